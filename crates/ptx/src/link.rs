//! The JIT linker: several translation units' PTX joined into one module, as nvlink joins the
//! units of a program built with relocatable device code (`nvcc -rdc=true`) and as the driver's
//! `cuLink*` functions join what an application adds.
//!
//! The rules are the PTX ISA's for linking directives:
//! - a definition without a linkage directive belongs to its unit (`static` in CUDA C++): where
//!   another unit uses the same name, it is renamed (`NAME$unitN`) in its own unit, so each
//!   unit's code keeps reaching its own;
//! - `.visible` definitions are one per name: a second one is an error naming both units;
//! - a `.weak` definition gives way to a `.visible` one, and the first `.weak` one wins over
//!   later ones;
//! - `.common` variables of one name are one variable, as large and as aligned as the largest;
//! - every `.extern` function or variable (and every function prototype) must be defined by
//!   some unit; those that are not are listed in one error. The VM's own functions (`vprintf`,
//!   `malloc`, `free`, `__assertfail`) need no definition; an `.extern .shared` array is the
//!   launch's dynamic shared memory in every unit.
//!
//! Joining works on parsed units (`parse::Unit`), before any name is resolved: the joined unit
//! is then finished and compiled like a single module.

use std::collections::{HashMap, HashSet};

use crate::inst::{Base, Operand};
use crate::parse::{Function, Linkage, Parsed, Unit};
use crate::PtxError;

/// Functions the VM provides, which an `.extern` declaration may name without a definition.
const BUILTIN_FUNCTIONS: [&str; 5] = [
    "vprintf",
    "malloc",
    "free",
    "__assertfail",
    crate::code::SET_CONDITIONAL,
];

/// Which unit's definition of each external name is kept: (unit, index in the unit, linkage).
type Defs = HashMap<String, (usize, usize, Linkage)>;

/// Joins `units` (each with its name, for messages) into one unit.
pub fn link(mut units: Vec<(String, Unit)>) -> Result<Unit, PtxError> {
    if units.is_empty() {
        return Err(PtxError::Link("nothing to link: no PTX was added".into()));
    }
    rename_internals(&mut units);
    let (fn_def, var_def, mut errors) = definitions(&units);
    // Every declaration must meet a definition.
    let unresolved = unresolved(&units, &fn_def, &var_def);
    if !unresolved.is_empty() {
        errors.push(format!("unresolved: {}", unresolved.join(", ")));
    }
    if !errors.is_empty() {
        return Err(PtxError::Link(errors.join("; ")));
    }
    Ok(join(units, &fn_def, &var_def))
}

/// The definitions kept of the external functions and of the external variables, and the
/// errors of conflicting ones.
fn definitions(units: &[(String, Unit)]) -> (Defs, Defs, Vec<String>) {
    let mut fn_def: Defs = HashMap::new();
    let mut var_def: Defs = HashMap::new();
    let mut errors = Vec::new();
    for (u, (uname, unit)) in units.iter().enumerate() {
        for (i, (f, &l)) in unit
            .parsed
            .functions
            .iter()
            .zip(&unit.fn_linkage)
            .enumerate()
        {
            if l == Linkage::Internal {
                continue;
            }
            choose(&mut fn_def, &f.name, (u, i, l), units, uname, &mut errors);
        }
        for (i, (v, &l)) in unit
            .parsed
            .globals
            .iter()
            .zip(&unit.var_linkage)
            .enumerate()
        {
            if l == Linkage::Internal || l == Linkage::Extern {
                continue;
            }
            choose(&mut var_def, &v.name, (u, i, l), units, uname, &mut errors);
        }
    }
    for name in fn_def.keys() {
        if let Some(&(u, ..)) = var_def.get(name) {
            errors.push(format!(
                "`{name}` is a function in one unit and a variable in {}",
                units[u].0
            ));
        }
    }
    (fn_def, var_def, errors)
}

/// The declarations no unit (nor the VM) defines, each once.
fn unresolved(units: &[(String, Unit)], fn_def: &Defs, var_def: &Defs) -> Vec<String> {
    let mut unresolved: Vec<String> = Vec::new();
    for (uname, unit) in units {
        let defined_here: HashSet<&str> = unit
            .parsed
            .functions
            .iter()
            .map(|f| f.name.as_str())
            .chain(unit.parsed.globals.iter().map(|v| v.name.as_str()))
            .collect();
        for (name, is_fn) in &unit.declared {
            let found = if *is_fn {
                fn_def.contains_key(name)
                    || defined_here.contains(name.as_str())
                    || BUILTIN_FUNCTIONS.contains(&name.as_str())
                    || crate::devrt::is_runtime(name)
            } else {
                var_def.contains_key(name) || defined_here.contains(name.as_str())
            };
            if !found {
                let what = if *is_fn { "function" } else { "variable" };
                let s = format!("{what} `{name}` (declared in {uname})");
                if !unresolved.contains(&s) {
                    unresolved.push(s);
                }
            }
        }
    }
    unresolved
}

