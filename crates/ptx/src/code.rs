//! The program as the interpreter runs it. Every instruction is compiled once, when the module
//! loads, into a compact [`Ins`]: operands resolved to a register index, an immediate, a special
//! register, a frame-relative variable or a module symbol (whose address the launch supplies),
//! branch targets to instruction indices, and calls to the callee's index with the frame
//! offsets of their arguments and return values. Nothing in it is looked up by name at run
//! time.

use std::collections::HashMap;

use crate::inst::{Base, Inst, Mods, Op, Operand, Space, Sreg, Type};
use crate::parse::{Function, Var};

/// A source operand.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Src {
    Reg(u32),
    /// A predicate negated (`!%p`).
    NotReg(u32),
    Imm(u64),
    Sreg(Sreg),
    /// A module symbol (a global or constant variable's address, a shared variable's offset):
    /// an index into [`Program::symbols`], resolved by each launch.
    Sym(u32),
    /// A `.local` variable of the frame: its local-space address is the frame's base plus this.
    Local(u64),
    /// A `.param` variable of the frame (a device function's parameters and return values, the
    /// arguments a function passes to its callees): a generic address in the local window.
    FrameParam(u64),
    /// A kernel parameter: its address in the parameter window.
    KernelParam(u64),
    /// No value (a vector or label where a value belongs): reading it fails the launch.
    Bad,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Dst {
    Reg(u32),
    Sink,
}

/// Sources an instruction holds at most (`bfi`, `lop3`, `shfl` take four).
pub const MAX_SRCS: usize = 5;
/// Destinations an instruction holds at most (`ld.v4`, `mov.b64 {a, b, c, d}`).
pub const MAX_DSTS: usize = 4;

/// One compiled instruction.
#[derive(Debug, Clone)]
pub struct Ins {
    pub op: Op,
    pub ty: Type,
    pub ty2: Type,
    pub space: Space,
    pub m: Mods,
    pub guard: Option<(u32, bool)>,
    pub nd: u8,
    /// The destination was a vector (`{a, b}`, or `d|p`).
    pub dvec: bool,
    pub d: [Dst; MAX_DSTS],
    pub ns: u8,
    /// The first source was a vector (`mov.b64 %rd, {lo, hi}`).
    pub svec: bool,
    pub s: [Src; MAX_SRCS],
    /// The `[base+offset]` operand of memory instructions.
    pub addr: Option<(Src, i64)>,
    /// The address's base is a 32-bit register: the address is computed in 32 bits, wrapping
    /// (`[%r+49280]` with `%r` "negative" is a small shared-memory offset, as CUTLASS's kernels
    /// compute them), then zero-extended.
    pub addr32: bool,
    /// The second address operand (`cp.async`'s source).
    pub addr2: Option<(Src, i64)>,
    /// A branch's target, or a call's index in [`Code::calls`].
    pub target: u32,
    /// The instruction's form specialized at load time, if it has one (`exec/spec/`).
    pub fast: crate::exec::spec::Fast,
}

impl Ins {
    #[inline(always)]
    pub fn src(&self, k: usize) -> Src {
        if k < self.ns as usize {
            self.s[k]
        } else {
            Src::Bad
        }
    }
}

/// The function nvcc calls for a failed device-side `assert()`, declared `.extern`.
pub const ASSERT_FAIL: &str = "__assertfail";
/// [`CallSite::callee`] of a call to [`ASSERT_FAIL`], which has no body in the module.
pub const ASSERT_CALLEE: u32 = u32::MAX;
/// [`CallSite::callee`] of an indirect call: the register [`CallSite::pointer`] holds each
/// lane's callee, a function address ([`crate::space::function_address`]).
pub const INDIRECT_CALLEE: u32 = u32::MAX - 1;
/// The function nvcc calls for device-side `printf`, declared `.extern`.
pub const VPRINTF: &str = "vprintf";
/// [`CallSite::callee`] of a call to [`VPRINTF`] (`printf.rs`).
pub const VPRINTF_CALLEE: u32 = u32::MAX - 2;
/// [`CallSite::callee`] of device `malloc` and `free` (`heap.rs`).
pub const MALLOC_CALLEE: u32 = u32::MAX - 3;
pub const FREE_CALLEE: u32 = u32::MAX - 4;
/// The device runtime's `cudaGraphSetConditional(handle, value)`, declared `.extern`: sets a
/// conditional graph node's value (`graph.rs`).
pub const SET_CONDITIONAL: &str = "cudaGraphSetConditional";
/// [`CallSite::callee`] of a call to [`SET_CONDITIONAL`].
pub const SET_CONDITIONAL_CALLEE: u32 = u32::MAX - 5;

