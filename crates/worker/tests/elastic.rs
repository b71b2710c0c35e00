//! Elastic sessions through the worker, client core and worker in one process: memory evicted
//! (by the node's command, or by itself when idle) to host memory and disk and brought back at
//! the same addresses; a session moved to another device; a move that cannot happen refused
//! with the session untouched.

use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpufuse_client::{ClientError, Connection};
use gpufuse_device::emu::EmuDevice;
use gpufuse_device::Device;
use gpufuse_proto::{
    encode_frame, ControlAnswer, FrameKind, Launch, NodeCommand, ReplyBody, Request,
};
use gpufuse_proto::{
    ContextHandle, DevicePtr, EventHandle, FunctionHandle, ModuleHandle, PhysicalHandle,
    StreamHandle,
};
use gpufuse_transport::{Conn, Stream};
use gpufuse_worker::{Elastic, ElasticConfig, Ledger, LocalLedger};
use sha2::{Digest, Sha256};

const BASE: u64 = 0x2000_0000_0000;
const WINDOW: u64 = 1 << 40;
const DEVICE: u64 = 1 << 30;

/// A module variable and a kernel that adds one to it and stores it through a pointer.
const PTX: &str = ".version 8.0\n.target sm_80\n.address_size 64\n\
    .global .align 4 .u32 counter = 7;\n\
    .visible .entry bump(.param .u64 p)\n{\n.reg .b32 %r<3>;\n.reg .b64 %rd<3>;\n\
    mov.u64 %rd1, counter;\nld.global.u32 %r1, [%rd1];\nadd.u32 %r1, %r1, 1;\n\
    st.global.u32 [%rd1], %r1;\nld.param.u64 %rd2, [p];\nst.global.u32 [%rd2], %r1;\nret;\n}\n\0";

/// A kernel that calls device-side malloc (its first launch makes the session's device heap).
const HEAP_PTX: &str = ".version 8.0\n.target sm_80\n.address_size 64\n\
    .extern .func (.param .b64 func_retval0) malloc(.param .b64 malloc_param_0);\n\
    .visible .entry grab()\n{\n.reg .b64 %rd<3>;\nmov.u64 %rd1, 64;\n{\n\
    .param .b64 param0;\nst.param.b64 [param0], %rd1;\n.param .b64 retval0;\n\
    call.uni (retval0), malloc, (param0);\nld.param.b64 %rd2, [retval0];\n}\nret;\n}\n\0";

/// The device ledger, shared with the test.
#[derive(Clone)]
struct SharedLedger(Arc<Mutex<(LocalLedger, (u64, u64))>>);

impl Ledger for SharedLedger {
    fn reserve(&mut self, bytes: u64) -> bool {
        self.0.lock().unwrap().0.reserve(bytes)
    }
    fn release(&mut self, bytes: u64) {
        self.0.lock().unwrap().0.release(bytes)
    }
    fn device_used(&mut self) -> u64 {
        self.0.lock().unwrap().0.used
    }
    fn swapped(&mut self, host: u64, disk: u64) {
        self.0.lock().unwrap().1 = (host, disk);
    }
}

impl SharedLedger {
    fn used(&self) -> u64 {
        self.0.lock().unwrap().0.used
    }
    fn swapped(&self) -> (u64, u64) {
        self.0.lock().unwrap().1
    }
}

struct Setup {
    client: Connection,
    node: Conn,
    ledger: SharedLedger,
    worker: std::thread::JoinHandle<()>,
    next_command: u64,
}

