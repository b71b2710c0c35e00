//! Parses a PTX file and lists what the VM cannot run:
//! `cargo run --release -p gpufuse-ptx --example ptx_check -- FILE.ptx`.
use std::collections::BTreeMap;

fn main() {
    let path = std::env::args().nth(1).expect("usage: ptx_check FILE.ptx");
    let src = std::fs::read_to_string(&path).expect("read");
    let t = std::time::Instant::now();
    let m = match gpufuse_ptx::Module::parse(&src) {
        Ok(m) => m,
        Err(e) => {
            println!("{path}: {e}");
            std::process::exit(1);
        }
    };
    let mut by_op: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, op) in m.unsupported() {
        *by_op.entry(op).or_default() += 1;
    }
    println!(
        "{path}: {} kernels parsed in {:?}; {} functions hold unsupported instructions",
        m.kernels().len(),
        t.elapsed(),
        by_op.values().sum::<usize>()
    );
    for (op, n) in by_op {
        println!("  {op}: first unsupported instruction of {n} functions");
    }
}
