//! From PTX text to functions made of decoded instructions.
//!
//! A hand-written lexer and statement parser: PTX is line-oriented and regular (directives,
//! declarations and `[@pred] opcode.mods operands;` statements), and the crates that parse it
//! either lack the forms nvcc/CuPy emit (`.param .align N .b8 name[M]`) or are unmaintained.

use std::collections::HashMap;

use crate::inst::{decode, Inst};
use crate::PtxError;

/// A kernel parameter (or a device function's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    pub name: String,
    pub offset: u32,
    pub size: u32,
    pub align: u32,
}

/// A variable declared in a function or module.
#[derive(Debug, Clone, PartialEq)]
pub struct Var {
    pub name: String,
    pub space: String,
    pub size: u64,
    pub align: u64,
    pub elem: u64,
    pub init: Option<Vec<u8>>,
}

/// A parsed `.entry` or `.func`.
#[derive(Debug, Clone)]
pub struct Function {
    pub name: String,
    pub is_entry: bool,
    pub params: Vec<Param>,
    pub returns: Vec<Param>,
    pub param_bytes: u32,
    /// Register name -> index, as seen at the end of the body (a scope's registers are gone).
    pub regs: HashMap<String, u32>,
    /// Registers in all, scoped ones included: `{ .reg .u32 %r1; ... }` declares a new
    /// register that shadows the function's `%r1` until the closing brace.
    pub nregs: usize,
    pub insts: Vec<Inst>,
    /// Variables declared in the body (`.shared`, `.local`, `.param` for calls).
    pub locals: Vec<Var>,
    pub max_threads: Option<u32>,
    /// The first instruction the VM does not implement, if any: the function still loads (a
    /// module holds many kernels), and launching it fails naming the instruction.
    pub unsupported: Option<String>,
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

pub fn type_size(t: &str) -> Option<u64> {
    Some(match t {
        "b8" | "u8" | "s8" | "pred" => 1,
        "b16" | "u16" | "s16" | "f16" | "bf16" => 2,
        "b32" | "u32" | "s32" | "f32" | "f16x2" | "bf16x2" | "tf32" => 4,
        "b64" | "u64" | "s64" | "f64" => 8,
        "b128" => 16,
        _ => return None,
    })
}

/// Splits `s` at top-level commas (outside brackets, braces and parentheses).
pub fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '[' | '{' | '(' => depth += 1,
            ']' | '}' | ')' => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 {
            out.push(cur.trim().to_string());
            cur.clear();
        } else {
            cur.push(c);
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// A declaration like `.align 8 .b8 name[24]` or `.u64 .ptr .global .align 4 name` or
/// `.f32 x = 0f3F800000`: (name, elem size, count, align, init text).
fn declaration(text: &str) -> Result<(String, u64, u64, u64, Option<String>), PtxError> {
    let (decl, init) = match text.split_once('=') {
        Some((d, i)) => (d, Some(i.trim().to_string())),
        None => (text, None),
    };
    let words: Vec<&str> = decl.split_whitespace().collect();
    let (mut align, mut elem, mut pointer, mut name) = (None, None, false, None);
    let mut i = 0;
    while i < words.len() {
        let w = words[i];
        if w == ".align" {
            if !pointer {
                align = words.get(i + 1).and_then(|a| a.parse::<u64>().ok());
            }
            i += 2;
            continue;
        }
        if w == ".ptr" {
            pointer = true;
        } else if let Some(t) = w.strip_prefix('.') {
            if let Some(s) = type_size(t) {
                elem = Some(s);
            } else if t.starts_with('v') && t.len() == 2 {
                // .v2/.v4 vector variables
            }
        } else {
            name = Some(w);
        }
        i += 1;
    }
    let name =
        name.ok_or_else(|| PtxError::Syntax(format!("declaration without a name: {text}")))?;
    let elem =
        elem.ok_or_else(|| PtxError::Syntax(format!("declaration without a type: {text}")))?;
    let (base, mut count) = match name.find('[') {
        Some(p) => (&name[..p], 1u64),
        None => (name, 1),
    };
    let mut rest = &name[base.len()..];
    let mut unsized_array = false;
    while let Some(open) = rest.find('[') {
        let close = rest
            .find(']')
            .ok_or_else(|| PtxError::Syntax(format!("bad array: {text}")))?;
        let n = rest[open + 1..close].trim();
        if n.is_empty() {
            unsized_array = true;
        } else {
            count *= n
                .parse::<u64>()
                .map_err(|_| PtxError::Syntax(format!("bad array size: {text}")))?;
        }
        rest = &rest[close + 1..];
    }
    if unsized_array {
        count = 0;
    }
    Ok((base.to_string(), elem, count, align.unwrap_or(elem), init))
}

/// Names in an initializer (`{func_a, func_b}`): each name, where its value goes.
type Refs = Vec<(usize, String)>;

fn parse_init(init: &str, elem: u64, float: bool, refs: &mut Refs) -> Result<Vec<u8>, PtxError> {
    let mut out = Vec::new();
    for tok in init
        .split(|c: char| c == ',' || c == '{' || c == '}' || c.is_whitespace())
        .filter(|t| !t.is_empty())
    {
        let v = match crate::inst::parse_number(tok, float, elem == 4) {
            Some(v) => v,
            None if is_name(tok) => {
                refs.push((out.len(), tok.to_string()));
                0
            }
            None => return Err(PtxError::Syntax(format!("bad initializer {tok}"))),
        };
        out.extend_from_slice(&v.to_le_bytes()[..elem as usize]);
    }
    Ok(out)
}

/// A PTX identifier: `[A-Za-z_$%][A-Za-z0-9_$]*`, not a number.
pub fn is_name(t: &str) -> bool {
    let mut c = t.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || "_$%".contains(f))
        && c.all(|x| x.is_ascii_alphanumeric() || "_$".contains(x))
}

/// A variable whose initializer names no symbol.
fn var(space: &str, text: &str) -> Result<Var, PtxError> {
    let (v, refs) = var_refs(space, text)?;
    match refs.first() {
        Some((_, name)) => Err(PtxError::Syntax(format!("bad initializer {name}"))),
        None => Ok(v),
    }
}

/// A variable, and the names its initializer holds (their bytes are zero until resolved).
fn var_refs(space: &str, text: &str) -> Result<(Var, Refs), PtxError> {
    let (name, elem, count, align, init) = declaration(text)?;
    let float = text.contains(".f32") || text.contains(".f64");
    let mut refs = Vec::new();
    let init = init
        .map(|i| parse_init(&i, elem, float, &mut refs))
        .transpose()?;
    let count = if count == 0 {
        init.as_ref().map_or(0, |b| b.len() as u64 / elem)
    } else {
        count
    };
    Ok((
        Var {
            name,
            space: space.to_string(),
            size: elem * count,
            align,
            elem,
            init,
        },
        refs,
    ))
}

fn params(list: &str) -> Result<Vec<Param>, PtxError> {
    let mut out = Vec::new();
    let mut end = 0u32;
    for p in split_top(list) {
        let p = p.trim().trim_start_matches(".param").trim();
        if p.is_empty() {
            continue;
        }
        let (name, elem, count, align, _) = declaration(p)?;
        let size = (elem * count.max(1)) as u32;
        let align = align.max(1) as u32;
        let offset = end.div_ceil(align) * align;
        out.push(Param {
            name,
            offset,
            size,
            align,
        });
        end = offset + size;
    }
    Ok(out)
}

/// A parsed module: functions and module-scope variables.
pub struct Parsed {
    pub version: (u32, u32),
    pub target: u32,
    pub functions: Vec<Function>,
    pub globals: Vec<Var>,
    /// Names in the globals' initializers: (global, byte offset, name), resolved at the end.
    refs: Vec<(usize, usize, String)>,
}

pub fn parse(src: &str) -> Result<Parsed, PtxError> {
    let mut parsed = Parsed {
        version: (0, 0),
        target: 0,
        functions: Vec::new(),
        globals: Vec::new(),
        refs: Vec::new(),
    };
    // `.version`, `.target` and `.address_size` end at the end of their line, not at a ';'.
    let src: String = strip_comments(src)
        .lines()
        .filter(|line| {
            let t = line.trim_start();
            let header = t.starts_with(".version")
                || t.starts_with(".target")
                || t.starts_with(".address_size");
            if header {
                let _ = top_directive(t, &mut parsed);
            }
            !header
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut rest = src.as_str();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        // Find the end of the next top-level item: a ';' or a '{ ... }' body.
        let semi = rest.find(';');
        let brace = rest.find('{');
        let is_body = match (semi, brace) {
            (Some(s), Some(b)) => b < s,
            (None, Some(_)) => true,
            _ => false,
        };
        if !is_body {
            let end = semi.unwrap_or(rest.len());
            let stmt = rest[..end].trim();
            rest = &rest[(end + 1).min(rest.len())..];
            top_directive(stmt, &mut parsed)?;
            continue;
        }
        let b = brace.expect("body");
        let header = rest[..b].trim().to_string();
        // Matching close brace.
        let mut depth = 0;
        let mut end = None;
        for (i, c) in rest[b..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(b + i);
                        break;
                    }
                }
                _ => {}
            }
        }
        let end = end.ok_or_else(|| PtxError::Syntax("unterminated function body".into()))?;
        let body = &rest[b + 1..end];
        rest = &rest[end + 1..];
        if header.contains(".entry") || header.contains(".func") {
            parsed.functions.push(function(&header, body)?);
        } else if header.contains(".global") || header.contains(".const") {
            // An initializer in braces: `.global .u32 t[2] = {1, 2};`
            let semi = rest.find(';').unwrap_or(rest.len());
            let text = format!("{header}{{{body}}}{}", &rest[..semi]);
            rest = &rest[(semi + 1).min(rest.len())..];
            top_directive(&text, &mut parsed)?;
        }
    }
    // A function's name in an initializer is its address (`crate::space::FUNCTION_WINDOW`).
    for (g, at, name) in std::mem::take(&mut parsed.refs) {
        let i = parsed
            .functions
            .iter()
            .position(|f| f.name == name)
            .ok_or_else(|| PtxError::Syntax(format!("bad initializer {name}")))?;
        let v = &mut parsed.globals[g];
        let n = v.elem as usize;
        if let Some(bytes) = v.init.as_mut().and_then(|b| b.get_mut(at..at + n)) {
            bytes.copy_from_slice(&crate::space::function_address(i).to_le_bytes()[..n]);
        }
    }
    Ok(parsed)
}

