//! `gpufuse controller`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

#[derive(clap::Args)]
pub struct ControllerArgs {
    /// unix:PATH, tcp:HOST:PORT or tcp+tls:HOST:PORT (with --tls-cert and --tls-key); may be
    /// given several times. Nodes and clients both connect here.
    #[arg(long, required = true)]
    listen: Vec<gpufuse_transport::Address>,
    /// binpack: fill the fullest GPU that fits (frees whole GPUs); spread: the emptiest, least
    /// busy GPU (least interference); balanced: the fullest node, the emptiest GPU on it.
    #[arg(long, default_value = "balanced")]
    policy: gpufuse_scheduler::Policy,
    /// Tenant quotas (TOML: see docs/pool.md). Re-read when its contents change (looked at
    /// every second) and on SIGHUP: new limits apply to new sessions and to those waiting; a
    /// file that does not parse is logged and the quotas in force stay.
    #[arg(long, value_name = "FILE")]
    quota_file: Option<PathBuf>,
    /// Require tokens signed with the secret in this file from clients and nodes (`gpufuse
    /// token`); a session's tenant is its token's subject.
    #[arg(long, value_name = "FILE")]
    token_secret_file: Option<PathBuf>,
    /// How often nodes report, in milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    heartbeat_ms: u64,
    /// Silence after which a node is lost (nothing is placed there), in milliseconds; the
    /// controller notices within 100 ms more (the default: lost within 5 s).
    #[arg(long, default_value_t = gpufuse_controller::DEFAULT_NODE_TIMEOUT.as_millis() as u64, value_parser = clap::value_parser!(u64).range(20..=600_000))]
    node_timeout_ms: u64,
    /// How long a session waits for capacity when its client names no wait (`gpufuse run
    /// --wait`), in seconds; keep it under the clients' hello timeout (10 s by default).
    #[arg(long, default_value_t = 8)]
    default_wait: u64,
    /// Defragment the pool: devices with less than PCT% of their memory promised are emptied
    /// into other devices of their model when all their sessions fit there (moved live, their
    /// programs unaware), freeing whole GPUs. A round every --defrag-interval, and every 2 s
    /// while sessions wait for capacity. Off by default.
    #[arg(long, value_name = "PCT", value_parser = clap::value_parser!(u32).range(1..=100))]
    defrag: Option<u32>,
    /// Seconds between defragmentation rounds.
    #[arg(
        long,
        default_value_t = 30,
        requires = "defrag",
        value_name = "SECONDS"
    )]
    defrag_interval: u64,
    /// Also run the Kubernetes operator in this process (kube's client: in-cluster account,
    /// KUBECONFIG or ~/.kube/config): each namespace's GPUQuota becomes that tenant's quota
    /// here, and allocated ResourceClaims are charged to it, so claims and sessions share one
    /// quota (docs/kubernetes.md).
    #[arg(long)]
    kubernetes: bool,
    /// With --kubernetes: seconds between the operator's full passes (changes also start one).
    #[arg(long, default_value_t = 30, requires = "kubernetes")]
    kubernetes_interval: u64,
    #[command(flatten)]
    tls: crate::tls::ServerTlsArgs,
    #[command(flatten)]
    observe: crate::observe::HttpArgs,
}

pub fn controller(a: ControllerArgs) -> anyhow::Result<()> {
    let mut config = gpufuse_controller::ControllerConfig::new(a.listen);
    config.policy = a.policy;
    if let Some(p) = &a.quota_file {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?;
        config.quotas = gpufuse_scheduler::QuotaFile::parse(&text)
            .with_context(|| format!("quota file {}", p.display()))?;
    }
    if let Some(p) = &a.token_secret_file {
        config.token_secret = Some(crate::token::read_secret(p)?);
    }
    config.heartbeat = Duration::from_millis(a.heartbeat_ms);
    config.node_timeout = Duration::from_millis(a.node_timeout_ms);
    config.default_wait = Duration::from_secs(a.default_wait);
    config.defrag = a.defrag;
    config.defrag_interval = Duration::from_secs(a.defrag_interval.max(1));
    config.tls = a.tls.load()?;
    let controller = gpufuse_controller::Controller::new(config);
    if let Some(p) = &a.quota_file {
        watch_quota_file(&controller, p)?;
    }
    // `--http`: the pool's metrics, health and dashboard, kept up while the controller serves.
    let _http = match a.observe.config()? {
        Some(h) => Some(gpufuse_observe::serve(
            h.addr,
            std::sync::Arc::new(controller.clone()),
            h.options,
        )?),
        None => None,
    };
    let _operator = if a.kubernetes {
        Some(crate::k8s::start_operator(
            controller.clone(),
            a.kubernetes_interval,
        )?)
    } else {
        None
    };
    controller.serve()?;
    Ok(())
}

/// Keeps `controller`'s quotas those of the file at `path`: re-read when it changes and on
/// SIGHUP (`gpufuse controller` and `gpufuse serve` with `--quota-file`).
pub(crate) fn watch_quota_file(
    controller: &gpufuse_controller::Controller,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    let mut hup = signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP])
        .context("cannot handle SIGHUP")?;
    std::thread::Builder::new()
        .name("sighup".into())
        .spawn(move || {
            for _ in hup.forever() {
                if tx.send(()).is_err() {
                    return;
                }
            }
        })
        .context("cannot start the SIGHUP thread")?;
    controller.watch_quota_file(path.to_path_buf(), gpufuse_controller::QUOTA_POLL, Some(rx));
    Ok(())
}
