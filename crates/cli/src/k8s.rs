//! Kubernetes: `gpufuse dra-plugin` (the DRA kubelet plugin, beside `gpufuse serve` on each
//! node), `gpufuse operator` and `gpufuse controller --kubernetes` (GPUPool/GPUQuota into a
//! controller's ledger), `gpufuse webhook` (shim injection for clusters without DRA), and
//! `gpufuse node --kubernetes`'s name and labels. Thin over `gpufuse-k8s`. The Kubernetes
//! connection is kube's: in-cluster service account, else `KUBECONFIG` or `~/.kube/config`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

#[derive(clap::Args)]
pub struct DraPluginArgs {
    /// The Kubernetes node this runs on (the DaemonSet passes spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// The gpufuse node, as this process reaches it.
    #[arg(long, default_value = "unix:/var/run/gpufuse/node.sock")]
    server: gpufuse_transport::Address,
    /// The gpufuse node, as containers reach it (default: --server; a unix socket's
    /// directory is mounted into the container).
    #[arg(long)]
    container_server: Option<gpufuse_transport::Address>,
    /// The node's token secret (`gpufuse serve --token-secret-file`): claims get tokens
    /// signed with it.
    #[arg(long)]
    token_secret_file: PathBuf,
    /// The kubelet's directory: sockets go to plugins/gpu.gpufuse.dev/dra.sock and
    /// plugins_registry/gpu.gpufuse.dev-reg.sock under it.
    #[arg(long, default_value = "/var/lib/kubelet")]
    kubelet_dir: PathBuf,
    /// Where CDI specs go (the container runtime reads them).
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// The host directory holding libcuda.so.1 and libnvidia-ml.so.1.
    #[arg(long, default_value = "/var/lib/gpufuse/lib")]
    host_lib_dir: PathBuf,
    /// Where that directory appears in containers.
    #[arg(long, default_value = "/usr/local/gpufuse/lib")]
    container_lib_dir: PathBuf,
    /// Seconds between reads of the node's devices (and slice updates).
    #[arg(long, default_value_t = 30)]
    resync: u64,
}

#[derive(clap::Args)]
pub struct OperatorArgs {
    #[command(subcommand)]
    command: Option<OperatorCommand>,
    /// Seconds between full passes (changes also start one).
    #[arg(long, default_value_t = 30)]
    interval: u64,
}

#[derive(clap::Subcommand)]
enum OperatorCommand {
    /// Print the GPUPool and GPUQuota CRDs (YAML).
    Crds,
    /// Print the DeviceClass claims name (YAML).
    DeviceClass,
}

#[derive(clap::Args)]
pub struct WebhookArgs {
    /// HOST:PORT to listen on.
    #[arg(long, default_value = "0.0.0.0:8443")]
    listen: String,
    /// Serving certificate and key (PEM); without them the webhook speaks plain HTTP (only
    /// behind a TLS-terminating proxy: the API server calls webhooks over HTTPS).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// GPUFUSE_SERVER for injected pods (the controller's or a node's address).
    #[arg(long)]
    server: String,
    /// The gpufuse image the init container runs (it copies the shims).
    #[arg(long)]
    image: String,
    #[arg(long)]
    token_secret_file: PathBuf,
    /// Seconds an injected token lives (default: no expiry).
    #[arg(long)]
    token_ttl: Option<u64>,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("stopping");
}

async fn kube_client() -> anyhow::Result<kube::Client> {
    kube::Client::try_default().await.context(
        "cannot reach the Kubernetes API (in-cluster account, KUBECONFIG or ~/.kube/config)",
    )
}

pub fn dra_plugin(a: DraPluginArgs) -> anyhow::Result<()> {
    let secret = crate::token::read_secret(&a.token_secret_file)?;
    let config = gpufuse_k8s::driver::DriverConfig {
        node_name: a.node_name,
        sockets: gpufuse_k8s::plugin::Sockets::under(&a.kubelet_dir),
        cdi_dir: a.cdi_dir,
        layout: gpufuse_k8s::cdi::Layout {
            host_lib_dir: a.host_lib_dir,
            container_lib_dir: a.container_lib_dir,
            container_server: a.container_server.unwrap_or_else(|| a.server.clone()),
            host_server: a.server,
        },
        secret,
        resync: Duration::from_secs(a.resync.max(1)),
    };
    runtime()?.block_on(async move {
        let client = kube_client().await?;
        gpufuse_k8s::driver::run(config, client, shutdown_signal()).await
    })
}

