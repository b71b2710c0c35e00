//! Warp matrix multiply-accumulate: `wmma.load`, `wmma.store` and `wmma.mma` (what CUDA's
//! `nvcuda::wmma` API compiles to), for the PTX ISA's forms:
//! - f16 A/B (m16n16k16, m32n8k16, m8n32k16) with f16 or f32 C and D (any pairing; `.satfinite`
//!   clamps to the largest finite value);
//! - bf16 A/B (the same shapes), f32 C/D;
//! - tf32 A/B (m16n16k8), f32 C/D;
//! - f64 (m8n8k4, `.rn`);
//! - s8/u8 A/B (the f16 shapes, any pairing), s32 C/D: sums wrap, or clamp with `.satfinite`.
//!
//! The 32 lanes of a warp run each instruction together; a partial warp fails the launch, as
//! do an address or stride that differs between lanes, an address or stride that is not a
//! multiple of 16 bytes ([`ExecError::MisalignedAddress`]; CUDA's guide asks for 32-byte
//! aligned matrices, but NVIDIA's own immaTensorCoreGemm steps through shared memory 16 bytes at
//! a time, so 16 is what GPUs take), and a generic address outside global and shared memory;
//! a matrix reaching outside device memory is [`ExecError::IllegalAddress`]. Sub-byte forms
//! (`.s4`/`.u4`/`.b1`) and any other type, shape or modifier fail, naming it.
//!
//! Fragments: the number and type of each operand's registers are the ISA's (f16 A/B: eight
//! `.f16x2`; bf16 A/B: `m*k/64` or `k*n/64` `.b32` holding two elements; tf32 A/B: four `.b32`;
//! s8/u8 A/B: `.b32` holding four; f32/s32 C/D: eight; f16 C/D: four `.f16x2`; f64: one A, one
//! B, two C/D). Which element sits where is the implementation's choice; this VM's is simple:
//! number a matrix's elements in row-major order of the matrix itself (`e = row * cols + col`,
//! whatever layout it has in memory), and give lane `l` the elements
//! `(l * per_lane + i) % (rows * cols)` for `i` in `0..per_lane`, `per_lane` being the elements
//! its registers hold, in register order (low half or byte first). Where the registers hold more
//! than the matrix (f16 A and B hold every element two or four times) the copies are in the
//! lanes after the first `rows * cols / per_lane`; `wmma.load` fills them all, and `wmma.mma`
//! reads the first. Element-wise code on fragments (`x[i] = alpha * x[i]`) keeps the copies
//! equal. Since the numbering ignores the memory layout, `wmma.mma` gets the same matrices
//! whatever its `.row`/`.col` qualifiers say.
//!
//! `wmma.mma` multiplies whole matrices in a native loop: products and sums in f64 (exact for
//! the integer forms), each element of D summed from C's and then the products in k order,
//! rounded once to D's type; tf32 inputs lose their low 13 mantissa bits.

use crate::code::{Code, Dst, Ins, Src};
use crate::half::{BF16, F16};
use crate::inst::Space;
use crate::lanes::{put, val_into};
use crate::space::{self, SHARED_WINDOW, WINDOW_MASK};
use crate::warp::{Env, Group, Warp};
use crate::ExecError;

/// What a `wmma` instruction does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    LoadA,
    LoadB,
    LoadC,
    Store,
    Mma,
}

/// Element types of `wmma` operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    F16,
    Bf16,
    Tf32,
    F32,
    F64,
    S8,
    U8,
    S32,
}

impl Elem {
    fn parse(t: &str) -> Option<Elem> {
        Some(match t {
            "f16" => Elem::F16,
            "bf16" => Elem::Bf16,
            "tf32" => Elem::Tf32,
            "f32" => Elem::F32,
            "f64" => Elem::F64,
            "s8" => Elem::S8,
            "u8" => Elem::U8,
            "s32" => Elem::S32,
            _ => return None,
        })
    }

    /// Bits of one element in memory and in a register.
    fn bits(self) -> u32 {
        match self {
            Elem::S8 | Elem::U8 => 8,
            Elem::F16 | Elem::Bf16 => 16,
            Elem::F64 => 64,
            _ => 32,
        }
    }

