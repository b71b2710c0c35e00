//! Moving a session to another worker: [`Session::reconnect`] opens a session at another
//! address and issues there again everything this session owns (contexts, device memory with
//! its contents, modules and their functions and globals, streams and events), under the same
//! handles and device addresses, then drops the old connection (whose worker frees what it
//! held). This is the hook live migration builds on.
//!
//! Device addresses are kept by placing allocations and module loads on the new worker in the
//! order the old one saw them; a worker that places something elsewhere (memory freed in
//! between on a device whose allocator reuses it, another device model) makes the reconnect
//! fail with [`ClientError::Reconnect`] naming the address, and the session stays where it
//! was. Placing memory at a chosen address needs a request the wire does not have yet.
//! Not carried yet, refused the same way: virtual memory mappings (`cuMemMap`) and texture or
//! surface objects. Events are created again unrecorded.

use gpufuse_proto::{ReplyBody, Request, MAX_COPY_CHUNK};
use gpufuse_transport::Address;

use crate::connection::{Accepted, Connection};
use crate::error::ClientError;
use crate::memory::{page, page_len, MemoryKind};
use crate::module::LoadState;
use crate::state::{Inner, Session};
use gpufuse_proto::{
    ContextHandle, DevicePtr, EventHandle, FunctionHandle, ModuleHandle, StreamHandle,
};

/// Device memory contents read from the old worker: (address, bytes).
type Contents = Vec<(u64, Vec<u8>)>;

/// Something that takes device address space, in the order the server placed it.
enum Placement {
    Allocation(u64),
    Module(u64),
}

fn refuse(why: impl Into<String>) -> ClientError {
    ClientError::Reconnect(why.into())
}

impl Session {
    /// Moves this session to the node at `address` (see the module docs). On failure the
    /// session stays on its current worker, unchanged.
    pub fn reconnect(&self, address: &Address) -> Result<(), ClientError> {
        let (conn, accepted) = Connection::open(address, &self.hello)?;
        self.reconnect_over(conn, accepted)
    }

    /// [`Session::reconnect`] over a connection the caller opened (and whose hello was
    /// accepted).
    pub fn reconnect_over(&self, conn: Connection, accepted: Accepted) -> Result<(), ClientError> {
        if accepted.devices.len() != self.devices.len() {
            return Err(refuse(format!(
                "the new worker has {} devices, the session uses {}",
                accepted.devices.len(),
                self.devices.len()
            )));
        }
        let mut g = self.lock();
        let (contents, pending_error) = g.capture()?;
        let old = std::mem::replace(&mut g.conn, conn);
        match g.reissue(&contents) {
            Ok(()) => {
                if let Some(e) = pending_error {
                    g.conn.keep_async_error(e);
                }
                drop(old);
                self.set_session_id(accepted.session_id);
                Ok(())
            }
            Err(e) => {
                // The old worker still holds everything: stay there.
                let _ = std::mem::replace(&mut g.conn, old);
                if let Some(p) = pending_error {
                    g.conn.keep_async_error(p);
                }
                Err(e)
            }
        }
    }
}

impl Inner {
    /// On the old worker: waits for all work, brings managed memory to the host and reads
    /// every other allocation's contents. Returns them and the asynchronous error not yet
    /// reported to the application.
    fn capture(&mut self) -> Result<(Contents, Option<i32>), ClientError> {
        if !self.physical.is_empty() || !self.mappings.is_empty() {
            return Err(refuse(
                "virtual memory mappings (cuMemMap) are not carried yet",
            ));
        }
        if self.shared_count > 0 {
            return Err(refuse(
                "managed memory shared with the device (a same-host session's \
                 cudaMallocManaged) is not carried: the new worker cannot map it",
            ));
        }
        if self.has_ipc_memory() {
            return Err(refuse(
                "memory shared with other processes (CUDA IPC) is not carried: the new \
                 worker cannot map it",
            ));
        }
        if !self.textures.is_empty() {
            return Err(refuse("texture and surface objects are not carried yet"));
        }
        let mut ctxs: Vec<u64> = self.contexts.keys().copied().collect();
        ctxs.sort_unstable();
        for ctx in ctxs {
            self.conn.call(&Request::CtxSynchronize {
                ctx: ContextHandle(ctx),
            })?;
        }
        let pending = self.conn.take_async_error();
        self.managed_to_host()?;
        let mut contents = Vec::new();
        let ptrs: Vec<(u64, u64)> = self
            .allocations
            .iter()
            .filter(|(_, a)| !matches!(a.kind, MemoryKind::Managed { .. } | MemoryKind::Mapped))
            .map(|(&p, a)| (p, a.size))
            .collect();
        for (p, size) in ptrs {
            let mut data = vec![0u8; usize::try_from(size).map_err(|_| refuse("size"))?];
            self.read_device(p, &mut data)?;
            contents.push((p, data));
        }
        Ok((contents, pending))
    }

