//! Generates the rest of the export table from the implemented functions under `src/api/` and
//! the driver's export list (`gpufuse_cuda_types::DRIVER_EXPORTS`):
//! - `aliases_<module>.rs`: `X_ptds`/`X_ptsz` exports forwarding to an implemented `X` (the
//!   default stream and the per-thread stream are the same stream on a gpufuse worker);
//! - `exports.rs`: a stub for every other driver name, and `address(name)` for
//!   `cuGetProcAddress`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

/// One `extern "C" fn` found in the sources: its module, parameter list and return type.
struct Implemented {
    module: String,
    params: Option<Vec<(String, String)>>,
}

fn main() {
    let api = Path::new("src/api");
    println!("cargo:rerun-if-changed=src/api");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    let mut implemented: BTreeMap<String, Implemented> = BTreeMap::new();
    let mut files: Vec<_> = std::fs::read_dir(api)
        .expect("src/api")
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for path in files {
        let module = path.file_stem().unwrap().to_string_lossy().to_string();
        if module == "mod" {
            continue;
        }
        println!("cargo:rerun-if-changed={}", path.display());
        let src = std::fs::read_to_string(&path).unwrap();
        scan(&src, &module, &mut implemented);
    }

    let exports: BTreeSet<&str> = gpufuse_cuda_types::DRIVER_EXPORTS.iter().copied().collect();
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let mut aliases: BTreeMap<String, String> = BTreeMap::new();
    let mut alias_names: BTreeMap<String, String> = BTreeMap::new();
    for name in &exports {
        if implemented.contains_key(*name) {
            continue;
        }
        let Some(base) = name
            .strip_suffix("_ptds")
            .or_else(|| name.strip_suffix("_ptsz"))
        else {
            continue;
        };
        let Some(Implemented {
            module,
            params: Some(params),
        }) = implemented.get(base)
        else {
            continue;
        };
        let decl: Vec<String> = params.iter().map(|(n, t)| format!("{n}: {t}")).collect();
        let args: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
        let code = aliases.entry(module.clone()).or_default();
        writeln!(
            code,
            "#[no_mangle]\npub unsafe extern \"C\" fn {name}({}) -> CUresult {{\n    // SAFETY: the same contract as `{base}`, which this forwards to.\n    unsafe {{ {base}({}) }}\n}}",
            decl.join(", "),
            args.join(", ")
        )
        .unwrap();
        alias_names.insert(name.to_string(), module.clone());
    }
    for path in std::fs::read_dir(api).unwrap() {
        let module = path
            .unwrap()
            .path()
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .to_string();
        let code = aliases.remove(&module).unwrap_or_default();
        std::fs::write(out.join(format!("aliases_{module}.rs")), code).unwrap();
    }

    let mut code = String::from("use std::ffi::c_void;\n\n");
    let mut table = String::new();
    for name in &exports {
        let path = if let Some(imp) = implemented.get(*name) {
            format!("crate::api::{}::{name}", imp.module)
        } else if let Some(module) = alias_names.get(*name) {
            format!("crate::api::{module}::{name}")
        } else {
            writeln!(
                code,
                "#[no_mangle]\npub extern \"C\" fn {name}() -> i32 {{\n    crate::api::init::unsupported(\"{name}\")\n}}"
            )
            .unwrap();
            name.to_string()
        };
        writeln!(table, "        \"{name}\" => {path} as *mut c_void,").unwrap();
    }
    // Implemented functions that are not in the driver's list still resolve by exact name.
    for (name, imp) in &implemented {
        if !exports.contains(name.as_str()) {
            writeln!(
                table,
                "        \"{name}\" => crate::api::{}::{name} as *mut c_void,",
                imp.module
            )
            .unwrap();
        }
    }
    write!(
        code,
        "\n/// The address of the export `name`, for `cuGetProcAddress`.\npub fn address(name: &str) -> Option<*mut c_void> {{\n    Some(match name {{\n{table}        _ => return None,\n    }})\n}}\n\n/// Every exported driver name.\npub const EXPORTED: &[&str] = &[\n"
    )
    .unwrap();
    let all: BTreeSet<&str> = exports
        .iter()
        .copied()
        .chain(implemented.keys().map(|s| s.as_str()))
        .collect();
    for n in all {
        writeln!(code, "    \"{n}\",").unwrap();
    }
    code.push_str("];\n");
    std::fs::write(out.join("exports.rs"), code).unwrap();
}

/// Finds `extern "C" fn cuXxx(...)` definitions and `cuXxx` names listed in macro invocations.
fn scan(src: &str, module: &str, implemented: &mut BTreeMap<String, Implemented>) {
    let mut rest = src;
    while let Some(i) = rest.find("extern \"C\" fn ") {
        rest = &rest[i + "extern \"C\" fn ".len()..];
        let name_end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let name = &rest[..name_end];
        if !name.starts_with("cu") || name.starts_with('$') {
            continue;
        }
        let after = &rest[name_end..];
        let params = after.strip_prefix('(').and_then(|a| {
            let mut depth = 1;
            let end = a.char_indices().find(|&(_, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                depth == 0
            })?;
            Some(split_params(&a[..end.0]))
        });
        implemented.insert(
            name.to_string(),
            Implemented {
                module: module.to_string(),
                params,
            },
        );
    }
    // Names generated by macros: every `cuXxx` identifier inside a `name!(...)` or `name! {...}`.
    let mut in_block = false;
    for line in src.lines() {
        let t = line.trim();
        let starts_block = t.ends_with("! {") && !t.starts_with("macro_rules!");
        let one_line = t.contains("!(") && t.ends_with(");") && !t.starts_with("//");
        if starts_block {
            in_block = true;
            continue;
        }
        if in_block && t == "}" {
            in_block = false;
            continue;
        }
        if in_block || one_line {
            for word in t.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
                if word.starts_with("cu")
                    && word.chars().nth(2).is_some_and(|c| c.is_ascii_uppercase())
                {
                    implemented.entry(word.to_string()).or_insert(Implemented {
                        module: module.to_string(),
                        params: None,
                    });
                }
            }
        }
    }
}

fn split_params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    let mut prev = ' ';
    for c in s.chars().chain(std::iter::once(',')) {
        match c {
            '(' | '<' | '[' => depth += 1,
            '>' if prev == '-' => {}
            ')' | '>' | ']' => depth -= 1,
            _ => {}
        }
        prev = c;
        if c == ',' && depth == 0 {
            let p = cur.trim().to_string();
            cur.clear();
            if let Some((n, t)) = p.split_once(':') {
                out.push((n.trim().to_string(), t.trim().to_string()));
            }
        } else {
            cur.push(c);
        }
    }
    out
}
