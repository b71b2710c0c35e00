//! Graph operations of the session: stream capture, graphs made by hand, instantiation, and a
//! launch that replays an executable's operations on a stream through the same paths as the
//! operations themselves (so managed memory and staged copies behave the same).

use gpufuse_proto::Request;

use crate::error::ClientError;
use crate::graph::{CondHandle, CondKind, Graph, Op};
use crate::handles::{self, Kind};
use crate::launch::LaunchConfig;
use crate::state::Inner;
use crate::status::{
    INVALID_HANDLE, INVALID_VALUE, STREAM_CAPTURE_INVALIDATED, STREAM_CAPTURE_UNMATCHED,
    STREAM_CAPTURE_UNSUPPORTED,
};
use gpufuse_proto::{DevicePtr, StreamHandle};

impl Inner {
    /// `cuStreamBeginCapture` on stream handle `stream`.
    pub fn begin_capture(&mut self, stream: u64) -> Result<(), ClientError> {
        let st = self.stream_id(stream)?;
        if self.graphs.capturing(st).is_some() {
            return Err(STREAM_CAPTURE_UNSUPPORTED.into());
        }
        let graph = handles::mint(Kind::Graph);
        self.graphs.graphs.insert(graph, Graph::default());
        self.graphs.capturing.insert(st, graph);
        self.lanes_changed();
        self.graphs.next_capture_id += 1;
        let id = self.graphs.next_capture_id;
        self.graphs.capture_ids.insert(st, id);
        Ok(())
    }

    /// `cuStreamBeginCaptureToGraph`: stream handle `stream` captures into the existing
    /// graph `graph`, after its nodes (a graph is replayed in the order of its nodes).
    pub fn begin_capture_to(&mut self, stream: u64, graph: u64) -> Result<(), ClientError> {
        let st = self.stream_id(stream)?;
        if self.graphs.capturing(st).is_some() {
            return Err(STREAM_CAPTURE_UNSUPPORTED.into());
        }
        if !self.graphs.graphs.contains_key(&graph) {
            return Err(INVALID_HANDLE.into());
        }
        self.graphs.capturing.insert(st, graph);
        self.lanes_changed();
        self.graphs.captured_into.insert(graph);
        self.graphs.next_capture_id += 1;
        let id = self.graphs.next_capture_id;
        self.graphs.capture_ids.insert(st, id);
        Ok(())
    }

    /// Whether the capture on stream handle `stream` goes into a graph that existed before it
    /// (`cuStreamBeginCaptureToGraph`).
    pub fn captures_into_existing(&self, stream: u64) -> Result<bool, ClientError> {
        let st = self.stream_id(stream)?;
        Ok(self
            .graphs
            .capturing(st)
            .is_some_and(|g| self.graphs.captured_into.contains(&g)))
    }

    /// `cuStreamEndCapture`: the captured graph.
    pub fn end_capture(&mut self, stream: u64) -> Result<u64, ClientError> {
        let st = self.stream_id(stream)?;
        let graph = self
            .graphs
            .capturing(st)
            .ok_or(ClientError::Cuda(STREAM_CAPTURE_UNMATCHED))?;
        self.graphs.captured_into.remove(&graph);
        self.graphs.capturing.retain(|_, gr| *gr != graph);
        self.graphs.captured_events.retain(|_, gr| *gr != graph);
        self.graphs.capture_ids.remove(&st);
        if !self.graphs.graphs.contains_key(&graph) {
            return Err(STREAM_CAPTURE_INVALIDATED.into());
        }
        Ok(graph)
    }

    /// Whether stream handle `stream` is capturing, and its capture's id (0 when not).
    pub fn capture_info(&self, stream: u64) -> Result<Option<u64>, ClientError> {
        let st = self.stream_id(stream)?;
        Ok(self
            .graphs
            .capturing(st)
            .map(|_| self.graphs.capture_ids.get(&st).copied().unwrap_or(0)))
    }

    /// The graph stream handle `stream` is capturing into, if it is capturing.
    pub fn capture_graph(&self, stream: u64) -> Result<Option<u64>, ClientError> {
        let st = self.stream_id(stream)?;
        Ok(self.graphs.capturing(st))
    }

