//! `gpufuse node`: `gpufuse serve` plus the agent that registers with a controller.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;

/// `K=V`.
pub fn label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && !k.contains(';') && !v.contains(';') => {
            Ok((k.to_string(), v.to_string()))
        }
        _ => Err(format!("expected KEY=VALUE, not {s:?}")),
    }
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct NodeArgs {
    #[command(subcommand)]
    action: Option<Box<crate::drain::NodeAction>>,
    /// The controller's address.
    #[arg(long, required = true)]
    controller: Option<gpufuse_transport::Address>,
    /// The node's name in the pool (the host name by default).
    #[arg(long, conflicts_with = "kubernetes")]
    name: Option<String>,
    /// Join the pool as this host's Kubernetes node: named $NODE_NAME (the DaemonSet passes
    /// spec.nodeName), the name a GPUPool's members have, with the Node object's labels (read
    /// once at start through kube's client: in-cluster account, KUBECONFIG or ~/.kube/config),
    /// and --label's besides, which win.
    #[arg(long)]
    kubernetes: bool,
    /// A label sessions may select (`gpufuse run --selector K=V`); may be given several times.
    #[arg(long, value_parser = label)]
    label: Vec<(String, String)>,
    /// The address clients are sent to (the first --listen by default).
    #[arg(long)]
    advertise: Option<gpufuse_transport::Address>,
    /// The token this node presents to a controller that checks tokens. Default: with
    /// --token-secret-file (the controller's secret, shared), a token the node signs itself.
    #[arg(
        long,
        env = "GPUFUSE_TOKEN",
        default_value = "",
        hide_env_values = true
    )]
    token: String,
    #[command(flatten)]
    serve: crate::ServeArgs,
}

pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".into())
}

pub fn node(a: NodeArgs) -> anyhow::Result<()> {
    if let Some(action) = a.action {
        return crate::drain::run(*action);
    }
    let controller = a.controller.clone().context("--controller is required")?;
    let advertise = match a.advertise {
        Some(addr) => addr,
        None => {
            let first = a.serve_first_listen().context("--listen is required")?;
            if let gpufuse_transport::Address::Tcp(hp) | gpufuse_transport::Address::TcpTls(hp) =
                &first
            {
                anyhow::ensure!(
                    !(hp.starts_with("0.0.0.0:") || hp.starts_with("[::]:") || hp.ends_with(":0")),
                    "--listen {first} is not an address clients can be sent to: give --advertise"
                );
            }
            first
        }
    };
    let (name, mut labels) = if a.kubernetes {
        crate::k8s::node_identity()?
    } else {
        (a.name.unwrap_or_else(host_name), BTreeMap::new())
    };
    labels.extend(a.label);
    let token = match (a.token.is_empty(), a.serve.token_secret()?) {
        (true, Some(secret)) => agent_token(&secret, &name)?,
        _ => a.token,
    };
    tracing::info!(
        "node {name} joins the pool at {controller} with {} label(s)",
        labels.len()
    );
    let link =
        gpufuse_node::agent::PoolLink::new(controller, name, advertise.to_string(), labels, token);
    let mut config = a.serve.node_config()?;
    config.pool = Some(Arc::new(link));
    gpufuse_node::serve(config)?;
    Ok(())
}

/// The token a node signs itself with the secret it shares with its controller, to register
/// (subject `node/NAME`, no expiry: it is presented on every reconnection).
fn agent_token(secret: &[u8], name: &str) -> anyhow::Result<String> {
    let claims = gpufuse_auth::Claims {
        subject: format!("node/{name}"),
        ..Default::default()
    };
    gpufuse_auth::issue(secret, &claims).context("cannot sign the node's token")
}

impl NodeArgs {
    pub(crate) fn log_format(&self) -> Option<crate::LogFormat> {
        self.serve.log_format
    }

    fn serve_first_listen(&self) -> Option<gpufuse_transport::Address> {
        self.serve.first_listen()
    }
}
