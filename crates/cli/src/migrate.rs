//! `gpufuse migrate ID --to [NODE:]DEVICE --server ADDR`: moves a session to another device
//! of its node (`gpufuse_node::elastic::migrate`) or to a device of another node
//! (`gpufuse_node::elastic::migrate_out`; through a controller, NODE is a node's name; asked
//! of a node, NODE is the other node's address) while its program runs.

use gpufuse_client::{ClientError, Connection};
use gpufuse_proto::SessionId;
use gpufuse_proto::{ServerHello, SessionKind};

#[derive(clap::Args)]
pub struct MigrateArgs {
    /// The session (`id` in `gpufuse status --json`'s sessions).
    id: u64,
    /// Where to move it: `DEVICE` (another device of its node) or `NODE:DEVICE` (a device of
    /// another node: its name when --server is a controller, its address, e.g.
    /// `unix:/run/b.sock:0` or `tcp:gpu-b:7070:0`, when --server is a node).
    #[arg(long, value_parser = parse_target)]
    to: Target,
    #[arg(long, env = "GPUFUSE_SERVER")]
    server: gpufuse_transport::Address,
    #[command(flatten)]
    pub tls: crate::tls::ClientTlsArgs,
    #[arg(long, env = "GPUFUSE_TOKEN", default_value = "")]
    token: String,
}

/// `--to`: a device of the session's node, or a node and one of its devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    node: Option<String>,
    device: u32,
}

fn parse_target(s: &str) -> Result<Target, String> {
    let bad = || format!("bad --to {s:?}: expected DEVICE or NODE:DEVICE (a device index)");
    match s.rsplit_once(':') {
        None => Ok(Target {
            node: None,
            device: s.trim().parse().map_err(|_| bad())?,
        }),
        Some((node, device)) if !node.is_empty() => Ok(Target {
            node: Some(node.to_string()),
            device: device.trim().parse().map_err(|_| bad())?,
        }),
        Some(_) => Err(bad()),
    }
}

pub fn migrate(a: MigrateArgs) -> anyhow::Result<()> {
    let kind = match a.to.node {
        None => SessionKind::Migrate {
            session: SessionId(a.id),
            device: a.to.device,
        },
        Some(node) => SessionKind::MigrateTo {
            session: SessionId(a.id),
            node,
            device: a.to.device,
            token: a.token.clone(),
        },
    };
    let hello = Connection::hello(kind, a.token, Default::default());
    // A move copies the session while it runs and, between nodes, stops at the program's
    // next synchronous call: the node answers when it is done (its own limit is 300 s).
    let wait = std::time::Duration::from_secs(330);
    match Connection::one_shot_within(&a.server, &hello, wait)? {
        ServerHello::Migrated {
            session,
            device,
            stop_us,
            total_us,
        } => {
            println!(
                "session {session} runs on device {device} now (stopped {:.1} ms of {:.1} ms)",
                stop_us as f64 / 1e3,
                total_us as f64 / 1e3
            );
            Ok(())
        }
        ServerHello::MigratedWith {
            session,
            device,
            total_us,
            figures: f,
        } => {
            println!(
                "session {session} runs on device {device} now ({})",
                how_it_moved(&f, total_us)
            );
            Ok(())
        }
        ServerHello::MovedToNode {
            session,
            node,
            new_session,
            device,
            total_us,
            figures: f,
        } => {
            println!(
                "session {session} runs on node {node} now, as its session {new_session} on \
                 device {device} ({})",
                how_it_moved(&f, total_us)
            );
            Ok(())
        }
        ServerHello::Refused { reason } => {
            anyhow::bail!("the gpufuse server at {} refused: {reason}", a.server)
        }
        _ => Err(ClientError::UnexpectedReply.into()),
    }
}

/// The stop, the total and what pre-copy moved.
fn how_it_moved(f: &gpufuse_proto::MoveFigures, total_us: u64) -> String {
    format!(
        "stopped {:.1} ms of {:.1} ms; {} round(s) of pre-copy moved {} while it ran, the stop {}",
        f.stop_us as f64 / 1e3,
        total_us as f64 / 1e3,
        f.rounds,
        human(f.precopied_bytes),
        human(f.stop_bytes),
    )
}

fn human(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_is_a_device_or_a_node_and_a_device() {
        assert_eq!(
            parse_target("1").unwrap(),
            Target {
                node: None,
                device: 1
            }
        );
        assert_eq!(
            parse_target("gpu-b:0").unwrap(),
            Target {
                node: Some("gpu-b".into()),
                device: 0
            }
        );
        assert_eq!(
            parse_target("unix:/run/b.sock:2").unwrap(),
            Target {
                node: Some("unix:/run/b.sock".into()),
                device: 2
            }
        );
        for bad in ["", "x", ":1", "gpu-b:", "gpu-b:x"] {
            assert!(parse_target(bad).is_err(), "{bad:?}");
        }
    }
}
