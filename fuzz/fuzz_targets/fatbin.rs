//! Module images as an application hands them to cuModuleLoadData: measuring a fatbin from its
//! bytes, listing and decompressing its entries, choosing PTX or a cubin, and reading a cubin's
//! kernels, parameter layouts and variables. None may panic or read past the input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = gpufuse_fatbin::classify(data.get(..4).unwrap_or(data));
    if let Ok(len) = gpufuse_fatbin::measure_len(data) {
        assert!(len <= data.len(), "measured {len} of {} bytes", data.len());
    }
    if let Ok(entries) = gpufuse_fatbin::entries(data) {
        for e in entries {
            let _ = e.is_ptx();
            let _ = e.contents();
        }
    }
    let _ = gpufuse_fatbin::select_ptx(data, 120);
    if let Ok(Some((_, cubin))) = gpufuse_fatbin::select_cubin(data, 100) {
        let _ = gpufuse_fatbin::cubin_info(&cubin);
    }
    let _ = gpufuse_fatbin::cubin_sm(data);
    let _ = gpufuse_fatbin::cubin_info(data);
});
