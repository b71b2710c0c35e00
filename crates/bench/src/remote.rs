//! The same measurements through a real gpufuse session (client core and worker, no FFI).

use std::time::Instant;

use anyhow::{bail, Context, Result};
use gpufuse_client::{Connection, Transport};
use gpufuse_proto::{ContextHandle, DevicePtr, FunctionHandle, ModuleHandle, StreamHandle};
use gpufuse_proto::{Launch, ReplyBody, Request, ResourceRequest, SessionKind};
use gpufuse_transport::Address;

/// An empty kernel: the launch path is measured, not the kernel.
pub const EMPTY_PTX: &str = ".version 7.0\n.target sm_80\n.address_size 64\n\n.visible .entry noop(\n\t.param .u64 noop_param_0,\n\t.param .u32 noop_param_1\n)\n{\n\tret;\n}\n\0";

pub struct Session {
    conn: Connection,
    /// The empty kernel's parameter bytes, once its module is loaded.
    noop_params: Option<usize>,
}

impl Session {
    /// A session at `addr` over `transport` (the shared-memory rings, or the socket only).
    pub fn open(addr: &Address, transport: Transport) -> Result<Self> {
        let hello = Connection::hello(SessionKind::Cuda, String::new(), ResourceRequest::default());
        let (mut conn, _) =
            Connection::open_with(addr, &hello, transport).context("open session")?;
        if transport == Transport::Shm && conn.transport() != "shm" {
            bail!("the session is not on the shared-memory transport");
        }
        conn.quiet(&Request::CtxCreate {
            ctx: ContextHandle(1),
            device: 0,
            flags: 0,
        })?;
        Ok(Self {
            conn,
            noop_params: None,
        })
    }

