//! Every class of bad or absurd input to `piper` (issue #9's list and its neighbours) gets one `error:`
//! line naming the field, exit code 2 and nothing on stdout: non-finite, negative and out-of-range numbers
//! in platform files and flags, sizes whose products would wrap `u64`, sizes that would allocate or loop
//! without bound, layouts that match nothing, unknown fields, and a file that shadows a preset.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `piper` in `dir`; it must fail with exit 2 and one line on stderr containing every `want`.
fn refused(dir: &Path, args: &[&str], want: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_piper")).args(args).current_dir(dir).output().expect("piper runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: exit {:?}, stderr {err}", out.status.code());
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: not one line: {err}");
    assert!(err.starts_with("error: "), "{args:?}: {err}");
    assert!(out.stdout.is_empty(), "{args:?}: printed {}", String::from_utf8_lossy(&out.stdout));
    for w in want {
        assert!(err.contains(w), "{args:?}: `{w}` not in: {err}");
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("piper-bad-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const LOCAL: &str = include_str!("../presets/platforms/local.toml");

/// The `local` preset with one `key = value` line replaced (the key must occur once, at a line start).
fn platform_with(dir: &Path, name: &str, key: &str, value: &str) -> String {
    let mut found = 0;
    let text: Vec<String> = LOCAL
        .lines()
        .map(|l| {
            if l.split('=').next().is_some_and(|k| k.trim() == key) {
                found += 1;
                format!("{key} = {value}")
            } else {
                l.to_string()
            }
        })
        .collect();
    assert_eq!(found, 1, "`{key}` must occur once in local.toml");
    let path = dir.join(name);
    std::fs::write(&path, text.join("\n")).unwrap();
    path.to_str().unwrap().to_string()
}

fn mixtral_config(dir: &Path, name: &str, overrides: &str) -> String {
    let text = format!(
        r#"{{"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 256, "num_local_experts": 4, "num_experts_per_tok": 2{overrides}}}"#
    );
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn platform_files_with_non_finite_negative_or_absurd_numbers_are_refused() {
    let dir = scratch("t1");
    for (key, value) in [
        ("intra_node_latency_us", "nan"),
        ("framework_overhead_gib", "nan"),
        ("half_bandwidth_bytes", "inf"),
        ("gpu_memory_gib", "-1.0"),
        ("nic_gbs", "inf"),
        ("memory_gbs", "1e300"),
    ] {
        let p = platform_with(&dir, &format!("{key}.toml"), key, value);
        let args = ["plan", "--model", "tiny", "--platform", &p, "--gpus", "2", "--global-batch", "4"];
        refused(&dir, &args, &[key]);
    }
    // Latencies of the switch, group and system levels ([topology.switch] etc.).
    let text = LOCAL.replacen("latency_us = ", "latency_us = -", 2);
    std::fs::write(dir.join("latency.toml"), text).unwrap();
    let p = dir.join("latency.toml");
    refused(&dir, &["memory", "--model", "tiny", "--platform", p.to_str().unwrap()], &["latency_us", "finite number"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn flags_with_non_finite_negative_or_absurd_numbers_are_refused() {
    let dir = scratch("t2");
    let loads = dir.join("loads.json");
    std::fs::write(&loads, r#"{"loads": [100, 90, 10, 0], "placement": [0, 0, 1, 1], "model": "tiny"}"#).unwrap();
    let loads = loads.to_str().unwrap();
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec!["memory", "--model", "tiny", "--expert-imbalance", "inf"], vec!["--expert-imbalance", "is inf"]),
        (vec!["memory", "--model", "tiny", "--expert-imbalance", "0.5"], vec!["--expert-imbalance"]),
        (vec!["memory", "--model", "tiny", "--weight-bytes=-16"], vec!["--weight-bytes", "is -16"]),
        (vec!["memory", "--model", "tiny", "--optimizer-bytes", "NaN"], vec!["--optimizer-bytes", "is NaN"]),
        (vec!["memory", "--model", "tiny", "--micro-batch-size", "4503599627370496"], vec!["--micro-batch-size"]),
        (vec!["memory", "--model", "tiny", "--seq-len", "0"], vec!["--seq-len"]),
        (vec!["memory", "--model", "tiny", "--pp", "1099511627777"], vec!["--pp"]),
        (vec!["memory", "--model", "tiny", "--dp", "1099511627776", "--ep", "2"], vec!["--pp × --ep × --dp"]),
        (
            vec![
                "memory",
                "--model",
                "tiny",
                "--dp",
                "1048576",
                "--micro-batch-size",
                "1048576",
                "--seq-len",
                "16777216",
            ],
            vec!["tokens per step"],
        ),
        (vec!["model", "--model", "tiny", "--seq-len", "18446744073709551615"], vec!["--seq-len"]),
        (vec!["migrate", "--worst-case", "--model", "tiny", "--link-gbps", "inf"], vec!["--link-gbps", "is inf"]),
        (vec!["migrate", "--worst-case", "--model", "tiny", "--bytes-per-param=-16"], vec!["--bytes-per-param"]),
        (vec!["migrate", "--worst-case", "--model", "tiny", "--group-size", "0"], vec!["--group-size"]),
        (vec!["migrate", "--loads", loads, "--expert-bytes=-1e9"], vec!["--expert-bytes", "is -1e9"]),
        (vec!["migrate", "--loads", loads, "--expert-bytes", "NaN"], vec!["--expert-bytes"]),
        (vec!["migrate", "--loads", loads, "--ranks", "1000000000000"], vec!["`ranks` is 1000000000000"]),
        (
            vec!["plan", "--model", "tiny", "--gpus", "4", "--global-batch", "8", "--pp", "3"],
            vec!["--pp", "must divide --gpus 4", "1, 2, 4"],
        ),
        (
            vec!["plan", "--model", "tiny", "--gpus", "4", "--global-batch", "8", "--ep", "3"],
            vec!["--ep", "must divide --gpus 4"],
        ),
        (vec!["plan", "--model", "tiny", "--gpus", "4", "--global-batch", "8", "--top", "0"], vec!["--top"]),
        // The busiest of EP expert ranks holds at most EP × the mean.
        (
            vec!["predict", "--model", "tiny", "--ep", "2", "--expert-imbalance", "2.5"],
            vec!["--expert-imbalance", "is 2.5 but EP = 2", "at most 2"],
        ),
        (vec!["plan", "--model", "tiny", "--gpus", "1099511627777", "--global-batch", "8"], vec!["--gpus"]),
        (
            vec!["plan", "--model", "tiny", "--gpus", "4", "--global-batch", "8", "--micro-batch-sizes", "0"],
            vec!["--micro-batch-sizes"],
        ),
    ];
    for (args, want) in cases {
        refused(&dir, &args, &want);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn model_sizes_that_would_wrap_allocate_or_loop_are_refused() {
    let dir = scratch("t3");
    let cases = [
        // 2^32 · 2^32 wrapped the embedding to 0 parameters.
        (r#", "hidden_size": 4294967296, "vocab_size": 4294967296"#, vec!["hidden_size", "1..="]),
        (r#", "vocab_size": 4611686018427387904"#, vec!["vocab_size"]),
        (r#", "num_hidden_layers": 1e18"#, vec!["num_hidden_layers", "1..=1000000"]),
        (
            r#", "num_local_experts": 1048576, "intermediate_size": 16777216, "hidden_size": 1048576"#,
            vec!["parameters"],
        ),
        (r#", "num_hidden_layers": 0"#, vec!["num_hidden_layers"]),
        (r#", "rope_theta": -1"#, vec!["rope_theta"]),
    ];
    for (i, (overrides, want)) in cases.iter().enumerate() {
        // JSON objects keep the last duplicate key, so the overrides replace the base values.
        let path = mixtral_config(&dir, &format!("c{i}.json"), overrides);
        refused(&dir, &["model", "--model", &path], want);
    }
    let v3 = include_str!("../presets/models/deepseek-v3.json").replacen(
        '{',
        r#"{"num_nextn_predict_layers": 1000000000000, "#,
        1,
    );
    let v3 = v3.replace(r#""num_nextn_predict_layers": 1,"#, "");
    std::fs::write(dir.join("v3.json"), v3).unwrap();
    refused(&dir, &["model", "--model", "v3.json"], &["num_nextn_predict_layers"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unknown_fields_and_preset_shadowing_are_refused() {
    let dir = scratch("t4");
    let spec =
        Command::new(env!("CARGO_BIN_EXE_piper")).args(["model", "--preset", "tiny", "--spec-json"]).output().unwrap();
    assert!(spec.status.success());
    let text = String::from_utf8(spec.stdout).unwrap().replacen('{', r#"{"hiden_size": 8, "#, 1);
    std::fs::write(dir.join("spec.json"), text).unwrap();
    refused(&dir, &["model", "--model", "spec.json"], &["unknown field `hiden_size`"]);
    // A file named like a preset, in the working directory: ambiguous, not silently the file.
    std::fs::write(dir.join("tiny"), "{}").unwrap();
    refused(&dir, &["model", "--model", "tiny"], &["names both a preset and a file", "./tiny"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Micro-batch counts whose schedule would list more stage·micro-batch pairs than the bound are refused
/// before anything is listed (a huge count used to abort on a 640 MiB allocation after ~30 s); just
/// below the bound the prediction comes back.
#[test]
fn schedules_too_long_to_list_are_refused_before_any_allocation() {
    let dir = scratch("t5");
    let model = mixtral_config(&dir, "deep.json", r#", "num_hidden_layers": 64"#);
    let bound = 1u64 << 20;
    for (pp, m) in [(1, bound + 1), (2, bound / 2 + 1), (64, bound / 64 + 1), (64, 1 << 24)] {
        let (pp, m) = (pp.to_string(), m.to_string());
        let args =
            ["predict", "--model", &model, "--pp", &pp, "--num-micro-batches", &m, "--seq-len", "8", "--dtype", "fp32"];
        refused(&dir, &args, &["--num-micro-batches", "stage·micro-batch pairs", "fewer, larger micro-batches"]);
    }
    let ok = Command::new(env!("CARGO_BIN_EXE_piper"))
        .args(["predict", "--model", &model, "--pp", "64", "--num-micro-batches", "16384", "--seq-len", "8"])
        .args(["--dtype", "fp32"])
        .output()
        .unwrap();
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Names read from files that would drive the terminal — every C0 and C1 control, DEL and Unicode's
/// bidirectional controls — are refused, and the error shows them escaped (no raw control byte
/// reaches stderr); names in other scripts are accepted.
#[test]
fn names_that_drive_the_terminal_are_refused_and_shown_escaped() {
    let dir = scratch("t6");
    let hiding: Vec<char> = (0u32..0x20)
        .chain(0x7f..0xa0)
        .chain([0x61c, 0x200e, 0x200f, 0x202a, 0x202b, 0x202c, 0x202d, 0x202e, 0x2066, 0x2067, 0x2068, 0x2069])
        .filter_map(char::from_u32)
        .collect();
    for (i, c) in hiding.iter().enumerate() {
        let name = format!("evil{c}[31mname");
        let json_name = serde_json::to_string(&name).unwrap();
        let model = mixtral_config(&dir, &format!("m{i}.json"), &format!(r#", "_name_or_path": {json_name}"#));
        let out = Command::new(env!("CARGO_BIN_EXE_piper")).args(["model", "--model", &model]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "U+{:04X}: {err}", *c as u32);
        assert!(err.contains("`name`") && err.contains("printable"), "U+{:04X}: {err}", *c as u32);
        assert!(!err.trim_end_matches('\n').contains(*c), "U+{:04X} reached stderr raw: {err:?}", *c as u32);
    }
    let platform = platform_with(&dir, "p.toml", "name", "\"local\\u001b]0;pwned\\u0007\"");
    refused(&dir, &["memory", "--model", "tiny", "--platform", &platform], &["`name`", "U+001B", "\\u{1b}"]);
    for name in ["Mixtral 8×7B", "Qwen3-MoE «petit»", "模型", "نموذج", "μοντέλο"] {
        let json_name = serde_json::to_string(name).unwrap();
        let model = mixtral_config(&dir, "ok.json", &format!(r#", "_name_or_path": {json_name}"#));
        let out = Command::new(env!("CARGO_BIN_EXE_piper")).args(["model", "--model", &model]).output().unwrap();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A field of the wrong type, or a value whose derived count would wrap, is reported as itself.
#[test]
fn errors_name_the_field_that_is_wrong() {
    let dir = scratch("t7");
    for value in ["7", "true", "[\"mixtral\"]", "{\"name\": \"mixtral\"}"] {
        let model = mixtral_config(&dir, "t.json", &format!(r#", "model_type": {value}"#));
        refused(&dir, &["model", "--model", &model], &["`model_type` must be a string", "mixtral"]);
    }
    for top in [u64::MAX, u64::MAX - 1, 1 << 40, 4] {
        let loads = dir.join("loads.json");
        let text = format!(r#"{{"loads": [100, 90, 10, 0], "placement": [0, 0, 1, {top}], "model": "tiny"}}"#);
        std::fs::write(&loads, text).unwrap();
        refused(&dir, &["migrate", "--loads", loads.to_str().unwrap()], &["`placement` holds rank", &top.to_string()]);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
