//! Moving sessions: the ledger of moves in flight, draining a node, defragmentation rounds and
//! preemption that moves its victims, on a simulated clock.

use std::collections::BTreeMap;

use gpufuse_scheduler::{
    Decision, DeviceSpec, MoveEnd, NodeSpec, Policy, Pool, Qos, QuotaFile, Request, SessionReport,
};

const GIB: u64 = 1 << 30;

fn node(name: &str, gpus: u32, model: &str, labels: &[(&str, &str)]) -> NodeSpec {
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
                uuid: format!("GPU-{name}-{index}"),
            })
            .collect(),
    }
}

fn report(id: u64, device: u32, gib: u64, qos: Qos) -> SessionReport {
    SessionReport {
        pool_session: Some(id),
        node_session: id + 100,
        tenant: Some("t".into()),
        device,
        vram_limit: Some(gib * GIB),
        compute_percent: None,
        qos,
        memory_used: 0,
        claim: None,
    }
}

fn ask(gib: u64) -> Request {
    Request {
        tenant: "t".into(),
        vram_bytes: Some(gib * GIB),
        ..Default::default()
    }
}

fn at(p: &Pool, id: u64) -> (String, u32) {
    let s = p.session(id).unwrap();
    (s.node.clone(), s.device)
}

/// Carries out moves as the controller does when every one succeeds.
fn carry_out(p: &mut Pool, moves: &[gpufuse_scheduler::Move]) {
    for m in moves {
        p.begin_move(m.session, &m.to_node, m.to_device, true)
            .unwrap();
        p.finish_move(
            m.session,
            MoveEnd::Moved {
                node_session: m.session + 500,
            },
        );
        p.check_invariants().unwrap();
    }
}

#[test]
fn a_move_in_flight_holds_both_devices_whatever_the_nodes_report() {
    let mut p = Pool::new(Policy::Binpack, QuotaFile::default());
    p.register_node(
        node("a", 1, "B200", &[]),
        &[report(1, 0, 6, Qos::Medium)],
        &[],
        0,
    );
    p.register_node(node("b", 1, "B200", &[]), &[], &[], 0);
    let charged = |p: &Pool, n: &str| p.node(n).unwrap().devices[0].charged_memory;
    p.begin_move(1, "b", 0, true).unwrap();
    assert!(p.is_moving(1));
    // Moving twice, or a session that is not there: refused, nothing changes.
    assert!(p
        .begin_move(1, "a", 0, true)
        .unwrap_err()
        .contains("moving already"));
    assert!(p.begin_move(9, "a", 0, true).is_err());
    // Its memory is on both devices while it is copied: both are charged, whatever the
    // nodes report meanwhile (both report it once the target has started its worker).
    for (a, b) in [(true, false), (true, true), (false, true)] {
        let on = |yes: bool, ns: u64| {
            let mut r = report(1, 0, 6, Qos::Medium);
            r.node_session = ns;
            if yes {
                vec![r]
            } else {
                vec![]
            }
        };
        p.report("a", &on(a, 101), &[], 1);
        p.report("b", &on(b, 7), &[], 1);
        assert_eq!(at(&p, 1), ("a".into(), 0));
        assert_eq!((charged(&p, "a"), charged(&p, "b")), (6 * GIB, 6 * GIB));
        p.check_invariants().unwrap();
    }
    // The move failed: where it was, with its node's id; the target's reservation is gone.
    p.finish_move(1, MoveEnd::Stayed);
    assert_eq!(at(&p, 1), ("a".into(), 0));
    assert_eq!(p.session(1).unwrap().node_session, Some(101));
    assert_eq!((charged(&p, "a"), charged(&p, "b")), (6 * GIB, 0));
    p.check_invariants().unwrap();
    // Again, and it lands.
    p.begin_move(1, "b", 0, true).unwrap();
    p.finish_move(1, MoveEnd::Moved { node_session: 7 });
    assert!(!p.is_moving(1));
    assert_eq!(at(&p, 1), ("b".into(), 0));
    assert_eq!(p.session(1).unwrap().node_session, Some(7));
    assert_eq!((charged(&p, "a"), charged(&p, "b")), (0, 6 * GIB));
    // The source no longer reports it, the target does: nothing changes.
    p.report("a", &[], &[], 2);
    let mut r = report(1, 0, 6, Qos::Medium);
    r.node_session = 7;
    p.report("b", &[r], &[], 2);
    assert_eq!(at(&p, 1), ("b".into(), 0));
    p.check_invariants().unwrap();
    // A session that ends while it moves: both charges go.
    p.begin_move(1, "a", 0, true).unwrap();
    p.end_session(1);
    assert_eq!((charged(&p, "a"), charged(&p, "b")), (0, 0));
    p.check_invariants().unwrap();
}

