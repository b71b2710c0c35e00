//! Client core and worker in one process over a socketpair, on the emulated GPU.

use std::os::unix::net::UnixStream;

use gpufuse_client::{ClientError, Connection};
use gpufuse_device::emu::EmuDevice;
use gpufuse_proto::{
    ContextHandle, DevicePtr, FunctionHandle, ModuleHandle, StreamHandle, TexHandle,
};
use gpufuse_proto::{ReplyBody, Request};
use gpufuse_transport::{Conn, Stream};
use gpufuse_worker::LocalLedger;

/// Runs a worker on a thread and hands back a connected client.
fn pair() -> (Connection, std::thread::JoinHandle<u64>) {
    let (a, b) = UnixStream::pair().unwrap();
    let worker = std::thread::spawn(move || {
        let mut dev = EmuDevice::new(0, 1 << 30, 0x2000_0000_0000, 1 << 40);
        let mut ledger = LocalLedger {
            total: 1 << 30,
            used: 0,
        };
        let mut conn = Conn::new(Stream::Unix(b));
        // The node reads the hello before it hands the connection to a worker.
        conn.recv().unwrap();
        gpufuse_worker::serve(conn, 1, &mut dev, &mut ledger, None).unwrap();
        ledger.used
    });
    let hello = Connection::hello(
        gpufuse_proto::SessionKind::Cuda,
        String::new(),
        Default::default(),
    );
    let client = Connection::handshake(Stream::Unix(a), &hello).unwrap().0;
    (client, worker)
}

fn alloc(c: &mut Connection, size: u64) -> u64 {
    match c.call(&Request::MemAlloc { device: 0, size }).unwrap() {
        ReplyBody::Ptr(DevicePtr(p)) => p,
        other => panic!("{other:?}"),
    }
}

#[test]
fn quiet_failures_are_reported_by_the_next_synchronizing_call() {
    let (mut c, w) = pair();
    let p = alloc(&mut c, 64);
    // Quiet, and out of bounds: no error now...
    c.quiet(&Request::MemcpyHtoD {
        dst: DevicePtr(p + 60),
        stream: StreamHandle(0),
        data: &[1; 8],
    })
    .unwrap();
    c.quiet(&Request::MemFree {
        ptr: DevicePtr(0xdead_beef),
    })
    .unwrap();
    // ...the first one comes back with the next reply.
    c.call(&Request::CtxSynchronize {
        ctx: ContextHandle(0),
    })
    .unwrap();
    assert_eq!(c.take_async_error(), Some(1));
    assert_eq!(c.take_async_error(), None);
    drop(c);
    assert_eq!(w.join().unwrap(), 0, "everything freed at disconnect");
}

#[test]
fn async_device_to_host_data_arrives_by_the_next_synchronization() {
    let (mut c, w) = pair();
    let p = alloc(&mut c, 1 << 20);
    let data: Vec<u8> = (0..1 << 20).map(|i| (i % 253) as u8).collect();
    c.quiet_with_tail(
        &Request::MemcpyHtoD {
            dst: DevicePtr(p),
            stream: StreamHandle(0),
            data: &[],
        },
        &data,
    )
    .unwrap();
    let mut back = vec![0u8; 1 << 20];
    // SAFETY: `back` outlives the synchronization below.
    let tag = unsafe { c.register_copy(back.as_mut_ptr(), back.len()) };
    c.quiet(&Request::MemcpyDtoHAsync {
        src: DevicePtr(p),
        size: 1 << 20,
        stream: StreamHandle(0),
        tag,
    })
    .unwrap();
    c.call(&Request::StreamSynchronize {
        stream: StreamHandle(0),
    })
    .unwrap();
    assert_eq!(back, data);
    drop(c);
    w.join().unwrap();
}

#[test]
fn sessions_cannot_name_memory_or_handles_they_do_not_own() {
    let (mut c, w) = pair();
    let p = alloc(&mut c, 4096);
    let err = |r: Result<ReplyBody, ClientError>| match r {
        Err(ClientError::Cuda(s)) => s,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        err(c.call(&Request::MemcpyDtoH {
            src: DevicePtr(p + 4096),
            size: 1,
            stream: StreamHandle(0)
        })),
        1
    );
    assert_eq!(
        err(c.call(&Request::MemcpyDtoH {
            src: DevicePtr(0x1000),
            size: 8,
            stream: StreamHandle(0)
        })),
        1
    );
    assert_eq!(
        err(c.call(&Request::StreamSynchronize {
            stream: StreamHandle(12345)
        })),
        400
    );
    assert_eq!(
        err(c.call(&Request::ModuleGetFunction {
            module: ModuleHandle(77),
            name: "k",
            function: FunctionHandle(1)
        })),
        400
    );
    assert_eq!(
        err(c.call(&Request::MemAlloc {
            device: 0,
            size: 2 << 30
        })),
        2
    );
    // Unknown image hash: the worker asks for the image instead of guessing.
    assert_eq!(
        c.call(&Request::ModuleLoad {
            module: ModuleHandle(1),
            device: 0,
            hash: [1; 32],
            image: None
        })
        .unwrap(),
        ReplyBody::NeedImage
    );
    drop(c);
    w.join().unwrap();
}

