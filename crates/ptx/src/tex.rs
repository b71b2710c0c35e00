//! Texture and surface instructions: `tex` (`.1d/.2d/.3d/.a1d/.a2d`, `.level`/`.grad` on the
//! one level a CUDA array has), `tld4` (`tex2Dgather`), `txq`, `suld.b`, `sust.b` and `suq`.
//!
//! A texture or surface object reaches a kernel as a 64-bit handle (a `.u64` parameter). The
//! device describes each live handle with a [`Texture`] ([`crate::DeviceMemory::texture`]): the
//! device address of its data, element format, shape, and for textures the sampler. Texels are
//! read from device memory like any global load, so an object whose memory was freed faults
//! with an illegal address; a handle the device does not know fails the launch with
//! [`ExecError::Texture`].
//!
//! Sampling follows the CUDA programming guide's "Texture Fetching" appendix: unnormalized
//! coordinates address texel `floor(x)`; normalized ones are scaled by the size first, after
//! wrap (`x - floor(x)`) or mirror; linear filtering blends the texels around `x - 0.5` with
//! weights in 9-bit fixed point (8 fractional bits, rounded to nearest); clamp repeats the
//! edge texel, border reads the border colour; 8- and 16-bit integer data read in
//! normalized-float mode becomes `v / 255`, `v / 65535` (unsigned) or `max(v / 127, -1)`,
//! `max(v / 32767, -1)` (signed). A 1-D fetch of linear memory (`tex1Dfetch`) out of range
//! reads zero. Components a format lacks read as 0, and the fourth as 1.

use crate::code::{Code, Ins};
use crate::inst::{Operand, Ty, Type};
use crate::lanes::{put, val_into};
use crate::warp::{Bits, Env, Group, Lanes, Warp};
use crate::{ExecError, PtxError};

/// The element format of one channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TexFormat {
    U8,
    S8,
    U16,
    S16,
    U32,
    S32,
    F16,
    F32,
}

impl TexFormat {
    pub fn bytes(self) -> u64 {
        match self {
            TexFormat::U8 | TexFormat::S8 => 1,
            TexFormat::U16 | TexFormat::S16 | TexFormat::F16 => 2,
            TexFormat::U32 | TexFormat::S32 | TexFormat::F32 => 4,
        }
    }

    fn is_float(self) -> bool {
        matches!(self, TexFormat::F16 | TexFormat::F32)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressMode {
    Wrap,
    Clamp,
    Mirror,
    Border,
}

/// What memory an object reads and how it is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Linear memory of `width` elements (`tex1Dfetch`).
    Linear,
    /// A 1-D, 2-D or 3-D CUDA array, or pitched 2-D memory.
    D1,
    D2,
    D3,
    /// Layered arrays: `depth` layers of 1-D or 2-D arrays.
    A1,
    A2,
}

/// How a texture samples (absent for surfaces).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    pub address: [AddressMode; 3],
    pub linear: bool,
    /// 8- and 16-bit integer data reads as normalized floats (`cudaReadModeNormalizedFloat`).
    pub normalized_float: bool,
    pub normalized_coords: bool,
    pub border: [f32; 4],
}

/// A texture or surface object as the device describes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Texture {
    /// Device address of element (0, 0, 0).
    pub addr: u64,
    pub format: TexFormat,
    /// 1, 2 or 4.
    pub channels: u8,
    pub shape: Shape,
    /// Elements per row; rows (1 for 1-D); slices or layers (1 if none).
    pub width: u64,
    pub height: u64,
    pub depth: u64,
    /// Bytes from one row to the next, and from one slice or layer to the next.
    pub pitch: u64,
    pub slice: u64,
    /// `None` for a surface object.
    pub sampler: Option<Sampler>,
}

impl Texture {
    fn elem(&self) -> u64 {
        self.format.bytes() * self.channels as u64
    }
}

/// The geometry an instruction names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Geom {
    D1,
    D2,
    D3,
    A1,
    A2,
    /// A cubemap: a direction (x, y, z) picks a face of a six-layer 2-D array.
    Cube,
    /// A layered cubemap: a layer, then a direction; cubemap `n`'s faces are layers `6n..6n+6`.
    ACube,
}

impl Geom {
    fn parse(m: &str) -> Option<Geom> {
        Some(match m {
            "1d" => Geom::D1,
            "2d" => Geom::D2,
            "3d" => Geom::D3,
            "a1d" => Geom::A1,
            "a2d" => Geom::A2,
            "cube" => Geom::Cube,
            "acube" => Geom::ACube,
            _ => return None,
        })
    }