#[test]
fn a_drain_moves_every_session_to_a_device_of_its_model_largest_first() {
    let mut p = Pool::new(Policy::Spread, QuotaFile::default());
    let on_a = [
        report(1, 0, 2, Qos::Medium),
        report(2, 0, 10, Qos::Low),
        report(3, 1, 6, Qos::High),
    ];
    p.register_node(node("a", 2, "B200", &[]), &on_a, &[], 0);
    p.register_node(
        node("b", 2, "B200", &[]),
        &[report(4, 0, 10, Qos::Medium)],
        &[],
        0,
    );
    // Another model with room to spare: never a target.
    p.register_node(node("c", 2, "H100", &[]), &[], &[], 0);
    let plan = p.plan_drain("a").unwrap();
    assert!(plan.stuck.is_empty(), "{:?}", plan.stuck);
    let order: Vec<u64> = plan.moves.iter().map(|m| m.session).collect();
    assert_eq!(order, [2, 3, 1]);
    assert!(plan.moves.iter().all(|m| m.to_node == "b"), "{plan:?}");
    // Planning changed nothing.
    assert_eq!(at(&p, 2), ("a".into(), 0));
    assert!(!p.node("a").unwrap().cordoned);
    // A drain cordons first: nothing new lands there meanwhile.
    assert!(p.cordon("a", true).unwrap());
    let mut small = ask(1);
    small.gpu_model = Some("B200".into());
    for _ in 0..2 {
        match p.submit(&small, 1).unwrap() {
            Decision::Placed(pl) => assert_ne!(pl.node, "a"),
            d => panic!("{d:?}"),
        }
    }
    p.check_invariants().unwrap();
    // Where each would go now, one at a time (as the controller moves them).
    for id in [2, 3, 1] {
        let (n, d) = p.move_target(id).unwrap();
        assert_eq!(n, "b");
        p.begin_move(id, &n, d, true).unwrap();
        p.finish_move(
            id,
            MoveEnd::Moved {
                node_session: id + 50,
            },
        );
    }
    assert!(p.sessions().all(|s| s.node != "a"));
    assert!(p
        .node("a")
        .unwrap()
        .devices
        .iter()
        .all(|d| d.charged_memory == 0));
    p.check_invariants().unwrap();
    // Uncordoned, it takes sessions again.
    assert!(p.cordon("a", false).unwrap());
    assert!(!p.cordon("a", false).unwrap());
    assert!(p.cordon("nowhere", true).is_err());
}

