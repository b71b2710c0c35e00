//! A client's placement: quota, filters and policy (the scheduler), a wait in the pending
//! queue while nothing fits, preemption of `low` sessions through their nodes, and the
//! redirect with a grant.

use std::time::{Duration, Instant};

use gpufuse_proto::{
    decode_owned, encode_frame, ClientHello, EndOrder, FrameKind, Grant, ServerHello, SessionKind,
    END_ORDER_KIND, GRANT_KIND, PROTOCOL_VERSION,
};
use gpufuse_scheduler::{Decision, MoveEnd, Placement, Request, Victim};
use gpufuse_transport::{Address, Conn};

use crate::{answer, refused, unix_now, Controller, PlacementAsk};
use gpufuse_proto::SessionId;

/// How long a grant is good for: the client uses it at once.
pub(crate) const GRANT_SECONDS: u64 = 30;
/// How long the controller waits for a node to end a preempted session.
const END_TIMEOUT: Duration = Duration::from_secs(12);

/// The scheduler's request for a hello, or why it is malformed or not allowed.
fn request_of(c: &Controller, hello: &ClientHello) -> Result<(Request, Option<u64>), String> {
    let ask = PlacementAsk::parse(&hello.token)?;
    let claims = c.authenticate(&ask.token)?;
    let tenant = match (&claims, ask.tenant) {
        (Some(cl), Some(t)) if t != cl.subject => {
            return Err(format!(
                "the session token is for tenant {:?}, not {t:?}",
                cl.subject
            ))
        }
        (Some(cl), _) => cl.subject.clone(),
        (None, t) => t.unwrap_or_default(),
    };
    let r = &hello.resources;
    let mut vram = r.vram_bytes;
    if let Some(max) = claims.as_ref().and_then(|c| c.max_vram_bytes) {
        match vram {
            Some(v) if v > max => {
                return Err(format!(
                    "the token allows at most {max} bytes of VRAM, and {v} were asked for"
                ))
            }
            _ => vram = Some(vram.unwrap_or(max)),
        }
    }
    // The token's compute bound, as a node applies it: more is refused, none gets it.
    let mut compute = r.compute_percent;
    if let Some(max) = claims.as_ref().and_then(|c| c.max_compute_percent) {
        if r.tflops.is_some() {
            return Err(format!(
                "the token allows at most {max}% of a device's compute: ask for a percentage, not TFLOPS"
            ));
        }
        match compute {
            Some(p) if p > max => {
                return Err(format!(
                    "the token allows at most {max}% of a device's compute, and {p}% was asked for"
                ))
            }
            _ => compute = Some(compute.unwrap_or(max)),
        }
    }
    Ok((
        Request {
            tenant,
            vram_bytes: vram,
            compute_percent: compute,
            tflops: r.tflops,
            qos: r.qos,
            selector: ask.selector,
            gpu_model: ask.gpu_model,
            device_uuid: claims.and_then(|c| c.device),
        },
        ask.wait_s,
    ))
}

/// A `Check` hello: would this session be accepted (placed now, or queued)?
pub(crate) fn check(c: &Controller, hello: &ClientHello) -> ServerHello {
    let (req, _) = match request_of(c, hello) {
        Ok(r) => r,
        Err(reason) => return refused(reason),
    };
    match c.books().pool.check(&req) {
        Ok(_) => ServerHello::Admissible { device: 0 },
        Err(e) => refused(e.to_string()),
    }
}

/// A `Check` hello for the in-process node: whether the session passes the quotas, and
/// whether it would wait in the queue (rather than be refused) when nothing fits now.
pub(crate) fn check_waits(c: &Controller, hello: &ClientHello) -> Result<bool, String> {
    let (req, wait) = request_of(c, hello)?;
    c.books().pool.check(&req).map_err(|e| e.to_string())?;
    Ok(!wait
        .map_or(c.0.config.default_wait, Duration::from_secs)
        .is_zero())
}

/// A `Cuda` hello: place the session and redirect its client, waiting while nothing fits.
pub(crate) fn serve(c: &Controller, mut conn: Conn, hello: &ClientHello) {
    let placement = {
        let mut hung_up = || conn.peer_hung_up();
        match decide(c, hello, &mut hung_up) {
            Ok(p) => p,
            Err(reason) => return answer(&mut conn, &refused(reason)),
        }
    };
    let grant = match seal_grant(c, &placement) {
        Ok(g) => g,
        Err(reason) => return answer(&mut conn, &refused(reason)),
    };
    answer(
        &mut conn,
        &ServerHello::Redirect {
            address: placement.address,
            grant,
        },
    );
}

