//! `gpufuse serve`: a node and its own controller in one process, with no configuration.
//!
//! The node's sessions are placed by an in-process `gpufuse_controller::Controller` (the same
//! policies, quotas, pending queue and preemption as a pool's controller); the node reports to
//! it by a call, and its clients are admitted where it says without a redirect.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use gpufuse_proto::{ClientHello, Grant, NodeReport, PoolPendingView};

#[derive(clap::Args)]
pub struct ServeCommand {
    #[command(flatten)]
    pub node: crate::ServeArgs,
    /// How sessions are placed on this machine's GPUs. balanced (the default): the emptiest
    /// GPU; binpack: the fullest GPU that fits (keeps whole GPUs free); spread: the emptiest,
    /// least busy GPU.
    #[arg(long, default_value = "balanced")]
    policy: gpufuse_scheduler::Policy,
    /// Tenant quotas (TOML: see docs/pool.md); a session's tenant is its token's subject or
    /// `gpufuse run --tenant`. Re-read when its contents change (looked at every second) and
    /// on SIGHUP; a file that does not parse is logged and the quotas in force stay.
    #[arg(long, value_name = "FILE")]
    quota_file: Option<PathBuf>,
    /// How long a session that fits nowhere waits for capacity when its client names no wait
    /// (`gpufuse run --wait`), in seconds. 0 (the default): it is refused at once, with the
    /// reason, as a full GPU answers; a pool's controller waits 8 s by default, its capacity
    /// changing all the time (docs/pool.md). A client that asks to wait is queued either way.
    #[arg(long, default_value_t = 0, value_name = "SECONDS")]
    default_wait: u64,
}

impl ServeCommand {
    pub(crate) fn log_format(&self) -> Option<crate::LogFormat> {
        self.node.log_format
    }
}

/// The controller as the node sees it in its own process.
struct Embedded(gpufuse_controller::Controller);

impl gpufuse_node::agent::LocalController for Embedded {
    fn grant_key(&self) -> Vec<u8> {
        self.0.grant_key()
    }
    fn report(&self, report: &NodeReport) {
        self.0.report_local(report);
    }
    fn place(
        &self,
        hello: &ClientHello,
        hung_up: &mut dyn FnMut() -> bool,
    ) -> Result<Grant, String> {
        self.0.place_local(hello, hung_up)
    }
    fn check(&self, hello: &ClientHello) -> Result<bool, String> {
        self.0.check_local(hello)
    }
    fn pending(&self) -> Vec<PoolPendingView> {
        self.0.pending()
    }
}

pub fn serve(a: ServeCommand) -> anyhow::Result<()> {
    let first = a.node.first_listen().context("--listen is required")?;
    let mut cc = gpufuse_controller::ControllerConfig::new(Vec::new());
    cc.policy = a.policy;
    if let Some(p) = &a.quota_file {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?;
        cc.quotas = gpufuse_scheduler::QuotaFile::parse(&text)
            .with_context(|| format!("quota file {}", p.display()))?;
    }
    cc.token_secret = a.node.token_secret()?;
    cc.default_wait = Duration::from_secs(a.default_wait);
    let controller = gpufuse_controller::Controller::new(cc);
    if let Some(p) = &a.quota_file {
        crate::controller::watch_quota_file(&controller, p)?;
    }
    controller.start_embedded();
    let link = gpufuse_node::agent::PoolLink::in_process(
        crate::node::host_name(),
        first,
        Arc::new(Embedded(controller)),
    );
    let mut config = a.node.node_config()?;
    config.pool = Some(Arc::new(link));
    gpufuse_node::serve(config)?;
    Ok(())
}
