//! Run files: `--config run.toml` holds any of a run's flags, by their names (`steps = 2000`,
//! `data = "book.txt"`, `no_progress = true`, `aux_loss_scope = "micro-batch"`); flags given on the
//! command line override it. A run with `--metrics FILE` writes every flag's resolved value beside it
//! (`FILE` with the extension `.toml`), so `--config` that file runs the same run again.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::error::{Result, RuntimeError};

/// The command line `args` (program name first) with the settings of its `--config FILE` put before
/// its own flags, so the command line overrides the file (`command` must let later flags override
/// earlier ones: `args_override_self`). Every key must be a flag of `command`; the errors name the file
/// and the key.
pub fn expand_config(args: Vec<OsString>, command: &clap::Command) -> Result<Vec<OsString>> {
    let Some(path) = config_path(&args) else { return Ok(args) };
    let shown = path.display().to_string().escape_debug().to_string();
    let refuse = |why: String| RuntimeError::invalid("--config", format!("{shown}: {why}"));
    let text = std::fs::read_to_string(&path).map_err(|e| refuse(e.to_string()))?;
    let table: toml::Table =
        text.parse().map_err(|e: toml::de::Error| refuse(format!("not TOML ({})", e.message())))?;
    let mut from_file = Vec::new();
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let arg = command
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()) && long != "config")
            .ok_or_else(|| refuse(format!("`{}` is not a flag of this program (see --help)", key.escape_debug())))?;
        let takes_value = arg.get_action().takes_values();
        match (value, takes_value) {
            (toml::Value::Boolean(true), false) => from_file.push(OsString::from(format!("--{long}"))),
            (toml::Value::Boolean(false), false) => {}
            (_, false) => return Err(refuse(format!("`{key}` is a switch: write `{key} = true` or leave it out"))),
            (toml::Value::Array(items), true) => {
                for item in items {
                    from_file.extend([OsString::from(format!("--{long}")), scalar(key, item).map_err(refuse)?.into()]);
                }
            }
            (v, true) => {
                from_file.extend([OsString::from(format!("--{long}")), scalar(key, v).map_err(refuse)?.into()])
            }
        }
    }
    let mut out = vec![args[0].clone()];
    out.extend(from_file);
    out.extend(args.into_iter().skip(1));
    Ok(out)
}

/// `--config FILE` or `--config=FILE` of a command line.
fn config_path(args: &[OsString]) -> Option<PathBuf> {
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        let a = a.to_string_lossy();
        if a == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(p) = a.strip_prefix("--config=") {
            return Some(PathBuf::from(p));
        }
    }
    None
}

fn scalar(key: &str, v: &toml::Value) -> std::result::Result<String, String> {
    match v {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        other => Err(format!("`{key}` must be a string, a number or a boolean, not a {}", other.type_str())),
    }
}

/// Where a run with metrics at `metrics` writes its resolved flags: `metrics` with the extension `.toml`.
pub fn run_file_beside(metrics: &Path) -> PathBuf {
    match metrics.extension() {
        Some(e) if e == "toml" => metrics.with_extension("run.toml"),
        _ => metrics.with_extension("toml"),
    }
}

/// Writes a run's resolved flags (`args`, serialised by their flag names; unset options left out) to
/// `path`, atomically.
pub fn write_run_file(path: &Path, args: &impl serde::Serialize) -> Result<()> {
    let text = toml::to_string(args).map_err(|e| RuntimeError::invalid("--metrics", format!("the run file: {e}")))?;
    let text = format!("# The resolved flags of a run; `--config` this file to run it again.\n{text}");
    piper_planner::atomic::write_atomic(path, text.as_bytes()).map_err(|e| RuntimeError::file("--metrics", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser, Debug, serde::Serialize)]
    #[command(args_override_self = true)]
    struct Flags {
        #[arg(long, default_value_t = 10)]
        steps: usize,
        #[arg(long)]
        data: Option<PathBuf>,
        #[arg(long)]
        no_progress: bool,
        #[arg(long, default_value_t = 1e-3)]
        lr: f64,
        #[arg(long)]
        #[serde(skip)]
        config: Option<PathBuf>,
    }

    fn scratch(name: &str, text: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("piper-run-file-{name}-{}.toml", std::process::id()));
        std::fs::write(&p, text).unwrap();
        p
    }

    fn parse(args: &[&str]) -> Result<Flags> {
        let args: Vec<OsString> = std::iter::once("prog").chain(args.iter().copied()).map(OsString::from).collect();
        Ok(Flags::parse_from(expand_config(args, &Flags::command())?))
    }

    #[test]
    fn the_file_sets_flags_and_the_command_line_overrides_them() {
        let f = scratch("set", "steps = 200\ndata = \"book.txt\"\nno_progress = true\nlr = 0.5\n");
        let a = parse(&["--config", f.to_str().unwrap()]).unwrap();
        assert_eq!((a.steps, a.data.as_deref(), a.no_progress, a.lr), (200, Some(Path::new("book.txt")), true, 0.5));
        let b = parse(&["--steps", "7", &format!("--config={}", f.display())]).unwrap();
        assert_eq!(b.steps, 7, "the command line wins wherever it stands");
        // A resolved file reads back as the flags it came from.
        let resolved = scratch("resolved", "");
        write_run_file(&resolved, &b).unwrap();
        let c = parse(&["--config", resolved.to_str().unwrap()]).unwrap();
        assert_eq!((c.steps, c.data, c.no_progress, c.lr), (b.steps, b.data, b.no_progress, b.lr));
        for p in [f, resolved] {
            std::fs::remove_file(p).unwrap();
        }
    }

    #[test]
    fn unknown_keys_and_wrong_kinds_name_the_file_and_the_key() {
        for (text, want) in [
            ("stepz = 3", "`stepz` is not a flag"),
            ("no_progress = 3", "`no_progress` is a switch"),
            ("data = { a = 1 }", "`data` must be a string, a number or a boolean"),
            ("steps = ", "not TOML"),
            ("config = \"x.toml\"", "`config` is not a flag"),
        ] {
            let f = scratch("bad", text);
            let e = parse(&["--config", f.to_str().unwrap()]).unwrap_err().to_string();
            assert!(e.starts_with("--config ") && e.contains(want), "{text}: {e}");
            std::fs::remove_file(f).unwrap();
        }
    }
}
