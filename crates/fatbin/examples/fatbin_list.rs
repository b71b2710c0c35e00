//! Lists the entries of every fatbin found in a file (an ELF's `.nv_fatbin` section or a bare
//! fatbin): `cargo run -p gpufuse-fatbin --example fatbin_list -- FILE`.
fn main() {
    let path = std::env::args().nth(1).expect("usage: fatbin_list FILE");
    let data = std::fs::read(&path).expect("read");
    let magic = 0xBA55_ED50u32.to_le_bytes();
    let mut at = 0;
    while let Some(pos) = data[at..].windows(4).position(|w| w == magic) {
        let start = at + pos;
        match gpufuse_fatbin::measure_len(&data[start..]) {
            Ok(len) => {
                let image = &data[start..start + len];
                match gpufuse_fatbin::entries(image) {
                    Ok(es) => {
                        let list: Vec<String> = es
                            .iter()
                            .map(|e| {
                                format!("{}:sm_{}", if e.is_ptx() { "ptx" } else { "elf" }, e.sm)
                            })
                            .collect();
                        println!("fatbin at {start:#x}, {len} bytes: {}", list.join(" "));
                    }
                    Err(e) => println!("fatbin at {start:#x}: {e}"),
                }
                at = start + len.max(4);
            }
            Err(_) => at = start + 4,
        }
    }
}
