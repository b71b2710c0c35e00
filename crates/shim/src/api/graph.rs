//! CUDA graphs: stream capture, instantiation and launch. Graphs live in the client
//! (`gpufuse_client::graph`); a launch replays the captured operations on the launch stream.

use std::ffi::{c_char, c_int, c_void};

use gpufuse_client::graph::{Graph, Op};
use gpufuse_client::handles::{self, Kind};
use gpufuse_client::state::Inner;
use gpufuse_proto::Request;

use crate::api::context::client_err;
use crate::api::copy::{dtod, dtoh_async, htod};
use crate::api::launch::send_launch;
use crate::api::module::h;
use crate::api::stream::{stream_id, CUstream};
use crate::ffi::{out, out_opt};
use crate::global::session;
use crate::guard::guard;
use crate::status::{CUresult, INVALID_HANDLE, INVALID_VALUE, STREAM_CAPTURE_UNSUPPORTED};

pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;

const CAPTURE_STATUS_NONE: c_int = 0;
const CAPTURE_STATUS_ACTIVE: c_int = 1;
const STREAM_CAPTURE_INVALIDATED: CUresult = 901;
const STREAM_CAPTURE_UNMATCHED: CUresult = 902;

fn begin(stream: CUstream) -> Result<(), CUresult> {
    let s = session()?;
    let mut g = s.lock();
    let st = stream_id(&g, stream)?;
    if g.graphs.capturing(st).is_some() {
        return Err(STREAM_CAPTURE_UNSUPPORTED);
    }
    let graph = handles::mint(Kind::Graph);
    g.graphs.graphs.insert(graph, Graph::default());
    g.graphs.capturing.insert(st, graph);
    g.graphs.next_capture_id += 1;
    let id = g.graphs.next_capture_id;
    g.graphs.capture_ids.insert(st, id);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(stream: CUstream, _mode: c_int) -> CUresult {
    guard(|| begin(stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture(stream: CUstream) -> CUresult {
    guard(|| begin(stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(stream: CUstream, pgraph: *mut CUgraph) -> CUresult {
    guard(|| {
        let s = session()?;
        let mut g = s.lock();
        let st = stream_id(&g, stream)?;
        let graph = g.graphs.capturing(st).ok_or(STREAM_CAPTURE_UNMATCHED)?;
        g.graphs.capturing.retain(|_, gr| *gr != graph);
        g.graphs.captured_events.retain(|_, gr| *gr != graph);
        g.graphs.capture_ids.remove(&st);
        if !g.graphs.graphs.contains_key(&graph) {
            return Err(STREAM_CAPTURE_INVALIDATED);
        }
        out(pgraph, graph as usize as CUgraph)
    })
}

fn capture_info(stream: CUstream) -> Result<(c_int, u64), CUresult> {
    let s = session()?;
    let g = s.lock();
    let st = stream_id(&g, stream)?;
    Ok(match g.graphs.capturing(st) {
        Some(_) => (
            CAPTURE_STATUS_ACTIVE,
            g.graphs.capture_ids.get(&st).copied().unwrap_or(0),
        ),
        None => (CAPTURE_STATUS_NONE, 0),
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: CUstream, status: *mut c_int) -> CUresult {
    guard(|| out(status, capture_info(stream)?.0))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo(
    stream: CUstream,
    status: *mut c_int,
    id: *mut u64,
) -> CUresult {
    guard(|| {
        let (st, cid) = capture_info(stream)?;
        out_opt(id, cid);
        out(status, st)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2(
    stream: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const c_void,
    num_deps: *mut usize,
) -> CUresult {
    guard(|| {
        let (st, cid) = capture_info(stream)?;
        out_opt(id, cid);
        out_opt(graph, std::ptr::null_mut());
        out_opt(deps, std::ptr::null());
        out_opt(num_deps, 0);
        out(status, st)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3(
    stream: CUstream,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const c_void,
    edges: *mut *const c_void,
    num_deps: *mut usize,
) -> CUresult {
    guard(|| {
        let (st, cid) = capture_info(stream)?;
        out_opt(id, cid);
        out_opt(graph, std::ptr::null_mut());
        out_opt(deps, std::ptr::null());
        out_opt(edges, std::ptr::null());
        out_opt(num_deps, 0);
        out(status, st)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphCreate(pgraph: *mut CUgraph, _flags: u32) -> CUresult {
    guard(|| {
        let s = session()?;
        let graph = handles::mint(Kind::Graph);
        s.lock().graphs.graphs.insert(graph, Graph::default());
        out(pgraph, graph as usize as CUgraph)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    guard(|| {
        let s = session()?;
        let gone = {
            let mut g = s.lock();
            let removed = g.graphs.graphs.remove(&h(graph)).ok_or(INVALID_HANDLE)?;
            g.graphs.release(&removed)
        };
        crate::api::memory::free_graph_memory(gone)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphGetNodes(
    graph: CUgraph,
    nodes: *mut *mut c_void,
    count: *mut usize,
) -> CUresult {
    guard(|| {
        let s = session()?;
        let g = s.lock();
        let n = g
            .graphs
            .graphs
            .get(&h(graph))
            .ok_or(INVALID_HANDLE)?
            .ops
            .len();
        if !nodes.is_null() {
            let want = crate::ffi::read(count)?;
            for i in 0..want.min(n) {
                crate::ffi::write_at(
                    nodes,
                    i,
                    ((h(graph) & 0xffff_ffff) << 16 | (i as u64 + 1)) as usize as *mut c_void,
                )?;
            }
        }
        out(count, n)
    })
}

fn instantiate(pexec: *mut CUgraphExec, graph: CUgraph) -> Result<(), CUresult> {
    if pexec.is_null() {
        return Err(INVALID_VALUE);
    }
    let s = session()?;
    let mut g = s.lock();
    let ops = g
        .graphs
        .graphs
        .get(&h(graph))
        .ok_or(INVALID_HANDLE)?
        .clone();
    let exec = handles::mint(Kind::GraphExec);
    g.graphs.hold(&ops);
    g.graphs.execs.insert(exec, ops);
    out(pexec, exec as usize as CUgraphExec)
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate(
    pexec: *mut CUgraphExec,
    graph: CUgraph,
    _err_node: *mut *mut c_void,
    _log: *mut c_char,
    _log_size: usize,
) -> CUresult {
    guard(|| instantiate(pexec, graph))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    pexec: *mut CUgraphExec,
    graph: CUgraph,
    _err_node: *mut *mut c_void,
    _log: *mut c_char,
    _log_size: usize,
) -> CUresult {
    guard(|| instantiate(pexec, graph))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    pexec: *mut CUgraphExec,
    graph: CUgraph,
    _flags: u64,
) -> CUresult {
    guard(|| instantiate(pexec, graph))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    pexec: *mut CUgraphExec,
    graph: CUgraph,
    _params: *mut c_void,
) -> CUresult {
    guard(|| instantiate(pexec, graph))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    guard(|| {
        let s = session()?;
        let gone = {
            let mut g = s.lock();
            let removed = g.graphs.execs.remove(&h(exec)).ok_or(INVALID_HANDLE)?;
            g.graphs.release(&removed)
        };
        crate::api::memory::free_graph_memory(gone)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphUpload(exec: CUgraphExec, stream: CUstream) -> CUresult {
    guard(|| {
        let s = session()?;
        let g = s.lock();
        stream_id(&g, stream)?;
        g.graphs
            .execs
            .get(&h(exec))
            .map(|_| ())
            .ok_or(INVALID_HANDLE)
    })
}

/// Replays one captured operation on `stream`.
fn run(g: &mut Inner, stream: u64, op: Op) -> Result<(), CUresult> {
    match op {
        Op::Launch {
            function,
            grid,
            block,
            shared_mem,
            params,
            attributes,
        } => send_launch(
            g, function, grid, block, shared_mem, stream, params, attributes,
        ),
        Op::HtoD { dst, src_host, len } => htod(g, dst, src_host as *const c_void, len, stream),
        Op::DtoH { dst_host, src, len } => dtoh_async(g, dst_host as *mut c_void, src, len, stream),
        Op::DtoD { dst, src, len } => dtod(g, dst, src, len, stream),
        Op::Memset {
            dst,
            value,
            elem_size,
            count,
        } => {
            crate::api::managed::to_device(g)?;
            g.conn
                .quiet(&Request::Memset {
                    dst,
                    value,
                    elem_size,
                    count,
                    stream,
                })
                .map_err(client_err)
        }
        Op::EventRecord { event } => {
            if g.events.contains_key(&event) {
                g.conn
                    .quiet(&Request::EventRecord { event, stream })
                    .map_err(client_err)?;
            }
            Ok(())
        }
        Op::MemAlloc { ptr, .. } => {
            // A launch of a graph whose allocation is still live (not freed by a free node or
            // cuMemFreeAsync since the last launch) is refused, as CUDA refuses it.
            let a = g.graphs.allocations.get_mut(&ptr).ok_or(INVALID_VALUE)?;
            if a.live {
                return Err(INVALID_VALUE);
            }
            a.live = true;
            Ok(())
        }
        Op::MemFree { ptr } => {
            let a = g.graphs.allocations.get_mut(&ptr).ok_or(INVALID_VALUE)?;
            if !a.live {
                return Err(INVALID_VALUE);
            }
            a.live = false;
            Ok(())
        }
        Op::HostFn { func, user } => {
            g.conn
                .call(&Request::StreamSynchronize { stream })
                .map_err(client_err)?;
            // SAFETY: the application registered this host function and argument during capture
            // and CUDA calls it each time the graph runs.
            let f: unsafe extern "C" fn(*mut c_void) = unsafe { std::mem::transmute(func) };
            // SAFETY: see above.
            unsafe { f(user as *mut c_void) };
            Ok(())
        }
    }
}

fn launch(exec: CUgraphExec, stream: CUstream) -> Result<(), CUresult> {
    let s = session()?;
    let mut g = s.lock();
    let st = stream_id(&g, stream)?;
    let ops = g
        .graphs
        .execs
        .get(&h(exec))
        .ok_or(INVALID_HANDLE)?
        .ops
        .clone();
    for op in ops {
        run(&mut g, st, op)?;
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult {
    guard(|| launch(exec, stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    guard(|| launch(exec, stream))
}

include!(concat!(env!("OUT_DIR"), "/aliases_graph.rs"));
