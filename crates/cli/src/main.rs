//! The `gpufuse` command. Thin: each subcommand is a module over the library crates.
//!
//! Subcommands: serve, controller, node, run, status (a node's view or the pool's), sessions,
//! kill, migrate, token, certs, simulate, top (ratatui), report, completions, man, and the
//! Kubernetes commands (`k8s.rs`: dra-plugin, operator, webhook; `controller --kubernetes`;
//! `node --kubernetes`'s name and labels); `worker` is the process a node starts per session.
//! `build.rs` records the git commit for `--version`.

mod admin;
mod controller;
mod drain;
mod k8s;
mod migrate;
mod node;
mod observe;
mod pool_status;
mod report;
mod run;
mod serve;
mod simulate;
mod status;
mod tls;
mod token;
mod top;
mod worker;

use clap::{Parser, Subcommand};

/// `--version`: the crate version and the commit it was built from (`build.rs`).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("GPUFUSE_GIT_COMMIT"),
    ")"
);

const LOGGING_HELP: &str = "\
Logging: `gpufuse serve` and its workers log to stderr at level info. Set GPUFUSE_LOG to change
it: GPUFUSE_LOG=debug, GPUFUSE_LOG=warn, or per module, e.g. GPUFUSE_LOG=info,gpufuse_node=debug
(tracing's EnvFilter syntax). Colour is used only when stderr is a terminal and NO_COLOR is unset.
GPUFUSE_LOG_FORMAT=json (or `gpufuse serve --log-format json`): one JSON object a line, each
with its session's span (id, tenant, node, device).

Environment: GPUFUSE_SERVER (--server), GPUFUSE_TOKEN (--token), GPUFUSE_LOG (log level),
GPUFUSE_HELLO_TIMEOUT (seconds a client waits for the server's answer to its hello; 10),
GPUFUSE_CALL_TIMEOUT (seconds a CUDA call may hear nothing from its worker, which sends a
heartbeat every 250 ms while it works; 30), GPUFUSE_TLS_CA, GPUFUSE_TLS_CERT, GPUFUSE_TLS_KEY
(--tls-ca, --tls-cert, --tls-key of clients reaching tcp+tls: servers).";

#[derive(Parser)]
#[command(
    name = "gpufuse",
    version = VERSION,
    about = "GPU virtualization and pooling: remote CUDA, enforced slices, one pool",
    after_help = LOGGING_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node and its own controller: place sessions on this machine's GPUs (or emulated ones) and serve them.
    #[command(after_help = LOGGING_HELP)]
    Serve(serve::ServeCommand),
    /// Run a program with gpufuse's libcuda.so.1 in place of NVIDIA's.
    Run(run::RunArgs),
    /// Show a node's devices and sessions, or a pool's nodes, devices, sessions and queue.
    Status(status::StatusArgs),
    /// Create a token secret or issue session tokens.
    Token(token::TokenArgs),
    /// List a node's sessions.
    Sessions(admin::SessionsArgs),
    /// End a session: its worker is killed, its memory freed, and its program's next CUDA call
    /// fails with CUDA_ERROR_DEVICE_UNAVAILABLE.
    Kill(admin::KillArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions(admin::CompletionsArgs),
    /// Make a CA, a server certificate and a client certificate for tcp+tls: listeners.
    Certs(tls::CertsArgs),
    /// Print gpufuse's man page (roff) to stdout: `gpufuse man | man -l -`; `gpufuse man serve`
    /// prints gpufuse-serve(1).
    Man(admin::ManArgs),
    /// Run a pool's controller: nodes register with it, clients ask it for a GPU and are sent
    /// to the node that serves them. Holds no GPU.
    #[command(after_help = LOGGING_HELP)]
    Controller(controller::ControllerArgs),
    /// Run a pool node: serve sessions on this machine's GPUs as `serve` does, placed by the
    /// controller this node registers with. `gpufuse node drain|cordon|uncordon NODE
    /// --server CONTROLLER` manage a pool's node.
    #[command(after_help = LOGGING_HELP)]
    Node(node::NodeArgs),
    /// Replay a synthetic cluster trace against a simulated pool, per placement policy and
    /// with one whole GPU per session, and print the table.
    Simulate(simulate::SimulateArgs),
    /// Watch a node's devices and sessions in the terminal, refreshed each second.
    Top(top::TopArgs),
    /// Per-tenant usage and cost over a period, against the same sessions on whole GPUs.
    Report(report::ReportArgs),
    /// Move a session to another device of its node while its program runs.
    Migrate(migrate::MigrateArgs),
    /// (internal) Serve one session; started by `gpufuse serve`.
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
    /// Kubernetes DRA kubelet plugin: publishes this node's GPUs and prepares claims for them.
    DraPlugin(k8s::DraPluginArgs),
    /// Kubernetes operator: reconciles GPUPool and GPUQuota; `crds` prints the CRDs.
    Operator(k8s::OperatorArgs),
    /// Kubernetes mutating webhook: injects the shims into labelled pods (clusters without DRA).
    Webhook(k8s::WebhookArgs),
}

#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    /// unix:PATH, tcp:HOST:PORT or tcp+tls:HOST:PORT (with --tls-cert and --tls-key); may be
    /// given several times.
    #[arg(long, required = true)]
    listen: Vec<gpufuse_transport::Address>,
    /// auto | emu:N[:SIZE] | cuda
    #[arg(long, default_value = "auto")]
    devices: gpufuse_node::DeviceSpec,
    /// Require session tokens signed with the secret in this file (see `gpufuse token`).
    #[arg(long)]
    token_secret_file: Option<std::path::PathBuf>,
    /// hard: a session never runs more than its --compute share, even on an idle device;
    /// elastic: shares divide a busy device, and idle capacity goes to whoever wants it.
    #[arg(long, default_value = "elastic")]
    compute_policy: gpufuse_proto::ComputePolicy,
    #[command(flatten)]
    tls: tls::ServerTlsArgs,
    /// Promise more device memory than there is: host=PCT[,disk=PCT] of each device's memory
    /// may wait in host memory (and on disk, with --swap-dir). When a device runs short,
    /// sessions not running kernels move memory out, least recently active first; it comes
    /// back before their next device work. Off by default.
    #[arg(long, value_name = "host=PCT[,disk=PCT]")]
    vram_oversubscribe: Option<String>,
    /// Where evicted device memory goes on disk.
    #[arg(long)]
    swap_dir: Option<std::path::PathBuf>,
    /// Scale to zero: a session idle this long (500ms, 30s, 5m) gives its device memory back
    /// (to host memory); its next call brings it back.
    #[arg(long, value_parser = gpufuse_node::elastic::parse_duration)]
    idle_ttl: Option<std::time::Duration>,
    /// A session idle this long moves its memory on to disk (needs --swap-dir).
    #[arg(long, value_parser = gpufuse_node::elastic::parse_duration)]
    idle_disk_ttl: Option<std::time::Duration>,
    /// Where the node keeps module images by content hash, shared by its sessions, so that a
    /// program loading the same libraries again sends only their hashes; `off` for none.
    /// Default: $XDG_CACHE_HOME/gpufuse/images, else ~/.cache/gpufuse/images.
    #[arg(long, value_name = "DIR|off")]
    image_cache: Option<std::path::PathBuf>,
    /// The image cache's size limit: least recently used images go beyond it.
    #[arg(long, value_name = "SIZE", default_value = "2GiB",
          value_parser = gpufuse_node::image_cache::parse_limit)]
    image_cache_size: u64,
    /// The directory the DRA plugin writes its CDI specs to (`gpufuse dra-plugin --cdi-dir`):
    /// a claim's token is honoured only while its claim is prepared (its spec is there), and
    /// only on the device Kubernetes allocated. Without it, claim tokens are refused.
    #[arg(long, value_name = "DIR")]
    cdi_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    observe: observe::HttpArgs,
    /// text (the default) or json: one JSON object a line, with the session's span (id,
    /// tenant, node, device). Also GPUFUSE_LOG_FORMAT.
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
}

