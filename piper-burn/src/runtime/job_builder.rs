//! [`JobBuilder`]: a [`Job`] from a model spec and a world, with everything else defaulted the way the
//! command line defaults it — the run's defaults, the `local` platform, the world's topology, a plan for
//! the world (one process: PP = EP = DP = 1; more ranks: the planner's first choice), FLOPs counted from
//! the spec, the peak FLOP/s measured on the device.
//!
//! ```no_run
//! use piper_burn::corpus::Grammar;
//! use piper_burn::runtime::{self, Job, RunConfig};
//! use piper_comm::local::LocalComm;
//! use piper_planner::model::ModelSpec;
//!
//! let spec = ModelSpec::mixtral("my-moe").hidden_size(128).layers(4).build()?;
//! let world = LocalComm::single();
//! let job = Job::builder(spec, &world).run(RunConfig::new().with_steps(100)).build()?;
//! let trained = runtime::execute(&job, &mut Grammar::new(32, 3, 9), |m| println!("{}", m.loss))?;
//! println!("final loss {}", trained.summary(&job.plan, job.flops_per_token).final_loss);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::prelude::*;
use piper_comm::{Communicator, Topology};
use piper_planner::model::{ModelSpec, training_flops_per_token};
use piper_planner::platform::{self, Platform};
use piper_planner::run_plan::RunPlan;

use super::checkpoint::{CheckpointSettings, open_resume};
use super::config::RunConfig;
use super::error::Result;
use super::job::Job;
use super::peak::measure_peak_flops;
use super::plan::{LayoutFlags, plan_auto, plan_from_flags};
use super::schedule::LrSchedule;

/// A job under construction; see the [module documentation](self).
#[must_use = "a builder does nothing until `build()`"]
pub struct JobBuilder<'a> {
    spec: ModelSpec,
    world: &'a dyn Communicator,
    run: RunConfig,
    plan: Option<RunPlan>,
    layout: Option<LayoutFlags>,
    platform: Option<Platform>,
    topo: Option<Topology>,
    device: Option<Device>,
    peak_flops: Option<f64>,
    checkpoint: CheckpointSettings,
    resume: Option<PathBuf>,
    init_hf: Option<PathBuf>,
    schedule: Option<Arc<dyn LrSchedule>>,
}

impl<'a> Job<'a> {
    /// A job training `spec` on `world` (every rank builds the same job).
    pub fn builder(spec: ModelSpec, world: &'a dyn Communicator) -> JobBuilder<'a> {
        JobBuilder {
            spec,
            world,
            run: RunConfig::new(),
            plan: None,
            layout: None,
            platform: None,
            topo: None,
            device: None,
            peak_flops: None,
            checkpoint: CheckpointSettings::default(),
            resume: None,
            init_hf: None,
            schedule: None,
        }
    }
}

impl<'a> JobBuilder<'a> {
    /// What to optimise and for how long (default [`RunConfig::new`]).
    pub fn run(mut self, run: RunConfig) -> Self {
        self.run = run;
        self
    }

    /// A plan the planner wrote (`piper plan --out`, [`RunPlan::load`]); it wins over [`layout`](Self::layout).
    pub fn plan(mut self, plan: RunPlan) -> Self {
        self.plan = Some(plan);
        self
    }

    /// A layout chosen by hand, priced by the planner on the job's platform.
    pub fn layout(mut self, layout: LayoutFlags) -> Self {
        self.layout = Some(layout);
        self
    }

    /// The platform plans are priced on (default: `local`, calibrated by `piper calibrate` when it was run).
    pub fn platform(mut self, platform: Platform) -> Self {
        self.platform = Some(platform);
        self
    }

    /// Which ranks share a node (default: detected from the world).
    pub fn topology(mut self, topo: Topology) -> Self {
        self.topo = Some(topo);
        self
    }

    /// The device this rank trains on (default: Burn's CPU backend, flex).
    pub fn device(mut self, device: Device) -> Self {
        self.device = Some(device);
        self
    }

    /// One rank's peak FLOP/s, the MFU's denominator (default: a GEMM timed on the device at build).
    pub fn peak_flops(mut self, flops: f64) -> Self {
        self.peak_flops = Some(flops);
        self
    }

    /// Where and when to save checkpoints (default: never).
    pub fn checkpoints(mut self, settings: CheckpointSettings) -> Self {
        self.checkpoint = settings;
        self
    }

    /// Continue from a checkpoint folder, or from the newest complete one under a checkpoint folder.
    pub fn resume(mut self, path: impl AsRef<Path>) -> Self {
        self.resume = Some(path.as_ref().to_path_buf());
        self
    }

    /// Start from a Hugging Face model folder's weights (the spec must be its config's).
    pub fn init_hf(mut self, folder: impl AsRef<Path>) -> Self {
        self.init_hf = Some(folder.as_ref().to_path_buf());
        self
    }

    /// The learning rate of each step (default: the run's warm-up and cosine decay).
    pub fn schedule(mut self, schedule: impl LrSchedule + 'static) -> Self {
        self.schedule = Some(Arc::new(schedule));
        self
    }

    /// The job, with what was left out filled in; the error names what does not fit.
    pub fn build(self) -> Result<Job<'a>> {
        self.run.validate()?;
        let platform = match self.platform {
            Some(p) => p,
            None => platform::preset("local")?,
        };
        let ranks = self.world.size();
        let plan = match (self.plan, &self.layout) {
            (Some(plan), _) => plan,
            (None, Some(layout)) => plan_from_flags(&self.spec, &platform, &self.run, layout, ranks)?,
            (None, None) if ranks == 1 => {
                plan_from_flags(&self.spec, &platform, &self.run, &LayoutFlags::single(), ranks)?
            }
            (None, None) => plan_auto(&self.spec, &platform, &self.run, ranks)?,
        };
        let topo = match self.topo {
            Some(t) => t,
            None => Topology::detect(self.world)?,
        };
        let device = self.device.unwrap_or_else(Device::flex);
        let peak_flops = self.peak_flops.unwrap_or_else(|| measure_peak_flops(&device));
        let flops_per_token = training_flops_per_token(&self.spec, self.run.seq_len as u64).total();
        Ok(Job {
            resume: self.resume.as_deref().map(open_resume).transpose()?,
            spec: self.spec,
            run: self.run,
            plan,
            world: self.world,
            topo,
            platform,
            device,
            flops_per_token,
            peak_flops,
            checkpoint: self.checkpoint,
            init_hf: self.init_hf,
            schedule: self.schedule,
        })
    }
}