    /// Elements one register holds.
    fn per_reg(self) -> usize {
        match self {
            Elem::F64 => 1,
            e => 32 / e.bits() as usize,
        }
    }

    /// Bytes of a register.
    fn reg_size(self) -> u8 {
        if self == Elem::F64 {
            8
        } else {
            4
        }
    }

    /// An element's value from its bits.
    #[inline(always)]
    fn value(self, v: u64) -> f64 {
        match self {
            Elem::F16 => f16_value(v),
            // bf16 is the top half of an f32.
            Elem::Bf16 => f32::from_bits((v as u32) << 16) as f64,
            // tf32: an f32 whose low 13 mantissa bits the tensor core ignores.
            Elem::Tf32 => f32::from_bits(v as u32 & !0x1fff) as f64,
            Elem::F32 => f32::from_bits(v as u32) as f64,
            Elem::F64 => f64::from_bits(v),
            Elem::S8 => v as u8 as i8 as f64,
            Elem::U8 => v as u8 as f64,
            Elem::S32 => v as u32 as i32 as f64,
        }
    }

    /// The bits of a result, rounded to nearest (integers wrap, or clamp with `sat`).
    fn encode(self, x: f64, sat: bool) -> u64 {
        match self {
            Elem::F16 => F16.encode(x, 'n', sat),
            Elem::Bf16 => BF16.encode(x, 'n', sat),
            Elem::F32 | Elem::Tf32 => {
                let y = x as f32;
                let y = if sat && y.is_infinite() {
                    f32::MAX.copysign(y)
                } else {
                    y
                };
                y.to_bits() as u64
            }
            Elem::F64 => x.to_bits(),
            Elem::S32 if sat => x.clamp(i32::MIN as f64, i32::MAX as f64) as i32 as u32 as u64,
            Elem::S32 => x as i64 as i32 as u32 as u64,
            Elem::S8 | Elem::U8 => x as i64 as u64 & 0xff,
        }
    }
}

/// An f16's value, from its fields (the general decoder's `powi` is slow in the inner loops).
#[inline(always)]
fn f16_value(v: u64) -> f64 {
    let sign = if v & 0x8000 != 0 { -1.0 } else { 1.0 };
    let (e, m) = ((v >> 10) & 0x1f, (v & 0x3ff) as f64);
    match e {
        0 => sign * m * f64::from_bits((1023 - 24) << 52),
        31 if m == 0.0 => sign * f64::INFINITY,
        31 => f64::NAN,
        _ => sign * (1024.0 + m) * f64::from_bits((e + 1023 - 25) << 52),
    }
}

/// One `wmma` form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wmma {
    pub kind: Kind,
    pub m: u8,
    pub n: u8,
    pub k: u8,
    /// The element type of the matrix a load or store moves; A's type for `mma`.
    pub ty: Elem,
    /// `mma`: B, C and D's types.
    pub b: Elem,
    pub c: Elem,
    pub d: Elem,
    /// Row-major layout of the matrix a load or store moves (`mma`: of A, and `row_b` of B).
    pub row: bool,
    pub row_b: bool,
    pub satfinite: bool,
    pub space: Space,
}

