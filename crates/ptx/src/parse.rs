//! From PTX text to functions made of decoded instructions.
//!
//! A statement parser over the tokens of `lex.rs`: every directive of the PTX ISA (9.x) is
//! either understood, ignored on purpose where it carries no meaning for execution (debug
//! information: `.file`, `.loc`, `.section .debug_*`, `@@DWARF`; optimization hints:
//! `.pragma`, `.maxnreg`, `.minnctapersm`, ...), or an error that names its line and text.
//! No text is skipped: `.version`, `.target`, `.address_size`, `.file` and `.loc` end at the end
//! of their line (they take no `;`), everything else at its `;` or its closing brace.
//!
//! The crates that parse PTX either lack the forms nvcc/CuPy emit (`.param .align N .b8
//! name[M]`) or are unmaintained; instructions themselves are decoded by `decode/` from their
//! source text.

use std::collections::HashMap;

use crate::decode::decode;
use crate::inst::Inst;
use crate::lex::{lex, Kind, Lexed, Token};
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
    /// Bytes of one scalar element (a `.v4 .f32` variable's elements are 4 bytes).
    pub elem: u64,
    pub init: Option<Vec<u8>>,
    /// `.attribute(.managed)`: a managed variable (`__managed__`), which the host reaches
    /// through unified memory.
    pub managed: bool,
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
    /// Each register's declared size in bytes, by index (`.pred`: 1): a 32-bit register as a
    /// memory operand's base makes a 32-bit address computation (`code::Ins::addr32`).
    pub reg_bytes: Vec<u8>,
    pub insts: Vec<Inst>,
    /// Variables declared in the body (`.shared`, `.local`, `.param` for calls).
    pub locals: Vec<Var>,
    /// `.maxntid` (else `.reqntid`): the most threads a block of this kernel may have.
    pub max_threads: Option<u32>,
    /// `.reqntid`: the block shape a launch must have.
    pub req_threads: Option<[u32; 3]>,
    /// `name: .branchtargets L1, L2, ...;` tables of `brx.idx`: each label's instruction.
    pub branch_targets: Vec<(String, Vec<usize>)>,
    /// The first instruction the VM does not implement, if any: the function still loads (a
    /// module holds many kernels), and launching it fails naming the instruction.
    pub unsupported: Option<String>,
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

/// A PTX identifier: `[A-Za-z_$%][A-Za-z0-9_$]*`, not a number.
pub fn is_name(t: &str) -> bool {
    let mut c = t.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || "_$%".contains(f))
        && c.all(|x| x.is_ascii_alphanumeric() || "_$".contains(x))
}

/// A parsed module: functions and module-scope variables.
pub struct Parsed {
    pub version: (u32, u32),
    pub target: u32,
    pub functions: Vec<Function>,
    pub globals: Vec<Var>,
}

/// How a module-scope definition or declaration is linked (`link.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Linkage {
    /// No linkage directive: the name belongs to its own unit (`static` in CUDA C++).
    Internal,
    Visible,
    Weak,
    /// `.common`: every unit's declaration is one variable, the largest of them.
    Common,
    /// `.extern`: defined by another unit.
    Extern,
}

/// A name a global's initializer holds (a function's address), resolved once every function
/// of the module is known: (global, byte offset, name, the error if nothing defines it).
pub type InitRef = (usize, usize, String, PtxError);

/// One translation unit as parsed, before its names are resolved: [`finish`] makes it a
/// module, or `link.rs` first joins several.
pub struct Unit {
    pub parsed: Parsed,
    /// The linkage of each function of `parsed.functions`.
    pub fn_linkage: Vec<Linkage>,
    /// The linkage of each variable of `parsed.globals`.
    pub var_linkage: Vec<Linkage>,
    /// Names declared without a definition here: `.extern` functions and variables, and
    /// function prototypes (`true` for a function).
    pub declared: Vec<(String, bool)>,
    pub refs: Vec<InitRef>,
    /// `.alias a, b;`: (a, b, the error if `b` is not defined).
    pub aliases: Vec<(String, String, PtxError)>,
}

/// The largest variable (and alignment) a module may declare: 2^48 bytes, past any device's
/// memory, so that no layout arithmetic overflows.
const MAX_VAR: u64 = 1 << 48;

/// Registers one `%r<N>` declaration may declare (nvcc's `-G` builds declare thousands).
const MAX_REGS: u64 = 1 << 20;

/// What a declaration's qualifiers say: `[.attribute(..)] [.align A] [.v2|.v4|.v8] .type
/// [.ptr [.space] [.align A]]`.
#[derive(Default)]
struct Head {
    align: Option<u64>,
    vec: u64,
    elem: u64,
    float: bool,
    managed: bool,
}

/// One name of a declaration: `name`, `name[N][M]`, `name[]`, `%r<N>`, with its initializer.
struct Item {
    name: String,
    tok: Token,
    /// Product of the array sizes; `None` for an unsized array (`name[]`).
    count: Option<u64>,
    /// `%r<N>`: a range of registers.
    range: Option<u32>,
    init: Option<Vec<Elem>>,
}

/// An element of an initializer: a number's bits, or a name (a function's address).
enum Elem {
    Bits(u64),
    Name(String, Token),
}

struct P<'a> {
    lx: &'a Lexed,
    i: usize,
}

impl<'a> P<'a> {
    fn peek(&self) -> Option<Token> {
        self.lx.tokens.get(self.i).copied()
    }

