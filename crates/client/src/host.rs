//! Page-locked host memory: `cuMemHostAlloc` hands out zeroed, page-aligned memory of this
//! process (or, with `CU_MEMHOSTALLOC_DEVICEMAP`, managed-like memory the device reaches at the
//! same address), and `cuMemHostRegister` records the application's own. Asynchronous copies
//! to page-locked memory are filled at the next synchronization; to pageable memory they
//! complete before returning.

use std::alloc::Layout;

use gpufuse_proto::ReplyBody;
use gpufuse_proto::Request;

use crate::error::ClientError;
use crate::state::{HostAllocation, Inner};
use crate::status::{
    HOST_MEMORY_ALREADY_REGISTERED, HOST_MEMORY_NOT_REGISTERED, INVALID_VALUE, OUT_OF_MEMORY,
    UNKNOWN,
};

const HOST_ALIGN: usize = 4096;
/// `CU_MEMHOSTALLOC_DEVICEMAP`.
pub const HOST_ALLOC_DEVICEMAP: u32 = 0x02;

impl Inner {
    /// `cuMemHostAlloc`: `size` bytes of page-locked memory.
    pub fn host_alloc(&mut self, size: usize, flags: u32) -> Result<*mut u8, ClientError> {
        let size = size.max(1);
        if flags & HOST_ALLOC_DEVICEMAP != 0 {
            // Kernels reach it through the same pointer (unified addressing): a device
            // allocation with host pages at its address, moved like managed memory.
            let p = self.alloc_managed(size as u64)?;
            self.host.insert(
                p as usize,
                HostAllocation {
                    size,
                    flags,
                    registered: false,
                    device_mapped: true,
                },
            );
            return Ok(p as usize as *mut u8);
        }
        let layout = Layout::from_size_align(size, HOST_ALIGN)
            .map_err(|_| ClientError::Cuda(OUT_OF_MEMORY))?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(OUT_OF_MEMORY.into());
        }
        self.host.insert(
            p as usize,
            HostAllocation {
                size,
                flags,
                registered: false,
                device_mapped: false,
            },
        );
        Ok(p)
    }

    /// `cuMemFreeHost` of memory [`Inner::host_alloc`] handed out.
    pub fn host_free(&mut self, p: usize) -> Result<(), ClientError> {
        match self.host.get(&p).copied() {
            Some(h) if h.device_mapped => {
                self.host.remove(&p);
                self.free(p as u64)
            }
            Some(h) if !h.registered => {
                self.host.remove(&p);
                let layout = Layout::from_size_align(h.size, HOST_ALIGN)
                    .map_err(|_| ClientError::Cuda(INVALID_VALUE))?;
                // SAFETY: `p` was returned by `alloc_zeroed` with this layout in `host_alloc`
                // and is removed from the table, so it is freed once.
                unsafe { std::alloc::dealloc(p as *mut u8, layout) };
                Ok(())
            }
            _ => Err(INVALID_VALUE.into()),
        }
    }

    /// `cuMemHostRegister`.
    pub fn host_register(&mut self, p: usize, size: usize, flags: u32) -> Result<(), ClientError> {
        if p == 0 || size == 0 {
            return Err(INVALID_VALUE.into());
        }
        if self.find_host(p).is_some() {
            return Err(HOST_MEMORY_ALREADY_REGISTERED.into());
        }
        self.host.insert(
            p,
            HostAllocation {
                size,
                flags,
                registered: true,
                device_mapped: false,
            },
        );
        Ok(())
    }

    /// `cuMemHostUnregister`.
    pub fn host_unregister(&mut self, p: usize) -> Result<(), ClientError> {
        match self.host.get(&p) {
            Some(h) if h.registered => {
                self.host.remove(&p);
                Ok(())
            }
            _ => Err(HOST_MEMORY_NOT_REGISTERED.into()),
        }
    }

    /// `cuMemGetInfo` of the current device: (free, total).
    pub fn mem_info(&mut self) -> Result<(u64, u64), ClientError> {
        let (_, device) = self.current()?;
        match self.conn.call(&Request::MemGetInfo { device })? {
            ReplyBody::MemInfo { free, total } => Ok((free, total)),
            _ => Err(UNKNOWN.into()),
        }
    }
}
