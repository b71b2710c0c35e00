//! Writes the PTX entries of every fatbin in a file (an ELF's `.nv_fatbin` section or a bare
//! fatbin) to DIR, one file each: `cargo run -p gpufuse-fatbin --example ptx_dump -- FILE DIR`.
//! With `ptx_check` (crates/ptx) it shows what a library's PTX needs of the VM.
fn main() {
    let mut args = std::env::args().skip(1);
    let (path, dir) = match (args.next(), args.next()) {
        (Some(p), Some(d)) => (p, d),
        _ => {
            eprintln!("usage: ptx_dump FILE DIR");
            std::process::exit(2);
        }
    };
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{dir}: {e}"));
    let magic = 0xBA55_ED50u32.to_le_bytes();
    let (mut at, mut n) = (0, 0);
    while let Some(pos) = data[at..].windows(4).position(|w| w == magic) {
        let start = at + pos;
        let Ok(len) = gpufuse_fatbin::measure_len(&data[start..]) else {
            at = start + 4;
            continue;
        };
        if let Ok(es) = gpufuse_fatbin::entries(&data[start..start + len]) {
            for e in es.iter().filter(|e| e.is_ptx()) {
                match e.contents() {
                    Ok(text) => {
                        let out = format!("{dir}/{n:04}_sm{}.ptx", e.sm);
                        std::fs::write(&out, &text[..]).unwrap_or_else(|e| panic!("{out}: {e}"));
                        n += 1;
                    }
                    Err(err) => eprintln!("fatbin at {start:#x}: {err}"),
                }
            }
        }
        at = start + len.max(4);
    }
    println!("{n} PTX entries written to {dir}");
}
