//! CUDA graphs recorded in the client: stream capture turns a stream's quiet operations into a
//! list of [`Op`]s. Launching an executable of device work only sends it to the worker once
//! (`GraphDefine`) and then one `GraphLaunch` per launch (`graph_ops.rs`); any other replays
//! its operations in capture order on a stream, as ordinary launches and copies. Either way
//! the worker charges and checks them like any other.

use std::collections::HashMap;

/// One captured operation, owning everything it needs. Host addresses are read (or written)
/// when the graph runs, as CUDA does for captured copies.
#[derive(Debug, Clone)]
pub enum Op {
    Launch {
        function: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        params: Vec<u8>,
        attributes: Vec<(u32, [u64; 8])>,
    },
    HtoD {
        dst: u64,
        src_host: usize,
        len: usize,
    },
    DtoH {
        dst_host: usize,
        src: u64,
        len: usize,
    },
    DtoD {
        dst: u64,
        src: u64,
        len: u64,
    },
    Memset {
        dst: u64,
        value: u32,
        elem_size: u8,
        count: u64,
    },
    EventRecord {
        event: u64,
    },
    HostFn {
        func: usize,
        user: usize,
    },
    /// A graph allocation (`cuGraphAddMemAllocNode`, `cudaMallocAsync` under capture): its
    /// address is fixed when the node is made, as CUDA's is, and the memory stays reserved
    /// for the graph until the graph and every executable made from it are destroyed
    /// ([`GraphAlloc`]). Replaying the node makes the allocation live.
    MemAlloc {
        ptr: u64,
        size: u64,
    },
    /// A graph free (`cuGraphAddMemFreeNode`, `cudaFreeAsync` under capture) of a graph
    /// allocation: replaying it ends the allocation's life; the memory stays reserved.
    MemFree {
        ptr: u64,
    },
    /// A conditional node (`cuGraphAddNode` of type `CU_GRAPH_NODE_TYPE_CONDITIONAL`): when
    /// the replay reaches it, it reads the condition's value (the word at `handle`, which
    /// kernels set with `cudaGraphSetConditional`) and runs a body graph accordingly.
    Conditional {
        /// The conditional handle: the device address of its value's 4-byte word.
        handle: u64,
        kind: CondKind,
        /// The body graphs, as handles the application adds nodes to. CUDA hands the
        /// application this array (`phGraph_out`): it stays where it is for the node's life.
        bodies: Box<[u64]>,
        /// In an executable: the bodies' operations as they were when it was instantiated.
        frozen: Vec<Graph>,
    },
}

/// What a conditional node does with its bodies (`CUgraphConditionalNodeType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CondKind {
    /// Body 0 if the value is nonzero, else body 1 if there is one.
    If,
    /// Body 0 again and again while the value is nonzero.
    While,
    /// Body `value`, if there is one.
    Switch,
}

impl CondKind {
    /// `CU_GRAPH_COND_TYPE_*`, with the number of bodies it may have.
    pub fn from_driver(kind: u32, bodies: u32) -> Option<CondKind> {
        match (kind, bodies) {
            (0, 1 | 2) => Some(CondKind::If),
            (1, 1) => Some(CondKind::While),
            (2, 1..) => Some(CondKind::Switch),
            _ => None,
        }
    }
}

/// A conditional handle made for a graph (`cuGraphConditionalHandleCreate`).
#[derive(Debug, Clone, Copy)]
pub struct CondHandle {
    /// The device address of its value's word (the handle the application gets).
    pub ptr: u64,
    /// Its value at each launch of the graph, with `CU_GRAPH_COND_ASSIGN_DEFAULT`.
    pub default: Option<u32>,
}

/// A graph under construction or finished.
#[derive(Debug, Clone, Default)]
pub struct Graph {
    pub ops: Vec<Op>,
    /// Conditional handles made for this graph.
    pub conditionals: Vec<CondHandle>,
}

impl Graph {
    /// The graph allocations its nodes make.
    pub fn allocations(&self) -> impl Iterator<Item = u64> + '_ {
        self.ops.iter().filter_map(|op| match op {
            Op::MemAlloc { ptr, .. } => Some(*ptr),
            _ => None,
        })
    }

    /// The conditional handles this graph uses: its own, and (in an executable) those of the
    /// bodies it holds.
    pub fn handles(&self) -> Vec<u64> {
        let mut out: Vec<u64> = self.conditionals.iter().map(|c| c.ptr).collect();
        for op in &self.ops {
            if let Op::Conditional { frozen, .. } = op {
                frozen.iter().for_each(|b| out.extend(b.handles()));
            }
        }
        out
    }

    /// The body graphs of its conditional nodes (handles).
    pub fn bodies(&self) -> impl Iterator<Item = u64> + '_ {
        self.ops.iter().flat_map(|op| match op {
            Op::Conditional { bodies, .. } => bodies.iter().copied(),
            _ => [].iter().copied(),
        })
    }
}

