//! The virtual timeline: every op gets its start and end when it is enqueued (the latest of
//! its enqueue time, its stream's previous op, the legacy stream's implicit synchronization
//! and the events it waits for, then the first time its engine is free for it), and its
//! effects are applied once the clock has passed its end.

use std::cmp::Ordering;
use std::sync::Arc;

use gpufuse_cuda_types::{short as E, CUresult};

use crate::ffi::HostPtr;
use crate::guard::now;
use crate::state::{Engine, EvState, SRef, Sim};

/// Where a host-to-device copy reads.
#[derive(Clone, Debug)]
pub(crate) enum HostSrc {
    /// Pageable memory, read when the copy was issued.
    Bytes(Arc<Vec<u8>>),
    /// Host memory read when the copy completes: page-locked memory, or a graph's node.
    Ptr(HostPtr),
}

/// One op: what a stream runs, or a captured graph node.
#[derive(Clone, Debug)]
pub(crate) enum Work {
    Kernel {
        duration: u64,
        /// `sim_add_u32`'s (ptr, n, value).
        add: Option<(u64, u32, u32)>,
    },
    HtoD {
        dst: u64,
        src: HostSrc,
        len: usize,
    },
    DtoH {
        dst: HostPtr,
        src: u64,
        len: usize,
    },
    DtoD {
        dst: u64,
        src: u64,
        len: usize,
    },
    Memset {
        dst: u64,
        value: u32,
        elem: u8,
        count: usize,
    },
    /// `cuEventRecord`.
    Record {
        event: u64,
    },
    /// `cuStreamWaitEvent` (in a graph: an external event wait).
    WaitEvent {
        event: u64,
    },
}

/// An op on the timeline whose effects are not yet applied.
pub(crate) struct Pending {
    pub end: u64,
    seq: u64,
    ctx: u64,
    compute_ns: u64,
    work: Work,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.end, self.seq) == (other.end, other.seq)
    }
}

impl Eq for Pending {}

impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Pending {
    /// Reversed, so that `BinaryHeap` pops the soonest end first (enqueue order among equal
    /// ends: a dependent op never ends before what it depends on).
    fn cmp(&self, other: &Self) -> Ordering {
        (other.end, other.seq).cmp(&(self.end, self.seq))
    }
}

/// Nanoseconds `bytes` take at `gbps` GB/s (bytes per nanosecond).
pub(crate) fn transfer_ns(bytes: usize, gbps: f64) -> u64 {
    (bytes as f64 / gbps).ceil() as u64
}

/// Device-to-device copies and memsets, GB/s.
const DEVICE_GBPS: f64 = 1000.0;

impl Sim {
    /// The end of the last op of stream `s` itself.
    pub fn last_end(&self, s: SRef) -> u64 {
        match s {
            SRef::Null(c) => self.contexts[&c].null_end,
            SRef::Id(id) => self.streams[&id].last_end,
        }
    }

    fn set_last_end(&mut self, s: SRef, t: u64) {
        match s {
            SRef::Null(c) => {
                if let Some(c) = self.contexts.get_mut(&c) {
                    c.null_end = t;
                }
            }
            SRef::Id(id) => {
                if let Some(st) = self.streams.get_mut(&id) {
                    st.last_end = t;
                }
            }
        }
    }

    /// The legacy stream's implicit synchronization: its work waits for every blocking
    /// stream of its context, and a blocking stream's work waits for it.
    fn implicit_dep(&self, s: SRef) -> u64 {
        match s {
            SRef::Null(c) => self
                .streams
                .values()
                .filter(|st| st.ctx == c && !st.nonblocking)
                .map(|st| st.last_end)
                .max()
                .unwrap_or(0)
                .max(self.contexts[&c].retired_blocking_end),
            SRef::Id(id) => {
                let st = &self.streams[&id];
                if st.nonblocking {
                    0
                } else {
                    self.contexts[&st.ctx].null_end
                }
            }
        }
    }

    /// When all work a synchronization of `s` waits for has completed.
    pub fn sync_target(&self, s: SRef) -> u64 {
        match s {
            SRef::Null(_) => self.last_end(s).max(self.implicit_dep(s)),
            SRef::Id(_) => self.last_end(s),
        }
    }

