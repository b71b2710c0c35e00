//! Just enough of PTX for the simulated driver: the ISA version and target, each `.entry`'s
//! name, parameter layout, `.maxntid`/`.reqntid` and static `.shared` size, and the module's
//! `.global`/`.const` variables with their initializers. Function bodies are skipped.

/// Why a module image was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PtxError {
    /// Not PTX text at all (`CUDA_ERROR_INVALID_IMAGE`).
    NotPtx,
    /// PTX the parser cannot read (`CUDA_ERROR_INVALID_PTX`).
    Invalid(String),
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Param {
    pub offset: usize,
    pub size: usize,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub name: String,
    pub params: Vec<Param>,
    /// The product of `.maxntid` or `.reqntid`, if given.
    pub max_threads: Option<u32>,
    /// Bytes of `.shared` variables declared in the body.
    pub static_shared: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Var {
    pub name: String,
    pub size: u64,
    pub align: u64,
    /// The initializer's bytes (shorter than `size`: the rest is zero).
    pub init: Vec<u8>,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Ptx {
    pub version: (u32, u32),
    /// `sm_90` -> 90.
    pub target: Option<u32>,
    pub entries: Vec<Entry>,
    pub vars: Vec<Var>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok<'a> {
    /// `.entry`, `.u32`, ...
    Dir(&'a str),
    Ident(&'a str),
    Num(&'a str),
    Str,
    Punct(char),
}

fn ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$'
}

fn tokenize(src: &str) -> Result<Vec<Tok<'_>>, PtxError> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let take = |i: &mut usize, f: &dyn Fn(u8) -> bool| {
        let s = *i;
        while *i < b.len() && f(b[*i]) {
            *i += 1;
        }
        s
    };
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let end = src[i + 2..]
                .find("*/")
                .ok_or_else(|| PtxError::Invalid("unterminated comment".into()))?;
            i += end + 4;
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += 1 + usize::from(b[i] == b'\\');
            }
            i += 1;
            out.push(Tok::Str);
        } else if c == b'.'
            && i + 1 < b.len()
            && (b[i + 1].is_ascii_alphabetic() || b[i + 1] == b'_')
        {
            i += 1;
            let s = take(&mut i, &ident_char);
            out.push(Tok::Dir(&src[s - 1..i]));
        } else if c.is_ascii_alphabetic() || c == b'_' || c == b'$' || c == b'%' {
            i += 1;
            let s = take(&mut i, &ident_char);
            out.push(Tok::Ident(&src[s - 1..i]));
        } else if c.is_ascii_digit() {
            let s = take(&mut i, &|c| {
                c.is_ascii_alphanumeric() || c == b'.' || c == b'_'
            });
            out.push(Tok::Num(&src[s..i]));
        } else {
            // One character: punctuation (or any other byte, as one char).
            let ch = src[i..].chars().next().unwrap_or('?');
            i += ch.len_utf8();
            out.push(Tok::Punct(ch));
        }
    }
    Ok(out)
}

/// Size in bytes of a PTX fundamental type directive.
fn type_size(t: &str) -> Option<u64> {
    Some(match t {
        ".b8" | ".u8" | ".s8" | ".pred" => 1,
        ".b16" | ".u16" | ".s16" | ".f16" | ".bf16" => 2,
        ".b32" | ".u32" | ".s32" | ".f32" | ".f16x2" | ".bf16x2" => 4,
        ".b64" | ".u64" | ".s64" | ".f64" | ".texref" | ".samplerref" | ".surfref" => 8,
        ".b128" => 16,
        _ => return None,
    })
}

fn is_float(t: &str) -> bool {
    matches!(t, ".f32" | ".f64")
}

/// A PTX integer literal: decimal, `0x` hex, `0b` binary, leading-zero octal, `U` suffix.
fn parse_int(s: &str) -> Option<i128> {
    let s = s.strip_suffix('U').unwrap_or(s);
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        i128::from_str_radix(h, 16).ok()
    } else if let Some(bin) = s.strip_prefix("0b").or_else(|| s.strip_prefix("0B")) {
        i128::from_str_radix(bin, 2).ok()
    } else if s.len() > 1 && s.starts_with('0') && s.bytes().all(|c| c.is_ascii_digit()) {
        i128::from_str_radix(&s[1..], 8).ok()
    } else {
        s.parse().ok()
    }
}