fn top_directive(stmt: &str, parsed: &mut Parsed) -> Result<(), PtxError> {
    let words: Vec<&str> = stmt.split_whitespace().collect();
    let Some(&first) = words.first() else {
        return Ok(());
    };
    match first {
        ".version" => {
            let v = words.get(1).copied().unwrap_or("0.0");
            let (a, b) = v.split_once('.').unwrap_or((v, "0"));
            parsed.version = (a.parse().unwrap_or(0), b.parse().unwrap_or(0));
        }
        ".target" => {
            parsed.target = words
                .get(1)
                .and_then(|t| {
                    t.trim_end_matches(',')
                        .trim_start_matches("sm_")
                        .trim_end_matches(['a', 'f'])
                        .parse()
                        .ok()
                })
                .unwrap_or(0);
        }
        _ => {
            if stmt.contains(".func") || stmt.contains(".entry") {
                return Ok(()); // declarations of functions
            }
            if stmt.contains(".extern") && !stmt.contains(".shared") {
                return Ok(()); // externs resolved elsewhere
            }
            for space in [".global", ".const"] {
                if let Some(pos) = stmt.find(space) {
                    let text = &stmt[pos + space.len()..];
                    let (v, refs) = var_refs(&space[1..], text)?;
                    let g = parsed.globals.len();
                    parsed
                        .refs
                        .extend(refs.into_iter().map(|(at, name)| (g, at, name)));
                    parsed.globals.push(v);
                    return Ok(());
                }
            }
            if stmt.contains(".shared") {
                // Module-scope shared variables: recorded with the globals, placed per block.
                if let Some(pos) = stmt.find(".shared") {
                    parsed.globals.push(var("shared", &stmt[pos + 7..])?);
                }
            }
        }
    }
    Ok(())
}