    fn peek_text(&self) -> &'a str {
        self.peek().map_or("", |t| self.lx.text(&t))
    }

    fn peek_is(&self, c: u8) -> bool {
        self.peek().is_some_and(|t| t.kind == Kind::Punct(c))
    }

    fn text(&self, t: &Token) -> &'a str {
        self.lx.text(t)
    }

    /// An error at token `t`: its line number, what is wrong, the line's text.
    fn err(&self, t: &Token, what: impl std::fmt::Display) -> PtxError {
        PtxError::Syntax(format!(
            "line {}: {what}: `{}`",
            t.line,
            self.lx.line(t.line)
        ))
    }

    /// An error at the end of the text.
    fn eof(&self, what: &str) -> PtxError {
        let line = self.lx.tokens.last().map_or(1, |t| t.line);
        PtxError::Syntax(format!("line {line}: {what} before the end of the text"))
    }

    fn next(&mut self, what: &str) -> Result<Token, PtxError> {
        let t = self.peek().ok_or_else(|| self.eof(what))?;
        self.i += 1;
        Ok(t)
    }

    fn expect(&mut self, c: u8) -> Result<Token, PtxError> {
        let what = format!("expected `{}`", c as char);
        let t = self.next(&what)?;
        if t.kind != Kind::Punct(c) {
            return Err(self.err(&t, format!("{what}, found `{}`", self.text(&t))));
        }
        Ok(t)
    }

    fn word(&mut self, what: &str) -> Result<(Token, &'a str), PtxError> {
        let t = self.next(what)?;
        if t.kind != Kind::Word {
            return Err(self.err(&t, format!("expected {what}, found `{}`", self.text(&t))));
        }
        Ok((t, self.text(&t)))
    }

    fn number(&mut self, what: &str) -> Result<u64, PtxError> {
        let (t, w) = self.word(what)?;
        crate::decode::parse_number(w, false, false)
            .filter(|_| w.bytes().next().is_some_and(|b| b.is_ascii_digit()))
            .ok_or_else(|| self.err(&t, format!("expected {what}, found `{w}`")))
    }

    /// The tokens left on `line` (a directive that ends at the end of its line).
    fn rest_of_line(&mut self, line: u32) -> Vec<Token> {
        let mut out = Vec::new();
        while let Some(t) = self.peek().filter(|t| t.line == line) {
            out.push(t);
            self.i += 1;
        }
        out
    }

    /// `.pragma "a", "b";`: optimization hints (`"nounroll"`), no meaning for execution.
    fn pragma(&mut self) -> Result<(), PtxError> {
        let kw = self.next(".pragma")?;
        loop {
            let t = self.next("`;` after .pragma")?;
            match t.kind {
                Kind::Str => {}
                _ => return Err(self.err(&kw, "a .pragma takes string literals")),
            }
            let sep = self.next("`;` after .pragma")?;
            match sep.kind {
                Kind::Punct(b',') => {}
                Kind::Punct(b';') => return Ok(()),
                _ => return Err(self.err(&sep, "expected `,` or `;` in .pragma")),
            }
        }
    }

    /// `.file N "name"[, timestamp, size]` or `.loc file line column[, ...]`: debug
    /// information, one line each.
    fn line_directive(&mut self) -> Result<(), PtxError> {
        let kw = self.next("directive")?;
        let rest = self.rest_of_line(kw.line);
        let first = rest.first().map(|t| self.text(t));
        if !first.is_some_and(|w| w.bytes().all(|b| b.is_ascii_digit()) && !w.is_empty()) {
            return Err(self.err(&kw, format!("{} without a file number", self.text(&kw))));
        }
        if self.text(&kw) == ".file" && !rest.iter().any(|t| t.kind == Kind::Str) {
            return Err(self.err(&kw, ".file without a file name"));
        }
        if let Some(bad) = rest.iter().find(|t| t.kind == Kind::Punct(b';')) {
            return Err(self.err(
                bad,
                format!("{} ends at the end of its line", self.text(&kw)),
            ));
        }
        Ok(())
    }

    /// `.attribute(.managed)`, `.attribute(.unified(hi, lo))`: whether it says managed.
    fn attribute(&mut self) -> Result<bool, PtxError> {
        self.next(".attribute")?;
        self.expect(b'(')?;
        let mut managed = false;
        loop {
            let (t, w) = self.word("an attribute")?;
            match w {
                ".managed" => managed = true,
                // A unified function or variable is identified by a 128-bit UUID (linking
                // across devices); one module on one device needs nothing of it.
                ".unified" => {
                    if self.peek_is(b'(') {
                        self.i += 1;
                        self.number("a .unified UUID")?;
                        self.expect(b',')?;
                        self.number("a .unified UUID")?;
                        self.expect(b')')?;
                    }
                }
                _ => return Err(self.err(&t, format!("unknown attribute `{w}`"))),
            }
            let sep = self.next("`)` after .attribute")?;
            match sep.kind {
                Kind::Punct(b',') => {}
                Kind::Punct(b')') => return Ok(managed),
                _ => return Err(self.err(&sep, "expected `,` or `)` in .attribute")),
            }
        }
    }

    /// A declaration's qualifiers, after its state space.
    fn head(&mut self) -> Result<Head, PtxError> {
        let mut h = Head {
            vec: 1,
            ..Head::default()
        };
        let mut pointer = false;
        while let Some(t) = self.peek().filter(|t| t.kind == Kind::Word) {
            let w = self.text(&t);
            if !w.starts_with('.') {
                break;
            }
            match w {
                ".attribute" => {
                    h.managed |= self.attribute()?;
                    continue;
                }
                ".align" => {
                    self.i += 1;
                    let a = self.number("an alignment")?;
                    if !a.is_power_of_two() {
                        return Err(self.err(&t, format!("alignment {a} is not a power of two")));
                    }
                    // After `.ptr`, `.align` is the pointee's alignment, not the variable's.
                    if !pointer {
                        h.align = Some(a);
                    }
                    continue;
                }
                ".v2" => h.vec = 2,
                ".v4" => h.vec = 4,
                ".v8" => h.vec = 8,
                ".ptr" => pointer = true,
                ".global" | ".const" | ".shared" | ".local" if pointer => {}
                ".texref" | ".samplerref" | ".surfref" => {
                    return Err(self.err(
                        &t,
                        format!(
                            "{w} variables (texture references) are not supported by the \
                             emulated GPU; use texture objects"
                        ),
                    ))
                }
                _ => match type_size(&w[1..]) {
                    Some(s) if h.elem == 0 => {
                        h.elem = s;
                        h.float = matches!(w, ".f32" | ".f64");
                    }
                    Some(_) => return Err(self.err(&t, format!("a second type `{w}`"))),
                    None => return Err(self.err(&t, format!("unknown qualifier `{w}`"))),
                },
            }
            self.i += 1;
        }
        if h.elem == 0 {
            let t = self
                .peek()
                .ok_or_else(|| self.eof("a declaration's type"))?;
            return Err(self.err(&t, "declaration without a type"));
        }
        Ok(h)
    }

    /// One declared name with its array sizes (or register range) and initializer.
    fn item(&mut self, h: &Head, regs: bool) -> Result<Item, PtxError> {
        let (tok, name) = self.word("a name")?;
        if name.starts_with('.') || !is_name(name) {
            return Err(self.err(&tok, format!("`{name}` is not a name")));
        }
        let mut item = Item {
            name: name.to_string(),
            tok,
            count: Some(1),
            range: None,
            init: None,
        };
        if regs && self.peek_is(b'<') {
            self.i += 1;
            let n = self.number("a register count")?;
            if n > MAX_REGS {
                return Err(self.err(&tok, format!("{n} registers (at most {MAX_REGS})")));
            }
            item.range = Some(n as u32);
            self.expect(b'>')?;
        }
        let (mut product, mut unsized_array) = (1u64, false);
        while self.peek_is(b'[') {
            self.i += 1;
            if self.peek_is(b']') {
                unsized_array = true;
            } else {
                let n = self.number("an array size")?;
                product = product
                    .checked_mul(n)
                    .ok_or_else(|| self.err(&tok, "array too large"))?;
            }
            self.expect(b']')?;
        }
        item.count = (!unsized_array).then_some(product);
        if self.peek_is(b'=') {
            self.i += 1;
            let mut elems = Vec::new();
            self.init(h, &mut elems)?;
            item.init = Some(elems);
        }
        Ok(item)
    }

    /// An initializer: a value, or `{ ... }` of values and nested braces.
    fn init(&mut self, h: &Head, out: &mut Vec<Elem>) -> Result<(), PtxError> {
        if self.peek_is(b'{') {
            self.i += 1;
            loop {
                self.init(h, out)?;
                let sep = self.next("`}` of an initializer")?;
                match sep.kind {
                    Kind::Punct(b',') => {}
                    Kind::Punct(b'}') => return Ok(()),
                    _ => {
                        return Err(self.err(
                            &sep,
                            format!("unexpected `{}` in an initializer", self.text(&sep)),
                        ))
                    }
                }
            }
        }
        let neg = self.peek_is(b'-');
        if neg {
            self.i += 1;
        }
        let (t, w) = self.word("an initializer value")?;
        let text = if neg { format!("-{w}") } else { w.to_string() };
        match crate::decode::parse_number(&text, h.float, h.elem == 4) {
            Some(v) if w.bytes().next().is_some_and(|b| b.is_ascii_digit()) => {
                out.push(Elem::Bits(v))
            }
            _ if !neg && is_name(w) && !self.peek_is(b'(') && !self.peek_is(b'+') => {
                out.push(Elem::Name(w.to_string(), t))
            }
            _ => {
                return Err(self.err(
                    &t,
                    format!(
                        "initializer `{w}` is not supported (numbers and function names are; \
                         variable addresses are not)"
                    ),
                ))
            }
        }
        Ok(())
    }

    /// A declaration after its state space: qualifiers, then names up to the `;`.
    fn declaration(&mut self, space: &str) -> Result<(Head, Vec<Item>), PtxError> {
        let h = self.head()?;
        let mut items = Vec::new();
        loop {
            items.push(self.item(&h, space == "reg")?);
            let sep = self.next("`;` after a declaration")?;
            match sep.kind {
                Kind::Punct(b',') => {}
                Kind::Punct(b';') => return Ok((h, items)),
                _ => {
                    return Err(self.err(
                        &sep,
                        format!("unexpected `{}` in a declaration", self.text(&sep)),
                    ))
                }
            }
        }
    }

    /// `( .param ..., .param ... )` of a function header.
    fn param_list(&mut self) -> Result<Vec<Param>, PtxError> {
        self.expect(b'(')?;
        let mut out: Vec<Param> = Vec::new();
        let mut end = 0u32;
        if self.peek_is(b')') {
            self.i += 1;
            return Ok(out);
        }
        loop {
            let (t, w) = self.word("`.param`")?;
            if w != ".param" {
                return Err(self.err(
                    &t,
                    format!("parameter `{w}`: only .param parameters are supported"),
                ));
            }
            let h = self.head()?;
            let item = self.item(&h, false)?;
            if item.init.is_some() {
                return Err(self.err(&item.tok, "a parameter has no initializer"));
            }
            let size = (h.elem * h.vec).saturating_mul(item.count.unwrap_or(0).max(1));
            let size = u32::try_from(size).map_err(|_| self.err(&t, "parameter too large"))?;
            let align = u32::try_from(h.align.unwrap_or(h.elem * h.vec).max(1))
                .map_err(|_| self.err(&t, "parameter alignment too large"))?;
            let offset = end
                .checked_next_multiple_of(align)
                .filter(|o| o.checked_add(size).is_some())
                .ok_or_else(|| self.err(&t, "parameters too large"))?;
            out.push(Param {
                name: item.name,
                offset,
                size,
                align,
            });
            end = offset + size;
            let sep = self.next("`)` of a parameter list")?;
            match sep.kind {
                Kind::Punct(b',') => {}
                Kind::Punct(b')') => return Ok(out),
                _ => return Err(self.err(&sep, "expected `,` or `)` in a parameter list")),
            }
        }
    }

    /// `N[, N[, N]]` of `.maxntid`, `.reqntid`, `.reqnctapercluster`.
    fn dims(&mut self, what: &str) -> Result<[u32; 3], PtxError> {
        let mut d = [1u32; 3];
        for (k, slot) in d.iter_mut().enumerate() {
            if k > 0 {
                if !self.peek_is(b',') {
                    break;
                }
                self.i += 1;
            }
            let t = self.peek().ok_or_else(|| self.eof(what))?;
            *slot = u32::try_from(self.number(what)?)
                .map_err(|_| self.err(&t, format!("{what} too large")))?;
        }
        Ok(d)
    }

    /// A function after its linkage: header, then `;` (a declaration: its name) or its body.
    fn function(&mut self) -> Result<Result<Function, String>, PtxError> {
        let (kw, w) = self.word(".entry or .func")?;
        let is_entry = w == ".entry";
        while self.peek_text() == ".attribute" {
            if self.attribute()? {
                return Err(self.err(&kw, "a function cannot be .managed"));
            }
        }
        let returns = if !is_entry && self.peek_is(b'(') {
            self.param_list()?
        } else {
            Vec::new()
        };
        let (nt, name) = self.word("a function name")?;
        if !is_name(name) {
            return Err(self.err(&nt, format!("`{name}` is not a function name")));
        }
        let params = if self.peek_is(b'(') {
            self.param_list()?
        } else {
            Vec::new()
        };
        let (mut max_threads, mut req_threads) = (None, None);
        loop {
            let t = self.next("a function body")?;
            match (t.kind, self.text(&t)) {
                (Kind::Punct(b';'), _) => return Ok(Err(name.to_string())),
                (Kind::Punct(b'{'), _) => break,
                (Kind::Word, ".maxntid") => {
                    max_threads = Some(threads(self.dims(".maxntid")?));
                }
                (Kind::Word, ".reqntid") => {
                    let d = self.dims(".reqntid")?;
                    req_threads = Some(d);
                    max_threads.get_or_insert(threads(d));
                }
                // Clusters: the emulated GPU runs each block on its own; a cluster's blocks
                // still all run, so the shape is a scheduling hint here.
                (Kind::Word, ".reqnctapercluster") => {
                    self.dims(".reqnctapercluster")?;
                }
                // Occupancy and register-allocation hints: no meaning for the interpreter.
                (
                    Kind::Word,
                    ".minnctapersm"
                    | ".maxnctapersm"
                    | ".maxnreg"
                    | ".maxclusterrank"
                    | ".abi_preserve"
                    | ".abi_preserve_control",
                ) => {
                    self.number("a count")?;
                }
                (Kind::Word, ".noreturn" | ".explicitcluster" | ".blocksareclusters") => {}
                (Kind::Word, ".pragma") => {
                    self.i -= 1;
                    self.pragma()?;
                }
                (_, other) => {
                    return Err(self.err(
                        &t,
                        format!("unexpected `{other}` in the header of function {name}"),
                    ))
                }
            }
        }
        let param_bytes = params.last().map_or(0, |p| p.offset + p.size);
        let mut f = Function {
            name: name.to_string(),
            is_entry,
            params,
            returns,
            param_bytes,
            regs: HashMap::new(),
            nregs: 0,
            reg_bytes: Vec::new(),
            insts: Vec::new(),
            locals: Vec::new(),
            max_threads,
            req_threads,
            branch_targets: Vec::new(),
            unsupported: None,
        };
        self.body(&mut f)?;
        Ok(Ok(f))
    }

    /// A function's statements, after its `{`, through the matching `}`.
    fn body(&mut self, f: &mut Function) -> Result<(), PtxError> {
        let mut labels: HashMap<String, usize> = HashMap::new();
        let mut pending: Vec<(usize, String, Token)> = Vec::new();
        let mut tables: Vec<(String, Vec<(String, Token)>)> = Vec::new();
        let mut scopes: Vec<Shadowed> = Vec::new();
        loop {
            let t = self
                .peek()
                .ok_or_else(|| self.eof(&format!("`}}` closing function {}", f.name)))?;
            let w = self.text(&t);
            match t.kind {
                Kind::Punct(b'{') => {
                    self.i += 1;
                    scopes.push(Vec::new());
                    continue;
                }
                Kind::Punct(b'}') => {
                    self.i += 1;
                    let Some(scope) = scopes.pop() else { break };
                    for (name, outer) in scope.into_iter().rev() {
                        match outer {
                            Some(r) => f.regs.insert(name, r),
                            None => f.regs.remove(&name),
                        };
                    }
                    continue;
                }
                Kind::Punct(b';') => {
                    self.i += 1;
                    continue;
                }
                Kind::Word | Kind::Punct(b'@') => {}
                _ => return Err(self.err(&t, format!("unexpected `{w}` in function {}", f.name))),
            }
            // A label: `name:`, before a statement or a table.
            if t.kind == Kind::Word
                && self
                    .lx
                    .tokens
                    .get(self.i + 1)
                    .is_some_and(|c| c.kind == Kind::Punct(b':'))
            {
                if !is_name(w) {
                    return Err(self.err(&t, format!("`{w}` is not a label")));
                }
                self.i += 2;
                if self.peek_text() == ".branchtargets" {
                    self.i += 1;
                    let mut list = Vec::new();
                    loop {
                        let (lt, l) = self.word("a label")?;
                        list.push((l.to_string(), lt));
                        if self.expect_one_of(b',', b';')? == b';' {
                            break;
                        }
                    }
                    tables.push((w.to_string(), list));
                } else if matches!(self.peek_text(), ".callprototype" | ".calltargets") {
                    // The prototype or target list of indirect calls: the call sites' own
                    // argument lists say what passes, and each callee is checked against them
                    // when called.
                    self.skip_statement()?;
                } else if labels.insert(w.to_string(), f.insts.len()).is_some() {
                    return Err(self.err(&t, format!("label {w} defined twice")));
                }
                continue;
            }
            match w {
                ".reg" => {
                    self.i += 1;
                    let (h, items) = self.declaration("reg")?;
                    if h.align.is_some() || h.managed {
                        return Err(self.err(&t, "a register takes no alignment or attribute"));
                    }
                    if h.vec != 1 {
                        return Err(self.err(&t, "vector registers are not supported"));
                    }
                    let before = f.nregs;
                    declare_regs(items, &mut f.regs, &mut f.nregs, scopes.last_mut());
                    let bytes = u8::try_from(h.elem.clamp(1, 16)).unwrap_or(16);
                    f.reg_bytes.resize(before, 8);
                    f.reg_bytes.resize(f.nregs, bytes);
                }
                ".local" | ".shared" | ".param" | ".const" | ".global" => {
                    self.i += 1;
                    let (h, items) = self.declaration(&w[1..])?;
                    for item in items {
                        let (v, refs) = self.var(&w[1..], &h, item)?;
                        if let Some((_, name, tok)) = refs.first() {
                            return Err(self.err(tok, format!("bad initializer {name}")));
                        }
                        f.locals.push(v);
                    }
                }
                ".loc" => self.line_directive()?,
                ".pragma" => self.pragma()?,
                _ if w.starts_with('.') => {
                    return Err(self.err(
                        &t,
                        format!("unknown directive `{w}` in function {}", f.name),
                    ))
                }
                _ => {
                    let (first, last) = self.instruction()?;
                    let stmt = self.lx.span(&first, &last);
                    let at = f.insts.len();
                    let mut labels_used = Vec::new();
                    let decoded = decode(stmt, &mut f.regs, &mut |label: &str| {
                        labels_used.push(label.to_string())
                    });
                    pending.extend(labels_used.into_iter().map(|l| (at, l, first)));
                    match decoded {
                        Ok(inst) => f.insts.push(inst),
                        Err(PtxError::Unsupported { opcode }) => {
                            f.unsupported.get_or_insert(opcode);
                            // A trap keeps the instruction indices (branch targets) right; it
                            // never runs: launching a function with an unsupported instruction
                            // fails first.
                            f.insts.push(Inst::trap(stmt));
                        }
                        Err(PtxError::Syntax(why) | PtxError::Link(why)) => {
                            return Err(self.err(&first, why));
                        }
                    }
                }
            }
        }
        for (at, label, tok) in pending {
            let target = *labels
                .get(&label)
                .ok_or_else(|| self.err(&tok, format!("unknown label {label}")))?;
            f.insts[at].resolve_label(target);
        }
        for (name, list) in tables {
            let mut targets = Vec::new();
            for (l, tok) in list {
                targets.push(
                    *labels
                        .get(&l)
                        .ok_or_else(|| self.err(&tok, format!("unknown label {l}")))?,
                );
            }
            f.branch_targets.push((name, targets));
        }
        Ok(())
    }

    fn expect_one_of(&mut self, a: u8, b: u8) -> Result<u8, PtxError> {
        let what = format!("`{}` or `{}`", a as char, b as char);
        let t = self.next(&what)?;
        match t.kind {
            Kind::Punct(c) if c == a || c == b => Ok(c),
            _ => Err(self.err(&t, format!("expected {what}, found `{}`", self.text(&t)))),
        }
    }

    /// Tokens through the next `;`, balanced in parentheses (`.callprototype`).
    fn skip_statement(&mut self) -> Result<(), PtxError> {
        loop {
            let t = self.next("`;`")?;
            match t.kind {
                Kind::Punct(b';') => return Ok(()),
                Kind::Punct(b'{' | b'}') => {
                    return Err(self.err(&t, "missing `;` before this brace"));
                }
                _ => {}
            }
        }
    }

    /// An instruction: its first and last token (the `;` is consumed, not included). Vector
    /// operands (`{%r1, %r2}`) are inside it; a `}` that closes more than it opened means the
    /// `;` is missing.
    fn instruction(&mut self) -> Result<(Token, Token), PtxError> {
        let first = self.next("an instruction")?;
        let mut last = first;
        let mut depth = 0i32;
        loop {
            let t = self.next("`;` ending an instruction")?;
            match t.kind {
                Kind::Punct(b';') if depth == 0 => return Ok((first, last)),
                Kind::Punct(b'{') => depth += 1,
                Kind::Punct(b'}') => {
                    depth -= 1;
                    if depth < 0 {
                        return Err(self.err(&first, "instruction without `;`"));
                    }
                }
                Kind::Str | Kind::Dwarf => {
                    return Err(self.err(&t, format!("unexpected `{}`", self.text(&t))))
                }
                _ => {}
            }
            last = t;
        }
    }

    /// A variable from a declared item: its size, alignment and initializer bytes, and the
    /// names in that initializer (their bytes are zero until resolved).
    #[allow(clippy::type_complexity)]
    fn var(
        &self,
        space: &str,
        h: &Head,
        item: Item,
    ) -> Result<(Var, Vec<(usize, String, Token)>), PtxError> {
        let elem = h.elem;
        let mut refs = Vec::new();
        let init = item.init.map(|elems| {
            let mut out = Vec::new();
            for e in elems {
                let v = match e {
                    Elem::Bits(v) => v,
                    Elem::Name(n, t) => {
                        refs.push((out.len(), n, t));
                        0
                    }
                };
                // A `.b128` element: the value zero-extended.
                let mut bytes = [0u8; 16];
                bytes[..8].copy_from_slice(&v.to_le_bytes());
                out.extend_from_slice(&bytes[..elem as usize]);
            }
            out
        });
        let scalars = match item.count {
            Some(n) => n.saturating_mul(h.vec),
            None => init.as_ref().map_or(0, |b| b.len() as u64 / elem),
        };
        let size = scalars.saturating_mul(elem);
        if size > MAX_VAR || h.align.is_some_and(|a| a > MAX_VAR) {
            return Err(self.err(&item.tok, format!("{} is too large", item.name)));
        }
        if init.as_ref().is_some_and(|b| b.len() as u64 > size) {
            return Err(self.err(
                &item.tok,
                format!("initializer of {} larger than the variable", item.name),
            ));
        }
        Ok((
            Var {
                name: item.name,
                space: space.to_string(),
                size,
                align: h.align.unwrap_or(elem * h.vec),
                elem,
                init,
                managed: h.managed,
            },
            refs,
        ))
    }
}