/// The joined unit: every kept definition in unit order, then text order.
fn join(units: Vec<(String, Unit)>, fn_def: &Defs, var_def: &Defs) -> Unit {
    let mut out = Unit {
        parsed: Parsed {
            version: (0, 0),
            target: 0,
            functions: Vec::new(),
            globals: Vec::new(),
        },
        fn_linkage: Vec::new(),
        var_linkage: Vec::new(),
        declared: Vec::new(),
        refs: Vec::new(),
        aliases: Vec::new(),
    };
    let mut merged = Merged::default();
    for (u, (_, unit)) in units.into_iter().enumerate() {
        let p = unit.parsed;
        out.parsed.version = out.parsed.version.max(p.version);
        out.parsed.target = out.parsed.target.max(p.target);
        for (i, (f, l)) in p.functions.into_iter().zip(unit.fn_linkage).enumerate() {
            let keep = l == Linkage::Internal
                || fn_def
                    .get(&f.name)
                    .is_some_and(|&(du, di, _)| (du, di) == (u, i));
            if keep {
                out.parsed.functions.push(f);
                out.fn_linkage.push(l);
            }
        }
        let vars = p.globals.into_iter().zip(unit.var_linkage);
        let slot = join_globals(&mut out, u, vars, var_def, &mut merged);
        for (g, at, name, e) in unit.refs {
            if let Some(Some(k)) = slot.get(g) {
                out.refs.push((*k, at, name, e));
            }
        }
        out.aliases.extend(unit.aliases);
    }
    out
}

/// The variables merged across units by name: `.common` ones and dynamic shared arrays, each
/// with its index in the joined unit.
#[derive(Default)]
struct Merged {
    common: HashMap<String, usize>,
    dynamic_shared: HashMap<String, usize>,
}

/// Unit `u`'s variables into the joined unit `out`: where each went (for its initializers'
/// names), `None` for a definition given way to another unit's.
fn join_globals(
    out: &mut Unit,
    u: usize,
    vars: impl Iterator<Item = (crate::parse::Var, Linkage)>,
    var_def: &Defs,
    merged: &mut Merged,
) -> Vec<Option<usize>> {
    let mut slot: Vec<Option<usize>> = Vec::new();
    for (i, (v, l)) in vars.enumerate() {
        let at = out.parsed.globals.len();
        match l {
            // Dynamic shared memory: one array of each name.
            Linkage::Extern => match merged.dynamic_shared.get(&v.name) {
                Some(&k) => {
                    let g = &mut out.parsed.globals[k];
                    g.align = g.align.max(v.align);
                    slot.push(Some(k));
                }
                None => {
                    merged.dynamic_shared.insert(v.name.clone(), at);
                    out.parsed.globals.push(v);
                    out.var_linkage.push(l);
                    slot.push(Some(at));
                }
            },
            Linkage::Internal => {
                out.parsed.globals.push(v);
                out.var_linkage.push(l);
                slot.push(Some(at));
            }
            _ if var_def
                .get(&v.name)
                .is_some_and(|&(_, _, dl)| dl == Linkage::Common && l == Linkage::Common) =>
            {
                match merged.common.get(&v.name) {
                    Some(&k) => {
                        let g = &mut out.parsed.globals[k];
                        if v.size > g.size {
                            g.size = v.size;
                            g.elem = v.elem;
                        }
                        g.align = g.align.max(v.align);
                        slot.push(Some(k));
                    }
                    None => {
                        merged.common.insert(v.name.clone(), at);
                        out.parsed.globals.push(v);
                        out.var_linkage.push(l);
                        slot.push(Some(at));
                    }
                }
            }
            _ if var_def
                .get(&v.name)
                .is_some_and(|&(du, di, _)| (du, di) == (u, i)) =>
            {
                out.parsed.globals.push(v);
                out.var_linkage.push(l);
                slot.push(Some(at));
            }
            _ => slot.push(None),
        }
    }
    slot
}