    /// Coordinates the instruction reads (the layer first for `.a1d`/`.a2d`).
    fn coords(self) -> usize {
        match self {
            Geom::D1 => 1,
            Geom::D2 | Geom::A1 => 2,
            Geom::D3 | Geom::A2 | Geom::Cube => 3,
            Geom::ACube => 4,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Geom::D1 => "1d",
            Geom::D2 => "2d",
            Geom::D3 => "3d",
            Geom::A1 => "a1d",
            Geom::A2 => "a2d",
            Geom::Cube => "cube",
            Geom::ACube => "acube",
        }
    }
}

/// What `txq`/`suq` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Query {
    Width,
    Height,
    Depth,
    ArraySize,
    NormalizedCoords,
    FilterMode,
    AddrMode(u8),
    NumMipmapLevels,
    NumSamples,
}

/// `suld`/`sust` out-of-range handling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clamp {
    Trap,
    Edge,
    Zero,
}

/// The form of a texture or surface instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TexOp {
    pub geom: Geom,
    /// `tld4`'s component (0 to 3 for `.r/.g/.b/.a`).
    pub comp: u8,
    pub query: Query,
    pub clamp: Clamp,
}

const B32: Type = Type {
    kind: Ty::B,
    size: 4,
};

/// An operand reader of [`decode`]'s caller: the operand's text, and whether an immediate is
/// a float.
type OperandOf<'o> = dyn FnMut(&str, bool) -> Result<Operand, PtxError> + 'o;

/// The modifiers of a texture or surface instruction.
struct TexMods {
    mods: crate::inst::Mods,
    types: Vec<Type>,
    geom: Option<Geom>,
    /// `tld4`'s component.
    comp: u8,
    /// Operands after the address that are read and ignored (a LOD, gradients).
    extra: usize,
    query: Option<Query>,
    clamp: Option<Clamp>,
}

/// Decodes `tex`, `tld4`, `txq`, `suld`, `sust`, `suq` (their operands are `[handle, {coords}]`).
#[allow(clippy::type_complexity)]
pub fn decode(
    op: crate::inst::Op,
    mods_s: &[&str],
    rest: &str,
    operand: &mut dyn FnMut(&str, bool) -> Result<Operand, PtxError>,
) -> Result<(crate::inst::Mods, Type, Type, Vec<Operand>), PtxError> {
    use crate::inst::Op;
    let opcode = || format!("{op:?}").to_lowercase() + "." + &mods_s.join(".");
    let unsupported = || PtxError::Unsupported { opcode: opcode() };
    let TexMods {
        mut mods,
        types,
        geom,
        comp,
        extra,
        query,
        clamp,
    } = modifiers(op, mods_s).ok_or_else(unsupported)?;
    let mut t = TexOp {
        geom: Geom::D1,
        comp,
        query: Query::Width,
        clamp: Clamp::Trap,
    };
    let items = crate::parse::split_top(rest);
    let mut args = Vec::new();
    let (ty, ty2) = match op {
        Op::Tex | Op::Tld4 => {
            let g = geom.ok_or_else(unsupported)?;
            if op == Op::Tld4 && g != Geom::D2 && g != Geom::A2 {
                return Err(unsupported());
            }
            // `.v4.dtype.ctype`: dtype f32/s32/u32, ctype f32/s32.
            let [d, c] = <[Type; 2]>::try_from(types.clone()).map_err(|_| unsupported())?;
            if mods.vec != 4
                || d.size != 4
                || !matches!(d.kind, Ty::F | Ty::S | Ty::U)
                || c.size != 4
                || !matches!(c.kind, Ty::F | Ty::S)
            {
                return Err(unsupported());
            }
            if items.len() != 2 + extra {
                return Err(unsupported());
            }
            t.geom = g;
            args.push(dst_vector(&items[0], operand, &unsupported)?);
            let layered = matches!(g, Geom::A1 | Geom::A2 | Geom::ACube);
            args.push(handle_and_coords(
                &items[1],
                (g.coords(), c.kind == Ty::F, layered),
                operand,
                &unsupported,
            )?);
            (d, c)
        }
        Op::Suld | Op::Sust => {
            let g = geom
                .filter(|&g| !matches!(g, Geom::Cube | Geom::ACube))
                .ok_or_else(unsupported)?;
            let [d] = <[Type; 1]>::try_from(types.clone()).map_err(|_| unsupported())?;
            if d.kind != Ty::B || !mods_s.contains(&"b") {
                // `sust.p` (formatted stores) is not implemented.
                return Err(unsupported());
            }
            t.geom = g;
            t.clamp = clamp.unwrap_or(Clamp::Trap);
            if items.len() != 2 {
                return Err(unsupported());
            }
            let at = (g.coords(), false, false);
            if op == Op::Suld {
                args.push(dst_vector(&items[0], operand, &unsupported)?);
                args.push(handle_and_coords(&items[1], at, operand, &unsupported)?);
            } else {
                args.push(handle_and_coords(&items[0], at, operand, &unsupported)?);
                args.push(dst_vector(&items[1], operand, &unsupported)?);
            }
            (d, d)
        }
        _ => {
            // txq/suq: `.query.b32 d, [a]`.
            t.query = query.ok_or_else(unsupported)?;
            if types != [B32] || items.len() != 2 || mods.vec != 0 {
                return Err(unsupported());
            }
            args.push(operand(&items[0], false)?);
            args.push(handle_and_coords(
                &items[1],
                (0, false, false),
                operand,
                &unsupported,
            )?);
            (B32, B32)
        }
    };
    if mods.vec == 0 {
        mods.vec = 1;
    }
    mods.tex = Some(t);
    Ok((mods, ty, ty2, args))
}