fn start(config: ElasticConfig, opener_fails: bool) -> Setup {
    let (a, b) = UnixStream::pair().unwrap();
    let (node, worker_commands) = UnixStream::pair().unwrap();
    let ledger = SharedLedger(Arc::new(Mutex::new((
        LocalLedger {
            total: DEVICE,
            used: 0,
        },
        (0, 0),
    ))));
    let mut worker_ledger = ledger.clone();
    let worker = std::thread::spawn(move || {
        let mut dev = EmuDevice::new(0, DEVICE, BASE, WINDOW);
        let mut conn = Conn::new(Stream::Unix(b));
        conn.recv().unwrap();
        let elastic = Elastic {
            config,
            commands: Some(worker_commands),
            open_device: Some(Box::new(move |index| {
                if opener_fails {
                    return Err("no such device".into());
                }
                Ok(Box::new(EmuDevice::new(index, DEVICE, BASE, WINDOW)) as Box<dyn Device>)
            })),
        };
        gpufuse_worker::serve_elastic(conn, 1, &mut dev, &mut worker_ledger, None, elastic)
            .unwrap();
    });
    let hello = Connection::hello(
        gpufuse_proto::SessionKind::Cuda,
        String::new(),
        Default::default(),
    );
    let client = Connection::handshake(Stream::Unix(a), &hello).unwrap().0;
    Setup {
        client,
        node: Conn::new(Stream::Unix(node)),
        ledger,
        worker,
        next_command: 1,
    }
}

impl Setup {
    fn command(&mut self, cmd: NodeCommand) -> ControlAnswer {
        let mut out = Vec::new();
        encode_frame(&mut out, FrameKind::Control, 0, self.next_command, &cmd);
        self.next_command += 1;
        self.node.send(&out).unwrap();
        let (h, body) = self.node.recv().unwrap();
        assert_eq!(h.kind, FrameKind::ControlReply);
        gpufuse_proto::decode_owned(body).unwrap()
    }

    /// A request, and its reply (`None` for a quiet one: sent without waiting, as the client
    /// core sends it; an error shows at the next synchronous call).
    fn call(&mut self, req: &Request) -> ReplyBody {
        if req.is_quiet() {
            self.client.quiet(req).unwrap();
            return ReplyBody::None;
        }
        self.client.call(req).unwrap()
    }

    fn alloc(&mut self, size: u64) -> u64 {
        match self.call(&Request::MemAlloc { device: 0, size }) {
            ReplyBody::Ptr(DevicePtr(p)) => p,
            other => panic!("{other:?}"),
        }
    }

    fn write(&mut self, dst: u64, data: &[u8]) {
        self.call(&Request::MemcpyHtoD {
            dst: DevicePtr(dst),
            stream: StreamHandle(0),
            data,
        });
    }

    fn read(&mut self, src: u64, size: u64) -> Vec<u8> {
        match self.call(&Request::MemcpyDtoH {
            src: DevicePtr(src),
            size,
            stream: StreamHandle(0),
        }) {
            ReplyBody::Data(d) => d,
            other => panic!("{other:?}"),
        }
    }

    /// Loads the modules and looks up `bump` (function 1) and `grab` (function 2).
    fn load(&mut self) {
        for (module, ptx, name) in [(1, PTX, "bump"), (2, HEAP_PTX, "grab")] {
            let image = ptx.as_bytes();
            let hash: [u8; 32] = Sha256::digest(image).into();
            self.call(&Request::ModuleLoad {
                module: ModuleHandle(module),
                device: 0,
                hash,
                image: Some(image),
            });
            self.call(&Request::ModuleGetFunction {
                module: ModuleHandle(module),
                name,
                function: FunctionHandle(module),
            });
        }
    }

    fn launch(&mut self, function: u64, params: &[u8]) -> Result<ReplyBody, ClientError> {
        self.client
            .quiet(&Request::LaunchKernel(Launch {
                function: FunctionHandle(function),
                grid: [1, 1, 1],
                block: [1, 1, 1],
                shared_mem: 0,
                stream: StreamHandle(0),
                params,
                attributes: vec![],
            }))
            .unwrap();
        self.client.call(&Request::CtxSynchronize {
            ctx: ContextHandle(0),
        })
    }

    fn bump(&mut self, out: u64) -> u32 {
        self.launch(1, &out.to_le_bytes()).unwrap();
        u32::from_le_bytes(self.read(out, 4).try_into().unwrap())
    }

    fn finish(self) -> SharedLedger {
        drop(self.client);
        self.worker.join().unwrap();
        self.ledger
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| ((i * 7 + i / 4096) as u8) ^ seed).collect()
}

