//! `gpufuse run`: runs a program with the shim first on `LD_LIBRARY_PATH`.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct RunArgs {
    #[arg(long, env = "GPUFUSE_SERVER")]
    server: gpufuse_transport::Address,
    /// VRAM for the session (e.g. 4GiB); the program sees this much.
    #[arg(long)]
    vram: Option<String>,
    /// Compute share in percent.
    #[arg(long)]
    compute: Option<u32>,
    /// Compute in TFLOPS: a share of the device's peak FP32 throughput (instead of --compute).
    #[arg(long)]
    tflops: Option<u32>,
    /// low | medium | high | critical
    #[arg(long)]
    qos: Option<String>,
    #[arg(long, env = "GPUFUSE_TOKEN")]
    token: Option<String>,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// A directory next to the `gpufuse` binary holding `libcuda.so.1`, `libcuda.so` and
/// `libnvidia-ml.so.1` links to the shims built beside it. Created once, atomically.
fn shim_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .ok_or_else(|| anyhow::anyhow!("no directory for {}", exe.display()))?;
    let shim = dir.join("libcuda.so");
    anyhow::ensure!(
        shim.exists(),
        "{} is missing: build the workspace (cargo build --release)",
        shim.display()
    );
    let target = dir.join("gpufuse-shim");
    let links: Vec<(&str, PathBuf)> = {
        let mut v = vec![("libcuda.so.1", shim.clone()), ("libcuda.so", shim)];
        let nvml = dir.join("libnvidia_ml.so");
        if nvml.exists() {
            v.push(("libnvidia-ml.so.1", nvml.clone()));
            v.push(("libnvidia-ml.so", nvml));
        }
        v
    };
    if links.iter().all(|(n, _)| target.join(n).exists()) {
        return Ok(target);
    }
    let tmp = dir.join(format!(".gpufuse-shim-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    for (name, to) in &links {
        std::os::unix::fs::symlink(to, tmp.join(name))?;
    }
    let _ = std::fs::remove_dir_all(&target);
    if std::fs::rename(&tmp, &target).is_err() {
        // Another `gpufuse run` made it first.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    Ok(target)
}

fn prepend(var: &str, dir: &Path) -> String {
    match std::env::var(var) {
        Ok(old) if !old.is_empty() => format!("{}:{old}", dir.display()),
        _ => dir.display().to_string(),
    }
}

pub fn run(a: RunArgs) -> anyhow::Result<()> {
    let dir = shim_dir()?;
    let mut cmd = std::process::Command::new(&a.command[0]);
    cmd.args(&a.command[1..])
        .env("LD_LIBRARY_PATH", prepend("LD_LIBRARY_PATH", &dir))
        .env("GPUFUSE_SERVER", a.server.to_string());
    if let Some(v) = &a.vram {
        let bytes = gpufuse_node::parse_size(v).ok_or_else(|| anyhow::anyhow!("bad --vram {v}"))?;
        cmd.env("GPUFUSE_VRAM", bytes.to_string());
    }
    if let Some(c) = a.compute {
        anyhow::ensure!((1..=100).contains(&c), "--compute is a percentage (1-100)");
        cmd.env("GPUFUSE_COMPUTE", c.to_string());
    }
    if let Some(t) = a.tflops {
        cmd.env("GPUFUSE_TFLOPS", t.to_string());
    }
    if let Some(q) = &a.qos {
        anyhow::ensure!(
            ["low", "medium", "high", "critical"].contains(&q.as_str()),
            "--qos is low, medium, high or critical"
        );
        cmd.env("GPUFUSE_QOS", q);
    }
    if let Some(t) = &a.token {
        cmd.env("GPUFUSE_TOKEN", t);
    }
    // exec: the program's exit status, stdout and stderr are its own.
    let err = cmd.exec();
    anyhow::bail!("cannot run {}: {err}", a.command[0])
}