/// A call site: the callee and where its arguments come from and its return values go.
#[derive(Debug, Clone)]
pub struct CallSite {
    pub callee: u32,
    /// An indirect call's function-address register.
    pub pointer: Option<u32>,
    pub args: Vec<Src>,
    pub rets: Vec<Src>,
}

/// A compiled function.
#[derive(Debug)]
pub struct Code {
    pub name: String,
    pub is_entry: bool,
    pub nregs: usize,
    pub insts: Vec<Ins>,
    /// Each instruction's text, for error messages.
    pub texts: Vec<Box<str>>,
    pub calls: Vec<CallSite>,
    /// Where the lanes of a divergent conditional branch meet again (`reconverge.rs`), per
    /// instruction.
    pub joins: Vec<u32>,
    /// The A, B and C register lists of each `mma` (the instruction's `target`).
    pub mma: Vec<[Vec<Src>; 3]>,
    /// The register lists of each `wmma` (the instruction's `target`).
    pub wmma: Vec<crate::wmma::Operands>,
    /// The values of each `sust` (the instruction's `target`).
    pub lists: Vec<Vec<Src>>,
    /// Bytes of local memory a frame of this function takes (parameters, return values,
    /// `.local` and `.param` variables), a multiple of 16.
    pub frame: u64,
    /// Frame offset and size of each parameter and return value (device functions).
    pub params: Vec<(u64, u64)>,
    pub returns: Vec<(u64, u64)>,
    /// Symbols the code names, to be resolved by a launch.
    pub symbols: Vec<u32>,
    /// `.shared` variables declared in the body: (symbol, variable).
    pub shared: Vec<(u32, Var)>,
    /// The first instruction the VM cannot run, if any.
    pub unsupported: Option<String>,
}

/// What a module symbol is.
#[derive(Debug, Clone)]
pub enum SymKind {
    /// A module variable in device memory (the launch's `symbols` gives its address), or a name
    /// nothing declares.
    Global(String),
    /// A module-scope `.shared` variable (index into the module's shared variables).
    ModuleShared(usize),
    /// A `.shared` variable declared in a function's body.
    BodyShared,
}

/// All the functions of a module, compiled.
#[derive(Debug)]
pub struct Program {
    pub funcs: Vec<Code>,
    pub symbols: Vec<SymKind>,
}

fn round_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a.max(1)) * a.max(1)
}

/// Module-wide symbol interning.
struct Symbols<'a> {
    kinds: Vec<SymKind>,
    index: HashMap<(Option<usize>, String), u32>,
    module_shared: &'a [Var],
}

impl Symbols<'_> {
    fn intern(&mut self, scope: Option<usize>, name: &str, kind: SymKind) -> u32 {
        let key = (scope, name.to_string());
        if let Some(&id) = self.index.get(&key) {
            return id;
        }
        let id = self.kinds.len() as u32;
        self.kinds.push(kind);
        self.index.insert(key, id);
        id
    }

    fn module(&mut self, name: &str) -> u32 {
        match self.module_shared.iter().position(|v| v.name == name) {
            Some(i) => self.intern(None, name, SymKind::ModuleShared(i)),
            None => self.intern(None, name, SymKind::Global(name.to_string())),
        }
    }
}

/// Where a function's names live.
struct Scope<'a> {
    /// name -> operand for the function's own variables and parameters.
    names: HashMap<String, Src>,
    /// The module's functions: a function's name is its address.
    functions: &'a HashMap<&'a str, usize>,
}

impl Scope<'_> {
    fn resolve(&self, name: &str, syms: &mut Symbols, used: &mut Vec<u32>) -> Src {
        if let Some(&s) = self.names.get(name) {
            if let Src::Sym(id) = s {
                used.push(id);
            }
            return s;
        }
        if let Some(&i) = self.functions.get(name) {
            return Src::Imm(crate::space::function_address(i));
        }
        let id = syms.module(name);
        used.push(id);
        Src::Sym(id)
    }
}