/// The node's eviction (host, then disk) and the session's way back: same addresses, every
/// byte, the module variable's value, the ledger released and charged again.
#[test]
fn evicted_memory_comes_back_intact_at_the_same_addresses() {
    let dir = tempdir("evict");
    let mut s = start(
        ElasticConfig {
            swap_dir: Some(dir.clone()),
            ..Default::default()
        },
        false,
    );
    s.load();
    let a = s.alloc(5 << 20);
    let b = s.alloc(300_001);
    s.write(a, &pattern(5 << 20, 1));
    s.write(b, &pattern(300_001, 2));
    assert_eq!(s.bump(b), 8);
    let charged = s.ledger.used();
    assert!(charged >= (5 << 20) + 300_001);

    let answer = s.command(NodeCommand::Evict {
        bytes: 1,
        to_disk: false,
    });
    assert!(answer.ok && answer.value >= 5 << 20, "{answer:?}");
    assert_eq!(s.ledger.used(), charged - answer.value);
    assert_eq!(
        s.ledger.swapped().0,
        5 << 20,
        "the largest range went first"
    );
    let answer = s.command(NodeCommand::Evict {
        bytes: u64::MAX,
        to_disk: true,
    });
    assert!(answer.ok);
    assert_eq!(s.ledger.used(), 0);
    let (host, disk) = s.ledger.swapped();
    assert_eq!(host, 0);
    assert!(disk >= (5 << 20) + 300_001);
    assert!(std::fs::read_dir(&dir).unwrap().count() >= 2, "swap files");

    // The next device work brings everything back.
    assert_eq!(s.read(a, 5 << 20), pattern(5 << 20, 1));
    assert_eq!(s.ledger.used(), charged);
    assert_eq!(s.ledger.swapped(), (0, 0));
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "swap files removed"
    );
    let mut head = pattern(300_001, 2);
    head[..4].copy_from_slice(&8u32.to_le_bytes());
    assert_eq!(s.read(b, 300_001), head);
    assert_eq!(s.bump(b), 9, "the module variable kept its value");

    // Evicted at the end: the session's end releases it all and removes its swap files.
    s.command(NodeCommand::Evict {
        bytes: u64::MAX,
        to_disk: true,
    });
    let ledger = s.finish();
    assert_eq!(ledger.used(), 0);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

/// Scale to zero: idle for the TTL, the session's memory leaves the device (host, then disk)
/// by itself; the next call finds everything where it was.
#[test]
fn an_idle_session_scales_to_zero_and_warms_up_on_its_next_call() {
    let dir = tempdir("idle");
    let mut s = start(
        ElasticConfig {
            idle_ttl: Some(Duration::from_millis(100)),
            idle_disk_ttl: Some(Duration::from_millis(400)),
            swap_dir: Some(dir.clone()),
            oversubscribed: false,
        },
        false,
    );
    s.load();
    let a = s.alloc(3 << 20);
    s.write(a, &pattern(3 << 20, 3));
    let charged = s.ledger.used();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(s.ledger.used(), 0, "idle: device memory given back");
    assert!(s.ledger.swapped().0 >= 3 << 20, "in host memory");
    std::thread::sleep(Duration::from_millis(400));
    assert!(s.ledger.swapped().1 >= 3 << 20, "then on disk");
    assert_eq!(s.read(a, 3 << 20), pattern(3 << 20, 3));
    assert_eq!(s.ledger.used(), charged);
    assert_eq!(s.bump(a), 8);
    s.finish();
}

