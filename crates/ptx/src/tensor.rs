//! Warp-level matrix instructions: `ldmatrix` and `mma.sync` for the shapes and types public
//! libraries' PTX uses (m16n8k16 and m16n8k8 with f16/bf16 inputs and f32 or f16
//! accumulators, m16n8k8 tf32 -> f32, m8n8k4 f64). The warp's 32 lanes run them together:
//! the fragments are gathered from every lane's registers into whole matrices by the PTX
//! ISA's fragment layouts, multiplied (products and sums in f64, rounded once to the
//! accumulator's type), and scattered back. Every lane of the warp must take part (the
//! instructions are `.sync.aligned`); a partial warp fails the launch.

use crate::code::{Code, Ins, Src};
use crate::half::{BF16, F16};
use crate::lanes::{put, val_into};
use crate::warp::{Bits, Env, Group, Lanes, Warp};
use crate::ExecError;

/// Element types of `mma` operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    F16,
    Bf16,
    Tf32,
    F32,
    F64,
    E4m3,
    E5m2,
}

impl Elem {
    fn parse(t: &str) -> Option<Elem> {
        Some(match t {
            "f16" => Elem::F16,
            "bf16" => Elem::Bf16,
            "tf32" => Elem::Tf32,
            "f32" => Elem::F32,
            "f64" => Elem::F64,
            "e4m3" => Elem::E4m3,
            "e5m2" => Elem::E5m2,
            _ => return None,
        })
    }

    /// Elements one 32-bit (or 64-bit, f64) register holds.
    fn per_reg(self) -> usize {
        match self {
            Elem::F16 | Elem::Bf16 => 2,
            Elem::E4m3 | Elem::E5m2 => 4,
            _ => 1,
        }
    }

    fn get(self, reg: u64, e: usize) -> f64 {
        match self {
            Elem::F16 => F16.decode((reg >> (16 * e)) & 0xffff),
            Elem::Bf16 => BF16.decode((reg >> (16 * e)) & 0xffff),
            // tf32: an f32 register whose low 13 mantissa bits the tensor core ignores.
            Elem::Tf32 => f32::from_bits(reg as u32 & !0x1fff) as f64,
            Elem::F32 => f32::from_bits(reg as u32) as f64,
            Elem::F64 => f64::from_bits(reg),
            Elem::E4m3 => crate::half::E4M3.decode((reg >> (8 * e)) & 0xff),
            Elem::E5m2 => crate::half::E5M2.decode((reg >> (8 * e)) & 0xff),
        }
    }

    fn bits(self, x: f64) -> u64 {
        match self {
            Elem::F16 => F16.encode(x, 'n', false),
            Elem::Bf16 => BF16.encode(x, 'n', false),
            Elem::Tf32 | Elem::F32 => (x as f32).to_bits() as u64,
            Elem::F64 => x.to_bits(),
            Elem::E4m3 => crate::half::E4M3.encode(x, 'n', true),
            Elem::E5m2 => crate::half::E5M2.encode(x, 'n', true),
        }
    }
}

/// One `mma.sync.aligned.mMnNkK.row.col.dtype.atype.btype.ctype` form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mma {
    pub m: u8,
    pub n: u8,
    pub k: u8,
    /// A's element type; B's is `b` (they differ only for fp8, `e5m2.e4m3`).
    pub ab: Elem,
    pub b: Elem,
    pub d: Elem,
    pub c: Elem,
}

/// Decodes the modifiers of `mma` (after the opcode); `None` for a form the VM does not run.
pub fn decode_mma(mods: &[&str]) -> Option<Mma> {
    let mut shape = None;
    let mut types = Vec::new();
    let mut layouts = Vec::new();
    for m in mods {
        match *m {
            "sync" | "aligned" => {}
            "row" | "col" => layouts.push(*m),
            "m16n8k16" => shape = Some((16, 8, 16)),
            "m16n8k8" => shape = Some((16, 8, 8)),
            "m8n8k4" => shape = Some((8, 8, 4)),
            "m16n8k32" => shape = Some((16, 8, 32)),
            t => types.push(Elem::parse(t)?),
        }
    }
    let (m, n, k) = shape?;
    if layouts != ["row", "col"] {
        return None;
    }
    let [d, a, b, c] = types[..] else {
        return None;
    };
    let fp8 = |e: Elem| matches!(e, Elem::E4m3 | Elem::E5m2);
    if a != b && !(fp8(a) && fp8(b)) {
        return None;
    }
    let ok = match (m, n, k, a) {
        (16, 8, 32, Elem::E4m3 | Elem::E5m2) => d == Elem::F32 && c == Elem::F32,
        (16, 8, 16, Elem::F16) | (16, 8, 8, Elem::F16) => {
            matches!((d, c), (Elem::F32, Elem::F32) | (Elem::F16, Elem::F16))
        }
        (16, 8, 16, Elem::Bf16) | (16, 8, 8, Elem::Bf16) | (16, 8, 8, Elem::Tf32) => {
            d == Elem::F32 && c == Elem::F32
        }
        (8, 8, 4, Elem::F64) => d == Elem::F64 && c == Elem::F64,
        _ => false,
    };
    ok.then_some(Mma {
        m,
        n,
        k,
        ab: a,
        b,
        d,
        c,
    })
}

