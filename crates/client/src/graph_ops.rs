//! Graph operations of the session: stream capture, graphs made by hand, instantiation, and a
//! launch that replays an executable's operations on a stream through the same paths as the
//! operations themselves (so managed memory and staged copies behave the same).

use gpufuse_proto::Request;

use crate::error::ClientError;
use crate::graph::{Graph, Op};
use crate::handles::{self, Kind};
use crate::launch::LaunchConfig;
use crate::state::Inner;
use crate::status::{
    INVALID_HANDLE, INVALID_VALUE, STREAM_CAPTURE_INVALIDATED, STREAM_CAPTURE_UNMATCHED,
    STREAM_CAPTURE_UNSUPPORTED,
};

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
        self.graphs.next_capture_id += 1;
        let id = self.graphs.next_capture_id;
        self.graphs.capture_ids.insert(st, id);
        Ok(())
    }

    /// `cuStreamEndCapture`: the captured graph.
    pub fn end_capture(&mut self, stream: u64) -> Result<u64, ClientError> {
        let st = self.stream_id(stream)?;
        let graph = self
            .graphs
            .capturing(st)
            .ok_or(ClientError::Cuda(STREAM_CAPTURE_UNMATCHED))?;
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

    /// `cuGraphDestroy`; graph allocations no graph holds any more are freed.
    pub fn destroy_graph(&mut self, graph: u64) -> Result<(), ClientError> {
        let removed = self.graphs.graphs.remove(&graph).ok_or(INVALID_HANDLE)?;
        let gone = self.graphs.release(&removed);
        gone.into_iter().try_for_each(|p| self.free(p))
    }

    /// `cuGraphInstantiate`: an executable of graph `graph`'s operations as they are now.
    pub fn instantiate(&mut self, graph: u64) -> Result<u64, ClientError> {
        let ops = self
            .graphs
            .graphs
            .get(&graph)
            .ok_or(INVALID_HANDLE)?
            .clone();
        let exec = handles::mint(Kind::GraphExec);
        self.graphs.hold(&ops);
        self.graphs.execs.insert(exec, ops);
        Ok(exec)
    }

    /// `cuGraphExecDestroy`.
    pub fn destroy_exec(&mut self, exec: u64) -> Result<(), ClientError> {
        let removed = self.graphs.execs.remove(&exec).ok_or(INVALID_HANDLE)?;
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
        let ops = self
            .graphs
            .execs
            .get(&exec)
            .ok_or(INVALID_HANDLE)?
            .ops
            .clone();
        for op in ops {
            // SAFETY: this function's contract.
            unsafe { self.replay(st, op) }?;
        }
        Ok(())
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
                dst,
                value,
                elem_size,
                count,
                stream,
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
