//! `gpufuse run`: asks the node whether it would admit the session, then runs the program with
//! the shim first on `LD_LIBRARY_PATH`.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use gpufuse_client::Connection;
use gpufuse_proto::{Qos, ResourceRequest, ServerHello, SessionKind};

fn vram_size(s: &str) -> Result<u64, String> {
    gpufuse_node::parse_size(s)
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("expected {}", gpufuse_node::SIZE_FORMS))
}

#[derive(clap::Args)]
pub struct RunArgs {
    #[arg(long, env = "GPUFUSE_SERVER")]
    server: gpufuse_transport::Address,
    /// VRAM for the session (e.g. 4GiB, 1.5GiB, 512MiB); the program sees this much.
    #[arg(long, value_name = "SIZE", value_parser = vram_size)]
    vram: Option<u64>,
    /// Compute share in percent (1-100).
    #[arg(long, value_name = "PCT", value_parser = clap::value_parser!(u32).range(1..=100))]
    compute: Option<u32>,
    /// Compute in TFLOPS: a share of the device's peak FP32 throughput (instead of --compute).
    #[arg(long)]
    tflops: Option<u32>,
    /// low | medium | high | critical
    #[arg(long)]
    qos: Option<Qos>,
    #[command(flatten)]
    pub tls: crate::tls::ClientTlsArgs,
    #[arg(long, env = "GPUFUSE_TOKEN")]
    token: Option<String>,
    /// Start the program without asking the node first whether it would admit the session.
    #[arg(long)]
    no_check: bool,
    /// Pool: the tenant charged (its quota); on a controller that checks tokens, the
    /// token's subject (which this must match, if given).
    #[arg(long)]
    tenant: Option<String>,
    /// Pool: only nodes with this label (KEY=VALUE; may be given several times).
    #[arg(long, value_name = "KEY=VALUE", value_parser = crate::node::label)]
    selector: Vec<(String, String)>,
    /// Pool: only GPUs whose model name contains this (case-insensitive), e.g. B200.
    #[arg(long)]
    gpu_model: Option<String>,
    /// Pool: seconds to wait for capacity when no GPU has room now (the controller's
    /// default is 8 s).
    #[arg(long, value_name = "SECONDS")]
    wait: Option<u64>,
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
    // Links into another build (a copied target directory) would load another build's shim:
    // they must point at this binary's own libraries.
    if links
        .iter()
        .all(|(n, to)| std::fs::read_link(target.join(n)).is_ok_and(|l| &l == to))
    {
        return Ok(target);
    }
    let tmp = dir.join(format!(".gpufuse-shim-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    for (name, to) in &links {
        std::os::unix::fs::symlink(to, tmp.join(name))
            .with_context(|| format!("cannot create the link {}", tmp.join(name).display()))?;
    }
    let _ = std::fs::remove_dir_all(&target);
    if std::fs::rename(&tmp, &target).is_err() {
        // Another `gpufuse run` made it first.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    Ok(target)
}

/// gpufuse's NVRTC interposer built beside the `gpufuse` binary (`crates/nvrtc-shim`: NVRTC's
/// cubins come with their PTX, which the emulated GPU runs), if it was built.
fn nvrtc_interposer() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let lib = exe.parent()?.join("libgpufuse_nvrtc.so");
    lib.exists().then_some(lib)
}

/// `LD_PRELOAD` with `lib` first (the loader takes colons or spaces between entries).
fn prepend_preload(lib: &Path) -> String {
    match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.trim().is_empty() => format!("{}:{old}", lib.display()),
        _ => lib.display().to_string(),
    }
}

fn prepend(var: &str, dir: &Path) -> String {
    match std::env::var(var) {
        Ok(old) if !old.is_empty() => format!("{}:{old}", dir.display()),
        _ => dir.display().to_string(),
    }
}

/// Asks the node whether a session with these resources would be admitted now, so a refusal
/// is reported with the node's reason before the program starts (a refused program would only
/// see "no CUDA-capable device").
fn check_admission(a: &RunArgs, token: &str, resources: &ResourceRequest) -> anyhow::Result<()> {
    let mut hello = Connection::hello(SessionKind::Check, token.to_string(), resources.clone());
    // This process becomes the program (exec), so the pid is the program's.
    hello.program = a.command[0].clone();
    let not_started = || format!("{} was not started", a.command[0]);
    match Connection::one_shot(&a.server, &hello) {
        Ok(ServerHello::Admissible { .. }) => Ok(()),
        Ok(ServerHello::Refused { reason }) => anyhow::bail!(
            "the gpufuse server at {} refused the session: {reason}; {}",
            a.server,
            not_started()
        ),
        Ok(_) => anyhow::bail!(
            "the gpufuse server at {} gave an unexpected answer to the admission check; {}",
            a.server,
            not_started()
        ),
        Err(e) => Err(anyhow::Error::new(e).context(not_started())),
    }
}

pub fn run(a: RunArgs) -> anyhow::Result<()> {
    let dir = shim_dir()?;
    let resources = ResourceRequest {
        vram_bytes: a.vram,
        compute_percent: a.compute,
        tflops: a.tflops,
        qos: a.qos.unwrap_or_default(),
    };
    // A pool's placement options travel in the token (gpufuse_controller::ask).
    let ask = gpufuse_controller::PlacementAsk {
        tenant: a.tenant.clone(),
        selector: a.selector.iter().cloned().collect(),
        gpu_model: a.gpu_model.clone(),
        wait_s: a.wait,
        token: a.token.clone().unwrap_or_default(),
    };
    let token = ask.encode().map_err(|e| anyhow::anyhow!("{e}"))?;
    if !a.no_check {
        check_admission(&a, &token, &resources)?;
    }
    let mut cmd = std::process::Command::new(&a.command[0]);
    cmd.args(&a.command[1..])
        .env("LD_LIBRARY_PATH", prepend("LD_LIBRARY_PATH", &dir))
        .env("GPUFUSE_SERVER", a.server.to_string());
    if let Some(bytes) = a.vram {
        cmd.env("GPUFUSE_VRAM", bytes.to_string());
    }
    if let Some(c) = a.compute {
        cmd.env("GPUFUSE_COMPUTE", c.to_string());
    }
    if let Some(t) = a.tflops {
        cmd.env("GPUFUSE_TFLOPS", t.to_string());
    }
    if let Some(q) = a.qos {
        cmd.env("GPUFUSE_QOS", q.name());
    }
    if a.token.is_some() || !ask.is_plain() {
        cmd.env("GPUFUSE_TOKEN", &token);
    }
    if let Some(w) = a.wait {
        // The client waits for the controller's answer longer than the controller waits for
        // capacity.
        let timeout = std::env::var("GPUFUSE_HELLO_TIMEOUT")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(10.0)
            .max(w as f64 + 10.0);
        cmd.env("GPUFUSE_HELLO_TIMEOUT", timeout.to_string());
    }
    if let Some(nvrtc) = nvrtc_interposer() {
        cmd.env("LD_PRELOAD", prepend_preload(&nvrtc));
    }
    // exec: the program's exit status, stdout and stderr are its own.
    let err = cmd.exec();
    anyhow::bail!("cannot run {}: {err}", a.command[0])
}