/// The modifiers of `op`, if it is a form the VM runs.
fn modifiers(op: crate::inst::Op, mods_s: &[&str]) -> Option<TexMods> {
    use crate::inst::Op;
    let mut t = TexMods {
        mods: crate::inst::Mods::default(),
        types: Vec::new(),
        geom: None,
        comp: 0,
        extra: 0,
        query: None,
        clamp: None,
    };
    for &m in mods_s {
        if let Some(g) = Geom::parse(m) {
            t.geom = Some(g);
            continue;
        }
        if let Some(ty) = Type::parse_pub(m) {
            t.types.push(ty);
            continue;
        }
        match (op, m) {
            (_, "v2") => t.mods.vec = 2,
            (_, "v4") => t.mods.vec = 4,
            // One level: a LOD or gradients select it whatever their value.
            (Op::Tex, "level") => t.extra = 1,
            (Op::Tex, "grad") => t.extra = 2,
            (Op::Tld4, "r") => t.comp = 0,
            (Op::Tld4, "g") => t.comp = 1,
            (Op::Tld4, "b") => t.comp = 2,
            (Op::Tld4, "a") => t.comp = 3,
            (Op::Suld | Op::Sust, "b") => {}
            (Op::Suld | Op::Sust, "trap") => t.clamp = Some(Clamp::Trap),
            (Op::Suld | Op::Sust, "clamp") => t.clamp = Some(Clamp::Edge),
            (Op::Suld | Op::Sust, "zero") => t.clamp = Some(Clamp::Zero),
            // Cache operators change nothing here.
            (Op::Suld | Op::Sust, "ca" | "cg" | "cs" | "cv" | "wb" | "wt") => {}
            (Op::Txq | Op::Suq, q) => {
                t.query = Some(match q {
                    "width" => Query::Width,
                    "height" => Query::Height,
                    "depth" => Query::Depth,
                    "array_size" => Query::ArraySize,
                    "normalized_coords" if op == Op::Txq => Query::NormalizedCoords,
                    "filter_mode" if op == Op::Txq => Query::FilterMode,
                    "addr_mode_0" if op == Op::Txq => Query::AddrMode(0),
                    "addr_mode_1" if op == Op::Txq => Query::AddrMode(1),
                    "addr_mode_2" if op == Op::Txq => Query::AddrMode(2),
                    "num_mipmap_levels" if op == Op::Txq => Query::NumMipmapLevels,
                    "num_samples" if op == Op::Txq => Query::NumSamples,
                    _ => return None,
                })
            }
            _ => return None,
        }
    }
    Some(t)
}

/// The `[handle, {coords}]` operand: handle and coordinates, as one vector. `(n, float,
/// first_int)`: `n` coordinates, floats (but for the first, a layer index, if `first_int`).
fn handle_and_coords(
    text: &str,
    (n, float, first_int): (usize, bool, bool),
    operand: &mut OperandOf,
    unsupported: &dyn Fn() -> PtxError,
) -> Result<Operand, PtxError> {
    let inner = text
        .trim()
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .ok_or_else(unsupported)?;
    let parts = crate::parse::split_top(inner);
    let handle = parts.first().ok_or_else(unsupported)?;
    let handle = operand(handle, false)?;
    if !matches!(handle, Operand::Reg(_) | Operand::Imm(_)) {
        // A `.texref`/`.surfref` by name: texture references left CUDA in 12.0.
        return Err(unsupported());
    }
    let mut v = vec![handle];
    if n > 0 {
        let coords = parts.get(1).ok_or_else(unsupported)?;
        let list = coords
            .trim()
            .strip_prefix('{')
            .and_then(|x| x.strip_suffix('}'))
            .map(|x| x.split(',').map(str::to_string).collect::<Vec<_>>())
            .unwrap_or_else(|| vec![coords.clone()]);
        if list.len() < n {
            return Err(unsupported());
        }
        for (k, c) in list.iter().take(n).enumerate() {
            v.push(operand(c, float && !(first_int && k == 0))?);
        }
    } else if parts.len() != 1 {
        return Err(unsupported());
    }
    Ok(Operand::Vector(v))
}