/// VMM physical memory the session unmapped (its contents live on without an address) leaves
/// the device with the rest when the session scales to zero, and maps again with every byte.
#[test]
fn unmapped_vmm_memory_scales_to_zero_too() {
    let dir = tempdir("vmm");
    let mut s = start(
        ElasticConfig {
            idle_ttl: Some(Duration::from_millis(100)),
            idle_disk_ttl: Some(Duration::from_millis(400)),
            swap_dir: Some(dir.clone()),
            oversubscribed: false,
        },
        false,
    );
    const G: u64 = 2 << 20;
    for handle in [11, 12] {
        s.call(&Request::MemCreate {
            handle: PhysicalHandle(handle),
            device: 0,
            size: G,
        });
    }
    let va = match s.call(&Request::MemAddressReserve {
        size: 2 * G,
        align: 0,
    }) {
        ReplyBody::Ptr(DevicePtr(p)) => p,
        other => panic!("{other:?}"),
    };
    for (k, handle) in [(0, 11), (1, 12)] {
        s.call(&Request::MemMap {
            ptr: DevicePtr(va + k * G),
            size: G,
            handle: PhysicalHandle(handle),
        });
        s.write(va + k * G, &pattern(G as usize, 5 + k as u8));
    }
    // 12 unmapped: its bytes live on without an address.
    s.client
        .quiet(&Request::MemUnmap {
            ptr: DevicePtr(va + G),
            size: G,
        })
        .unwrap();
    assert_eq!(s.read(va, G), pattern(G as usize, 5));
    let charged = s.ledger.used();
    assert!(charged >= 2 * G, "{charged}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(s.ledger.used(), 0, "idle: all device memory given back");
    assert_eq!(
        s.ledger.swapped().0,
        2 * G,
        "mapped and unmapped in host memory"
    );
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(s.ledger.swapped(), (0, 2 * G), "then on disk");
    // The two swap places: every byte of each.
    s.client
        .quiet(&Request::MemUnmap {
            ptr: DevicePtr(va),
            size: G,
        })
        .unwrap();
    for (k, handle) in [(0, 12), (1, 11)] {
        s.call(&Request::MemMap {
            ptr: DevicePtr(va + k * G),
            size: G,
            handle: PhysicalHandle(handle),
        });
    }
    assert_eq!(s.ledger.used(), charged);
    assert_eq!(s.read(va, G), pattern(G as usize, 6));
    assert_eq!(s.read(va + G, G), pattern(G as usize, 5));
    s.finish();
}

/// A session moves to another device in the middle of its work: the same addresses, data,
/// module variable, events and streams; a move that cannot happen changes nothing.
#[test]
fn a_session_moves_to_another_device_and_goes_on() {
    let mut s = start(ElasticConfig::default(), false);
    s.load();
    let a = s.alloc(4 << 20);
    s.write(a, &pattern(4 << 20, 4));
    s.call(&Request::StreamCreate {
        stream: StreamHandle(9),
        flags: 0,
        priority: 0,
    });
    s.call(&Request::EventCreate {
        event: EventHandle(5),
        flags: 0,
    });
    s.call(&Request::EventRecord {
        event: EventHandle(5),
        stream: StreamHandle(9),
    });
    assert_eq!(s.bump(a), 8);
    // Work in flight: a launch queued (quiet) just before the move.
    s.client
        .quiet(&Request::LaunchKernel(Launch {
            function: FunctionHandle(1),
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_mem: 0,
            stream: StreamHandle(9),
            params: &a.to_le_bytes(),
            attributes: vec![],
        }))
        .unwrap();
    s.client.flush().unwrap();
    let answer = s.command(NodeCommand::Migrate { device: 1 });
    assert!(answer.ok, "{answer:?}");
    // Events recorded before the move still time against ones after it.
    s.call(&Request::EventCreate {
        event: EventHandle(6),
        flags: 0,
    });
    s.call(&Request::EventRecord {
        event: EventHandle(6),
        stream: StreamHandle(9),
    });
    match s.call(&Request::EventElapsedTime {
        start: EventHandle(5),
        end: EventHandle(6),
    }) {
        ReplyBody::Elapsed(ms) => assert!(ms >= 0.0),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.bump(a), 10, "the queued launch ran, then this one");
    let mut want = pattern(4 << 20, 4);
    want[..4].copy_from_slice(&10u32.to_le_bytes());
    assert_eq!(s.read(a, 4 << 20), want);
    s.finish();
}

#[test]
fn a_move_that_cannot_happen_leaves_the_session_untouched() {
    // The target cannot be opened.
    let mut s = start(ElasticConfig::default(), true);
    s.load();
    let a = s.alloc(1 << 20);
    s.write(a, &pattern(1 << 20, 5));
    let answer = s.command(NodeCommand::Migrate { device: 1 });
    assert!(!answer.ok);
    assert_eq!(s.read(a, 1 << 20), pattern(1 << 20, 5));
    s.finish();

    // The session used device-side malloc, whose heap cannot be captured yet.
    let mut s = start(ElasticConfig::default(), false);
    s.load();
    let a = s.alloc(1 << 20);
    s.write(a, &pattern(1 << 20, 6));
    s.launch(2, &[]).unwrap();
    let answer = s.command(NodeCommand::Migrate { device: 1 });
    assert!(!answer.ok);
    assert_eq!(s.read(a, 1 << 20), pattern(1 << 20, 6));
    assert_eq!(s.bump(a), 8);
    s.finish();
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gpufuse-elastic-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A move with pre-copy under a steady kernel load: the session keeps launching while its
/// memory is copied; the stop copies only what kernels wrote since (the module variable and
/// the small buffer the kernel stores to, not the large untouched one); every byte is intact
/// and no kernel's update is lost.
#[test]
fn a_move_with_precopy_copies_only_what_was_dirty_in_the_stop() {
    use gpufuse_proto::MoveOutcome;
    const BIG: u64 = 64 << 20;
    let mut s = start(ElasticConfig::default(), false);
    s.load();
    let big = s.alloc(BIG);
    let want = pattern(BIG as usize, 6);
    for (i, part) in want.chunks(8 << 20).enumerate() {
        s.write(big + (i as u64) * (8 << 20), part);
    }
    let small = s.alloc(64 << 10);
    let mut count = s.bump(small);
    assert_eq!(count, 8);
    let mut out = Vec::new();
    encode_frame(
        &mut out,
        FrameKind::Control,
        0,
        77,
        &NodeCommand::MigrateWithFigures { device: 1 },
    );
    s.node.send(&out).unwrap();
    let mut late = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let figures = loop {
        assert!(std::time::Instant::now() < deadline, "the move never ended");
        // The steady load: a launch, a synchronize and a read, again and again.
        let next = s.bump(small);
        assert_eq!(
            next,
            count + 1,
            "a kernel's update was lost across the move"
        );
        count = next;
        if let Some(f) = late {
            // A few launches after the answer: the session runs on the target.
            if count >= f + 3 {
                break late_figures(&mut s);
            }
            continue;
        }
        if s.node.poll_frame() {
            late = Some(count);
        }
    };
    fn late_figures(s: &mut Setup) -> gpufuse_proto::MoveFigures {
        let (h, body) = s.node.recv().unwrap();
        assert_eq!((h.kind, h.request_id), (FrameKind::ControlReply, 77));
        match gpufuse_proto::decode_owned::<MoveOutcome>(body).unwrap() {
            MoveOutcome::Moved(f) => f,
            other => panic!("{other:?}"),
        }
    }
    assert!(figures.rounds >= 1, "{figures:?}");
    assert!(figures.bytes > BIG, "{figures:?}");
    assert!(figures.precopied_bytes >= BIG, "{figures:?}");
    assert!(
        figures.stop_bytes <= (64 << 10) + 64,
        "the stop copied more than what kernels wrote: {figures:?}"
    );
    let got = s.read(big, BIG);
    assert!(got == want, "the untouched buffer changed across the move");
    // A move while the session has changed its layout meanwhile is still whole: a second
    // move back, with an allocation made during its pre-copy.
    out.clear();
    encode_frame(
        &mut out,
        FrameKind::Control,
        0,
        78,
        &NodeCommand::MigrateWithFigures { device: 0 },
    );
    s.node.send(&out).unwrap();
    let extra = s.alloc(3 << 20);
    s.write(extra, &pattern(3 << 20, 9));
    let (h, body) = s.node.recv().unwrap();
    assert_eq!(h.request_id, 78);
    match gpufuse_proto::decode_owned::<MoveOutcome>(body).unwrap() {
        MoveOutcome::Moved(f) => assert!(f.bytes >= BIG + (3 << 20), "{f:?}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.read(extra, 3 << 20), pattern(3 << 20, 9));
    assert!(s.read(big, BIG) == want);
    assert_eq!(s.bump(small), count + 1);
    s.finish();
}