/// Compiles every function of a module.
pub fn compile(functions: &[Function], module_shared: &[Var]) -> Program {
    let mut syms = Symbols {
        kinds: Vec::new(),
        index: HashMap::new(),
        module_shared,
    };
    let by_name: HashMap<&str, usize> = functions
        .iter()
        .enumerate()
        .map(|(i, f)| (f.name.as_str(), i))
        .collect();
    let mut funcs = Vec::with_capacity(functions.len());
    for (fi, f) in functions.iter().enumerate() {
        funcs.push(compile_function(fi, f, functions, &by_name, &mut syms));
    }
    Program {
        funcs,
        symbols: syms.kinds,
    }
}

fn compile_function(
    fi: usize,
    f: &Function,
    functions: &[Function],
    by_name: &HashMap<&str, usize>,
    syms: &mut Symbols,
) -> Code {
    // The frame: parameters and return values (device functions), then the body's `.local`
    // and `.param` variables. A name declared again (the `.param param0` of each call
    // sequence) shares one slot, large enough for each declaration.
    let mut frame = 0u64;
    let mut names: HashMap<String, Src> = HashMap::new();
    let mut params = Vec::new();
    let mut returns = Vec::new();
    if !f.is_entry {
        for (list, out) in [(&f.params, &mut params), (&f.returns, &mut returns)] {
            for p in list {
                frame = round_up(frame, p.align as u64);
                names.insert(p.name.clone(), Src::FrameParam(frame));
                out.push((frame, p.size as u64));
                frame += p.size as u64;
            }
        }
    }
    let mut body: Vec<(&Var, u64, u64)> = Vec::new(); // (var, size, align) merged by name
    for v in f
        .locals
        .iter()
        .filter(|v| v.space == "local" || v.space == "param")
    {
        match body
            .iter_mut()
            .find(|(b, _, _)| b.name == v.name && b.space == v.space)
        {
            Some(b) => {
                b.1 = b.1.max(v.size);
                b.2 = b.2.max(v.align);
            }
            None => body.push((v, v.size, v.align)),
        }
    }
    for (v, size, align) in body {
        frame = round_up(frame, align);
        let src = if v.space == "local" {
            Src::Local(frame)
        } else {
            Src::FrameParam(frame)
        };
        names.entry(v.name.clone()).or_insert(src);
        frame += size;
    }
    let mut shared = Vec::new();
    for v in f.locals.iter().filter(|v| v.space == "shared") {
        let id = syms.intern(Some(fi), &v.name, SymKind::BodyShared);
        if !shared.iter().any(|(s, _)| *s == id) {
            shared.push((id, v.clone()));
        }
        names.entry(v.name.clone()).or_insert(Src::Sym(id));
    }
    if f.is_entry {
        for p in &f.params {
            names
                .entry(p.name.clone())
                .or_insert(Src::KernelParam(p.offset as u64));
        }
    }
    let scope = Scope {
        names,
        functions: by_name,
    };
    let mut code = Code {
        name: f.name.clone(),
        is_entry: f.is_entry,
        nregs: f.nregs,
        insts: Vec::with_capacity(f.insts.len()),
        texts: Vec::with_capacity(f.insts.len()),
        calls: Vec::new(),
        mma: Vec::new(),
        wmma: Vec::new(),
        lists: Vec::new(),
        joins: Vec::new(),
        frame: round_up(frame, 16),
        params,
        returns,
        symbols: Vec::new(),
        shared,
        unsupported: f.unsupported.clone(),
    };
    for inst in &f.insts {
        let ins = match compile_inst(inst, &scope, syms, &mut code, functions, by_name) {
            Ok(mut ins) => {
                ins.addr32 = matches!(ins.addr, Some((Src::Reg(r), _))
                    if f.reg_bytes.get(r as usize).is_some_and(|&b| b <= 4));
                ins.fast = crate::exec::spec::specialize(&ins);
                ins
            }
            Err(why) => {
                code.unsupported.get_or_insert(why);
                trap_ins()
            }
        };
        code.insts.push(ins);
        code.texts.push(inst.text.as_str().into());
    }
    code.joins = crate::reconverge::joins(&code.insts);
    code.symbols.sort_unstable();
    code.symbols.dedup();
    code
}

