//! An instruction's modifiers (the opcode's dot-separated parts after its base name): types in
//! order, packed formats, the state space, and the named flags of [`MODIFIERS`].

use std::sync::OnceLock;

use super::Index;
use crate::half::Packed;
use crate::inst::{AtomOp, BoolOp, Cmp, MbarOp, Mods, Op, PrmtMode, ShflMode, Space, TestpMode};
use crate::inst::{Ty, Type, VoteMode};

/// A named modifier: the names it goes by, the instructions it applies to (every one when
/// empty), a condition on the modifiers read before it, and what it sets.
struct Modifier {
    names: &'static [&'static str],
    ops: &'static [Op],
    when: fn(&Mods) -> bool,
    set: fn(&mut Mods),
}

fn always(_: &Mods) -> bool {
    true
}

/// A modifier the VM accepts and has no use for.
fn nothing(_: &mut Mods) {}

/// A modifier of every instruction.
const fn any(names: &'static [&'static str], set: fn(&mut Mods)) -> Modifier {
    Modifier {
        names,
        ops: &[],
        when: always,
        set,
    }
}

/// A modifier of the instructions `ops` only.
const fn of(ops: &'static [Op], names: &'static [&'static str], set: fn(&mut Mods)) -> Modifier {
    Modifier {
        names,
        ops,
        when: always,
        set,
    }
}

const MIN_MAX: &[Op] = &[Op::Min, Op::Max];
const ATOMIC: &[Op] = &[Op::Atom, Op::Red, Op::Redux];
const SETP: &[Op] = &[Op::Setp, Op::Set];

/// The named modifiers. A name may have several entries: the first that applies to the
/// instruction (in this order) is the one read; a name none applies to is a form the VM does
/// not run.
static MODIFIERS: &[Modifier] = &[
    any(&["hi"], |m| m.hi = true),
    any(&["lo"], |m| m.lo = true),
    any(&["wide"], |m| m.wide = true),
    any(&["cc"], |m| m.cc = true),
    any(&["sat"], |m| m.sat = true),
    any(&["satfinite"], |m| m.satfinite = true),
    of(MIN_MAX, &["NaN"], |m| m.nan = true),
    of(MIN_MAX, &["xorsign"], |m| m.xorsign = true),
    // `min/max.xorsign.abs`: `.abs` only after `.xorsign`.
    Modifier {
        names: &["abs"],
        ops: MIN_MAX,
        when: |m| m.xorsign,
        set: nothing,
    },
    of(&[Op::Min, Op::Max, Op::Fma, Op::Cvt], &["relu"], |m| {
        m.relu = true
    }),
    of(&[Op::Bfind], &["shiftamt"], |m| m.shiftamt = true),
    any(&["L2::cache_hint"], |m| m.cache_hint = true),
    of(&[Op::Testp], &["finite"], |m| m.testp = TestpMode::Finite),
    of(&[Op::Testp], &["infinite"], |m| {
        m.testp = TestpMode::Infinite
    }),
    of(&[Op::Testp], &["number"], |m| m.testp = TestpMode::Number),
    of(&[Op::Testp], &["notanumber"], |m| {
        m.testp = TestpMode::NotANumber
    }),
    of(&[Op::Testp], &["normal"], |m| m.testp = TestpMode::Normal),
    of(&[Op::Testp], &["subnormal"], |m| {
        m.testp = TestpMode::Subnormal
    }),
    of(&[Op::Prmt], &["f4e"], |m| m.prmt = PrmtMode::F4e),
    of(&[Op::Prmt], &["b4e"], |m| m.prmt = PrmtMode::B4e),
    of(&[Op::Prmt], &["rc8"], |m| m.prmt = PrmtMode::Rc8),
    of(&[Op::Prmt], &["ecl"], |m| m.prmt = PrmtMode::Ecl),
    of(&[Op::Prmt], &["ecr"], |m| m.prmt = PrmtMode::Ecr),
    of(&[Op::Prmt], &["rc16"], |m| m.prmt = PrmtMode::Rc16),
    of(&[Op::Shf, Op::Szext, Op::Bmsk], &["clamp"], nothing),
    of(&[Op::Szext, Op::Bmsk], &["wrap"], |m| m.shf_wrap = true),
    of(&[Op::Griddep], &["wait", "launch_dependents"], nothing),
    of(&[Op::Mbarrier], &["init"], |m| m.mbar = MbarOp::Init),
    of(&[Op::Mbarrier], &["inval"], |m| m.mbar = MbarOp::Inval),
    of(&[Op::Mbarrier], &["arrive"], |m| m.mbar = MbarOp::Arrive),
    of(&[Op::Mbarrier], &["arrive_drop"], |m| {
        m.mbar = MbarOp::ArriveDrop
    }),
    of(&[Op::Mbarrier], &["test_wait"], |m| {
        m.mbar = MbarOp::TestWait
    }),
    of(&[Op::Mbarrier], &["try_wait"], |m| m.mbar = MbarOp::TryWait),
    of(&[Op::Mbarrier], &["pending_count"], |m| {
        m.mbar = MbarOp::PendingCount
    }),
    of(&[Op::Mbarrier], &["parity"], |m| m.parity = true),
    of(
        &[Op::CpAsync, Op::CpAsyncWait],
        &["async", "commit_group", "wait_group", "wait_all"],
        nothing,
    ),
    of(
        &[Op::Createpolicy],
        &[
            "fractional",
            "range",
            "L2::evict_last",
            "L2::evict_normal",
            "L2::evict_first",
            "L2::evict_unchanged",
        ],
        nothing,
    ),
    of(
        &[Op::Prefetch],
        &[
            "L2::evict_last",
            "L2::evict_normal",
            "L2::evict_first",
            "L2::evict_unchanged",
            "L2",
        ],
        nothing,
    ),
    of(
        &[Op::Ldmatrix],
        &["sync", "aligned", "m8n8", "x1", "x2", "x4"],
        nothing,
    ),
    of(&[Op::Ldmatrix], &["trans"], |m| m.trans = true),
    of(&[Op::Vabsdiff], &["add"], |m| m.simd_add = true),
    any(&["rni"], |m| m.rnd_int = Some('n')),
    any(&["rzi"], |m| m.rnd_int = Some('z')),
    any(&["rmi"], |m| m.rnd_int = Some('m')),
    any(&["rpi"], |m| m.rnd_int = Some('p')),
    any(&["rz"], |m| m.rnd = Some('z')),
    any(&["rm"], |m| m.rnd = Some('m')),
    any(&["rp"], |m| m.rnd = Some('p')),
    of(&[Op::Cvt], &["rna"], |m| m.rnd = Some('a')),
    any(&["v2"], |m| m.vec = 2),
    any(&["v4"], |m| m.vec = 4),
    any(&["to"], |m| m.to = true),
    of(&[Op::Shf], &["l"], |m| m.shf_left = true),
    any(&["wrap"], |m| m.shf_wrap = true),
    of(&[Op::Shfl], &["up"], |m| m.shfl_mode = ShflMode::Up),
    of(&[Op::Shfl], &["down"], |m| m.shfl_mode = ShflMode::Down),
    of(&[Op::Shfl], &["bfly"], |m| m.shfl_mode = ShflMode::Bfly),
    of(&[Op::Shfl], &["idx"], |m| m.shfl_mode = ShflMode::Idx),
    of(&[Op::Vote, Op::Match], &["all"], |m| {
        m.vote_mode = VoteMode::All
    }),
    of(&[Op::Vote, Op::Match], &["any"], |m| {
        m.vote_mode = VoteMode::Any
    }),
    of(&[Op::Vote], &["uni"], |m| m.vote_mode = VoteMode::Uni),
    of(&[Op::Vote], &["ballot"], |m| m.vote_mode = VoteMode::Ballot),
    any(&["uni"], |m| m.uni = true),
    // The operation of `atom`, `red` and `redux`.
    of(ATOMIC, &["add"], |m| m.atom_op = AtomOp::Add),
    of(ATOMIC, &["min"], |m| m.atom_op = AtomOp::Min),
    of(ATOMIC, &["max"], |m| m.atom_op = AtomOp::Max),
    of(ATOMIC, &["exch"], |m| m.atom_op = AtomOp::Exch),
    of(ATOMIC, &["cas"], |m| m.atom_op = AtomOp::Cas),
    of(ATOMIC, &["and"], |m| m.atom_op = AtomOp::And),
    of(ATOMIC, &["or"], |m| m.atom_op = AtomOp::Or),
    of(ATOMIC, &["xor"], |m| m.atom_op = AtomOp::Xor),
    of(ATOMIC, &["inc"], |m| m.atom_op = AtomOp::Inc),
    of(ATOMIC, &["dec"], |m| m.atom_op = AtomOp::Dec),
    // The comparison of `setp` and `set`. (`lo` and `hi` never reach their entries here: the
    // entries at the top take them first.)
    of(SETP, &["eq"], |m| m.cmp = Cmp::Eq),
    of(SETP, &["ne"], |m| m.cmp = Cmp::Ne),
    of(SETP, &["lt"], |m| m.cmp = Cmp::Lt),
    of(SETP, &["le"], |m| m.cmp = Cmp::Le),
    of(SETP, &["gt"], |m| m.cmp = Cmp::Gt),
    of(SETP, &["ge"], |m| m.cmp = Cmp::Ge),
    of(SETP, &["lo"], |m| m.cmp = Cmp::Lo),
    of(SETP, &["ls"], |m| m.cmp = Cmp::Ls),
    of(SETP, &["hi"], |m| m.cmp = Cmp::Hi),
    of(SETP, &["hs"], |m| m.cmp = Cmp::Hs),
    of(SETP, &["equ"], |m| m.cmp = Cmp::Equ),
    of(SETP, &["neu"], |m| m.cmp = Cmp::Neu),
    of(SETP, &["ltu"], |m| m.cmp = Cmp::Ltu),
    of(SETP, &["leu"], |m| m.cmp = Cmp::Leu),
    of(SETP, &["gtu"], |m| m.cmp = Cmp::Gtu),
    of(SETP, &["geu"], |m| m.cmp = Cmp::Geu),
    of(SETP, &["num"], |m| m.cmp = Cmp::Num),
    of(SETP, &["nan"], |m| m.cmp = Cmp::Nan),
    of(&[Op::Bar], &["warp"], nothing),
    of(&[Op::Bar], &["red"], |m| m.bar_red = true),
    of(&[Op::Bar], &["popc"], |m| m.atom_op = AtomOp::Add),
    of(&[Op::Bar], &["and"], |m| m.atom_op = AtomOp::And),
    of(&[Op::Bar], &["or"], |m| m.atom_op = AtomOp::Or),
    of(SETP, &["and"], |m| m.bool_op = BoolOp::And),
    of(SETP, &["or"], |m| m.bool_op = BoolOp::Or),
    of(SETP, &["xor"], |m| m.bool_op = BoolOp::Xor),
    // Caching, ordering, scope and approximation qualifiers change nothing here, nor does
    // `.rn`, the rounding the VM does by default.
    any(
        &[
            "rn",
            "approx",
            "full",
            "ftz",
            "nc",
            "ca",
            "cg",
            "cs",
            "lu",
            "cv",
            "wb",
            "wt",
            "sync",
            "aligned",
            "volatile",
            "relaxed",
            "acquire",
            "release",
            "acq_rel",
            "sc",
            "gpu",
            "cta",
            "sys",
            "gl",
            "L1",
            "L2",
            "noftz",
            "arrive",
            "red",
            "popc",
            "r",
            "ptr",
            "weak",
            "mmio",
            "cluster",
            "proxy",
            "async",
            "L2::64B",
            "L2::128B",
            "L2::256B",
            "L1::no_allocate",
            "L1::evict_last",
            "L1::evict_normal",
            "L1::evict_unchanged",
            "L1::evict_first",
            "L2::evict_last",
            "L2::evict_first",
            "L2::evict_normal",
            "L2::evict_unchanged",
            "u32x2",
        ],
        nothing,
    ),
];

/// Each name's entries of [`MODIFIERS`]: bit `i` for entry `i` (so in table order).
fn index() -> &'static Index<u128> {
    static INDEX: OnceLock<Index<u128>> = OnceLock::new();
    INDEX.get_or_init(|| {
        assert!(MODIFIERS.len() <= 128, "the index holds 128 entries");
        let mut index = Index::with_capacity_and_hasher(256, Default::default());
        for (i, m) in MODIFIERS.iter().enumerate() {
            for &name in m.names {
                *index.entry(name).or_default() |= 1u128 << i;
            }
        }
        index
    })
}

