//! The default node timeout and the controller's ticker together mark a silent node lost
//! within 5 s of its last report (issue 12), on a simulated clock: whatever the phase of the
//! ticker against the last report, the first tick that finds the node lost comes in time,
//! and a node that misses fewer than four 1 s heartbeats is never lost.

use gpufuse_controller::{ControllerConfig, DEFAULT_NODE_TIMEOUT, TICK};
use gpufuse_scheduler::{DeviceSpec, NodeSpec, NodeState, Policy, Pool, QuotaFile};

/// Headroom for a tick's sleep overrunning and its wait for the ledger's lock.
const SLACK_MS: u64 = 50;

fn node() -> NodeSpec {
    NodeSpec {
        name: "n".into(),
        address: "unix:/n".into(),
        labels: Default::default(),
        devices: vec![DeviceSpec {
            index: 0,
            model: "emu".into(),
            memory_total: 1 << 30,
            compute_capability: (10, 0),
            capacity_mtflops: 1000,
            uuid: String::new(),
        }],
    }
}

#[test]
fn a_silent_node_is_lost_within_5_s_with_the_defaults() {
    let config = ControllerConfig::new(vec![]);
    assert_eq!(config.node_timeout, DEFAULT_NODE_TIMEOUT);
    let timeout = config.node_timeout.as_millis() as u64;
    let tick = TICK.as_millis() as u64;
    let heartbeat = config.heartbeat.as_millis() as u64;
    for phase in 0..tick {
        let mut pool = Pool::new(Policy::default(), QuotaFile::default());
        // The node's last report, at 1000 ms on the controller's clock.
        let last = 1_000;
        pool.register_node(node(), &[], &[], last);
        // The ticker's ticks, `phase` ms into its period.
        let mut t = phase;
        let lost_at = loop {
            if t >= last && !pool.expire(t, timeout).is_empty() {
                break t;
            }
            t += tick;
            assert!(t < last + 60_000, "never lost");
        };
        assert_eq!(pool.node("n").unwrap().state, NodeState::Lost);
        let after = lost_at - last;
        assert!(
            after + SLACK_MS <= 5_000,
            "phase {phase}: lost {after} ms after its last report"
        );
        assert!(
            after > 4 * heartbeat,
            "phase {phase}: lost after only {after} ms (heartbeats every {heartbeat} ms)"
        );
    }
}
