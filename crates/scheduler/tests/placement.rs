//! Placement decisions on small pools, on a simulated clock.

use std::collections::BTreeMap;

use gpufuse_scheduler::{
    ClaimCharge, Decision, DeviceLoad, DeviceSpec, NodeSpec, NodeState, Policy, Pool, Qos,
    QuotaFile, Rejected, Request, SessionReport, SessionState,
};

const GIB: u64 = 1 << 30;

fn node(name: &str, gpus: u32, labels: &[(&str, &str)], model: &str) -> NodeSpec {
    NodeSpec {
        name: name.into(),
        address: format!("unix:/tmp/{name}.sock"),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        devices: (0..gpus)
            .map(|index| DeviceSpec {
                index,
                model: model.into(),
                memory_total: 16 * GIB,
                compute_capability: (10, 0),
                capacity_mtflops: 80_000,
                uuid: String::new(),
            })
            .collect(),
    }
}

fn pool(policy: Policy) -> Pool {
    let mut p = Pool::new(policy, QuotaFile::default());
    p.register_node(node("a", 2, &[("zone", "x")], "B200"), &[], &[], 0);
    p.register_node(node("b", 2, &[("zone", "y")], "H100"), &[], &[], 0);
    p
}

fn ask(vram_gib: u64) -> Request {
    Request {
        tenant: "t".into(),
        vram_bytes: Some(vram_gib * GIB),
        ..Default::default()
    }
}

fn placed(p: &mut Pool, r: &Request) -> (String, u32) {
    match p.submit(r, 0).unwrap() {
        Decision::Placed(pl) => (pl.node, pl.device),
        other => panic!("not placed: {other:?}"),
    }
}

#[test]
fn binpack_fills_the_fullest_device_first() {
    let mut p = pool(Policy::Binpack);
    let first = placed(&mut p, &ask(4));
    // The same device again while it has room, then the next.
    assert_eq!(placed(&mut p, &ask(4)), first);
    assert_eq!(placed(&mut p, &ask(8)), first);
    assert_ne!(placed(&mut p, &ask(4)), first);
    p.check_invariants().unwrap();
}

#[test]
fn spread_uses_the_emptiest_and_least_busy_device() {
    let mut p = pool(Policy::Spread);
    let mut seen: Vec<(String, u32)> = (0..4).map(|_| placed(&mut p, &ask(2))).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 4, "four sessions on four devices");
    // Among equally free devices, the measured load decides.
    let mut p = pool(Policy::Spread);
    let busy = DeviceLoad {
        utilization_percent: 90,
        memory_used: 0,
    };
    p.report("a", &[], &[busy, busy], 1);
    p.report("b", &[], &[busy, DeviceLoad::default()], 1);
    assert_eq!(placed(&mut p, &ask(2)), ("b".into(), 1));
}

#[test]
fn balanced_fills_a_node_and_spreads_inside_it() {
    let mut p = pool(Policy::Balanced);
    let (n1, d1) = placed(&mut p, &ask(2));
    let (n2, d2) = placed(&mut p, &ask(2));
    assert_eq!(n1, n2, "the same node");
    assert_ne!(d1, d2, "another device on it");
    let (n3, _) = placed(&mut p, &ask(2));
    assert_eq!(n3, n1);
}

