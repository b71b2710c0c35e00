//! The controller as a [`gpufuse_observe::PoolSource`] for `gpufuse controller --http`: the
//! pool view ([`Controller::snapshot`]) in the shape the metrics, the dashboard and `gpufuse
//! top` read. Devices and sessions are the nodes' last reports; the pool-wide series
//! (`gpufuse_pool_sessions`, `gpufuse_nodes`) come from the controller's own books.

use gpufuse_observe::snapshot::{
    ControllerSnapshot, DeviceSnapshot, Histogram, NodeSnapshot, PendingSnapshot, PoolSnapshot,
    PoolSource, SessionSnapshot,
};
use gpufuse_proto::PoolStatus;

use crate::Controller;

impl PoolSource for Controller {
    fn snapshot(&self) -> PoolSnapshot {
        let mut snap = to_snapshot(
            &Controller::snapshot(self),
            &gpufuse_observe::snapshot::host_name(),
        );
        if let Some(c) = &mut snap.controller {
            c.placement = self.placement_times();
        }
        snap
    }
}

/// The pool view as observe's snapshot (placement times are the caller's to fill in). A device's UUID is not in the nodes' reports; the
/// series name devices by node and index (`Hostname`, `gpu`).
pub fn to_snapshot(pool: &PoolStatus, host: &str) -> PoolSnapshot {
    let devices = pool
        .nodes
        .iter()
        .flat_map(|n| {
            n.devices.iter().map(move |d| DeviceSnapshot {
                node: n.name.clone(),
                index: d.index,
                uuid: String::new(),
                model: d.model.clone(),
                kind: String::new(),
                memory_total_bytes: d.memory_total_bytes,
                memory_used_bytes: d.memory_used_bytes,
                memory_promised_bytes: d.memory_promised_bytes,
                busy_ratio: f64::from(d.utilization_percent) / 100.0,
                sessions: d.sessions,
                compute_promised_percent: d.compute_promised_percent,
            })
        })
        .collect();
    let sessions = pool
        .sessions
        .iter()
        .filter(|s| s.node.is_some())
        .map(|s| SessionSnapshot {
            id: s.id.get(),
            node: s.node.clone().unwrap_or_default(),
            device: s.device.unwrap_or(0),
            tenant: s.tenant.clone(),
            qos: s.qos.clone(),
            memory_used_bytes: s.memory_used_bytes,
            memory_limit_bytes: s.vram_limit_bytes,
            compute_share: s.compute_percent.map(|c| f64::from(c) / 100.0),
            state: s.state.clone(),
            ..Default::default()
        })
        .collect();
    let pending = pool
        .pending
        .iter()
        .map(|p| PendingSnapshot {
            what: format!("session {}", p.id),
            tenant: p.tenant.clone(),
            reason: p.reason.clone(),
            age_seconds: p.waiting_ms as f64 / 1000.0,
            state: "pending".into(),
        })
        .collect();
    let mut by_state: std::collections::BTreeMap<String, u64> =
        ["pending", "starting", "running", "lost"]
            .iter()
            .map(|s| (s.to_string(), 0))
            .collect();
    for s in &pool.sessions {
        *by_state.entry(s.state.clone()).or_default() += 1;
    }
    let nodes = pool
        .nodes
        .iter()
        .map(|n| NodeSnapshot {
            name: n.name.clone(),
            state: n.state.clone(),
            address: n.address.clone(),
        })
        .collect();
    PoolSnapshot {
        role: "controller".into(),
        host: host.into(),
        // The nodes' launch-queue policy is theirs; the controller has a placement policy.
        compute_policy: String::new(),
        devices,
        sessions,
        pending,
        controller: Some(ControllerSnapshot {
            sessions_by_state: by_state.into_iter().collect(),
            placement: Histogram::default(),
            nodes,
        }),
        image_cache: None,
    }
}

#[cfg(test)]
mod tests {
    use gpufuse_proto::{
        PoolDeviceView, PoolNodeView, PoolPendingView, PoolSessionView, PoolStatus,
    };
    use gpufuse_scheduler::NodeState;

    use super::to_snapshot;

    fn device(index: u32, sessions: u32) -> PoolDeviceView {
        PoolDeviceView {
            index,
            model: "NVIDIA H100".into(),
            compute_capability: (9, 0),
            memory_total_bytes: 80 << 30,
            memory_promised_bytes: 8 << 30,
            memory_used_bytes: 3 << 30,
            compute_promised_percent: 40,
            utilization_percent: 25,
            sessions,
        }
    }

