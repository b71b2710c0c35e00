//! Device-side `printf`: nvcc compiles it to `vprintf(format, args)`, an `.extern` function
//! with no body, whose second argument points at the arguments packed each at its own
//! alignment (integers of 4 or 8 bytes, doubles, pointers). The VM formats each call as C's
//! `printf` would and hands the text to [`crate::DeviceMemory::print`]; the device keeps it
//! for the application (gpufuse prints it at the next synchronizing call, as CUDA does).
//! Each call's text is one record: records of different threads never interleave.

use crate::code::{CallSite, Src};
use crate::space::{load, store, LOCAL_WINDOW};
use crate::warp::{Bits, Env, Group, Warp};
use crate::ExecError;

/// The longest format or `%s` string read (a GPU's printf buffer is 1 MiB in all).
const MAX_STRING: u64 = 64 << 10;
/// Widths and precisions are capped here (a larger one could not fit the buffer anyway).
const MAX_FIELD: usize = 4096;

/// Runs `vprintf` for `run`'s lanes (lowest lane first) and sets each one's return value,
/// the number of bytes it printed.
pub fn vprintf(
    w: &mut Warp,
    env: &mut Env,
    g: &Group,
    cs: &CallSite,
    run: u32,
) -> Result<(), ExecError> {
    let vals: Vec<crate::warp::Lanes> = cs
        .args
        .iter()
        .map(|&a| match a {
            Src::FrameParam(_) => Ok([0; 32]),
            a => crate::lanes::val(w, env, g, a, 8),
        })
        .collect::<Result<_, _>>()?;
    for l in Bits(run) {
        let mut arg = |k: usize| -> Result<u64, ExecError> {
            match cs.args.get(k) {
                Some(&Src::FrameParam(off)) => load(w, env, l, LOCAL_WINDOW + g.base + off, 8),
                Some(_) => Ok(vals[k][l]),
                None => Ok(0),
            }
        };
        let (fmt, args) = (arg(0)?, arg(1)?);
        let text = format(w, env, l, fmt, args)?;
        env.l.mem.print(&text);
        let n = text.len() as u64;
        match cs.rets.first() {
            Some(&Src::FrameParam(off)) => store(w, env, l, LOCAL_WINDOW + g.base + off, 4, n)?,
            Some(&Src::Reg(r)) => {
                if let Some(row) = w.levels[g.depth].get_mut(r as usize) {
                    row[l] = n;
                }
            }
            _ => {}
        }
    }
    w.goto(run, g.pc + 1);
    Ok(())
}

/// A NUL-terminated string at `p` in lane `l`'s view of memory.
fn string(w: &Warp, env: &mut Env, l: usize, p: u64, max: u64) -> Result<Vec<u8>, ExecError> {
    let mut out = Vec::new();
    for i in 0..max.min(MAX_STRING) {
        match load(w, env, l, p.wrapping_add(i), 1)? as u8 {
            0 => break,
            b => out.push(b),
        }
    }
    Ok(out)
}

/// One conversion's flags, width and precision.
#[derive(Default)]
struct Spec {
    left: bool,
    plus: bool,
    space: bool,
    alt: bool,
    zero: bool,
    width: usize,
    precision: Option<usize>,
    /// Length modifiers: `l` and wider (64-bit integers), and the number of `h`s.
    long: bool,
    short: u8,
}

impl Spec {
    /// `body` (digits, without sign) with `sign` and `prefix`, padded to the width.
    fn pad(&self, sign: &str, prefix: &str, body: &str, numeric: bool) -> String {
        let len = sign.len() + prefix.len() + body.len();
        if len >= self.width {
            return format!("{sign}{prefix}{body}");
        }
        let fill = self.width - len;
        if self.left {
            format!("{sign}{prefix}{body}{}", " ".repeat(fill))
        } else if self.zero && numeric {
            format!("{sign}{prefix}{}{body}", "0".repeat(fill))
        } else {
            format!("{}{sign}{prefix}{body}", " ".repeat(fill))
        }
    }