pub fn operator(a: OperatorArgs) -> anyhow::Result<()> {
    match a.command {
        Some(OperatorCommand::Crds) => {
            print!("{}", gpufuse_k8s::crd::crds_yaml());
            Ok(())
        }
        Some(OperatorCommand::DeviceClass) => {
            print!("{}", gpufuse_k8s::slice::device_class_yaml());
            Ok(())
        }
        None => {
            // A controller that listens nowhere: the same ledger and quota arithmetic as
            // `gpufuse controller --kubernetes`, without the pool's sessions.
            let controller = gpufuse_controller::Controller::new(
                gpufuse_controller::ControllerConfig::new(Vec::new()),
            );
            let rt = runtime()?;
            let client = rt.block_on(kube_client())?;
            rt.block_on(async move {
                tokio::select! {
                    () = run_operator(client, controller, a.interval) => {}
                    () = shutdown_signal() => {}
                }
            });
            Ok(())
        }
    }
}

async fn run_operator(
    client: kube::Client,
    controller: gpufuse_controller::Controller,
    interval: u64,
) {
    let op = gpufuse_k8s::operator::Operator {
        client,
        backend: gpufuse_k8s::operator::ControllerPool::new(controller),
        instance: std::env::var("POD_NAME").unwrap_or_else(|_| "gpufuse-operator".into()),
    };
    gpufuse_k8s::operator::run(
        op,
        Duration::from_secs(interval.max(1)),
        Duration::from_millis(200),
    )
    .await;
}

/// `gpufuse controller --kubernetes`: the operator on its own thread, reconciling into
/// `controller`'s ledger. Fails at once when the Kubernetes API cannot be reached.
pub fn start_operator(
    controller: gpufuse_controller::Controller,
    interval: u64,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let rt = runtime()?;
    let client = rt.block_on(kube_client())?;
    Ok(std::thread::Builder::new()
        .name("k8s-operator".into())
        .spawn(move || {
            rt.block_on(run_operator(client, controller, interval));
            tracing::warn!("the Kubernetes operator stopped: its watches ended");
        })?)
}

/// How long `gpufuse node --kubernetes` waits for the API server at start.
const NODE_LABELS_WAIT: Duration = Duration::from_secs(30);

/// `gpufuse node --kubernetes`: the node's name ($NODE_NAME, the DaemonSet's spec.nodeName)
/// and its Kubernetes node's labels. Fails when either cannot be had: a node registered
/// under another name would not be a member of its GPUPools.
pub fn node_identity() -> anyhow::Result<(String, std::collections::BTreeMap<String, String>)> {
    let name = std::env::var("NODE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .context("--kubernetes names the node $NODE_NAME, which is not set (the DaemonSet sets it from spec.nodeName)")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let read = async {
        let client = kube_client().await?;
        gpufuse_k8s::node_labels::node_labels(client, &name).await
    };
    // The node starts only once it knows its labels: a silent API server is an error the
    // kubelet restarts it on, not a hang.
    let labels = rt
        .block_on(async { tokio::time::timeout(NODE_LABELS_WAIT, read).await })
        .map_err(|_| {
            anyhow::anyhow!(
                "--kubernetes: the API server did not answer for node {name}'s labels within {} s",
                NODE_LABELS_WAIT.as_secs()
            )
        })??;
    Ok((name, labels))
}

pub fn webhook(a: WebhookArgs) -> anyhow::Result<()> {
    let config = gpufuse_k8s::webhook::WebhookConfig {
        server: a.server,
        image: a.image,
        secret: crate::token::read_secret(&a.token_secret_file)?,
        token_ttl: a.token_ttl,
    };
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(c), Some(k)) => {
            Some(gpufuse_transport::tls::ServerTls::from_files(c, k, None)?.rustls_config())
        }
        _ => None,
    };
    runtime()?.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&a.listen)
            .await
            .with_context(|| format!("cannot listen on {}", a.listen))?;
        tracing::info!(
            "webhook listening on {} ({})",
            a.listen,
            if tls.is_some() { "HTTPS" } else { "plain HTTP" }
        );
        tokio::select! {
            r = gpufuse_k8s::webhook::serve(config, listener, tls) => r?,
            () = shutdown_signal() => {}
        }
        Ok::<(), anyhow::Error>(())
    })
}