fn function(header: &str, body: &str) -> Result<Function, PtxError> {
    let is_entry = header.contains(".entry");
    let kw = if is_entry { ".entry" } else { ".func" };
    let after = &header[header.find(kw).expect("keyword") + kw.len()..];
    let after = after.trim();
    // `.func (.param .b64 ret) name (params)` or `.entry name (params)`.
    let (returns, after) = if after.starts_with('(') {
        let close = after
            .find(')')
            .ok_or_else(|| PtxError::Syntax("bad .func return list".into()))?;
        (params(&after[1..close])?, after[close + 1..].trim())
    } else {
        (Vec::new(), after)
    };
    let name_end = after
        .find(|c: char| c == '(' || c.is_whitespace())
        .unwrap_or(after.len());
    let name = after[..name_end].to_string();
    let after = &after[name_end..];
    let (plist, directives) = match (after.find('('), after.rfind(')')) {
        (Some(a), Some(b)) if b > a => (&after[a + 1..b], &after[b + 1..]),
        _ => ("", after),
    };
    let params = params(plist)?;
    let param_bytes = params.last().map_or(0, |p| p.offset + p.size);
    let max_threads = directives
        .split(".maxntid")
        .nth(1)
        .or_else(|| directives.split(".reqntid").nth(1))
        .map(|d| {
            d.split(',')
                .filter_map(|x| x.trim().parse::<u32>().ok())
                .product()
        });
    let mut f = Function {
        name,
        is_entry,
        params,
        returns,
        param_bytes,
        regs: HashMap::new(),
        nregs: 0,
        insts: Vec::new(),
        locals: Vec::new(),
        max_threads,
        unsupported: None,
    };
    for p in f.params.clone().iter().chain(f.returns.clone().iter()) {
        let _ = p;
    }
    let mut labels: HashMap<String, usize> = HashMap::new();
    let mut pending: Vec<(usize, String)> = Vec::new();
    let mut scopes: Vec<Shadowed> = Vec::new();
    for raw in body.split(';') {
        let mut stmt = raw.trim();
        // Labels (possibly several) before a statement, and the braces of nested scopes.
        loop {
            let rest = stmt.trim_start_matches(|c: char| c == '{' || c == '}' || c.is_whitespace());
            for c in stmt[..stmt.len() - rest.len()].chars() {
                match c {
                    '{' => scopes.push(Vec::new()),
                    '}' => {
                        for (name, outer) in scopes.pop().unwrap_or_default().into_iter().rev() {
                            match outer {
                                Some(r) => f.regs.insert(name, r),
                                None => f.regs.remove(&name),
                            };
                        }
                    }
                    _ => {}
                }
            }
            stmt = rest;
            match stmt.find(':') {
                Some(c)
                    if !stmt[..c].contains(char::is_whitespace)
                        && !stmt[..c].contains('[')
                        && !stmt[c..].starts_with("::")
                        && !stmt.starts_with('@') =>
                {
                    labels.insert(stmt[..c].to_string(), f.insts.len());
                    stmt = stmt[c + 1..].trim();
                }
                _ => break,
            }
        }
        let stmt = stmt.trim();
        if stmt.is_empty() {
            continue;
        }
        if let Some(decl) = stmt.strip_prefix(".reg") {
            declare_regs(decl, &mut f.regs, &mut f.nregs, scopes.last_mut())?;
            continue;
        }
        let mut handled = false;
        for space in [".shared", ".local", ".param", ".const", ".global"] {
            if let Some(text) = stmt.strip_prefix(space) {
                f.locals.push(var(&space[1..], text)?);
                handled = true;
                break;
            }
        }
        // `proto: .callprototype ...` and `tgts: .calltargets ...` describe indirect calls; the
        // call sites themselves say what passes.
        if handled
            || stmt.contains(".callprototype")
            || stmt.contains(".calltargets")
            || stmt.starts_with(".pragma")
            || stmt.starts_with(".loc")
            || stmt.starts_with(".file")
            || stmt.starts_with(".maxnreg")
        {
            continue;
        }
        let at = f.insts.len();
        match decode(stmt, &mut f.regs, &mut |label: &str| {
            pending.push((at, label.to_string()))
        }) {
            Ok(inst) => f.insts.push(inst),
            Err(PtxError::Unsupported { opcode }) => {
                f.unsupported.get_or_insert(opcode);
                // A trap keeps the instruction indices (branch targets) right; it never runs,
                // because launching a function with an unsupported instruction fails first.
                f.insts.push(Inst::trap(stmt));
            }
            Err(e) => return Err(e),
        }
    }
    for (at, label) in pending {
        let target = *labels
            .get(&label)
            .ok_or_else(|| PtxError::Syntax(format!("unknown label {label}")))?;
        f.insts[at].resolve_label(target);
    }
    Ok(f)
}