impl ServeArgs {
    /// The token secret of `--token-secret-file`, if given.
    pub(crate) fn token_secret(&self) -> anyhow::Result<Option<Vec<u8>>> {
        self.token_secret_file
            .as_deref()
            .map(token::read_secret)
            .transpose()
    }

    pub(crate) fn first_listen(&self) -> Option<gpufuse_transport::Address> {
        self.listen.first().cloned()
    }

    /// What `gpufuse serve` (and `gpufuse node`, with its pool link) runs.
    pub(crate) fn node_config(self) -> anyhow::Result<gpufuse_node::NodeConfig> {
        let tokens = match &self.token_secret_file {
            Some(p) => gpufuse_node::TokenPolicy::Verify(token::read_secret(p)?),
            None => gpufuse_node::TokenPolicy::Open,
        };
        let mut elastic = gpufuse_node::ElasticOptions {
            swap_dir: self.swap_dir,
            idle_ttl: self.idle_ttl,
            idle_disk_ttl: self.idle_disk_ttl,
            ..Default::default()
        };
        if let Some(o) = &self.vram_oversubscribe {
            elastic.parse_oversubscribe(o).map_err(anyhow::Error::msg)?;
        }
        if elastic.disk_percent > 0 && elastic.swap_dir.is_none() {
            anyhow::bail!("--vram-oversubscribe disk=PCT needs --swap-dir");
        }
        if elastic.idle_disk_ttl.is_some() && elastic.swap_dir.is_none() {
            anyhow::bail!("--idle-disk-ttl needs --swap-dir");
        }
        if let Some(d) = &elastic.swap_dir {
            std::fs::create_dir_all(d)
                .map_err(|e| anyhow::anyhow!("--swap-dir {}: {e}", d.display()))?;
        }
        let image_cache =
            gpufuse_node::image_cache::open(self.image_cache.as_deref(), self.image_cache_size)
                .map_err(|e| anyhow::anyhow!("--image-cache: {e}"))?;
        Ok(gpufuse_node::NodeConfig {
            elastic,
            image_cache,
            tls: self.tls.load()?,
            client_certs: self.tls.requires_client_certs(),
            listen: self.listen,
            devices: self.devices,
            tokens,
            worker_exe: std::env::current_exe()?,
            compute_policy: self.compute_policy,
            pool: None,
            http: self.observe.config()?,
            cdi_dir: self.cdi_dir,
        })
    }
}