/// Threads of a block shape (saturating: a bound past any block's size means no bound).
fn threads(d: [u32; 3]) -> u32 {
    d.iter()
        .fold(1u64, |a, &x| a.saturating_mul(x as u64))
        .min(u32::MAX as u64) as u32
}

/// Registers a scope declared, with what each name meant outside it.
type Shadowed = Vec<(String, Option<u32>)>;

/// `.reg .b32 %r<10>` declares %r0..%r9; `.reg .pred p, q` declares each name. At function
/// level a name is declared once; inside a nested scope (`scope`), each declaration is a new
/// register and the outer meaning is kept for the closing brace.
fn declare_regs(
    items: Vec<Item>,
    regs: &mut HashMap<String, u32>,
    nregs: &mut usize,
    mut scope: Option<&mut Shadowed>,
) {
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
    for item in items {
        match item.range {
            Some(n) => (0..n).for_each(|i| declare(format!("{}{i}", item.name))),
            None => declare(item.name),
        }
    }
}

/// Parses one module and resolves its names.
pub fn parse(src: &str) -> Result<Parsed, PtxError> {
    finish(parse_unit(src)?)
}

/// Parses one translation unit, leaving the names of its initializers and aliases unresolved.
pub fn parse_unit(src: &str) -> Result<Unit, PtxError> {
    let lx = lex(src)?;
    let mut p = P { lx: &lx, i: 0 };
    let mut u = Unit {
        parsed: Parsed {
            version: (0, 0),
            target: 0,
            functions: Vec::new(),
            globals: Vec::new(),
        },
        fn_linkage: Vec::new(),
        var_linkage: Vec::new(),
        declared: Vec::new(),
        // Names in the globals' initializers: (global, byte offset, name), resolved at the end.
        refs: Vec::new(),
        aliases: Vec::new(),
    };
    // `.target sm_10, map_f64_to_f32` (old PTX for GPUs without doubles): its token, if given.
    let mut map_f64: Option<Token> = None;
    while let Some(t) = p.peek() {
        let w = p.text(&t);
        match t.kind {
            Kind::Punct(b';') => {
                p.i += 1;
                continue;
            }
            // Old nvcc's debug information, one line each.
            Kind::Dwarf => {
                p.i += 1;
                continue;
            }
            Kind::Word => {}
            _ => return Err(p.err(&t, format!("unexpected `{w}` at module scope"))),
        }
        match w {
            ".version" => u.parsed.version = p.version(t)?,
            ".target" => {
                let (sm, map) = p.target(t)?;
                u.parsed.target = sm;
                if map.is_some() {
                    map_f64 = map;
                }
            }
            ".address_size" => p.address_size(t)?,
            ".file" => p.line_directive()?,
            ".section" => p.section()?,
            ".pragma" => p.pragma()?,
            ".alias" => {
                let alias = p.alias(t)?;
                u.aliases.push(alias);
            }
            ".sreg" => {
                return Err(p.err(&t, "special registers (.sreg) are predefined, not declared"))
            }
            ".tex" => {
                return Err(p.err(
                    &t,
                    ".tex variables (texture references) are not supported by the emulated \
                     GPU; use texture objects",
                ))
            }
            ".visible" | ".extern" | ".weak" | ".common" | ".entry" | ".func" | ".global"
            | ".const" | ".shared" | ".local" => p.module_declaration(&mut u)?,
            _ => {
                let what = if w.starts_with('.') {
                    "unknown directive"
                } else {
                    "unexpected text at module scope"
                };
                return Err(p.err(&t, format!("{what} `{w}`")));
            }
        }
    }
    if let Some(tok) = map_f64 {
        p.check_map_f64(tok, &u.parsed)?;
    }
    Ok(u)
}