    /// `cuGraphCreate`: an empty graph.
    pub fn create_graph(&mut self) -> u64 {
        let graph = handles::mint(Kind::Graph);
        self.graphs.graphs.insert(graph, Graph::default());
        graph
    }

    /// How many operations (nodes) graph `graph` holds.
    pub fn graph_len(&self, graph: u64) -> Result<usize, ClientError> {
        Ok(self
            .graphs
            .graphs
            .get(&graph)
            .ok_or(INVALID_HANDLE)?
            .ops
            .len())
    }

    /// Graph `graph`, to add nodes to (`cuGraphAdd*Node`).
    pub fn graph_mut(&mut self, graph: u64) -> Option<&mut Graph> {
        self.graphs.graphs.get_mut(&graph)
    }

    /// The graph a node handle names (`(graph & 0xffff_ffff) << 16 | index`, the shim's
    /// node handles).
    pub fn graph_of_node(&self, node: u64) -> Option<&Graph> {
        self.graphs
            .graphs
            .iter()
            .find(|(gh, _)| *gh & 0xffff_ffff == node >> 16)
            .map(|(_, graph)| graph)
    }

    /// [`Inner::graph_of_node`], to change the node.
    pub fn graph_of_node_mut(&mut self, node: u64) -> Option<&mut Graph> {
        self.graphs
            .graphs
            .iter_mut()
            .find(|(gh, _)| *gh & 0xffff_ffff == node >> 16)
            .map(|(_, graph)| graph)
    }

    /// Whether `graph` exists.
    pub fn has_graph(&self, graph: u64) -> bool {
        self.graphs.graphs.contains_key(&graph)
    }

    /// Whether `ptr` is a graph allocation.
    pub fn is_graph_allocation(&self, ptr: u64) -> bool {
        self.graphs.allocations.contains_key(&ptr)
    }

    /// Forgets the graph allocation at `ptr` (a node that could not be added).
    pub fn forget_graph_allocation(&mut self, ptr: u64) {
        self.graphs.allocations.remove(&ptr);
    }

    /// Graph allocations: (bytes reserved, bytes live).
    pub fn graph_memory(&self) -> (u64, u64) {
        let all = self.graphs.allocations.values();
        let reserved = all.clone().map(|a| a.size).sum();
        let used = all.filter(|a| a.live).map(|a| a.size).sum();
        (reserved, used)
    }

    /// Whether stream `st` (an id) is capturing.
    pub fn is_capturing(&self, st: u64) -> bool {
        self.graphs.capturing(st).is_some()
    }

    /// Records `op` if stream `st` is capturing; gives it back otherwise.
    pub fn capture_op(&mut self, st: u64, op: Op) -> Option<Op> {
        self.graphs.record(st, op)
    }

    /// `cuGraphDestroy`, with the bodies of its conditional nodes; graph allocations and
    /// conditional handles no graph holds any more are freed.
    pub fn destroy_graph(&mut self, graph: u64) -> Result<(), ClientError> {
        let removed = self.graphs.graphs.remove(&graph).ok_or(INVALID_HANDLE)?;
        let gone = self.graphs.release(&removed);
        for body in removed.bodies() {
            // A body the application destroyed itself is already gone.
            let _ = self.destroy_graph(body);
        }
        gone.into_iter().try_for_each(|p| self.free(p))
    }

    /// `cuGraphClone`: a new graph with graph `graph`'s nodes (the bodies of its conditional
    /// nodes cloned too); it holds the same graph allocations and conditional handles.
    pub fn clone_graph(&mut self, graph: u64) -> Result<u64, ClientError> {
        let mut copy = self
            .graphs
            .graphs
            .get(&graph)
            .ok_or(INVALID_HANDLE)?
            .clone();
        for op in &mut copy.ops {
            if let Op::Conditional { bodies, .. } = op {
                let mut cloned = Vec::with_capacity(bodies.len());
                for &b in bodies.iter() {
                    cloned.push(self.clone_graph(b)?);
                }
                *bodies = cloned.into_boxed_slice();
            }
        }
        self.graphs.hold(&copy);
        let handle = handles::mint(Kind::Graph);
        self.graphs.graphs.insert(handle, copy);
        Ok(handle)
    }

