//! The PTX parser and the instruction compiler on arbitrary text: an error naming what it did
//! not understand, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(m) = gpufuse_ptx::Module::parse(text) {
        let _ = m.kernels();
        let _ = m.unsupported();
    }
});
