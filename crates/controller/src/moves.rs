//! Moving pool sessions (`docs/migration.md`, `docs/pool.md`): an operator's move (`gpufuse
//! migrate ID --to NODE:DEVICE --server CONTROLLER`), a drain (`gpufuse node drain NODE`), a
//! defragmentation round (`--defrag`) and a preemption's victims all end up in [`carry_out`].
//!
//! The pool charges a move before it runs (`Pool::begin_move`: the target holds the
//! session's slice and share, and its own device keeps them until it lands), the controller
//! signs an order for the session's node (and a grant for the target node when the move
//! leaves the node), asks the node to move it, and settles the ledger with the outcome. The
//! nodes do the moving; the session's program notices nothing.

use std::time::Duration;

use gpufuse_proto::{
    ClientHello, DrainedSession, EndOrder, Grant, MoveFigures, ServerHello, SessionKind,
    StuckSession, END_ORDER_KIND, GRANT_KIND, PROTOCOL_VERSION,
};
use gpufuse_scheduler::{MoveEnd, SessionId};

use crate::place::{one_shot_within, GRANT_SECONDS};
use crate::{refused, unix_now, Controller, PlacementAsk};

/// How long a move may take (pre-copy of a large session while it runs, then the stop at its
/// client's next synchronous call).
const MOVE_TIMEOUT: Duration = Duration::from_secs(300);

/// A move that landed.
pub(crate) struct Landed {
    pub node: String,
    pub device: u32,
    /// The session's id on its node now.
    pub node_session: u64,
    pub total_us: u64,
    pub figures: MoveFigures,
}

/// A `MigrateTo` hello at the controller: session `id` (the pool's) to device `device` of
/// node `node` (its name), asked by an operator or the session's tenant.
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
    let within = {
        let mut b = c.books();
        let Some(s) = b.pool.session(id).cloned() else {
            return refused(format!("there is no session {id} in the pool"));
        };
        if let Some(cl) = &claims {
            if cl.subject != s.tenant && cl.subject != crate::ADMIN_SUBJECT {
                return refused(format!(
                    "session {id} belongs to another tenant; a token for {:?} may move only its own sessions",
                    cl.subject
                ));
            }
        }
        if let Err(reason) = b.pool.begin_move(id, node, device, true) {
            return refused(format!("session {id} cannot move: {reason}"));
        }
        s.node == node
    };
    match carry_out(c, id, MoveEnd::Stayed) {
        Ok(l) if within => ServerHello::MigratedWith {
            session: gpufuse_proto::SessionId(id),
            device,
            total_us: l.total_us,
            figures: l.figures,
        },
        Ok(l) => ServerHello::MovedToNode {
            session: gpufuse_proto::SessionId(id),
            node: l.node,
            new_session: gpufuse_proto::SessionId(l.node_session),
            device: l.device,
            total_us: l.total_us,
            figures: l.figures,
        },
        Err(reason) => refused(reason),
    }
}

/// Carries out the move of session `id` the pool has charged, and settles it: landed, or
/// `on_failure` (the session stayed where it was, or, for a preemption's victim, ends).
pub(crate) fn carry_out(
    c: &Controller,
    id: SessionId,
    on_failure: MoveEnd,
) -> Result<Landed, String> {
    let ask = {
        let b = c.books();
        ask_node(c, &b.pool, id)
    };
    let answer = ask.and_then(|(source, address, hello, node_session, target)| {
        tracing::info!(
            "moving session {id} from {source} to {} device {}",
            target.0,
            target.1
        );
        let answer = one_shot_within(&address, &hello, MOVE_TIMEOUT)
            .map_err(|e| format!("node {source}: {e}"))?;
        match answer {
            ServerHello::MovedToNode {
                new_session,
                total_us,
                figures,
                ..
            } => Ok(Landed {
                node: target.0,
                device: target.1,
                node_session: new_session.get(),
                total_us,
                figures,
            }),
            ServerHello::MigratedWith {
                total_us, figures, ..
            } => Ok(Landed {
                node: target.0,
                device: target.1,
                node_session,
                total_us,
                figures,
            }),
            ServerHello::Refused { reason } => Err(format!("node {source} refused: {reason}")),
            other => Err(format!("node {source} answered {other:?}")),
        }
    });
    let mut b = c.books();
    match &answer {
        Ok(l) => {
            b.pool.finish_move(
                id,
                MoveEnd::Moved {
                    node_session: l.node_session,
                },
            );
            tracing::info!(
                "session {id} moved to {} device {} (its session {} there)",
                l.node,
                l.device,
                l.node_session
            );
        }
        Err(reason) => {
            tracing::warn!("session {id} did not move: {reason}");
            b.pool.finish_move(id, on_failure);
        }
    }
    c.reschedule(&mut b);
    answer
}

type NodeAsk = (String, String, ClientHello, u64, (String, u32));