/// The bytes of literal `lit` (negated if `neg`) as a value of type `ty` of `size` bytes.
fn literal_bytes(lit: &str, neg: bool, ty: &str, size: usize) -> Result<Vec<u8>, PtxError> {
    let bad = || PtxError::Invalid(format!("bad literal {lit}"));
    let bits: u128 = if let Some(h) = lit.strip_prefix("0f").or_else(|| lit.strip_prefix("0F")) {
        let v = u32::from_str_radix(h, 16).map_err(|_| bad())?;
        (if neg { v ^ 0x8000_0000 } else { v }) as u128
    } else if let Some(h) = lit.strip_prefix("0d").or_else(|| lit.strip_prefix("0D")) {
        let v = u64::from_str_radix(h, 16).map_err(|_| bad())?;
        (if neg { v ^ (1 << 63) } else { v }) as u128
    } else if is_float(ty) && !lit.starts_with("0x") {
        let v: f64 = lit.parse().map_err(|_| bad())?;
        let v = if neg { -v } else { v };
        match size {
            4 => (v as f32).to_bits() as u128,
            _ => v.to_bits() as u128,
        }
    } else {
        let v = parse_int(lit).ok_or_else(bad)?;
        (if neg { -v } else { v }) as u128
    };
    Ok(bits.to_le_bytes()[..size.min(16)].to_vec())
}

struct Parser<'a> {
    t: Vec<Tok<'a>>,
    i: usize,
}