#[test]
fn a_drain_names_what_cannot_move_and_why() {
    let mut p = Pool::new(Policy::Binpack, QuotaFile::default());
    p.register_node(
        node("a", 1, "B200", &[("zone", "x")]),
        &[report(1, 0, 4, Qos::Medium)],
        &[],
        0,
    );
    p.register_node(node("b", 1, "B200", &[("zone", "y")]), &[], &[], 0);
    // A session placed with a selector only has nodes with its labels to go to.
    let mut r = ask(3);
    r.selector = BTreeMap::from([("zone".to_string(), "x".to_string())]);
    let id = match p.submit(&r, 0).unwrap() {
        Decision::Placed(pl) => pl.session,
        d => panic!("{d:?}"),
    };
    let mut rep = report(id, 0, 3, Qos::Medium);
    rep.node_session = 9;
    p.report("a", &[report(1, 0, 4, Qos::Medium), rep], &[], 1);
    let plan = p.plan_drain("a").unwrap();
    assert_eq!(plan.moves.len(), 1);
    assert_eq!(plan.moves[0].session, 1);
    assert_eq!(plan.stuck.len(), 1);
    assert_eq!(plan.stuck[0].0, id);
    assert!(
        plan.stuck[0].1.contains("its labels"),
        "{}",
        plan.stuck[0].1
    );
    assert!(p.plan_drain("nowhere").is_err());
}

#[test]
fn defragmentation_empties_whole_devices_so_a_large_session_fits() {
    let mut p = Pool::new(Policy::Spread, QuotaFile::default());
    // Spread left four devices each a quarter full (4 GiB of 16) and one 3/4 full.
    p.register_node(
        node("a", 2, "B200", &[]),
        &[report(1, 0, 4, Qos::Low), report(2, 1, 4, Qos::Medium)],
        &[],
        0,
    );
    p.register_node(
        node("b", 3, "B200", &[]),
        &[
            report(3, 0, 4, Qos::Low),
            report(4, 1, 4, Qos::Medium),
            report(5, 2, 12, Qos::Medium),
        ],
        &[],
        0,
    );
    let big = p.submit(&ask(14), 1).unwrap();
    let Decision::Pending { id: big, .. } = big else {
        panic!("{big:?}")
    };
    // A threshold under every device's use: nothing to do.
    assert!(p.plan_defrag(20).is_empty());
    let plan = p.plan_defrag(50);
    // No session moves twice, and none moves onto a device the round empties.
    let mut moved: Vec<u64> = plan.iter().map(|m| m.session).collect();
    moved.sort_unstable();
    moved.dedup();
    assert_eq!(moved.len(), plan.len(), "{plan:?}");
    for m in &plan {
        assert!(
            !plan
                .iter()
                .any(|o| (o.from_node.as_str(), o.from_device) == (m.to_node.as_str(), m.to_device)),
            "{m:?} lands on a device the round empties: {plan:?}"
        );
    }
    // The 3/4-full device is over the threshold: never emptied.
    assert!(plan.iter().all(|m| m.session != 5));
    carry_out(&mut p, &plan);
    let empty = p
        .nodes()
        .iter()
        .flat_map(|n| &n.devices)
        .filter(|d| d.sessions.is_empty())
        .count();
    assert!(empty >= 3, "{plan:?}");
    let placed = p.retry_pending(2);
    assert_eq!(placed.len(), 1);
    assert_eq!(placed[0].session, big);
    p.check_invariants().unwrap();
    // Packed now: a second round has nothing to do.
    assert!(p.plan_defrag(50).is_empty());
}

#[test]
fn defragmentation_leaves_a_device_whose_sessions_do_not_all_fit_elsewhere() {
    let mut p = Pool::new(Policy::Spread, QuotaFile::default());
    p.register_node(
        node("a", 2, "B200", &[]),
        &[
            report(1, 0, 5, Qos::Low),
            report(2, 0, 2, Qos::Low),
            report(3, 1, 10, Qos::Low),
        ],
        &[],
        0,
    );
    // Device 0 (7 GiB) cannot empty: 5 and 2 GiB do not both fit in device 1's 6 GiB.
    let plan = p.plan_defrag(50);
    assert!(plan.is_empty(), "{plan:?}");
}