/// Decodes the modifiers of `wmma` (after the opcode); the error says what is not supported.
pub fn decode(mods: &[&str]) -> Result<Wmma, String> {
    let (kind, rest) = match mods {
        ["load", "a", r @ ..] => (Kind::LoadA, r),
        ["load", "b", r @ ..] => (Kind::LoadB, r),
        ["load", "c", r @ ..] => (Kind::LoadC, r),
        ["store", "d", r @ ..] => (Kind::Store, r),
        ["mma", r @ ..] => (Kind::Mma, r),
        _ => return Err("an unknown wmma operation".into()),
    };
    let mut shape = None;
    let mut types = Vec::new();
    let mut layouts = Vec::new();
    let (mut sync, mut aligned, mut rn, mut satfinite) = (false, false, false, false);
    let mut space = Space::Generic;
    for &m in rest {
        match m {
            "sync" => sync = true,
            "aligned" => aligned = true,
            "row" | "col" => layouts.push(m == "row"),
            "m16n16k16" => shape = Some((16, 16, 16)),
            "m32n8k16" => shape = Some((32, 8, 16)),
            "m8n32k16" => shape = Some((8, 32, 16)),
            "m16n16k8" => shape = Some((16, 16, 8)),
            "m8n8k4" => shape = Some((8, 8, 4)),
            "m8n8k32" | "m8n8k128" | "s4" | "u4" | "b1" | "xor" | "and" | "popc" => {
                let t = rest.iter().find(|t| matches!(**t, "s4" | "u4" | "b1"));
                return Err(format!(
                    "sub-byte wmma (.{}) is not supported",
                    t.unwrap_or(&m)
                ));
            }
            "global" if kind != Kind::Mma => space = Space::Global,
            "shared" | "shared::cta" if kind != Kind::Mma => space = Space::Shared,
            "rn" if kind == Kind::Mma => rn = true,
            "satfinite" if kind == Kind::Mma => satfinite = true,
            t => match Elem::parse(t) {
                Some(e) => types.push(e),
                None => return Err(format!("unknown modifier .{t}")),
            },
        }
    }
    if !sync || !aligned {
        return Err("wmma without .sync.aligned".into());
    }
    let (m, n, k) = shape.ok_or("wmma without a shape")?;
    let f16_shape = k == 16;
    let mut f = Wmma {
        kind,
        m,
        n,
        k,
        ty: Elem::F16,
        b: Elem::F16,
        c: Elem::F16,
        d: Elem::F16,
        row: true,
        row_b: true,
        satfinite,
        space,
    };
    let bad = || format!("wmma of types {types:?} in shape m{m}n{n}k{k}");
    if kind == Kind::Mma {
        let [ra, rb] = layouts[..] else {
            return Err("wmma.mma without two layouts".into());
        };
        (f.row, f.row_b) = (ra, rb);
        let (d, a, b, c) = match types[..] {
            // The f16 form names D's and C's types only.
            [d, c] => (d, Elem::F16, Elem::F16, c),
            [d, a, b, c] if a != Elem::F16 => (d, a, b, c),
            _ => return Err(bad()),
        };
        let float = |e: Elem| matches!(e, Elem::F16 | Elem::F32);
        let int8 = |e: Elem| matches!(e, Elem::S8 | Elem::U8);
        let ok = match a {
            Elem::F16 => f16_shape && float(d) && float(c),
            Elem::Bf16 => f16_shape && b == a && d == Elem::F32 && c == Elem::F32 && !satfinite,
            Elem::Tf32 => {
                (m, n, k) == (16, 16, 8) && b == a && d == Elem::F32 && c == Elem::F32 && !satfinite
            }
            Elem::F64 => (m, n, k) == (8, 8, 4) && b == a && d == a && c == a && !satfinite && rn,
            Elem::S8 | Elem::U8 => f16_shape && int8(b) && d == Elem::S32 && c == Elem::S32,
            _ => false,
        };
        if a == Elem::F64 && !rn {
            return Err("wmma.mma.f64 without .rn".into());
        }
        if !ok || (rn && a != Elem::F64) {
            return Err(format!("{}{}", bad(), if rn { " with .rn" } else { "" }));
        }
        (f.ty, f.b, f.c, f.d) = (a, b, c, d);
        return Ok(f);
    }
    let [row] = layouts[..] else {
        return Err("wmma.load/store without one layout".into());
    };
    let [t] = types[..] else {
        return Err(bad());
    };
    f.row = row;
    let ok = match kind {
        Kind::LoadA | Kind::LoadB => match t {
            Elem::F16 | Elem::Bf16 | Elem::S8 | Elem::U8 => f16_shape,
            Elem::Tf32 => (m, n, k) == (16, 16, 8),
            Elem::F64 => (m, n, k) == (8, 8, 4),
            _ => false,
        },
        _ => match t {
            Elem::F16 | Elem::S32 => f16_shape,
            Elem::F32 => f16_shape || (m, n, k) == (16, 16, 8),
            Elem::F64 => (m, n, k) == (8, 8, 4),
            _ => false,
        },
    };
    if !ok {
        return Err(bad());
    }
    f.ty = t;
    Ok(f)
}

/// A fragment: a matrix of `rows * cols` elements of type `ty` in `regs` registers per lane.
#[derive(Debug, Clone, Copy)]
struct Frag {
    rows: usize,
    cols: usize,
    ty: Elem,
    regs: usize,
}

