//! Platforms: TOML specs, presets, and efficiency interpolation.

pub mod calibration;
pub mod efficiency;
pub mod nnls;
pub mod refinement;
pub mod runtime;
pub mod spec;
pub mod step_costs;
pub mod tables;
pub mod threads;

use std::path::{Path, PathBuf};

pub use calibration::{
    DataParallelRuns, MemoryFit, MemoryPoint, ProfiledRun, fit_memory, with_data_parallel, with_runtime,
    with_step_costs,
};
pub use refinement::Refinement;
pub use runtime::RuntimeCosts;
pub use spec::{GIB, GemmTable, Level, Link, Platform, Topology};
pub use step_costs::{ClassWork, StepCosts, StepRun, WorkClass, fit_step_costs};
pub use threads::{ThreadCosts, mean_of, thread_counts, threads_per_rank};

use crate::error::{Error, Result};

const PRESETS: &[(&str, &str)] = &[
    ("frontier", include_str!("../../presets/platforms/frontier.toml")),
    ("nvlink-8", include_str!("../../presets/platforms/nvlink-8.toml")),
    ("local", include_str!("../../presets/platforms/local.toml")),
];

/// Names of the built-in platforms.
pub fn preset_names() -> Vec<&'static str> {
    PRESETS.iter().map(|(n, _)| *n).collect()
}

/// Where `piper calibrate` writes the calibrated `local` platform: `$PIPER_LOCAL_PLATFORM`, else
/// `$XDG_CONFIG_HOME/piper/local.toml`, else `~/.config/piper/local.toml`.
pub fn calibrated_local_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PIPER_LOCAL_PLATFORM") {
        return Some(PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("piper").join("local.toml"))
}

/// A built-in platform. `local` prefers the calibrated file when one exists.
pub fn preset(name: &str) -> Result<Platform> {
    if name == "local"
        && let Some(path) = calibrated_local_path().filter(|p| p.exists())
    {
        return load(&path);
    }
    let (_, text) = PRESETS
        .iter()
        .find(|(n, _)| *n == name)
        .ok_or_else(|| Error::unknown("platform (neither a file nor a preset)", name, &preset_names()))?;
    parse(text, &format!("platform preset {name}"))
}

/// A `--platform` argument: a TOML file or a preset name.
pub fn resolve_platform(arg: &str) -> Result<Platform> {
    let path = Path::new(arg);
    if path.exists() { load(path) } else { preset(arg) }
}

/// Reads and validates a platform TOML file.
pub fn load(path: &Path) -> Result<Platform> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::file(path.display().to_string(), format!("cannot read: {e}")))?;
    parse(&text, &path.display().to_string())
}

/// Parses and validates platform TOML text.
pub fn parse(text: &str, source: &str) -> Result<Platform> {
    let platform: Platform = toml::from_str(text).map_err(|e| {
        let line = e.span().map(|span| text[..span.start].matches('\n').count() + 1);
        let place = line.map_or(String::new(), |l| format!(" (line {l})"));
        Error::file(source, format!("{}{place}", one_line(e.message())))
    })?;
    platform.validate()?;
    Ok(platform)
}

/// Serialises a platform as TOML (the format `piper calibrate` writes).
pub fn to_toml(platform: &Platform) -> String {
    toml::to_string(platform).expect("a platform always serialises")
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_parse_and_round_trip() {
        for name in preset_names() {
            let p = parse(PRESETS.iter().find(|(n, _)| *n == name).unwrap().1, name).unwrap();
            let back = parse(&to_toml(&p), "round trip").unwrap();
            assert_eq!(p, back, "{name}");
        }
    }

    #[test]
    fn frontier_levels_follow_the_hierarchy() {
        let p = preset("frontier").unwrap();
        assert_eq!(p.level(0, 7), Level::Node);
        assert_eq!(p.level(0, 8), Level::Switch); // node 0 and node 1, same switch
        assert_eq!(p.level(0, 4 * 8), Level::Group); // node 4: next switch, same group
        assert_eq!(p.level(0, 128 * 8), Level::System); // node 128: next dragonfly group
        assert_eq!(p.injection_gbs(), 100.0);
        assert_eq!(p.intra_gbs(0, 1), 200.0);
    }

    #[test]
    fn bad_platform_names_the_field() {
        let text =
            PRESETS[0].1.replace("gpu_to_nic = [0, 0, 1, 1, 2, 2, 3, 3]", "gpu_to_nic = [0, 0, 1, 1, 2, 2, 3, 9]");
        let err = parse(&text, "f.toml").unwrap_err().to_string();
        assert!(err.contains("`topology.gpu_to_nic`"), "{err}");
        let text = PRESETS[0].1.replace("gpus_per_node = 8", "gpus_per_node = 8\nbogus = 1");
        let err = parse(&text, "f.toml").unwrap_err().to_string();
        assert!(err.starts_with("f.toml: unknown field `bogus`, expected one of"), "{err}");
        assert!(err.ends_with("(line 12)"), "{err}");
        assert!(!err.contains('\n'));
    }

    #[test]
    fn unknown_dtype_lists_the_known_ones() {
        let err = preset("frontier").unwrap().peak_flops("fp8").unwrap_err().to_string();
        assert!(err.contains("peak_tflops.fp8") && err.contains("bf16"), "{err}");
    }
}
