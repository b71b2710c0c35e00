//! Copies and memsets. Host-to-device data, device-to-device copies and memsets are quiet;
//! synchronous device-to-host copies are round trips; asynchronous ones into page-locked memory
//! are staged by the worker and land with the next synchronizing reply. Page-locked memory in
//! the session's host arena (shared-memory sessions, `host.rs`) is copied by the worker in
//! place: the requests name arena offsets and carry no data. Under stream capture
//! each is recorded into the graph instead. Every one reaches the device through the device-work
//! choke point (`work.rs`). 2-D copies ([`Inner::copy_2d`]) and 2-D memsets
//! ([`Inner::memset_2d`]) too, their sizes from the application checked before they are used.

use gpufuse_proto::{Rect, ReplyBody, Request, MAX_COPY_CHUNK};

use crate::error::ClientError;
use crate::graph::Op;
use crate::host::ARENA_SYNC_HTOD_MIN;
use crate::registered::ArenaSpan;
use crate::state::Inner;
use crate::status::{INVALID_VALUE, NOT_SUPPORTED, UNKNOWN};
use gpufuse_proto::{DevicePtr, StreamHandle};

/// One side of a 2-D copy: device memory (an allocation, or a CUDA array's rows) or host
/// memory, the address of its first byte and its pitch in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Side2D {
    pub device: bool,
    pub ptr: u64,
    pub pitch: u64,
}