impl Frag {
    fn new(which: Kind, f: &Wmma, ty: Elem) -> Frag {
        let (m, n, k) = (f.m as usize, f.n as usize, f.k as usize);
        let (rows, cols) = match which {
            Kind::LoadA => (m, k),
            Kind::LoadB => (k, n),
            _ => (m, n),
        };
        // f16 A and B are eight `.f16x2` in every shape: two or four copies of each element.
        let regs = if ty == Elem::F16 && matches!(which, Kind::LoadA | Kind::LoadB) {
            8
        } else {
            rows * cols / 32 / ty.per_reg()
        };
        Frag {
            rows,
            cols,
            ty,
            regs,
        }
    }

    fn len(self) -> usize {
        self.rows * self.cols
    }
}

impl Wmma {
    /// The fragment a load or store moves.
    fn frag(&self) -> Frag {
        Frag::new(self.kind, self, self.ty)
    }

    /// Registers of the destination list and of each source list.
    pub fn operand_regs(&self) -> (usize, Vec<usize>) {
        match self.kind {
            Kind::LoadA | Kind::LoadB | Kind::LoadC => (self.frag().regs, vec![]),
            Kind::Store => (0, vec![self.frag().regs]),
            Kind::Mma => (
                Frag::new(Kind::Store, self, self.d).regs,
                vec![
                    Frag::new(Kind::LoadA, self, self.ty).regs,
                    Frag::new(Kind::LoadB, self, self.b).regs,
                    Frag::new(Kind::LoadC, self, self.c).regs,
                ],
            ),
        }
    }
}

/// The most elements a fragment holds (f16 m32n8k16 A).
const MAX_ELEMS: usize = 512;
/// The most registers a fragment takes.
const MAX_REGS: usize = 8;

/// Register lists of one `wmma` (the instruction's `target` in [`Code::wmma`]).
#[derive(Debug, Clone, Default)]
pub struct Operands {
    pub d: Vec<Dst>,
    pub s: Vec<Vec<Src>>,
}

/// `wmma.load`, `wmma.store` or `wmma.mma`.
pub fn exec(
    w: &mut Warp,
    env: &mut Env,
    code: &Code,
    g: &Group,
    ins: &Ins,
    run: u32,
) -> Result<(), ExecError> {
    let bad = || ExecError::Unsupported("a wmma without its operands".into());
    let f = ins.m.wmma.ok_or_else(bad)?;
    let ops = code.wmma.get(ins.target as usize).ok_or_else(bad)?;
    let what = match f.kind {
        Kind::Mma => "wmma.mma",
        Kind::Store => "wmma.store",
        _ => "wmma.load",
    };
    crate::tensor::whole_warp(run, what)?;
    match f.kind {
        Kind::Mma => mma(w, env, g, &f, ops, run),
        Kind::Store => {
            let frag = f.frag();
            let mut vals = [0u64; MAX_ELEMS];
            gather(w, env, g, frag, &ops.s[0], &mut vals)?;
            let (base, stride) = place(w, env, g, ins, &f, frag)?;
            store(w, env, frag, f.row, base, stride, &vals)
        }
        _ => {
            let frag = f.frag();
            let (base, stride) = place(w, env, g, ins, &f, frag)?;
            let mut vals = [0u64; MAX_ELEMS];
            load(w, env, frag, f.row, base, stride, &mut vals)?;
            scatter(w, g, frag, &ops.d, &vals, run);
            Ok(())
        }
    }
}