    fn sign(&self, negative: bool) -> &'static str {
        if negative {
            "-"
        } else if self.plus {
            "+"
        } else if self.space {
            " "
        } else {
            ""
        }
    }
}

/// C's `%e` body of `x` (finite, non-negative) with `p` fraction digits.
fn exp_form(x: f64, p: usize, upper: bool) -> String {
    let s = format!("{x:.p$e}");
    let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let e: i32 = exp.parse().unwrap_or(0);
    let sign = if e < 0 { '-' } else { '+' };
    let out = format!("{mant}e{sign}{:02}", e.unsigned_abs());
    if upper {
        out.to_uppercase()
    } else {
        out
    }
}

/// C's `%g` body: `%e` or `%f` by the exponent, trailing zeros removed unless `#`.
fn general_form(x: f64, p: usize, alt: bool, upper: bool) -> String {
    let p = p.max(1);
    let e = if x == 0.0 {
        0
    } else {
        let s = format!("{x:.*e}", p - 1);
        s.split_once('e')
            .and_then(|(_, e)| e.parse::<i32>().ok())
            .unwrap_or(0)
    };
    let mut s = if (e as i64) < p as i64 && e >= -4 {
        format!("{x:.*}", (p as i64 - 1 - e as i64).max(0) as usize)
    } else {
        exp_form(x, p - 1, upper)
    };
    if !alt {
        let (mant, exp) = match s.find(['e', 'E']) {
            Some(i) => (s[..i].to_string(), s[i..].to_string()),
            None => (s.clone(), String::new()),
        };
        let mant = if mant.contains('.') {
            mant.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            mant
        };
        s = mant + &exp;
    }
    s
}

/// The packed arguments of one `printf` call of lane `l`, read in order, each at its own
/// alignment.
struct Args<'w> {
    w: &'w Warp,
    l: usize,
    at: u64,
    off: u64,
}

impl Args<'_> {
    /// The next argument of `size` bytes.
    fn next(&mut self, env: &mut Env, size: u64) -> Result<u64, ExecError> {
        self.off = self.off.div_ceil(size) * size;
        let v = load(self.w, env, self.l, self.at.wrapping_add(self.off), size)?;
        self.off += size;
        Ok(v)
    }
}

/// Formats `printf(fmt, args...)` for lane `l`: `args` points at the packed arguments.
fn format(w: &Warp, env: &mut Env, l: usize, fmt: u64, args: u64) -> Result<Vec<u8>, ExecError> {
    let f = string(w, env, l, fmt, MAX_STRING)?;
    let mut out: Vec<u8> = Vec::new();
    let mut args = Args {
        w,
        l,
        at: args,
        off: 0,
    };
    let mut i = 0;
    while i < f.len() {
        let c = f[i];
        i += 1;
        if c != b'%' {
            out.push(c);
            continue;
        }
        let start = i - 1;
        let mut spec = conversion_spec(&f, &mut i, env, &mut args)?;
        let Some(&conv) = f.get(i) else {
            out.extend_from_slice(&f[start..]);
            break;
        };
        i += 1;
        let text = match conv {
            b'%' => "%".to_string(),
            b'd' | b'i' => signed(&mut spec, env, &mut args)?,
            b'u' | b'x' | b'X' | b'o' => unsigned(conv, &mut spec, env, &mut args)?,
            b'c' => {
                let v = args.next(env, 4)? as u8;
                let body = String::from_utf8_lossy(&[v]).into_owned();
                spec.pad("", "", &body, false)
            }
            b's' => {
                let p = args.next(env, 8)?;
                let s = if p == 0 {
                    b"(null)".to_vec()
                } else {
                    string(
                        w,
                        env,
                        l,
                        p,
                        spec.precision.map_or(MAX_STRING, |p| p as u64),
                    )?
                };
                let body = String::from_utf8_lossy(&s).into_owned();
                spec.pad("", "", &body, false)
            }
            b'p' => {
                let p = args.next(env, 8)?;
                spec.pad("", "0x", &format!("{p:x}"), false)
            }
            b'f' | b'F' | b'e' | b'E' | b'g' | b'G' | b'a' | b'A' => {
                float(conv, &spec, f64::from_bits(args.next(env, 8)?))
            }
            // Anything else (`%n`, unknown conversions) is printed as written.
            _ => String::from_utf8_lossy(&f[start..i]).into_owned(),
        };
        out.extend_from_slice(text.as_bytes());
    }
    Ok(out)
}