/// The destination (or `sust`'s values) as a vector of registers.
fn dst_vector(
    text: &str,
    operand: &mut OperandOf,
    unsupported: &dyn Fn() -> PtxError,
) -> Result<Operand, PtxError> {
    let t = text.trim();
    if t.contains('|') {
        // `d|p`: the residency predicate of sparse textures.
        return Err(unsupported());
    }
    let list: Vec<&str> = match t.strip_prefix('{').and_then(|x| x.strip_suffix('}')) {
        Some(inner) => inner.split(',').collect(),
        None => vec![t],
    };
    Ok(Operand::Vector(
        list.iter()
            .map(|x| operand(x, false))
            .collect::<Result<_, _>>()?,
    ))
}

/// Looks up a handle once per distinct value in the group.
fn lookup(env: &Env, h: u64, last: &mut Option<(u64, Texture)>) -> Result<Texture, ExecError> {
    if let Some((k, t)) = *last {
        if k == h {
            return Ok(t);
        }
    }
    let t = env.l.mem.texture(h).ok_or_else(|| {
        ExecError::Texture(format!(
            "texture or surface object {h:#x} does not exist (destroyed, or never created)"
        ))
    })?;
    *last = Some((h, t));
    Ok(t)
}

fn check_geom(t: &Texture, g: Geom, what: &str) -> Result<(), ExecError> {
    let ok = match g {
        Geom::D1 => matches!(t.shape, Shape::Linear | Shape::D1),
        Geom::D2 => t.shape == Shape::D2,
        Geom::D3 => t.shape == Shape::D3,
        Geom::A1 => t.shape == Shape::A1,
        Geom::A2 => t.shape == Shape::A2,
        Geom::Cube => t.shape == Shape::A2 && t.depth == 6 && t.width == t.height,
        Geom::ACube => {
            t.shape == Shape::A2 && t.depth >= 6 && t.depth.is_multiple_of(6) && t.width == t.height
        }
    };
    if ok {
        Ok(())
    } else {
        Err(ExecError::Texture(format!(
            "{what}.{} on a {:?} object",
            g.name(),
            t.shape
        )))
    }
}

/// Reads the raw channels of the element at `(x, y, z)` (in range).
fn element(
    w: &Warp,
    env: &mut Env,
    l: usize,
    t: &Texture,
    x: u64,
    y: u64,
    z: u64,
) -> Result<[u64; 4], ExecError> {
    let at = t.addr + x * t.elem() + y * t.pitch + z * t.slice;
    let n = t.format.bytes();
    let mut out = [0u64; 4];
    for (c, o) in out.iter_mut().enumerate().take(t.channels as usize) {
        *o = crate::space::load(w, env, l, at + c as u64 * n, n)?;
    }
    Ok(out)
}

/// A channel as a float (normalized for 8/16-bit integers when the sampler says so).
fn channel_f32(t: &Texture, raw: u64, normalized: bool) -> f32 {
    match t.format {
        TexFormat::F32 => f32::from_bits(raw as u32),
        TexFormat::F16 => crate::half::F16.decode(raw) as f32,
        TexFormat::U8 if normalized => raw as u8 as f32 / 255.0,
        TexFormat::U16 if normalized => raw as u16 as f32 / 65535.0,
        TexFormat::S8 if normalized => (raw as i8 as f32 / 127.0).max(-1.0),
        TexFormat::S16 if normalized => (raw as i16 as f32 / 32767.0).max(-1.0),
        TexFormat::U8 | TexFormat::U16 | TexFormat::U32 => raw as u32 as f32,
        TexFormat::S8 => raw as i8 as f32,
        TexFormat::S16 => raw as i16 as f32,
        TexFormat::S32 => raw as i32 as f32,
    }
}

/// A channel as an integer result (sign-extended for signed formats).
fn channel_int(t: &Texture, raw: u64) -> u32 {
    match t.format {
        TexFormat::S8 => raw as i8 as i32 as u32,
        TexFormat::S16 => raw as i16 as i32 as u32,
        _ => raw as u32,
    }
}

