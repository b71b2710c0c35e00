//! The interpreter. A block's threads run as warps of 32; within a warp the lanes whose program
//! counter is lowest execute the next instruction together (min-PC scheduling), so converged
//! code runs in lockstep (warp shuffles and votes see their partners) and divergent paths
//! reconverge. `bar.sync` parks a thread until every live thread of its block arrives.

use crate::inst::{Base, Inst, Op, Operand, Space, Sreg, Ty, Type};
use crate::parse::Function;
use crate::{DeviceMemory, ExecError, LaunchConfig};

/// Generic-address windows of the state spaces that are not device memory.
pub const SHARED_WINDOW: u64 = 0x7F00_0000_0000_0000;
pub const LOCAL_WINDOW: u64 = 0x7E00_0000_0000_0000;
pub const PARAM_WINDOW: u64 = 0x7D00_0000_0000_0000;
const WINDOW_MASK: u64 = 0xFF00_0000_0000_0000;

/// Symbols a kernel can name: module variables (device addresses), and its own locals.
pub struct Symbols<'a> {
    pub global: &'a dyn Fn(&str) -> Option<u64>,
    /// name -> (space, offset) for shared/local variables of the function or module.
    pub local: &'a std::collections::HashMap<String, (Space, u64)>,
}

struct Thread {
    regs: Vec<u64>,
    pc: usize,
    carry: u64,
    done: bool,
    at_barrier: bool,
    local: Vec<u8>,
    tid: [u32; 3],
}

struct Block<'a> {
    f: &'a Function,
    cfg: &'a LaunchConfig,
    ctaid: [u32; 3],
    params: &'a [u8],
    shared: Vec<u8>,
    syms: &'a Symbols<'a>,
    mem: &'a mut dyn DeviceMemory,
    lane_instructions: u64,
}

fn mask(size: u8) -> u64 {
    if size >= 8 {
        u64::MAX
    } else {
        (1u64 << (size as u32 * 8)) - 1
    }
}

fn sext(v: u64, size: u8) -> i64 {
    let bits = size as u32 * 8;
    if bits >= 64 {
        v as i64
    } else {
        ((v << (64 - bits)) as i64) >> (64 - bits)
    }
}

fn f32v(v: u64) -> f32 {
    f32::from_bits(v as u32)
}
fn f64v(v: u64) -> f64 {
    f64::from_bits(v)
}
fn fv(v: u64, t: Type) -> f64 {
    if t.size == 4 {
        f32v(v) as f64
    } else if t.size == 2 {
        half_to_f32(v as u16) as f64
    } else {
        f64v(v)
    }
}
fn from_f(x: f64, t: Type) -> u64 {
    if t.size == 4 {
        (x as f32).to_bits() as u64
    } else if t.size == 2 {
        f32_to_half(x as f32) as u64
    } else {
        x.to_bits()
    }
}

fn half_to_f32(h: u16) -> f32 {
    let s = ((h >> 15) & 1) as u32;
    let e = ((h >> 10) & 0x1f) as i32;
    let m = (h & 0x3ff) as u32;
    let bits = if e == 0 {
        if m == 0 {
            s << 31
        } else {
            let f = m as f32 / 1024.0 * 2f32.powi(-14);
            return if s == 1 { -f } else { f };
        }
    } else if e == 31 {
        (s << 31) | 0x7f80_0000 | (m << 13)
    } else {
        (s << 31) | (((e - 15 + 127) as u32) << 23) | (m << 13)
    };
    f32::from_bits(bits)
}

fn f32_to_half(f: f32) -> u16 {
    let b = f.to_bits();
    let s = ((b >> 16) & 0x8000) as u16;
    let e = ((b >> 23) & 0xff) as i32 - 127 + 15;
    let m = b & 0x7f_ffff;
    if ((b >> 23) & 0xff) == 0xff {
        return s | 0x7c00 | if m != 0 { 0x200 } else { 0 };
    }
    if e >= 31 {
        return s | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return s;
        }
        let m = (m | 0x80_0000) >> (1 - e);
        return s | ((m + 0x1000) >> 13) as u16;
    }
    let r = s as u32 | ((e as u32) << 10) | (m >> 13);
    // round to nearest even
    let rem = m & 0x1fff;
    (if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        r + 1
    } else {
        r
    }) as u16
}