    /// The engine an op runs on, its duration, and whether its host memory is page-locked.
    fn cost(&self, w: &Work) -> (Option<Engine>, u64, bool) {
        let rate = |pinned: bool| match pinned {
            true => self.cfg.pinned_gbps,
            false => self.cfg.pageable_gbps,
        };
        match w {
            Work::Kernel { duration, .. } => (Some(Engine::Compute), *duration, false),
            Work::HtoD { src, len, .. } => {
                let pinned = match src {
                    HostSrc::Bytes(_) => false,
                    HostSrc::Ptr(p) => self.mem.is_pinned(p.0 as usize, *len),
                };
                (Some(Engine::HtoD), transfer_ns(*len, rate(pinned)), pinned)
            }
            Work::DtoH { dst, len, .. } => {
                let pinned = self.mem.is_pinned(dst.0 as usize, *len);
                (Some(Engine::DtoH), transfer_ns(*len, rate(pinned)), pinned)
            }
            Work::DtoD { len, .. } => {
                (Some(Engine::Compute), transfer_ns(*len, DEVICE_GBPS), false)
            }
            Work::Memset { elem, count, .. } => (
                Some(Engine::Compute),
                transfer_ns(*elem as usize * count, DEVICE_GBPS),
                false,
            ),
            Work::Record { .. } | Work::WaitEvent { .. } => (None, 0, false),
        }
    }

    fn count(&mut self, w: &Work, pinned: bool) {
        let st = &mut self.stats;
        match w {
            Work::Kernel { .. } => st.kernels_run += 1,
            Work::HtoD { len, .. } if pinned => st.htod_dma_bytes += *len as u64,
            Work::HtoD { len, .. } => st.htod_pageable_bytes += *len as u64,
            Work::DtoH { len, .. } if pinned => st.dtoh_dma_bytes += *len as u64,
            Work::DtoH { len, .. } => st.dtoh_pageable_bytes += *len as u64,
            Work::DtoD { len, .. } => st.dtod_bytes += *len as u64,
            Work::Memset { elem, count, .. } => st.memset_bytes += (*elem as usize * count) as u64,
            Work::Record { .. } | Work::WaitEvent { .. } => {}
        }
    }

    /// Puts `work`, issued at `issued`, on stream `s`'s timeline, starting no earlier than
    /// `not_before`. Returns its end.
    pub fn enqueue(&mut self, s: SRef, work: Work, issued: u64, not_before: u64) -> u64 {
        let ctx = self.ctx_of(s);
        let dev = self.contexts[&ctx].device;
        let mut start = issued
            .max(not_before)
            .max(self.last_end(s))
            .max(self.implicit_dep(s));
        if let Work::WaitEvent { event } = &work {
            if let Some(EvState::At(t)) = self.events.get(event).map(|e| e.state) {
                start = start.max(t);
            }
        }
        let (engine, duration, pinned) = self.cost(&work);
        if let Some(e) = engine {
            start = self.devices[dev]
                .engine(e)
                .place(start, duration, self.clock);
        }
        let end = start + duration;
        self.set_last_end(s, end);
        if let Some(c) = self.contexts.get_mut(&ctx) {
            c.all_end = c.all_end.max(end);
        }
        match &work {
            Work::Record { event } => {
                if let Some(ev) = self.events.get_mut(event) {
                    ev.state = EvState::At(end);
                }
                return end;
            }
            Work::WaitEvent { .. } => return end,
            _ => {}
        }
        self.count(&work, pinned);
        self.seq += 1;
        self.pending.push(Pending {
            end,
            seq: self.seq,
            ctx,
            compute_ns: if engine == Some(Engine::Compute) {
                duration
            } else {
                0
            },
            work,
        });
        self.stats.ops_enqueued += 1;
        self.stats.max_queued_ops = self.stats.max_queued_ops.max(self.pending.len() as u64);
        end
    }

    /// Issues `work` on `s` now: recorded if `s` is capturing (`Ok(None)`), else enqueued
    /// (`Ok(Some(end))`). Legacy-stream work while a blocking stream of its context captures
    /// is `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` and invalidates that capture.
    pub fn submit(&mut self, s: SRef, work: Work) -> Result<Option<u64>, CUresult> {
        self.submit_at(s, work, now())
    }

