//! `gpufuse sessions`, `gpufuse kill`, `gpufuse completions` and `gpufuse man`.

use clap::CommandFactory;
use gpufuse_client::{ClientError, Connection};
use gpufuse_proto::SessionId;
use gpufuse_proto::{ServerHello, SessionKind};

#[derive(clap::Args)]
pub struct SessionsArgs {
    #[arg(long, env = "GPUFUSE_SERVER")]
    server: gpufuse_transport::Address,
    #[command(flatten)]
    pub tls: crate::tls::ClientTlsArgs,
    #[arg(long, env = "GPUFUSE_TOKEN", default_value = "")]
    token: String,
    /// Print JSON (a list of sessions).
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct KillArgs {
    #[arg(long, env = "GPUFUSE_SERVER")]
    server: gpufuse_transport::Address,
    /// On a node that checks tokens, a token of the session's own tenant.
    #[command(flatten)]
    pub tls: crate::tls::ClientTlsArgs,
    #[arg(long, env = "GPUFUSE_TOKEN", default_value = "")]
    token: String,
    /// The session's id, as `gpufuse sessions` lists it.
    id: u64,
}

#[derive(clap::Args)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    shell: clap_complete::Shell,
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

pub fn sessions(a: SessionsArgs) -> anyhow::Result<()> {
    let s = Connection::query_status(&a.server, a.token)?;
    if a.json {
        let v: Vec<_> = s
            .sessions
            .iter()
            .map(|x| {
                serde_json::json!({
                    "id": x.id, "pid": x.pid, "program": x.program, "tenant": x.subject,
                    "worker_pid": x.worker_pid, "device": x.device, "used_bytes": x.used_bytes,
                    "limit_bytes": x.limit_bytes, "qos": x.qos.name(),
                    "compute_percent": x.compute_percent, "device_time_us": x.device_time_us,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if s.sessions.is_empty() {
        println!("no sessions");
        return Ok(());
    }
    println!(
        "{:>5}  {:>8}  {:<12} {:>6} {:>12} {:>12}  {:<8} PROGRAM",
        "ID", "PID", "TENANT", "DEVICE", "USED MiB", "SLICE MiB", "QOS"
    );
    for x in &s.sessions {
        println!(
            "{:>5}  {:>8}  {:<12} {:>6} {:>12.1} {:>12}  {:<8} {}",
            x.id,
            x.pid,
            x.subject.as_deref().unwrap_or("-"),
            x.device,
            mib(x.used_bytes),
            x.limit_bytes
                .map_or("-".to_string(), |l| format!("{:.1}", mib(l))),
            x.qos.name(),
            x.program
        );
    }
    Ok(())
}

pub fn kill(a: KillArgs) -> anyhow::Result<()> {
    let hello = Connection::hello(
        SessionKind::End {
            session: SessionId(a.id),
        },
        a.token,
        Default::default(),
    );
    match Connection::one_shot(&a.server, &hello)? {
        ServerHello::Ended { session } => {
            println!("session {session} ended; its memory is freed");
            Ok(())
        }
        ServerHello::Refused { reason } => {
            anyhow::bail!("the gpufuse server at {} refused: {reason}", a.server)
        }
        _ => Err(ClientError::UnexpectedReply.into()),
    }
}

pub fn completions(a: CompletionsArgs) -> anyhow::Result<()> {
    let mut cmd = crate::Cli::command();
    clap_complete::generate(a.shell, &mut cmd, "gpufuse", &mut std::io::stdout());
    Ok(())
}

#[derive(clap::Args)]
pub struct ManArgs {
    /// A subcommand's page (gpufuse-serve(1), ...) instead of gpufuse(1).
    subcommand: Option<String>,
}

pub fn man(a: ManArgs) -> anyhow::Result<()> {
    let cmd = crate::Cli::command();
    let page = match &a.subcommand {
        None => cmd,
        Some(name) => {
            let names: Vec<_> = cmd
                .get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(|s| s.get_name().to_string())
                .collect();
            let sub = cmd
                .find_subcommand(name)
                .filter(|s| !s.is_hide_set())
                .ok_or_else(|| {
                    anyhow::anyhow!("no subcommand {name:?}; the pages are {}", names.join(", "))
                })?;
            // The page's name is what the main page's SUBCOMMANDS section refers to.
            sub.clone()
                .name(format!("gpufuse-{name}"))
                .version(crate::VERSION)
        }
    };
    clap_mangen::Man::new(page).render(&mut std::io::stdout().lock())?;
    Ok(())
}