/// The bytes `height` rows of `width` bytes at `pitch` span: `pitch * (height - 1) + width`,
/// checked (`height` > 0).
fn span_2d(pitch: u64, width: u64, height: u64) -> Result<u64, ClientError> {
    pitch
        .checked_mul(height - 1)
        .and_then(|s| s.checked_add(width))
        .ok_or_else(|| INVALID_VALUE.into())
}

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
            if let Some(span) = self.arena_span(src.as_ptr() as usize, src.len()) {
                // Page-locked memory the worker maps: it copies from there. The application
                // may reuse the source once this returns, so it waits for a reply, after which
                // the worker has read it.
                self.send_htod_span(dst, src, stream, span)?;
                self.conn.call_raw(&Request::Ping)?;
                return Ok(());
            }
        }
        self.send_htod(dst, src, stream)
    }

    /// Quiet host-to-device copies carrying `src`'s bytes, in frame-sized parts. Each part is
    /// its frame's tail: sent from `src` itself, never copied into the frame buffer, and the
    /// worker receives a large one straight into device memory.
    fn send_htod(&mut self, dst: u64, src: &[u8], stream: u64) -> Result<(), ClientError> {
        for (i, chunk) in src.chunks(MAX_COPY_CHUNK).enumerate() {
            let req = Request::MemcpyHtoD {
                dst: DevicePtr(dst + (i * MAX_COPY_CHUNK) as u64),
                stream: StreamHandle(stream),
                data: &[],
            };
            self.conn.quiet_with_tail(&req, chunk)?;
        }
        Ok(())
    }

    /// Quiet host-to-device copies of `src` split as `span` says: its arena part named by
    /// offset, the application's own bytes before and after it carried.
    fn send_htod_span(
        &mut self,
        dst: u64,
        src: &[u8],
        stream: u64,
        span: ArenaSpan,
    ) -> Result<(), ClientError> {
        let (head, rest) = src.split_at(span.head);
        let tail = &rest[span.mid..];
        self.send_htod(dst, head, stream)?;
        self.conn.quiet(&Request::MemcpyHtoDHost {
            dst: DevicePtr(dst + span.head as u64),
            stream: StreamHandle(stream),
            offset: span.offset,
            size: span.mid as u64,
        })?;
        self.send_htod(dst + (span.head + span.mid) as u64, tail, stream)
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
        let span = match self.arena_span(src.as_ptr() as usize, src.len()) {
            Some(span) if !src.is_empty() => span,
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
        self.send_htod_span(dst, src, stream, span)?;
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
        let span = match dst.is_empty() {
            true => None,
            false => self.arena_span(dst.as_ptr() as usize, dst.len()),
        };
        if let Some(span) = span {
            // The worker writes the arena part in place; the reply to the call after it says
            // it has. The application's own bytes around it come back in replies.
            let (head, rest) = dst.split_at_mut(span.head);
            let tail = &mut rest[span.mid..];
            self.read_dtoh(head, src, stream)?;
            self.conn.quiet(&Request::MemcpyDtoHHost {
                src: DevicePtr(src + span.head as u64),
                stream: StreamHandle(stream),
                offset: span.offset,
                size: span.mid as u64,
            })?;
            self.read_dtoh(tail, src + (span.head + span.mid) as u64, stream)?;
            self.conn.call_raw(&Request::Ping)?;
            return self.synchronized();
        }
        self.read_dtoh(dst, src, stream)?;
        self.synchronized()
    }

    /// Device-to-host copies answered with their bytes, received into `dst`, in frame-sized
    /// parts.
    fn read_dtoh(&mut self, dst: &mut [u8], src: u64, stream: u64) -> Result<(), ClientError> {
        for (i, chunk) in dst.chunks_mut(MAX_COPY_CHUNK).enumerate() {
            let req = Request::MemcpyDtoH {
                src: DevicePtr(src + (i * MAX_COPY_CHUNK) as u64),
                size: chunk.len() as u64,
                stream: StreamHandle(stream),
            };
            self.conn.call_read_into(&req, chunk)?;
        }
        Ok(())
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
            if let Some(span) = self.arena_span(dst as usize, len) {
                // Page-locked memory the worker maps: written there in stream order; the
                // page-locked bytes around it (a registration's partial pages) are staged.
                self.managed_to_device()?;
                // SAFETY: this function's contract, for the first `head` bytes.
                unsafe { self.stage_dtoh(dst, src, span.head, stream) }?;
                self.conn.quiet(&Request::MemcpyDtoHHost {
                    src: DevicePtr(src + span.head as u64),
                    stream: StreamHandle(stream),
                    offset: span.offset,
                    size: span.mid as u64,
                })?;
                self.arena_copies_queued();
                let done = span.head + span.mid;
                // SAFETY: this function's contract, for the bytes after the arena part.
                return unsafe {
                    self.stage_dtoh(dst.add(done), src + done as u64, len - done, stream)
                };
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
        // SAFETY: this function's contract.
        unsafe { self.stage_dtoh(dst, src, len, stream) }
    }

    /// Quiet device-to-host copies of `len` bytes whose data the worker stages and the client
    /// writes into `dst` when a later reply brings it.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes until the copy's stream (or the whole
    /// context) is synchronized.
    unsafe fn stage_dtoh(
        &mut self,
        dst: *mut u8,
        src: u64,
        len: usize,
        stream: u64,
    ) -> Result<(), ClientError> {
        let mut off = 0;
        while off < len {
            let n = (len - off).min(MAX_COPY_CHUNK);
            // SAFETY: this function's contract: valid until the stream is synchronized, which
            // is no earlier than the reply that brings the data.
            let tag = unsafe { self.conn.register_copy(dst.add(off), n) };
            let req = Request::MemcpyDtoHAsync {
                src: DevicePtr(src + off as u64),
                size: n as u64,
                stream: StreamHandle(stream),
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
            dst: DevicePtr(dst),
            src: DevicePtr(src),
            size: len,
            stream: StreamHandle(stream),
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
            dst: DevicePtr(dst),
            value,
            elem_size,
            count,
            stream: StreamHandle(stream),
        })
    }

    /// A 2-D copy of `height` rows of `width` bytes from `src` to `dst` on `stream`
    /// (`cuMemcpy2D`; 3-D copies are one per slice). Device to device is quiet; host to device
    /// sends the rows packed; device to host is a round trip, written row by row into the
    /// destination, and, when `sync`, reports an asynchronous error like a synchronizing call;
    /// host to host is copied here. A device side's pitch must hold a row; a host side's
    /// pitch is at least the row. Not under stream capture. Larger than a frame: NOT_SUPPORTED.
    ///
    /// # Safety
    /// A host side must be valid for `height` rows of `width` bytes at its pitch during this
    /// call: readable for the source, writable for the destination (and they may overlap).
    pub unsafe fn copy_2d(
        &mut self,
        src: Side2D,
        dst: Side2D,
        width: u64,
        height: u64,
        stream: u64,
        sync: bool,
    ) -> Result<(), ClientError> {
        if width == 0 || height == 0 {
            return Ok(());
        }
        self.not_capturing(stream)?;
        if (src.device && src.pitch < width) || (dst.device && dst.pitch < width) {
            return Err(INVALID_VALUE.into());
        }
        let (sp, dp) = (src.pitch.max(width), dst.pitch.max(width));
        let (src_span, dst_span) = (span_2d(sp, width, height)?, span_2d(dp, width, height)?);
        if src.device {
            self.check_device_range(src.ptr, src_span)?;
        }
        if dst.device {
            self.check_device_range(dst.ptr, dst_span)?;
        }
        // A host side lies in this process's address space: its span must fit one.
        let host = |side: Side2D, span: u64| -> Result<(usize, usize), ClientError> {
            let end = side.ptr.checked_add(span);
            if side.ptr == 0 || end.is_none_or(|e| e > usize::MAX as u64) {
                return Err(INVALID_VALUE.into());
            }
            Ok((side.ptr as usize, side.pitch.max(width) as usize))
        };
        let (w, h) = (width as usize, height as usize);
        let rect = |ptr, pitch| Rect { ptr, pitch };
        match (src.device, dst.device) {
            (true, true) => self.device_work(&Request::Memcpy2DDtoD {
                dst: rect(DevicePtr(dst.ptr), dp),
                src: rect(DevicePtr(src.ptr), sp),
                width,
                height,
                stream: StreamHandle(stream),
            }),
            (false, true) => {
                let (base, pitch) = host(src, src_span)?;
                let size = width.checked_mul(height).ok_or(INVALID_VALUE)?;
                if size > MAX_COPY_CHUNK as u64 {
                    return Err(NOT_SUPPORTED.into());
                }
                let mut packed = Vec::with_capacity(size as usize);
                for row in 0..h {
                    // SAFETY: row `row` of the source, `w` bytes, inside the span checked
                    // above; this function's contract: readable during this call.
                    packed.extend_from_slice(unsafe {
                        std::slice::from_raw_parts((base + row * pitch) as *const u8, w)
                    });
                }
                self.device_work(&Request::Memcpy2DHtoD {
                    dst: rect(DevicePtr(dst.ptr), dp),
                    width,
                    height,
                    stream: StreamHandle(stream),
                    data: &packed,
                })
            }
            (true, false) => {
                let (base, pitch) = host(dst, dst_span)?;
                let size = width.checked_mul(height).ok_or(INVALID_VALUE)?;
                if size > MAX_COPY_CHUNK as u64 {
                    return Err(NOT_SUPPORTED.into());
                }
                let req = Request::Memcpy2DDtoH {
                    src: rect(DevicePtr(src.ptr), sp),
                    width,
                    height,
                    stream: StreamHandle(stream),
                };
                let ReplyBody::Data(data) = self.device_call(&req)? else {
                    return Err(UNKNOWN.into());
                };
                if data.len() as u64 != size {
                    return Err(UNKNOWN.into());
                }
                for (row, chunk) in data.chunks(w).enumerate() {
                    // SAFETY: row `row` of the destination, `w` bytes, inside the span checked
                    // above; this function's contract: writable during this call.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            chunk.as_ptr(),
                            (base + row * pitch) as *mut u8,
                            w,
                        )
                    };
                }
                if sync {
                    self.take_async_error()?;
                }
                Ok(())
            }
            (false, false) => {
                let (src_base, sp) = host(src, src_span)?;
                let (dst_base, dp) = host(dst, dst_span)?;
                for row in 0..h {
                    // SAFETY: row `row` of the source and the destination, `w` bytes each,
                    // inside the spans checked above; this function's contract: valid during
                    // this call; `copy` allows overlap.
                    unsafe {
                        std::ptr::copy(
                            (src_base + row * sp) as *const u8,
                            (dst_base + row * dp) as *mut u8,
                            w,
                        )
                    };
                }
                Ok(())
            }
        }
    }

    /// Sets `height` rows of `width` elements of `elem_size` (1, 2 or 4) bytes, `pitch` bytes
    /// apart from `dst`, to `value` (`cuMemsetD2D*`). Under stream capture, one memset node
    /// per row.
    #[allow(clippy::too_many_arguments)]
    pub fn memset_2d(
        &mut self,
        dst: u64,
        pitch: u64,
        value: u32,
        elem_size: u8,
        width: u64,
        height: u64,
        stream: u64,
    ) -> Result<(), ClientError> {
        let row = width
            .checked_mul(u64::from(elem_size))
            .ok_or(INVALID_VALUE)?;
        if width == 0 || height == 0 {
            return Ok(());
        }
        if pitch < row {
            return Err(INVALID_VALUE.into());
        }
        self.check_device_range(dst, span_2d(pitch, row, height)?)?;
        if self.graphs.capturing(stream).is_some() {
            for r in 0..height {
                let op = Op::Memset {
                    dst: dst + r * pitch,
                    value,
                    elem_size,
                    count: width,
                };
                self.graphs.record(stream, op);
            }
            return Ok(());
        }
        self.device_work(&Request::Memset2D {
            dst: Rect {
                ptr: DevicePtr(dst),
                pitch,
            },
            value,
            elem_size,
            width,
            height,
            stream: StreamHandle(stream),
        })
    }
}