/// Logs go to stderr, coloured only on a terminal and without `NO_COLOR` (no escape codes in
/// log files); one JSON object a line with `--log-format json` or `GPUFUSE_LOG_FORMAT=json`
/// (which the node's workers inherit), each carrying its session span (id, tenant, node,
/// device).
fn init_logs(format: Option<LogFormat>) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let format = match format {
        Some(f) => f,
        None => match std::env::var("GPUFUSE_LOG_FORMAT") {
            Ok(v) => <LogFormat as clap::ValueEnum>::from_str(&v, true)
                .map_err(|_| anyhow::anyhow!("GPUFUSE_LOG_FORMAT={v:?}: expected text or json"))?,
            Err(_) => LogFormat::Text,
        },
    };
    if format == LogFormat::Json {
        // Workers are started by this process: they log the same way.
        std::env::set_var("GPUFUSE_LOG_FORMAT", "json");
    }
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPUFUSE_LOG")
        .unwrap_or_else(|_| "info".into());
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => logs.json().with_current_span(true).init(),
        LogFormat::Text => logs
            .with_ansi(std::io::stderr().is_terminal() && !no_color)
            .init(),
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Errors are printed once, as a chain of causes on one line, without a backtrace.
fn main() -> std::process::ExitCode {
    match run_cli() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // `gpufuse man | head`: the reader left; nothing to report.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gpufuse: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run_cli() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(a) => {
            init_logs(a.log_format())?;
            serve::serve(a)
        }
        Command::Controller(a) => {
            init_logs(None)?;
            controller::controller(a)
        }
        Command::Node(a) => {
            init_logs(a.log_format())?;
            node::node(a)
        }
        Command::Simulate(a) => simulate::simulate(a),
        Command::Run(a) => {
            a.tls.export()?;
            run::run(a)
        }
        Command::Status(a) => {
            a.tls.export()?;
            status::status(a)
        }
        Command::Token(a) => token::token(a),
        Command::Sessions(a) => {
            a.tls.export()?;
            admin::sessions(a)
        }
        Command::Kill(a) => {
            a.tls.export()?;
            admin::kill(a)
        }
        Command::Migrate(a) => {
            a.tls.export()?;
            migrate::migrate(a)
        }
        Command::Completions(a) => admin::completions(a),
        Command::Certs(a) => tls::certs(a),
        Command::Man(a) => admin::man(a),
        Command::Top(a) => {
            a.tls.export()?;
            top::top(a)
        }
        Command::Report(a) => report::report(a),
        Command::Worker(a) => {
            init_logs(None)?;
            worker::worker(a)
        }
        Command::DraPlugin(a) => {
            init_logs(None)?;
            k8s::dra_plugin(a)
        }
        Command::Operator(a) => {
            init_logs(None)?;
            k8s::operator(a)
        }
        Command::Webhook(a) => {
            init_logs(None)?;
            k8s::webhook(a)
        }
    }
}
