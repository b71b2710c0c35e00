//! Draining a node and defragmenting a pool, as processes: a controller and `gpufuse node`s
//! on unix sockets, clients (the client core, in this process) that keep launching kernels
//! while the controller moves their sessions, every byte checked after.

mod moving;

use std::time::Duration;

use gpufuse_client::Connection;
use gpufuse_proto::{ResourceRequest, SessionKind};

use moving::*;

fn slice(mib: u64) -> ResourceRequest {
    ResourceRequest {
        vram_bytes: Some(mib << 20),
        ..Default::default()
    }
}

/// `gpufuse node drain NODE` cordons the node and moves its three sessions to the other
/// node, two while their kernels run and one idle (its client makes no call meanwhile): no
/// update is lost, every byte is intact, the drained node holds nothing, a new session goes
/// elsewhere; `uncordon` lets sessions land there again.
#[test]
fn draining_a_node_moves_its_sessions_away_while_they_run() {
    // Binpack and na first: both sessions land on na.
    let mut pool = Pool::start("drain", &["--policy", "binpack"]);
    pool.add_node("na", "emu:1:1GiB");
    let (c1, _, big1, counter1) = session_at(&pool.addr(), slice(256));
    let (c2, _, big2, counter2) = session_at(&pool.addr(), slice(256));
    let (mut idle, _, big3, counter3) = session_at(&pool.addr(), slice(128));
    assert_eq!(bump(&mut idle, counter3), 1);
    pool.add_node("nb", "emu:1:1GiB");
    wait_until("the sessions run on na", || {
        let r = pool.running();
        r.len() == 3 && r.iter().all(|(_, n, _)| n == "na")
    });
    let (done1, load1) = keep_bumping(c1, counter1);
    let (done2, load2) = keep_bumping(c2, counter2);
    std::thread::sleep(Duration::from_millis(200));
    let out = pool.gpufuse(&["node", "drain", "na"]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.matches("moved to node nb device 0").count(),
        3,
        "{stdout}"
    );
    assert!(
        stdout.contains("3 session(s) moved off it, 0 stay"),
        "{stdout}"
    );
    std::thread::sleep(Duration::from_millis(200));
    let _c1 = stop_and_check(done1, load1, big1, counter1);
    let _c2 = stop_and_check(done2, load2, big2, counter2);
    // The idle one follows at its next call.
    check_big(&mut idle, big3);
    assert_eq!(bump(&mut idle, counter3), 2);
    let st = pool.status();
    let na = st["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "na")
        .unwrap()
        .clone();
    assert_eq!(na["cordoned"], true, "{na}");
    assert_eq!(na["devices"][0]["memory_promised_bytes"], 0, "{na}");
    wait_until("na reports nothing used", || {
        pool.status()["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["name"] == "na" && n["devices"][0]["memory_used_bytes"] == 0)
    });
    assert!(pool.running().iter().all(|(_, n, _)| n == "nb"));
    // Cordoned: a new session goes to nb although binpack would not prefer na otherwise.
    let (c3, ..) = session_at(&pool.addr(), slice(128));
    wait_until("the fourth session runs", || pool.running().len() == 4);
    assert!(pool.running().iter().all(|(_, n, _)| n == "nb"));
    drop(c3);
    // Uncordoned: na takes sessions again (binpack prefers the fuller nb while it has room,
    // so ask for more than nb has left).
    let out = pool.gpufuse(&["node", "uncordon", "na"]);
    assert!(out.status.success());
    let (_c4, ..) = session_at(&pool.addr(), slice(500));
    wait_until("the big session runs on na", || {
        pool.running().iter().any(|(_, n, _)| n == "na")
    });
    // Draining a node that does not exist is refused by name.
    let out = pool.gpufuse(&["node", "drain", "nowhere"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nowhere"));
}

/// A fragmented pool: spread put one 256 MiB session on each node's 1 GiB device, and a
/// session asking for 800 MiB fits on neither. The controller's defragmenter (`--defrag 60`)
/// moves one session next to the other while its kernels run, which frees a whole device:
/// the waiting session is placed there, and every byte of the moved one is intact.
#[test]
fn defragmentation_frees_a_device_for_a_session_that_waits() {
    let mut pool = Pool::start(
        "defrag",
        &[
            "--policy",
            "spread",
            "--defrag",
            "60",
            "--defrag-interval",
            "3600",
        ],
    );
    pool.add_node("na", "emu:1:1GiB");
    pool.add_node("nb", "emu:1:1GiB");
    let (c1, _, big1, counter1) = session_at(&pool.addr(), slice(256));
    let (c2, _, big2, counter2) = session_at(&pool.addr(), slice(256));
    wait_until("one session on each node", || {
        let r = pool.running();
        r.len() == 2 && r[0].1 != r[1].1
    });
    let (done1, load1) = keep_bumping(c1, counter1);
    let (done2, load2) = keep_bumping(c2, counter2);
    // The large session waits (up to a minute) for a device with 800 MiB unpromised.
    let addr = pool.addr();
    let waiter = std::thread::spawn(move || {
        let hello = Connection::hello(SessionKind::Cuda, "gfp1;wait=60;token=".into(), slice(800));
        std::env::set_var("GPUFUSE_HELLO_TIMEOUT", "90");
        Connection::open(&addr, &hello).map(|(c, a)| (c, a.session_id))
    });
    let (big_conn, _) = waiter.join().unwrap().expect("the large session is placed");
    let _c1 = stop_and_check(done1, load1, big1, counter1);
    let _c2 = stop_and_check(done2, load2, big2, counter2);
    // Both small sessions share one device now; the large one has the other.
    wait_until("three sessions run", || pool.running().len() == 3);
    let r = pool.running();
    let big_node = &r.iter().max_by_key(|(id, ..)| *id).unwrap().1;
    assert_eq!(
        r.iter().filter(|(_, n, _)| n == big_node).count(),
        1,
        "{r:?}"
    );
    drop(big_conn);
}