    /// On the new worker: everything again, under the same handles and addresses.
    fn reissue(&mut self, contents: &Contents) -> Result<(), ClientError> {
        let mut ctxs: Vec<(u64, u32, u32)> = self
            .contexts
            .iter()
            .map(|(&h, c)| (h, c.device, c.flags))
            .collect();
        ctxs.sort_unstable();
        for (ctx, device, flags) in ctxs {
            self.conn.quiet(&Request::CtxCreate {
                ctx: ContextHandle(ctx),
                device,
                flags,
            })?;
        }
        let mut placements: Vec<(u64, Placement)> = self
            .allocations
            .iter()
            .filter(|(_, a)| !matches!(a.kind, MemoryKind::Global { .. } | MemoryKind::Mapped))
            .map(|(&p, a)| (a.order, Placement::Allocation(p)))
            .chain(
                self.modules
                    .iter()
                    .filter(|(_, module)| module.state == LoadState::Loaded)
                    .map(|(&m, module)| (module.order, Placement::Module(m))),
            )
            .collect();
        placements.sort_by_key(|(order, _)| *order);
        for (_, placement) in placements {
            match placement {
                Placement::Allocation(p) => self.place_allocation(p)?,
                Placement::Module(m) => {
                    let (device, image) = {
                        let module = &self.modules[&m];
                        (module.device, module.image.clone())
                    };
                    self.send_module(m, device, &image)?;
                }
            }
        }
        self.reissue_module_names()?;
        let streams: Vec<(u64, u32, i32)> = self
            .streams
            .iter()
            .map(|(&h, s)| (h, s.flags, s.priority))
            .collect();
        for (stream, flags, priority) in streams {
            self.conn.quiet(&Request::StreamCreate {
                stream: StreamHandle(stream),
                flags,
                priority,
            })?;
        }
        let events: Vec<(u64, u32)> = self.events.iter().map(|(&h, e)| (h, e.flags)).collect();
        for (event, flags) in events {
            self.conn.quiet(&Request::EventCreate {
                event: EventHandle(event),
                flags,
            })?;
        }
        for (p, data) in contents {
            for (i, chunk) in data.chunks(MAX_COPY_CHUNK).enumerate() {
                self.conn.quiet(&Request::MemcpyHtoD {
                    dst: DevicePtr(p + (i * MAX_COPY_CHUNK) as u64),
                    stream: StreamHandle(0),
                    data: chunk,
                })?;
            }
        }
        // The host holds managed memory's contents: the next device work hands them over.
        self.managed_on_device = false;
        // Everything quiet is applied before the session counts as moved.
        self.conn.call(&Request::Ping)?;
        match self.conn.take_async_error() {
            Some(e) => Err(refuse(format!(
                "the new worker failed a request issued again (CUDA error {e})"
            ))),
            None => Ok(()),
        }
    }

    /// Allocates the allocation at `p` again; it must land at the same address.
    fn place_allocation(&mut self, p: u64) -> Result<(), ClientError> {
        let a = self.allocations[&p];
        let size = match a.kind {
            MemoryKind::Managed { .. } => page_len(a.size) as u64 + page(),
            _ => a.size,
        };
        let want = a.server_ptr(p);
        let got = match self.conn.call(&Request::MemAlloc {
            device: a.device,
            size,
        })? {
            ReplyBody::Ptr(DevicePtr(got)) => got,
            _ => return Err(ClientError::UnexpectedReply),
        };
        if got != want {
            return Err(refuse(format!(
                "device memory at {want:#x} was placed at {got:#x} on the new worker"
            )));
        }
        Ok(())
    }

    /// Functions and globals looked up by name, under the same handles and addresses.
    fn reissue_module_names(&mut self) -> Result<(), ClientError> {
        let functions: Vec<(u64, u64, String)> = self
            .functions
            .iter()
            .map(|(&f, func)| (f, func.module, func.name.clone()))
            .collect();
        for (function, module, name) in functions {
            let req = Request::ModuleGetFunction {
                module: ModuleHandle(module),
                name: &name,
                function: FunctionHandle(function),
            };
            let ReplyBody::Function(_) = self.conn.call(&req)? else {
                return Err(ClientError::UnexpectedReply);
            };
        }
        let globals: Vec<(u64, String, u64)> = self
            .modules
            .iter()
            .flat_map(|(&m, module)| {
                module
                    .globals
                    .iter()
                    .map(move |(name, &ptr)| (m, name.clone(), ptr))
            })
            .collect();
        for (module, name, want) in globals {
            match self.conn.call(&Request::ModuleGetGlobal {
                module: ModuleHandle(module),
                name: &name,
            })? {
                ReplyBody::Global {
                    ptr: DevicePtr(ptr),
                    ..
                } if ptr == want => {}
                ReplyBody::Global {
                    ptr: DevicePtr(ptr),
                    ..
                } => {
                    return Err(refuse(format!(
                        "global `{name}` at {want:#x} was placed at {ptr:#x} on the new worker"
                    )))
                }
                _ => return Err(ClientError::UnexpectedReply),
            }
        }
        Ok(())
    }
}
