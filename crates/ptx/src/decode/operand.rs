//! Operands: registers (`%r1`, `!%p`), special registers (`%tid.x`), immediates in PTX's
//! number forms, addresses (`[%rd+8]`, `[sym]`), vectors (`{a, b}`), `d|p` pairs, labels of
//! branches and symbols.

use std::collections::HashMap;

use crate::inst::{Base, Operand, Sreg};
use crate::PtxError;

/// A number as raw bits of the given float width (if `float`) or as an integer.
pub fn parse_number(tok: &str, float: bool, f32: bool) -> Option<u64> {
    let t = tok.trim();
    if let Some(h) = t.strip_prefix("0f").or_else(|| t.strip_prefix("0F")) {
        let bits = u32::from_str_radix(h, 16).ok()?;
        return Some(if f32 || !float {
            bits as u64
        } else {
            (f32::from_bits(bits) as f64).to_bits()
        });
    }
    if let Some(h) = t.strip_prefix("0d").or_else(|| t.strip_prefix("0D")) {
        let bits = u64::from_str_radix(h, 16).ok()?;
        return Some(if f32 {
            (f64::from_bits(bits) as f32).to_bits() as u64
        } else {
            bits
        });
    }
    let (neg, body) = match t.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, t),
    };
    let body = body.trim_end_matches('U');
    let int = if let Some(h) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else if body.len() > 1 && body.starts_with('0') && body.bytes().all(|b| b.is_ascii_digit()) {
        u64::from_str_radix(&body[1..], 8).ok()
    } else {
        body.parse::<u64>().ok()
    };
    match int {
        Some(v) if !float || !body.contains(['.', 'e', 'E']) => {
            if float {
                let f = if neg { -(v as f64) } else { v as f64 };
                return Some(if f32 {
                    (f as f32).to_bits() as u64
                } else {
                    f.to_bits()
                });
            }
            Some(if neg { v.wrapping_neg() } else { v })
        }
        _ => {
            let f: f64 = t.parse().ok()?;
            Some(if f32 {
                (f as f32).to_bits() as u64
            } else {
                f.to_bits()
            })
        }
    }
}

fn special(name: &str) -> Option<Sreg> {
    let dim = |s: &str| match s {
        "x" => Some(0),
        "y" => Some(1),
        "z" => Some(2),
        _ => None,
    };
    if let Some((base, d)) = name.split_once('.') {
        let d = dim(d)?;
        return Some(match base {
            "%tid" => Sreg::Tid(d),
            "%ntid" => Sreg::Ntid(d),
            "%ctaid" => Sreg::Ctaid(d),
            "%nctaid" => Sreg::Nctaid(d),
            _ => return None,
        });
    }
    Some(match name {
        "%laneid" => Sreg::Laneid,
        "%warpid" => Sreg::Warpid,
        "%nwarpid" => Sreg::Nwarpid,
        "%smid" => Sreg::Smid,
        "%nsmid" => Sreg::Nsmid,
        "%clock" => Sreg::Clock,
        "%clock64" => Sreg::Clock64,
        "%lanemask_eq" => Sreg::LanemaskEq,
        "%lanemask_lt" => Sreg::LanemaskLt,
        "%lanemask_le" => Sreg::LanemaskLe,
        "%lanemask_gt" => Sreg::LanemaskGt,
        "%lanemask_ge" => Sreg::LanemaskGe,
        "%dynamic_smem_size" => Sreg::DynSmem,
        "%globaltimer" => Sreg::Globaltimer,
        "%reserved_smem_offset_begin" => Sreg::ReservedSmem(0),
        "%reserved_smem_offset_end" => Sreg::ReservedSmem(1),
        "%reserved_smem_offset_cap" => Sreg::ReservedSmem(2),
        "%reserved_smem_offset_0" => Sreg::ReservedSmem(3),
        "%reserved_smem_offset_1" => Sreg::ReservedSmem(4),
        _ => {
            let n: u8 = name.strip_prefix("%envreg")?.parse().ok()?;
            return (n < 32).then_some(Sreg::Envreg(n));
        }
    })
}

pub(super) fn operand(
    text: &str,
    regs: &HashMap<String, u32>,
    float: bool,
    f32: bool,
    label: &mut dyn FnMut(&str),
    is_branch: bool,
) -> Result<Operand, PtxError> {
    let t = text.trim();
    if t == "_" {
        return Ok(Operand::Sink);
    }
    // The warp size, a constant operand (what nvcc emits for `warpSize`).
    if t == "WARP_SZ" {
        return Ok(Operand::Imm(32));
    }
    if let Some((d, p)) = t.split_once('|') {
        // `d|p`: a value and a predicate destination (shfl, setp).
        return Ok(Operand::Vector(vec![
            operand(d, regs, float, f32, label, false)?,
            operand(p, regs, float, f32, label, false)?,
        ]));
    }
    if let Some(inner) = t.strip_prefix('{').and_then(|x| x.strip_suffix('}')) {
        let items = inner
            .split(',')
            .map(|x| operand(x, regs, float, f32, label, false))
            .collect::<Result<_, _>>()?;
        return Ok(Operand::Vector(items));
    }
    if let Some(inner) = t.strip_prefix('[').and_then(|x| x.strip_suffix(']')) {
        let inner = inner.replace(' ', "");
        let (base, off) = match inner.find(['+', '-']).filter(|&p| p > 0) {
            Some(p) => (
                &inner[..p],
                parse_number(inner[p..].trim_start_matches('+'), false, false).map(|v| v as i64),
            ),
            None => (inner.as_str(), Some(0)),
        };
        let offset = off.ok_or_else(|| PtxError::Syntax(format!("bad address {t}")))?;
        let base = if let Some(&r) = regs.get(base) {
            Base::Reg(r)
        } else if let Some(v) = parse_number(base, false, false) {
            return Ok(Operand::Addr {
                base: Base::Abs,
                offset: v as i64 + offset,
            });
        } else {
            Base::Sym(base.to_string())
        };
        return Ok(Operand::Addr { base, offset });
    }
    if let Some(r) = t.strip_prefix('!') {
        return regs
            .get(r)
            .map(|&i| Operand::NotReg(i))
            .ok_or_else(|| PtxError::Syntax(format!("unknown register {r}")));
    }
    if let Some(&r) = regs.get(t) {
        return Ok(Operand::Reg(r));
    }
    if let Some(s) = special(t) {
        return Ok(Operand::Special(s));
    }
    if t.starts_with('%') {
        return Err(PtxError::Syntax(format!("unknown register {t}")));
    }
    if let Some(v) = parse_number(t, float, f32) {
        return Ok(Operand::Imm(v));
    }
    if is_branch {
        label(t);
        return Ok(Operand::Label(usize::MAX));
    }
    Ok(Operand::Sym(t.to_string()))
}