/// Whether a fetch returns floats: float data, or 8/16-bit integers read as normalized floats.
fn returns_float(t: &Texture) -> bool {
    t.format.is_float()
        || t.sampler.is_some_and(|s| s.normalized_float)
            && !matches!(t.format, TexFormat::U32 | TexFormat::S32)
}

/// A texel index under an address mode; `None` is the border.
fn address(i: i64, n: u64, mode: AddressMode) -> Option<u64> {
    let n = n.max(1) as i64;
    Some(match mode {
        AddressMode::Clamp => i.clamp(0, n - 1) as u64,
        AddressMode::Border => {
            if i < 0 || i >= n {
                return None;
            }
            i as u64
        }
        AddressMode::Wrap => i.rem_euclid(n) as u64,
        AddressMode::Mirror => {
            let m = i.rem_euclid(2 * n);
            (if m >= n { 2 * n - 1 - m } else { m }) as u64
        }
    })
}

/// A normalized coordinate under wrap or mirror (the guide's rules), scaled to texels.
fn scale(u: f32, n: u64, mode: AddressMode, normalized: bool) -> f32 {
    if !normalized {
        return u;
    }
    let u = match mode {
        AddressMode::Wrap => u - u.floor(),
        AddressMode::Mirror => {
            let f = u.floor();
            let r = u - f;
            if (f as i64) & 1 != 0 {
                1.0 - r
            } else {
                r
            }
        }
        _ => u,
    };
    u * n as f32
}

/// The 9-bit fixed-point weight (8 fractional bits) of a fraction.
fn weight(f: f32) -> f32 {
    (f * 256.0).round() / 256.0
}

/// One texel as four floats or four integer bit patterns (the result's form).
#[allow(clippy::too_many_arguments)]
fn texel(
    w: &Warp,
    env: &mut Env,
    l: usize,
    t: &Texture,
    s: &Sampler,
    idx: [i64; 3],
    layer: u64,
    dims: usize,
    float: bool,
) -> Result<[u32; 4], ExecError> {
    let sizes = [t.width, t.height, t.depth];
    let mut at = [0u64; 3];
    let mut border = false;
    for k in 0..dims {
        match address(idx[k], sizes[k], s.address[k]) {
            Some(i) => at[k] = i,
            None => border = true,
        }
    }
    if border {
        return Ok(s
            .border
            .map(|b| if float { b.to_bits() } else { b as i32 as u32 }));
    }
    let (x, y, z) = match t.shape {
        Shape::A1 => (at[0], 0, layer),
        Shape::A2 => (at[0], at[1], layer),
        _ => (at[0], at[1], at[2]),
    };
    let raw = element(w, env, l, t, x, y, z)?;
    Ok(expand(t, &raw, float))
}

/// The raw channels as the four components of a result.
fn expand(t: &Texture, raw: &[u64; 4], float: bool) -> [u32; 4] {
    let normalized = t.sampler.is_some_and(|s| s.normalized_float);
    let mut out = if float {
        [0, 0, 0, 1.0f32.to_bits()]
    } else {
        [0, 0, 0, 1]
    };
    for (c, o) in out.iter_mut().enumerate().take(t.channels as usize) {
        *o = if float {
            channel_f32(t, raw[c], normalized).to_bits()
        } else {
            channel_int(t, raw[c])
        };
    }
    out
}

/// `tex` and `tld4` for the lanes in `run`.
pub fn tex(
    w: &mut Warp,
    env: &mut Env,
    g: &Group,
    ins: &Ins,
    run: u32,
    gather: bool,
) -> Result<(), ExecError> {
    let Some(op) = ins.m.tex else {
        return Err(ExecError::Unsupported("tex without its form".into()));
    };
    let coord_float = ins.ty2.kind == Ty::F;
    let mut h = [0u64; 32];
    val_into(w, env, g, ins.src(0), 8, &mut h)?;
    let n = op.geom.coords();
    let mut c = [[0u64; 32]; 4];
    for (k, ck) in c.iter_mut().enumerate().take(n) {
        val_into(w, env, g, ins.src(1 + k), 4, ck)?;
    }
    let mut out = [[0u64; 32]; 4];
    let mut last = None;
    let want_float = ins.ty.kind == Ty::F;
    for l in Bits(run) {
        let t = lookup(env, h[l], &mut last)?;
        let what = if gather { "tld4" } else { "tex" };
        check_geom(&t, op.geom, what)?;
        let r = if t.shape == Shape::Linear {
            // tex1Dfetch: an integer element index; out of range reads zero.
            let i = if coord_float {
                f32::from_bits(c[0][l] as u32).floor() as i64
            } else {
                c[0][l] as u32 as i32 as i64
            };
            let float = want_float || returns_float(&t);
            if i < 0 || i as u64 >= t.width {
                [0; 4]
            } else {
                let raw = element(w, env, l, &t, i as u64, 0, 0)?;
                expand(&t, &raw, float)
            }
        } else {
            let s = t.sampler.ok_or_else(|| {
                ExecError::Texture(format!("{what} of surface object {:#x}", h[l]))
            })?;
            sample(w, env, l, &t, &s, op, &c, coord_float, want_float, gather)?
        };
        for k in 0..4 {
            out[k][l] = r[k] as u64;
        }
    }
    for (d, o) in ins.d.iter().zip(&out).take(ins.nd as usize) {
        put(w, g, *d, o, run);
    }
    Ok(())
}

