//! The command-line flags of a training run and their resolution into a run: the model spec, the
//! [`RunConfig`], the plan (a plan file, `--plan auto`, or the layout flags priced by the planner) and
//! the data. Examples flatten [`RunArgs`] into their own parser and add what only they know (the backend).

use std::path::PathBuf;

use piper_planner::checkpoint::companions::folder_tokenizer_files;
use piper_planner::comm::A2aAlgo;
use piper_planner::layout::{Layout, Recompute, Schedule, StageSplit};
use piper_planner::model::{ModelSpec, resolve_model};
use piper_planner::platform::Platform;
use piper_planner::run_plan::RunPlan;
use piper_planner::text::TOKENIZER_FILE;

use super::checkpoint::{CheckpointSettings, Resume, open_resume};
use super::config::{AuxLossScope, FLAGS, MigrationDecision, RunConfig};
use super::error::{Result, RuntimeError};
use super::plan::{LayoutFlags, check_plan, plan_auto, plan_from_flags};
use super::report::ReportOptions;

/// Flags of a training run.
#[derive(clap::Args, Debug, Clone, serde::Serialize)]
pub struct RunArgs {
    /// A run file (TOML) of flags by name (`steps = 2000`, `no_progress = true`); flags given here
    /// override it. A run with --metrics FILE writes its resolved flags to FILE's name with `.toml`.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Model: tiny (Mixtral-style), tiny-qwen3, tiny-deepseek, or any planner preset / config.json
    /// [default: the plan file's model, else tiny].
    #[arg(long)]
    pub preset: Option<String>,
    #[arg(long, default_value_t = 1000)]
    pub steps: usize,
    /// Sequences per step over all ranks, the global batch [default: the plan file's, else 16].
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Tokens each sequence trains on, the planner's sequence length [default: the plan file's, else 63].
    #[arg(long)]
    pub seq_len: Option<usize>,
    #[arg(long, default_value_t = 3e-3)]
    pub lr: f64,
    #[arg(long, default_value_t = 20)]
    pub warmup: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Weight of the load-balancing loss [default: the model config's `router_aux_loss_coef`, else 0.01].
    #[arg(long)]
    pub aux_loss_coef: Option<f64>,
    /// Weight of the multi-token-prediction loss (DeepSeek-V3's `num_nextn_predict_layers`). MTP is not
    /// implemented yet: 0 trains such a model without its MTP module, as transformers runs it.
    #[arg(long)]
    pub mtp_loss_weight: Option<f64>,
    /// Token counts of the load-balancing loss: summed over the ranks sharing a layer, or per rank.
    #[arg(long, value_enum, default_value_t = AuxScopeArg::Global)]
    pub aux_loss_scope: AuxScopeArg,
    /// Clip the global gradient norm to this (0: off).
    #[arg(long, default_value_t = 1.0)]
    pub grad_clip: f64,
    /// Train on this UTF-8 text file instead of the synthetic grammar: through --tokenizer, else the
    /// --init-hf folder's tokenizer.json, else as bytes (a model trained from scratch, vocabulary ≥ 256).
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Evaluate on a held-out split every N steps and after the last (0: off): the end of --data's
    /// text (training never draws it), or an independent stream of the grammar.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub eval_every: usize,
    /// Tokens of the held-out split (rounded up to whole global batches).
    #[arg(long, default_value_t = 8192, value_name = "T")]
    pub eval_tokens: usize,
    /// The Hugging Face tokenizer.json that encodes --data (e.g. from `piper tokenizer train`); its ids
    /// must fit the model's vocabulary.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    #[arg(long, default_value_t = 48)]
    pub grammar_alphabet: usize,
    #[arg(long, default_value_t = 3)]
    pub grammar_branching: usize,
    /// One JSON line per step.
    #[arg(long)]
    pub metrics: Option<PathBuf>,
    /// The run summary (JSON) at the end (rank 0).
    #[arg(long)]
    pub summary: Option<PathBuf>,
    /// The history of training runs this run appends its predicted and measured figures to (rank 0),
    /// which `piper calibrate --refine` refits the platform from; `off` for none [default:
    /// $PIPER_HISTORY, else ~/.local/share/piper/history.jsonl].
    #[arg(long)]
    pub history: Option<PathBuf>,
    /// A log line every N steps (0: none).
    #[arg(long, default_value_t = 50)]
    pub log_every: usize,
    /// Plain log lines instead of a progress bar (without a terminal the lines are always plain).
    #[arg(long)]
    pub no_progress: bool,
    /// Print where the steady steps' time goes (rank 0): per phase and per fused operation, with GFLOP/s.
    #[arg(long)]
    pub profile: bool,
    /// Write the run's timeline to FILE.json, a Chrome/Perfetto trace with one process per rank: steps,
    /// every instruction of the schedule with its micro-batch, expert exchanges, evaluation, migration
    /// and checkpoints (rank 0 gathers the ranks' spans and writes the file).
    #[arg(long, value_name = "FILE.json")]
    pub trace: Option<PathBuf>,
    /// Print the runtime's `tracing` events and spans that pass FILTER to stderr from the first step on
    /// (every rank; spans as they close, with their times): `info`, `piper::report=info`,
    /// `piper_burn::runtime=info,warn`. Default: $RUST_LOG; nothing without either.
    #[arg(long, value_name = "FILTER")]
    pub log: Option<String>,
    /// Draw the run's pictures into DIR at the end (rank 0), as PNG and SVG: loss (with the held-out
    /// and the best possible), tokens/s and MFU, expert load per MoE layer (heat map), rank imbalance
    /// and migrations; from the --metrics file when given (every step since the first, across resumes).
    #[arg(long, value_name = "DIR")]
    pub plots: Option<PathBuf>,
    /// A plan file (`piper plan --out`), or `auto` (the planner, in memory). Overrides the layout flags.
    #[arg(long)]
    pub plan: Option<String>,
    /// Platform the planner prices on: `local` (this machine) or a TOML file.
    #[arg(long, default_value = "local")]
    pub platform: String,
    #[arg(long, default_value_t = 1)]
    pub pp: u64,
    #[arg(long, default_value_t = 1)]
    pub ep: u64,
    #[arg(long, default_value_t = 1)]
    pub dp: u64,
    #[arg(long, default_value_t = 1)]
    pub micro_batches: usize,
    #[arg(long, value_parser = ["gpipe", "1f1b"], default_value = "1f1b")]
    pub schedule: String,
    /// Layers per stage, e.g. 1,3 (default: even).
    #[arg(long)]
    pub split: Option<String>,
    #[arg(long = "all-to-all", value_parser = ["flat", "pairwise", "halo"], default_value = "flat")]
    pub all_to_all: String,
    /// Activation recompute: `none` keeps every activation for the backward; `full` keeps each decoder
    /// layer's input and recomputes the layer (its all-to-alls included) in the backward — less memory
    /// for about one more forward; `selective` keeps all but the dense MLPs' and shared experts'
    /// `silu(gate) ⊙ up`, recomputed in their backward (one element-wise pass).
    #[arg(long, value_parser = ["none", "selective", "full"], default_value = "none")]
    pub recompute: String,
    /// Expert migration: `plan` follows the plan's policy (`--plan auto` and layout flags get the
    /// planner's default policy), `off` never moves an expert.
    #[arg(long, value_parser = ["plan", "off"], default_value = "plan")]
    pub migration: String,
    /// `on`: shared experts compute while the expert dispatch's rows travel (flat or pairwise
    /// all-to-all; HALO's phases wait on each other); `off`: before a blocking dispatch.
    #[arg(long, value_parser = ["on", "off"], default_value = "on")]
    pub overlap: String,
    /// Overrides the policy's threshold (max/mean tokens per rank of an expert group, ≥ 1).
    #[arg(long)]
    pub migration_threshold: Option<f64>,
    /// Overrides the policy's steps between checks.
    #[arg(long)]
    pub migration_every: Option<usize>,
    /// When a check moves experts: `payoff` when the imbalance has held at two checks in a row and the
    /// move pays for itself within four windows; `threshold` whenever the window exceeds the threshold
    /// (the paper's rule).
    #[arg(long, value_parser = ["payoff", "threshold"], default_value = "payoff")]
    pub migration_decision: String,
    /// A skewed workload `K:FACTOR`: experts 0..K−1 of every MoE layer draw about FACTOR× their balanced
    /// share of tokens (a fixed router bias), so migration has something to do.
    #[arg(long, value_name = "K:FACTOR")]
    pub hot_experts: Option<String>,
    /// The peak FLOP/s MFU refers to, in TFLOP/s per rank (e.g. the datasheet's); by default a 1024³ GEMM
    /// is timed on the backend at start-up.
    #[arg(long)]
    pub peak_tflops: Option<f64>,
    /// Debug: start every router at zero (all tokens tie and pick the lowest-numbered experts).
    #[arg(long)]
    pub zero_router: bool,
    /// Save checkpoints under this folder (`step-NNNNNNNN/` per save, `latest` names the newest), after
    /// the last step and every --save-every steps.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Save every N steps (0: only after the last step).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub save_every: usize,
    /// Keep the K newest checkpoints under --checkpoint-dir.
    #[arg(long, default_value_t = 2, value_name = "K")]
    pub keep: usize,
    /// Start from a Hugging Face model folder (config.json and model.safetensors or a sharded
    /// model.safetensors.index.json; F32, BF16 or F16 weights): the model is the folder's config.json, its
    /// weights the folder's, and the run fine-tunes it.
    #[arg(long, value_name = "DIR")]
    pub init_hf: Option<PathBuf>,
    /// Resume from a checkpoint folder, or from the latest one under a --checkpoint-dir; `--steps` stays
    /// the run's total (a run saved at step 10 and resumed with --steps 20 trains steps 10..19). Any
    /// layout may resume any checkpoint.
    #[arg(long, value_name = "PATH")]
    pub resume: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuxScopeArg {
    Global,
    MicroBatch,
}

/// A run, resolved from its flags and checked: everything but the Burn model and the device.
pub struct ResolvedRun {
    pub spec: ModelSpec,
    pub platform: Platform,
    pub config: RunConfig,
    pub plan: RunPlan,
    pub checkpoint: CheckpointSettings,
    pub resume: Option<Resume>,
    pub init_hf: Option<PathBuf>,
}

impl RunArgs {
    /// Resolves the flags for a job of `ranks` ranks. A plan file fills in the model, batch and sequence
    /// length the flags leave out, and must agree with those given. One line, naming the flag, for the
    /// first thing that cannot work — before any model is built.
    pub fn resolve(&self, ranks: usize) -> Result<ResolvedRun> {
        self.resolve_fields(ranks).map_err(as_flags)
    }

    fn resolve_fields(&self, ranks: usize) -> Result<ResolvedRun> {
        let file = match self.plan.as_deref() {
            Some("auto") | None => None,
            Some(path) => Some(RunPlan::load(path.as_ref()).map_err(|e| RuntimeError::from(e).under("--plan"))?),
        };
        let source = self.model_source(file.as_ref())?;
        let spec = resolve_model(&source).and_then(|s| s.for_training(self.mtp_loss_weight))?;
        let config = self.run_config(file.as_ref())?;
        if let Some(t) = self.peak_tflops {
            // 1 MFLOP/s to an exaFLOP/s per rank: beyond that it is a typo, and the MFU would be noise.
            piper_planner::limits::number("run", "--peak-tflops", t, 1e-6, 1e6)?;
        }
        let platform = piper_planner::platform::resolve_platform(&self.platform)?;
        let plan = match file {
            Some(p) => p,
            None => self.layout_plan(&spec, &platform, &config, ranks)?,
        };
        check_plan(&plan, &spec, &config, ranks)?;
        let checkpoint = CheckpointSettings {
            dir: self.checkpoint_dir.clone(),
            save_every: self.save_every,
            keep: self.keep,
            hf_config: hf_config(&source),
            tokenizer_files: match (&self.tokenizer, &self.init_hf) {
                (Some(file), _) => vec![(file.clone(), TOKENIZER_FILE.to_string())],
                (None, Some(dir)) => folder_tokenizer_files(dir),
                (None, None) => Vec::new(),
            },
        };
        checkpoint.validate()?;
        let resume = self.resume.as_deref().map(open_resume).transpose()?;
        Ok(ResolvedRun { spec, platform, config, plan, checkpoint, resume, init_hf: self.init_hf.clone() })
    }

    /// Where the model comes from: the `--init-hf` folder's config.json, `--preset`, the plan file's
    /// model, else `tiny`.
    fn model_source(&self, file: Option<&RunPlan>) -> Result<String> {
        match (&self.init_hf, &self.preset) {
            (Some(_), Some(p)) => Err(RuntimeError::invalid(
                "--init-hf",
                format!("takes the model from its folder's config.json; drop --preset {p}"),
            )),
            (Some(dir), None) => {
                let config = dir.join("config.json");
                if !config.is_file() {
                    return Err(RuntimeError::invalid("--init-hf", format!("{}: no config.json in it", dir.display())));
                }
                Ok(config.display().to_string())
            }
            (None, Some(p)) => Ok(p.clone()),
            (None, None) => Ok(file.map_or_else(|| "tiny".into(), |p| p.model.clone())),
        }
    }

    /// The run configuration of the flags (batch and sequence length from the plan file where the flags
    /// leave them out), checked.
    fn run_config(&self, file: Option<&RunPlan>) -> Result<RunConfig> {
        let config = RunConfig::new()
            .with_steps(self.steps)
            .with_global_batch(self.batch_size.or(file.map(|p| p.global_batch as usize)).unwrap_or(16))
            .with_seq_len(self.seq_len.or(file.map(|p| p.seq_len as usize)).unwrap_or(63))
            .with_lr(self.lr)
            .with_warmup_steps(self.warmup)
            .with_grad_clip(self.grad_clip)
            .with_aux_loss_coef(self.aux_loss_coef)
            .with_zero_router(self.zero_router)
            .with_aux_loss_scope(match self.aux_loss_scope {
                AuxScopeArg::Global => AuxLossScope::Global,
                AuxScopeArg::MicroBatch => AuxLossScope::MicroBatch,
            })
            .with_seed(self.seed)
            .with_eval_every(self.eval_every)
            .with_eval_tokens(self.eval_tokens)
            .with_overlap(self.overlap == "on")
            .with_migration(self.migration == "plan")
            .with_migration_threshold(self.migration_threshold)
            .with_migration_every(self.migration_every)
            .with_migration_decision(match self.migration_decision.as_str() {
                "threshold" => MigrationDecision::Threshold,
                _ => MigrationDecision::Payoff,
            });
        let config = match self.hot_experts.as_deref() {
            Some(text) => {
                let (k, f) = parse_hot_experts(text)?;
                config.with_hot_experts(k).with_hot_factor(f)
            }
            None => config,
        };
        config.validate().map_err(as_flags)?;
        Ok(config)
    }

    /// The plan without a plan file: `--plan auto`, or the layout flags priced by the planner.
    fn layout_plan(&self, spec: &ModelSpec, platform: &Platform, config: &RunConfig, ranks: usize) -> Result<RunPlan> {
        if self.plan.is_some() {
            return plan_auto(spec, platform, config, ranks);
        }
        let split = self.split.as_deref().map(|s| StageSplit::parse(s, spec.num_layers, self.pp));
        let flags = LayoutFlags {
            layout: Layout { pp: self.pp, ep: self.ep, dp: self.dp },
            micro_batches: self.micro_batches,
            schedule: if self.schedule == "gpipe" { Schedule::GPipe } else { Schedule::OneFOneB },
            split: split.transpose()?,
            all_to_all: A2aAlgo::parse(&self.all_to_all, "--all-to-all")?,
            recompute: match self.recompute.as_str() {
                "full" => Recompute::Full,
                "selective" => Recompute::Selective,
                _ => Recompute::None,
            },
        };
        plan_from_flags(spec, platform, config, &flags, ranks)
    }

    /// Where the per-step output goes; a resumed run's metrics continue after step `steps_done`.
    pub fn report_options(&self, steps_done: usize) -> ReportOptions {
        ReportOptions {
            metrics: self.metrics.clone(),
            log_every: self.log_every,
            progress: !self.no_progress,
            steps_done,
        }
    }

    /// The training data (the text file, tokenized or as bytes, or the grammar), checked against the
    /// model's vocabulary, with the held-out split `run` evaluates on set aside.
    pub fn corpus(
        &self,
        vocab_size: usize,
        run: &RunConfig,
    ) -> std::result::Result<Box<dyn crate::corpus::Corpus>, crate::corpus::DataError> {
        let flags = crate::corpus::DataFlags {
            data: self.data.as_deref(),
            tokenizer: self.tokenizer.as_deref(),
            model_folder: self.init_hf.as_deref(),
            alphabet: self.grammar_alphabet,
            branching: self.grammar_branching,
            seed: self.seed,
        };
        let mut corpus = crate::corpus::open(&flags, vocab_size)?;
        if run.eval_every > 0 {
            corpus.hold_out(run.eval_sequences(), run.seq_len + 1)?;
        }
        Ok(corpus)
    }
}

/// The Hugging Face config.json the model comes from (a file of a transformers family, not a preset or a
/// native spec), as checkpoints keep it for their export.
fn hf_config(source: &str) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(source).ok()?;
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    let family = value.get("model_type")?.as_str()?;
    (family != "piper").then_some(value)
}