/// Directives that start a top-level statement; skipping an unknown one stops at them.
const TOP_LEVEL: &[&str] = &[
    ".version",
    ".target",
    ".address_size",
    ".entry",
    ".func",
    ".global",
    ".const",
    ".visible",
    ".weak",
    ".extern",
    ".common",
    ".file",
    ".section",
];

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<Tok<'a>> {
        self.t.get(self.i).copied()
    }

    fn next(&mut self) -> Option<Tok<'a>> {
        let t = self.peek();
        self.i += 1;
        t
    }

    fn eat(&mut self, p: char) -> bool {
        if self.peek() == Some(Tok::Punct(p)) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, p: char) -> Result<(), PtxError> {
        if self.eat(p) {
            Ok(())
        } else {
            Err(PtxError::Invalid(format!(
                "expected '{p}' at token {}",
                self.i
            )))
        }
    }

    fn num(&mut self) -> Result<u64, PtxError> {
        match self.next() {
            Some(Tok::Num(n)) => parse_int(n)
                .and_then(|v| u64::try_from(v).ok())
                .ok_or_else(|| PtxError::Invalid(format!("bad number {n}"))),
            t => Err(PtxError::Invalid(format!("expected a number, found {t:?}"))),
        }
    }

    /// Skips a balanced `{ ... }` starting at the current `{`.
    fn skip_block(&mut self) -> Result<(), PtxError> {
        let mut depth = 0usize;
        while let Some(t) = self.next() {
            match t {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(());
                    }
                }
                _ => {}
            }
        }
        Err(PtxError::Invalid("unbalanced braces".into()))
    }

    /// Skips an unknown statement: to its `;`, over a block, or up to the next top-level
    /// directive.
    fn skip_statement(&mut self) -> Result<(), PtxError> {
        while let Some(t) = self.peek() {
            match t {
                Tok::Punct(';') => {
                    self.i += 1;
                    return Ok(());
                }
                Tok::Punct('{') => return self.skip_block(),
                Tok::Dir(d) if TOP_LEVEL.contains(&d) => return Ok(()),
                _ => self.i += 1,
            }
        }
        Ok(())
    }

    /// One variable declaration after its state space (`.global`, `.const`, `.shared`), to
    /// its `;`: `[.align N] [.vN] .type name[dims] [= init] {, name[dims] [= init]}`.
    fn var_decl(&mut self) -> Result<Vec<Var>, PtxError> {
        let mut align = None;
        let mut vector = 1u64;
        let mut ty = None;
        loop {
            match self.peek() {
                Some(Tok::Dir(".align")) => {
                    self.i += 1;
                    align = Some(self.num()?);
                }
                Some(Tok::Dir(d @ (".v2" | ".v4" | ".v8"))) => {
                    self.i += 1;
                    vector = d[2..].parse().unwrap_or(1);
                }
                Some(Tok::Dir(d)) if type_size(d).is_some() => {
                    self.i += 1;
                    ty = Some(d);
                }
                Some(Tok::Dir(_)) => self.i += 1,
                _ => break,
            }
        }
        let ty = ty.ok_or_else(|| PtxError::Invalid("variable without a type".into()))?;
        let elem = type_size(ty).unwrap_or(1) * vector;
        let mut vars = Vec::new();
        loop {
            let name = match self.next() {
                Some(Tok::Ident(n)) => n.to_string(),
                t => {
                    return Err(PtxError::Invalid(format!(
                        "expected a variable name, found {t:?}"
                    )))
                }
            };
            let mut count = 1u64;
            while self.eat('[') {
                if self.eat(']') {
                    count = 0;
                    continue;
                }
                count = count.saturating_mul(self.num()?);
                self.expect(']')?;
            }
            let size = elem.saturating_mul(count);
            let mut init = Vec::new();
            if self.eat('=') {
                init = self.initializer(ty, type_size(ty).unwrap_or(1) as usize)?;
                init.truncate(size as usize);
            }
            vars.push(Var {
                name,
                size,
                align: align.unwrap_or(elem).max(1),
                init,
            });
            match self.next() {
                Some(Tok::Punct(',')) => continue,
                Some(Tok::Punct(';')) => return Ok(vars),
                t => {
                    return Err(PtxError::Invalid(format!(
                        "expected ',' or ';', found {t:?}"
                    )))
                }
            }
        }
    }

    /// An initializer up to (not including) the declaration's `,` or `;`: its literals in
    /// order as values of `ty`; a symbol's address is written as 0.
    fn initializer(&mut self, ty: &str, size: usize) -> Result<Vec<u8>, PtxError> {
        let mut out = Vec::new();
        let mut depth = 0usize;
        let mut neg = false;
        while let Some(t) = self.peek() {
            match t {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => depth = depth.saturating_sub(1),
                Tok::Punct(',' | ';') if depth == 0 => break,
                Tok::Punct('-') => neg = true,
                Tok::Num(n) => {
                    out.extend(literal_bytes(n, neg, ty, size)?);
                    neg = false;
                }
                Tok::Ident(_) => {
                    out.extend(std::iter::repeat_n(0, size));
                    if self.t.get(self.i + 1) == Some(&Tok::Punct('(')) {
                        // generic(sym): one address.
                        self.i += 1;
                        while self.peek().is_some_and(|t| t != Tok::Punct(')')) {
                            self.i += 1;
                        }
                    }
                }
                _ => {}
            }
            self.i += 1;
        }
        Ok(out)
    }

    /// One kernel parameter: `.param [.align N] .type [.ptr ...] name[[N]]`.
    fn param(&mut self) -> Result<(u64, u64), PtxError> {
        if self.next() != Some(Tok::Dir(".param")) {
            return Err(PtxError::Invalid("expected .param".into()));
        }
        let (mut align, mut elem, mut ptr, mut count) = (None, None, false, 1u64);
        loop {
            match self.peek() {
                Some(Tok::Dir(".align")) => {
                    self.i += 1;
                    let a = self.num()?;
                    // After .ptr, .align is the pointee's.
                    if !ptr {
                        align = Some(a);
                    }
                }
                Some(Tok::Dir(".ptr")) => {
                    self.i += 1;
                    ptr = true;
                }
                Some(Tok::Dir(d)) => {
                    self.i += 1;
                    if let Some(s) = type_size(d) {
                        elem = Some(s);
                    }
                }
                Some(Tok::Ident(_)) => {
                    self.i += 1;
                    while self.eat('[') {
                        count = count.saturating_mul(self.num()?);
                        self.expect(']')?;
                    }
                }
                _ => break,
            }
        }
        let elem = elem.ok_or_else(|| PtxError::Invalid("parameter without a type".into()))?;
        Ok((elem.saturating_mul(count), align.unwrap_or(elem).max(1)))
    }

    /// `.entry name (params) directives { body }`, after `.entry`.
    fn entry(&mut self) -> Result<Option<Entry>, PtxError> {
        let name = match self.next() {
            Some(Tok::Ident(n)) => n.to_string(),
            t => {
                return Err(PtxError::Invalid(format!(
                    "expected a kernel name, found {t:?}"
                )))
            }
        };
        let mut params = Vec::new();
        let mut offset = 0u64;
        if self.eat('(') && !self.eat(')') {
            loop {
                let (size, align) = self.param()?;
                offset = offset.next_multiple_of(align);
                params.push(Param {
                    offset: offset as usize,
                    size: size as usize,
                });
                offset += size;
                if self.eat(')') {
                    break;
                }
                self.expect(',')?;
            }
        }
        let mut max_threads = None;
        loop {
            match self.peek() {
                Some(Tok::Dir(d @ (".maxntid" | ".reqntid"))) => {
                    self.i += 1;
                    let mut n = self.num()?;
                    while self.eat(',') {
                        n = n.saturating_mul(self.num()?);
                    }
                    if d == ".reqntid" || max_threads.is_none() {
                        max_threads = Some(n.min(u32::MAX as u64) as u32);
                    }
                }
                Some(Tok::Punct('{')) => break,
                // A prototype: no body.
                Some(Tok::Punct(';')) => {
                    self.i += 1;
                    return Ok(None);
                }
                Some(_) => self.i += 1,
                None => return Err(PtxError::Invalid(format!("kernel {name} has no body"))),
            }
        }
        let static_shared = self.body_shared()?;
        Ok(Some(Entry {
            name,
            params,
            max_threads,
            static_shared,
        }))
    }

    /// Skips a body, adding up the `.shared` variables declared in it.
    fn body_shared(&mut self) -> Result<u64, PtxError> {
        let mut depth = 0usize;
        let mut shared = 0u64;
        while let Some(t) = self.peek() {
            match t {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => {
                    depth -= 1;
                    if depth == 0 {
                        self.i += 1;
                        return Ok(shared);
                    }
                }
                Tok::Dir(".shared") if self.i > 0 && self.t[self.i - 1] != Tok::Dir(".extern") => {
                    // A declaration starts the statement: `.shared .align 4 .b8 x[16];`.
                    let prev = self.t[self.i - 1];
                    if matches!(prev, Tok::Punct(';' | '{' | '}')) {
                        self.i += 1;
                        for v in self.var_decl()? {
                            shared = shared.next_multiple_of(v.align) + v.size;
                        }
                        continue;
                    }
                }
                _ => {}
            }
            self.i += 1;
        }
        Err(PtxError::Invalid("unbalanced braces".into()))
    }
}