/// A filtered sample of an array or pitched texture at lane `l`'s coordinates.
#[allow(clippy::too_many_arguments)]
fn sample(
    w: &Warp,
    env: &mut Env,
    l: usize,
    t: &Texture,
    s: &Sampler,
    op: TexOp,
    c: &[Lanes; 4],
    coord_float: bool,
    want_float: bool,
    gather: bool,
) -> Result<[u32; 4], ExecError> {
    if matches!(op.geom, Geom::Cube | Geom::ACube) {
        return sample_cube(w, env, l, t, s, op, c, want_float);
    }
    let layered = matches!(op.geom, Geom::A1 | Geom::A2);
    // The layer (an integer, clamped to the layers there are) comes first.
    let layer = if layered {
        (c[0][l] as u32 as i32).clamp(0, t.depth.max(1) as i32 - 1) as u64
    } else {
        0
    };
    let first = layered as usize;
    let dims = op.geom.coords() - first;
    let sizes = [t.width, t.height, t.depth];
    let float = want_float || returns_float(t);
    if !coord_float {
        // Integer coordinates: the texel itself, no filtering.
        let mut idx = [0i64; 3];
        for k in 0..dims {
            idx[k] = c[first + k][l] as u32 as i32 as i64;
        }
        return texel(w, env, l, t, s, idx, layer, dims, float);
    }
    let mut x = [0f32; 3];
    for k in 0..dims {
        let u = f32::from_bits(c[first + k][l] as u32);
        x[k] = scale(u, sizes[k], s.address[k], s.normalized_coords);
    }
    if gather {
        // The four texels a bilinear filter would blend, one component of each, in the order
        // (i, j+1), (i+1, j+1), (i+1, j), (i, j).
        let (i, j) = ((x[0] - 0.5).floor() as i64, (x[1] - 0.5).floor() as i64);
        let mut r = [0u32; 4];
        for (k, (di, dj)) in [(0, 1), (1, 1), (1, 0), (0, 0)].into_iter().enumerate() {
            let v = texel(w, env, l, t, s, [i + di, j + dj, 0], layer, 2, float)?;
            r[k] = v[op.comp as usize];
        }
        return Ok(r);
    }
    if !s.linear {
        let idx = [
            x[0].floor() as i64,
            x[1].floor() as i64,
            x[2].floor() as i64,
        ];
        return texel(w, env, l, t, s, idx, layer, dims, float);
    }
    if !float {
        return Err(ExecError::Texture(
            "linear filtering of a texture read as integers".into(),
        ));
    }
    // Linear filtering: the 2^dims texels around x - 0.5, weighted by 9-bit fractions.
    let mut base = [0i64; 3];
    let mut a = [0f32; 3];
    for k in 0..dims {
        let xb = x[k] - 0.5;
        base[k] = xb.floor() as i64;
        a[k] = weight(xb - xb.floor());
    }
    let mut acc = [0f32; 4];
    for corner in 0..(1usize << dims) {
        let mut idx = base;
        let mut wgt = 1.0f32;
        for k in 0..dims {
            let up = corner >> k & 1 == 1;
            idx[k] += up as i64;
            wgt *= if up { a[k] } else { 1.0 - a[k] };
        }
        if wgt == 0.0 {
            continue;
        }
        let v = texel(w, env, l, t, s, idx, layer, dims, true)?;
        for k in 0..4 {
            acc[k] += wgt * f32::from_bits(v[k]);
        }
    }
    Ok(acc.map(f32::to_bits))
}