#[test]
fn selectors_and_gpu_models_filter_nodes() {
    for policy in Policy::ALL {
        let mut p = pool(policy);
        let mut r = ask(1);
        r.selector = BTreeMap::from([("zone".to_string(), "y".to_string())]);
        assert_eq!(placed(&mut p, &r).0, "b");
        let mut r = ask(1);
        r.gpu_model = Some("b200".into());
        assert_eq!(placed(&mut p, &r).0, "a");
        let mut r = ask(1);
        r.selector = BTreeMap::from([("zone".to_string(), "z".to_string())]);
        match p.submit(&r, 0).unwrap() {
            Decision::Pending { reason, .. } => assert!(reason.contains("zone=z"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_session_that_fits_nowhere_waits_and_is_placed_when_capacity_frees() {
    let mut p = pool(Policy::Binpack);
    let ids: Vec<u64> = (0..4)
        .map(|_| match p.submit(&ask(16), 0).unwrap() {
            Decision::Placed(pl) => pl.session,
            d => panic!("{d:?}"),
        })
        .collect();
    let Decision::Pending { id, reason } = p.submit(&ask(8), 5).unwrap() else {
        panic!("should wait")
    };
    assert!(reason.contains("8 GiB"), "{reason}");
    assert_eq!(p.pending().len(), 1);
    assert!(p.retry_pending(6).is_empty());
    p.end_session(ids[2]);
    let placed = p.retry_pending(7);
    assert_eq!(placed.len(), 1);
    assert_eq!(placed[0].session, id);
    assert!(p.pending().is_empty());
    p.check_invariants().unwrap();
}

#[test]
fn quotas_refuse_with_the_limit_named() {
    let q = QuotaFile::parse("[tenants.t]\nsessions = 1\n").unwrap();
    let mut p = Pool::new(Policy::Balanced, q);
    p.register_node(node("a", 1, &[], "B200"), &[], &[], 0);
    placed(&mut p, &ask(1));
    let e = p.submit(&ask(1), 0).unwrap_err();
    assert!(matches!(e, Rejected::Quota(_)));
    assert!(e.to_string().contains("sessions = 1"), "{e}");
}

#[test]
fn claims_and_sessions_share_one_quota() {
    let mut q = QuotaFile::default();
    q.set_tenant(
        "t",
        Some(
            QuotaFile::parse("[default]\nvram = \"6GiB\"\nmax_session_compute = 50\n")
                .unwrap()
                .default
                .unwrap(),
        ),
    );
    let mut p = Pool::new(Policy::Balanced, q);
    p.register_node(node("a", 1, &[], "B200"), &[], &[], 0);
    let claim = |v: u64, c: u32| ClaimCharge {
        tenant: "t".into(),
        node: "k8s-node".into(),
        vram_bytes: v * GIB,
        compute_percent: c,
    };
    // Per-session maxima apply to a claim alone.
    let e = p.charge_claim("big", claim(1, 60)).unwrap_err();
    assert!(e.to_string().contains("max_session_compute"), "{e}");
    p.charge_claim("c1", claim(4, 30)).unwrap();
    p.charge_claim("c1", claim(4, 30)).unwrap(); // again: charged once
    assert_eq!(p.tenant_usage("t").vram, 4 * GIB);
    assert_eq!(p.tenant_usage("t").sessions, 1);
    // A session over what the claim left is refused, and the message says what is held.
    let e = p.submit(&ask(3), 0).unwrap_err();
    assert!(e.to_string().contains("4 GiB is held"), "{e}");
    placed(&mut p, &ask(2));
    // And a claim over what the session and the first claim hold.
    let e = p.charge_claim("c2", claim(1, 10)).unwrap_err();
    assert!(e.to_string().contains("6 GiB is held"), "{e}");
    p.check_invariants().unwrap();
    assert_eq!(p.release_claim("c1").unwrap().vram_bytes, 4 * GIB);
    p.charge_claim("c2", claim(1, 10)).unwrap();
    assert_eq!(p.tenant_usage("t").vram, 3 * GIB);
    assert_eq!(p.claims().len(), 1);
    p.check_invariants().unwrap();
    // The tenant's own quota removed: nothing limits it.
    let mut q = p.quotas().clone();
    q.set_tenant("t", None);
    p.set_quotas(q);
    p.charge_claim("c3", claim(100, 100)).unwrap();
}

fn running(p: &mut Pool, node: &str, reports: &[SessionReport]) {
    p.report(node, reports, &[], 1);
}

#[test]
fn high_qos_preempts_the_fewest_low_sessions() {
    let mut p = Pool::new(Policy::Binpack, QuotaFile::default());
    p.register_node(node("a", 2, &[], "B200"), &[], &[], 0);
    // Device 0: one low 12 GiB session; device 1: three low 4 GiB sessions.
    let low = |gib: u64, dev: u32, ns: u64| SessionReport {
        pool_session: Some(100 + ns),
        node_session: ns,
        tenant: Some("t".into()),
        device: dev,
        vram_limit: Some(gib * GIB),
        compute_percent: None,
        qos: Qos::Low,
        memory_used: 0,
        claim: None,
    };
    let reports = [low(12, 0, 1), low(4, 1, 2), low(4, 1, 3), low(4, 1, 4)];
    running(&mut p, "a", &reports);
    p.check_invariants().unwrap();
    let mut r = ask(10);
    r.qos = Qos::Medium;
    assert!(matches!(p.submit(&r, 2).unwrap(), Decision::Pending { .. }));
    r.qos = Qos::High;
    match p.submit(&r, 2).unwrap() {
        Decision::Preempt(plan) => {
            assert_eq!(plan.victims.len(), 1);
            assert_eq!(plan.victims[0].node_session, 1);
            assert_eq!(
                (plan.placement.node.as_str(), plan.placement.device),
                ("a", 0)
            );
        }
        d => panic!("{d:?}"),
    }
    p.check_invariants().unwrap();
}

#[test]
fn a_silent_node_is_lost_then_reconciled_from_its_report() {
    let mut p = pool(Policy::Balanced);
    let pl = match p.submit(&ask(4), 0).unwrap() {
        Decision::Placed(pl) => pl,
        d => panic!("{d:?}"),
    };
    let report = SessionReport {
        pool_session: Some(pl.session),
        node_session: 7,
        tenant: Some("t".into()),
        device: pl.device,
        vram_limit: Some(4 * GIB),
        compute_percent: None,
        qos: Qos::Medium,
        memory_used: GIB,
        claim: None,
    };
    p.report(&pl.node, std::slice::from_ref(&report), &[], 1_000);
    assert_eq!(p.session(pl.session).unwrap().state, SessionState::Running);
    // The other node keeps heartbeating; this one goes quiet.
    let other = if pl.node == "a" { "b" } else { "a" };
    p.report(other, &[], &[], 5_000);
    assert_eq!(p.expire(6_500, 5_000), vec![pl.node.clone()]);
    assert_eq!(p.node(&pl.node).unwrap().state, NodeState::Lost);
    assert_eq!(p.session(pl.session).unwrap().state, SessionState::Lost);
    // Nothing is placed on the lost node.
    for _ in 0..4 {
        assert_eq!(placed(&mut p, &ask(1)).0, other);
    }
    p.check_invariants().unwrap();
    // It comes back with its session: running again, same id.
    let spec = p.node(&pl.node).unwrap().spec.clone();
    p.register_node(spec.clone(), std::slice::from_ref(&report), &[], 7_000);
    assert_eq!(p.session(pl.session).unwrap().state, SessionState::Running);
    // A report without it: it ended.
    p.register_node(spec, &[], &[], 8_000);
    assert!(p.session(pl.session).is_none());
    p.check_invariants().unwrap();
}

#[test]
fn a_restarted_controller_learns_sessions_from_reports() {
    let mut p = Pool::new(Policy::Balanced, QuotaFile::default());
    let report = SessionReport {
        pool_session: Some(41),
        node_session: 3,
        tenant: Some("t".into()),
        device: 1,
        vram_limit: Some(8 * GIB),
        compute_percent: Some(30),
        qos: Qos::High,
        memory_used: 0,
        claim: None,
    };
    p.register_node(node("a", 2, &[], "B200"), &[report], &[], 0);
    let s = p.session(41).unwrap();
    assert_eq!((s.device, s.state), (1, SessionState::Running));
    assert_eq!(p.tenant_usage("t").vram, 8 * GIB);
    // New ids do not collide with reported ones.
    let pl = placed(&mut p, &ask(1));
    assert_eq!(pl.0, "a");
    assert!(p.sessions().all(|s| s.id != 41 || s.device == 1));
    assert_eq!(p.sessions().count(), 2);
    p.check_invariants().unwrap();
}

#[test]
fn placed_sessions_that_never_start_are_forgotten() {
    let mut p = pool(Policy::Binpack);
    let pl = match p.submit(&ask(4), 0).unwrap() {
        Decision::Placed(pl) => pl,
        d => panic!("{d:?}"),
    };
    p.report(&pl.node, &[], &[], 1_000);
    assert!(p.session(pl.session).is_some(), "still starting");
    p.report("a", &[], &[], 40_000);
    p.report("b", &[], &[], 40_000);
    p.expire(40_000, 5_000);
    assert!(p.session(pl.session).is_none());
    p.check_invariants().unwrap();
}

#[test]
fn tflops_are_a_share_of_each_devices_capacity() {
    let mut p = Pool::new(Policy::Spread, QuotaFile::default());
    let mut small = node("small", 1, &[], "L4");
    small.devices[0].capacity_mtflops = 30_000;
    p.register_node(small, &[], &[], 0);
    p.register_node(node("big", 1, &[], "B200"), &[], &[], 0);
    // 40 TFLOPS: more than the small device has; half of the big one's 80.
    let r = Request {
        tflops: Some(40),
        ..ask(1)
    };
    let Decision::Placed(pl) = p.submit(&r, 0).unwrap() else {
        panic!("not placed")
    };
    assert_eq!((pl.node.as_str(), pl.compute_percent), ("big", Some(50)));
    // The big device has 50% left: another 40 TFLOPS fits; a third does not.
    assert!(matches!(p.submit(&r, 0).unwrap(), Decision::Placed(_)));
    let Decision::Pending { reason, .. } = p.submit(&r, 0).unwrap() else {
        panic!("placed beyond capacity")
    };
    assert!(reason.contains("40 TFLOPS"), "{reason}");
    // Asking for both, or in TFLOPS under a compute quota, is refused.
    let both = Request {
        compute_percent: Some(10),
        ..r.clone()
    };
    assert!(matches!(p.submit(&both, 0), Err(Rejected::Invalid(_))));
    let q = QuotaFile::parse("[default]\ncompute = 100\n").unwrap();
    let mut quota = Pool::new(Policy::Spread, q);
    quota.register_node(node("big", 1, &[], "B200"), &[], &[], 0);
    assert!(matches!(quota.submit(&r, 0), Err(Rejected::Invalid(_))));
}

#[test]
fn a_node_groups_policy_places_on_its_nodes_and_the_pools_elsewhere() {
    use gpufuse_scheduler::NodeGroup;
    let x = |gib| Request {
        selector: [("zone".to_string(), "x".to_string())].into(),
        ..ask(gib)
    };
    let y = |gib| Request {
        selector: [("zone".to_string(), "y".to_string())].into(),
        ..ask(gib)
    };
    let mut p = pool(Policy::Binpack);
    // A group of node "a" that spreads (a GPUPool), and node "c" that registers later.
    p.set_group(
        "inference",
        NodeGroup {
            nodes: ["a".to_string(), "c".to_string()].into(),
            policy: Policy::Spread,
        },
    );
    assert_eq!(p.policy_of("a"), Policy::Spread);
    assert_eq!(p.policy_of("b"), Policy::Binpack);
    // On "a": one session a device (spread); on "b": both on one device (binpack).
    let a1 = placed(&mut p, &x(2));
    let a2 = placed(&mut p, &x(2));
    assert_eq!(a1.0, "a");
    assert_eq!(a2.0, "a");
    assert_ne!(a1.1, a2.1, "spread inside the group");
    let b1 = placed(&mut p, &y(2));
    let b2 = placed(&mut p, &y(2));
    assert_eq!(b1, b2, "binpack outside it");
    p.check_invariants().unwrap();

    // A node registering under a group's name joins it.
    p.register_node(node("c", 2, &[("zone", "z")], "B200"), &[], &[], 0);
    assert_eq!(p.policy_of("c"), Policy::Spread);
    let z = |gib| Request {
        selector: [("zone".to_string(), "z".to_string())].into(),
        ..ask(gib)
    };
    assert_ne!(placed(&mut p, &z(1)), placed(&mut p, &z(1)));
    p.check_invariants().unwrap();

    // Between groups the pool's policy (binpack) picks: the fullest device that fits is
    // b's (12 GiB free), not the group's own (spread) pick, a device of c with 15 GiB free.
    assert_eq!(placed(&mut p, &ask(1)), b1);

    // The group gone: its nodes pack again.
    assert!(p.remove_group("inference"));
    assert_eq!(p.policy_of("a"), Policy::Binpack);
    let again = placed(&mut p, &x(1));
    assert_eq!(placed(&mut p, &x(1)), again);
    p.check_invariants().unwrap();
}

#[test]
fn between_groups_a_balanced_pool_prefers_the_fullest_node() {
    use gpufuse_scheduler::NodeGroup;
    let mut p = pool(Policy::Balanced);
    for (name, node) in [("ga", "a"), ("gb", "b")] {
        p.set_group(
            name,
            NodeGroup {
                nodes: [node.to_string()].into(),
                policy: Policy::Binpack,
            },
        );
    }
    // Node b gets a session: it is the fuller node, so the next one goes there too, onto the
    // device that already has one (b's own binpack).
    let first = placed(
        &mut p,
        &Request {
            selector: [("zone".to_string(), "y".to_string())].into(),
            ..ask(4)
        },
    );
    assert_eq!(placed(&mut p, &ask(4)), first);
    p.check_invariants().unwrap();
}
