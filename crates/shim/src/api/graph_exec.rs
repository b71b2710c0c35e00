//! Reading and changing what a graph or an executable graph runs
//! (`gpufuse_client::graph_update`): kernel nodes' parameters (`cuGraphKernelNodeGetParams`,
//! `cuGraphKernelNodeSetParams`, `cuGraphExecKernelNodeSetParams`) and a whole executable from
//! an edited graph (`cuGraphExecUpdate`).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use gpufuse_client::graph::Op;

use gpufuse_client::graph_update::UpdateRefused;

use crate::api::graph::{CUgraph, CUgraphExec};
use crate::api::graph_nodes::{
    launch_op, node_handle, node_op, read_v1, CUgraphNode, KernelNodeParams,
};
use crate::api::module::h;
use crate::ffi::{out, out_opt, read};
use crate::global::{client_err, session};
use crate::guard::guard;
use crate::status::{CUresult, INVALID_VALUE};

/// `CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE`.
const GRAPH_EXEC_UPDATE_FAILURE: CUresult = 910;

/// `CUgraphExecUpdateResultInfo`: the result, the node concerned and the node it came from.
#[repr(C)]
pub struct UpdateResultInfo {
    result: u32,
    error_node: CUgraphNode,
    error_from_node: CUgraphNode,
}

/// The arguments `cuGraphKernelNodeGetParams` hands out, per node: a copy of the packed
/// parameters and the array of pointers into it (addresses), kept until the node's next get.
type Args = (Box<[u8]>, Box<[usize]>);
static ARGS: Mutex<Option<HashMap<u64, Args>>> = Mutex::new(None);

/// A kernel node's parameters: its function, dimensions, and `kernelParams` pointing at a copy
/// of the arguments it was given (no `extra`, as the driver answers).
fn get_kernel(node: CUgraphNode) -> Result<KernelNodeParams, CUresult> {
    let s = session()?;
    let g = s.lock();
    let Op::Launch {
        function,
        grid,
        block,
        shared_mem,
        params,
        ..
    } = node_op(&g, node)?
    else {
        return Err(INVALID_VALUE);
    };
    let (_, layout) = g.launch_layout(function).map_err(client_err)?;
    let kernel = g.kernel_of(function);
    drop(g);
    let bytes: Box<[u8]> = params.into_boxed_slice();
    let base = bytes.as_ptr() as usize;
    let pointers: Box<[usize]> = layout.iter().map(|p| base + p.offset as usize).collect();
    let kernel_params = pointers.as_ptr() as *mut *mut c_void;
    // Moving the boxes moves no heap data: the addresses stay valid while they are kept.
    ARGS.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(node as usize as u64, (bytes, pointers));
    Ok(KernelNodeParams {
        func: function as usize as *mut c_void,
        grid_dim_x: grid[0],
        grid_dim_y: grid[1],
        grid_dim_z: grid[2],
        block_dim_x: block[0],
        block_dim_y: block[1],
        block_dim_z: block[2],
        shared_mem_bytes: shared_mem,
        kernel_params,
        extra: std::ptr::null_mut(),
        kern: kernel.map_or(std::ptr::null_mut(), |k| k as usize as *mut c_void),
        ctx: std::ptr::null_mut(),
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphKernelNodeGetParams_v2(
    node: CUgraphNode,
    params: *mut KernelNodeParams,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { out(params, get_kernel(node)?) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphKernelNodeGetParams(
    node: CUgraphNode,
    params: *mut c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let p = get_kernel(node)?;
        // The v1 struct: everything up to `extra` (56 bytes).
        let bytes = std::slice::from_raw_parts((&p as *const KernelNodeParams).cast::<u8>(), 56);
        out(
            params.cast::<[u8; 56]>(),
            <[u8; 56]>::try_from(bytes).map_err(|_| INVALID_VALUE)?,
        )
    })
}

/// # Safety
/// `p`'s argument pointers are the application's, valid as the CUDA API contract says.
unsafe fn set_kernel(
    exec: Option<u64>,
    node: CUgraphNode,
    p: KernelNodeParams,
) -> Result<(), CUresult> {
    let s = session()?;
    let mut g = s.lock();
    // SAFETY: this function's contract.
    let op = unsafe { launch_op(&mut g, &p) }?;
    g.set_kernel_node(exec, node as usize as u64, op)
        .map_err(client_err)
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphKernelNodeSetParams(
    node: CUgraphNode,
    params: *const c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { set_kernel(None, node, read_v1(params)?) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphKernelNodeSetParams_v2(
    node: CUgraphNode,
    params: *const c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { set_kernel(None, node, read(params.cast::<KernelNodeParams>())?) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecKernelNodeSetParams(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { set_kernel(Some(h(exec)), node, read_v1(params)?) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecKernelNodeSetParams_v2(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: *const c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        set_kernel(
            Some(h(exec)),
            node,
            read(params.cast::<KernelNodeParams>())?,
        )
    })
}

/// The update, and the node handle of the operation a refusal concerns.
fn update(exec: CUgraphExec, graph: CUgraph) -> Result<Result<(), (u32, CUgraphNode)>, CUresult> {
    let s = session()?;
    let mut g = s.lock();
    let outcome = g.update_exec(h(exec), h(graph)).map_err(client_err)?;
    Ok(outcome.map_err(|UpdateRefused { result, index }| {
        let node = index.map_or(std::ptr::null_mut(), |i| node_handle(h(graph), i as u64));
        (result, node)
    }))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecUpdate_v2(
    exec: CUgraphExec,
    graph: CUgraph,
    info: *mut UpdateResultInfo,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let (result, node, status) = match update(exec, graph)? {
            Ok(()) => (0, std::ptr::null_mut(), Ok(())),
            Err((r, n)) => (r, n, Err(GRAPH_EXEC_UPDATE_FAILURE)),
        };
        out_opt(
            info,
            UpdateResultInfo {
                result,
                error_node: node,
                error_from_node: std::ptr::null_mut(),
            },
        );
        status
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecUpdate(
    exec: CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    result: *mut u32,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        if result.is_null() {
            return Err(INVALID_VALUE);
        }
        let (r, node, status) = match update(exec, graph)? {
            Ok(()) => (0, std::ptr::null_mut(), Ok(())),
            Err((r, n)) => (r, n, Err(GRAPH_EXEC_UPDATE_FAILURE)),
        };
        out_opt(error_node, node);
        out_opt(result, r);
        status
    })
}