/// The face a direction points at and the face's normalized coordinates (s, t), by the table
/// of the CUDA programming guide ("Cubemap Fetch"): the major axis picks the face, and
/// s = (sc / |m| + 1) / 2, t = (tc / |m| + 1) / 2.
pub fn cube_face(x: f32, y: f32, z: f32) -> (u64, f32, f32) {
    let (ax, ay, az) = (x.abs(), y.abs(), z.abs());
    let (face, m, sc, tc) = if ax >= ay && ax >= az {
        if x >= 0.0 {
            (0, ax, -z, -y)
        } else {
            (1, ax, z, -y)
        }
    } else if ay >= az {
        if y >= 0.0 {
            (2, ay, x, z)
        } else {
            (3, ay, x, -z)
        }
    } else if z >= 0.0 {
        (4, az, x, -y)
    } else {
        (5, az, -x, -y)
    };
    let m = if m > 0.0 { m } else { 1.0 };
    (face, (sc / m + 1.0) / 2.0, (tc / m + 1.0) / 2.0)
}

/// `tex.cube`: the face's layer of the array, sampled at the face's normalized coordinates
/// with the texture's filter and address modes.
#[allow(clippy::too_many_arguments)]
fn sample_cube(
    w: &Warp,
    env: &mut Env,
    l: usize,
    t: &Texture,
    s: &Sampler,
    op: TexOp,
    c: &[Lanes; 4],
    want_float: bool,
) -> Result<[u32; 4], ExecError> {
    // `.acube`: the cubemap (an integer, clamped to the cubemaps there are) comes first.
    let (first, cube) = if op.geom == Geom::ACube {
        let cubes = (t.depth / 6).max(1) as i32;
        (1, (c[0][l] as u32 as i32).clamp(0, cubes - 1) as u64)
    } else {
        (0, 0)
    };
    let f = |k: usize| f32::from_bits(c[first + k][l] as u32);
    let (face, u, v) = cube_face(f(0), f(1), f(2));
    let mut layer = [[0u64; 32]; 4];
    layer[0][l] = 6 * cube + face;
    layer[1][l] = u.to_bits() as u64;
    layer[2][l] = v.to_bits() as u64;
    let face_op = TexOp {
        geom: Geom::A2,
        ..op
    };
    let normalized = Sampler {
        normalized_coords: true,
        ..*s
    };
    sample(
        w,
        env,
        l,
        t,
        &normalized,
        face_op,
        &layer,
        true,
        want_float,
        false,
    )
}

/// `txq` and `suq`.
pub fn query(w: &mut Warp, env: &mut Env, g: &Group, ins: &Ins, run: u32) -> Result<(), ExecError> {
    let Some(op) = ins.m.tex else {
        return Err(ExecError::Unsupported("txq without its form".into()));
    };
    let mut h = [0u64; 32];
    val_into(w, env, g, ins.src(0), 8, &mut h)?;
    let mut out = [0u64; 32];
    let mut last = None;
    for l in Bits(run) {
        let t = lookup(env, h[l], &mut last)?;
        let layered = matches!(t.shape, Shape::A1 | Shape::A2);
        let s = t.sampler;
        out[l] = match op.query {
            Query::Width => t.width,
            Query::Height => {
                if t.shape == Shape::A1 {
                    1
                } else {
                    t.height
                }
            }
            Query::Depth => {
                if layered {
                    1
                } else {
                    t.depth
                }
            }
            Query::ArraySize => {
                if layered {
                    t.depth
                } else {
                    0
                }
            }
            Query::NormalizedCoords => s.is_some_and(|s| s.normalized_coords) as u64,
            Query::FilterMode => s.is_some_and(|s| s.linear) as u64,
            Query::AddrMode(k) => s.map_or(0, |s| s.address[k as usize] as u64),
            Query::NumMipmapLevels => 1,
            Query::NumSamples => 0,
        };
    }
    put(w, g, ins.d[0], &out, run);
    Ok(())
}