/// The directives at module scope.
impl P<'_> {
    /// `.version MAJOR.MINOR`.
    fn version(&mut self, t: Token) -> Result<(u32, u32), PtxError> {
        self.i += 1;
        let rest = self.rest_of_line(t.line);
        let v = match rest.as_slice() {
            [v] => self.text(v),
            _ => return Err(self.err(&t, ".version takes one MAJOR.MINOR number")),
        };
        v.split_once('.')
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
            .ok_or_else(|| self.err(&t, format!("bad PTX version `{v}`")))
    }

    /// `.target sm_NN[, option...]`: the architecture, and the token of `map_f64_to_f32` if
    /// it is one of the options.
    fn target(&mut self, t: Token) -> Result<(u32, Option<Token>), PtxError> {
        self.i += 1;
        let rest = self.rest_of_line(t.line);
        let mut items = rest.split(|x| x.kind == Kind::Punct(b','));
        let sm = items.next().and_then(|s| match s {
            [s] => self
                .text(s)
                .strip_prefix("sm_")?
                .trim_end_matches(['a', 'f'])
                .parse::<u32>()
                .ok(),
            _ => None,
        });
        let sm = sm.ok_or_else(|| self.err(&t, "bad .target (expected sm_NN)"))?;
        let mut map_f64 = None;
        for opt in items {
            match opt {
                // Texture modes matter to texture references (not supported), `debug` to
                // debuggers; `map_f64_to_f32` changes only `.f64` arithmetic, which a module
                // with it must not have (checked at the end).
                [o] if matches!(
                    self.text(o),
                    "texmode_unified" | "texmode_independent" | "debug"
                ) => {}
                [o] if self.text(o) == "map_f64_to_f32" => map_f64 = Some(*o),
                _ => {
                    let o = opt.first().copied().unwrap_or(t);
                    return Err(self.err(
                        &o,
                        format!("unsupported .target option `{}`", self.text(&o)),
                    ));
                }
            }
        }
        Ok((sm, map_f64))
    }

    /// `.address_size 64`.
    fn address_size(&mut self, t: Token) -> Result<(), PtxError> {
        self.i += 1;
        let rest = self.rest_of_line(t.line);
        match rest.as_slice() {
            [n] if self.text(n) == "64" => Ok(()),
            _ => Err(self.err(&t, "only .address_size 64 is supported")),
        }
    }

    /// A DWARF section of a `-G` build: debug information, no meaning for execution.
    fn section(&mut self) -> Result<(), PtxError> {
        self.i += 1;
        let (nt, name) = self.word("a section name")?;
        if !name.starts_with(".debug_") {
            return Err(self.err(&nt, format!("unknown section `{name}`")));
        }
        self.expect(b'{')?;
        let mut depth = 1;
        while depth > 0 {
            let x = self.next("`}` closing a .section")?;
            match x.kind {
                Kind::Punct(b'{') => depth += 1,
                Kind::Punct(b'}') => depth -= 1,
                _ => {}
            }
        }
        Ok(())
    }

    /// `.alias a, b;`: the names, and the error to report if `b` is not defined.
    fn alias(&mut self, t: Token) -> Result<(String, String, PtxError), PtxError> {
        self.i += 1;
        let (_, a) = self.word("an alias name")?;
        self.expect(b',')?;
        let (_, b) = self.word("an aliased function")?;
        self.expect(b';')?;
        let e = self.err(&t, format!(".alias of undefined function {b}"));
        Ok((a.to_string(), b.to_string(), e))
    }

    /// A function or a variable at module scope, after its linkage directives (if any).
    fn module_declaration(&mut self, u: &mut Unit) -> Result<(), PtxError> {
        let mut linkage = Linkage::Internal;
        while let ".visible" | ".extern" | ".weak" | ".common" = self.peek_text() {
            linkage = match (linkage, self.peek_text()) {
                (Linkage::Extern, _) | (_, ".extern") => Linkage::Extern,
                (_, ".weak") => Linkage::Weak,
                (_, ".common") => Linkage::Common,
                (l, _) => l.max_visible(),
            };
            self.i += 1;
        }
        let external = linkage == Linkage::Extern;
        let (st, space) = self.word("a declaration")?;
        match space {
            ".entry" | ".func" => {
                self.i -= 1;
                match self.function()? {
                    Ok(_) if external => {
                        return Err(self.err(&st, "an .extern function has no body"))
                    }
                    Ok(f) => {
                        u.parsed.functions.push(f);
                        u.fn_linkage.push(linkage);
                    }
                    Err(name) => u.declared.push((name, true)),
                }
            }
            ".global" | ".const" | ".shared" => {
                let (h, items) = self.declaration(&space[1..])?;
                // An `.extern .global`/`.const` is another module's (resolved by name at
                // launch, or by `link.rs`); an `.extern .shared` array is dynamic shared
                // memory.
                if external && space != ".shared" {
                    u.declared
                        .extend(items.into_iter().map(|i| (i.name, false)));
                    return Ok(());
                }
                for item in items {
                    let (v, r) = self.var(&space[1..], &h, item)?;
                    if space == ".shared" && v.init.is_some() {
                        return Err(self.err(&st, "shared variables take no initializer"));
                    }
                    let g = u.parsed.globals.len();
                    u.refs.extend(r.into_iter().map(|(at, n, tok)| {
                        let e = self.err(&tok, format!("bad initializer {n}"));
                        (g, at, n, e)
                    }));
                    u.parsed.globals.push(v);
                    u.var_linkage.push(linkage);
                }
            }
            ".local" => {
                return Err(self.err(&st, "module-scope .local variables are not supported"))
            }
            _ => return Err(self.err(&st, format!("unexpected `{space}` after linkage"))),
        }
        Ok(())
    }

    /// `.target ... map_f64_to_f32` (at `tok`) makes every `.f64` instruction an `.f32` one:
    /// not emulated, so a module that has any is refused, naming it; one without (NVIDIA's
    /// matrixMulDynlinkJIT's CUDA 4.0 PTX) means what it says.
    fn check_map_f64(&self, tok: Token, parsed: &Parsed) -> Result<(), PtxError> {
        let f64_inst = parsed
            .functions
            .iter()
            .flat_map(|f| &f.insts)
            .find(|i| i.text.contains(".f64"));
        if let Some(i) = f64_inst {
            return Err(self.err(
                &tok,
                format!(
                    "`.target ... map_f64_to_f32` maps `.f64` arithmetic to `.f32`, which the \
                     emulated GPU does not do: `{}`",
                    i.text
                ),
            ));
        }
        Ok(())
    }
}