impl Block<'_> {
    fn special(&self, t: &Thread, lane: u32, warp: u32, s: Sreg) -> u64 {
        let c = self.cfg;
        match s {
            Sreg::Tid(d) => t.tid[d as usize] as u64,
            Sreg::Ntid(d) => c.block[d as usize] as u64,
            Sreg::Ctaid(d) => self.ctaid[d as usize] as u64,
            Sreg::Nctaid(d) => c.grid[d as usize] as u64,
            Sreg::Laneid => lane as u64,
            Sreg::Warpid => warp as u64,
            Sreg::Nwarpid => 64,
            Sreg::Smid => 0,
            Sreg::Nsmid => 108,
            Sreg::Clock | Sreg::Clock64 | Sreg::Globaltimer => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
            Sreg::LanemaskEq => 1 << lane,
            Sreg::LanemaskLt => (1u64 << lane) - 1,
            Sreg::LanemaskLe => (1u64 << (lane + 1)) - 1,
            Sreg::LanemaskGt => !((1u64 << (lane + 1)) - 1) & 0xffff_ffff,
            Sreg::LanemaskGe => !((1u64 << lane) - 1) & 0xffff_ffff,
            Sreg::DynSmem => c.dynamic_shared_bytes as u64,
        }
    }

    fn symbol(&self, name: &str) -> Result<u64, ExecError> {
        if let Some(&(space, off)) = self.syms.local.get(name) {
            return Ok(match space {
                Space::Shared => off,
                Space::Local => off,
                _ => off,
            });
        }
        if let Some(p) = self.f.params.iter().find(|p| p.name == name) {
            return Ok(PARAM_WINDOW + p.offset as u64);
        }
        (self.syms.global)(name)
            .ok_or_else(|| ExecError::Unsupported(format!("unknown symbol {name}")))
    }

    fn val(
        &self,
        t: &Thread,
        lane: u32,
        warp: u32,
        o: &Operand,
        ty: Type,
    ) -> Result<u64, ExecError> {
        Ok(match o {
            Operand::Reg(r) => t.regs[*r as usize] & mask(ty.size),
            Operand::NotReg(r) => (t.regs[*r as usize] == 0) as u64,
            Operand::Imm(v) => *v & mask(ty.size),
            Operand::Special(s) => self.special(t, lane, warp, *s) & mask(ty.size),
            Operand::Sym(name) => self.symbol(name)?,
            Operand::Addr { .. } | Operand::Vector(_) | Operand::Label(_) | Operand::Sink => {
                return Err(ExecError::Unsupported(format!("operand {o:?}")))
            }
        })
    }

    /// The address an `[...]` operand names, in `space` (shared/local/param offsets are window
    /// addresses; generic and global are device or window addresses).
    fn addr(&self, t: &Thread, o: &Operand, space: Space) -> Result<u64, ExecError> {
        let Operand::Addr { base, offset } = o else {
            return Err(ExecError::Unsupported(format!("address {o:?}")));
        };
        let b = match base {
            Base::Reg(r) => t.regs[*r as usize],
            Base::Abs => 0,
            Base::Sym(name) => self.symbol(name)?,
        };
        let a = b.wrapping_add(*offset as u64);
        Ok(match space {
            Space::Shared if a & WINDOW_MASK == 0 => SHARED_WINDOW + a,
            Space::Local if a & WINDOW_MASK == 0 => LOCAL_WINDOW + a,
            Space::Param if a & WINDOW_MASK == 0 => PARAM_WINDOW + a,
            _ => a,
        })
    }

    fn load(&mut self, t: &Thread, addr: u64, out: &mut [u8]) -> Result<(), ExecError> {
        let n = out.len() as u64;
        let range = |buf: &[u8], off: u64| -> Result<std::ops::Range<usize>, ExecError> {
            let end = off
                .checked_add(n)
                .filter(|&e| e <= buf.len() as u64)
                .ok_or(ExecError::IllegalAddress(addr))?;
            Ok(off as usize..end as usize)
        };
        match addr & WINDOW_MASK {
            SHARED_WINDOW => {
                out.copy_from_slice(&self.shared[range(&self.shared, addr - SHARED_WINDOW)?])
            }
            LOCAL_WINDOW => out.copy_from_slice(&t.local[range(&t.local, addr - LOCAL_WINDOW)?]),
            PARAM_WINDOW => {
                out.copy_from_slice(&self.params[range(self.params, addr - PARAM_WINDOW)?])
            }
            _ => self.mem.read(addr, out)?,
        }
        Ok(())
    }

    fn store(&mut self, t: &mut Thread, addr: u64, data: &[u8]) -> Result<(), ExecError> {
        let n = data.len() as u64;
        let check = |len: usize, off: u64| -> Result<usize, ExecError> {
            off.checked_add(n)
                .filter(|&e| e <= len as u64)
                .map(|_| off as usize)
                .ok_or(ExecError::IllegalAddress(addr))
        };
        match addr & WINDOW_MASK {
            SHARED_WINDOW => {
                let o = check(self.shared.len(), addr - SHARED_WINDOW)?;
                self.shared[o..o + data.len()].copy_from_slice(data);
            }
            LOCAL_WINDOW => {
                let o = check(t.local.len(), addr - LOCAL_WINDOW)?;
                t.local[o..o + data.len()].copy_from_slice(data);
            }
            PARAM_WINDOW => return Err(ExecError::IllegalAddress(addr)),
            _ => self.mem.write(addr, data)?,
        }
        Ok(())
    }

    fn set(t: &mut Thread, o: &Operand, v: u64) {
        match o {
            Operand::Reg(r) => t.regs[*r as usize] = v,
            _ => {}
        }
    }
}

fn cmp(op: &str, a: u64, b: u64, ty: Type) -> bool {
    match ty.kind {
        Ty::F => {
            let (x, y) = (fv(a, ty), fv(b, ty));
            let unordered = x.is_nan() || y.is_nan();
            match op {
                "eq" => x == y,
                "ne" => !unordered && x != y,
                "lt" => x < y,
                "le" => x <= y,
                "gt" => x > y,
                "ge" => x >= y,
                "equ" => unordered || x == y,
                "neu" => unordered || x != y,
                "ltu" => unordered || x < y,
                "leu" => unordered || x <= y,
                "gtu" => unordered || x > y,
                "geu" => unordered || x >= y,
                "num" => !unordered,
                "nan" => unordered,
                _ => false,
            }
        }
        Ty::S => {
            let (x, y) = (sext(a, ty.size), sext(b, ty.size));
            match op {
                "eq" => x == y,
                "ne" => x != y,
                "lt" => x < y,
                "le" => x <= y,
                "gt" => x > y,
                "ge" => x >= y,
                _ => false,
            }
        }
        _ => match op {
            "eq" => a == b,
            "ne" => a != b,
            "lt" | "lo" => a < b,
            "le" | "ls" => a <= b,
            "gt" | "hi" => a > b,
            "ge" | "hs" => a >= b,
            _ => false,
        },
    }
}