    /// `cuGraphConditionalHandleCreate`: a handle for conditional nodes of graph `graph`, the
    /// address of a 4-byte word of device memory that holds its value (kernels set it with
    /// `cudaGraphSetConditional`, a store there). The value starts at `default`; with
    /// `assign_default` (`CU_GRAPH_COND_ASSIGN_DEFAULT`) every launch of the graph sets it
    /// to `default` first.
    pub fn create_conditional_handle(
        &mut self,
        graph: u64,
        default: u32,
        assign_default: bool,
    ) -> Result<u64, ClientError> {
        if !self.graphs.graphs.contains_key(&graph) {
            return Err(INVALID_HANDLE.into());
        }
        let ptr = self.alloc(8)?;
        if let Err(e) = self.device_work(&Request::Memset {
            dst: DevicePtr(ptr),
            value: default,
            elem_size: 4,
            count: 2,
            stream: StreamHandle(0),
        }) {
            let _ = self.free(ptr);
            return Err(e);
        }
        self.graphs.handles.insert(ptr, 1);
        if let Some(g) = self.graphs.graphs.get_mut(&graph) {
            g.conditionals.push(CondHandle {
                ptr,
                default: assign_default.then_some(default),
            });
        }
        Ok(ptr)
    }

    /// A conditional node of `kind` on `handle` with `bodies` new empty body graphs, for the
    /// caller to append to a graph. The node's `bodies` array stays where it is while the node
    /// exists (the application reads it as `phGraph_out`).
    pub fn conditional_node(
        &mut self,
        handle: u64,
        kind: CondKind,
        bodies: usize,
    ) -> Result<Op, ClientError> {
        if !self.graphs.handles.contains_key(&handle) {
            return Err(INVALID_VALUE.into());
        }
        Ok(Op::Conditional {
            handle,
            kind,
            bodies: (0..bodies).map(|_| self.create_graph()).collect(),
            frozen: Vec::new(),
        })
    }

    /// Graph `graph` as an executable takes it: its conditional nodes carry their bodies'
    /// operations as they are now.
    pub(crate) fn freeze(&self, graph: &Graph, depth: usize) -> Result<Graph, ClientError> {
        let mut out = graph.clone();
        for op in &mut out.ops {
            if let Op::Conditional { bodies, frozen, .. } = op {
                if depth > 64 {
                    return Err(INVALID_VALUE.into());
                }
                *frozen = bodies
                    .iter()
                    .map(|b| {
                        let body = self.graphs.graphs.get(b).ok_or(INVALID_HANDLE)?;
                        self.freeze(body, depth + 1)
                    })
                    .collect::<Result<_, ClientError>>()?;
            }
        }
        Ok(out)
    }

    /// `cuGraphInstantiate`: an executable of graph `graph`'s operations as they are now.
    pub fn instantiate(&mut self, graph: u64) -> Result<u64, ClientError> {
        let ops = self.freeze(self.graphs.graphs.get(&graph).ok_or(INVALID_HANDLE)?, 0)?;
        let exec = handles::mint(Kind::GraphExec);
        self.graphs.hold(&ops);
        self.graphs.execs.insert(exec, ops);
        Ok(exec)
    }

    /// `cuGraphExecDestroy`.
    pub fn destroy_exec(&mut self, exec: u64) -> Result<(), ClientError> {
        let removed = self.graphs.execs.remove(&exec).ok_or(INVALID_HANDLE)?;
        if self.conn.graph_state(exec) == Some(true) {
            self.conn.quiet(&Request::GraphDestroy { graph: exec })?;
        }
        self.conn.set_graph_state(exec, None);
        let gone = self.graphs.release(&removed);
        gone.into_iter().try_for_each(|p| self.free(p))
    }

    /// `cuGraphUpload`: checks the stream and the executable (there is nothing to upload).
    pub fn check_exec(&self, exec: u64, stream: u64) -> Result<(), ClientError> {
        self.stream_id(stream)?;
        self.graphs
            .execs
            .get(&exec)
            .map(|_| ())
            .ok_or(ClientError::Cuda(INVALID_HANDLE))
    }