/// A conversion's flags, width, precision and length (`f[*i]` is just after its `%`; `*`
/// widths and precisions are read from the arguments), up to its conversion character.
fn conversion_spec(
    f: &[u8],
    i: &mut usize,
    env: &mut Env,
    args: &mut Args,
) -> Result<Spec, ExecError> {
    let mut spec = Spec::default();
    while let Some(&c) = f.get(*i) {
        match c {
            b'-' => spec.left = true,
            b'+' => spec.plus = true,
            b' ' => spec.space = true,
            b'#' => spec.alt = true,
            b'0' => spec.zero = true,
            _ => break,
        }
        *i += 1;
    }
    if f.get(*i) == Some(&b'*') {
        let v = args.next(env, 4)? as u32 as i32;
        spec.left |= v < 0;
        spec.width = v.unsigned_abs() as usize;
        *i += 1;
    } else {
        while let Some(d) = f.get(*i).filter(|c| c.is_ascii_digit()) {
            spec.width = spec
                .width
                .saturating_mul(10)
                .saturating_add((d - b'0') as usize);
            *i += 1;
        }
    }
    if f.get(*i) == Some(&b'.') {
        *i += 1;
        let mut p = 0usize;
        if f.get(*i) == Some(&b'*') {
            let v = args.next(env, 4)? as u32 as i32;
            *i += 1;
            spec.precision = (v >= 0).then_some(v as usize);
        } else {
            while let Some(d) = f.get(*i).filter(|c| c.is_ascii_digit()) {
                p = p.saturating_mul(10).saturating_add((d - b'0') as usize);
                *i += 1;
            }
            spec.precision = Some(p);
        }
    }
    // Length: hh, h, l, ll, z, j, t, L (64-bit integers for l and wider on this ABI).
    while let Some(&c) = f.get(*i) {
        match c {
            b'l' | b'z' | b'j' | b't' | b'L' | b'q' => spec.long = true,
            b'h' => spec.short += 1,
            _ => break,
        }
        *i += 1;
    }
    spec.width = spec.width.min(MAX_FIELD);
    spec.precision = spec.precision.map(|p| p.min(MAX_FIELD));
    Ok(spec)
}

/// `digits` zero-extended to the precision (none for a zero of precision 0); a precision
/// turns the `0` flag off.
fn with_precision(spec: &mut Spec, mut digits: String, zero_value: bool) -> String {
    if let Some(p) = spec.precision {
        spec.zero = false;
        if p == 0 && zero_value {
            digits.clear();
        } else if digits.len() < p {
            digits = "0".repeat(p - digits.len()) + &digits;
        }
    }
    digits
}

/// `%d`, `%i`.
fn signed(spec: &mut Spec, env: &mut Env, args: &mut Args) -> Result<String, ExecError> {
    let v = if spec.long {
        args.next(env, 8)? as i64
    } else {
        args.next(env, 4)? as u32 as i32 as i64
    };
    let v = match spec.short {
        0 => v,
        1 => v as i16 as i64,
        _ => v as i8 as i64,
    };
    let digits = with_precision(spec, v.unsigned_abs().to_string(), v == 0);
    Ok(spec.pad(spec.sign(v < 0), "", &digits, true))
}

