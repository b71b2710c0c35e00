//! Building graphs node by node (`cuGraphAdd*Node`): each node becomes the operations a stream
//! capture of the same work would have recorded (`gpufuse_client::graph::Op`), appended to the
//! graph. Dependencies must name nodes already in the graph, so appending in the order nodes are
//! added is a valid order to replay them in; replay is sequential on the launch stream.
//! A 2-D or 3-D copy becomes one copy per row; a 2-D memset one memset per row.

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::{addr_of, addr_of_mut};

use gpufuse_client::graph::{CondKind, Op};
use gpufuse_client::state::Inner;

use crate::api::copy::{side, slice_rows, Memcpy3D};
use crate::api::graph::CUgraph;
use crate::api::launch::pack;
use crate::api::module::h;
use crate::ffi::{out, read, read_at};
use crate::global::session;
use crate::guard::guard;
use crate::status::{CUresult, INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED};

pub type CUgraphNode = *mut c_void;

/// The handle of node `index` (1-based: its last operation) of `graph`:
/// `(graph & 0xffff_ffff) << 16 | index`, as `cuGraphGetNodes` numbers them.
pub(crate) fn node_handle(graph: u64, index: u64) -> CUgraphNode {
    ((graph & 0xffff_ffff) << 16 | index) as usize as CUgraphNode
}

/// Appends `ops` to `graph` after checking `deps` name nodes of it; writes the new node's
/// handle (the graph and the index of its last operation, as `cuGraphGetNodes` numbers them).
///
/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn add(
    g: &mut Inner,
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    ops: Vec<Op>,
) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        if node.is_null() || (ndeps > 0 && deps.is_null()) {
            return Err(INVALID_VALUE);
        }
        let gh = h(graph);
        let graph_ops = g.graph_mut(gh).ok_or(INVALID_HANDLE)?.ops.len();
        for i in 0..ndeps {
            let dep = read_at(deps, i)? as usize as u64;
            let index = dep & 0xffff;
            if dep >> 16 != gh & 0xffff_ffff || index == 0 || index as usize > graph_ops {
                return Err(INVALID_VALUE);
            }
        }
        let graph_ref = g.graph_mut(gh).ok_or(INVALID_HANDLE)?;
        graph_ref.ops.extend(ops);
        // An empty node stands at the last operation so far (the index is never replayed alone).
        let index = graph_ref.ops.len().max(1) as u64;
        out(node, node_handle(gh, index))
    }
}

/// `CUDA_KERNEL_NODE_PARAMS_v2` (the v1 struct is its first 56 bytes); the node parameter
/// structs here are generated from NVIDIA's header.
pub(crate) type KernelNodeParams = gpufuse_cuda_types::structs::CUDA_KERNEL_NODE_PARAMS;
/// The launch a kernel node's parameters describe, its arguments packed now (as CUDA copies
/// them when the node is made or its parameters set).
///
/// # Safety
/// `p`'s argument pointers are the application's, valid as the CUDA API contract says.
pub(crate) unsafe fn launch_op(g: &mut Inner, p: &KernelNodeParams) -> Result<Op, CUresult> {
    let grid = [p.grid_dim_x, p.grid_dim_y, p.grid_dim_z];
    let block = [p.block_dim_x, p.block_dim_y, p.block_dim_z];
    if grid.contains(&0) || block.contains(&0) {
        return Err(INVALID_VALUE);
    }
    let handle = if p.func.is_null() { p.kern } else { p.func };
    let (function, layout) = g
        .launch_layout(handle as usize as u64)
        .map_err(|_| INVALID_HANDLE)?;
    // SAFETY: this function's contract: the argument pointers are valid.
    let params = unsafe {
        pack(
            &layout,
            p.kernel_params.cast_const().cast(),
            p.extra.cast_const().cast(),
        )
    }?;
    Ok(Op::Launch {
        function,
        grid,
        block,
        shared_mem: p.shared_mem_bytes,
        params,
        attributes: Vec::new(),
    })
}

/// Kernel node parameters in the v1 layout (`CUDA_KERNEL_NODE_PARAMS_v1`: everything up to
/// `extra`), widened to the v2 struct.
///
/// # Safety
/// `params` is the application's pointer to a v1 struct.
pub(crate) unsafe fn read_v1(params: *const c_void) -> Result<KernelNodeParams, CUresult> {
    // SAFETY: this function's contract.
    let v1 = unsafe { read(params.cast::<[u8; 56]>()) }?;
    let mut bytes = [0u8; std::mem::size_of::<KernelNodeParams>()];
    bytes[..56].copy_from_slice(&v1);
    // SAFETY: a local buffer of the struct's size; every bit pattern is a valid struct of
    // integers and pointers.
    unsafe { read(bytes.as_ptr().cast::<KernelNodeParams>()) }
}

