//! A node's link: registration, then a report every heartbeat (and whenever its sessions
//! change). The first report registers the node (its devices and labels replace what the
//! pool knew; its sessions are reconciled); a closed link marks the node lost at once.

use std::sync::atomic::Ordering;

use gpufuse_proto::{
    decode_owned, encode_frame, AgentAnswer, ClientHello, FrameKind, NodeReport, ServerHello,
};
use gpufuse_scheduler::{DeviceLoad, DeviceSpec, NodeSpec, SessionReport};
use gpufuse_transport::Conn;

use crate::{answer, refused, Controller};

/// A link that hears nothing for this many node timeouts is closed (the node is long lost
/// by then; its agent reconnects if it is alive).
const IDLE_TIMEOUTS: u32 = 6;

pub(crate) fn serve(c: &Controller, mut conn: Conn, hello: &ClientHello) {
    if let Err(reason) = c.authenticate(&hello.token) {
        return answer(&mut conn, &refused(reason));
    }
    let cfg = &c.0.config;
    answer(
        &mut conn,
        &ServerHello::PoolAgent {
            grant_key: c.0.grant_key.to_vec(),
            heartbeat_ms: cfg.heartbeat.as_millis().clamp(10, 60_000) as u32,
        },
    );
    let _ = conn
        .stream()
        .set_read_timeout(Some(cfg.node_timeout * IDLE_TIMEOUTS));
    let id = c.0.next_link.fetch_add(1, Ordering::Relaxed);
    let mut name: Option<String> = None;
    loop {
        let report: NodeReport = match conn.recv() {
            Ok((h, body)) if h.kind == FrameKind::Control => match decode_owned(body) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!("malformed report from node {name:?}: {e}; closing its link");
                    break;
                }
            },
            Ok((h, _)) => {
                tracing::warn!("node {name:?} sent a {:?} frame; closing its link", h.kind);
                break;
            }
            Err(e) => {
                if name.is_some() {
                    tracing::warn!("node {}'s link closed: {e}", name.as_deref().unwrap_or(""));
                }
                break;
            }
        };
        let reply = match &name {
            Some(n) if *n != report.name => AgentAnswer::Refused {
                reason: format!("this link registered node {n}, not {}", report.name),
            },
            Some(_) => {
                let mut b = c.books();
                let now = c.now();
                if b.links.get(&report.name) == Some(&id) {
                    let (_, sessions, loads) = parts(&report);
                    b.pool.report(&report.name, &sessions, &loads, now);
                    c.reschedule(&mut b);
                    AgentAnswer::Ack
                } else {
                    AgentAnswer::Refused {
                        reason: format!("node {} registered again on another link", report.name),
                    }
                }
            }
            None => {
                let mut b = c.books();
                let now = c.now();
                let (spec, sessions, loads) = parts(&report);
                tracing::info!(
                    "node {} registered: {} device(s), {} session(s), at {}",
                    spec.name,
                    spec.devices.len(),
                    sessions.len(),
                    spec.address
                );
                b.links.insert(spec.name.clone(), id);
                b.pool.register_node(spec, &sessions, &loads, now);
                c.reschedule(&mut b);
                name = Some(report.name.clone());
                AgentAnswer::Ack
            }
        };
        let refused = matches!(reply, AgentAnswer::Refused { .. });
        let mut out = Vec::new();
        encode_frame(&mut out, FrameKind::ControlReply, 0, 0, &reply);
        if conn.send(&out).is_err() || refused {
            break;
        }
    }
    if let Some(n) = name {
        let mut b = c.books();
        if b.links.get(&n) == Some(&id) {
            b.links.remove(&n);
            if b.pool.mark_lost(&n) {
                tracing::warn!("node {n} is lost: its link closed");
            }
            c.reschedule(&mut b);
        }
    }
}

/// A report as the scheduler takes it.
pub(crate) fn parts(r: &NodeReport) -> (NodeSpec, Vec<SessionReport>, Vec<DeviceLoad>) {
    let spec = NodeSpec {
        name: r.name.clone(),
        address: r.address.clone(),
        labels: r.labels.clone(),
        devices: r
            .devices
            .iter()
            .map(|d| DeviceSpec {
                index: d.index,
                model: d.model.clone(),
                memory_total: d.memory_total_bytes,
                compute_capability: d.compute_capability,
                capacity_mtflops: d.capacity_mtflops,
                uuid: gpufuse_proto::uuid_text(&d.uuid),
            })
            .collect(),
    };
    let sessions = r
        .sessions
        .iter()
        .map(|s| SessionReport {
            pool_session: s.pool_session.map(gpufuse_proto::SessionId::get),
            node_session: s.node_session.get(),
            tenant: s.tenant.clone(),
            device: s.device,
            vram_limit: s.vram_limit_bytes,
            compute_percent: s.compute_percent,
            qos: s.qos,
            memory_used: s.memory_used_bytes,
            claim: s.claim.clone(),
        })
        .collect();
    let mut devices: Vec<_> = r.devices.iter().collect();
    devices.sort_by_key(|d| d.index);
    let loads = devices
        .iter()
        .map(|d| DeviceLoad {
            utilization_percent: d.utilization_percent,
            memory_used: d.memory_used_bytes,
        })
        .collect();
    (spec, sessions, loads)
}