/// `%u`, `%x`, `%X`, `%o`.
fn unsigned(
    conv: u8,
    spec: &mut Spec,
    env: &mut Env,
    args: &mut Args,
) -> Result<String, ExecError> {
    let v = if spec.long {
        args.next(env, 8)?
    } else {
        args.next(env, 4)?
    };
    let v = match spec.short {
        0 => v,
        1 => v as u16 as u64,
        _ => v as u8 as u64,
    };
    let digits = match conv {
        b'u' => v.to_string(),
        b'x' => format!("{v:x}"),
        b'X' => format!("{v:X}"),
        _ => format!("{v:o}"),
    };
    let digits = with_precision(spec, digits, v == 0);
    let prefix = match conv {
        b'x' if spec.alt && v != 0 => "0x",
        b'X' if spec.alt && v != 0 => "0X",
        b'o' if spec.alt && !digits.starts_with('0') => "0",
        _ => "",
    };
    Ok(spec.pad("", prefix, &digits, true))
}

/// `%f`, `%F`, `%e`, `%E`, `%g`, `%G`, `%a`, `%A` of `x`.
fn float(conv: u8, spec: &Spec, x: f64) -> String {
    let upper = conv.is_ascii_uppercase();
    let neg = x.is_sign_negative() && !x.is_nan();
    let a = x.abs();
    let p = spec.precision.unwrap_or(6);
    let body = if x.is_nan() {
        "nan".to_string()
    } else if a.is_infinite() {
        "inf".to_string()
    } else {
        match conv {
            b'f' | b'F' => format!("{a:.p$}"),
            b'e' | b'E' => exp_form(a, p, upper),
            b'g' | b'G' => general_form(a, spec.precision.unwrap_or(6), spec.alt, upper),
            // %a: hexadecimal floating point, as glibc writes a normal double.
            _ => hex_float(a, spec.precision),
        }
    };
    let body = if upper { body.to_uppercase() } else { body };
    let numeric = x.is_finite();
    spec.pad(spec.sign(neg), "", &body, numeric)
}

/// `%a` of a non-negative finite double: `0x1.<hex>p<exp>` (`0x0p+0` for zero).
fn hex_float(a: f64, precision: Option<usize>) -> String {
    if a == 0.0 {
        return "0x0p+0".to_string();
    }
    let bits = a.to_bits();
    let (mut exp, mut mant, lead) = if bits >> 52 == 0 {
        (-1022i64, bits & ((1 << 52) - 1), 0)
    } else {
        ((bits >> 52) as i64 - 1023, bits & ((1 << 52) - 1), 1)
    };
    let mut digits = format!("{mant:013x}");
    if let Some(p) = precision.filter(|&p| p < 13) {
        // Round the mantissa to p hex digits (to nearest, ties to even).
        let drop = 4 * (13 - p) as u32;
        let full = (lead << 52) | mant;
        let half = 1u64 << (drop - 1);
        let rem = full & ((1 << drop) - 1);
        let mut kept = full >> drop;
        if rem > half || (rem == half && kept & 1 == 1) {
            kept += 1;
        }
        let lead2 = kept >> (4 * p);
        mant = kept & ((1u64 << (4 * p)) - 1);
        if lead2 > 1 {
            exp += 1;
        }
        digits = if p == 0 {
            String::new()
        } else {
            format!("{mant:0w$x}", w = p)
        };
    } else {
        digits = digits.trim_end_matches('0').to_string();
    }
    let dot = if digits.is_empty() { "" } else { "." };
    let sign = if exp < 0 { '-' } else { '+' };
    format!("0x{lead}{dot}{digits}p{sign}{}", exp.unsigned_abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_float_forms() {
        assert_eq!(exp_form(12345.678, 6, false), "1.234568e+04");
        assert_eq!(exp_form(0.000123, 2, true), "1.23E-04");
        assert_eq!(general_form(0.0001, 6, false, false), "0.0001");
        assert_eq!(general_form(1e-5, 6, false, false), "1e-05");
        assert_eq!(general_form(123456789.0, 6, false, false), "1.23457e+08");
        assert_eq!(general_form(100.0, 6, true, false), "100.000");
        assert_eq!(hex_float(1.0, None), "0x1p+0");
        assert_eq!(hex_float(0.5, None), "0x1p-1");
    }
}
