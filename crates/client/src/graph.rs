//! CUDA graphs recorded in the client: stream capture turns a stream's quiet operations into a
//! list of [`Op`]s, and launching a graph replays them in capture order on a stream. The worker
//! sees ordinary launches and copies, so it charges and checks them like any other.

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
}

/// A graph under construction or finished.
#[derive(Debug, Clone, Default)]
pub struct Graph {
    pub ops: Vec<Op>,
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
}

impl Graphs {
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
}