    /// `cuGraphLaunch`: replays the executable's operations on stream handle `stream`.
    ///
    /// # Safety
    /// The host memory and host functions the graph's operations name are valid now, as CUDA
    /// requires of a graph launch: copy sources and destinations for their lengths (a
    /// page-locked destination until the stream is synchronized), host functions callable
    /// with their argument.
    pub unsafe fn launch_graph(&mut self, exec: u64, stream: u64) -> Result<(), ClientError> {
        let st = self.stream_id(stream)?;
        // Launched into a capture, a graph's operations are recorded: replayed here.
        if self.graphs.capturing(st).is_none() && self.worker_graph(exec)? {
            return self.device_work(&Request::GraphLaunch {
                graph: exec,
                stream: StreamHandle(st),
            });
        }
        let graph = self.graphs.execs.get(&exec).ok_or(INVALID_HANDLE)?.clone();
        // SAFETY: this function's contract.
        unsafe { self.run_graph(st, &graph) }
    }

    /// Whether executable `exec` is a graph the worker keeps (defining it there first if it
    /// can be: device work only, a node from protocol 17 on), so that a launch is one request.
    fn worker_graph(&mut self, exec: u64) -> Result<bool, ClientError> {
        if let Some(known) = self.conn.graph_state(exec) {
            return Ok(known);
        }
        let graph = self.graphs.execs.get(&exec).ok_or(INVALID_HANDLE)?;
        let nodes = match self.conn.peer_version() >= 17 {
            true => worker_nodes(graph),
            false => None,
        };
        let Some(nodes) = nodes else {
            self.conn.set_graph_state(exec, Some(false));
            return Ok(false);
        };
        self.conn
            .quiet(&Request::GraphDefine { graph: exec, nodes })?;
        self.conn.set_graph_state(exec, Some(true));
        Ok(true)
    }

    /// Runs `graph` (an executable's, or a body of one) on stream `stream`: its conditional
    /// handles that have a default get it, then its operations replay in order.
    ///
    /// # Safety
    /// As for [`Inner::launch_graph`].
    unsafe fn run_graph(&mut self, stream: u64, graph: &Graph) -> Result<(), ClientError> {
        for c in &graph.conditionals {
            if let Some(value) = c.default {
                self.device_work(&Request::Memset {
                    dst: DevicePtr(c.ptr),
                    value,
                    elem_size: 4,
                    count: 1,
                    stream: StreamHandle(stream),
                })?;
            }
        }
        for op in &graph.ops {
            // SAFETY: this function's contract.
            unsafe { self.replay(stream, op.clone()) }?;
        }
        Ok(())
    }

    /// A conditional handle's value now: the device's work on `stream` before it done.
    fn conditional_value(&mut self, handle: u64, stream: u64) -> Result<u32, ClientError> {
        let mut word = [0u8; 4];
        self.copy_from_device(&mut word, handle, stream)?;
        Ok(u32::from_le_bytes(word))
    }

