//! Generates the shim's export surface from its export table, `exports.toml` (every implemented
//! driver function: its area, whether it is quiet or synchronous, and its per-thread alias), and
//! the driver's export list (`gpufuse_cuda_types::DRIVER_EXPORTS`):
//! - `aliases_<area>.rs`: the `X_ptds`/`X_ptsz` exports the table asks for, forwarding to `X`
//!   (the default stream and the per-thread stream are the same stream on a gpufuse worker);
//! - `exports.rs`: a stub for every other driver name, `address(name)` for `cuGetProcAddress`,
//!   and the table itself as `DECLARED`.
//!
//! The table is checked here: every name and alias is one of NVIDIA's exports, none appears
//! twice, every area is a module under `src/api/`, every alias is a per-thread form of its
//! function. That every table name is defined in its area is checked by the compiler (the
//! address map names `crate::api::<area>::<name>`); a `#[no_mangle]` export left out of the table
//! collides with its generated stub at link time (tests/export_table.rs checks the built
//! library's symbols against the table).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::Deserialize;

/// One row of `exports.toml`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    call: Call,
    per_thread: Option<String>,
    params: Option<String>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Call {
    Quiet,
    Sync,
}

fn main() {
    println!("cargo:rerun-if-changed=exports.toml");
    println!("cargo:rerun-if-changed=src/api");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    let text = std::fs::read_to_string("exports.toml").expect("crates/shim/exports.toml");
    let table: BTreeMap<String, BTreeMap<String, Entry>> =
        toml::from_str(&text).unwrap_or_else(|e| panic!("exports.toml: {e}"));
    let driver: BTreeSet<&str> = gpufuse_cuda_types::DRIVER_EXPORTS.iter().copied().collect();
    let areas: BTreeSet<String> = std::fs::read_dir("src/api")
        .expect("src/api")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().to_string())
        .filter(|m| m != "mod")
        .collect();
    if let Err(problems) = check(&table, &driver, &areas) {
        panic!("exports.toml:\n  {}", problems.join("\n  "));
    }

    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap());
    // Every exported name -> the path of its function.
    let mut paths: BTreeMap<&str, String> = BTreeMap::new();
    let mut declared = String::new();
    for area in &areas {
        let mut aliases = String::new();
        for (name, e) in table.get(area).into_iter().flatten() {
            paths.insert(name, format!("crate::api::{area}::{name}"));
            let call = match e.call {
                Call::Quiet => "Quiet",
                Call::Sync => "Sync",
            };
            writeln!(
                declared,
                "    Declared {{ name: \"{name}\", area: \"{area}\", call: Call::{call}, per_thread: {:?} }},",
                e.per_thread
            )
            .unwrap();
            let (Some(alias), Some(params)) = (&e.per_thread, &e.params) else {
                continue;
            };
            paths.insert(alias, format!("crate::api::{area}::{alias}"));
            let args: Vec<&str> = split_params(params).into_iter().map(|(n, _)| n).collect();
            writeln!(
                aliases,
                "#[no_mangle]\npub unsafe extern \"C\" fn {alias}({params}) -> CUresult {{\n    // SAFETY: the same contract as `{name}`, which this forwards to.\n    unsafe {{ {name}({}) }}\n}}",
                args.join(", ")
            )
            .unwrap();
        }
        std::fs::write(out.join(format!("aliases_{area}.rs")), aliases).unwrap();
    }

    let mut code = String::from("use std::ffi::c_void;\n\n");
    let mut map = String::new();
    for name in &driver {
        let path = match paths.get(name) {
            Some(path) => path.clone(),
            None => {
                writeln!(
                    code,
                    "#[no_mangle]\npub extern \"C\" fn {name}() -> i32 {{\n    crate::api::init::unsupported(\"{name}\")\n}}"
                )
                .unwrap();
                name.to_string()
            }
        };
        writeln!(map, "        \"{name}\" => {path} as *mut c_void,").unwrap();
    }
    write!(
        code,
        "\n/// The address of the export `name`, for `cuGetProcAddress`.\npub fn address(name: &str) -> Option<*mut c_void> {{\n    Some(match name {{\n{map}        _ => return None,\n    }})\n}}\n\n/// Every exported driver name.\npub const EXPORTED: &[&str] = &[\n"
    )
    .unwrap();
    for n in &driver {
        writeln!(code, "    \"{n}\",").unwrap();
    }
    write!(
        code,
        "];\n\n/// The export table (`exports.toml`): every implemented driver function.\npub const DECLARED: &[Declared] = &[\n{declared}];\n"
    )
    .unwrap();
    std::fs::write(out.join("exports.rs"), code).unwrap();
}

/// Every problem with the table, or nothing.
fn check(
    table: &BTreeMap<String, BTreeMap<String, Entry>>,
    driver: &BTreeSet<&str>,
    areas: &BTreeSet<String>,
) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for (area, entries) in table {
        if !areas.contains(area) {
            problems.push(format!("[{area}] is no module under src/api/"));
        }
        for (name, e) in entries {
            let mut names = vec![name.as_str()];
            match (&e.per_thread, &e.params) {
                (Some(alias), Some(_)) => {
                    let base = alias
                        .strip_suffix("_ptds")
                        .or_else(|| alias.strip_suffix("_ptsz"));
                    if base != Some(name.as_str()) {
                        problems.push(format!(
                            "{name}: per_thread {alias} is not {name}_ptds or {name}_ptsz"
                        ));
                    }
                    names.push(alias);
                }
                (None, None) => {}
                _ => problems.push(format!("{name}: per_thread and params go together")),
            }
            for n in names {
                if !driver.contains(n) {
                    problems.push(format!("{n} is not one of NVIDIA's driver exports"));
                }
                if let Some(other) = seen.insert(n, area) {
                    problems.push(format!("{n} is declared twice ([{other}] and [{area}])"));
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// `name: Type` pairs of a Rust parameter list (commas inside brackets belong to the type).
fn split_params(s: &str) -> Vec<(&str, &str)> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    let bytes = s.as_bytes();
    for (i, &c) in bytes.iter().enumerate() {
        match c {
            b'(' | b'<' | b'[' => depth += 1,
            b'>' if i > 0 && bytes[i - 1] == b'-' => {}
            b')' | b'>' | b']' => depth -= 1,
            b',' if depth == 0 => {
                push_param(&s[start..i], &mut out);
                start = i + 1;
            }
            _ => {}
        }
    }
    push_param(&s[start..], &mut out);
    out
}

fn push_param<'a>(p: &'a str, out: &mut Vec<(&'a str, &'a str)>) {
    if let Some((n, t)) = p.split_once(':') {
        out.push((n.trim(), t.trim()));
    }
}