/// The address of a surface access of `bytes` bytes at byte `x`, row `y`, slice or layer `z`
/// under the instruction's clamp mode; `None`: out of range in `.zero` mode.
fn surface_at(
    t: &Texture,
    op: TexOp,
    bytes: u64,
    c: [i64; 3],
    handle: u64,
) -> Result<Option<u64>, ExecError> {
    // (x in bytes, y, z) and which of y and z the geometry uses.
    let ((x, y, z), uses) = match op.geom {
        Geom::D1 => ((c[0], 0, 0), (false, false)),
        Geom::D2 => ((c[0], c[1], 0), (true, false)),
        Geom::D3 => ((c[0], c[1], c[2]), (true, true)),
        Geom::A1 => ((c[1], 0, c[0]), (false, true)),
        Geom::A2 => ((c[1], c[2], c[0]), (true, true)),
        Geom::Cube | Geom::ACube => {
            return Err(ExecError::Texture(format!(
                "a surface access with .{} geometry",
                op.geom.name()
            )))
        }
    };
    let row = t.width * t.elem();
    let mut out = false;
    let mut fit = |v: i64, n: u64, used: bool| -> i64 {
        if !used {
            return 0;
        }
        let n = n.max(1) as i64;
        if v < 0 || v >= n {
            out = true;
        }
        v.clamp(0, n - 1)
    };
    let y = fit(y, t.height, uses.0);
    let z = fit(z, t.depth, uses.1);
    let mut x = x;
    if x < 0 || (x as u64).saturating_add(bytes) > row {
        out = true;
        x = x.clamp(0, row.saturating_sub(bytes) as i64);
    }
    if out {
        match op.clamp {
            Clamp::Zero => return Ok(None),
            Clamp::Trap => {
                return Err(ExecError::Texture(format!(
                "surface object {handle:#x}: an access of {bytes} bytes at {c:?} is out of range"
            )))
            }
            Clamp::Edge => {}
        }
    }
    if !(x as u64).is_multiple_of(bytes) {
        return Err(ExecError::MisalignedAddress(t.addr + x as u64));
    }
    Ok(Some(
        t.addr + x as u64 + y as u64 * t.pitch + z as u64 * t.slice,
    ))
}

/// `suld.b` (`store == false`) and `sust.b`.
pub fn surface(
    w: &mut Warp,
    env: &mut Env,
    code: &Code,
    g: &Group,
    ins: &Ins,
    run: u32,
    store: bool,
) -> Result<(), ExecError> {
    let Some(op) = ins.m.tex else {
        return Err(ExecError::Unsupported("suld without its form".into()));
    };
    let mut h = [0u64; 32];
    val_into(w, env, g, ins.src(0), 8, &mut h)?;
    let n = op.geom.coords();
    let mut c = [[0u64; 32]; 3];
    for (k, ck) in c.iter_mut().enumerate().take(n) {
        val_into(w, env, g, ins.src(1 + k), 4, ck)?;
    }
    let size = ins.ty.size as u64;
    let count = ins.m.vec.max(1) as usize;
    let mut vals = [[0u64; 32]; 4];
    if store {
        let list = code
            .lists
            .get(ins.target as usize)
            .ok_or_else(|| ExecError::Unsupported("sust without values".into()))?;
        for (k, &s) in list.iter().enumerate().take(count) {
            val_into(w, env, g, s, size as u8, &mut vals[k])?;
        }
    }
    let mut last = None;
    for l in Bits(run) {
        let t = lookup(env, h[l], &mut last)?;
        check_geom(&t, op.geom, if store { "sust" } else { "suld" })?;
        let coords = [0, 1, 2].map(|k| {
            if k < n {
                c[k][l] as u32 as i32 as i64
            } else {
                0
            }
        });
        let at = surface_at(&t, op, size * count as u64, coords, h[l])?;
        for (k, v) in vals.iter_mut().enumerate().take(count) {
            match at {
                Some(a) if store => {
                    crate::space::store(w, env, l, a + k as u64 * size, size, v[l])?
                }
                Some(a) => v[l] = crate::space::load(w, env, l, a + k as u64 * size, size)?,
                None => {
                    if !store {
                        v[l] = 0;
                    }
                }
            }
        }
    }
    if !store {
        for (k, v) in vals.iter().enumerate().take((ins.nd as usize).min(count)) {
            put(w, g, ins.d[k], v, run);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::cube_face;

    /// The guide's face table: the major axis picks the face; the face's center is (0.5, 0.5)
    /// and its corners follow the table's signs.
    #[test]
    fn cube_faces_follow_the_guides_table() {
        assert_eq!(cube_face(1.0, 0.0, 0.0), (0, 0.5, 0.5));
        assert_eq!(cube_face(-1.0, 0.0, 0.0), (1, 0.5, 0.5));
        assert_eq!(cube_face(0.0, 1.0, 0.0), (2, 0.5, 0.5));
        assert_eq!(cube_face(0.0, -1.0, 0.0), (3, 0.5, 0.5));
        assert_eq!(cube_face(0.0, 0.0, 1.0), (4, 0.5, 0.5));
        assert_eq!(cube_face(0.0, 0.0, -1.0), (5, 0.5, 0.5));
        // +X: s from -z, t from -y.
        assert_eq!(cube_face(2.0, -1.0, 1.0), (0, 0.25, 0.75));
        // -Z: s from -x, t from -y.
        assert_eq!(cube_face(0.5, 0.5, -1.0), (5, 0.25, 0.25));
    }
}