impl Mma {
    /// Registers per lane of A, B and C/D.
    pub fn regs(self) -> (usize, usize, usize, usize) {
        let per = self.ab.per_reg();
        let (m, n, k) = (self.m as usize, self.n as usize, self.k as usize);
        (
            m * k / 32 / per,
            k * n / 32 / per,
            m * n / 32 / self.c.per_reg(),
            m * n / 32 / self.d.per_reg(),
        )
    }

    /// (row, column) in A of element `i` of lane `l`'s fragment.
    fn a_at(self, l: usize, i: usize) -> (usize, usize) {
        let (g, t) = (l >> 2, l & 3);
        match (self.m, self.k, self.ab) {
            (8, 4, _) => (g, t),
            // 8-bit elements, four to a register: quads where 16-bit layouts have pairs.
            (16, 32, _) => {
                let (reg, e) = (i / 4, i % 4);
                (g + 8 * (reg & 1), 4 * t + e + 16 * (reg >> 1))
            }
            (16, 8, Elem::Tf32) => (g + 8 * (i & 1), t + 4 * (i >> 1)),
            (16, 8, _) => (g + 8 * (i >> 1), 2 * t + (i & 1)),
            _ => (g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2)),
        }
    }

    /// (row, column) in B of element `i` of lane `l`'s fragment.
    fn b_at(self, l: usize, i: usize) -> (usize, usize) {
        let (g, t) = (l >> 2, l & 3);
        match (self.k, self.ab) {
            (4, _) => (t, g),
            (32, _) => {
                let (reg, e) = (i / 4, i % 4);
                (4 * t + e + 16 * reg, g)
            }
            (8, Elem::Tf32) => (t + 4 * i, g),
            (8, _) => (2 * t + i, g),
            _ => (2 * t + (i & 1) + 8 * (i >> 1), g),
        }
    }

    /// (row, column) in C/D of element `i` of lane `l`'s fragment.
    fn c_at(self, l: usize, i: usize) -> (usize, usize) {
        let (g, t) = (l >> 2, l & 3);
        if self.m == 8 {
            (g, 2 * t + i)
        } else {
            (g + 8 * (i >> 1), 2 * t + (i & 1))
        }
    }
}

fn gather(w: &Warp, env: &Env, g: &Group, srcs: &[Src], size: u8) -> Result<Vec<Lanes>, ExecError> {
    srcs.iter()
        .map(|&s| {
            let mut o = [0u64; 32];
            val_into(w, env, g, s, size, &mut o)?;
            Ok(o)
        })
        .collect()
}

pub(crate) fn whole_warp(run: u32, what: &str) -> Result<(), ExecError> {
    if run != u32::MAX {
        return Err(ExecError::Unsupported(format!(
            "{what} by a partial warp (lanes {run:#010x}): every lane must take part"
        )));
    }
    Ok(())
}

