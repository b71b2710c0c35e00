//! Copies and memsets. Host-to-device data, device-to-device copies and memsets are quiet;
//! synchronous device-to-host copies are round trips; asynchronous ones into page-locked memory
//! are staged by the worker and land with the next synchronizing reply. Page-locked memory in
//! the session's host arena (shared-memory sessions, `host.rs`) is copied by the worker in
//! place: the requests name arena offsets and carry no data. Under stream capture
//! each is recorded into the graph instead. Every one reaches the device through the device-work
//! choke point (`work.rs`).

use gpufuse_proto::{Request, MAX_COPY_CHUNK};

use crate::error::ClientError;
use crate::graph::Op;
use crate::host::ARENA_SYNC_HTOD_MIN;
use crate::state::Inner;
use crate::status::INVALID_VALUE;

impl Inner {
    /// A host-to-device copy of `src` to `dst` on `stream`, in frame-sized parts.
    pub fn copy_to_device(&mut self, dst: u64, src: &[u8], stream: u64) -> Result<(), ClientError> {
        self.check_device_range(dst, src.len() as u64)?;
        let op = Op::HtoD {
            dst,
            src_host: src.as_ptr() as usize,
            len: src.len(),
        };
        if self.graphs.record(stream, op).is_none() {
            return Ok(());
        }
        self.managed_to_device()?;
        if src.len() >= ARENA_SYNC_HTOD_MIN {
            if let Some(offset) = self.arena_offset(src.as_ptr() as usize, src.len()) {
                // Page-locked memory the worker maps: it copies from there. The application
                // may reuse the source once this returns, so it waits for a reply, after which
                // the worker has read it.
                self.conn.quiet(&Request::MemcpyHtoDHost {
                    dst,
                    stream,
                    offset,
                    size: src.len() as u64,
                })?;
                self.conn.call_raw(&Request::Ping)?;
                return Ok(());
            }
        }
        for (i, chunk) in src.chunks(MAX_COPY_CHUNK).enumerate() {
            let req = Request::MemcpyHtoD {
                dst: dst + (i * MAX_COPY_CHUNK) as u64,
                stream,
                data: chunk,
            };
            self.conn.quiet(&req)?;
        }
        Ok(())
    }

    /// An asynchronous host-to-device copy of `src` to `dst` on `stream`. From page-locked
    /// memory of the connection's host arena, the worker reads the source when the copy runs,
    /// in stream order, so it must stay unchanged until then (CUDA's contract for asynchronous
    /// copies from page-locked memory); any other source is copied before this returns.
    pub fn copy_to_device_async(
        &mut self,
        dst: u64,
        src: &[u8],
        stream: u64,
    ) -> Result<(), ClientError> {
        let offset = match self.arena_offset(src.as_ptr() as usize, src.len()) {
            Some(offset) if !src.is_empty() => offset,
            _ => return self.copy_to_device(dst, src, stream),
        };
        self.check_device_range(dst, src.len() as u64)?;
        let op = Op::HtoD {
            dst,
            src_host: src.as_ptr() as usize,
            len: src.len(),
        };
        if self.graphs.record(stream, op).is_none() {
            return Ok(());
        }
        self.managed_to_device()?;
        self.conn.quiet(&Request::MemcpyHtoDHost {
            dst,
            stream,
            offset,
            size: src.len() as u64,
        })?;
        self.arena_copies_queued();
        Ok(())
    }

    /// A synchronous device-to-host copy into `dst`: the device's work before it is done when
    /// it returns, so it synchronizes like a synchronize call (asynchronous error, managed
    /// memory back to the host).
    pub fn copy_from_device(
        &mut self,
        dst: &mut [u8],
        src: u64,
        stream: u64,
    ) -> Result<(), ClientError> {
        self.check_device_range(src, dst.len() as u64)?;
        self.not_capturing(stream)?;
        self.managed_to_device()?;
        if let Some(offset) = self.arena_offset(dst.as_ptr() as usize, dst.len()) {
            if !dst.is_empty() {
                // The worker writes it in place; the reply to the call after it says it has.
                self.conn.quiet(&Request::MemcpyDtoHHost {
                    src,
                    stream,
                    offset,
                    size: dst.len() as u64,
                })?;
                self.conn.call_raw(&Request::Ping)?;
                return self.synchronized();
            }
        }
        for (i, chunk) in dst.chunks_mut(MAX_COPY_CHUNK).enumerate() {
            let req = Request::MemcpyDtoH {
                src: src + (i * MAX_COPY_CHUNK) as u64,
                size: chunk.len() as u64,
                stream,
            };
            self.conn.call_read_into(&req, chunk)?;
        }
        self.synchronized()
    }