/// The grant a placement gives its client, signed for the node.
pub(crate) fn grant_of(placement: &Placement) -> Grant {
    Grant {
        session: SessionId(placement.session),
        node: placement.node.clone(),
        device: placement.device,
        vram_bytes: placement.vram_bytes,
        compute_percent: placement.compute_percent,
        qos: placement.qos,
        tenant: placement.tenant.clone(),
        expires: unix_now() + GRANT_SECONDS,
    }
}

fn seal_grant(c: &Controller, placement: &Placement) -> Result<String, String> {
    gpufuse_auth::seal(&c.0.grant_key, GRANT_KIND, &grant_of(placement))
        .map_err(|e| format!("cannot sign a grant: {e}"))
}

/// Places a `Cuda` hello: quota, filters and policy, preempting `low` sessions for a `high`
/// or `critical` one, or waiting in the queue until it fits, its wait ends or `hung_up`
/// says its client left.
pub(crate) fn decide(
    c: &Controller,
    hello: &ClientHello,
    hung_up: &mut dyn FnMut() -> bool,
) -> Result<Placement, String> {
    let (req, wait) = request_of(c, hello)?;
    let wait = wait.map_or(c.0.config.default_wait, Duration::from_secs);
    let decision = {
        let mut b = c.books();
        let now = c.now();
        let started = Instant::now();
        let d = b.pool.submit(&req, now);
        b.placement.observe(started.elapsed().as_secs_f64());
        d
    };
    let placement = match decision {
        Err(e) => return Err(e.to_string()),
        Ok(Decision::Placed(p)) => p,
        Ok(Decision::Preempt(plan)) => {
            // Victims that fit elsewhere move there (at once, side by side); the others, and
            // any whose move fails, are ended.
            let (moving, mut ending): (Vec<Victim>, Vec<Victim>) =
                plan.victims.into_iter().partition(|v| v.move_to.is_some());
            let failed: Vec<Victim> = std::thread::scope(|scope| {
                let moves: Vec<_> = moving
                    .into_iter()
                    .map(|v| {
                        scope.spawn(move || {
                            crate::moves::carry_out(c, v.session, MoveEnd::Ended)
                                .err()
                                .map(|_| v)
                        })
                    })
                    .collect();
                moves
                    .into_iter()
                    .filter_map(|h| h.join().ok().flatten())
                    .collect()
            });
            ending.extend(failed);
            if let Err(reason) = end_victims(c, &ending) {
                tracing::warn!(
                    "preemption for session {}: {reason}",
                    plan.placement.session
                );
            }
            plan.placement
        }
        Ok(Decision::Pending { id, reason }) => {
            tracing::info!(
                "session {id} ({}) waits: {reason}",
                if req.tenant.is_empty() {
                    "default"
                } else {
                    &req.tenant
                }
            );
            wait_for(c, hung_up, id, wait)?
        }
    };
    tracing::info!(
        "session {} ({}) placed on {} device {} ({})",
        placement.session,
        placement.tenant,
        placement.node,
        placement.device,
        placement.address
    );
    Ok(placement)
}

/// Waits until the queue places pending request `id`, `wait` passes or the client hangs up.
fn wait_for(
    c: &Controller,
    hung_up: &mut dyn FnMut() -> bool,
    id: u64,
    wait: Duration,
) -> Result<Placement, String> {
    let deadline = Instant::now() + wait;
    let mut b = c.books();
    loop {
        if let Some(p) = b.placed.remove(&id) {
            return Ok(p);
        }
        let now = Instant::now();
        let gone = hung_up();
        if now >= deadline || gone {
            let reason = b
                .pool
                .pending()
                .iter()
                .find(|p| p.id == id)
                .map(|p| p.reason.clone())
                .unwrap_or_default();
            b.pool.cancel_pending(id);
            if gone {
                tracing::info!("session {id}'s client gave up waiting");
            }
            if wait.is_zero() {
                return Err(format!(
                    "nothing fits now: {reason} (gpufuse run --wait SECONDS waits for capacity)"
                ));
            }
            return Err(format!(
                "no capacity within {:.0} s: {reason} (gpufuse run --wait SECONDS waits longer)",
                wait.as_secs_f64()
            ));
        }
        let step = (deadline - now).min(Duration::from_millis(100));
        b =
            c.0.changed
                .wait_timeout(b, step)
                .unwrap_or_else(|e| e.into_inner())
                .0;
    }
}

