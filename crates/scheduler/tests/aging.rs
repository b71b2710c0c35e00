//! The pending queue's bound against starvation, on a simulated clock: a request that has
//! waited past `AGING_MS` keeps the device where it could next fit, so a stream of small
//! requests (queued or new) no longer takes that device's capacity as it frees.

use gpufuse_scheduler::{
    Decision, DeviceSpec, NodeSpec, Policy, Pool, Qos, QuotaFile, Request, SessionId, AGING_MS,
};

const GIB: u64 = 1 << 30;

fn node(name: &str, gpus: u32, gib: u64) -> NodeSpec {
    NodeSpec {
        name: name.into(),
        address: format!("unix:/tmp/{name}.sock"),
        labels: Default::default(),
        devices: (0..gpus)
            .map(|index| DeviceSpec {
                index,
                model: "B200".into(),
                memory_total: gib * GIB,
                compute_capability: (10, 0),
                capacity_mtflops: 80_000,
                uuid: String::new(),
            })
            .collect(),
    }
}

fn ask(gib: u64, qos: Qos) -> Request {
    Request {
        tenant: "t".into(),
        vram_bytes: Some(gib * GIB),
        qos,
        ..Default::default()
    }
}

fn placed(d: Decision) -> SessionId {
    match d {
        Decision::Placed(p) => p.session,
        other => panic!("not placed: {other:?}"),
    }
}

fn pending(d: Decision) -> (SessionId, String) {
    match d {
        Decision::Pending { id, reason } => (id, reason),
        other => panic!("not pending: {other:?}"),
    }
}

/// One 8 GiB device with two 3 GiB sessions on it (2 GiB free), and a 6 GiB request waiting
/// since `t = 0`. Every 10 s the older small session ends and a new 3 GiB one arrives: the
/// device never has 6 GiB free unless the small ones are held back.
fn churn(policy: Policy) -> (Pool, SessionId, Vec<SessionId>) {
    let mut p = Pool::new(policy, QuotaFile::default());
    p.register_node(node("a", 1, 8), &[], &[], 0);
    let small = vec![
        placed(p.submit(&ask(3, Qos::Medium), 0).unwrap()),
        placed(p.submit(&ask(3, Qos::Medium), 0).unwrap()),
    ];
    let (big, reason) = pending(p.submit(&ask(6, Qos::Medium), 0).unwrap());
    assert!(reason.contains("6 GiB"), "{reason}");
    (p, big, small)
}

#[test]
fn before_the_bound_small_requests_overtake_a_big_one() {
    let (mut p, big, mut small) = churn(Policy::Binpack);
    for t in (10_000..AGING_MS).step_by(10_000) {
        p.end_session(small.remove(0));
        assert!(p.retry_pending(t).is_empty());
        small.push(placed(p.submit(&ask(3, Qos::Medium), t).unwrap()));
        assert_eq!(p.pending()[0].id, big);
        p.check_invariants().unwrap();
    }
}

#[test]
fn after_the_bound_a_big_request_is_placed_despite_a_stream_of_small_ones() {
    for policy in Policy::ALL {
        let (mut p, big, mut small) = churn(policy);
        let mut held = Vec::new();
        let mut big_at = None;
        for t in (10_000..=200_000).step_by(10_000) {
            if !small.is_empty() {
                p.end_session(small.remove(0));
            }
            for pl in p.retry_pending(t) {
                if pl.session == big {
                    big_at = Some(t);
                }
            }
            if big_at.is_some() {
                break;
            }
            match p.submit(&ask(3, Qos::Medium), t).unwrap() {
                Decision::Placed(pl) => {
                    assert!(t < AGING_MS, "{policy:?}: a small request placed at {t} ms");
                    small.push(pl.session);
                }
                Decision::Pending { id, reason } => {
                    assert!(t >= AGING_MS, "{policy:?}: held back at {t} ms: {reason}");
                    assert!(
                        reason.contains(&format!("held back for request {big}"))
                            && reason.contains("device 0 of node a"),
                        "{reason}"
                    );
                    held.push(id);
                }
                other => panic!("{other:?}"),
            }
            p.check_invariants().unwrap();
        }
        // At 60 s one small session ends and its space is kept; the other ends at 70 s and
        // the big request fits. The small one that came at 60 s waits.
        assert_eq!(big_at, Some(70_000), "{policy:?}");
        assert_eq!(held.len(), 1, "{policy:?}");
        // The held-back requests wait behind it, their reason now plain capacity.
        let ids: Vec<SessionId> = p.pending().iter().map(|x| x.id).collect();
        assert_eq!(ids, held, "{policy:?}");
        assert!(p.pending()[0].reason.contains("3 GiB"), "{:?}", p.pending());
        p.check_invariants().unwrap();
        // The big session ends: the held-back ones are placed.
        p.end_session(big);
        assert_eq!(p.retry_pending(90_000).len(), 1, "{policy:?}");
        p.check_invariants().unwrap();
    }
}

