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
            id: s.id,
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
    use gpufuse_scheduler::NodeState;

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
