//! The `gpufuse` command. Thin: each subcommand is a module over the library crates.

mod run;
mod status;
mod token;
mod worker;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "gpufuse",
    version,
    about = "GPU virtualization and pooling: remote CUDA, enforced slices, one pool"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node: listen for sessions and serve them on this machine's GPUs (or emulated ones).
    Serve(ServeArgs),
    /// Run a program with gpufuse's libcuda.so.1 in place of NVIDIA's.
    Run(run::RunArgs),
    /// Show a node's devices and sessions.
    Status(status::StatusArgs),
    /// Create a token secret or issue session tokens.
    Token(token::TokenArgs),
    /// (internal) Serve one session; started by `gpufuse serve`.
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// unix:PATH or tcp:HOST:PORT; may be given several times.
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
}

fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPUFUSE_LOG")
        .unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Errors are printed once, as a chain of causes on one line, without a backtrace.
fn main() -> std::process::ExitCode {
    match run_cli() {
        Ok(()) => std::process::ExitCode::SUCCESS,
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
            };
            gpufuse_node::serve(config)?;
            Ok(())
        }
        Command::Run(a) => run::run(a),
        Command::Status(a) => status::status(a),
        Command::Token(a) => token::token(a),
        Command::Worker(a) => {
            init_logs();
            worker::worker(a)
        }
    }
}