/// The hello that asks session `id`'s node to carry out its charged move, signed by the
/// controller: (source node, its address, the hello, the session's node id, target).
fn ask_node(
    c: &Controller,
    pool: &gpufuse_scheduler::Pool,
    id: SessionId,
) -> Result<NodeAsk, String> {
    let s = pool
        .session(id)
        .ok_or_else(|| format!("session {id} ended"))?;
    let (_, m) = pool
        .moves_in_flight()
        .find(|(m, _)| *m == id)
        .ok_or_else(|| format!("session {id} is not moving"))?;
    let node_session = m
        .from_node_session
        .ok_or_else(|| format!("session {id} has not started on its node yet"))?;
    let source = (m.from_node.clone(), m.from_device);
    let source_address = pool
        .node(&source.0)
        .map(|n| n.spec.address.clone())
        .ok_or_else(|| format!("there is no node {} in the pool", source.0))?;
    let order = EndOrder {
        node: source.0.clone(),
        node_session: gpufuse_proto::SessionId(node_session),
        expires: unix_now() + GRANT_SECONDS,
    };
    let order = gpufuse_auth::seal(&c.0.grant_key, END_ORDER_KIND, &order)
        .map_err(|e| format!("cannot sign an order: {e}"))?;
    let kind = if m.to_node == source.0 {
        SessionKind::Migrate {
            session: gpufuse_proto::SessionId(node_session),
            device: m.to_device,
        }
    } else {
        let target_address = pool
            .node(&m.to_node)
            .map(|n| n.spec.address.clone())
            .ok_or_else(|| format!("there is no node {} in the pool", m.to_node))?;
        let grant = Grant {
            session: gpufuse_proto::SessionId(id),
            node: m.to_node.clone(),
            device: m.to_device,
            vram_bytes: s.vram_limit,
            compute_percent: s.compute_percent,
            qos: s.qos,
            tenant: s.tenant.clone(),
            // The grant is presented when the pre-copy starts, within the grant's life.
            expires: unix_now() + GRANT_SECONDS,
        };
        let grant = gpufuse_auth::seal(&c.0.grant_key, GRANT_KIND, &grant)
            .map_err(|e| format!("cannot sign a grant: {e}"))?;
        SessionKind::MigrateTo {
            session: gpufuse_proto::SessionId(node_session),
            node: target_address,
            device: m.to_device,
            token: grant,
        }
    };
    let hello = ClientHello {
        protocol_version: PROTOCOL_VERSION,
        kind,
        token: order,
        pid: std::process::id(),
        program: "gpufuse controller (move)".into(),
        resources: Default::default(),
    };
    Ok((
        source.0,
        source_address,
        hello,
        node_session,
        (m.to_node.clone(), m.to_device),
    ))
}

/// A `Drain` hello: cordons `node` and moves its sessions off, one at a time, largest first,
/// each to where the pool would put it at that moment.
pub(crate) fn drain(c: &Controller, hello: &ClientHello, node: &str) -> ServerHello {
    if let Err(reason) = c.authorize_admin(&hello.token) {
        return refused(reason);
    }
    let plan = {
        let mut b = c.books();
        if let Err(reason) = b.pool.cordon(node, true) {
            return refused(reason);
        }
        match b.pool.plan_drain(node) {
            Ok(p) => p,
            Err(reason) => return refused(reason),
        }
    };
    tracing::info!(
        "draining node {node}: {} session(s) to move, {} cannot",
        plan.moves.len(),
        plan.stuck.len()
    );
    let mut moved = Vec::new();
    let mut stuck: Vec<StuckSession> = plan
        .stuck
        .iter()
        .map(|(session, reason)| StuckSession {
            session: gpufuse_proto::SessionId(*session),
            reason: reason.clone(),
        })
        .collect();
    for m in &plan.moves {
        let begun = {
            let mut b = c.books();
            b.pool
                .move_target(m.session)
                .and_then(|(n, d)| b.pool.begin_move(m.session, &n, d, true))
        };
        let outcome = begun.and_then(|()| carry_out(c, m.session, MoveEnd::Stayed));
        match outcome {
            Ok(l) => moved.push(DrainedSession {
                session: gpufuse_proto::SessionId(m.session),
                node: l.node,
                device: l.device,
                total_us: l.total_us,
                figures: l.figures,
            }),
            Err(reason) => stuck.push(StuckSession {
                session: gpufuse_proto::SessionId(m.session),
                reason,
            }),
        }
    }
    ServerHello::Drained {
        node: node.to_string(),
        moved,
        stuck,
    }
}

/// A `Cordon` hello.
pub(crate) fn cordon(c: &Controller, hello: &ClientHello, node: &str, on: bool) -> ServerHello {
    if let Err(reason) = c.authorize_admin(&hello.token) {
        return refused(reason);
    }
    let mut b = c.books();
    match b.pool.cordon(node, on) {
        Ok(_) => {
            tracing::info!("node {node} {}", if on { "cordoned" } else { "uncordoned" });
            c.reschedule(&mut b);
            ServerHello::Cordoned {
                node: node.to_string(),
                cordoned: on,
            }
        }
        Err(reason) => refused(reason),
    }
}
