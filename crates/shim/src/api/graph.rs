//! CUDA graphs: stream capture, instantiation and launch. Graphs live in the client
//! (`gpufuse_client::graph`); a launch replays the captured operations on the launch stream.

use std::ffi::{c_char, c_int, c_void};

use crate::api::module::h;
use crate::api::stream::CUstream;
use crate::ffi::{out, out_opt};
use crate::global::with_core;
use crate::guard::guard;
use crate::status::{CUresult, INVALID_VALUE};

pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;

const CAPTURE_STATUS_NONE: c_int = 0;
const CAPTURE_STATUS_ACTIVE: c_int = 1;

fn begin(stream: CUstream) -> Result<(), CUresult> {
    with_core(|g| g.begin_capture(h(stream)))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(stream: CUstream, _mode: c_int) -> CUresult {
    guard(|| begin(stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture(stream: CUstream) -> CUresult {
    guard(|| begin(stream))
}

/// `cuStreamBeginCaptureToGraph`: the stream's work is appended to an existing graph (after
/// its nodes: graphs replay in node order, so the given dependencies hold).
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCaptureToGraph(
    stream: CUstream,
    graph: CUgraph,
    _deps: *const c_void,
    _edges: *const c_void,
    _num_deps: usize,
    _mode: c_int,
) -> CUresult {
    guard(|| with_core(|g| g.begin_capture_to(h(stream), h(graph))))
}

/// A capture into an existing graph may end without asking for the graph back.
#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(stream: CUstream, pgraph: *mut CUgraph) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let (graph, existing) = with_core(|g| {
            let existing = g.captures_into_existing(h(stream))?;
            Ok((g.end_capture(h(stream))?, existing))
        })?;
        if pgraph.is_null() && existing {
            return Ok(());
        }
        out(pgraph, graph as usize as CUgraph)
    })
}

/// `cuStreamUpdateCaptureDependencies`: the captured graph replays in node order, so the
/// next captured work already follows every node added so far; only the stream's capture is
/// checked.
fn update_dependencies(stream: CUstream) -> Result<(), CUresult> {
    match with_core(|g| g.capture_graph(h(stream)))? {
        Some(_) => Ok(()),
        None => Err(INVALID_VALUE),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamUpdateCaptureDependencies(
    stream: CUstream,
    _deps: *const c_void,
    _num_deps: usize,
    _flags: u32,
) -> CUresult {
    guard(|| update_dependencies(stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamUpdateCaptureDependencies_v2(
    stream: CUstream,
    _deps: *const c_void,
    _edges: *const c_void,
    _num_deps: usize,
    _flags: u32,
) -> CUresult {
    guard(|| update_dependencies(stream))
}

/// The graph a capturing stream records into (null when it is not capturing).
fn capture_graph(stream: CUstream) -> Result<CUgraph, CUresult> {
    Ok(with_core(|g| g.capture_graph(h(stream)))?
        .map_or(std::ptr::null_mut(), |g| g as usize as CUgraph))
}

fn capture_info(stream: CUstream) -> Result<(c_int, u64), CUresult> {
    Ok(match with_core(|g| g.capture_info(h(stream)))? {
        Some(id) => (CAPTURE_STATUS_ACTIVE, id),
        None => (CAPTURE_STATUS_NONE, 0),
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: CUstream, status: *mut c_int) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(status, capture_info(stream)?.0) })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo(
    stream: CUstream,
    status: *mut c_int,
    id: *mut u64,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
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
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let (st, cid) = capture_info(stream)?;
        out_opt(id, cid);
        out_opt(graph, capture_graph(stream)?);
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
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let (st, cid) = capture_info(stream)?;
        out_opt(id, cid);
        out_opt(graph, capture_graph(stream)?);
        out_opt(deps, std::ptr::null());
        out_opt(edges, std::ptr::null());
        out_opt(num_deps, 0);
        out(status, st)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphCreate(pgraph: *mut CUgraph, _flags: u32) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let graph = with_core(|g| Ok(g.create_graph()))?;
        out(pgraph, graph as usize as CUgraph)
    })
}

/// `cuGraphClone`: a copy of the graph's nodes as they are now.
#[no_mangle]
pub unsafe extern "C" fn cuGraphClone(pclone: *mut CUgraph, graph: CUgraph) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let clone = with_core(|g| g.clone_graph(h(graph)))?;
        out(pclone, clone as usize as CUgraph)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    guard(|| with_core(|g| g.destroy_graph(h(graph))))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphGetNodes(
    graph: CUgraph,
    nodes: *mut *mut c_void,
    count: *mut usize,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let n = with_core(|g| g.graph_len(h(graph)))?;
        if !nodes.is_null() {
            let want = crate::ffi::read(count)?;
            for i in 0..want.min(n) {
                crate::ffi::write_at(
                    nodes,
                    i,
                    crate::api::graph_nodes::node_handle(h(graph), i as u64 + 1),
                )?;
            }
        }
        out(count, n)
    })
}
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn instantiate(pexec: *mut CUgraphExec, graph: CUgraph) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        if pexec.is_null() {
            return Err(INVALID_VALUE);
        }
        let exec = with_core(|g| g.instantiate(h(graph)))?;
        out(pexec, exec as usize as CUgraphExec)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate(
    pexec: *mut CUgraphExec,
    graph: CUgraph,
    _err_node: *mut *mut c_void,
    _log: *mut c_char,
    _log_size: usize,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { instantiate(pexec, graph) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    pexec: *mut CUgraphExec,
    graph: CUgraph,
    _err_node: *mut *mut c_void,
    _log: *mut c_char,
    _log_size: usize,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { instantiate(pexec, graph) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    pexec: *mut CUgraphExec,
    graph: CUgraph,
    _flags: u64,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { instantiate(pexec, graph) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    pexec: *mut CUgraphExec,
    graph: CUgraph,
    _params: *mut c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { instantiate(pexec, graph) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    guard(|| with_core(|g| g.destroy_exec(h(exec))))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphUpload(exec: CUgraphExec, stream: CUstream) -> CUresult {
    guard(|| with_core(|g| g.check_exec(h(exec), h(stream))))
}

fn launch(exec: CUgraphExec, stream: CUstream) -> Result<(), CUresult> {
    // SAFETY: CUDA requires the host memory and host functions a graph names to be valid
    // whenever it is launched.
    with_core(|g| unsafe { g.launch_graph(h(exec), h(stream)) })
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