/// Parses a PTX module's text.
pub(crate) fn parse(src: &str) -> Result<Ptx, PtxError> {
    let t = tokenize(src)?;
    if !t.contains(&Tok::Dir(".version")) {
        return Err(PtxError::NotPtx);
    }
    let mut p = Parser { t, i: 0 };
    let mut out = Ptx::default();
    let mut external = false;
    while let Some(tok) = p.peek() {
        match tok {
            Tok::Dir(".version") => {
                p.i += 1;
                let v = match p.next() {
                    Some(Tok::Num(v)) => v,
                    t => return Err(PtxError::Invalid(format!("bad .version {t:?}"))),
                };
                let (maj, min) = v.split_once('.').unwrap_or((v, "0"));
                out.version = (
                    maj.parse()
                        .map_err(|_| PtxError::Invalid(format!("bad .version {v}")))?,
                    min.parse()
                        .map_err(|_| PtxError::Invalid(format!("bad .version {v}")))?,
                );
            }
            Tok::Dir(".target") => {
                p.i += 1;
                while let Some(Tok::Ident(t)) = p.peek() {
                    p.i += 1;
                    if let Some(arch) = t.strip_prefix("sm_") {
                        let digits: String =
                            arch.chars().take_while(char::is_ascii_digit).collect();
                        out.target = digits.parse().ok();
                    }
                    if !p.eat(',') {
                        break;
                    }
                }
            }
            Tok::Dir(".visible" | ".weak" | ".common") => p.i += 1,
            Tok::Dir(".extern") => {
                p.i += 1;
                external = true;
                continue;
            }
            Tok::Dir(".entry") => {
                p.i += 1;
                if let Some(e) = p.entry()? {
                    out.entries.push(e);
                }
            }
            Tok::Dir(".global" | ".const") => {
                p.i += 1;
                let vars = p.var_decl()?;
                if !external {
                    out.vars.extend(vars);
                }
            }
            _ => {
                p.i += 1;
                p.skip_statement()?;
            }
        }
        external = false;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = r#"
//
// Generated by NVIDIA NVVM Compiler
.version 8.4
.target sm_90
.address_size 64
.file 1 "k.cu"

.extern .global .u32 elsewhere;
.global .align 4 .u32 counter = 7;
.visible .global .align 8 .b8 table[16] = {1, 2, 3};
.const .align 4 .f32 coeffs[2] = {0f3F800000, 2.0};
.global .u64 addr = generic(counter);

.func helper(.param .b32 x) { ret; }

.visible .entry sim_add_u32(
    .param .u64 .ptr .global .align 16 sim_add_u32_param_0,
    .param .u32 sim_add_u32_param_1,
    .param .u32 sim_add_u32_param_2
)
.maxntid 256, 1, 1
{
    .reg .b32 %r<4>;
    .shared .align 4 .b8 tile[1024];
    .extern .shared .align 16 .b8 dyn[];
    /* { unbalanced in a comment */
    ret;
}

.entry spin_us20(.param .u8 a, .param .align 8 .b8 s[12], .param .f64 d, .param .u16 h)
{
    ret;
}

.entry noparams
{
}
"#;

    #[test]
    fn entries_params_and_variables() {
        let p = parse(SRC).unwrap();
        assert_eq!(p.version, (8, 4));
        assert_eq!(p.target, Some(90));
        assert_eq!(p.entries.len(), 3);
        let add = &p.entries[0];
        assert_eq!(add.name, "sim_add_u32");
        let layout: Vec<_> = add.params.iter().map(|p| (p.offset, p.size)).collect();
        assert_eq!(layout, [(0, 8), (8, 4), (12, 4)]);
        assert_eq!(add.max_threads, Some(256));
        assert_eq!(add.static_shared, 1024);
        let spin = &p.entries[1];
        let layout: Vec<_> = spin.params.iter().map(|p| (p.offset, p.size)).collect();
        assert_eq!(layout, [(0, 1), (8, 12), (24, 8), (32, 2)]);
        assert!(p.entries[2].params.is_empty());
        let vars: Vec<_> = p
            .vars
            .iter()
            .map(|v| (v.name.as_str(), v.size, v.align))
            .collect();
        assert_eq!(
            vars,
            [
                ("counter", 4, 4),
                ("table", 16, 8),
                ("coeffs", 8, 4),
                ("addr", 8, 8)
            ]
        );
        assert_eq!(p.vars[0].init, [7, 0, 0, 0]);
        assert_eq!(p.vars[1].init, [1, 2, 3]);
        assert_eq!(p.vars[2].init, [0, 0, 0x80, 0x3f, 0, 0, 0, 0x40]);
    }

    #[test]
    fn not_ptx_and_bad_ptx() {
        assert_eq!(parse("\x7fELF"), Err(PtxError::NotPtx));
        assert_eq!(parse("hello"), Err(PtxError::NotPtx));
        assert!(matches!(
            parse(".version 8.0\n.entry k(.param .u32 a, { }"),
            Err(PtxError::Invalid(_))
        ));
        assert!(matches!(
            parse(".version 8.0\n.entry k( .reg .u32 a) {}"),
            Err(PtxError::Invalid(_))
        ));
    }
}
