//! `gpufuse node drain|cordon|uncordon NODE --server CONTROLLER`: an operator's hold on a
//! pool's node. Cordoned, nothing new is placed there; drained, every session moves off it
//! too (live: `docs/migration.md`), each to the best device of its model elsewhere.

use gpufuse_client::{ClientError, Connection};
use gpufuse_proto::{ServerHello, SessionKind};

#[derive(clap::Subcommand)]
pub enum NodeAction {
    /// Cordon NODE, then move every session off it while its program runs, largest first,
    /// each to the device the pool would place it on now (same GPU model, the labels it
    /// asked for). Prints where each went and what cannot move; exits 1 when any stays.
    Drain(NodeAdminArgs),
    /// Place nothing new on NODE; its sessions keep running.
    Cordon(NodeAdminArgs),
    /// Place sessions on NODE again.
    Uncordon(NodeAdminArgs),
}

#[derive(clap::Args)]
pub struct NodeAdminArgs {
    /// The node's name in the pool (`gpufuse status --server CONTROLLER`).
    name: String,
    /// The pool's controller.
    #[arg(long, env = "GPUFUSE_SERVER")]
    server: gpufuse_transport::Address,
    /// On a controller that checks tokens: a token for the subject `admin`.
    #[arg(
        long,
        env = "GPUFUSE_TOKEN",
        default_value = "",
        hide_env_values = true
    )]
    token: String,
    /// Print the controller's answer as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    tls: crate::tls::ClientTlsArgs,
}

/// How long a drain may take: its moves run one after another, each up to 300 s.
const DRAIN_WAIT: std::time::Duration = std::time::Duration::from_secs(3600);

pub fn run(action: NodeAction) -> anyhow::Result<()> {
    let (a, kind) = match action {
        NodeAction::Drain(a) => {
            let node = a.name.clone();
            (a, SessionKind::Drain { node })
        }
        NodeAction::Cordon(a) => {
            let node = a.name.clone();
            (
                a,
                SessionKind::Cordon {
                    node,
                    cordoned: true,
                },
            )
        }
        NodeAction::Uncordon(a) => {
            let node = a.name.clone();
            (
                a,
                SessionKind::Cordon {
                    node,
                    cordoned: false,
                },
            )
        }
    };
    a.tls.export()?;
    let hello = Connection::hello(kind, a.token.clone(), Default::default());
    let reply = Connection::one_shot_within(&a.server, &hello, DRAIN_WAIT)?;
    if a.json {
        if let ServerHello::Refused { reason } = &reply {
            anyhow::bail!("the controller at {} refused: {reason}", a.server);
        }
        println!("{}", serde_json::to_string_pretty(&reply)?);
    }
    match reply {
        ServerHello::Cordoned { node, cordoned } => {
            if !a.json {
                println!(
                    "node {node} is {}",
                    if cordoned {
                        "cordoned: nothing new is placed there"
                    } else {
                        "uncordoned: sessions may be placed there again"
                    }
                );
            }
            Ok(())
        }
        ServerHello::Drained { node, moved, stuck } => {
            if !a.json {
                for m in &moved {
                    println!(
                        "session {} moved to node {} device {} ({:.1} ms, stopped {:.1} ms)",
                        m.session,
                        m.node,
                        m.device,
                        m.total_us as f64 / 1e3,
                        m.figures.stop_us as f64 / 1e3
                    );
                }
                for s in &stuck {
                    println!("session {} stays on {node}: {}", s.session, s.reason);
                }
                println!(
                    "node {node} is cordoned; {} session(s) moved off it, {} stay",
                    moved.len(),
                    stuck.len()
                );
            }
            if stuck.is_empty() {
                Ok(())
            } else {
                std::process::exit(1)
            }
        }
        ServerHello::Refused { reason } => {
            anyhow::bail!("the controller at {} refused: {reason}", a.server)
        }
        _ => Err(ClientError::UnexpectedReply.into()),
    }
}