/// Device memory reserved for a graph allocation node.
#[derive(Debug, Clone, Copy)]
pub struct GraphAlloc {
    pub size: u64,
    /// Graphs and executables whose nodes make it: the memory is freed when none is left.
    pub refs: usize,
    /// Allocated by a replay and not freed since (by a free node or `cuMemFreeAsync`).
    pub live: bool,
}

/// Graphs, instantiated graphs and which streams are capturing into which graph.
#[derive(Debug, Default)]
pub struct Graphs {
    pub graphs: HashMap<u64, Graph>,
    pub execs: HashMap<u64, Graph>,
    /// stream -> graph being captured.
    pub capturing: HashMap<u64, u64>,
    /// event -> graph it was recorded into during capture (for fork/join across streams).
    pub captured_events: HashMap<u64, u64>,
    /// stream -> capture sequence id.
    pub capture_ids: HashMap<u64, u64>,
    pub next_capture_id: u64,
    /// Graph allocations by address.
    pub allocations: HashMap<u64, GraphAlloc>,
    /// Conditional handles (their words' addresses) and how many graphs and executables use
    /// each: the word is freed when none does.
    pub handles: HashMap<u64, usize>,
    /// Graphs being captured into that existed before the capture
    /// (`cuStreamBeginCaptureToGraph`): ending the capture leaves them to their owner.
    pub captured_into: std::collections::HashSet<u64>,
}

impl Graphs {
    /// A graph (or an executable made from it) now also holds `graph`'s allocations.
    pub fn hold(&mut self, graph: &Graph) {
        for ptr in graph.allocations() {
            if let Some(a) = self.allocations.get_mut(&ptr) {
                a.refs += 1;
            }
        }
        for ptr in graph.handles() {
            if let Some(n) = self.handles.get_mut(&ptr) {
                *n += 1;
            }
        }
    }

    /// `graph` (or an executable) is gone: returns the allocations no graph holds any more,
    /// for the caller to free.
    pub fn release(&mut self, graph: &Graph) -> Vec<u64> {
        let mut gone = Vec::new();
        for ptr in graph.allocations() {
            if let Some(a) = self.allocations.get_mut(&ptr) {
                a.refs = a.refs.saturating_sub(1);
                if a.refs == 0 {
                    self.allocations.remove(&ptr);
                    gone.push(ptr);
                }
            }
        }
        for ptr in graph.handles() {
            if let Some(n) = self.handles.get_mut(&ptr) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.handles.remove(&ptr);
                    gone.push(ptr);
                }
            }
        }
        gone
    }

    /// The graph `stream` is capturing into, if any.
    pub fn capturing(&self, stream: u64) -> Option<u64> {
        self.capturing.get(&stream).copied()
    }

    /// Records `op` if `stream` is capturing; returns it back otherwise.
    pub fn record(&mut self, stream: u64, op: Op) -> Option<Op> {
        match self.capturing(stream).and_then(|g| self.graphs.get_mut(&g)) {
            Some(graph) => {
                graph.ops.push(op);
                None
            }
            None => Some(op),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_records_only_capturing_streams() {
        let mut g = Graphs::default();
        g.graphs.insert(10, Graph::default());
        g.capturing.insert(5, 10);
        assert!(g
            .record(
                5,
                Op::DtoD {
                    dst: 1,
                    src: 2,
                    len: 3
                }
            )
            .is_none());
        assert!(g
            .record(
                6,
                Op::DtoD {
                    dst: 1,
                    src: 2,
                    len: 3
                }
            )
            .is_some());
        assert_eq!(g.graphs[&10].ops.len(), 1);
    }

    #[test]
    fn graph_allocations_live_while_a_graph_holds_them() {
        let mut g = Graphs::default();
        let graph = Graph {
            ops: vec![Op::MemAlloc { ptr: 7, size: 64 }, Op::MemFree { ptr: 7 }],
            ..Default::default()
        };
        g.allocations.insert(
            7,
            GraphAlloc {
                size: 64,
                refs: 1,
                live: false,
            },
        );
        g.hold(&graph); // an executable
        assert!(g.release(&graph).is_empty());
        assert_eq!(g.release(&graph), vec![7]);
        assert!(g.allocations.is_empty());
    }
}