/// Integer or float arithmetic of two operands (of each half, for packed pairs).
fn arith(i: &Inst, a: u64, b: u64) -> Result<u64, ExecError> {
    match i.mods.x2 {
        Some(e) => {
            let lo = arith_of(i, e, a & 0xffff, b & 0xffff)?;
            let hi = arith_of(i, e, (a >> 16) & 0xffff, (b >> 16) & 0xffff)?;
            Ok((hi & 0xffff) << 16 | (lo & 0xffff))
        }
        None => arith_of(i, i.ty, a, b),
    }
}

fn arith_of(i: &Inst, t: Type, a: u64, b: u64) -> Result<u64, ExecError> {
    let m = mask(t.size);
    if t.kind == Ty::F {
        let (x, y) = (fv(a, t), fv(b, t));
        let r = match i.op {
            Op::Add => x + y,
            Op::Sub => x - y,
            Op::Mul => x * y,
            Op::Div => x / y,
            Op::Min => x.min(y),
            Op::Max => x.max(y),
            Op::Copysign => y.copysign(x),
            _ => return Err(ExecError::Unsupported(i.text.clone())),
        };
        let r = if t.size == 4 { (r as f32) as f64 } else { r };
        let r = if i.mods.sat { r.clamp(0.0, 1.0) } else { r };
        return Ok(from_f(r, t));
    }
    let signed = t.kind == Ty::S;
    let bits = t.size as u32 * 8;
    Ok(match i.op {
        Op::Add => a.wrapping_add(b) & m,
        Op::Sub => a.wrapping_sub(b) & m,
        Op::Mul if i.mods.wide => {
            if signed {
                (sext(a, t.size).wrapping_mul(sext(b, t.size))) as u64
            } else {
                a.wrapping_mul(b)
            }
        }
        Op::Mul if i.mods.hi => {
            if signed {
                ((sext(a, t.size) as i128 * sext(b, t.size) as i128) >> bits) as u64 & m
            } else {
                ((a as u128 * b as u128) >> bits) as u64 & m
            }
        }
        Op::Mul | Op::Mul24 => a.wrapping_mul(b) & m,
        Op::Div => {
            if b == 0 {
                m
            } else if signed {
                sext(a, t.size).wrapping_div(sext(b, t.size)) as u64 & m
            } else {
                a / b
            }
        }
        Op::Rem => {
            if b == 0 {
                a
            } else if signed {
                sext(a, t.size).wrapping_rem(sext(b, t.size)) as u64 & m
            } else {
                a % b
            }
        }
        Op::Min => {
            if signed {
                sext(a, t.size).min(sext(b, t.size)) as u64 & m
            } else {
                a.min(b)
            }
        }
        Op::Max => {
            if signed {
                sext(a, t.size).max(sext(b, t.size)) as u64 & m
            } else {
                a.max(b)
            }
        }
        Op::And => a & b,
        Op::Or => a | b,
        Op::Xor => a ^ b,
        Op::Shl => {
            if b >= bits as u64 {
                0
            } else {
                (a << b) & m
            }
        }
        Op::Shr => {
            let sh = b.min(bits as u64 - 1 + signed as u64);
            if signed {
                (sext(a, t.size) >> sh.min(63)) as u64 & m
            } else if b >= bits as u64 {
                0
            } else {
                a >> sh
            }
        }
        _ => return Err(ExecError::Unsupported(i.text.clone())),
    })
}