/// Sets the named modifier `name` of `op`: `false` if none applies.
fn named(op: Op, name: &str, mods: &mut Mods) -> bool {
    let Some(&entries) = index().get(name) else {
        return false;
    };
    let mut bits = entries;
    while bits != 0 {
        let m = &MODIFIERS[bits.trailing_zeros() as usize];
        bits &= bits - 1;
        if (m.ops.is_empty() || m.ops.contains(&op)) && (m.when)(mods) {
            (m.set)(mods);
            return true;
        }
    }
    false
}

/// The modifiers of a plain instruction (every family but textures, `mma` and `wmma`): its
/// flags, its types in order, and its state space; `Err` for a form the VM does not run.
pub(super) fn read(op: Op, mods_s: &[&str]) -> Result<(Mods, Vec<Type>, Space), ()> {
    let mut mods = Mods::default();
    let mut types = Vec::new();
    let mut space = Space::Generic;
    for m in mods_s {
        if let Some(t) = Type::parse(m) {
            types.push(t);
        } else if let Some(p) = (op == Op::Cvt).then(|| Packed::parse(m)).flatten() {
            cvt_packed(p, &mut mods, &mut types)?;
        } else if let Some(elem) = m.strip_suffix("x2").and_then(Type::parse) {
            packed_pair(op, elem, &mut mods, &mut types)?;
        } else if let Some(sp) = space_of(m) {
            if op == Op::CpAsync && space != Space::Generic {
                // `cp.async.ca.shared.global`: the destination's space, then the source's.
                mods.space2 = Some(sp);
            } else if op == Op::Cvta || op == Op::Isspacep {
                mods.space2 = Some(sp);
            } else {
                space = sp;
            }
        } else if !named(op, m, &mut mods) {
            return Err(());
        }
    }
    Ok((mods, types, space))
}