/// Found by the `worker_requests` fuzz target: a 2-D copy with zero-width rows panicked the
/// worker (`chunks(0)`), and `width * height` from the wire was unchecked.
#[test]
fn zero_width_and_overflowing_2d_copies_are_answered_not_panics() {
    let (mut c, w) = pair();
    let p = alloc(&mut c, 4096);
    let rect = gpufuse_proto::Rect {
        ptr: DevicePtr(p),
        pitch: 64,
    };
    let got = c
        .call(&Request::Memcpy2DDtoH {
            src: rect,
            width: 0,
            height: 3,
            stream: StreamHandle(0),
        })
        .unwrap();
    assert_eq!(got, ReplyBody::Data(vec![]));
    c.quiet(&Request::Memcpy2DHtoD {
        dst: rect,
        width: 0,
        height: 3,
        stream: StreamHandle(0),
        data: &[],
    })
    .unwrap();
    c.quiet(&Request::Memset2D {
        dst: rect,
        value: 0,
        elem_size: 4,
        width: u64::MAX / 2,
        height: 1,
        stream: StreamHandle(0),
    })
    .unwrap();
    c.call(&Request::CtxSynchronize {
        ctx: ContextHandle(0),
    })
    .unwrap();
    assert_eq!(
        c.take_async_error(),
        Some(1),
        "the overflowing memset is refused"
    );
    assert!(matches!(
        c.call(&Request::Memcpy2DDtoH {
            src: gpufuse_proto::Rect {
                ptr: DevicePtr(p),
                pitch: 1 << 62
            },
            width: 1 << 62,
            height: 1 << 3,
            stream: StreamHandle(0),
        }),
        Err(ClientError::Cuda(1))
    ));
    drop(c);
    assert_eq!(w.join().unwrap(), 0);
}

/// `MemAllocPitch` rounds the width up to a 512-byte pitch; a width within 511 of `u64::MAX`
/// panicked the worker in a debug build (in release it wrapped to a zero pitch, refused only
/// because a zero-byte allocation is): the rounding is checked now.
#[test]
fn a_pitched_allocation_whose_pitch_overflows_is_invalid_not_a_panic() {
    let (mut c, w) = pair();
    for width in [u64::MAX, u64::MAX - 1, u64::MAX - 510] {
        assert!(
            matches!(
                c.call(&Request::MemAllocPitch {
                    device: 0,
                    width,
                    height: 1,
                    elem_size: 4,
                }),
                Err(ClientError::Cuda(1))
            ),
            "width {width:#x}"
        );
    }
    // A height that overflows `pitch * height` is out of memory, as before.
    assert!(matches!(
        c.call(&Request::MemAllocPitch {
            device: 0,
            width: 1 << 40,
            height: 1 << 40,
            elem_size: 4,
        }),
        Err(ClientError::Cuda(2))
    ));
    // The session still works, and an ordinary pitched allocation is rounded up.
    match c
        .call(&Request::MemAllocPitch {
            device: 0,
            width: 513,
            height: 3,
            elem_size: 4,
        })
        .unwrap()
    {
        ReplyBody::Pitch {
            ptr: DevicePtr(ptr),
            pitch,
        } => {
            assert_eq!(pitch, 1024);
            c.quiet(&Request::MemFree {
                ptr: DevicePtr(ptr),
            })
            .unwrap();
            assert_eq!(c.call_raw(&Request::Ping).unwrap().deferred_error, None);
        }
        other => panic!("{other:?}"),
    }
    drop(c);
    assert_eq!(w.join().unwrap(), 0);
}

#[test]
fn texture_objects_must_lie_in_an_allocation_and_exist_once() {
    use gpufuse_proto::{TexObjectDesc, TexSampler, TexShape};
    let (mut c, w) = pair();
    let p = alloc(&mut c, 4096);
    // 16 x 16 floats, rows of 64 bytes: 1024 bytes from p.
    let desc = |ptr, pitch| TexObjectDesc {
        ptr,
        format: 0x20,
        channels: 1,
        shape: TexShape::D2,
        width: 16,
        height: 16,
        depth: 1,
        pitch,
        sampler: Some(TexSampler {
            address: [1; 3],
            filter: 0,
            flags: 0,
            border: [0.0; 4],
        }),
    };
    let create = |c: &mut Connection, handle, d| match c.call(&Request::TexObjectCreate {
        handle: TexHandle(handle),
        desc: d,
    }) {
        Ok(_) => 0,
        Err(ClientError::Cuda(s)) => s,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(create(&mut c, 7, desc(DevicePtr(p), 64)), 0);
    // The same handle twice; memory past the allocation's end; rows shorter than a row.
    assert_eq!(create(&mut c, 7, desc(DevicePtr(p), 64)), 1);
    assert_eq!(create(&mut c, 8, desc(DevicePtr(p + 3500), 64)), 1);
    assert_eq!(create(&mut c, 9, desc(DevicePtr(p), 512)), 1);
    assert_eq!(create(&mut c, 10, desc(DevicePtr(p), 32)), 1);
    assert_eq!(create(&mut c, 11, desc(DevicePtr(0xdead_0000), 64)), 1);
    // An unknown format or address mode.
    let mut bad = desc(DevicePtr(p), 64);
    bad.format = 0x99;
    assert_eq!(create(&mut c, 12, bad), 1);
    let mut bad = desc(DevicePtr(p), 64);
    bad.sampler.as_mut().unwrap().address[0] = 9;
    assert_eq!(create(&mut c, 13, bad), 1);
    // Destroying is quiet: destroying twice is reported by the next call.
    c.quiet(&Request::TexObjectDestroy {
        handle: TexHandle(7),
    })
    .unwrap();
    c.call(&Request::CtxSynchronize {
        ctx: ContextHandle(0),
    })
    .unwrap();
    assert_eq!(c.take_async_error(), None);
    c.quiet(&Request::TexObjectDestroy {
        handle: TexHandle(7),
    })
    .unwrap();
    c.call(&Request::CtxSynchronize {
        ctx: ContextHandle(0),
    })
    .unwrap();
    assert_eq!(c.take_async_error(), Some(400));
    drop(c);
    assert_eq!(w.join().unwrap(), 0, "everything freed at disconnect");
}
