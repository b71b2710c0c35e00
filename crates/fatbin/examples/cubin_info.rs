//! Prints what the cubins of a fatbin (or a bare cubin) say about their kernels and variables:
//! `cargo run -p gpufuse-fatbin --example cubin_info FILE`.

fn main() {
    let path = std::env::args().nth(1).expect("usage: cubin_info FILE");
    let image = std::fs::read(&path).expect("read the file");
    let cubins: Vec<(u32, Vec<u8>)> = match gpufuse_fatbin::classify(&image) {
        gpufuse_fatbin::ImageKind::Cubin => vec![(0, image.clone())],
        _ => gpufuse_fatbin::entries(&image)
            .expect("a fatbin")
            .iter()
            .filter(|e| !e.is_ptx())
            .map(|e| (e.sm, e.contents().expect("entry contents").into_owned()))
            .collect(),
    };
    for (sm, cubin) in cubins {
        match gpufuse_fatbin::cubin_info(&cubin) {
            Ok(info) => {
                println!(
                    "sm_{sm}: {} kernels, {} variables",
                    info.kernels.len(),
                    info.variables.len()
                );
                for k in &info.kernels {
                    let p: Vec<_> = k
                        .params
                        .iter()
                        .map(|p| format!("{}+{}", p.offset, p.size))
                        .collect();
                    println!(
                        "  kernel {} ({}) total {:?}",
                        k.name,
                        p.join(" "),
                        k.param_bytes
                    );
                }
                for v in &info.variables {
                    println!(
                        "  variable {} {} bytes{}",
                        v.name,
                        v.size,
                        if v.init.is_some() { " initialized" } else { "" }
                    );
                }
            }
            Err(e) => println!("sm_{sm}: {e}"),
        }
    }
}