fn trap_ins() -> Ins {
    let b32 = crate::alu::B32;
    Ins {
        op: Op::Trap,
        ty: b32,
        ty2: b32,
        space: Space::Generic,
        m: Mods::default(),
        guard: None,
        nd: 0,
        dvec: false,
        d: [Dst::Sink; MAX_DSTS],
        ns: 0,
        svec: false,
        s: [Src::Bad; MAX_SRCS],
        addr: None,
        addr32: false,
        addr2: None,
        target: 0,
        fast: crate::exec::spec::Fast::None,
    }
}

/// Instructions whose first operand is not a destination.
fn has_dst(op: Op) -> bool {
    !matches!(
        op,
        Op::St
            | Op::Red
            | Op::Bra
            | Op::Ret
            | Op::Exit
            | Op::Bar
            | Op::Membar
            | Op::Fence
            | Op::Trap
            | Op::Brkpt
            | Op::Nanosleep
            | Op::Prefetch
            | Op::Call
            | Op::Griddep
            | Op::CpAsync
            | Op::CpAsyncWait
            | Op::Stackrestore
            | Op::Sust
    )
}

fn compile_inst(
    inst: &Inst,
    scope: &Scope,
    syms: &mut Symbols,
    code: &mut Code,
    functions: &[Function],
    by_name: &HashMap<&str, usize>,
) -> Result<Ins, String> {
    let mut ins = trap_ins();
    ins.op = inst.op;
    ins.ty = inst.ty;
    ins.ty2 = inst.ty2;
    ins.space = inst.space;
    ins.m = inst.mods;
    ins.guard = inst.pred;
    if inst.op == Op::Call {
        return compile_call(inst, ins, scope, syms, code, functions, by_name);
    }
    if inst.op == Op::Wmma {
        return compile_wmma(inst, ins, scope, syms, code);
    }
    let mut used = Vec::new();
    let mut args = inst.args.iter();
    match inst.op {
        Op::St | Op::Red | Op::Prefetch => {
            ins.addr = mem_operand(args.next(), scope, syms, &mut used);
        }
        Op::Mbarrier if !inst.mods.mbar.has_dst() => {
            ins.addr = mem_operand(args.next(), scope, syms, &mut used);
        }
        Op::CpAsync => {
            ins.addr = mem_operand(args.next(), scope, syms, &mut used);
            ins.addr2 = mem_operand(args.next(), scope, syms, &mut used);
            if ins.addr2.is_none() {
                return Err(format!("cp.async without a source address: {}", inst.text));
            }
        }
        Op::Bra => {
            ins.target = match inst.args.last() {
                Some(Operand::Label(t)) => u32::try_from(*t).unwrap_or(u32::MAX),
                _ => return Err(format!("branch without a label: {}", inst.text)),
            };
            return Ok(ins);
        }
        _ => {}
    }
    let mbar_dst = inst.op == Op::Mbarrier && inst.mods.mbar.has_dst();
    if (has_dst(inst.op) && inst.op != Op::Mbarrier)
        || mbar_dst
        || (inst.op == Op::Bar && inst.mods.bar_red)
    {
        destinations(inst, &mut ins, args.next())?;
    }
    if inst.op == Op::Mma {
        return compile_mma(inst, ins, args, scope, syms, code, used);
    }
    if inst.op == Op::Sust {
        return compile_sust(inst, ins, args, scope, syms, code, used);
    }
    if matches!(inst.op, Op::Ld | Op::Ldu | Op::Atom | Op::Ldmatrix)
        || (mbar_dst && inst.mods.mbar != crate::inst::MbarOp::PendingCount)
    {
        ins.addr = mem_operand(args.next(), scope, syms, &mut used);
    }
    sources(inst, &mut ins, args, scope, syms, &mut used)?;
    if (matches!(
        inst.op,
        Op::Ld | Op::Ldu | Op::St | Op::Atom | Op::Red | Op::Prefetch | Op::CpAsync
    ) || (inst.op == Op::Mbarrier && inst.mods.mbar != crate::inst::MbarOp::PendingCount))
        && ins.addr.is_none()
    {
        return Err(format!(
            "memory instruction without an address: {}",
            inst.text
        ));
    }
    code.symbols.extend(used);
    Ok(ins)
}