/// `mma.sync.aligned ...  {d}, {a}, {b}, {c}`.
pub fn mma(
    w: &mut Warp,
    env: &mut Env,
    code: &Code,
    g: &Group,
    ins: &Ins,
    run: u32,
) -> Result<(), ExecError> {
    let bad = || ExecError::Unsupported("an mma without its operands".into());
    let f = ins.m.mma.ok_or_else(bad)?;
    whole_warp(run, "mma.sync")?;
    let [a, b, c] = code.mma.get(ins.target as usize).ok_or_else(bad)?;
    let (na, nb, nc, nd) = f.regs();
    if a.len() != na || b.len() != nb || c.len() != nc || ins.nd as usize != nd {
        return Err(ExecError::Unsupported(format!(
            "mma with {}+{}+{}+{} registers ({na}+{nb}+{nc}+{nd} wanted)",
            ins.nd,
            a.len(),
            b.len(),
            c.len()
        )));
    }
    let wide = |e: Elem| if e == Elem::F64 { 8 } else { 4 };
    let (ra, rb, rc) = (
        gather(w, env, g, a, wide(f.ab))?,
        gather(w, env, g, b, wide(f.ab))?,
        gather(w, env, g, c, wide(f.c))?,
    );
    let (m, n, k) = (f.m as usize, f.n as usize, f.k as usize);
    let mut am = vec![0f64; m * k];
    let mut bm = vec![0f64; k * n];
    let mut cm = vec![0f64; m * n];
    for l in 0..32 {
        let per = f.ab.per_reg();
        for i in 0..na * per {
            let (r, col) = f.a_at(l, i);
            am[r * k + col] = f.ab.get(ra[i / per][l], i % per);
        }
        for i in 0..nb * per {
            let (r, col) = f.b_at(l, i);
            bm[r * n + col] = f.b.get(rb[i / per][l], i % per);
        }
        let per = f.c.per_reg();
        for i in 0..nc * per {
            let (r, col) = f.c_at(l, i);
            cm[r * n + col] = f.c.get(rc[i / per][l], i % per);
        }
    }
    let mut dm = vec![0f64; m * n];
    for r in 0..m {
        for col in 0..n {
            let mut s = cm[r * n + col];
            for x in 0..k {
                s += am[r * k + x] * bm[x * n + col];
            }
            dm[r * n + col] = s;
        }
    }
    let per = f.d.per_reg();
    for reg in 0..nd {
        let mut out = [0u64; 32];
        for (l, o) in out.iter_mut().enumerate() {
            for e in 0..per {
                let (r, col) = f.c_at(l, reg * per + e);
                *o |= f.d.bits(dm[r * n + col]) << (16 * e);
            }
        }
        put(w, g, ins.d[reg], &out, run);
    }
    Ok(())
}

/// `ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16 {d...}, [addr]`: lanes
/// `8j..8j+7` give the addresses of matrix `j`'s eight rows (16 bytes each); each lane gets
/// two adjacent elements of each matrix (of a column of it with `.trans`).
pub fn ldmatrix(
    w: &mut Warp,
    env: &mut Env,
    g: &Group,
    ins: &Ins,
    run: u32,
) -> Result<(), ExecError> {
    whole_warp(run, "ldmatrix")?;
    let mut a = [0u64; 32];
    crate::space::addrs(w, env, g, ins, &mut a)?;
    let count = ins.nd as usize;
    if !matches!(count, 1 | 2 | 4) {
        return Err(ExecError::Unsupported(format!(
            "ldmatrix of {count} matrices"
        )));
    }
    // Each matrix's 8 rows of 8 elements.
    let mut mats = vec![[[0u64; 8]; 8]; count];
    for (j, mat) in mats.iter_mut().enumerate() {
        for (r, row) in mat.iter_mut().enumerate() {
            let base = a[8 * j + r];
            if base % 16 != 0 {
                return Err(ExecError::MisalignedAddress(base));
            }
            for (c, e) in row.iter_mut().enumerate() {
                *e = crate::space::load(w, env, 8 * j + r, base + 2 * c as u64, 2)?;
            }
        }
    }
    let trans = ins.m.trans;
    for (j, mat) in mats.iter().enumerate() {
        let mut out = [0u64; 32];
        for l in Bits(run) {
            let (r, c) = (l / 4, 2 * (l % 4));
            out[l] = if trans {
                mat[c][r] | mat[c + 1][r] << 16
            } else {
                mat[r][c] | mat[r][c + 1] << 16
            };
        }
        put(w, g, ins.d[j], &out, run);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element of each matrix is covered exactly once by the fragments.
    #[test]
    fn fragments_cover_the_matrices() {
        for mods in [
            "sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
            "sync.aligned.m16n8k16.row.col.f16.f16.f16.f16",
            "sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
            "sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32",
            "sync.aligned.m8n8k4.row.col.f64.f64.f64.f64",
            "sync.aligned.m16n8k32.row.col.f32.e5m2.e4m3.f32",
        ] {
            let parts: Vec<&str> = mods.split('.').collect();
            let f = decode_mma(&parts).unwrap();
            let (m, n, k) = (f.m as usize, f.n as usize, f.k as usize);
            let (na, nb, nc, _) = f.regs();
            let per = f.ab.per_reg();
            let mut seen_a = vec![0; m * k];
            let mut seen_b = vec![0; k * n];
            let mut seen_c = vec![0; m * n];
            for l in 0..32 {
                for i in 0..na * per {
                    let (r, c) = f.a_at(l, i);
                    seen_a[r * k + c] += 1;
                }
                for i in 0..nb * per {
                    let (r, c) = f.b_at(l, i);
                    seen_b[r * n + c] += 1;
                }
                for i in 0..nc * f.c.per_reg() {
                    let (r, c) = f.c_at(l, i);
                    seen_c[r * n + c] += 1;
                }
            }
            assert!(seen_a.iter().all(|&x| x == 1), "{mods} A");
            assert!(seen_b.iter().all(|&x| x == 1), "{mods} B");
            assert!(seen_c.iter().all(|&x| x == 1), "{mods} C");
        }
    }
}