/// A packed format of `cvt` (`f16x2`, `bf16x2`, `e4m3x2`, `e5m2x2`, `tf32`): the destination's
/// if it comes first, else the source's.
fn cvt_packed(p: Packed, mods: &mut Mods, types: &mut Vec<Type>) -> Result<(), ()> {
    if types.is_empty() && mods.pk_dst.is_none() {
        mods.pk_dst = Some(p);
    } else {
        mods.pk_src = Some(p);
    }
    types.push(Type {
        kind: Ty::B,
        size: if p.bits() == 8 { 2 } else { 4 },
    });
    if p == Packed::Tf32 && mods.pk_src.is_some() {
        return Err(());
    }
    Ok(())
}

/// A packed pair (`f16x2`, `bf16x2`, `s16x2`, `u16x2`) where the instruction takes one: the
/// element type in [`Mods::x2`], a 32-bit register.
fn packed_pair(op: Op, elem: Type, mods: &mut Mods, types: &mut Vec<Type>) -> Result<(), ()> {
    let packed_ok = match op {
        Op::Add | Op::Sub | Op::Mul | Op::Min | Op::Max => true,
        Op::Fma | Op::Neg | Op::Abs | Op::Set | Op::Setp | Op::Tanh | Op::Ex2 => elem.is_float(),
        // `atom.add.noftz.{f16x2,bf16x2}`, `red` alike.
        Op::Atom | Op::Red => elem.is_float(),
        _ => false,
    };
    if !packed_ok || elem.size != 2 {
        return Err(());
    }
    if mods.x2.is_some_and(|e| e != elem) {
        return Err(());
    }
    mods.x2 = Some(elem);
    types.push(Type {
        kind: Ty::B,
        size: 4,
    });
    Ok(())
}

fn space_of(m: &str) -> Option<Space> {
    Some(match m {
        "global" => Space::Global,
        "shared" | "shared::cta" | "shared::cluster" => Space::Shared,
        "local" => Space::Local,
        "param" => Space::Param,
        "const" => Space::Const,
        _ => return None,
    })
}