    /// Replays one captured operation on `stream`.
    ///
    /// # Safety
    /// As for [`Inner::launch_graph`].
    unsafe fn replay(&mut self, stream: u64, op: Op) -> Result<(), ClientError> {
        match op {
            Op::Launch {
                function,
                grid,
                block,
                shared_mem,
                params,
                attributes,
            } => {
                let config = LaunchConfig {
                    grid,
                    block,
                    shared_mem,
                    stream,
                    attributes,
                };
                self.launch(function, config, params)
            }
            Op::HtoD { dst, src_host, len } => {
                if len > 0 && src_host == 0 {
                    return Err(INVALID_VALUE.into());
                }
                let src = if len == 0 {
                    &[][..]
                } else {
                    // SAFETY: this function's contract: the captured source is readable.
                    unsafe { std::slice::from_raw_parts(src_host as *const u8, len) }
                };
                self.copy_to_device(dst, src, stream)
            }
            // SAFETY: this function's contract: the captured destination is writable.
            Op::DtoH { dst_host, src, len } => unsafe {
                self.copy_from_device_async(dst_host as *mut u8, src, len, stream)
            },
            Op::DtoD { dst, src, len } => self.copy_on_device(dst, src, len, stream),
            Op::Memset {
                dst,
                value,
                elem_size,
                count,
            } => self.device_work(&Request::Memset {
                dst: DevicePtr(dst),
                value,
                elem_size,
                count,
                stream: StreamHandle(stream),
            }),
            Op::EventRecord { event } => self.replay_event_record(event, stream),
            Op::MemAlloc { ptr, .. } => {
                // A launch of a graph whose allocation is still live (not freed by a free node
                // or cuMemFreeAsync since the last launch) is refused, as CUDA refuses it.
                let a = self.graphs.allocations.get_mut(&ptr).ok_or(INVALID_VALUE)?;
                if a.live {
                    return Err(INVALID_VALUE.into());
                }
                a.live = true;
                Ok(())
            }
            Op::MemFree { ptr } => {
                let a = self.graphs.allocations.get_mut(&ptr).ok_or(INVALID_VALUE)?;
                if !a.live {
                    return Err(INVALID_VALUE.into());
                }
                a.live = false;
                Ok(())
            }
            // The replay waits for the stream's work before the node to read the value: graph
            // launches with conditional nodes return when their last condition is read.
            Op::Conditional {
                handle,
                kind,
                frozen,
                ..
            } => match kind {
                CondKind::If => {
                    let v = self.conditional_value(handle, stream)?;
                    match frozen.get(usize::from(v == 0)) {
                        // SAFETY: this function's contract.
                        Some(body) => unsafe { self.run_graph(stream, body) },
                        None => Ok(()),
                    }
                }
                CondKind::While => {
                    let body = frozen.first().ok_or(INVALID_VALUE)?;
                    while self.conditional_value(handle, stream)? != 0 {
                        // SAFETY: this function's contract.
                        unsafe { self.run_graph(stream, body) }?;
                    }
                    Ok(())
                }
                CondKind::Switch => {
                    let v = self.conditional_value(handle, stream)?;
                    match frozen.get(v as usize) {
                        // SAFETY: this function's contract.
                        Some(body) => unsafe { self.run_graph(stream, body) },
                        None => Ok(()),
                    }
                }
            },
            Op::HostFn { func, user } => {
                self.drain_stream(stream)?;
                if func == 0 {
                    return Err(INVALID_VALUE.into());
                }
                // SAFETY: the application registered this host function and argument during
                // capture and CUDA calls it each time the graph runs (this function's
                // contract); `func` is not NULL.
                let f: unsafe extern "C" fn(*mut std::ffi::c_void) =
                    unsafe { std::mem::transmute::<usize, _>(func) };
                // SAFETY: see above.
                unsafe { f(user as *mut std::ffi::c_void) };
                Ok(())
            }
        }
    }
}

/// `CU_LAUNCH_ATTRIBUTE_COOPERATIVE`.
const COOPERATIVE: u32 = 2;

/// A graph's operations as the worker keeps them, when all are device work: launches (with no
/// attribute but cooperative), device-to-device copies and memsets. Anything else (host
/// memory, host functions, events, allocations, conditionals) is replayed by the client.
fn worker_nodes(graph: &Graph) -> Option<Vec<gpufuse_proto::GraphNode>> {
    if !graph.conditionals.is_empty() {
        return None;
    }
    graph
        .ops
        .iter()
        .map(|op| match op {
            Op::Launch {
                function,
                grid,
                block,
                shared_mem,
                params,
                attributes,
            } => {
                let mut cooperative = false;
                for (id, v) in attributes {
                    match *id {
                        COOPERATIVE => cooperative = v[0] as u32 != 0,
                        _ => return None,
                    }
                }
                Some(gpufuse_proto::GraphNode::Launch {
                    function: gpufuse_proto::FunctionHandle(*function),
                    grid: *grid,
                    block: *block,
                    shared_mem: *shared_mem,
                    params: params.clone(),
                    cooperative,
                })
            }
            &Op::DtoD { dst, src, len } => Some(gpufuse_proto::GraphNode::Copy {
                dst: DevicePtr(dst),
                src: DevicePtr(src),
                size: len,
            }),
            &Op::Memset {
                dst,
                value,
                elem_size,
                count,
            } => Some(gpufuse_proto::GraphNode::Memset {
                dst: DevicePtr(dst),
                value,
                elem_size,
                count,
            }),
            _ => None,
        })
        .collect()
}