/// # Safety
/// The pointer arguments are an exported call's own, valid as the CUDA API contract says.
unsafe fn kernel_node(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    p: KernelNodeParams,
) -> Result<(), CUresult> {
    let s = session()?;
    let mut g = s.lock();
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        let op = launch_op(&mut g, &p)?;
        add(&mut g, node, graph, deps, ndeps, vec![op])
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddKernelNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    params: *const c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe { kernel_node(node, graph, deps, ndeps, read_v1(params)?) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddKernelNode_v2(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    params: *const c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let p = read(params.cast::<KernelNodeParams>())?;
        kernel_node(node, graph, deps, ndeps, p)
    })
}

/// One operation per row of a 3-D copy (host-to-host copies have no operation: refused).
fn copy_ops(g: &Inner, p: &Memcpy3D) -> Result<Vec<Op>, CUresult> {
    let (src_rows, dst_rows) = slice_rows(g, p)?;
    let (w, rows, slices) = (p.width_in_bytes, p.height, p.depth.max(1));
    let mut ops = Vec::new();
    // As `cuMemcpy3D` itself: an empty extent copies nothing.
    if w == 0 || rows == 0 {
        return Ok(ops);
    }
    for z in 0..slices {
        for r in 0..rows {
            let sy = p.src_y + (p.src_z + z) * src_rows + r;
            let dy = p.dst_y + (p.dst_z + z) * dst_rows + r;
            let (src_dev, src, _) = side(
                g,
                p.src_memory_type,
                p.src_host as usize,
                p.src_device,
                p.src_array,
                p.src_x_in_bytes,
                sy,
                p.src_pitch.max(w),
            )?;
            let (dst_dev, dst, _) = side(
                g,
                p.dst_memory_type,
                p.dst_host as usize,
                p.dst_device,
                p.dst_array,
                p.dst_x_in_bytes,
                dy,
                p.dst_pitch.max(w),
            )?;
            ops.push(match (src_dev, dst_dev) {
                (false, true) => Op::HtoD {
                    dst,
                    src_host: src as usize,
                    len: w,
                },
                (true, false) => Op::DtoH {
                    dst_host: dst as usize,
                    src,
                    len: w,
                },
                (true, true) => Op::DtoD {
                    dst,
                    src,
                    len: w as u64,
                },
                (false, false) => return Err(NOT_SUPPORTED),
            });
        }
    }
    Ok(ops)
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemcpyNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    params: *const Memcpy3D,
    _ctx: *mut c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let p = read(params)?;
        let s = session()?;
        let mut g = s.lock();
        let ops = copy_ops(&g, &p)?;
        add(&mut g, node, graph, deps, ndeps, ops)
    })
}

/// `CUDA_MEMSET_NODE_PARAMS`.
type MemsetNodeParams = gpufuse_cuda_types::structs::CUDA_MEMSET_NODE_PARAMS;

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemsetNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    params: *const c_void,
    _ctx: *mut c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let p = read(params.cast::<MemsetNodeParams>())?;
        let elem_size = match p.element_size {
            1 | 2 | 4 => p.element_size as u8,
            _ => return Err(INVALID_VALUE),
        };
        let row_bytes = p
            .width
            .checked_mul(p.element_size as usize)
            .ok_or(INVALID_VALUE)?;
        if p.height > 1 && p.pitch < row_bytes {
            return Err(INVALID_VALUE);
        }
        let ops = (0..p.height.max(1))
            .map(|r| Op::Memset {
                dst: p.dst + (r * p.pitch) as u64,
                value: p.value,
                elem_size,
                count: p.width as u64,
            })
            .collect();
        let s = session()?;
        let mut g = s.lock();
        add(&mut g, node, graph, deps, ndeps, ops)
    })
}