    fn node(name: &str, state: &str, devices: Vec<PoolDeviceView>) -> PoolNodeView {
        PoolNodeView {
            name: name.into(),
            address: format!("tcp:{name}:7000"),
            state: state.into(),
            cordoned: false,
            labels: Default::default(),
            last_heard_ms: 100,
            devices,
        }
    }

    fn session(id: u64, node: Option<&str>, state: &str) -> PoolSessionView {
        PoolSessionView {
            id: gpufuse_proto::SessionId(id),
            tenant: "alice".into(),
            node: node.map(str::to_string),
            device: node.map(|_| 1),
            state: state.into(),
            vram_limit_bytes: Some(8 << 30),
            compute_percent: Some(40),
            qos: "high".into(),
            memory_used_bytes: 3 << 30,
            node_session: node.map(|_| gpufuse_proto::SessionId(5)),
            claim: None,
        }
    }

    /// What `gpufuse top --server CONTROLLER` and the controller's `--http` show of a pool.
    #[test]
    fn the_pool_view_becomes_nodes_devices_and_sessions() {
        let pool = PoolStatus {
            policy: "binpack".into(),
            nodes: vec![
                node("gpu-a", "ready", vec![device(0, 0), device(1, 1)]),
                node("gpu-b", "lost", vec![device(0, 0)]),
            ],
            sessions: vec![
                session(1, Some("gpu-a"), "running"),
                session(2, None, "pending"),
            ],
            pending: vec![PoolPendingView {
                id: gpufuse_proto::SessionId(2),
                tenant: "bob".into(),
                vram_bytes: Some(90 << 30),
                compute_percent: None,
                qos: "medium".into(),
                reason: "no device has 90 GiB free".into(),
                waiting_ms: 2500,
            }],
        };
        let snap = to_snapshot(&pool, "ctl");
        assert_eq!(
            (snap.role.as_str(), snap.host.as_str()),
            ("controller", "ctl")
        );
        let devices: Vec<(&str, u32, u32)> = snap
            .devices
            .iter()
            .map(|d| (d.node.as_str(), d.index, d.sessions))
            .collect();
        assert_eq!(devices, [("gpu-a", 0, 0), ("gpu-a", 1, 1), ("gpu-b", 0, 0)]);
        let d = &snap.devices[1];
        assert_eq!(d.model, "NVIDIA H100");
        assert_eq!(
            (
                d.memory_total_bytes,
                d.memory_used_bytes,
                d.memory_promised_bytes
            ),
            (80 << 30, 3 << 30, 8 << 30)
        );
        assert_eq!(d.busy_ratio, 0.25);
        // Placed sessions are the session table; the waiting one is pending, with why.
        assert_eq!(snap.sessions.len(), 1);
        let s = &snap.sessions[0];
        assert_eq!((s.id, s.node.as_str(), s.device), (1, "gpu-a", 1));
        assert_eq!((s.tenant.as_str(), s.qos.as_str()), ("alice", "high"));
        assert_eq!(s.memory_limit_bytes, Some(8 << 30));
        assert_eq!(s.compute_share, Some(0.4));
        assert_eq!(snap.pending.len(), 1);
        let p = &snap.pending[0];
        assert_eq!(
            (p.what.as_str(), p.state.as_str(), p.age_seconds),
            ("session 2", "pending", 2.5)
        );
        assert_eq!(p.reason, "no device has 90 GiB free");
        let c = snap.controller.expect("a controller's figures");
        let nodes: Vec<(&str, &str)> = c
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.state.as_str()))
            .collect();
        assert_eq!(nodes, [("gpu-a", "ready"), ("gpu-b", "lost")]);
        let by_state: std::collections::BTreeMap<&str, u64> = c
            .sessions_by_state
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        assert_eq!(by_state["running"], 1);
        assert_eq!(by_state["pending"], 1);
        assert_eq!(by_state["lost"], 0);
    }

    /// `gpufuse_nodes` has a sample for each of the scheduler's node states, and only those.
    #[test]
    fn the_metrics_node_states_are_the_schedulers() {
        let names: Vec<&str> = [NodeState::Ready, NodeState::Lost]
            .into_iter()
            .map(|s| {
                // A new state fails to compile here: add it to the list and to NODE_STATES.
                match s {
                    NodeState::Ready | NodeState::Lost => s.name(),
                }
            })
            .collect();
        assert_eq!(names, gpufuse_observe::snapshot::NODE_STATES);
    }
}
