//! The `gpufuse` command. Thin: each subcommand is a module over the library crates.

mod admin;
mod k8s;
mod run;
mod status;
mod tls;
mod token;
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
    /// Run a node: listen for sessions and serve them on this machine's GPUs (or emulated ones).
    #[command(after_help = LOGGING_HELP)]
    Serve(ServeArgs),
    /// Run a program with gpufuse's libcuda.so.1 in place of NVIDIA's.
    Run(run::RunArgs),
    /// Show a node's devices and sessions.
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
struct ServeArgs {
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
}

/// Logs go to stderr, coloured only on a terminal and without `NO_COLOR` (no escape codes in
/// log files).
fn init_logs() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPUFUSE_LOG")
        .unwrap_or_else(|_| "info".into());
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && !no_color)
        .init();
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
            init_logs();
            let tokens = match a.token_secret_file {
                Some(p) => gpufuse_node::TokenPolicy::Verify(token::read_secret(&p)?),
                None => gpufuse_node::TokenPolicy::Open,
            };
            let config = gpufuse_node::NodeConfig {
                listen: a.listen,
                devices: a.devices,
                tokens,
                worker_exe: std::env::current_exe()?,
                compute_policy: a.compute_policy,
                tls: a.tls.load()?,
                client_certs: a.tls.requires_client_certs(),
            };
            gpufuse_node::serve(config)?;
            Ok(())
        }
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
        Command::Completions(a) => admin::completions(a),
        Command::Certs(a) => tls::certs(a),
        Command::Man(a) => admin::man(a),
        Command::Worker(a) => {
            init_logs();
            worker::worker(a)
        }
        Command::DraPlugin(a) => (init_logs(), k8s::dra_plugin(a)).1,
        Command::Operator(a) => (init_logs(), k8s::operator(a)).1,
        Command::Webhook(a) => (init_logs(), k8s::webhook(a)).1,
    }
}
