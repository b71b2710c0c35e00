//! What the device needs to know about a PTX module before the VM runs it: each kernel's
//! parameter layout and each module variable's size, alignment and initializer.
//!
//! Layout rule (docs: cuda-driver-interception.md section 7): `.param .<type>` has the type's
//! size and alignment; `.param .align A .b8 name[N]` has size N and alignment A;
//! `.param .<type> name[N]` is N elements; each offset is the previous end rounded up to the
//! parameter's alignment.

use gpufuse_proto::ParamSlot;

/// A kernel entry and its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    pub name: String,
    pub params: Vec<ParamSlot>,
}

/// A module-scope `.global` or `.const` variable.
#[derive(Debug, Clone, PartialEq)]
pub struct Variable {
    pub name: String,
    pub size: u64,
    pub align: u64,
    pub init: Option<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Layout {
    pub kernels: Vec<Kernel>,
    pub variables: Vec<Variable>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid PTX: {0}")]
pub struct LayoutError(pub String);

fn type_size(t: &str) -> Option<u64> {
    Some(match t {
        ".b8" | ".u8" | ".s8" | ".pred" => 1,
        ".b16" | ".u16" | ".s16" | ".f16" | ".bf16" => 2,
        ".b32" | ".u32" | ".s32" | ".f32" | ".f16x2" | ".bf16x2" => 4,
        ".b64" | ".u64" | ".s64" | ".f64" => 8,
        ".b128" => 16,
        _ => return None,
    })
}

fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

fn tokens(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in src.chars() {
        if c.is_whitespace() || "()[],;{}=".contains(c) {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            if !c.is_whitespace() {
                out.push(c.to_string());
            }
        } else {
            cur.push(c);
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn number(t: &str) -> Option<u64> {
    t.parse().ok()
}

/// One declaration: `[.align A] .<type> name [ '[' N? ']' ]...`, starting after the state space.
/// Returns (name, elem size, count, align, next token index).
fn declaration(t: &[String], mut i: usize) -> Result<(String, u64, u64, u64, usize), LayoutError> {
    let mut align = None;
    let mut elem = None;
    let mut pointer = false;
    while i < t.len() && t[i].starts_with('.') {
        match t[i].as_str() {
            // After `.ptr`, `.align` is the pointee's alignment, not the parameter's.
            ".align" => {
                if !pointer {
                    align = t.get(i + 1).and_then(|a| number(a));
                }
                i += 2;
                continue;
            }
            ".ptr" => pointer = true,
            ".global" | ".const" | ".shared" | ".local" | ".v2" | ".v4" => {}
            other => {
                if let Some(s) = type_size(other) {
                    elem = Some(s);
                } else if elem.is_none() && !other.starts_with(".ptr") {
                    return Err(LayoutError(format!("unknown type {other}")));
                }
            }
        }
        i += 1;
    }
    let elem = elem.ok_or_else(|| LayoutError("declaration without a type".into()))?;
    let name = t
        .get(i)
        .ok_or_else(|| LayoutError("declaration without a name".into()))?
        .clone();
    i += 1;
    let mut count = 1u64;
    while t.get(i).map(String::as_str) == Some("[") {
        match t.get(i + 1).map(String::as_str) {
            Some("]") => {
                count = 0;
                i += 2;
            }
            Some(n) => {
                count *= number(n).ok_or_else(|| LayoutError(format!("bad array size {n}")))?;
                i += 3;
            }
            None => return Err(LayoutError("unterminated array".into())),
        }
    }
    Ok((name, elem, count, align.unwrap_or(elem), i))
}

/// Parses an initializer value of one element.
fn element(tok: &str, elem: u64, float: bool) -> Option<Vec<u8>> {
    let v: u64 = if let Some(h) = tok.strip_prefix("0f").or_else(|| tok.strip_prefix("0F")) {
        u32::from_str_radix(h, 16).ok()? as u64
    } else if let Some(h) = tok.strip_prefix("0d").or_else(|| tok.strip_prefix("0D")) {
        u64::from_str_radix(h, 16).ok()?
    } else if let Some(h) = tok.strip_prefix("0x").or_else(|| tok.strip_prefix("0X")) {
        u64::from_str_radix(h.trim_end_matches('U'), 16).ok()?
    } else if float && tok.contains('.') {
        let f: f64 = tok.parse().ok()?;
        if elem == 4 {
            (f as f32).to_bits() as u64
        } else {
            f.to_bits()
        }
    } else {
        tok.trim_end_matches('U').parse::<i64>().ok()? as u64
    };
    Some(v.to_le_bytes()[..elem as usize].to_vec())
}

/// The layout of a module known only from its cubin (SASS): kernels and parameters from
/// `.nv.info`, variables from the symbol table (aligned to 8, the most a scalar needs).
pub fn from_cubin(info: &gpufuse_fatbin::CubinInfo) -> Layout {
    Layout {
        kernels: info
            .kernels
            .iter()
            .map(|k| Kernel {
                name: k.name.clone(),
                params: k
                    .params
                    .iter()
                    .map(|p| ParamSlot {
                        offset: p.offset,
                        size: p.size,
                    })
                    .collect(),
            })
            .collect(),
        variables: info
            .variables
            .iter()
            .map(|v| Variable {
                name: v.name.clone(),
                size: v.size,
                align: 8,
                init: v.init.clone(),
            })
            .collect(),
    }
}

/// The names of the module's function definitions (`.entry` or `.func` with a body, not the
/// declarations before them), in text order: function `i` is at
/// [`gpufuse_ptx::function_address`]`(i)`, as the VM numbers them.
fn defined_functions(t: &[String]) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < t.len() {
        match t[i].as_str() {
            "{" => depth += 1,
            "}" => depth = depth.saturating_sub(1),
            ".entry" | ".func" if depth == 0 => {
                // `.func (.param .b32 ret) name (params) ... { ... }` or `... ;`
                let mut j = i + 1;
                if t.get(j).map(String::as_str) == Some("(") {
                    while j < t.len() && t[j] != ")" {
                        j += 1;
                    }
                    j += 1;
                }
                let name = t.get(j).map(String::as_str);
                while j < t.len() && t[j] != "{" && t[j] != ";" {
                    j += 1;
                }
                if let (Some(name), Some("{")) = (name, t.get(j).map(String::as_str)) {
                    out.push(name);
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Parses the layout of a PTX module.
pub fn parse(src: &str) -> Result<Layout, LayoutError> {
    let t = tokens(&strip_comments(src));
    let functions = defined_functions(&t);
    let mut layout = Layout::default();
    let mut depth = 0usize;
    let mut i = 0;
    while i < t.len() {
        match t[i].as_str() {
            "{" => depth += 1,
            "}" => depth = depth.saturating_sub(1),
            ".entry" if depth == 0 => {
                let name = t
                    .get(i + 1)
                    .ok_or_else(|| LayoutError(".entry without a name".into()))?
                    .clone();
                i += 2;
                let mut params = Vec::new();
                let mut end = 0u32;
                if t.get(i).map(String::as_str) == Some("(") {
                    i += 1;
                    while i < t.len() && t[i] != ")" {
                        if t[i] == ".param" {
                            let (_, elem, count, align, next) = declaration(&t, i + 1)?;
                            let size = (elem * count.max(1)) as u32;
                            let offset = end.div_ceil(align as u32) * align as u32;
                            params.push(ParamSlot { offset, size });
                            end = offset + size;
                            i = next;
                        } else {
                            i += 1;
                        }
                    }
                }
                layout.kernels.push(Kernel { name, params });
            }
            ".global" | ".const"
                if depth == 0
                    && t.get(i.wrapping_sub(1)).map(String::as_str) != Some(".extern") =>
            {
                let (name, elem, count, align, mut next) = declaration(&t, i + 1)?;
                let float = t[i + 1..next].iter().any(|x| x.starts_with(".f"));
                let mut init = None;
                if t.get(next).map(String::as_str) == Some("=") {
                    let mut bytes = Vec::new();
                    next += 1;
                    while next < t.len() && t[next] != ";" {
                        if !matches!(t[next].as_str(), "{" | "}" | ",") {
                            // A function's name is its address, as the VM numbers functions.
                            let f = functions.iter().position(|f| *f == t[next]).map(|i| {
                                gpufuse_ptx::function_address(i).to_le_bytes()[..elem as usize]
                                    .to_vec()
                            });
                            bytes.extend(f.or_else(|| element(&t[next], elem, float)).ok_or_else(
                                || LayoutError(format!("bad initializer {}", t[next])),
                            )?);
                        }
                        next += 1;
                    }
                    init = Some(bytes);
                }
                let count = if count == 0 {
                    init.as_ref().map_or(0, |b| b.len() as u64 / elem)
                } else {
                    count
                };
                layout.variables.push(Variable {
                    name,
                    size: elem * count,
                    align,
                    init,
                });
                i = next;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvcc_vadd_layout() {
        let ptx = ".visible .entry _Z4vaddPKfS0_Pfi(\n\t.param .u32 n,\n\t.param .u64 .ptr .global .align 4 p,\n\t.param .u64 a2,\n\t.param .u32 a3\n)\n{\n\tret;\n}\n";
        let l = parse(ptx).unwrap();
        let offs: Vec<_> = l.kernels[0]
            .params
            .iter()
            .map(|p| (p.offset, p.size))
            .collect();
        // `.align 4` after `.ptr` is the pointee's: the pointer itself is 8-aligned.
        assert_eq!(offs, vec![(0, 4), (8, 8), (16, 8), (24, 4)]);
    }

    #[test]
    fn cupy_aligned_byte_arrays() {
        let ptx = ".visible .entry cupy_add__float64_float_float64(\n.param .align 8 .b8 p0[32],\n.param .f64 p1,\n.param .align 8 .b8 p2[32],\n.param .align 8 .b8 p3[24]\n)\n{ ret; }";
        let l = parse(ptx).unwrap();
        let offs: Vec<_> = l.kernels[0]
            .params
            .iter()
            .map(|p| (p.offset, p.size))
            .collect();
        assert_eq!(offs, vec![(0, 32), (32, 8), (40, 32), (72, 24)]);
    }

    #[test]
    fn kernels_named_like_instructions_and_globals() {
        let ptx = "// c\n.const .align 4 .b8 table[16] = {1, 2, 3, 4};\n.global .align 4 .f32 scale = 0f3F800000;\n.extern .shared .align 16 .b8 dyn[];\n.visible .entry vadd() { ret; }\n/* .entry nope() */";
        let l = parse(ptx).unwrap();
        assert_eq!(l.kernels.len(), 1);
        assert_eq!(l.kernels[0].name, "vadd");
        assert_eq!(l.variables[0].name, "table");
        assert_eq!(l.variables[0].size, 16);
        assert_eq!(l.variables[0].init.as_deref(), Some(&[1u8, 2, 3, 4][..]));
        assert_eq!(
            l.variables[1].init.as_deref(),
            Some(&1.0f32.to_le_bytes()[..])
        );
    }

    /// A table of function addresses (nvcc's `d_table[] = {f, g}`) holds the addresses the VM
    /// gives the functions: the same bytes as the VM's own parse of the module.
    #[test]
    fn function_addresses_in_initializers() {
        let ptx = ".version 8.0\n.target sm_80\n.address_size 64\n            .func (.param .b32 r) g\n(\n.param .b32 a\n)\n;\n            .global .align 8 .u64 table[2] = {g, f};\n            .visible .entry k(.param .u64 p) { ret; }\n            .func (.param .b32 r) f(.param .b32 a) { st.param.b32 [r], 1; ret; }\n            .func (.param .b32 r) g(.param .b32 a) { st.param.b32 [r], 2; ret; }\n";
        let l = parse(ptx).unwrap();
        let want: Vec<u8> = [2usize, 1]
            .iter()
            .flat_map(|&i| gpufuse_ptx::function_address(i).to_le_bytes())
            .collect();
        assert_eq!(l.variables[0].init.as_deref(), Some(&want[..]));
        let m = gpufuse_ptx::Module::parse(ptx).unwrap();
        assert_eq!(m.globals()[0].init.as_deref(), Some(&want[..]));
        assert!(parse(".global .u64 t[1] = {nothing};").is_err());
    }
}
