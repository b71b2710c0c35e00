//! Launches, streams, events, stream capture and graphs.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

use gpufuse_cuda_types::{short as E, CUresult};

use super::Handle;
use crate::ffi;
use crate::guard::{call, Flow, Need, Res};
use crate::state::{
    handle, id_of, Capture, EvState, Event, Exec, KernelKind, Kind, SRef, Sim, Stream,
    EVENT_DISABLE_TIMING,
};
use crate::tables;
use crate::timeline::Work;

/// `CU_STREAM_NON_BLOCKING`.
const STREAM_NON_BLOCKING: c_uint = 0x1;
/// `CU_EVENT_WAIT_EXTERNAL`.
const EVENT_WAIT_EXTERNAL: c_uint = 0x1;

fn u32_at(buf: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([buf[off], buf[off + 1], buf[off + 2], buf[off + 3]])
}

/// A launch's common part, with its parameters already packed.
///
/// # Safety
/// `params` and `extra` must be as cuda.h documents for `cuLaunchKernel`.
#[allow(clippy::too_many_arguments)]
unsafe fn launch(
    s: &mut Sim,
    func: Handle,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    cooperative: bool,
) -> Res {
    let id = s.function_id(func)?;
    let sref = s.stream(stream)?;
    let f = &s.functions[&id];
    let grid_ok = grid.iter().all(|&g| g >= 1)
        && grid[0] <= i32::MAX as u32
        && grid[1] <= 65535
        && grid[2] <= 65535;
    let block_ok =
        block.iter().all(|&b| b >= 1) && block[0] <= 1024 && block[1] <= 1024 && block[2] <= 64;
    let threads = block.iter().map(|&b| b as u64).product::<u64>();
    if !grid_ok || !block_ok || threads > f.max_threads as u64 {
        return Err(E::INVALID_VALUE);
    }
    if shared as u64 > f.max_dynamic_shared {
        return Err(E::INVALID_VALUE);
    }
    if cooperative {
        let blocks = grid.iter().map(|&g| g as u64).product::<u64>();
        let resident = tables::occupancy(threads as u32, f.static_shared + shared as u64) as u64
            * tables::SMS as u64;
        if blocks > resident {
            return Err(E::COOPERATIVE_LAUNCH_TOO_LARGE);
        }
    }
    // SAFETY: `params` and `extra` are as cuda.h documents (the contract).
    let buf = unsafe { ffi::kernel_params(&f.params, f.params_size(), params, extra) }?;
    let add = match f.kind {
        KernelKind::AddU32 => {
            let (p, n, v) = (f.params[0].0, f.params[1].0, f.params[2].0);
            let ptr = u64::from(u32_at(&buf, p)) | (u64::from(u32_at(&buf, p + 4)) << 32);
            Some((ptr, u32_at(&buf, n), u32_at(&buf, v)))
        }
        KernelKind::Plain => None,
    };
    let duration = f.duration_ns;
    s.submit(sref, Work::Kernel { duration, add })?;
    s.stats.kernel_launches += 1;
    Ok(Flow::Done)
}

/// The capture of stream `s`, which must be capturing.
fn capture_mut(s: &mut Sim, sref: SRef) -> Option<&mut Capture> {
    match sref {
        SRef::Id(id) => s.streams.get_mut(&id).and_then(|st| st.capture.as_mut()),
        SRef::Null(_) => None,
    }
}

/// Invalidates `s`'s capture and answers `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, if it
/// captures.
fn refuse_if_capturing(s: &mut Sim, sref: SRef) -> Result<(), CUresult> {
    match capture_mut(s, sref) {
        Some(c) => {
            c.invalidated = true;
            Err(E::STREAM_CAPTURE_UNSUPPORTED)
        }
        None => Ok(()),
    }
}

