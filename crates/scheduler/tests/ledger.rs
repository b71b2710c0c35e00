//! Property tests: whatever happens to the pool (requests, ends, reports, lost nodes,
//! re-registrations, expiry), every device's ledger equals the sum of its sessions' charges,
//! no device is charged past its memory or its compute by placement, tenant totals add up,
//! the indexes agree with the ledgers, nothing waits that would fit, and no session is placed
//! on a lost node.

use std::collections::BTreeMap;

use gpufuse_scheduler::{
    Decision, DeviceSpec, NodeSpec, NodeState, Policy, Pool, Qos, QuotaFile, Request, SessionReport,
};
use proptest::prelude::*;

const GIB: u64 = 1 << 30;

#[derive(Clone, Debug)]
enum Op {
    Submit {
        gib: u64,
        compute: Option<u32>,
        qos: u8,
        tenant: u8,
        zone: Option<u8>,
    },
    End(usize),
    Report(u8),
    Lose(u8),
    Register(u8),
    Tick(u64),
    Cancel(usize),
    Cordon(u8, bool),
    /// A defragmentation round with this threshold, its moves begun.
    Defrag(u32),
    /// Settles the i-th move in flight: moved, stayed or ended.
    Settle(usize, u8),
    /// Nodes (a bit mask) in group g with policy q; an empty mask removes the group.
    Group {
        g: u8,
        mask: u8,
        q: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..20, proptest::option::of(1u32..80), 0u8..4, 0u8..3, proptest::option::of(0u8..2))
            .prop_map(|(gib, compute, qos, tenant, zone)| Op::Submit { gib, compute, qos, tenant, zone }),
        2 => any::<usize>().prop_map(Op::End),
        2 => (0u8..3).prop_map(Op::Report),
        1 => (0u8..3).prop_map(Op::Lose),
        1 => (0u8..3).prop_map(Op::Register),
        1 => (1u64..20_000).prop_map(Op::Tick),
        1 => any::<usize>().prop_map(Op::Cancel),
        1 => (0u8..2, 0u8..8, 0u8..3).prop_map(|(g, mask, q)| Op::Group { g, mask, q }),
        1 => (0u8..3, any::<bool>()).prop_map(|(n, on)| Op::Cordon(n, on)),
        1 => (10u32..90).prop_map(Op::Defrag),
        2 => (any::<usize>(), 0u8..3).prop_map(|(i, k)| Op::Settle(i, k)),
    ]
}

fn spec(n: u8) -> NodeSpec {
    NodeSpec {
        name: format!("n{n}"),
        address: format!("unix:/n{n}"),
        labels: BTreeMap::from([("zone".to_string(), (n % 2).to_string())]),
        devices: (0..2)
            .map(|index| DeviceSpec {
                index,
                model: "emu".into(),
                memory_total: 24 * GIB,
                compute_capability: (10, 0),
                capacity_mtflops: 1000,
                uuid: String::new(),
            })
            .collect(),
    }
}