/// The matrix's address and its stride in bytes (between rows of a row-major matrix, columns
/// of a column-major one): the same in every lane, aligned, in global or shared memory.
fn place(
    w: &Warp,
    env: &Env,
    g: &Group,
    ins: &Ins,
    f: &Wmma,
    frag: Frag,
) -> Result<(u64, u64), ExecError> {
    let mut a = [0u64; 32];
    space::addrs(w, env, g, ins, &mut a)?;
    let bytes = (frag.ty.bits() / 8) as u64;
    let stride = if ins.ns > 0 {
        let mut s = [0u64; 32];
        val_into(w, env, g, ins.src(0), 4, &mut s)?;
        if s.iter().any(|&x| x != s[0]) {
            return Err(ExecError::Unsupported(
                "wmma with a different stride in each lane".into(),
            ));
        }
        s[0]
    } else if f.row {
        frag.cols as u64
    } else {
        frag.rows as u64
    } * bytes;
    let base = a[0];
    if a.iter().any(|&x| x != base) {
        return Err(ExecError::Unsupported(
            "wmma with a different address in each lane".into(),
        ));
    }
    let win = base & WINDOW_MASK;
    if win != 0 && win != SHARED_WINDOW {
        return Err(ExecError::Unsupported(format!(
            "wmma at {base:#x}, outside global and shared memory"
        )));
    }
    if !base.is_multiple_of(16) {
        return Err(ExecError::MisalignedAddress(base));
    }
    if !stride.is_multiple_of(16) {
        return Err(ExecError::MisalignedAddress(base.wrapping_add(stride)));
    }
    Ok((base, stride))
}

/// Where element `j` of line `line` (a row of a row-major matrix, a column of a column-major
/// one) sits in the fragment's row-major numbering, and the line's length.
#[inline(always)]
fn lines(frag: Frag, row: bool) -> (usize, usize) {
    if row {
        (frag.rows, frag.cols)
    } else {
        (frag.cols, frag.rows)
    }
}

/// Reads the matrix's elements (their bits, in row-major order) from memory, eight bytes at a
/// time (every line is a multiple of eight bytes).
fn load(
    w: &Warp,
    env: &mut Env,
    frag: Frag,
    row: bool,
    base: u64,
    stride: u64,
    vals: &mut [u64; MAX_ELEMS],
) -> Result<(), ExecError> {
    let bits = frag.ty.bits();
    let per_word = (64 / bits) as usize;
    let mask = if bits == 64 {
        u64::MAX
    } else {
        (1 << bits) - 1
    };
    let (nlines, len) = lines(frag, row);
    for line in 0..nlines {
        let at = base.wrapping_add(line as u64 * stride);
        for word in 0..len / per_word {
            let v = space::load(w, env, 0, at.wrapping_add(8 * word as u64), 8)?;
            for e in 0..per_word {
                let j = word * per_word + e;
                let (r, c) = if row { (line, j) } else { (j, line) };
                vals[r * frag.cols + c] = (v >> (bits as usize * e)) & mask;
            }
        }
    }
    Ok(())
}

fn store(
    w: &mut Warp,
    env: &mut Env,
    frag: Frag,
    row: bool,
    base: u64,
    stride: u64,
    vals: &[u64; MAX_ELEMS],
) -> Result<(), ExecError> {
    let bits = frag.ty.bits();
    let per_word = (64 / bits) as usize;
    let (nlines, len) = lines(frag, row);
    for line in 0..nlines {
        let at = base.wrapping_add(line as u64 * stride);
        for word in 0..len / per_word {
            let mut v = 0u64;
            for e in 0..per_word {
                let j = word * per_word + e;
                let (r, c) = if row { (line, j) } else { (j, line) };
                v |= vals[r * frag.cols + c] << (bits as usize * e);
            }
            space::store(w, env, 0, at.wrapping_add(8 * word as u64), 8, v)?;
        }
    }
    Ok(())
}

/// Writes a fragment's registers in every lane from the matrix's elements: lane `l`'s slot `i`
/// (register `i / per`, element `i % per` of it) holds element `(l * per_lane + i) % len`.
/// (Counters, not divisions: this runs for every load and mma.)
fn scatter(w: &mut Warp, g: &Group, frag: Frag, d: &[Dst], vals: &[u64; MAX_ELEMS], run: u32) {
    let (per, bits, len) = (frag.ty.per_reg(), frag.ty.bits() as usize, frag.len());
    let mut out = [[0u64; 32]; MAX_REGS];
    let mut e = 0;
    for l in 0..32 {
        for reg in out.iter_mut().take(frag.regs) {
            let mut word = 0u64;
            for j in 0..per {
                word |= vals[e] << (bits * j);
                e += 1;
                if e == len {
                    e = 0;
                }
            }
            reg[l] = word;
        }
    }
    for (reg, &dst) in out.iter().zip(d).take(frag.regs) {
        put(w, g, dst, reg, run);
    }
}