/// The job's fields beside the run configuration's ([`FLAGS`]) and the flags that set them.
pub const JOB_FLAGS: [(&str, &str); 15] = [
    ("seed", "--seed"),
    ("hot_experts", "--hot-experts"),
    ("layout.pp", "--pp"),
    ("layout.ep", "--ep"),
    ("layout.dp", "--dp"),
    ("micro_batches", "--micro-batches"),
    ("recompute", "--recompute"),
    ("plan", "--plan"),
    ("data", "--data"),
    ("resume", "--resume"),
    ("init_hf", "--init-hf"),
    ("init_hf and resume", "--init-hf and --resume"),
    ("checkpoint.dir", "--checkpoint-dir"),
    ("checkpoint.save_every", "--save-every"),
    ("checkpoint.keep", "--keep"),
];

/// The flag that sets a field, if one does.
fn flag_of(field: &str) -> Option<&'static str> {
    FLAGS.iter().chain(&JOB_FLAGS).find(|(name, _)| *name == field).map(|(_, flag)| *flag)
}

/// A message's `` `field` `` references as their flags.
fn flags_in(text: String) -> String {
    FLAGS.iter().chain(&JOB_FLAGS).fold(text, |t, (field, flag)| t.replace(&format!("`{field}`"), flag))
}