/// What node `n` would report: the sessions the pool placed there (as if all started).
fn reports(p: &Pool, n: u8) -> Vec<SessionReport> {
    let name = format!("n{n}");
    p.sessions()
        .filter(|s| s.node == name)
        .map(|s| SessionReport {
            pool_session: Some(s.id),
            node_session: s.node_session.unwrap_or(s.id + 1000),
            tenant: Some(s.tenant.clone()),
            device: s.device,
            vram_limit: s.vram_limit,
            compute_percent: s.compute_percent,
            qos: s.qos,
            memory_used: s.vram_limit.unwrap_or(0) / 2,
            claim: None,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn the_ledgers_always_add_up(policy in 0usize..3, ops in proptest::collection::vec(op(), 1..80)) {
        let quotas = QuotaFile::parse("[tenants.t0]\nvram = \"40GiB\"\nsessions = 5\n").unwrap();
        let mut p = Pool::new(Policy::ALL[policy], quotas);
        let mut now = 0u64;
        for n in 0..3 {
            p.register_node(spec(n), &[], &[], now);
        }
        for op in ops {
            match op {
                Op::Submit { gib, compute, qos, tenant, zone } => {
                    let req = Request {
                        tenant: format!("t{tenant}"),
                        vram_bytes: Some(gib * GIB),
                        compute_percent: compute,
                        tflops: None,
                        qos: [Qos::Low, Qos::Medium, Qos::High, Qos::Critical][qos as usize],
                        selector: zone.map(|z| BTreeMap::from([("zone".to_string(), z.to_string())])).unwrap_or_default(),
                        gpu_model: None,
                        device_uuid: None,
                    };
                    if let Ok(Decision::Placed(pl) | Decision::Preempt(gpufuse_scheduler::PreemptionPlan { placement: pl, .. })) = p.submit(&req, now) {
                        let node = p.node(&pl.node).unwrap();
                        prop_assert_eq!(node.state, NodeState::Ready);
                        prop_assert!(!node.cordoned);
                        if let Some(z) = zone {
                            prop_assert_eq!(node.spec.labels["zone"].clone(), z.to_string());
                        }
                    }
                }
                Op::End(i) => {
                    let ids: Vec<u64> = p.sessions().map(|s| s.id).collect();
                    if !ids.is_empty() {
                        p.end_session(ids[i % ids.len()]);
                        p.retry_pending(now);
                    }
                }
                Op::Report(n) => {
                    if p.node(&format!("n{n}")).unwrap().state == NodeState::Ready {
                        let r = reports(&p, n);
                        p.report(&format!("n{n}"), &r, &[], now);
                    }
                }
                Op::Lose(n) => {
                    p.mark_lost(&format!("n{n}"));
                }
                Op::Register(n) => {
                    let r = reports(&p, n);
                    p.register_node(spec(n), &r, &[], now);
                    p.retry_pending(now);
                }
                Op::Tick(ms) => {
                    now += ms;
                    p.expire(now, 5_000);
                    p.retry_pending(now);
                }
                Op::Cancel(i) => {
                    let ids: Vec<u64> = p.pending().iter().map(|x| x.id).collect();
                    if !ids.is_empty() {
                        p.cancel_pending(ids[i % ids.len()]);
                    }
                }
                Op::Cordon(n, on) => {
                    p.cordon(&format!("n{n}"), on).unwrap();
                }
                Op::Defrag(th) => {
                    for m in p.plan_defrag(th) {
                        let _ = p.begin_move(m.session, &m.to_node, m.to_device, true);
                    }
                }
                Op::Settle(i, k) => {
                    let ids: Vec<u64> = p.moves_in_flight().map(|(id, _)| id).collect();
                    if !ids.is_empty() {
                        let id = ids[i % ids.len()];
                        let end = match k {
                            0 => gpufuse_scheduler::MoveEnd::Moved { node_session: id + 5000 },
                            1 => gpufuse_scheduler::MoveEnd::Stayed,
                            _ => gpufuse_scheduler::MoveEnd::Ended,
                        };
                        p.finish_move(id, end);
                        p.retry_pending(now);
                    }
                }
                Op::Group { g, mask, q } => {
                    let nodes: std::collections::BTreeSet<String> =
                        (0..3).filter(|n| mask & (1 << n) != 0).map(|n| format!("n{n}")).collect();
                    if nodes.is_empty() {
                        p.remove_group(&format!("g{g}"));
                    } else {
                        p.set_group(&format!("g{g}"), gpufuse_scheduler::NodeGroup { nodes, policy: Policy::ALL[q as usize] });
                    }
                }
            }
            p.check_invariants().map_err(TestCaseError::fail)?;
            // Placement never charges a device past what it has (reports here mirror the
            // pool's own placements).
            for n in p.nodes() {
                for d in &n.devices {
                    prop_assert!(d.charged_memory <= d.spec.memory_total);
                    prop_assert!(d.charged_compute <= 100);
                }
            }
            // Quota totals hold.
            prop_assert!(p.tenant_usage("t0").vram <= 40 * GIB);
            prop_assert!(p.tenant_usage("t0").sessions <= 5);
        }
        // After a retry, nothing that waits would fit now, but what is held back for a
        // request that has waited past AGING_MS (of its QoS or higher).
        p.retry_pending(now);
        let waiting: Vec<(Request, String)> =
            p.pending().iter().map(|x| (x.request.clone(), x.reason.clone())).collect();
        for (req, reason) in waiting {
            if reason.starts_with("held back for request") {
                let aged = p.pending().iter().any(|x| {
                    now.saturating_sub(x.since) >= gpufuse_scheduler::AGING_MS
                        && x.request.qos.rank() >= req.qos.rank()
                });
                prop_assert!(aged, "{:?} held back by no aged request: {}", req, reason);
                continue;
            }
            let free_somewhere = p.nodes().iter().filter(|n| n.placeable()).any(|n| {
                req.selector.iter().all(|(k, v)| n.spec.labels.get(k) == Some(v))
                    && n.devices.iter().any(|d| {
                        d.free_memory() >= req.vram_bytes.unwrap_or(1)
                            && d.free_compute() >= req.compute_percent.unwrap_or(0)
                    })
            });
            let over_quota = p.quotas().admit(&req, p.tenant_usage(&req.tenant)).is_err();
            prop_assert!(!free_somewhere || over_quota, "{:?} waits but fits", req);
        }
    }
}