/// The destination operand: a register, a sink, or a vector of them.
fn destinations(inst: &Inst, ins: &mut Ins, o: Option<&Operand>) -> Result<(), String> {
    let dst = |o: &Operand| match o {
        Operand::Reg(r) => Dst::Reg(*r),
        _ => Dst::Sink,
    };
    match o {
        Some(Operand::Vector(v)) => {
            if v.len() > MAX_DSTS {
                return Err(too_many(inst));
            }
            ins.dvec = true;
            for (k, o) in v.iter().enumerate() {
                ins.d[k] = dst(o);
            }
            ins.nd = v.len() as u8;
        }
        Some(o) => {
            ins.d[0] = dst(o);
            ins.nd = 1;
        }
        None => {}
    }
    Ok(())
}

fn too_many(inst: &Inst) -> String {
    format!("too many operands: {}", inst.text)
}

/// `mma`'s `{a}, {b}, {c}` (after the destinations): the source lists live beside the code,
/// in [`Code::mma`] at the instruction's `target`.
fn compile_mma<'a>(
    inst: &Inst,
    mut ins: Ins,
    args: impl Iterator<Item = &'a Operand>,
    scope: &Scope,
    syms: &mut Symbols,
    code: &mut Code,
    mut used: Vec<u32>,
) -> Result<Ins, String> {
    let mut lists: Vec<Vec<Src>> = Vec::new();
    for o in args {
        lists.push(match o {
            Operand::Vector(v) => v
                .iter()
                .map(|x| to_src(x, scope, syms, &mut used))
                .collect(),
            o => vec![to_src(o, scope, syms, &mut used)],
        });
    }
    let Ok([a, b, c]) = <[Vec<Src>; 3]>::try_from(lists) else {
        return Err(format!("mma without three source lists: {}", inst.text));
    };
    ins.target = code.mma.len() as u32;
    code.mma.push([a, b, c]);
    code.symbols.extend(used);
    Ok(ins)
}

/// `sust`'s `[handle, {coords}], {values}`: the values live beside the code, in
/// [`Code::lists`] at the instruction's `target`.
fn compile_sust<'a>(
    inst: &Inst,
    mut ins: Ins,
    mut args: impl Iterator<Item = &'a Operand>,
    scope: &Scope,
    syms: &mut Symbols,
    code: &mut Code,
    mut used: Vec<u32>,
) -> Result<Ins, String> {
    let (Some(Operand::Vector(at)), Some(Operand::Vector(vals)), None) =
        (args.next(), args.next(), args.next())
    else {
        return Err(format!("sust without an address and values: {}", inst.text));
    };
    if at.len() > MAX_SRCS {
        return Err(too_many(inst));
    }
    for (k, x) in at.iter().enumerate() {
        ins.s[k] = to_src(x, scope, syms, &mut used);
    }
    ins.ns = at.len() as u8;
    ins.target = code.lists.len() as u32;
    code.lists.push(
        vals.iter()
            .map(|x| to_src(x, scope, syms, &mut used))
            .collect(),
    );
    code.symbols.extend(used);
    Ok(ins)
}

/// The source operands after the destinations and the address: a vector source (`mov`'s
/// packing, the values of `st`, `atom`, `red`, a texture's coordinates) takes one slot per
/// element; `.L2::cache_hint`'s policy operand is dropped.
fn sources<'a>(
    inst: &Inst,
    ins: &mut Ins,
    args: impl Iterator<Item = &'a Operand>,
    scope: &Scope,
    syms: &mut Symbols,
    used: &mut Vec<u32>,
) -> Result<(), String> {
    let mut n = 0;
    let mut rest: Vec<&Operand> = args.collect();
    if inst.mods.cache_hint && matches!(inst.op, Op::St | Op::Red | Op::Atom | Op::CpAsync) {
        // The cache policy operand of `.L2::cache_hint`: a hint the VM has no use for.
        if rest.pop().is_none() {
            return Err(format!("cache hint without a policy: {}", inst.text));
        }
    }
    for (k, o) in rest.into_iter().enumerate() {
        match o {
            Operand::Vector(v)
                if k == 0 && inst.op == Op::Mov
                    || matches!(
                        inst.op,
                        Op::St
                            | Op::Atom
                            | Op::Red
                            | Op::Tex
                            | Op::Tld4
                            | Op::Suld
                            | Op::Txq
                            | Op::Suq
                    ) =>
            {
                if n + v.len() > MAX_SRCS {
                    return Err(too_many(inst));
                }
                ins.svec = true;
                for x in v {
                    ins.s[n] = to_src(x, scope, syms, used);
                    n += 1;
                }
            }
            o => {
                if n >= MAX_SRCS {
                    return Err(too_many(inst));
                }
                ins.s[n] = to_src(o, scope, syms, used);
                n += 1;
            }
        }
    }
    ins.ns = n as u8;
    Ok(())
}