/// An `End` hello (`gpufuse kill --server CONTROLLER ID`): ends pool session `id` through its
/// node. On a controller that checks tokens, only a token of the session's tenant may.
pub(crate) fn end(c: &Controller, hello: &ClientHello, id: u64) -> ServerHello {
    let token = PlacementAsk::parse(&hello.token).map_or(hello.token.clone(), |a| a.token);
    let claims = match c.authenticate(&token) {
        Ok(cl) => cl,
        Err(reason) => return refused(reason),
    };
    let victim = {
        let b = c.books();
        let Some(s) = b.pool.session(id) else {
            return refused(format!("there is no session {id} in the pool"));
        };
        if let Some(cl) = &claims {
            if cl.subject != s.tenant {
                return refused(format!(
                    "session {id} belongs to another tenant; a token for {:?} may end only its own sessions",
                    cl.subject
                ));
            }
        }
        let Some(node_session) = s.node_session else {
            return refused(format!(
                "session {id} has not started on its node yet; try again"
            ));
        };
        Victim {
            session: id,
            node: s.node.clone(),
            address: b
                .pool
                .node(&s.node)
                .map(|n| n.spec.address.clone())
                .unwrap_or_default(),
            node_session,
            move_to: None,
        }
    };
    match end_victims(c, std::slice::from_ref(&victim)) {
        Ok(()) => {
            let mut b = c.books();
            b.pool.end_session(id);
            c.reschedule(&mut b);
            ServerHello::Ended {
                session: SessionId(id),
            }
        }
        Err(reason) => refused(reason),
    }
}

/// Ends each victim through its node (as `gpufuse kill` does), with a signed order.
fn end_victims(c: &Controller, victims: &[Victim]) -> Result<(), String> {
    for v in victims {
        tracing::info!(
            "ending session {} (node {} session {})",
            v.session,
            v.node,
            v.node_session
        );
        let order = EndOrder {
            node: v.node.clone(),
            node_session: SessionId(v.node_session),
            expires: unix_now() + GRANT_SECONDS,
        };
        let token = gpufuse_auth::seal(&c.0.grant_key, END_ORDER_KIND, &order)
            .map_err(|e| e.to_string())?;
        let hello = ClientHello {
            protocol_version: PROTOCOL_VERSION,
            kind: SessionKind::End {
                session: SessionId(v.node_session),
            },
            token,
            pid: std::process::id(),
            program: "gpufuse controller (preemption)".into(),
            resources: Default::default(),
        };
        match one_shot(&v.address, &hello) {
            Ok(ServerHello::Ended { .. }) => {}
            Ok(ServerHello::Refused { reason }) => {
                return Err(format!(
                    "node {} refused to end session {}: {reason}",
                    v.node, v.node_session
                ))
            }
            Ok(other) => return Err(format!("node {} answered {other:?}", v.node)),
            Err(e) => return Err(format!("node {}: {e}", v.node)),
        }
    }
    Ok(())
}

fn one_shot(address: &str, hello: &ClientHello) -> Result<ServerHello, String> {
    one_shot_within(address, hello, END_TIMEOUT)
}

/// Sends `hello` to the node at `address` and returns its answer, waiting `timeout` for it.
pub(crate) fn one_shot_within(
    address: &str,
    hello: &ClientHello,
    timeout: Duration,
) -> Result<ServerHello, String> {
    let addr: Address = address.parse().map_err(|e| format!("{e}"))?;
    let stream = addr
        .connect()
        .map_err(|e| format!("cannot reach {address}: {e}"))?;
    let _ = stream.set_read_timeout(Some(timeout));
    let mut conn = Conn::new(stream);
    let mut frame = Vec::new();
    encode_frame(&mut frame, FrameKind::Hello, 0, 0, hello);
    conn.send(&frame).map_err(|e| e.to_string())?;
    let (_, body) = conn.recv().map_err(|e| e.to_string())?;
    decode_owned::<ServerHello>(body).map_err(|e| e.to_string())
}
