//! Changing what an executable graph (or a graph) runs without building it again:
//! `cuGraphExecKernelNodeSetParams`, `cuGraphKernelNodeSetParams` and `cuGraphExecUpdate`.
//! A node handle names its graph and the index of its last operation
//! (`crate::graph_ops::Inner::graph_of_node`); an executable holds its graph's operations at
//! the same indices, so a node of the graph names the same operation in every executable made
//! from it.

use crate::error::ClientError;
use crate::graph::{Graph, Op};
use crate::state::Inner;
use crate::status::{INVALID_HANDLE, INVALID_VALUE};

/// Why `cuGraphExecUpdate` refused (`CUgraphExecUpdateResult`), with the index (1-based, as
/// node handles number them) of the first operation concerned, if one is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateRefused {
    /// `CU_GRAPH_EXEC_UPDATE_ERROR_*`.
    pub result: u32,
    pub index: Option<usize>,
}

/// `CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED`.
pub const TOPOLOGY_CHANGED: u32 = 2;
/// `CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED`.
pub const NODE_TYPE_CHANGED: u32 = 3;
/// `CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED`.
pub const NOT_SUPPORTED: u32 = 6;

/// Whether two operations are nodes of the same type (what an update may change is their
/// parameters only).
fn same_type(a: &Op, b: &Op) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// Operations an update cannot change in place: memory nodes (their addresses are the
/// graph's) and conditional nodes (their bodies).
fn updatable(op: &Op) -> bool {
    !matches!(
        op,
        Op::MemAlloc { .. } | Op::MemFree { .. } | Op::Conditional { .. }
    )
}

impl Inner {
    /// Replaces the kernel launch node `node` stands for with `launch`, in executable `exec`
    /// if given, else in the node's own graph.
    pub fn set_kernel_node(
        &mut self,
        exec: Option<u64>,
        node: u64,
        launch: Op,
    ) -> Result<(), ClientError> {
        if !matches!(launch, Op::Launch { .. }) {
            return Err(INVALID_VALUE.into());
        }
        let index = (node & 0xffff) as usize;
        let graph = match exec {
            Some(e) => {
                // The node must belong to a graph (`graph_of_node`), and the executable must
                // hold an operation at its index. The worker's copy is defined again at the
                // next launch.
                self.graph_of_node(node).ok_or(INVALID_HANDLE)?;
                self.conn.set_graph_state(e, None);
                self.graphs.execs.get_mut(&e).ok_or(INVALID_HANDLE)?
            }
            None => self.graph_of_node_mut(node).ok_or(INVALID_HANDLE)?,
        };
        let slot = index
            .checked_sub(1)
            .and_then(|i| graph.ops.get_mut(i))
            .ok_or(INVALID_VALUE)?;
        if !matches!(slot, Op::Launch { .. }) {
            return Err(INVALID_VALUE.into());
        }
        *slot = launch;
        Ok(())
    }

    /// `cuGraphExecUpdate`: executable `exec` runs graph `graph`'s operations from now on, if
    /// they are the same nodes in the same order as what it runs now, differing only in their
    /// parameters. Refused (and `exec` unchanged) otherwise.
    pub fn update_exec(
        &mut self,
        exec: u64,
        graph: u64,
    ) -> Result<Result<(), UpdateRefused>, ClientError> {
        let source = self.graphs.graphs.get(&graph).ok_or(INVALID_HANDLE)?;
        let new = self.freeze(source, 0)?;
        let old = self.graphs.execs.get(&exec).ok_or(INVALID_HANDLE)?;
        if let Some(refused) = refusal(old, &new) {
            return Ok(Err(refused));
        }
        self.graphs.execs.insert(exec, new);
        self.conn.set_graph_state(exec, None);
        Ok(Ok(()))
    }
}

fn refusal(old: &Graph, new: &Graph) -> Option<UpdateRefused> {
    if !old.conditionals.is_empty() || !new.conditionals.is_empty() {
        return Some(UpdateRefused {
            result: NOT_SUPPORTED,
            index: None,
        });
    }
    if old.ops.len() != new.ops.len() {
        return Some(UpdateRefused {
            result: TOPOLOGY_CHANGED,
            index: None,
        });
    }
    for (i, (a, b)) in old.ops.iter().zip(&new.ops).enumerate() {
        if !same_type(a, b) {
            return Some(UpdateRefused {
                result: NODE_TYPE_CHANGED,
                index: Some(i + 1),
            });
        }
        if !updatable(a) {
            return Some(UpdateRefused {
                result: NOT_SUPPORTED,
                index: Some(i + 1),
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(function: u64, arg: u8) -> Op {
        Op::Launch {
            function,
            grid: [1; 3],
            block: [1; 3],
            shared_mem: 0,
            params: vec![arg],
            attributes: Vec::new(),
        }
    }

    fn graph(ops: Vec<Op>) -> Graph {
        Graph {
            ops,
            ..Default::default()
        }
    }

    #[test]
    fn an_update_may_change_parameters_only() {
        let memset = Op::Memset {
            dst: 8,
            value: 0,
            elem_size: 1,
            count: 4,
        };
        let old = graph(vec![memset.clone(), launch(1, 1)]);
        assert_eq!(
            refusal(&old, &graph(vec![memset.clone(), launch(1, 2)])),
            None
        );
        assert_eq!(
            refusal(&old, &graph(vec![launch(1, 2)])).map(|r| r.result),
            Some(TOPOLOGY_CHANGED)
        );
        assert_eq!(
            refusal(&old, &graph(vec![launch(1, 2), memset.clone()])),
            Some(UpdateRefused {
                result: NODE_TYPE_CHANGED,
                index: Some(1)
            })
        );
        let alloc = graph(vec![Op::MemAlloc { ptr: 1, size: 8 }]);
        assert_eq!(
            refusal(&alloc, &alloc).map(|r| r.result),
            Some(NOT_SUPPORTED)
        );
    }
}