#[test]
fn preemption_moves_victims_that_fit_elsewhere_and_ends_the_rest() {
    let mut p = Pool::new(Policy::Binpack, QuotaFile::default());
    p.register_node(
        node("a", 1, "B200", &[]),
        &[report(1, 0, 8, Qos::Low), report(2, 0, 8, Qos::Low)],
        &[],
        0,
    );
    // Node b's device holds one 8 GiB victim, not two.
    p.register_node(
        node("b", 1, "B200", &[]),
        &[report(3, 0, 6, Qos::Medium)],
        &[],
        0,
    );
    let mut r = ask(16);
    r.qos = Qos::Critical;
    let plan = match p.submit(&r, 1).unwrap() {
        Decision::Preempt(plan) => plan,
        d => panic!("{d:?}"),
    };
    assert_eq!(plan.victims.len(), 2);
    let moved: Vec<_> = plan
        .victims
        .iter()
        .filter(|v| v.move_to.is_some())
        .collect();
    assert_eq!(moved.len(), 1, "{plan:?}");
    assert_eq!(moved[0].move_to, Some(("b".to_string(), 0)));
    assert!(p.is_moving(moved[0].session));
    // Its node is asked by the id it has there.
    let (_, m) = p
        .moves_in_flight()
        .find(|(id, _)| *id == moved[0].session)
        .unwrap();
    assert_eq!(
        (m.from_node.as_str(), m.from_node_session),
        ("a", Some(moved[0].node_session))
    );
    let ended = plan.victims.iter().find(|v| v.move_to.is_none()).unwrap();
    assert!(p.session(ended.session).is_none());
    assert_eq!(
        (plan.placement.node.as_str(), plan.placement.device),
        ("a", 0)
    );
    assert_eq!(p.node("b").unwrap().devices[0].charged_memory, 14 * GIB);
    p.check_invariants().unwrap();
    // The move failed after all: the controller ends it instead.
    p.finish_move(moved[0].session, MoveEnd::Ended);
    assert!(p.session(moved[0].session).is_none());
    assert_eq!(p.node("b").unwrap().devices[0].charged_memory, 6 * GIB);
    p.check_invariants().unwrap();
}

/// A session its node admitted on a Kubernetes claim's token (no grant, so no pool id; the
/// claim named in the report): counted once on its device, never moved by a drain or a
/// defragmentation round, never a preemption's victim, and still there when the node reports
/// it again.
#[test]
fn a_claims_session_stays_on_its_device_and_is_never_a_victim() {
    let mut p = Pool::new(Policy::Binpack, QuotaFile::default());
    let mut claimed = report(0, 0, 4, Qos::Low);
    claimed.pool_session = None;
    claimed.node_session = 7;
    claimed.tenant = Some("team-a/train".into());
    claimed.claim = Some("5b7a1c2e-0000-4000-8000-00000000000a".into());
    p.register_node(node("a", 1, "B200", &[]), &[claimed.clone()], &[], 0);
    p.register_node(node("b", 1, "B200", &[]), &[], &[], 0);
    let s = p.sessions().next().unwrap().clone();
    assert!(s.pinned);
    assert_eq!(s.claim, claimed.claim);
    assert_eq!(s.tenant, "team-a/train");
    assert_eq!(p.node("a").unwrap().devices[0].charged_memory, 4 * GIB);
    // Reported again, by the same node id: the same session, not a second one.
    p.report("a", &[claimed.clone()], &[], 1);
    assert_eq!(p.sessions().count(), 1);
    assert_eq!(p.node("a").unwrap().devices[0].charged_memory, 4 * GIB);

    let plan = p.plan_drain("a").unwrap();
    assert!(plan.moves.is_empty(), "{plan:?}");
    assert_eq!(plan.stuck.len(), 1);
    assert!(
        plan.stuck[0].1.contains("bound to its device"),
        "{}",
        plan.stuck[0].1
    );
    assert!(p.plan_defrag(100).is_empty());
    // A critical session that needs the whole device waits rather than end the claim's.
    p.report("b", &[report(9, 0, 14, Qos::Medium)], &[], 1);
    let mut r = ask(16);
    r.qos = Qos::Critical;
    assert!(matches!(p.submit(&r, 2).unwrap(), Decision::Pending { .. }));
    assert_eq!(p.sessions().filter(|s| s.pinned).count(), 1);
    p.check_invariants().unwrap();
}