    /// The transport the session is on: `shm`, `unix`, `tcp` or `tcp+tls`.
    pub fn transport(&self) -> &'static str {
        self.conn.transport()
    }

    pub fn round_trip_us(&mut self, n: usize) -> Result<f64> {
        for _ in 0..n / 10 {
            self.conn.call(&Request::Ping)?;
        }
        let t = Instant::now();
        for _ in 0..n {
            self.conn.call(&Request::Ping)?;
        }
        Ok(t.elapsed().as_secs_f64() * 1e6 / n as f64)
    }

    /// Launches per second: issued (client side) and until the worker has run them all.
    pub fn quiet_launch_rate(&mut self, n: usize) -> Result<(f64, f64)> {
        let len = match self.noop_params {
            Some(len) => len,
            None => self.load_noop()?,
        };
        let params = vec![0u8; len];
        let t = Instant::now();
        for _ in 0..n {
            self.conn.quiet(&Request::LaunchKernel(Launch {
                function: FunctionHandle(3),
                grid: [1, 1, 1],
                block: [1, 1, 1],
                shared_mem: 0,
                stream: StreamHandle(0),
                params: &params,
                attributes: Vec::new(),
            }))?;
        }
        let issued = t.elapsed().as_secs_f64();
        self.conn.call(&Request::CtxSynchronize {
            ctx: ContextHandle(1),
        })?;
        let drained = t.elapsed().as_secs_f64();
        Ok((n as f64 / issued, n as f64 / drained))
    }

    /// Loads the empty kernel's module; its parameters' size.
    fn load_noop(&mut self) -> Result<usize> {
        let image = EMPTY_PTX.as_bytes();
        let hash: [u8; 32] =
            sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(image)).into();
        self.conn.call(&Request::ModuleLoad {
            module: ModuleHandle(2),
            device: 0,
            hash,
            image: Some(image),
        })?;
        let ReplyBody::Function(info) = self.conn.call(&Request::ModuleGetFunction {
            module: ModuleHandle(2),
            name: "noop",
            function: FunctionHandle(3),
        })?
        else {
            bail!("no function info");
        };
        let len = info
            .params
            .iter()
            .map(|p| (p.offset + p.size) as usize)
            .max()
            .unwrap_or(0);
        self.noop_params = Some(len);
        Ok(len)
    }

    fn alloc(&mut self, size: usize) -> Result<u64> {
        match self.conn.call(&Request::MemAlloc {
            device: 0,
            size: size as u64,
        })? {
            ReplyBody::Ptr(DevicePtr(p)) => Ok(p),
            _ => bail!("alloc"),
        }
    }

    pub fn h2d_gib_s(&mut self, size: usize, reps: usize) -> Result<f64> {
        let dst = self.alloc(size)?;
        let data = vec![9u8; size];
        self.conn.quiet_with_tail(
            &Request::MemcpyHtoD {
                dst: DevicePtr(dst),
                stream: StreamHandle(0),
                data: &[],
            },
            &data,
        )?;
        self.conn.call(&Request::CtxSynchronize {
            ctx: ContextHandle(1),
        })?;
        let t = Instant::now();
        for _ in 0..reps {
            self.conn.quiet_with_tail(
                &Request::MemcpyHtoD {
                    dst: DevicePtr(dst),
                    stream: StreamHandle(0),
                    data: &[],
                },
                &data,
            )?;
        }
        self.conn.call(&Request::CtxSynchronize {
            ctx: ContextHandle(1),
        })?;
        let s = t.elapsed().as_secs_f64();
        self.conn.quiet(&Request::MemFree {
            ptr: DevicePtr(dst),
        })?;
        Ok((size * reps) as f64 / s / (1u64 << 30) as f64)
    }

    pub fn d2h_gib_s(&mut self, size: usize, reps: usize) -> Result<f64> {
        let src = self.alloc(size)?;
        let mut dst = vec![0u8; size];
        let req = Request::MemcpyDtoH {
            src: DevicePtr(src),
            size: size as u64,
            stream: StreamHandle(0),
        };
        self.conn.call_read_into(&req, &mut dst)?;
        let t = Instant::now();
        for _ in 0..reps {
            self.conn.call_read_into(&req, &mut dst)?;
        }
        let s = t.elapsed().as_secs_f64();
        self.conn.quiet(&Request::MemFree {
            ptr: DevicePtr(src),
        })?;
        Ok((size * reps) as f64 / s / (1u64 << 30) as f64)
    }

    /// Copies between page-locked memory of the session's host arena and the device, GiB/s:
    /// (host to device, device to host), each copy as `cuMemcpyHtoD`/`cuMemcpyDtoH` send it
    /// (the request naming the arena, then a round trip: the copy is done when it returns).
    /// `None` when the session has no arena (not on the shared-memory transport).
    pub fn pinned_gib_s(&mut self, size: usize, reps: usize) -> Result<Option<(f64, f64)>> {
        let Some(arena) = self.conn.host_arena().cloned() else {
            return Ok(None);
        };
        let Some(host) = arena.alloc(size) else {
            bail!("the host arena has no {size} bytes free");
        };
        let offset = arena
            .offset_of(host as usize, size)
            .context("arena offset")?;
        arena.write(offset, &vec![7u8; size]);
        let dev = self.alloc(size)?;
        let mut timed = |req: &Request| -> Result<f64> {
            self.conn.quiet(req)?;
            self.conn.call(&Request::Ping)?;
            let t = Instant::now();
            for _ in 0..reps {
                self.conn.quiet(req)?;
                self.conn.call(&Request::Ping)?;
            }
            Ok((size * reps) as f64 / t.elapsed().as_secs_f64() / (1u64 << 30) as f64)
        };
        let h2d = timed(&Request::MemcpyHtoDHost {
            dst: DevicePtr(dev),
            stream: StreamHandle(0),
            offset,
            size: size as u64,
        })?;
        let d2h = timed(&Request::MemcpyDtoHHost {
            src: DevicePtr(dev),
            stream: StreamHandle(0),
            offset,
            size: size as u64,
        })?;
        self.conn.quiet(&Request::MemFree {
            ptr: DevicePtr(dev),
        })?;
        self.conn.call(&Request::Ping)?;
        arena.free(host, size);
        Ok(Some((h2d, d2h)))
    }
}
