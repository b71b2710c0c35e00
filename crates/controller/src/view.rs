//! The pool view (`gpufuse status --server CONTROLLER`), from the scheduler's books.

use gpufuse_proto::SessionId;
use gpufuse_proto::{PoolDeviceView, PoolNodeView, PoolPendingView, PoolSessionView, PoolStatus};
use gpufuse_scheduler::{Millis, Pool};

pub(crate) fn snapshot(pool: &Pool, now: Millis) -> PoolStatus {
    let nodes = pool
        .nodes()
        .iter()
        .map(|n| PoolNodeView {
            name: n.spec.name.clone(),
            address: n.spec.address.clone(),
            state: n.state.name().into(),
            cordoned: n.cordoned,
            labels: n.spec.labels.clone(),
            last_heard_ms: now.saturating_sub(n.last_heard),
            devices: n
                .devices
                .iter()
                .map(|d| PoolDeviceView {
                    index: d.spec.index,
                    model: d.spec.model.clone(),
                    compute_capability: d.spec.compute_capability,
                    memory_total_bytes: d.spec.memory_total,
                    memory_promised_bytes: d.charged_memory,
                    memory_used_bytes: d.load.memory_used,
                    compute_promised_percent: d.charged_compute,
                    utilization_percent: d.load.utilization_percent,
                    sessions: d.sessions.len() as u32,
                })
                .collect(),
        })
        .collect();
    let moving: std::collections::HashMap<u64, (String, u32)> = pool
        .moves_in_flight()
        .map(|(id, m)| (id, (m.from_node.clone(), m.from_device)))
        .collect();
    let mut sessions: Vec<PoolSessionView> = pool
        .sessions()
        .map(|s| {
            // A moving session runs where it came from until the move lands.
            let (node, device, state) = match moving.get(&s.id) {
                Some((n, d)) => (n.clone(), *d, "moving"),
                None => (s.node.clone(), s.device, s.state.name()),
            };
            (s, node, device, state)
        })
        .map(|(s, node, device, state)| PoolSessionView {
            id: SessionId(s.id),
            tenant: s.tenant.clone(),
            node: Some(node),
            device: Some(device),
            state: state.into(),
            vram_limit_bytes: s.vram_limit,
            compute_percent: s.compute_percent,
            qos: s.qos.name().into(),
            memory_used_bytes: s.memory_used,
            node_session: s.node_session.map(gpufuse_proto::SessionId),
            claim: s.claim.clone(),
        })
        .collect();
    let pending: Vec<PoolPendingView> = pool
        .pending()
        .iter()
        .map(|p| PoolPendingView {
            id: SessionId(p.id),
            tenant: p.request.tenant.clone(),
            vram_bytes: p.request.vram_bytes,
            compute_percent: p.request.compute_percent,
            qos: p.request.qos.name().into(),
            reason: p.reason.clone(),
            waiting_ms: now.saturating_sub(p.since),
        })
        .collect();
    sessions.extend(pending.iter().map(|p| PoolSessionView {
        id: p.id,
        tenant: p.tenant.clone(),
        node: None,
        device: None,
        state: "pending".into(),
        vram_limit_bytes: p.vram_bytes,
        compute_percent: p.compute_percent,
        qos: p.qos.clone(),
        memory_used_bytes: 0,
        node_session: None,
        claim: None,
    }));
    sessions.sort_by_key(|s| s.id);
    PoolStatus {
        policy: pool.policy().name().into(),
        nodes,
        sessions,
        pending,
    }
}
