//! `gpufuse migrate ID --to NODE:DEVICE --server CONTROLLER`: moves a pool session to a device
//! of another node while its program runs (`docs/migration.md`). The controller checks the
//! asker may manage the session, charges the session's slice and share on the target device
//! in its ledger (refused, nothing changed, when they do not fit), signs a grant for the target
//! node, and asks the session's node to move it there (a `MigrateTo` hello with the target's
//! address and the grant); the nodes do the rest. A failed move gives the charge back.
//! A target on the session's own node is a move between its devices, asked of that node.

use std::time::Duration;

use gpufuse_proto::{ClientHello, Grant, ServerHello, SessionKind, GRANT_KIND, PROTOCOL_VERSION};

use crate::place::{one_shot_within, GRANT_SECONDS};
use crate::{refused, unix_now, Controller, PlacementAsk};

/// How long a move may take (pre-copy of a large session while it runs, then the stop at its
/// client's next synchronous call).
const MOVE_TIMEOUT: Duration = Duration::from_secs(300);

/// A `MigrateTo` hello at the controller: session `id` (the pool's) to device `device` of
/// node `node` (its name).
pub(crate) fn migrate(
    c: &Controller,
    hello: &ClientHello,
    id: u64,
    node: &str,
    device: u32,
) -> ServerHello {
    let token = PlacementAsk::parse(&hello.token).map_or(hello.token.clone(), |a| a.token);
    let claims = match c.authenticate(&token) {
        Ok(cl) => cl,
        Err(reason) => return refused(reason),
    };
    // Where it is, where it goes; the target charged before anything moves.
    let (source, source_address, source_device, node_session, grant, target_address) = {
        let mut b = c.books();
        let Some(s) = b.pool.session(id).cloned() else {
            return refused(format!("there is no session {id} in the pool"));
        };
        if let Some(cl) = &claims {
            if cl.subject != s.tenant {
                return refused(format!(
                    "session {id} belongs to another tenant; a token for {:?} may move only its own sessions",
                    cl.subject
                ));
            }
        }
        let Some(node_session) = s.node_session else {
            return refused(format!(
                "session {id} has not started on its node yet; try again"
            ));
        };
        let source_address = b
            .pool
            .node(&s.node)
            .map(|n| n.spec.address.clone())
            .unwrap_or_default();
        if s.node == node {
            drop(b);
            return within_node(&source_address, id, node, node_session, device);
        }
        let Some(target_address) = b.pool.node(node).map(|n| n.spec.address.clone()) else {
            return refused(format!("there is no node {node} in the pool"));
        };
        if let Err(reason) = b.pool.relocate(id, node, device, None) {
            return refused(format!("session {id} cannot move: {reason}"));
        }
        let grant = Grant {
            session: id,
            node: node.to_string(),
            device,
            vram_bytes: s.vram_limit,
            compute_percent: s.compute_percent,
            qos: s.qos,
            tenant: s.tenant.clone(),
            // The grant is presented when the pre-copy starts, within the grant's life.
            expires: unix_now() + GRANT_SECONDS,
        };
        let grant = match gpufuse_auth::seal(&c.0.grant_key, GRANT_KIND, &grant) {
            Ok(g) => g,
            Err(e) => {
                let _ = b.pool.relocate(id, &s.node, s.device, Some(node_session));
                return refused(format!("cannot sign a grant: {e}"));
            }
        };
        (
            s.node,
            source_address,
            s.device,
            node_session,
            grant,
            target_address,
        )
    };
    tracing::info!("moving session {id} from {source} to {node} device {device}");
    let ask = ClientHello {
        protocol_version: PROTOCOL_VERSION,
        kind: SessionKind::MigrateTo {
            session: node_session,
            node: target_address,
            device,
            token: grant,
        },
        token: token.clone(),
        pid: std::process::id(),
        program: "gpufuse controller (migrate)".into(),
        resources: Default::default(),
    };
    let answer = one_shot_within(&source_address, &ask, MOVE_TIMEOUT);
    let mut b = c.books();
    let reply = match answer {
        Ok(ServerHello::MovedToNode {
            new_session,
            total_us,
            figures,
            ..
        }) => {
            let _ = b.pool.relocate(id, node, device, Some(new_session));
            tracing::info!("session {id} moved to {node} (its session {new_session} there)");
            ServerHello::MovedToNode {
                session: id,
                node: node.to_string(),
                new_session,
                device,
                total_us,
                figures,
            }
        }
        Ok(ServerHello::Refused { reason }) => {
            let _ = b
                .pool
                .relocate(id, &source, source_device, Some(node_session));
            refused(format!("node {source} refused: {reason}"))
        }
        Ok(other) => {
            let _ = b
                .pool
                .relocate(id, &source, source_device, Some(node_session));
            refused(format!("node {source} answered {other:?}"))
        }
        Err(e) => {
            let _ = b
                .pool
                .relocate(id, &source, source_device, Some(node_session));
            refused(format!("node {source}: {e}"))
        }
    };
    c.reschedule(&mut b);
    reply
}

/// A move between two devices of the session's node, asked of that node.
fn within_node(address: &str, id: u64, node: &str, node_session: u64, device: u32) -> ServerHello {
    let ask = ClientHello {
        protocol_version: PROTOCOL_VERSION,
        kind: SessionKind::Migrate {
            session: node_session,
            device,
        },
        token: String::new(),
        pid: std::process::id(),
        program: "gpufuse controller (migrate)".into(),
        resources: Default::default(),
    };
    match one_shot_within(address, &ask, MOVE_TIMEOUT) {
        Ok(ServerHello::MigratedWith {
            total_us, figures, ..
        }) => ServerHello::MigratedWith {
            session: id,
            device,
            total_us,
            figures,
        },
        Ok(ServerHello::Refused { reason }) => refused(format!("node {node} refused: {reason}")),
        Ok(other) => refused(format!("node {node} answered {other:?}")),
        Err(e) => refused(format!("node {node}: {e}")),
    }
}
