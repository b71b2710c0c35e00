//! Graphs the worker keeps (`GraphDefine`, protocol 17): an executable graph of device work
//! only (launches, device-to-device copies, memsets), defined once by the client and launched
//! with one request. A device that makes graphs of its own (a real GPU: one driver graph,
//! launched with one driver call) gets it whole; on any other (the emulated GPU) the worker
//! runs the nodes one by one, through the same paths as the requests they stand for. Either
//! way a graph launch is device work under the session's lease, charged by the device.

use std::collections::HashMap;

use gpufuse_device::status as st;
use gpufuse_proto::{GraphNode, Launch, StreamHandle};

use crate::{Session, R};

/// A defined graph: its nodes as the client sent them, and whether the device holds it.
pub(crate) struct Defined {
    nodes: Vec<GraphNode>,
    on_device: bool,
}

#[derive(Default)]
pub(crate) struct GraphBooks {
    graphs: HashMap<u64, Defined>,
}

/// `CU_LAUNCH_ATTRIBUTE_COOPERATIVE`, set.
fn cooperative_attr() -> (u32, [u64; 8]) {
    let mut v = [0u64; 8];
    v[0] = 1;
    (2, v)
}

impl Session<'_> {
    /// The device's form of `nodes`, every handle and range checked.
    fn device_nodes(&self, nodes: &[GraphNode]) -> R<Vec<gpufuse_device::GraphNode>> {
        nodes
            .iter()
            .map(|n| {
                Ok(match n {
                    GraphNode::Launch {
                        function,
                        grid,
                        block,
                        shared_mem,
                        params,
                        cooperative,
                    } => {
                        let (module, name) = self.kernel(function.get())?;
                        gpufuse_device::GraphNode::Launch {
                            module,
                            function: name.to_string(),
                            grid: *grid,
                            block: *block,
                            shared_mem: *shared_mem,
                            params: params.clone(),
                            cooperative: *cooperative,
                        }
                    }
                    GraphNode::Copy { dst, src, size } => {
                        self.check_range(dst.get(), *size)?;
                        self.check_range(src.get(), *size)?;
                        gpufuse_device::GraphNode::Copy {
                            dst: dst.get(),
                            src: src.get(),
                            len: *size,
                        }
                    }
                    GraphNode::Memset {
                        dst,
                        value,
                        elem_size,
                        count,
                    } => {
                        if !matches!(elem_size, 1 | 2 | 4) {
                            return Err(st::INVALID_VALUE);
                        }
                        self.check_range(dst.get(), count.saturating_mul(u64::from(*elem_size)))?;
                        gpufuse_device::GraphNode::Memset {
                            dst: dst.get(),
                            value: *value,
                            elem_size: *elem_size,
                            count: *count,
                        }
                    }
                })
            })
            .collect()
    }

    /// `GraphDefine`: keeps `nodes` as graph `graph` (replacing one of that id), on the device
    /// when it takes graphs.
    pub(crate) fn graph_define(&mut self, graph: u64, nodes: Vec<GraphNode>) -> R<()> {
        let _ = self.graph_destroy(graph);
        let device_nodes = self.device_nodes(&nodes)?;
        let on_device = match self.device.define_graph(graph, &device_nodes) {
            Ok(()) => {
                tracing::debug!(graph, nodes = nodes.len(), "graph made the device's own");
                true
            }
            Err(e) => {
                if e.status != st::NOT_SUPPORTED {
                    tracing::debug!(
                        graph,
                        status = e.status,
                        "graph run node by node: {}",
                        e.detail()
                    );
                }
                false
            }
        };
        self.graphs
            .graphs
            .insert(graph, Defined { nodes, on_device });
        Ok(())
    }

    /// `GraphLaunch`: the whole graph on `stream`.
    pub(crate) fn graph_launch(&mut self, graph: u64, stream: u64) -> R<()> {
        self.check_stream(stream)?;
        let g = self
            .graphs
            .graphs
            .get_mut(&graph)
            .ok_or(st::INVALID_HANDLE)?;
        if g.on_device {
            self.lease_for_launch();
            let r = self.device.launch_graph(graph, stream);
            return self.launched(&format_args!("graph {graph}"), r);
        }
        // The nodes are lent to the run, not copied, and put back whatever happens.
        let nodes = std::mem::take(&mut g.nodes);
        let ran = self.run_nodes(&nodes, stream);
        if let Some(g) = self.graphs.graphs.get_mut(&graph) {
            g.nodes = nodes;
        }
        ran
    }

    /// A graph's nodes one by one on `stream`, through the paths of the requests they stand
    /// for.
    fn run_nodes(&mut self, nodes: &[GraphNode], stream: u64) -> R<()> {
        for n in nodes {
            match *n {
                GraphNode::Launch {
                    function,
                    grid,
                    block,
                    shared_mem,
                    ref params,
                    cooperative,
                } => self.launch_kernel(&Launch {
                    function,
                    grid,
                    block,
                    shared_mem,
                    stream: StreamHandle(stream),
                    params,
                    attributes: cooperative.then(cooperative_attr).into_iter().collect(),
                })?,
                GraphNode::Copy { dst, src, size } => {
                    self.memcpy_dtod(dst.get(), src.get(), size, stream)?
                }
                GraphNode::Memset {
                    dst,
                    value,
                    elem_size,
                    count,
                } => self.memset(dst.get(), value, elem_size, count, stream)?,
            }
        }
        Ok(())
    }

    /// `GraphDestroy`.
    pub(crate) fn graph_destroy(&mut self, graph: u64) -> R<()> {
        let g = self
            .graphs
            .graphs
            .remove(&graph)
            .ok_or(st::INVALID_HANDLE)?;
        if g.on_device {
            let _ = self.device.destroy_graph(graph);
        }
        Ok(())
    }

    /// Module `module` (the client's handle) is going: the device's graphs that launch its
    /// kernels are dropped from the device.
    pub(crate) fn graphs_leave_module(&mut self, module: u64) {
        let uses = |nodes: &[GraphNode], functions: &HashMap<u64, (u64, std::sync::Arc<str>)>| {
            nodes.iter().any(|n| match n {
                GraphNode::Launch { function, .. } => functions
                    .get(&function.get())
                    .is_some_and(|(m, _)| *m == module),
                _ => false,
            })
        };
        let doomed: Vec<u64> = self
            .graphs
            .graphs
            .iter()
            .filter(|(_, g)| g.on_device && uses(&g.nodes, &self.modules.functions))
            .map(|(&id, _)| id)
            .collect();
        for id in doomed {
            let _ = self.device.destroy_graph(id);
            if let Some(g) = self.graphs.graphs.get_mut(&id) {
                g.on_device = false;
            }
        }
    }

    /// The graphs as a move carries them: (id, nodes), by id.
    pub(crate) fn graphs_for_move(&self) -> Vec<(u64, Vec<GraphNode>)> {
        let mut v: Vec<(u64, Vec<GraphNode>)> = self
            .graphs
            .graphs
            .iter()
            .map(|(&id, g)| (id, g.nodes.clone()))
            .collect();
        v.sort_by_key(|(id, _)| *id);
        v
    }

    /// Graphs a move brought: kept, and made the device's own by [`Session::rebuild_graphs`].
    pub(crate) fn adopt_graphs(&mut self, graphs: Vec<(u64, Vec<GraphNode>)>) {
        self.graphs.graphs = graphs
            .into_iter()
            .map(|(id, nodes)| {
                (
                    id,
                    Defined {
                        nodes,
                        on_device: false,
                    },
                )
            })
            .collect();
    }

    /// Every graph forgotten (a reset, the end).
    pub(crate) fn release_graphs(&mut self) {
        let ids: Vec<u64> = self.graphs.graphs.keys().copied().collect();
        for g in ids {
            let _ = self.graph_destroy(g);
        }
    }

    /// The session now runs on another device: its graphs are made there again.
    pub(crate) fn rebuild_graphs(&mut self) {
        let ids: Vec<u64> = self.graphs.graphs.keys().copied().collect();
        for id in ids {
            let nodes = match self.graphs.graphs.get(&id) {
                Some(g) => g.nodes.clone(),
                None => continue,
            };
            let on_device = self
                .device_nodes(&nodes)
                .is_ok_and(|d| self.device.define_graph(id, &d).is_ok());
            if let Some(g) = self.graphs.graphs.get_mut(&id) {
                g.on_device = on_device;
            }
        }
    }
}