/// An error of the library as the command line reports it: each field it names by the flag that sets
/// it ([`FLAGS`], [`JOB_FLAGS`]), in its subject and its message.
pub fn as_flags(e: RuntimeError) -> RuntimeError {
    match e {
        RuntimeError::Invalid { field, why } => {
            RuntimeError::Invalid { field: flag_of(&field).map_or(field, str::to_string), why: flags_in(why) }
        }
        RuntimeError::File { flag, path, why } => {
            RuntimeError::File { flag: flag_of(flag).unwrap_or(flag), path, why: flags_in(why) }
        }
        RuntimeError::Flag { flag, source } => {
            RuntimeError::Flag { flag: flag_of(flag).unwrap_or(flag), source: Box::new(as_flags(*source)) }
        }
        RuntimeError::Checkpoint { step, source } => {
            RuntimeError::Checkpoint { step, source: Box::new(as_flags(*source)) }
        }
        other => other,
    }
}

/// `K:FACTOR` of `--hot-experts`.
fn parse_hot_experts(text: &str) -> Result<(usize, f64)> {
    let bad = || {
        RuntimeError::invalid(
            "--hot-experts",
            format!("`{text}` must be K:FACTOR, e.g. 2:4 (experts 0..K−1 draw FACTOR× their share)"),
        )
    };
    let (k, f) = text.split_once(':').ok_or_else(bad)?;
    let k: usize = k.trim().parse().map_err(|_| bad())?;
    let f: f64 = f.trim().parse().map_err(|_| bad())?;
    if k == 0 {
        return Err(bad());
    }
    Ok((k, f))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        run: RunArgs,
    }

    /// The library names a run configuration's field; the command line names its flag.
    #[test]
    fn a_bad_field_is_named_by_its_flag_on_the_command_line() {
        let fields = serde_json::to_value(RunConfig::new()).unwrap();
        for (field, _) in FLAGS {
            assert!(fields.get(field).is_some(), "{field} is no RunConfig field");
        }
        let library = RunConfig::new().with_global_batch(0).validate().unwrap_err().to_string();
        assert!(library.starts_with("global_batch is 0"), "{library}");
        for (args, want) in [
            (vec!["--batch-size", "0"], "--batch-size is 0"),
            (vec!["--lr", "NaN"], "--lr is NaN"),
            (vec!["--hot-experts", "2:inf"], "--hot-experts factor is inf"),
        ] {
            let parsed = Args::parse_from(std::iter::once("train").chain(args.iter().copied()));
            let err = parsed.run.run_config(None).unwrap_err().to_string();
            assert!(err.starts_with(want), "{args:?}: {err}");
        }
    }

    /// The job's other fields the same way: a layout, checkpoint settings, a resume, named as fields by
    /// the library and as flags on the command line, in the error's subject and in its message.
    #[test]
    fn the_jobs_fields_are_named_by_their_flags_on_the_command_line() {
        use crate::runtime::checkpoint::CheckpointSettings;
        let keep = CheckpointSettings { keep: 0, ..CheckpointSettings::default() }.validate().unwrap_err();
        assert!(keep.to_string().starts_with("checkpoint.keep is 0"), "{keep}");
        assert!(as_flags(keep).to_string().starts_with("--keep is 0"));
        let every = CheckpointSettings { save_every: 5, ..CheckpointSettings::default() }.validate().unwrap_err();
        assert_eq!(as_flags(every).to_string(), "--save-every needs --checkpoint-dir DIR (where to save)");
        let file = RuntimeError::file("resume", std::path::Path::new("ck"), "trained with `seed` 3");
        assert_eq!(as_flags(file.under("init_hf")).to_string(), "--init-hf --resume ck: trained with --seed 3");
        for (field, flag) in JOB_FLAGS {
            let e = as_flags(RuntimeError::invalid(field, format!("see `{field}`")));
            assert_eq!(e.to_string(), format!("{flag} see {flag}"));
        }
    }
}