export! {
    /// `cuLaunchKernel`: parameters by `kernelParams` or by the `extra` buffer.
    fn cuLaunchKernel(func: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: Handle, params: *mut *mut c_void, extra: *mut *mut c_void) {
        call(Need::Init, |s| {
            // SAFETY: `params` and `extra` are as cuda.h documents (this export's contract).
            unsafe { launch(s, func, [gx, gy, gz], [bx, by, bz], shared, stream, params, extra, false) }
        })
    }

    /// `cuLaunchCooperativeKernel`: every block must be resident at once.
    fn cuLaunchCooperativeKernel(func: Handle, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: Handle, params: *mut *mut c_void) {
        call(Need::Init, |s| {
            let no_extra = std::ptr::null_mut();
            // SAFETY: `params` is as cuda.h documents (this export's contract).
            unsafe { launch(s, func, [gx, gy, gz], [bx, by, bz], shared, stream, params, no_extra, true) }
        })
    }

    /// `cuStreamCreateWithPriority`: flags 0 (blocking) or `CU_STREAM_NON_BLOCKING`; the
    /// priority is clamped to the range, as the driver does.
    fn cuStreamCreateWithPriority(ph_stream: *mut Handle, flags: c_uint, _priority: c_int) {
        call(Need::Init, |s| {
            let ctx = s.current()?;
            if ph_stream.is_null() || flags & !STREAM_NON_BLOCKING != 0 {
                return Err(E::INVALID_VALUE);
            }
            let id = s.new_id();
            s.streams.insert(
                id,
                Stream {
                    ctx,
                    nonblocking: flags & STREAM_NON_BLOCKING != 0,
                    last_end: 0,
                    capture: None,
                },
            );
            // SAFETY: `ph_stream` is non-NULL and writable (this export's contract).
            unsafe { ffi::put(ph_stream, handle(Kind::Stream, id)) }?;
            Ok(Flow::Done)
        })
    }

    /// `cuStreamDestroy_v2`: returns at once; work already issued still completes.
    fn cuStreamDestroy_v2(stream: Handle) {
        call(Need::Init, |s| {
            let id = id_of(Kind::Stream, stream)
                .filter(|id| s.streams.contains_key(id))
                .ok_or(E::INVALID_HANDLE)?;
            if let Some(st) = s.streams.remove(&id) {
                if !st.nonblocking {
                    if let Some(c) = s.contexts.get_mut(&st.ctx) {
                        c.retired_blocking_end = c.retired_blocking_end.max(st.last_end);
                    }
                }
            }
            Ok(Flow::Done)
        })
    }

    /// `cuStreamSynchronize`: until the stream's last op completes (the legacy stream's: and
    /// the blocking streams' work before it).
    fn cuStreamSynchronize(stream: Handle) {
        call(Need::Init, |s| {
            let sref = s.stream(stream)?;
            s.stats.stream_synchronizes += 1;
            refuse_if_capturing(s, sref)?;
            Ok(Flow::Until {
                t: s.sync_target(sref),
                fault_ctx: Some(s.ctx_of(sref)),
            })
        })
    }

    /// `cuStreamQuery`: `CUDA_ERROR_NOT_READY` while work remains.
    fn cuStreamQuery(stream: Handle) {
        call(Need::Init, |s| {
            let sref = s.stream(stream)?;
            s.stats.stream_queries += 1;
            refuse_if_capturing(s, sref)?;
            if s.clock < s.sync_target(sref) {
                return Err(E::NOT_READY);
            }
            match s.take_fault(s.ctx_of(sref)) {
                Some(code) => Err(code),
                None => Ok(Flow::Done),
            }
        })
    }

    /// `cuStreamWaitEvent`: the stream's later work waits for the event's last record.
    fn cuStreamWaitEvent(stream: Handle, event: Handle, flags: c_uint) {
        call(Need::Init, |s| {
            let sref = s.stream(stream)?;
            let ev = s.event_id(event)?;
            if flags & !EVENT_WAIT_EXTERNAL != 0 {
                return Err(E::INVALID_VALUE);
            }
            let state = s.events[&ev].state;
            if let Some(c) = capture_mut(s, sref) {
                return match state {
                    EvState::Never => Ok(Flow::Done),
                    // Recorded earlier in this capture: already ordered (one stream).
                    EvState::Captured(id) if id == c.id => Ok(Flow::Done),
                    _ if flags & EVENT_WAIT_EXTERNAL != 0 => {
                        c.nodes.push(Work::WaitEvent { event: ev });
                        Ok(Flow::Done)
                    }
                    _ => {
                        c.invalidated = true;
                        Err(E::STREAM_CAPTURE_ISOLATION)
                    }
                };
            }
            match state {
                EvState::Never => Ok(Flow::Done),
                EvState::Captured(_) => Err(E::STREAM_CAPTURE_ISOLATION),
                EvState::At(_) => {
                    s.submit(sref, Work::WaitEvent { event: ev })?;
                    Ok(Flow::Done)
                }
            }
        })
    }

    /// `cuEventCreate`: flags `CU_EVENT_BLOCKING_SYNC`, `CU_EVENT_DISABLE_TIMING`,
    /// `CU_EVENT_INTERPROCESS` (with timing disabled).
    fn cuEventCreate(ph_event: *mut Handle, flags: c_uint) {
        call(Need::Init, |s| {
            s.current()?;
            if ph_event.is_null() || flags & !0x7 != 0 || (flags & 0x4 != 0 && flags & EVENT_DISABLE_TIMING == 0) {
                return Err(E::INVALID_VALUE);
            }
            let id = s.new_id();
            s.events.insert(
                id,
                Event {
                    flags,
                    state: EvState::Never,
                },
            );
            // SAFETY: `ph_event` is non-NULL and writable (this export's contract).
            unsafe { ffi::put(ph_event, handle(Kind::Event, id)) }?;
            Ok(Flow::Done)
        })
    }

    /// `cuEventRecord`: completes when the stream's work before it does.
    fn cuEventRecord(event: Handle, stream: Handle) {
        call(Need::Init, |s| {
            let ev = s.event_id(event)?;
            let sref = s.stream(stream)?;
            s.submit(sref, Work::Record { event: ev })?;
            Ok(Flow::Done)
        })
    }

    /// `cuEventQuery`: `CUDA_ERROR_NOT_READY` until the recorded work completes; success for
    /// an event never recorded.
    fn cuEventQuery(event: Handle) {
        call(Need::Init, |s| {
            let ev = s.event_id(event)?;
            s.stats.event_queries += 1;
            match s.events[&ev].state {
                EvState::Never => Ok(Flow::Done),
                EvState::Captured(_) => Err(E::STREAM_CAPTURE_UNSUPPORTED),
                EvState::At(t) if s.clock < t => Err(E::NOT_READY),
                EvState::At(_) => Ok(Flow::Done),
            }
        })
    }

    /// `cuEventSynchronize`: until the event completes.
    fn cuEventSynchronize(event: Handle) {
        call(Need::Init, |s| {
            let ev = s.event_id(event)?;
            s.stats.event_synchronizes += 1;
            match s.events[&ev].state {
                EvState::Never => Ok(Flow::Done),
                EvState::Captured(_) => Err(E::STREAM_CAPTURE_UNSUPPORTED),
                EvState::At(t) => Ok(Flow::Until { t, fault_ctx: None }),
            }
        })
    }

    /// `cuEventElapsedTime`: milliseconds between two completed events' times.
    fn cuEventElapsedTime(ms: *mut f32, start: Handle, end: Handle) {
        call(Need::Init, |s| {
            if ms.is_null() {
                return Err(E::INVALID_VALUE);
            }
            let (a, b) = (s.event_id(start)?, s.event_id(end)?);
            let (a, b) = (&s.events[&a], &s.events[&b]);
            if (a.flags | b.flags) & EVENT_DISABLE_TIMING != 0 {
                return Err(E::INVALID_HANDLE);
            }
            let (EvState::At(ta), EvState::At(tb)) = (a.state, b.state) else {
                return Err(E::INVALID_HANDLE);
            };
            if s.clock < ta.max(tb) {
                return Err(E::NOT_READY);
            }
            let elapsed = (tb as f64 - ta as f64) / 1e6;
            // SAFETY: `ms` is non-NULL and writable (this export's contract).
            unsafe { ffi::put(ms, elapsed as f32) }?;
            Ok(Flow::Done)
        })
    }

    /// `cuEventDestroy_v2`.
    fn cuEventDestroy_v2(event: Handle) {
        call(Need::Init, |s| {
            let ev = s.event_id(event)?;
            s.events.remove(&ev);
            Ok(Flow::Done)
        })
    }

    /// `cuStreamBeginCapture_v2`: modes global (0), thread-local (1), relaxed (2); not on the
    /// legacy stream.
    fn cuStreamBeginCapture_v2(stream: Handle, mode: c_int) {
        call(Need::Init, |s| {
            let sref = s.stream(stream)?;
            if !(0..=2).contains(&mode) {
                return Err(E::INVALID_VALUE);
            }
            let SRef::Id(id) = sref else {
                return Err(E::STREAM_CAPTURE_UNSUPPORTED);
            };
            if s.capturing(sref) {
                return Err(E::ILLEGAL_STATE);
            }
            let capture = s.new_id();
            if let Some(st) = s.streams.get_mut(&id) {
                st.capture = Some(Capture {
                    id: capture,
                    mode,
                    thread: std::thread::current().id(),
                    nodes: Vec::new(),
                    invalidated: false,
                });
            }
            Ok(Flow::Done)
        })
    }

    /// `cuStreamEndCapture`: the recorded work as a graph, or
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` (and a NULL graph).
    fn cuStreamEndCapture(stream: Handle, ph_graph: *mut Handle) {
        call(Need::Init, |s| {
            if ph_graph.is_null() {
                return Err(E::INVALID_VALUE);
            }
            let sref = s.stream(stream)?;
            let c = capture_mut(s, sref).ok_or(E::ILLEGAL_STATE)?;
            if c.mode != 2 && c.thread != std::thread::current().id() {
                return Err(E::STREAM_CAPTURE_WRONG_THREAD);
            }
            let SRef::Id(id) = sref else {
                return Err(E::ILLEGAL_STATE);
            };
            let Some(c) = s.streams.get_mut(&id).and_then(|st| st.capture.take()) else {
                return Err(E::ILLEGAL_STATE);
            };
            if c.invalidated {
                // SAFETY: `ph_graph` is non-NULL and writable (this export's contract).
                unsafe { ffi::put(ph_graph, std::ptr::null_mut()) }?;
                return Err(E::STREAM_CAPTURE_INVALIDATED);
            }
            let g = s.new_id();
            s.graphs.insert(g, Arc::new(c.nodes));
            // SAFETY: `ph_graph` is non-NULL and writable (this export's contract).
            unsafe { ffi::put(ph_graph, handle(Kind::Graph, g)) }?;
            Ok(Flow::Done)
        })
    }

    /// `cuGraphInstantiateWithFlags`.
    fn cuGraphInstantiateWithFlags(ph_exec: *mut Handle, graph: Handle, flags: u64) {
        call(Need::Init, |s| {
            if ph_exec.is_null() || flags & !0xf != 0 {
                return Err(E::INVALID_VALUE);
            }
            let g = id_of(Kind::Graph, graph)
                .and_then(|g| s.graphs.get(&g))
                .cloned()
                .ok_or(E::INVALID_HANDLE)?;
            let id = s.new_id();
            s.execs.insert(id, Exec { nodes: g, last_end: 0 });
            // SAFETY: `ph_exec` is non-NULL and writable (this export's contract).
            unsafe { ffi::put(ph_exec, handle(Kind::Exec, id)) }?;
            Ok(Flow::Done)
        })
    }

    /// `cuGraphLaunch`: every node on the stream, in order, in one call (into a capturing
    /// stream: recorded).
    fn cuGraphLaunch(exec: Handle, stream: Handle) {
        call(Need::Init, |s| {
            let id = id_of(Kind::Exec, exec)
                .filter(|id| s.execs.contains_key(id))
                .ok_or(E::INVALID_HANDLE)?;
            let sref = s.stream(stream)?;
            let (nodes, last) = (s.execs[&id].nodes.clone(), s.execs[&id].last_end);
            if let Some(c) = capture_mut(s, sref) {
                if c.invalidated {
                    return Err(E::STREAM_CAPTURE_INVALIDATED);
                }
                c.nodes.extend(nodes.iter().cloned());
            } else {
                if let SRef::Null(ctx) = sref {
                    s.refuse_null_join(ctx)?;
                }
                let end = s.launch_nodes(&nodes, sref, last);
                if let Some(e) = s.execs.get_mut(&id) {
                    e.last_end = end;
                }
            }
            s.stats.graph_launches += 1;
            Ok(Flow::Done)
        })
    }

    /// `cuGraphExecDestroy`.
    fn cuGraphExecDestroy(exec: Handle) {
        call(Need::Init, |s| {
            let id = id_of(Kind::Exec, exec)
                .filter(|id| s.execs.contains_key(id))
                .ok_or(E::INVALID_HANDLE)?;
            s.execs.remove(&id);
            Ok(Flow::Done)
        })
    }

    /// `cuGraphDestroy`: executable graphs made from it stay.
    fn cuGraphDestroy(graph: Handle) {
        call(Need::Init, |s| {
            let id = id_of(Kind::Graph, graph)
                .filter(|id| s.graphs.contains_key(id))
                .ok_or(E::INVALID_HANDLE)?;
            s.graphs.remove(&id);
            Ok(Flow::Done)
        })
    }
}