/// Records the definition `def` of `name` where it wins over the one kept so far, or the
/// error of two strong definitions.
fn choose(
    kept: &mut Defs,
    name: &str,
    def: (usize, usize, Linkage),
    units: &[(String, Unit)],
    uname: &str,
    errors: &mut Vec<String>,
) {
    let Some(&(ku, _, kl)) = kept.get(name) else {
        kept.insert(name.to_string(), def);
        return;
    };
    match (kl, def.2) {
        (Linkage::Visible, Linkage::Visible) => errors.push(format!(
            "multiple definitions of `{name}` (in {} and {uname})",
            units[ku].0
        )),
        (Linkage::Weak | Linkage::Common, Linkage::Visible) => {
            kept.insert(name.to_string(), def);
        }
        _ => {}
    }
}

/// Gives each unit-internal definition whose name another unit also uses a name of its own,
/// throughout its unit.
fn rename_internals(units: &mut [(String, Unit)]) {
    // Every name each unit defines or declares.
    let names: Vec<HashSet<String>> = units
        .iter()
        .map(|(_, u)| {
            u.parsed
                .functions
                .iter()
                .map(|f| f.name.clone())
                .chain(u.parsed.globals.iter().map(|v| v.name.clone()))
                .chain(u.declared.iter().map(|d| d.0.clone()))
                .collect()
        })
        .collect();
    let all: HashSet<&String> = names.iter().flatten().collect();
    let mut taken: HashSet<String> = all.iter().map(|s| s.to_string()).collect();
    for (u, (_, unit)) in units.iter_mut().enumerate() {
        let internal = unit
            .parsed
            .functions
            .iter()
            .zip(&unit.fn_linkage)
            .map(|(f, &l)| (&f.name, l))
            .chain(
                unit.parsed
                    .globals
                    .iter()
                    .zip(&unit.var_linkage)
                    .map(|(v, &l)| (&v.name, l)),
            )
            .filter(|&(_, l)| l == Linkage::Internal)
            .map(|(n, _)| n.clone());
        let mut map: HashMap<String, String> = HashMap::new();
        for name in internal {
            let elsewhere = names
                .iter()
                .enumerate()
                .any(|(o, set)| o != u && set.contains(&name));
            if !elsewhere || map.contains_key(&name) {
                continue;
            }
            let mut fresh = format!("{name}$unit{u}");
            let mut k = 0;
            while taken.contains(&fresh) {
                k += 1;
                fresh = format!("{name}$unit{u}_{k}");
            }
            taken.insert(fresh.clone());
            map.insert(name, fresh);
        }
        if !map.is_empty() {
            rename_unit(unit, &map);
        }
    }
}

fn rename_unit(unit: &mut Unit, map: &HashMap<String, String>) {
    let re = |n: &mut String| {
        if let Some(m) = map.get(n.as_str()) {
            *n = m.clone();
        }
    };
    for (f, &l) in unit.parsed.functions.iter_mut().zip(&unit.fn_linkage) {
        if l == Linkage::Internal {
            re(&mut f.name);
        }
        rename_in_function(f, map);
    }
    for (v, &l) in unit.parsed.globals.iter_mut().zip(&unit.var_linkage) {
        if l == Linkage::Internal {
            re(&mut v.name);
        }
    }
    for r in &mut unit.refs {
        re(&mut r.2);
    }
    for a in &mut unit.aliases {
        re(&mut a.1);
    }
}

/// Renames the module names a function's instructions use, except those its own parameters
/// and variables shadow.
fn rename_in_function(f: &mut Function, map: &HashMap<String, String>) {
    let own: HashSet<&str> = f
        .params
        .iter()
        .chain(&f.returns)
        .map(|p| p.name.as_str())
        .chain(f.locals.iter().map(|v| v.name.as_str()))
        .collect();
    let map: HashMap<&str, &str> = map
        .iter()
        .filter(|(k, _)| !own.contains(k.as_str()))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    if map.is_empty() {
        return;
    }
    fn walk(o: &mut Operand, map: &HashMap<&str, &str>) {
        match o {
            Operand::Sym(n)
            | Operand::Addr {
                base: Base::Sym(n), ..
            } => {
                if let Some(m) = map.get(n.as_str()) {
                    *n = m.to_string();
                }
            }
            Operand::Vector(v) => v.iter_mut().for_each(|o| walk(o, map)),
            _ => {}
        }
    }
    for inst in &mut f.insts {
        inst.args.iter_mut().for_each(|o| walk(o, &map));
    }
}
