//! Where divergent lanes meet again: the immediate post-dominator of each conditional branch,
//! computed once per function over its basic blocks (Cooper, Harvey and Kennedy's iterative
//! dominators on the reverse control-flow graph, from a virtual exit).
//!
//! Min-PC scheduling alone runs the lanes at the lowest PC first. When a compiler places one
//! side of a branch out of line (after the loop that holds it), the lanes on the inline side
//! reach the loop's back edge and start the next iteration before the others have finished
//! this one: warp-synchronous code that relies on the lanes meeting again (CuPy's 32-thread
//! bitonic select, legacy warp reductions without `__syncwarp`) then reads stale values. A GPU
//! reconverges the lanes at the branch's immediate post-dominator; so does the VM (`warp.rs`
//! holds lanes there until the rest of the branch's lanes arrive).

use crate::code::Ins;
use crate::inst::Op;

/// No reconvergence point (the paths meet only at the function's exit).
pub const NONE: u32 = u32::MAX;

/// For each instruction, the index of the instruction where the lanes of a divergent
/// conditional branch there meet again, or [`NONE`] (also for every other instruction).
pub fn joins(insts: &[Ins]) -> Vec<u32> {
    let n = insts.len();
    let mut out = vec![NONE; n];
    if n == 0 {
        return out;
    }
    // Basic blocks: leaders at 0, branch targets, and after branches, returns and exits.
    let ends = |i: &Ins| matches!(i.op, Op::Bra | Op::Ret | Op::Exit | Op::Trap);
    let mut leader = vec![false; n];
    leader[0] = true;
    for (k, i) in insts.iter().enumerate() {
        if i.op == Op::Bra && (i.target as usize) < n {
            leader[i.target as usize] = true;
        }
        if ends(i) && k + 1 < n {
            leader[k + 1] = true;
        }
    }
    let starts: Vec<usize> = (0..n).filter(|&k| leader[k]).collect();
    let nb = starts.len();
    let mut block_of = vec![0usize; n];
    for (b, &s) in starts.iter().enumerate() {
        let e = starts.get(b + 1).copied().unwrap_or(n);
        block_of[s..e].fill(b);
    }
    // Successors; `nb` is the virtual exit.
    let exit = nb;
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); nb + 1];
    for (b, &s) in starts.iter().enumerate() {
        let last = starts.get(b + 1).copied().unwrap_or(n) - 1;
        let i = &insts[last];
        let next = if last + 1 < n {
            block_of[last + 1]
        } else {
            exit
        };
        let guarded = i.guard.is_some();
        match i.op {
            Op::Bra => {
                let t = i.target as usize;
                succ[b].push(if t < n { block_of[t] } else { exit });
                if guarded {
                    succ[b].push(next);
                }
            }
            Op::Ret | Op::Exit | Op::Trap => {
                succ[b].push(exit);
                if guarded {
                    succ[b].push(next);
                }
            }
            _ => succ[b].push(next),
        }
        let _ = s;
    }
    let mut pred: Vec<Vec<usize>> = vec![Vec::new(); nb + 1];
    for (b, ss) in succ.iter().enumerate() {
        for &s in ss {
            pred[s].push(b);
        }
    }
    // Reverse post-order of the reverse graph from the exit (a DFS along predecessors).
    let mut order = Vec::with_capacity(nb + 1);
    let mut seen = vec![false; nb + 1];
    let mut stack: Vec<(usize, usize)> = vec![(exit, 0)];
    seen[exit] = true;
    while let Some(&mut (b, ref mut k)) = stack.last_mut() {
        if let Some(&p) = pred[b].get(*k) {
            *k += 1;
            if !seen[p] {
                seen[p] = true;
                stack.push((p, 0));
            }
        } else {
            order.push(b);
            stack.pop();
        }
    }
    order.reverse();
    let mut rpo = vec![usize::MAX; nb + 1];
    for (k, &b) in order.iter().enumerate() {
        rpo[b] = k;
    }
    // Post-dominators: dominators of the reverse graph, whose "predecessors" are successors.
    let undefined = usize::MAX;
    let mut idom = vec![undefined; nb + 1];
    idom[exit] = exit;
    let intersect = |idom: &[usize], mut a: usize, mut b: usize| {
        while a != b {
            while rpo[a] > rpo[b] {
                a = idom[a];
            }
            while rpo[b] > rpo[a] {
                b = idom[b];
            }
        }
        a
    };
    let mut changed = true;
    while changed {
        changed = false;
        for &b in order.iter().skip(1) {
            let mut new = undefined;
            for &s in &succ[b] {
                if idom[s] == undefined {
                    continue;
                }
                new = if new == undefined {
                    s
                } else {
                    intersect(&idom, s, new)
                };
            }
            if new != undefined && idom[b] != new {
                idom[b] = new;
                changed = true;
            }
        }
    }
    for (k, i) in insts.iter().enumerate() {
        if i.op != Op::Bra || i.guard.is_none() {
            continue;
        }
        let b = block_of[k];
        let p = idom[b];
        if p != undefined && p != exit {
            out[k] = starts[p] as u32;
        }
    }
    out
}