/// `call`: the call site (callee, where its arguments come from and its return values go)
/// in [`Code::calls`], the instruction's `target`.
fn compile_call(
    inst: &Inst,
    mut ins: Ins,
    scope: &Scope,
    syms: &mut Symbols,
    code: &mut Code,
    functions: &[Function],
    by_name: &HashMap<&str, usize>,
) -> Result<Ins, String> {
    let mut used = Vec::new();
    let (Some(Operand::Vector(rets)), Some(target), Some(Operand::Vector(a))) =
        (inst.args.first(), inst.args.get(1), inst.args.get(2))
    else {
        return Err(format!("bad call: {}", inst.text));
    };
    let (callee, pointer, rets) = callee(inst, target, rets, a, functions, by_name)?;
    let site = CallSite {
        callee,
        pointer,
        args: a
            .iter()
            .map(|o| to_src(o, scope, syms, &mut used))
            .collect(),
        rets: rets
            .iter()
            .map(|o| to_src(o, scope, syms, &mut used))
            .collect(),
    };
    ins.target = code.calls.len() as u32;
    code.calls.push(site);
    code.symbols.extend(used);
    Ok(ins)
}

/// A call's callee: a function of the module (by index), one of the VM's builtins (`assert`,
/// `printf`, `malloc`/`free`, `cudaGraphSetConditional`, the device runtime), or an indirect
/// call's function-address register; with the return operands the call site passes.
fn callee<'a>(
    inst: &Inst,
    target: &Operand,
    rets: &'a [Operand],
    a: &[Operand],
    functions: &[Function],
    by_name: &HashMap<&str, usize>,
) -> Result<(u32, Option<u32>, &'a [Operand]), String> {
    Ok(match target {
        // Through a function address: each lane's callee is checked when it calls.
        &Operand::Reg(r) => (INDIRECT_CALLEE, Some(r), rets),
        // `assert()` in device code: the call ends the kernel with the assertion's message.
        Operand::Sym(name) if name == ASSERT_FAIL && !by_name.contains_key(ASSERT_FAIL) => {
            (ASSERT_CALLEE, None, &[])
        }
        // `printf` in device code: formatted by the VM (`printf.rs`).
        Operand::Sym(name) if name == VPRINTF && !by_name.contains_key(VPRINTF) => {
            if a.len() != 2 || rets.len() > 1 {
                return Err(format!("call that does not match vprintf: {}", inst.text));
            }
            (VPRINTF_CALLEE, None, rets)
        }
        // `malloc`/`free` (`new`/`delete`) in device code: the device heap (`heap.rs`).
        Operand::Sym(name)
            if (name == "malloc" || name == "free") && !by_name.contains_key(name.as_str()) =>
        {
            let malloc = name == "malloc";
            if a.len() != 1 || rets.len() != malloc as usize {
                return Err(format!("call that does not match {name}: {}", inst.text));
            }
            (if malloc { MALLOC_CALLEE } else { FREE_CALLEE }, None, rets)
        }
        // `cudaGraphSetConditional` in device code: a store to the handle's word.
        Operand::Sym(name) if name == SET_CONDITIONAL && !by_name.contains_key(SET_CONDITIONAL) => {
            if a.len() != 2 || !rets.is_empty() {
                return Err(format!(
                    "call that does not match {SET_CONDITIONAL}: {}",
                    inst.text
                ));
            }
            (SET_CONDITIONAL_CALLEE, None, rets)
        }
        // The device runtime (dynamic parallelism, `devrt.rs`).
        Operand::Sym(name)
            if !by_name.contains_key(name.as_str()) && crate::devrt::is_runtime(name) =>
        {
            let Some((f, nargs)) = crate::devrt::lookup(name) else {
                return Err(format!(
                    "call of the device runtime's {name}, which the emulated GPU does not provide"
                ));
            };
            if a.len() != nargs || rets.len() != 1 {
                return Err(format!("call that does not match {name}: {}", inst.text));
            }
            (crate::devrt::CALLEE_BASE + f as u32, None, rets)
        }
        Operand::Sym(name) => {
            let &callee = by_name
                .get(name.as_str())
                .ok_or_else(|| format!("call {name} (a function without a body)"))?;
            let f = &functions[callee];
            if f.is_entry || f.params.len() != a.len() || f.returns.len() != rets.len() {
                return Err(format!(
                    "call that does not match its callee: {}",
                    inst.text
                ));
            }
            (callee as u32, None, rets)
        }
        _ => return Err(format!("bad call: {}", inst.text)),
    })
}

