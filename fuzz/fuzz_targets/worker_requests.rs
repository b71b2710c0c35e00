//! The worker's request handling on the emulated GPU: a session fed arbitrary requests (each a
//! 2-byte length and a body, as decoded from frames) never panics, never charges more than its
//! slice, and gives back every byte it held when it ends.
//!
//! Fuzzed module images never load (the worker checks each image against its SHA-256), so
//! every session starts with one fixed module loaded (`module` 1) and its kernels bound to
//! function handles 1..=4 ([`KERNELS`]): fuzzed launches run real kernels with fuzzed grids,
//! blocks, shared memory, parameters and attributes. A launch that runs longer than
//! [`LAUNCH_BUDGET`] is cancelled through the session's cancel flag (as when a client goes
//! away) by one watchdog thread, and at most [`MAX_LAUNCHES`] launches of one input run.
#![no_main]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use gpufuse_device::emu::EmuDevice;
use gpufuse_proto::Request;
use gpufuse_worker::{LocalLedger, Session};
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};

const LIMIT: u64 = 64 << 20;
const LAUNCH_BUDGET: Duration = Duration::from_millis(2);
const MAX_LAUNCHES: usize = 4;

/// The kernels of [`MODULE`], bound to function handles 1, 2, ... in this order.
const KERNELS: [&str; 4] = ["store", "spin", "reverse", "maybe_trap"];

/// Global stores at fuzzed addresses (in the session's memory, outside it, misaligned), a loop
/// as long as a parameter says (up to 64 turns) and an atomic, shared memory with a barrier,
/// and a trap.
const MODULE: &str = r#".version 8.0
.target sm_80
.address_size 64

.visible .entry store(.param .u64 p, .param .u32 n, .param .u32 v)
{
  .reg .pred %p<2>;
  .reg .b32 %r<8>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [p];
  ld.param.u32 %r1, [n];
  ld.param.u32 %r2, [v];
  mov.u32 %r3, %ctaid.x;
  mov.u32 %r4, %ntid.x;
  mov.u32 %r5, %tid.x;
  mad.lo.s32 %r6, %r3, %r4, %r5;
  setp.ge.u32 %p1, %r6, %r1;
  @%p1 bra DONE;
  cvta.to.global.u64 %rd2, %rd1;
  mul.wide.u32 %rd3, %r6, 4;
  add.s64 %rd2, %rd2, %rd3;
  st.global.u32 [%rd2], %r2;
DONE:
  ret;
}

.visible .entry spin(.param .u64 p, .param .u32 iters)
{
  .reg .pred %p<2>;
  .reg .b32 %r<4>;
  .reg .b64 %rd<2>;
  ld.param.u64 %rd1, [p];
  ld.param.u32 %r1, [iters];
  min.u32 %r1, %r1, 64;
  mov.u32 %r2, 0;
LOOP:
  setp.ge.u32 %p1, %r2, %r1;
  @%p1 bra END;
  add.u32 %r2, %r2, 1;
  bra.uni LOOP;
END:
  atom.global.add.u32 %r3, [%rd1], 1;
  ret;
}

.visible .entry reverse(.param .u64 p)
{
  .reg .b32 %r<8>;
  .reg .b64 %rd<8>;
  .shared .align 4 .b32 buf[1024];
  ld.param.u64 %rd1, [p];
  cvta.to.global.u64 %rd1, %rd1;
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, %ctaid.x;
  mad.lo.s32 %r4, %r3, %r2, %r1;
  mul.wide.u32 %rd2, %r4, 4;
  add.s64 %rd3, %rd1, %rd2;
  ld.global.u32 %r5, [%rd3];
  mov.u64 %rd4, buf;
  mul.wide.u32 %rd5, %r1, 4;
  add.s64 %rd6, %rd4, %rd5;
  st.shared.u32 [%rd6], %r5;
  bar.sync 0;
  sub.u32 %r6, %r2, %r1;
  sub.u32 %r6, %r6, 1;
  mul.wide.u32 %rd5, %r6, 4;
  add.s64 %rd6, %rd4, %rd5;
  ld.shared.u32 %r7, [%rd6];
  st.global.u32 [%rd3], %r7;
  ret;
}

