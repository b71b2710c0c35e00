//! A launch stops when its cancel flag is set (`DeviceMemory::cancel`): a kernel that would
//! loop for ever, on one host thread, on several, and in a cooperative grid, fails with
//! `ExecError::Cancelled` soon after the flag is set, and leaves its memory readable. Before
//! the flag existed, a worker whose client was killed ran such a kernel to its end.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpufuse_ptx::{ExecError, LaunchConfig, Module, VecMemory};

const BASE: u64 = 0x2000_0000_0000;

/// Each thread first adds 1 to the word at `p` (how many threads started), then counts to
/// `limit` storing its count at `p + 8`: for ever, for `limit` = `u64::MAX`.
const SPIN: &str = ".version 8.0\n.target sm_80\n.address_size 64\n\
.visible .entry spin(.param .u64 p, .param .u64 limit)\n{\n\
.reg .pred %p<2>;\n.reg .b64 %rd<6>;\n.reg .b32 %r<4>;\n\
ld.param.u64 %rd1, [p];\nld.param.u64 %rd2, [limit];\n\
atom.global.add.u64 %rd3, [%rd1], 1;\nmov.u64 %rd4, 0;\n\
$L_loop:\nadd.u64 %rd4, %rd4, 1;\nst.global.u64 [%rd1+8], %rd4;\n\
setp.lt.u64 %p1, %rd4, %rd2;\n@%p1 bra $L_loop;\nret;\n}\n";

fn params(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Launches `spin` for ever on `threads` host threads, sets the flag once the kernel runs,
/// and returns what the launch returned and how long it took to stop. A launch that does not
/// stop fails the test (its thread is left to the end of the test process) instead of hanging it.
fn stopped(threads: usize, grid: u32, block: u32, cooperative: bool) -> (ExecError, Duration) {
    let m = Arc::new(Module::parse(SPIN).unwrap());
    let flag = Arc::new(AtomicBool::new(false));
    let mem = Arc::new(VecMemory::new(BASE, 1 << 20).with_cancel(flag.clone()));
    let cfg = LaunchConfig {
        grid: [grid, 1, 1],
        block: [block, 1, 1],
        dynamic_shared_bytes: 0,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let (m, mem) = (m.clone(), mem.clone());
        std::thread::spawn(move || {
            let p = params(&[BASE, u64::MAX]);
            let r = m.launch_with(
                "spin",
                &cfg,
                &p,
                &*mem,
                &|_| None,
                threads,
                cooperative.then_some(BASE + 4096),
            );
            let _ = tx.send(r);
        });
    }
    let started = || u64::from_le_bytes(mem.read(0, 8).try_into().unwrap());
    let deadline = Instant::now() + Duration::from_secs(30);
    while started() == 0 {
        assert!(Instant::now() < deadline, "the kernel never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Let it run a while: a cancel is not a launch that never began.
    std::thread::sleep(Duration::from_millis(50));
    let set = Instant::now();
    flag.store(true, Ordering::Relaxed);
    let r = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the launch did not stop within 30 s of its cancel flag");
    (
        r.expect_err("a kernel that loops for ever finished"),
        set.elapsed(),
    )
}

#[test]
fn a_cancelled_launch_stops_on_one_host_thread() {
    let (e, took) = stopped(1, 4, 64, false);
    assert_eq!(e, ExecError::Cancelled);
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn a_cancelled_launch_stops_on_several_host_threads() {
    let (e, took) = stopped(4, 64, 256, false);
    assert_eq!(e, ExecError::Cancelled);
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn a_cancelled_cooperative_launch_stops() {
    let (e, took) = stopped(2, 8, 128, true);
    assert_eq!(e, ExecError::Cancelled);
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn a_launch_whose_flag_is_never_set_runs_to_its_end() {
    let m = Module::parse(SPIN).unwrap();
    let flag = Arc::new(AtomicBool::new(false));
    let mem = VecMemory::new(BASE, 1 << 20).with_cancel(flag);
    let cfg = LaunchConfig {
        grid: [2, 1, 1],
        block: [32, 1, 1],
        dynamic_shared_bytes: 0,
    };
    m.launch_on("spin", &cfg, &params(&[BASE, 10_000]), &mem, &|_| None, 2)
        .unwrap();
    let count = u64::from_le_bytes(mem.read(0, 8).try_into().unwrap());
    assert_eq!(count, 64);
    let last = u64::from_le_bytes(mem.read(8, 8).try_into().unwrap());
    assert_eq!(last, 10_000);
}