#[test]
fn an_aged_request_keeps_one_device_and_others_stay_usable() {
    // Two devices: the aged request keeps the one where it could next fit (the most free);
    // small requests still land on the other.
    let mut p = Pool::new(Policy::Spread, QuotaFile::default());
    p.register_node(node("a", 2, 8), &[], &[], 0);
    let s0 = placed(p.submit(&ask(5, Qos::Medium), 0).unwrap());
    let _s1 = placed(p.submit(&ask(4, Qos::Medium), 0).unwrap());
    // 3 GiB and 4 GiB free: 6 GiB fits on neither.
    let (big, _) = pending(p.submit(&ask(6, Qos::Medium), 0).unwrap());
    let kept = p.session(_s1).unwrap().device;
    let t = AGING_MS;
    assert!(p.retry_pending(t).is_empty());
    // Spread would pick the emptier device (the kept one, 4 GiB free): the small request
    // goes to the other instead.
    let d = p.submit(&ask(1, Qos::Medium), t).unwrap();
    let Decision::Placed(pl) = d else {
        panic!("{d:?}")
    };
    assert_ne!(pl.device, kept);
    // What only fits on the kept device waits, saying why.
    let (_, reason) = pending(p.submit(&ask(4, Qos::Medium), t).unwrap());
    assert!(
        reason.contains(&format!("held back for request {big}")),
        "{reason}"
    );
    p.check_invariants().unwrap();
    // The device kept for it frees: it is placed there.
    p.end_session(_s1);
    let placed_now = p.retry_pending(t + 1);
    assert_eq!(placed_now[0].session, big, "{placed_now:?}");
    assert_eq!(placed_now[0].device, kept);
    let _ = s0;
    p.check_invariants().unwrap();
}

#[test]
fn a_higher_qos_request_is_not_held_back_by_an_aged_lower_one() {
    let (mut p, big, _small) = churn(Policy::Binpack);
    let t = AGING_MS + 1;
    assert!(p.retry_pending(t).is_empty());
    let high = p.submit(&ask(1, Qos::High), t).unwrap();
    assert!(matches!(high, Decision::Placed(_)), "{high:?}");
    // A lower one is.
    let (_, reason) = pending(p.submit(&ask(1, Qos::Low), t).unwrap());
    assert!(
        reason.contains(&format!("held back for request {big}")),
        "{reason}"
    );
    p.check_invariants().unwrap();
}

#[test]
fn an_aged_request_over_quota_keeps_nothing() {
    // A request waiting on its tenant's quota (after the quotas changed), not on capacity,
    // holds nothing back however long it waits.
    let mut p = Pool::new(Policy::Binpack, QuotaFile::default());
    p.register_node(node("a", 1, 8), &[], &[], 0);
    let a = placed(p.submit(&ask(3, Qos::Medium), 0).unwrap());
    let _b = placed(p.submit(&ask(3, Qos::Medium), 0).unwrap());
    let mut mine = ask(1, Qos::Medium);
    mine.tenant = "q".into();
    let _q0 = placed(p.submit(&mine, 0).unwrap());
    mine.vram_bytes = Some(6 * GIB);
    let (id, _) = pending(p.submit(&mine, 0).unwrap());
    p.set_quotas(QuotaFile::parse("[tenants.q]\nsessions = 1\n").unwrap());
    assert!(p.retry_pending(AGING_MS).is_empty());
    let reason = &p.pending().iter().find(|x| x.id == id).unwrap().reason;
    assert!(reason.contains("sessions = 1"), "{reason}");
    p.end_session(a);
    assert!(matches!(
        p.submit(&ask(3, Qos::Medium), AGING_MS).unwrap(),
        Decision::Placed(_)
    ));
    p.check_invariants().unwrap();
}

#[test]
fn new_quotas_reshape_the_queue() {
    // A per-session maximum that a waiting request now exceeds: it waits with that reason,
    // and runs once the maximum is raised again.
    let mut p = Pool::new(Policy::Binpack, QuotaFile::default());
    p.register_node(node("a", 1, 8), &[], &[], 0);
    let a = placed(p.submit(&ask(6, Qos::Medium), 0).unwrap());
    let (id, _) = pending(p.submit(&ask(4, Qos::Medium), 0).unwrap());
    p.set_quotas(QuotaFile::parse("[default]\nmax_session_vram = \"2GiB\"\n").unwrap());
    p.end_session(a);
    assert!(p.retry_pending(1).is_empty());
    let reason = &p.pending().iter().find(|x| x.id == id).unwrap().reason;
    assert!(reason.contains("max_session_vram"), "{reason}");
    p.set_quotas(QuotaFile::default());
    let placed_now = p.retry_pending(2);
    assert_eq!(placed_now.len(), 1);
    assert_eq!(placed_now[0].vram_bytes, Some(4 * GIB));
    p.check_invariants().unwrap();
}
