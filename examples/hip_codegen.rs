//! Every MoE kernel as HIP C++ and as an AMDGPU code object for a GPU architecture (default gfx90a,
//! Frontier's MI250X), with the registers and memory each uses — without a GPU.
//!
//! ```text
//! cargo run --release --features hip-codegen --example hip_codegen -- [--arch gfx90a] [--out DIR] [--json FILE]
//! ```
//! Writes `DIR/<kernel>.hip` and `DIR/<kernel>.co`; `--json` writes the resource table.

use clap::Parser;
use kernels_cubecl::hip::hip_sources;
use kernels_cubecl::hiprtc::HipRtc;

#[derive(Parser)]
struct Args {
    /// AMD GPU architecture (gfx90a = MI250X, gfx942 = MI300X; HIP 5.2 knows up to gfx90a).
    #[arg(long, default_value = "gfx90a")]
    arch: String,
    /// Directory for the sources and code objects.
    #[arg(long, default_value = "target/hip-kernels")]
    out: std::path::PathBuf,
    /// Resource table as JSON.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), String> {
    let rtc = HipRtc::load()?;
    std::fs::create_dir_all(&args.out).map_err(|e| format!("--out {}: {e}", args.out.display()))?;
    println!("{:<26} {:>5} {:>5} {:>7} {:>7} {:>8}", "kernel", "VGPR", "SGPR", "spills", "LDS B", "code B");
    let mut rows = Vec::new();
    for k in hip_sources()? {
        let co = rtc.compile(k.name, &k.source, &args.arch)?;
        let write = |ext: &str, bytes: &[u8]| {
            let path = args.out.join(format!("{}.{ext}", k.name));
            piper::planner::atomic::write_atomic(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))
        };
        write("hip", k.source.as_bytes())?;
        write("co", &co.bytes)?;
        println!(
            "{:<26} {:>5} {:>5} {:>7} {:>7} {:>8}",
            k.name,
            co.vgpr_count,
            co.sgpr_count,
            co.spill_count,
            co.lds_bytes as usize + k.dynamic_shared_bytes,
            co.bytes.len()
        );
        rows.push(serde_json::json!({
            "kernel": k.name, "target": co.target, "vgpr": co.vgpr_count, "sgpr": co.sgpr_count,
            "spills": co.spill_count, "lds_bytes": co.lds_bytes as usize + k.dynamic_shared_bytes,
            "dynamic_shared_bytes": k.dynamic_shared_bytes, "scratch_bytes": co.scratch_bytes,
            "code_object_bytes": co.bytes.len(),
        }));
    }
    println!("sources and code objects in {}", args.out.display());
    if let Some(path) = &args.json {
        let doc = serde_json::json!({ "arch": args.arch, "compiler": format!("HIP RTC ({})", rtc.library()), "kernels": rows });
        piper::planner::atomic::write_atomic(path, serde_json::to_string_pretty(&doc).unwrap().as_bytes())
            .map_err(|e| format!("--json {}: {e}", path.display()))?;
    }
    Ok(())
}