/// `.reg .b32 %r<10>` declares %r0..%r9; `.reg .pred p, q` declares each name.
/// Registers a scope declared, with what each name meant outside it.
type Shadowed = Vec<(String, Option<u32>)>;

/// Declares registers. At function level a name is declared once; inside a nested scope
/// (`scope`), each declaration is a new register and the outer meaning is kept for the
/// closing brace.
fn declare_regs(
    decl: &str,
    regs: &mut HashMap<String, u32>,
    nregs: &mut usize,
    mut scope: Option<&mut Shadowed>,
) -> Result<(), PtxError> {
    let mut declare = |name: String| {
        let next = *nregs as u32;
        match scope.as_deref_mut() {
            Some(shadowed) => {
                if !shadowed.iter().any(|(n, _)| *n == name) {
                    shadowed.push((name.clone(), regs.get(&name).copied()));
                }
                regs.insert(name, next);
                *nregs += 1;
            }
            None => {
                if let std::collections::hash_map::Entry::Vacant(e) = regs.entry(name) {
                    e.insert(next);
                    *nregs += 1;
                }
            }
        }
    };
    let decl = decl.trim();
    let rest = decl.split_once(char::is_whitespace).map_or("", |(_, r)| r);
    for item in rest.split(',') {
        let item = item.trim();
        if let Some((base, n)) = item.split_once('<') {
            let n: u32 = n
                .trim_end_matches('>')
                .parse()
                .map_err(|_| PtxError::Syntax(format!("bad register range {item}")))?;
            for i in 0..n {
                declare(format!("{base}{i}"));
            }
        } else if !item.is_empty() {
            declare(item.to_string());
        }
    }
    Ok(())
}