    /// [`Sim::submit`] for work issued at `issued` (a call that spent time before issuing).
    pub fn submit_at(&mut self, s: SRef, work: Work, issued: u64) -> Result<Option<u64>, CUresult> {
        match s {
            SRef::Id(id) => {
                let st = self.streams.get_mut(&id).ok_or(E::INVALID_HANDLE)?;
                if let Some(c) = st.capture.as_mut() {
                    if c.invalidated {
                        return Err(E::STREAM_CAPTURE_INVALIDATED);
                    }
                    let capture = c.id;
                    if let Work::Record { event } = &work {
                        if let Some(ev) = self.events.get_mut(event) {
                            ev.state = EvState::Captured(capture);
                        }
                    }
                    if let Some(c) = self.streams.get_mut(&id).and_then(|s| s.capture.as_mut()) {
                        c.nodes.push(work);
                    }
                    return Ok(None);
                }
            }
            SRef::Null(ctx) => self.refuse_null_join(ctx)?,
        }
        Ok(Some(self.enqueue(s, work, issued, 0)))
    }

    /// Legacy-stream work would make a capturing blocking stream of context `ctx` wait for
    /// it: `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`, and the capture is invalidated.
    pub fn refuse_null_join(&mut self, ctx: u64) -> Result<(), CUresult> {
        let mut joined = false;
        for st in self.streams.values_mut() {
            if st.ctx == ctx && !st.nonblocking {
                if let Some(c) = st.capture.as_mut() {
                    c.invalidated = true;
                    joined = true;
                }
            }
        }
        match joined {
            true => Err(E::STREAM_CAPTURE_IMPLICIT),
            false => Ok(()),
        }
    }

    /// Whether `s` is capturing.
    pub fn capturing(&self, s: SRef) -> bool {
        match s {
            SRef::Id(id) => self.streams.get(&id).is_some_and(|s| s.capture.is_some()),
            SRef::Null(_) => false,
        }
    }

    /// A call that may not run while context `ctx` captures in a mode that forbids it (global,
    /// or thread-local from the capturing thread): `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`,
    /// and those captures are invalidated.
    pub fn forbid_during_capture(&mut self, ctx: u64) -> Result<(), CUresult> {
        let me = std::thread::current().id();
        let mut hit = false;
        for st in self.streams.values_mut().filter(|s| s.ctx == ctx) {
            if let Some(c) = st.capture.as_mut() {
                if c.mode == 0 || (c.mode == 1 && c.thread == me) {
                    c.invalidated = true;
                    hit = true;
                }
            }
        }
        match hit {
            true => Err(E::STREAM_CAPTURE_UNSUPPORTED),
            false => Ok(()),
        }
    }

    /// Applies, in completion order, the effects of every op that ended by `t`.
    pub fn apply_due(&mut self, t: u64) {
        while self.pending.peek().is_some_and(|p| p.end <= t) {
            let Some(p) = self.pending.pop() else { break };
            self.stats.compute_busy_ns += p.compute_ns;
            if self.apply(&p.work).is_err() {
                self.stats.faults += 1;
                if let Some(c) = self.contexts.get_mut(&p.ctx) {
                    c.fault = Some(E::ILLEGAL_ADDRESS);
                }
            }
        }
    }

    fn apply(&mut self, w: &Work) -> Result<(), CUresult> {
        match w {
            Work::Kernel {
                add: Some((ptr, n, value)),
                ..
            } => self.mem.add_u32(*ptr, *n, *value),
            Work::HtoD {
                dst,
                src: HostSrc::Bytes(b),
                ..
            } => self.mem.write(*dst, b),
            Work::HtoD {
                dst,
                src: HostSrc::Ptr(p),
                len,
            } => {
                // SAFETY: the caller of the copy keeps its host memory valid until the copy
                // completes (CUDA's contract for asynchronous copies and graph nodes).
                unsafe { self.mem.write_from_host(*dst, p.0, *len) }
            }
            Work::DtoH { dst, src, len } => {
                // SAFETY: as above, for writing.
                unsafe { self.mem.read_to_host(*src, dst.0, *len) }
            }
            Work::DtoD { dst, src, len } => {
                let mut buf = vec![0u8; *len];
                self.mem.read(*src, &mut buf)?;
                self.mem.write(*dst, &buf)
            }
            Work::Memset {
                dst,
                value,
                elem,
                count,
            } => self.mem.fill(*dst, *value, *elem, *count),
            Work::Kernel { add: None, .. } | Work::Record { .. } | Work::WaitEvent { .. } => Ok(()),
        }
    }

    /// Enqueues a graph's nodes on `s` in order, the first no earlier than `not_before`.
    /// Returns the end of the last.
    pub fn launch_nodes(&mut self, nodes: &[Work], s: SRef, not_before: u64) -> u64 {
        let mut nb = not_before;
        let issued = now();
        for w in nodes {
            self.enqueue(s, w.clone(), issued, nb);
            nb = 0;
        }
        self.last_end(s).max(not_before)
    }
}
