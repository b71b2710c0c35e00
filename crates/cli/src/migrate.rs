//! `gpufuse migrate ID --to DEVICE --server ADDR`: moves a session to another device of its
//! node while its program runs (`gpufuse_node::elastic::migrate`).

use gpufuse_client::{ClientError, Connection};
use gpufuse_proto::{ServerHello, SessionKind};

#[derive(clap::Args)]
pub struct MigrateArgs {
    /// The session (`id` in `gpufuse status --json`'s sessions).
    id: u64,
    /// The node's device to move it to.
    #[arg(long)]
    to: u32,
    #[arg(long, env = "GPUFUSE_SERVER")]
    server: gpufuse_transport::Address,
    #[command(flatten)]
    pub tls: crate::tls::ClientTlsArgs,
    #[arg(long, env = "GPUFUSE_TOKEN", default_value = "")]
    token: String,
}

pub fn migrate(a: MigrateArgs) -> anyhow::Result<()> {
    let hello = Connection::hello(
        SessionKind::Migrate {
            session: a.id,
            device: a.to,
        },
        a.token,
        Default::default(),
    );
    match Connection::one_shot(&a.server, &hello)? {
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
                "session {session} runs on device {device} now (stopped {:.1} ms of {:.1} ms; \
                 {} round(s) of pre-copy moved {} while it ran, the stop {})",
                f.stop_us as f64 / 1e3,
                total_us as f64 / 1e3,
                f.rounds,
                human(f.precopied_bytes),
                human(f.stop_bytes),
            );
            Ok(())
        }
        ServerHello::Refused { reason } => {
            anyhow::bail!("the gpufuse server at {} refused: {reason}", a.server)
        }
        _ => Err(ClientError::UnexpectedReply.into()),
    }
}

fn human(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}