.visible .entry maybe_trap(.param .u32 when)
{
  .reg .pred %p<2>;
  .reg .b32 %r<3>;
  ld.param.u32 %r1, [when];
  mov.u32 %r2, %tid.x;
  setp.eq.u32 %p1, %r1, %r2;
  @%p1 trap;
  ret;
}
"#;

/// Loads [`MODULE`] as module 1 and binds [`KERNELS`] to function handles 1, 2, ...
fn preload(session: &mut Session) {
    static IMAGE: OnceLock<(String, [u8; 32])> = OnceLock::new();
    let (image, hash) = IMAGE.get_or_init(|| {
        let image = format!("{MODULE}\0");
        let hash = Sha256::digest(image.as_bytes()).into();
        (image, hash)
    });
    let loaded = session.handle(Request::ModuleLoad {
        module: gpufuse_proto::ModuleHandle(1),
        device: 0,
        hash: *hash,
        image: Some(image.as_bytes()),
    });
    assert!(loaded.is_ok(), "the fixed module loads: {loaded:?}");
    for (i, name) in KERNELS.iter().enumerate() {
        let got = session.handle(Request::ModuleGetFunction {
            module: gpufuse_proto::ModuleHandle(1),
            name,
            function: gpufuse_proto::FunctionHandle(i as u64 + 1),
        });
        assert!(got.is_ok(), "{name}: {got:?}");
    }
}

/// One thread for the whole run: it sets the cancel flag of a launch still running at its
/// deadline.
struct Watchdog {
    deadline: Mutex<Option<Instant>>,
    wake: Condvar,
    cancel: Arc<AtomicBool>,
}

fn watchdog() -> &'static Watchdog {
    static W: OnceLock<&'static Watchdog> = OnceLock::new();
    W.get_or_init(|| {
        let w: &'static Watchdog = Box::leak(Box::new(Watchdog {
            deadline: Mutex::new(None),
            wake: Condvar::new(),
            cancel: Arc::new(AtomicBool::new(false)),
        }));
        std::thread::spawn(move || {
            let mut deadline = w.deadline.lock().unwrap();
            loop {
                deadline = match *deadline {
                    None => w.wake.wait(deadline).unwrap(),
                    Some(at) => match at.checked_duration_since(Instant::now()) {
                        Some(left) if !left.is_zero() => {
                            w.wake.wait_timeout(deadline, left).unwrap().0
                        }
                        _ => {
                            w.cancel.store(true, Ordering::Relaxed);
                            *deadline = None;
                            deadline
                        }
                    },
                };
            }
        });
        w
    })
}

/// Runs one launch, cancelled if it runs longer than [`LAUNCH_BUDGET`].
fn launch(session: &mut Session, req: Request, quiet: bool) {
    let w = watchdog();
    w.cancel.store(false, Ordering::Relaxed);
    *w.deadline.lock().unwrap() = Some(Instant::now() + LAUNCH_BUDGET);
    w.wake.notify_one();
    let _ = session.dispatch(req, quiet);
    *w.deadline.lock().unwrap() = None;
}

fuzz_target!(|data: &[u8]| {
    let mut device = EmuDevice::new(0, 256 << 20, 0x2000_0000_0000, 1 << 40);
    let mut ledger = LocalLedger {
        total: 256 << 20,
        used: 0,
    };
    {
        let mut session = Session::new(&mut device, &mut ledger, Some(LIMIT));
        session.set_cancel(watchdog().cancel.clone());
        preload(&mut session);
        let mut launches = 0;
        let mut rest = data;
        while let Some((len, tail)) = rest.split_first_chunk::<2>() {
            let len = usize::from(u16::from_le_bytes(*len)).min(tail.len());
            let (body, next) = tail.split_at(len);
            rest = next;
            let Ok(req) = gpufuse_proto::decode_borrowed::<Request>(body) else {
                continue;
            };
            let quiet = req.is_quiet();
            if matches!(req, Request::LaunchKernel(_)) {
                if launches == MAX_LAUNCHES {
                    continue;
                }
                launches += 1;
                launch(&mut session, req, quiet);
            } else {
                let _ = session.dispatch(req, quiet);
            }
            assert!(
                session.used() <= LIMIT,
                "charged {} over {LIMIT}",
                session.used()
            );
        }
        session.release_all();
    }
    assert_eq!(ledger.used, 0, "every byte given back");
});