/// Reads a fragment's elements (their bits, in row-major order) from its registers: each from
/// the first lane holding it.
fn gather(
    w: &Warp,
    env: &Env,
    g: &Group,
    frag: Frag,
    srcs: &[Src],
    vals: &mut [u64; MAX_ELEMS],
) -> Result<(), ExecError> {
    let (per, bits, len) = (frag.ty.per_reg(), frag.ty.bits() as usize, frag.len());
    let mask = if bits == 64 {
        u64::MAX
    } else {
        (1 << bits) - 1
    };
    let mut regs = [[0u64; 32]; MAX_REGS];
    for (reg, &s) in srcs.iter().enumerate().take(frag.regs) {
        val_into(w, env, g, s, frag.ty.reg_size(), &mut regs[reg])?;
    }
    let mut e = 0;
    'lanes: for l in 0..32 {
        for reg in regs.iter().take(frag.regs) {
            for j in 0..per {
                if e == len {
                    break 'lanes;
                }
                vals[e] = (reg[l] >> (bits * j)) & mask;
                e += 1;
            }
        }
    }
    Ok(())
}

/// `wmma.mma.sync.aligned.alayout.blayout.shape.dtype{.atype.btype}.ctype {d}, {a}, {b}, {c}`.
fn mma(
    w: &mut Warp,
    env: &mut Env,
    g: &Group,
    f: &Wmma,
    ops: &Operands,
    run: u32,
) -> Result<(), ExecError> {
    let fa = Frag::new(Kind::LoadA, f, f.ty);
    let fb = Frag::new(Kind::LoadB, f, f.b);
    let fc = Frag::new(Kind::LoadC, f, f.c);
    let fd = Frag::new(Kind::Store, f, f.d);
    let (m, n, k) = (f.m as usize, f.n as usize, f.k as usize);
    let mut bits = [0u64; MAX_ELEMS];
    // A, B and the accumulators row-major; each row of D sums its products in k order,
    // starting from C, the columns in step (a loop the compiler vectorizes).
    let mut a = [0f64; MAX_ELEMS];
    let mut b = [0f64; MAX_ELEMS];
    let mut acc = [0f64; MAX_ELEMS];
    gather(w, env, g, fa, &ops.s[0], &mut bits)?;
    for (x, &v) in a.iter_mut().zip(&bits).take(m * k) {
        *x = f.ty.value(v);
    }
    gather(w, env, g, fb, &ops.s[1], &mut bits)?;
    for (x, &v) in b.iter_mut().zip(&bits).take(k * n) {
        *x = f.b.value(v);
    }
    gather(w, env, g, fc, &ops.s[2], &mut bits)?;
    for (x, &v) in acc.iter_mut().zip(&bits).take(m * n) {
        *x = f.c.value(v);
    }
    for r in 0..m {
        let row = &mut acc[r * n..r * n + n];
        for x in 0..k {
            let av = a[r * k + x];
            for (d, &bv) in row.iter_mut().zip(&b[x * n..x * n + n]) {
                *d += av * bv;
            }
        }
    }
    let sat = f.satfinite;
    for (o, &x) in bits.iter_mut().zip(&acc).take(m * n) {
        *o = f.d.encode(x, sat);
    }
    scatter(w, g, fd, &ops.d, &bits, run);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(s: &str) -> Result<Wmma, String> {
        decode(&s.split('.').collect::<Vec<_>>())
    }

    /// The register counts are the ISA's (as nvcc 13.5 emits them).
    #[test]
    fn register_counts_follow_the_isa() {
        for (mods, d, s) in [
            ("load.a.sync.aligned.row.m16n16k16.global.f16", 8, vec![]),
            ("load.b.sync.aligned.col.m8n32k16.f16", 8, vec![]),
            ("load.c.sync.aligned.row.m32n8k16.f16", 4, vec![]),
            ("load.c.sync.aligned.row.m32n8k16.shared.f32", 8, vec![]),
            ("load.a.sync.aligned.row.m8n32k16.bf16", 2, vec![]),
            ("load.b.sync.aligned.row.m8n32k16.bf16", 8, vec![]),
            ("load.a.sync.aligned.col.m32n8k16.bf16", 8, vec![]),
            ("load.a.sync.aligned.col.m16n16k8.tf32", 4, vec![]),
            ("load.c.sync.aligned.col.m8n8k4.f64", 2, vec![]),
            ("load.a.sync.aligned.col.m32n8k16.global.u8", 4, vec![]),
            ("load.b.sync.aligned.col.m8n32k16.s8", 4, vec![]),
            ("store.d.sync.aligned.col.m16n16k16.global.s32", 0, vec![8]),
            ("store.d.sync.aligned.col.m16n16k16.f16", 0, vec![4]),
            (
                "mma.sync.aligned.row.col.m16n16k16.f32.f16",
                8,
                vec![8, 8, 4],
            ),
            (
                "mma.sync.aligned.col.row.m32n8k16.f32.bf16.bf16.f32",
                8,
                vec![8, 2, 8],
            ),
            (
                "mma.sync.aligned.row.row.m8n32k16.s32.s8.u8.s32.satfinite",
                8,
                vec![1, 4, 8],
            ),
            (
                "mma.sync.aligned.row.col.m8n8k4.f64.f64.f64.f64.rn",
                2,
                vec![1, 1, 2],
            ),
        ] {
            let f = form(mods).unwrap_or_else(|e| panic!("{mods}: {e}"));
            assert_eq!(f.operand_regs(), (d, s), "{mods}");
        }
    }

    /// The fast f16 and bf16 decoders agree with the general one on every value.
    #[test]
    fn half_values_match_the_decoder() {
        for v in 0..=0xffffu64 {
            let (a, b) = (Elem::F16.value(v), F16.decode(v));
            assert!(a == b || (a.is_nan() && b.is_nan()), "f16 {v:#x}: {a} {b}");
            let (a, b) = (Elem::Bf16.value(v), BF16.decode(v));
            assert!(a == b || (a.is_nan() && b.is_nan()), "bf16 {v:#x}: {a} {b}");
        }
    }

    #[test]
    fn unsupported_forms_are_named() {
        for (mods, why) in [
            ("load.a.sync.aligned.row.m16n16k16.f16.foo", ".foo"),
            ("load.a.sync.aligned.row.m16n16k8.f16", "shape"),
            ("load.a.sync.aligned.row.m8n8k32.s4", ".s4"),
            (
                "mma.sync.aligned.row.col.m16n16k8.f32.tf32.tf32.f32.satfinite",
                "types",
            ),
            ("mma.sync.aligned.row.col.m8n8k4.f64.f64.f64.f64", ".rn"),
            ("mma.sync.aligned.row.col.m16n16k16.f32.f32.rn", ".rn"),
            ("load.a.row.m16n16k16.f16", "sync"),
            ("mma.sync.aligned.row.m16n16k16.f32.f32", "layouts"),
            ("fence.sync.aligned", "operation"),
        ] {
            let e = form(mods).unwrap_err();
            assert!(e.contains(why), "{mods}: {e}");
        }
    }

    /// Every element of each fragment is in some lane, and the first copy is the one read.
    #[test]
    fn fragments_cover_their_matrices() {
        for mods in [
            "mma.sync.aligned.row.col.m16n16k16.f32.f16",
            "mma.sync.aligned.row.col.m32n8k16.f16.f16",
            "mma.sync.aligned.row.col.m8n32k16.f32.bf16.bf16.f32",
            "mma.sync.aligned.row.col.m16n16k8.f32.tf32.tf32.f32",
            "mma.sync.aligned.row.col.m8n8k4.f64.f64.f64.f64.rn",
            "mma.sync.aligned.row.col.m32n8k16.s32.u8.s8.s32",
        ] {
            let f = form(mods).unwrap();
            for (which, ty) in [
                (Kind::LoadA, f.ty),
                (Kind::LoadB, f.b),
                (Kind::LoadC, f.c),
                (Kind::Store, f.d),
            ] {
                let fr = Frag::new(which, &f, ty);
                assert!(fr.len() <= MAX_ELEMS && fr.regs <= MAX_REGS);
                let per_lane = fr.regs * fr.ty.per_reg();
                assert_eq!((32 * per_lane) % fr.len(), 0, "{mods} {which:?}");
            }
        }
    }
}