impl Linkage {
    /// `.visible` over no directive.
    fn max_visible(self) -> Linkage {
        match self {
            Linkage::Internal => Linkage::Visible,
            l => l,
        }
    }
}

/// Resolves a unit's aliases and the function names in its initializers.
pub fn finish(unit: Unit) -> Result<Parsed, PtxError> {
    let mut parsed = unit.parsed;
    // `.alias a, b;`: `a` is `b` (a copy of `b` under `a`'s name, after the definitions, so
    // function numbering in text order is unchanged).
    for (a, b, e) in unit.aliases {
        let f = parsed.functions.iter().find(|f| f.name == b).ok_or(e)?;
        let mut copy = f.clone();
        copy.name = a;
        parsed.functions.push(copy);
    }
    // A function's name in an initializer is its address (`crate::space::FUNCTION_WINDOW`).
    for (g, at, name, e) in unit.refs {
        let i = parsed
            .functions
            .iter()
            .position(|f| f.name == name)
            .ok_or(e)?;
        let v = &mut parsed.globals[g];
        let n = (v.elem as usize).min(8);
        if let Some(bytes) = v.init.as_mut().and_then(|b| b.get_mut(at..at + n)) {
            bytes.copy_from_slice(&crate::space::function_address(i).to_le_bytes()[..n]);
        }
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ptx` without its line information: no `.file`/`.loc` lines, no `.section` blocks.
    fn strip_line_info(ptx: &str) -> String {
        let mut in_section = false;
        ptx.lines()
            .filter(|l| {
                let l = l.trim();
                in_section |= l.starts_with(".section");
                let keep = !in_section && !l.starts_with(".loc") && !l.starts_with(".file");
                if in_section && l.starts_with('}') {
                    in_section = false;
                }
                keep
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn counts(ptx: &str) -> Vec<(String, usize)> {
        let p = parse(ptx).unwrap();
        p.functions
            .iter()
            .map(|f| (f.name.clone(), f.insts.len()))
            .collect()
    }

    /// The bug this parser replaced: a `.loc` line (no `;`) was glued to the next statement,
    /// which was then dropped. nvcc's `-lineinfo` build has the plain build's instructions, and
    /// the `-G` build has as many instructions as it has without its line information.
    #[test]
    fn every_instruction_of_line_info_builds_is_kept() {
        let plain = include_str!("../tests/fixtures/kernels.ptx");
        let lineinfo = include_str!("../tests/fixtures/kernels.lineinfo.ptx");
        let debug = include_str!("../tests/fixtures/kernels.debug.ptx");
        assert!(lineinfo.contains(".loc") && debug.contains(".section"));
        assert_eq!(counts(lineinfo), counts(plain));
        assert_eq!(counts(lineinfo), counts(&strip_line_info(lineinfo)));
        assert_eq!(counts(debug), counts(&strip_line_info(debug)));
        let glued = ".version 9.0\n.target sm_80\n.address_size 64\n.visible .entry k()\n{\n\
            .reg .b32 %r<3>;\n\t.loc\t1 5 3\n\tmov.u32 %r1, 7;\n\t.loc 1 6 3\n\tret;\n}\n";
        let p = parse(glued).unwrap();
        assert_eq!(p.functions[0].insts.len(), 2);
    }
}