/// `wmma.load {d}, [addr]{, stride}`, `wmma.store [addr], {s}{, stride}` and
/// `wmma.mma {d}, {a}, {b}, {c}`: the register lists live beside the code, checked against
/// the counts the form takes.
fn compile_wmma(
    inst: &Inst,
    mut ins: Ins,
    scope: &Scope,
    syms: &mut Symbols,
    code: &mut Code,
) -> Result<Ins, String> {
    let f = inst.mods.wmma.ok_or("wmma without its form")?;
    let store = f.kind == crate::wmma::Kind::Store;
    let mut used = Vec::new();
    let mut ops = crate::wmma::Operands::default();
    let mut first = true;
    for o in &inst.args {
        match o {
            Operand::Vector(v) if first && !store => {
                ops.d = v
                    .iter()
                    .map(|o| match o {
                        Operand::Reg(r) => Dst::Reg(*r),
                        _ => Dst::Sink,
                    })
                    .collect();
            }
            Operand::Vector(v) => ops.s.push(
                v.iter()
                    .map(|x| to_src(x, scope, syms, &mut used))
                    .collect(),
            ),
            Operand::Addr { .. } if ins.addr.is_none() => {
                ins.addr = mem_operand(Some(o), scope, syms, &mut used);
            }
            o if ins.addr.is_some() && ins.ns == 0 => {
                ins.s[0] = to_src(o, scope, syms, &mut used);
                ins.ns = 1;
            }
            _ => return Err(format!("wmma with an unexpected operand: {}", inst.text)),
        }
        first = false;
    }
    let (nd, ns) = f.operand_regs();
    let got: Vec<usize> = ops.s.iter().map(Vec::len).collect();
    let mem = f.kind != crate::wmma::Kind::Mma;
    if ops.d.len() != nd || got != ns || ins.addr.is_some() != mem {
        return Err(format!(
            "{} with {} destination and {got:?} source registers ({nd} and {ns:?} wanted){}",
            inst.text,
            ops.d.len(),
            if mem && ins.addr.is_none() {
                ", without an address"
            } else {
                ""
            }
        ));
    }
    ins.target = code.wmma.len() as u32;
    code.wmma.push(ops);
    code.symbols.extend(used);
    Ok(ins)
}

fn to_src(o: &Operand, scope: &Scope, syms: &mut Symbols, used: &mut Vec<u32>) -> Src {
    match o {
        Operand::Reg(r) => Src::Reg(*r),
        Operand::NotReg(r) => Src::NotReg(*r),
        Operand::Imm(v) => Src::Imm(*v),
        Operand::Special(s) => Src::Sreg(*s),
        Operand::Sym(name) => scope.resolve(name, syms, used),
        _ => Src::Bad,
    }
}

fn mem_operand(
    o: Option<&Operand>,
    scope: &Scope,
    syms: &mut Symbols,
    used: &mut Vec<u32>,
) -> Option<(Src, i64)> {
    match o {
        Some(Operand::Addr { base, offset }) => Some((
            match base {
                Base::Reg(r) => Src::Reg(*r),
                Base::Abs => Src::Imm(0),
                Base::Sym(name) => scope.resolve(name, syms, used),
            },
            *offset,
        )),
        _ => None,
    }
}