    /// An asynchronous device-to-host copy of `len` bytes into `dst`. To pageable memory the
    /// driver completes the copy before returning (cudarc's clone_dtoh relies on it); only
    /// page-locked destinations are filled at the next synchronization.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes now and, if it is page-locked memory,
    /// until the copy's stream (or the whole context) is synchronized, as CUDA requires of
    /// asynchronous copies.
    pub unsafe fn copy_from_device_async(
        &mut self,
        dst: *mut u8,
        src: u64,
        len: usize,
        stream: u64,
    ) -> Result<(), ClientError> {
        self.check_device_range(src, len as u64)?;
        if len > 0 && dst.is_null() {
            return Err(INVALID_VALUE.into());
        }
        let op = Op::DtoH {
            dst_host: dst as usize,
            src,
            len,
        };
        if self.graphs.record(stream, op).is_none() {
            return Ok(());
        }
        if len > 0 {
            if let Some(offset) = self.arena_offset(dst as usize, len) {
                // Page-locked memory the worker maps: written there in stream order.
                self.managed_to_device()?;
                self.conn.quiet(&Request::MemcpyDtoHHost {
                    src,
                    stream,
                    offset,
                    size: len as u64,
                })?;
                self.arena_copies_queued();
                return Ok(());
            }
        }
        if self.find_host(dst as usize).is_none() {
            let dst = if len == 0 {
                &mut []
            } else {
                // SAFETY: this function's contract: valid for writes of `len` bytes now.
                unsafe { std::slice::from_raw_parts_mut(dst, len) }
            };
            return self.copy_from_device(dst, src, stream);
        }
        self.managed_to_device()?;
        let mut off = 0;
        while off < len {
            let n = (len - off).min(MAX_COPY_CHUNK);
            // SAFETY: this function's contract: valid until the stream is synchronized, which
            // is no earlier than the reply that brings the data.
            let tag = unsafe { self.conn.register_copy(dst.add(off), n) };
            let req = Request::MemcpyDtoHAsync {
                src: src + off as u64,
                size: n as u64,
                stream,
                tag,
            };
            self.conn.quiet(&req)?;
            off += n;
        }
        Ok(())
    }

    /// A device-to-device copy.
    pub fn copy_on_device(
        &mut self,
        dst: u64,
        src: u64,
        len: u64,
        stream: u64,
    ) -> Result<(), ClientError> {
        self.check_device_range(dst, len)?;
        self.check_device_range(src, len)?;
        if self
            .graphs
            .record(stream, Op::DtoD { dst, src, len })
            .is_none()
        {
            return Ok(());
        }
        self.device_work(&Request::MemcpyDtoD {
            dst,
            src,
            size: len,
            stream,
        })
    }

    /// Sets `count` elements of `elem_size` (1, 2 or 4) bytes at `dst` to `value`.
    pub fn memset(
        &mut self,
        dst: u64,
        value: u32,
        elem_size: u8,
        count: u64,
        stream: u64,
    ) -> Result<(), ClientError> {
        self.check_device_range(dst, count.saturating_mul(u64::from(elem_size)))?;
        if count == 0 {
            return Ok(());
        }
        let op = Op::Memset {
            dst,
            value,
            elem_size,
            count,
        };
        if self.graphs.record(stream, op).is_none() {
            return Ok(());
        }
        self.device_work(&Request::Memset {
            dst,
            value,
            elem_size,
            count,
            stream,
        })
    }
}