fn cvt(i: &Inst, v: u64) -> u64 {
    let (dst, src) = (i.ty, i.ty2);
    match (dst.kind == Ty::F, src.kind == Ty::F) {
        (true, true) => {
            let x = fv(v, src);
            let x = match i.mods.rnd_int {
                Some('n') => x.round_ties_even(),
                Some('z') => x.trunc(),
                Some('m') => x.floor(),
                Some('p') => x.ceil(),
                _ => x,
            };
            let x = if i.mods.sat { x.clamp(0.0, 1.0) } else { x };
            from_f(x, dst)
        }
        (true, false) => {
            let x = if src.kind == Ty::S {
                sext(v, src.size) as f64
            } else {
                (v & mask(src.size)) as f64
            };
            from_f(x, dst)
        }
        (false, true) => {
            let x = fv(v, src);
            let x = match i.mods.rnd_int {
                Some('n') => x.round_ties_even(),
                Some('m') => x.floor(),
                Some('p') => x.ceil(),
                _ => x.trunc(),
            };
            if x.is_nan() {
                return 0;
            }
            let r = if dst.kind == Ty::S {
                let bits = dst.size as u32 * 8;
                let (lo, hi) = (
                    -(2f64.powi(bits as i32 - 1)),
                    2f64.powi(bits as i32 - 1) - 1.0,
                );
                x.clamp(lo, hi) as i64 as u64
            } else {
                let hi = 2f64.powi(dst.size as i32 * 8) - 1.0;
                x.clamp(0.0, hi) as u64
            };
            r & mask(dst.size)
        }
        (false, false) => {
            let x = if src.kind == Ty::S {
                sext(v, src.size) as u64
            } else {
                v & mask(src.size)
            };
            if i.mods.sat && dst.size < 8 {
                let bits = dst.size as u32 * 8;
                let xs = if src.kind == Ty::S {
                    x as i64 as i128
                } else {
                    x as i128
                };
                let (lo, hi): (i128, i128) = if dst.kind == Ty::S {
                    (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
                } else {
                    (0, (1 << bits) - 1)
                };
                return (xs.clamp(lo, hi) as u64) & mask(dst.size);
            }
            let r = x & mask(dst.size);
            if dst.kind == Ty::S {
                sext(r, dst.size) as u64 & mask(dst.size.max(4))
            } else {
                r
            }
        }
    }
}

fn unary_float(i: &Inst, a: u64) -> Result<u64, ExecError> {
    let t = i.ty;
    let x = fv(a, t);
    let r = match i.op {
        Op::Rcp => 1.0 / x,
        Op::Sqrt => x.sqrt(),
        Op::Rsqrt => 1.0 / x.sqrt(),
        Op::Sin => x.sin(),
        Op::Cos => x.cos(),
        Op::Ex2 => x.exp2(),
        Op::Lg2 => x.log2(),
        Op::Tanh => x.tanh(),
        Op::Abs => x.abs(),
        Op::Neg => -x,
        _ => return Err(ExecError::Unsupported(i.text.clone())),
    };
    Ok(from_f(r, t))
}

/// Runs one block to completion.
pub fn run_block(
    f: &Function,
    cfg: &LaunchConfig,
    ctaid: [u32; 3],
    params: &[u8],
    shared_bytes: usize,
    local_bytes: usize,
    syms: &Symbols,
    mem: &mut dyn DeviceMemory,
) -> Result<u64, ExecError> {
    let [bx, by, bz] = cfg.block;
    let nthreads = (bx * by * bz) as usize;
    let nregs = f.regs.len();
    let mut threads: Vec<Thread> = (0..nthreads)
        .map(|i| {
            let i = i as u32;
            Thread {
                regs: vec![0; nregs],
                pc: 0,
                carry: 0,
                done: false,
                at_barrier: false,
                local: vec![0; local_bytes],
                tid: [i % bx, (i / bx) % by, i / (bx * by)],
            }
        })
        .collect();
    let mut b = Block {
        f,
        cfg,
        ctaid,
        params,
        shared: vec![0; shared_bytes],
        syms,
        mem,
        lane_instructions: 0,
    };
    let nwarps = nthreads.div_ceil(32);
    loop {
        let mut progressed = false;
        for w in 0..nwarps {
            let lanes = w * 32..((w + 1) * 32).min(nthreads);
            // Run this warp until all its threads are done or waiting at a barrier.
            loop {
                let pc = threads[lanes.clone()]
                    .iter()
                    .filter(|t| !t.done && !t.at_barrier)
                    .map(|t| t.pc)
                    .min();
                let Some(pc) = pc else { break };
                let active: Vec<usize> = lanes
                    .clone()
                    .filter(|&l| !threads[l].done && !threads[l].at_barrier && threads[l].pc == pc)
                    .collect();
                step(&mut b, &mut threads, &active, w as u32, pc)?;
                progressed = true;
            }
        }
        if threads.iter().all(|t| t.done) {
            return Ok(b.lane_instructions);
        }
        if threads.iter().filter(|t| !t.done).all(|t| t.at_barrier) {
            for t in threads.iter_mut() {
                t.at_barrier = false;
            }
            continue;
        }
        if !progressed {
            return Err(ExecError::Unsupported(
                "deadlock: threads wait at different barriers".into(),
            ));
        }
    }
}

/// Executes the instruction at `pc` for the `active` lanes (all at `pc`).
fn step(
    b: &mut Block,
    threads: &mut [Thread],
    active: &[usize],
    warp: u32,
    pc: usize,
) -> Result<(), ExecError> {
    let f = b.f;
    let Some(i) = f.insts.get(pc) else {
        for &l in active {
            threads[l].done = true;
        }
        return Ok(());
    };
    b.lane_instructions += active.len() as u64;
    // Guard predicate.
    let runs: Vec<usize> = active
        .iter()
        .copied()
        .filter(|&l| match i.pred {
            Some((r, neg)) => (threads[l].regs[r as usize] != 0) != neg,
            None => true,
        })
        .collect();
    let lane_of = |l: usize| (l % 32) as u32;
    match i.op {
        Op::Shfl | Op::Vote | Op::Activemask | Op::Match | Op::Redux => {
            let warp_mask: u64 = runs.iter().map(|&l| 1u64 << lane_of(l)).sum();
            let ty = Type {
                kind: Ty::B,
                size: 4,
            };
            match i.op {
                Op::Activemask => {
                    for &l in &runs {
                        Block::set(&mut threads[l], &i.args[0], warp_mask);
                    }
                }
                Op::Vote => {
                    // vote.sync.mode.pred d, {!}a, membermask
                    let src_idx = i.args.len() - 2;
                    let mut vals = Vec::new();
                    for &l in &runs {
                        vals.push((
                            l,
                            b.val(
                                &threads[l],
                                lane_of(l),
                                warp,
                                &i.args[src_idx],
                                Type {
                                    kind: Ty::Pred,
                                    size: 1,
                                },
                            )? != 0,
                        ));
                    }
                    let ballot: u64 = vals
                        .iter()
                        .filter(|(_, v)| *v)
                        .map(|(l, _)| 1u64 << lane_of(*l))
                        .sum();
                    let r = match i.mods.vote_mode {
                        "all" => (vals.iter().all(|(_, v)| *v)) as u64,
                        "any" => (ballot != 0) as u64,
                        "uni" => (vals.iter().all(|(_, v)| *v) || ballot == 0) as u64,
                        _ => ballot,
                    };
                    for &l in &runs {
                        Block::set(&mut threads[l], &i.args[0], r);
                    }
                }
                Op::Redux => {
                    // redux.sync.op.type d, a, membermask: every lane gets the whole reduction.
                    let t = i.ty;
                    let mut acc: Option<u64> = None;
                    for &l in &runs {
                        let x = b.val(&threads[l], lane_of(l), warp, &i.args[1], t)? & 0xffff_ffff;
                        acc = Some(match acc {
                            None => x,
                            Some(y) => redux_op(i.mods.atom_op, t, y, x)
                                .ok_or_else(|| ExecError::Unsupported(i.text.clone()))?,
                        });
                    }
                    let r = acc.unwrap_or(0);
                    for &l in &runs {
                        Block::set(&mut threads[l], &i.args[0], r);
                    }
                }
                Op::Match => {
                    let mut vals = Vec::new();
                    for &l in &runs {
                        vals.push((l, b.val(&threads[l], lane_of(l), warp, &i.args[1], i.ty)?));
                    }
                    for &(l, v) in &vals {
                        let m: u64 = vals
                            .iter()
                            .filter(|(_, x)| *x == v)
                            .map(|(o, _)| 1u64 << lane_of(*o))
                            .sum();
                        let r = if i.mods.vote_mode == "all" {
                            if m == warp_mask {
                                m
                            } else {
                                0
                            }
                        } else {
                            m
                        };
                        Block::set(&mut threads[l], &i.args[0], r);
                    }
                }
                _ => {
                    // shfl.sync.mode.b32 d[|p], a, b, c, membermask
                    let (dst, pdst) = match &i.args[0] {
                        Operand::Vector(v) => (v[0].clone(), v.get(1).cloned()),
                        o => (o.clone(), None),
                    };
                    let mut src = [0u64; 32];
                    let mut present = 0u64;
                    for &l in &runs {
                        src[lane_of(l) as usize] =
                            b.val(&threads[l], lane_of(l), warp, &i.args[1], ty)?;
                        present |= 1 << lane_of(l);
                    }
                    for &l in &runs {
                        let lane = lane_of(l) as i64;
                        let bval = b.val(&threads[l], lane as u32, warp, &i.args[2], ty)? as i64;
                        let c = b.val(&threads[l], lane as u32, warp, &i.args[3], ty)? as i64;
                        let max_lane = c & 0x1f;
                        let seg_mask = (c >> 8) & 0x1f;
                        let min_lane = lane & seg_mask;
                        let max_lane = min_lane | (max_lane & !seg_mask);
                        let j = match i.mods.shfl_mode {
                            "up" => lane - bval,
                            "down" => lane + bval,
                            "bfly" => lane ^ bval,
                            _ => min_lane | (bval & !seg_mask),
                        };
                        let ok = match i.mods.shfl_mode {
                            "up" => j >= min_lane,
                            _ => j <= max_lane,
                        };
                        let j = if ok && (0..32).contains(&j) && present & (1 << j) != 0 {
                            j
                        } else {
                            lane
                        };
                        let v = src[j as usize];
                        Block::set(&mut threads[l], &dst, v);
                        if let Some(p) = &pdst {
                            Block::set(&mut threads[l], p, ok as u64);
                        }
                    }
                }
            }
            for &l in active {
                threads[l].pc += 1;
            }
            return Ok(());
        }
        _ => {}
    }
    for &l in active {
        threads[l].pc += 1;
    }
    for l in runs {
        exec_lane(b, &mut threads[l], lane_of(l), warp, i)?;
    }
    Ok(())
}

fn exec_lane(
    b: &mut Block,
    t: &mut Thread,
    lane: u32,
    warp: u32,
    i: &Inst,
) -> Result<(), ExecError> {
    let ty = i.ty;
    let a = &i.args;
    let v = |b: &Block, t: &Thread, k: usize, ty: Type| -> Result<u64, ExecError> {
        b.val(
            t,
            lane,
            warp,
            a.get(k)
                .ok_or_else(|| ExecError::Unsupported(i.text.clone()))?,
            ty,
        )
    };
    match i.op {
        Op::Mov => {
            match (&a[0], &a[1]) {
                (Operand::Vector(parts), src) => {
                    // Unpack: mov.b64 {lo, hi}, %rd
                    let x = b.val(t, lane, warp, src, ty)?;
                    let n = parts.len() as u32;
                    let w = (ty.size as u32 * 8) / n;
                    for (k, p) in parts.iter().enumerate() {
                        Block::set(t, p, (x >> (w * k as u32)) & ((1u64 << w) - 1));
                    }
                }
                (dst, Operand::Vector(parts)) => {
                    let n = parts.len() as u32;
                    let w = (ty.size as u32 * 8) / n;
                    let mut x = 0u64;
                    for (k, p) in parts.iter().enumerate() {
                        x |= (b.val(
                            t,
                            lane,
                            warp,
                            p,
                            Type {
                                kind: Ty::B,
                                size: (w / 8) as u8,
                            },
                        )? & ((1u64 << w) - 1))
                            << (w * k as u32);
                    }
                    Block::set(t, dst, x);
                }
                (dst, src) => {
                    let x = b.val(t, lane, warp, src, ty)?;
                    Block::set(t, dst, x);
                }
            }
        }
        Op::Ld | Op::Ldu => {
            let addr = b.addr(t, &a[1], i.space)?;
            let n = ty.size as usize;
            let count = if i.mods.vec > 0 {
                i.mods.vec as usize
            } else {
                1
            };
            let mut buf = [0u8; 64];
            b.load(t, addr, &mut buf[..n * count])?;
            let dsts: Vec<Operand> = match &a[0] {
                Operand::Vector(v) => v.clone(),
                o => vec![o.clone()],
            };
            for (k, d) in dsts.iter().enumerate() {
                let mut w = [0u8; 8];
                w[..n].copy_from_slice(&buf[k * n..k * n + n]);
                let mut x = u64::from_le_bytes(w);
                if ty.kind == Ty::S {
                    x = sext(x, ty.size) as u64;
                }
                Block::set(t, d, x);
            }
        }
        Op::St => {
            let addr = b.addr(t, &a[0], i.space)?;
            let n = ty.size as usize;
            let srcs: Vec<Operand> = match &a[1] {
                Operand::Vector(v) => v.clone(),
                o => vec![o.clone()],
            };
            let mut buf = Vec::with_capacity(n * srcs.len());
            for s in &srcs {
                let x = b.val(t, lane, warp, s, ty)?;
                buf.extend_from_slice(&x.to_le_bytes()[..n]);
            }
            b.store(t, addr, &buf)?;
        }
        Op::Cvta => {
            let x = v(b, t, 1, ty)?;
            let win = match i.mods.space2 {
                Some(Space::Shared) => SHARED_WINDOW,
                Some(Space::Local) => LOCAL_WINDOW,
                Some(Space::Param) => PARAM_WINDOW,
                _ => 0,
            };
            let r = if i.mods.to {
                if win != 0 && x & WINDOW_MASK == win {
                    x - win
                } else {
                    x
                }
            } else if x & WINDOW_MASK == 0 {
                x + win
            } else {
                x
            };
            Block::set(t, &a[0], r);
        }
        Op::Isspacep => {
            let x = v(
                b,
                t,
                1,
                Type {
                    kind: Ty::U,
                    size: 8,
                },
            )?;
            let r = match i.mods.space2 {
                Some(Space::Shared) => x & WINDOW_MASK == SHARED_WINDOW,
                Some(Space::Local) => x & WINDOW_MASK == LOCAL_WINDOW,
                Some(Space::Global) => x & WINDOW_MASK == 0,
                _ => false,
            };
            Block::set(t, &a[0], r as u64);
        }
        Op::Cvt => {
            let x = v(b, t, 1, i.ty2)?;
            Block::set(t, &a[0], cvt(i, x));
        }
        Op::Add | Op::Sub if i.mods.cc => {
            let (x, y) = (v(b, t, 1, ty)?, v(b, t, 2, ty)?);
            let bits = ty.size as u32 * 8;
            let (r, c) = if i.op == Op::Add {
                let s = x as u128 + y as u128;
                (s as u64 & mask(ty.size), (s >> bits) as u64 & 1)
            } else {
                let s = (x as u128).wrapping_sub(y as u128);
                (s as u64 & mask(ty.size), (x < y) as u64)
            };
            t.carry = c;
            Block::set(t, &a[0], r);
        }
        Op::Addc | Op::Subc => {
            let (x, y) = (v(b, t, 1, ty)?, v(b, t, 2, ty)?);
            let bits = ty.size as u32 * 8;
            let (r, c) = if i.op == Op::Addc {
                let s = x as u128 + y as u128 + t.carry as u128;
                (s as u64 & mask(ty.size), (s >> bits) as u64 & 1)
            } else {
                let s = (x as u128).wrapping_sub(y as u128 + t.carry as u128);
                (
                    s as u64 & mask(ty.size),
                    ((x as u128) < y as u128 + t.carry as u128) as u64,
                )
            };
            if i.mods.cc {
                t.carry = c;
            }
            Block::set(t, &a[0], r);
        }
        Op::Add
        | Op::Sub
        | Op::Mul
        | Op::Div
        | Op::Rem
        | Op::Min
        | Op::Max
        | Op::And
        | Op::Or
        | Op::Xor
        | Op::Shl
        | Op::Shr
        | Op::Copysign
        | Op::Mul24 => {
            let sty = if matches!(i.op, Op::Shl | Op::Shr) {
                Type {
                    kind: Ty::U,
                    size: 4,
                }
            } else {
                ty
            };
            let x = v(b, t, 1, ty)?;
            let y = v(b, t, 2, sty)?;
            let r = if ty.kind == Ty::Pred {
                match i.op {
                    Op::And => x & y,
                    Op::Or => x | y,
                    Op::Xor => x ^ y,
                    _ => return Err(ExecError::Unsupported(i.text.clone())),
                }
            } else {
                arith(i, x, y)?
            };
            Block::set(t, &a[0], r);
        }
        Op::Mad | Op::Fma | Op::Madc | Op::Mad24 => {
            let (x, y, z) = (
                v(b, t, 1, ty)?,
                v(b, t, 2, ty)?,
                v(
                    b,
                    t,
                    3,
                    if i.mods.wide {
                        Type {
                            size: ty.size * 2,
                            ..ty
                        }
                    } else {
                        ty
                    },
                )?,
            );
            let r = if ty.kind == Ty::F {
                let r = if ty.size == 4 {
                    f32v(x).mul_add(f32v(y), f32v(z)) as f64
                } else {
                    fv(x, ty).mul_add(fv(y, ty), fv(z, ty))
                };
                let r = if i.mods.sat { r.clamp(0.0, 1.0) } else { r };
                from_f(r, ty)
            } else {
                let bits = ty.size as u32 * 8;
                let prod: u128 = if ty.kind == Ty::S {
                    (sext(x, ty.size) as i128 * sext(y, ty.size) as i128) as u128
                } else {
                    x as u128 * y as u128
                };
                let (p, wm) = if i.mods.wide {
                    (prod as u64, mask(ty.size * 2))
                } else if i.mods.hi {
                    ((prod >> bits) as u64 & mask(ty.size), mask(ty.size))
                } else {
                    (prod as u64 & mask(ty.size), mask(ty.size))
                };
                let cin = if i.op == Op::Madc { t.carry } else { 0 };
                let s = p as u128 + z as u128 + cin as u128;
                let obits = if i.mods.wide { bits * 2 } else { bits };
                if i.mods.cc {
                    t.carry = (s >> obits) as u64 & 1;
                }
                s as u64 & wm
            };
            Block::set(t, &a[0], r);
        }
        Op::Abs | Op::Neg if ty.kind != Ty::F => {
            let x = sext(v(b, t, 1, ty)?, ty.size);
            let r = if i.op == Op::Abs {
                x.wrapping_abs()
            } else {
                x.wrapping_neg()
            };
            Block::set(t, &a[0], r as u64 & mask(ty.size));
        }
        Op::Abs
        | Op::Neg
        | Op::Rcp
        | Op::Sqrt
        | Op::Rsqrt
        | Op::Sin
        | Op::Cos
        | Op::Ex2
        | Op::Lg2
        | Op::Tanh => {
            let r = unary_float(i, v(b, t, 1, ty)?)?;
            Block::set(t, &a[0], r);
        }
        Op::Not => {
            let x = v(b, t, 1, ty)?;
            let r = if ty.kind == Ty::Pred {
                (x == 0) as u64
            } else {
                !x & mask(ty.size)
            };
            Block::set(t, &a[0], r);
        }
        Op::Cnot => {
            let x = v(b, t, 1, ty)?;
            Block::set(t, &a[0], (x == 0) as u64);
        }
        Op::Setp | Op::Set => {
            let (x, y) = (v(b, t, 1, ty)?, v(b, t, 2, ty)?);
            let mut r = cmp(i.mods.cmp, x, y, ty);
            if !i.mods.bool_op.is_empty() {
                let c = v(
                    b,
                    t,
                    3,
                    Type {
                        kind: Ty::Pred,
                        size: 1,
                    },
                )? != 0;
                r = match i.mods.bool_op {
                    "and" => r && c,
                    "or" => r || c,
                    _ => r ^ c,
                };
            }
            match &a[0] {
                Operand::Vector(ps) => {
                    Block::set(t, &ps[0], r as u64);
                    if let Some(p) = ps.get(1) {
                        Block::set(t, p, (!r) as u64);
                    }
                }
                d => {
                    let out = if i.op == Op::Set {
                        if i.ty.kind == Ty::F && false {
                            0
                        } else if r {
                            u32::MAX as u64
                        } else {
                            0
                        }
                    } else {
                        r as u64
                    };
                    Block::set(t, d, out);
                }
            }
        }
        Op::Selp => {
            let c = v(
                b,
                t,
                3,
                Type {
                    kind: Ty::Pred,
                    size: 1,
                },
            )?;
            let r = if c != 0 {
                v(b, t, 1, ty)?
            } else {
                v(b, t, 2, ty)?
            };
            Block::set(t, &a[0], r);
        }
        Op::Bra => {
            if let Some(Operand::Label(target)) = a.last() {
                t.pc = *target;
            }
        }
        Op::Ret | Op::Exit => t.done = true,
        Op::Trap | Op::Brkpt => return Err(ExecError::Trap),
        Op::Bar => t.at_barrier = true,
        Op::Membar | Op::Fence | Op::Nanosleep | Op::Prefetch => {}
        Op::Atom | Op::Red => {
            let addr = b.addr(t, &a[if i.op == Op::Atom { 1 } else { 0 }], i.space)?;
            let base = if i.op == Op::Atom { 2 } else { 1 };
            let n = ty.size as usize;
            let mut buf = [0u8; 8];
            b.load(t, addr, &mut buf[..n])?;
            let old = u64::from_le_bytes(buf);
            let x = v(b, t, base, ty)?;
            let new = match i.mods.atom_op {
                "add" if ty.kind == Ty::F => from_f(fv(old, ty) + fv(x, ty), ty),
                "add" => old.wrapping_add(x) & mask(ty.size),
                "min" if ty.kind == Ty::F => from_f(fv(old, ty).min(fv(x, ty)), ty),
                "max" if ty.kind == Ty::F => from_f(fv(old, ty).max(fv(x, ty)), ty),
                "min" if ty.kind == Ty::S => {
                    sext(old, ty.size).min(sext(x, ty.size)) as u64 & mask(ty.size)
                }
                "max" if ty.kind == Ty::S => {
                    sext(old, ty.size).max(sext(x, ty.size)) as u64 & mask(ty.size)
                }
                "min" => old.min(x),
                "max" => old.max(x),
                "exch" => x,
                "cas" => {
                    if old == x {
                        v(b, t, base + 1, ty)?
                    } else {
                        old
                    }
                }
                "and" => old & x,
                "or" => old | x,
                "xor" => old ^ x,
                "inc" => {
                    if old >= x {
                        0
                    } else {
                        old + 1
                    }
                }
                "dec" => {
                    if old == 0 || old > x {
                        x
                    } else {
                        old - 1
                    }
                }
                _ => return Err(ExecError::Unsupported(i.text.clone())),
            };
            b.store(t, addr, &new.to_le_bytes()[..n])?;
            if i.op == Op::Atom {
                Block::set(t, &a[0], old);
            }
        }
        Op::Popc => {
            let x = v(b, t, 1, ty)?;
            Block::set(t, &a[0], x.count_ones() as u64);
        }
        Op::Clz => {
            let x = v(b, t, 1, ty)?;
            Block::set(
                t,
                &a[0],
                (x.leading_zeros() - (64 - ty.size as u32 * 8)) as u64,
            );
        }
        Op::Brev => {
            let x = v(b, t, 1, ty)?;
            Block::set(t, &a[0], x.reverse_bits() >> (64 - ty.size as u32 * 8));
        }
        Op::Bfe => {
            let x = v(b, t, 1, ty)?;
            let pos = v(
                b,
                t,
                2,
                Type {
                    kind: Ty::U,
                    size: 4,
                },
            )? & 0xff;
            let len = v(
                b,
                t,
                3,
                Type {
                    kind: Ty::U,
                    size: 4,
                },
            )? & 0xff;
            let bits = ty.size as u64 * 8;
            let r = if len == 0 {
                0
            } else {
                let field = if pos >= bits { 0 } else { x >> pos }
                    & if len >= 64 { u64::MAX } else { (1 << len) - 1 };
                if ty.kind == Ty::S {
                    let sign_pos = (pos + len - 1).min(bits - 1);
                    let sign = (x >> sign_pos) & 1;
                    let l = len.min(bits);
                    if sign == 1 && l < 64 {
                        (field | (u64::MAX << l)) & mask(ty.size)
                    } else {
                        field
                    }
                } else {
                    field
                }
            };
            Block::set(t, &a[0], r);
        }
        Op::Bfi => {
            let (x, y) = (v(b, t, 1, ty)?, v(b, t, 2, ty)?);
            let pos = v(
                b,
                t,
                3,
                Type {
                    kind: Ty::U,
                    size: 4,
                },
            )? & 0xff;
            let len = v(
                b,
                t,
                4,
                Type {
                    kind: Ty::U,
                    size: 4,
                },
            )? & 0xff;
            let bits = ty.size as u64 * 8;
            let r = if len == 0 || pos >= bits {
                y
            } else {
                let m = (if len >= 64 {
                    u64::MAX
                } else {
                    (1u64 << len) - 1
                }) << pos;
                ((y & !m) | ((x << pos) & m)) & mask(ty.size)
            };
            Block::set(t, &a[0], r);
        }
        Op::Prmt => {
            let (x, y) = (v(b, t, 1, ty)?, v(b, t, 2, ty)?);
            let sel = v(b, t, 3, ty)?;
            let bytes = ((y & 0xffff_ffff) << 32) | (x & 0xffff_ffff);
            let mut r = 0u64;
            for k in 0..4 {
                let s = (sel >> (k * 4)) & 0xf;
                let byte = (bytes >> ((s & 7) * 8)) & 0xff;
                let byte = if s & 8 != 0 {
                    if byte & 0x80 != 0 {
                        0xff
                    } else {
                        0
                    }
                } else {
                    byte
                };
                r |= byte << (k * 8);
            }
            Block::set(t, &a[0], r);
        }
        Op::Shf => {
            let (lo, hi) = (v(b, t, 1, ty)?, v(b, t, 2, ty)?);
            let mut sh = v(b, t, 3, ty)?;
            sh = if i.mods.shf_wrap { sh & 31 } else { sh.min(32) };
            let x = (hi << 32) | lo;
            let r = if i.mods.shf_left {
                (x << sh) >> 32
            } else {
                x >> sh
            };
            Block::set(t, &a[0], r & 0xffff_ffff);
        }
        Op::Lop3 => {
            let (x, y, z) = (v(b, t, 1, ty)?, v(b, t, 2, ty)?, v(b, t, 3, ty)?);
            let lut = v(b, t, 4, ty)?;
            let mut r = 0u64;
            for bit in 0..32 {
                let idx = (((x >> bit) & 1) << 2) | (((y >> bit) & 1) << 1) | ((z >> bit) & 1);
                r |= ((lut >> idx) & 1) << bit;
            }
            Block::set(t, &a[0], r);
        }
        Op::Testp => {
            let x = fv(v(b, t, 1, ty)?, ty);
            Block::set(t, &a[0], x.is_finite() as u64);
        }
        Op::Sad => {
            let (x, y, z) = (v(b, t, 1, ty)?, v(b, t, 2, ty)?, v(b, t, 3, ty)?);
            let d = if ty.kind == Ty::S {
                (sext(x, ty.size) - sext(y, ty.size)).unsigned_abs()
            } else {
                x.abs_diff(y)
            };
            Block::set(t, &a[0], (d + z) & mask(ty.size));
        }
        Op::Dp4a => {
            let (x, y, z) = (v(b, t, 1, ty)?, v(b, t, 2, i.ty2)?, v(b, t, 3, ty)?);
            let mut s = z as i64;
            for k in 0..4 {
                let xa = (x >> (k * 8)) & 0xff;
                let ya = (y >> (k * 8)) & 0xff;
                let xa = if ty.kind == Ty::S {
                    xa as i8 as i64
                } else {
                    xa as i64
                };
                let ya = if i.ty2.kind == Ty::S {
                    ya as i8 as i64
                } else {
                    ya as i64
                };
                s += xa * ya;
            }
            Block::set(t, &a[0], s as u64 & 0xffff_ffff);
        }
        Op::Shfl | Op::Vote | Op::Activemask | Op::Match | Op::Redux | Op::Mov64Split => {
            unreachable!("warp-wide, handled in step")
        }
    }
    Ok(())
}

/// One step of a `redux.sync` reduction on 32-bit values.
fn redux_op(op: &str, t: Type, a: u64, b: u64) -> Option<u64> {
    let (sa, sb) = (a as u32 as i32, b as u32 as i32);
    let signed = t.kind == Ty::S;
    Some(match op {
        "add" => (a as u32).wrapping_add(b as u32) as u64,
        "min" if signed => sa.min(sb) as u32 as u64,
        "max" if signed => sa.max(sb) as u32 as u64,
        "min" => a.min(b),
        "max" => a.max(b),
        "and" => a & b,
        "or" => a | b,
        "xor" => a ^ b,
        _ => return None,
    })
}