/// `CUDA_HOST_NODE_PARAMS`.
type HostNodeParams = gpufuse_cuda_types::structs::CUDA_HOST_NODE_PARAMS;

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddHostNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    params: *const c_void,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let p = read(params.cast::<HostNodeParams>())?;
        if p.r#fn.is_null() {
            return Err(INVALID_VALUE);
        }
        let op = Op::HostFn {
            func: p.r#fn as usize,
            user: p.user_data as usize,
        };
        let s = session()?;
        let mut g = s.lock();
        add(&mut g, node, graph, deps, ndeps, vec![op])
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddEmptyNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = session()?;
        let mut g = s.lock();
        add(&mut g, node, graph, deps, ndeps, Vec::new())
    })
}

/// Edges: a graph is replayed in the order its nodes were added, so an edge from an earlier
/// node to a later one holds already; one that would need reordering is refused.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddDependencies(
    graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    count: usize,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = session()?;
        let g = s.lock();
        let gh = h(graph);
        if !g.has_graph(gh) {
            return Err(INVALID_HANDLE);
        }
        for i in 0..count {
            let (a, b) = (
                read_at(from, i)? as usize as u64,
                read_at(to, i)? as usize as u64,
            );
            if a >> 16 != gh & 0xffff_ffff || b >> 16 != gh & 0xffff_ffff {
                return Err(INVALID_VALUE);
            }
            if a & 0xffff >= b & 0xffff {
                return Err(NOT_SUPPORTED);
            }
        }
        Ok(())
    })
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS`: the pool's properties, access descriptors, size, and the
/// address (out).
pub type MemAllocNodeParams = gpufuse_cuda_types::structs::CUDA_MEM_ALLOC_NODE_PARAMS;

const ALLOCATION_TYPE_PINNED: c_uint = 1;
const LOCATION_TYPE_DEVICE: c_uint = 1;

/// The operation a node stands for (its handle holds the graph and the index of its last
/// operation).
pub(crate) fn node_op(g: &Inner, node: CUgraphNode) -> Result<Op, CUresult> {
    let n = node as usize as u64;
    let graph = g.graph_of_node(n).ok_or(INVALID_HANDLE)?;
    let index = (n & 0xffff) as usize;
    index
        .checked_sub(1)
        .and_then(|i| graph.ops.get(i))
        .cloned()
        .ok_or(INVALID_HANDLE)
}

/// `cuGraphAddMemAllocNode`: the allocation's address is fixed now and written to
/// `params.dptr`; its memory is reserved for the graph until the graph and its executables
/// are destroyed (`gpufuse_client::graph::GraphAlloc`).
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    params: *mut MemAllocNodeParams,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let mut p = read(params)?;
        if p.pool_props.alloc_type as c_uint != ALLOCATION_TYPE_PINNED
            || p.pool_props.location.r#type as c_uint != LOCATION_TYPE_DEVICE
            || p.pool_props.handle_types != 0
            || p.bytesize == 0
        {
            return Err(INVALID_VALUE);
        }
        let s = session()?;
        let mut g = s.lock();
        if !g.has_graph(h(graph)) {
            return Err(INVALID_HANDLE);
        }
        let device = u32::try_from(p.pool_props.location.id).map_err(|_| INVALID_VALUE)?;
        let pool = crate::api::memory::device_pool(device);
        let ptr = g
            .graph_alloc_node(p.bytesize as u64, pool)
            .map_err(crate::global::client_err)?;
        let op = Op::MemAlloc {
            ptr,
            size: p.bytesize as u64,
        };
        if let Err(e) = add(&mut g, node, graph, deps, ndeps, vec![op]) {
            g.forget_graph_allocation(ptr);
            drop(g);
            crate::api::memory::free(ptr)?;
            return Err(e);
        }
        p.dptr = ptr;
        crate::ffi::out(params, p)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphMemAllocNodeGetParams(
    node: CUgraphNode,
    params: *mut MemAllocNodeParams,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = session()?;
        let g = s.lock();
        let Op::MemAlloc { ptr, size } = node_op(&g, node)? else {
            return Err(INVALID_VALUE);
        };
        let device = g
            .allocation(ptr)
            .and_then(|a| a.pool())
            .and_then(|p| g.pool_device(p).ok())
            .unwrap_or(0);
        out(
            params,
            MemAllocNodeParams {
                pool_props: gpufuse_cuda_types::structs::CUmemPoolProps {
                    alloc_type: ALLOCATION_TYPE_PINNED as c_int,
                    handle_types: 0,
                    location: gpufuse_cuda_types::structs::CUmemLocation {
                        r#type: LOCATION_TYPE_DEVICE as c_int,
                        id: device as c_int,
                    },
                    win32_security_attributes: std::ptr::null_mut(),
                    max_size: 0,
                    usage: 0,
                    reserved: [0; 54],
                },
                access_descs: std::ptr::null(),
                access_desc_count: 0,
                bytesize: size as usize,
                dptr: ptr,
            },
        )
    })
}

/// `cuGraphAddMemFreeNode`: of a graph allocation only, as CUDA requires.
#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    dptr: u64,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = session()?;
        let mut g = s.lock();
        if !g.is_graph_allocation(dptr) {
            return Err(INVALID_VALUE);
        }
        add(
            &mut g,
            node,
            graph,
            deps,
            ndeps,
            vec![Op::MemFree { ptr: dptr }],
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphMemFreeNodeGetParams(
    node: CUgraphNode,
    dptr: *mut u64,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = session()?;
        let g = s.lock();
        match node_op(&g, node)? {
            Op::MemFree { ptr } => out(dptr, ptr),
            _ => Err(INVALID_VALUE),
        }
    })
}

/// Graph memory is reserved per allocation and released with its graphs: nothing to trim.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGraphMemTrim(device: c_int) -> CUresult {
    guard(|| {
        let s = session()?;
        s.attribute(device, 16).map(|_| ()).ok_or(INVALID_VALUE)
    })
}

const GRAPH_MEM_USED_CURRENT: c_int = 0;
const GRAPH_MEM_USED_HIGH: c_int = 1;
const GRAPH_MEM_RESERVED_CURRENT: c_int = 2;
const GRAPH_MEM_RESERVED_HIGH: c_int = 3;

/// High watermarks of graph memory (used, reserved), reset by `cuDeviceSetGraphMemAttribute`.
static GRAPH_MEM_HIGH: std::sync::Mutex<(u64, u64)> = std::sync::Mutex::new((0, 0));

/// `CU_GRAPH_MEM_ATTR_*`: used is the memory of live graph allocations, reserved that of
/// every graph allocation (all devices together; the emulated GPUs of a session share them).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetGraphMemAttribute(
    device: c_int,
    attr: c_int,
    value: *mut u64,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = session()?;
        s.attribute(device, 16).ok_or(INVALID_VALUE)?;
        let g = s.lock();
        let (reserved, used) = g.graph_memory();
        let mut high = GRAPH_MEM_HIGH.lock().unwrap_or_else(|e| e.into_inner());
        high.0 = high.0.max(used);
        high.1 = high.1.max(reserved);
        out(
            value,
            match attr {
                GRAPH_MEM_USED_CURRENT => used,
                GRAPH_MEM_USED_HIGH => high.0,
                GRAPH_MEM_RESERVED_CURRENT => reserved,
                GRAPH_MEM_RESERVED_HIGH => high.1,
                _ => return Err(INVALID_VALUE),
            },
        )
    })
}

/// Only the high watermarks can be set, and only to 0 (as CUDA allows).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceSetGraphMemAttribute(
    device: c_int,
    attr: c_int,
    value: *const u64,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let s = session()?;
        s.attribute(device, 16).ok_or(INVALID_VALUE)?;
        if read(value)? != 0 {
            return Err(INVALID_VALUE);
        }
        let mut high = GRAPH_MEM_HIGH.lock().unwrap_or_else(|e| e.into_inner());
        match attr {
            GRAPH_MEM_USED_HIGH => high.0 = 0,
            GRAPH_MEM_RESERVED_HIGH => high.1 = 0,
            _ => return Err(INVALID_VALUE),
        }
        Ok(())
    })
}

/// `CUgraphNodeParams`: the node type, then (at byte 16) the type's parameters, 256 bytes in
/// all (generated from `cuda.h`).
pub type NodeParams = gpufuse_cuda_types::structs::CUgraphNodeParams;
type ConditionalParams = gpufuse_cuda_types::structs::CUDA_CONDITIONAL_NODE_PARAMS;
type MemcpyNodeParams = gpufuse_cuda_types::structs::CUDA_MEMCPY_NODE_PARAMS;
type MemsetNodeParamsV2 = gpufuse_cuda_types::structs::CUDA_MEMSET_NODE_PARAMS_v2;

const NODE_KERNEL: c_uint = 0;
const NODE_MEMCPY: c_uint = 1;
const NODE_MEMSET: c_uint = 2;
const NODE_HOST: c_uint = 3;
const NODE_EMPTY: c_uint = 5;
const NODE_MEM_ALLOC: c_uint = 10;
const NODE_MEM_FREE: c_uint = 11;
const NODE_CONDITIONAL: c_uint = 13;

/// `CUDA_CONDITIONAL_NODE_PARAMS`: the handle, the type and number of bodies, then
/// `phGraph_out`, which the driver fills with the node's body graphs, and the context. The
/// array it points to is the node's own and lives as long as the node.
///
/// # Safety
/// `params` points to the application's node parameters, writable.
unsafe fn conditional_node(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    params: *mut ConditionalParams,
) -> Result<(), CUresult> {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        let p = read(params)?;
        let (handle, kind, size) = (p.handle, p.r#type as u32, p.size);
        let kind = CondKind::from_driver(kind, size).ok_or(INVALID_VALUE)?;
        let s = session()?;
        let mut g = s.lock();
        let op = g
            .conditional_node(handle, kind, size as usize)
            .map_err(crate::global::client_err)?;
        let Op::Conditional { bodies, .. } = &op else {
            return Err(INVALID_VALUE);
        };
        let (array, made) = (bodies.as_ptr(), bodies.to_vec());
        if let Err(e) = add(&mut g, node, graph, deps, ndeps, vec![op]) {
            for b in made {
                let _ = g.destroy_graph(b);
            }
            return Err(e);
        }
        // SAFETY: `params` was read above (non-NULL); the caller's contract makes it writable.
        let slot = addr_of_mut!((*params).ph_graph_out);
        out(slot, array.cast_mut().cast::<CUgraph>())
    }
}

/// `cuGraphConditionalHandleCreate`: a handle for conditional nodes of `graph`, whose value
/// starts at `default` (and is set to it at every launch with `CU_GRAPH_COND_ASSIGN_DEFAULT`).
#[no_mangle]
pub unsafe extern "C" fn cuGraphConditionalHandleCreate(
    handle: *mut u64,
    graph: CUgraph,
    _ctx: *mut c_void,
    default: c_uint,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        if handle.is_null() || flags & !COND_ASSIGN_DEFAULT != 0 {
            return Err(INVALID_VALUE);
        }
        let s = session()?;
        let mut g = s.lock();
        let made = g
            .create_conditional_handle(h(graph), default, flags & COND_ASSIGN_DEFAULT != 0)
            .map_err(crate::global::client_err)?;
        out(handle, made)
    })
}

/// `CU_GRAPH_COND_ASSIGN_DEFAULT`.
const COND_ASSIGN_DEFAULT: c_uint = 1;

/// `cuGraphAddNode` with the generic parameters: each node type the graphs replay (kernel,
/// memcpy, memset, host, empty, memory allocation and free) goes to its own `cuGraphAdd*Node`,
/// conditional nodes (IF, WHILE, SWITCH) to [`conditional_node`]; other types (child graphs,
/// events, semaphores, batch memory operations) are `CUDA_ERROR_NOT_SUPPORTED`.
unsafe fn add_node(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    params: *mut NodeParams,
) -> CUresult {
    if params.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: the application passes a CUgraphNodeParams: the type, then the union of every
    // type's parameters. Each arm hands its own member to that type's entry point; where an
    // entry point takes an older version of the struct, the newer one begins with its fields.
    unsafe {
        let u = std::ptr::addr_of_mut!((*params).anon2);
        match (*params).r#type as c_uint {
            NODE_KERNEL => {
                cuGraphAddKernelNode_v2(node, graph, deps, ndeps, addr_of_mut!((*u).kernel).cast())
            }
            NODE_MEMCPY => {
                let m: *mut MemcpyNodeParams = addr_of_mut!((*u).memcpy);
                let ctx = (*m).copy_ctx;
                cuGraphAddMemcpyNode(node, graph, deps, ndeps, addr_of!((*m).copy_params), ctx)
            }
            NODE_MEMSET => {
                let m: *mut MemsetNodeParamsV2 = addr_of_mut!((*u).memset);
                let ctx = (*m).ctx;
                cuGraphAddMemsetNode(node, graph, deps, ndeps, m.cast(), ctx)
            }
            NODE_HOST => cuGraphAddHostNode(node, graph, deps, ndeps, addr_of!((*u).host).cast()),
            NODE_EMPTY => cuGraphAddEmptyNode(node, graph, deps, ndeps),
            NODE_MEM_ALLOC => {
                cuGraphAddMemAllocNode(node, graph, deps, ndeps, addr_of_mut!((*u).alloc).cast())
            }
            NODE_MEM_FREE => cuGraphAddMemFreeNode(node, graph, deps, ndeps, (*u).free.dptr),
            NODE_CONDITIONAL => {
                guard(|| conditional_node(node, graph, deps, ndeps, addr_of_mut!((*u).conditional)))
            }
            _ => NOT_SUPPORTED,
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    params: *mut NodeParams,
) -> CUresult {
    // SAFETY: the application's pointers, as the driver takes them.
    unsafe { add_node(node, graph, deps, ndeps, params) }
}

/// `CUgraphEdgeData`: ports and type of an edge.
pub type EdgeData = gpufuse_cuda_types::structs::CUgraphEdgeData;

/// The `_v2`/`_v3` forms carry edge data: only default edges (full completion, ports 0) are
/// replayed; programmatic ports are `CUDA_ERROR_NOT_SUPPORTED`.
unsafe fn add_node_edges(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    edges: *const EdgeData,
    ndeps: usize,
    params: *mut NodeParams,
) -> CUresult {
    // SAFETY: the caller vouches for the pointer arguments (# Safety).
    unsafe {
        if !edges.is_null() {
            for i in 0..ndeps {
                match read_at(edges, i) {
                    Ok(e) if e.from_port == 0 && e.to_port == 0 && e.r#type == 0 => {}
                    Ok(_) => return NOT_SUPPORTED,
                    Err(e) => return e,
                }
            }
        }
        // SAFETY: as for cuGraphAddNode.
        {
            add_node(node, graph, deps, ndeps, params)
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode_v2(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    edges: *const EdgeData,
    ndeps: usize,
    params: *mut NodeParams,
) -> CUresult {
    // SAFETY: the application's pointers.
    unsafe { add_node_edges(node, graph, deps, edges, ndeps, params) }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode_v3(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    edges: *const EdgeData,
    ndeps: usize,
    params: *mut NodeParams,
) -> CUresult {
    // SAFETY: the application's pointers.
    unsafe { add_node_edges(node, graph, deps, edges, ndeps, params) }
}

/// The kernel launch a kernel node stands for, to change its attributes.
fn kernel_node_attributes(
    g: &mut Inner,
    node: CUgraphNode,
) -> Result<&mut Vec<(u32, [u64; 8])>, CUresult> {
    let n = node as usize as u64;
    let graph = g.graph_of_node_mut(n).ok_or(INVALID_HANDLE)?;
    let index = (n & 0xffff) as usize;
    match index.checked_sub(1).and_then(|i| graph.ops.get_mut(i)) {
        Some(Op::Launch { attributes, .. }) => Ok(attributes),
        Some(_) => Err(INVALID_VALUE),
        None => Err(INVALID_HANDLE),
    }
}

/// `CU_LAUNCH_ATTRIBUTE_COOPERATIVE`: a kernel node may be cooperative.
const KERNEL_ATTR_COOPERATIVE: c_uint = 2;

/// Kernel-node attributes: those a stream takes (an access-policy window, checked as the
/// driver checks it; priority; memory sync domains) and cooperative; kept with the node's
/// launch, which sends them like `cuLaunchKernelEx` does.
#[no_mangle]
pub unsafe extern "C" fn cuGraphKernelNodeSetAttribute(
    node: CUgraphNode,
    attr: c_uint,
    value: *const [u64; 8],
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let v = read(value)?;
        if attr != KERNEL_ATTR_COOPERATIVE {
            crate::api::stream::check_attr(attr, &v)?;
        }
        let s = session()?;
        let mut g = s.lock();
        let attrs = kernel_node_attributes(&mut g, node)?;
        match attrs.iter_mut().find(|(id, _)| *id == attr) {
            Some(slot) => slot.1 = v,
            None => attrs.push((attr, v)),
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphKernelNodeGetAttribute(
    node: CUgraphNode,
    attr: c_uint,
    value: *mut [u64; 8],
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        if attr != KERNEL_ATTR_COOPERATIVE {
            crate::api::stream::check_attr(attr, &[0; 8])?;
        }
        let s = session()?;
        let mut g = s.lock();
        let attrs = kernel_node_attributes(&mut g, node)?;
        let v = attrs
            .iter()
            .find(|(id, _)| *id == attr)
            .map_or([0; 8], |&(_, v)| v);
        out(value, v)
    })
}

include!(concat!(env!("OUT_DIR"), "/aliases_graph_nodes.rs"));
