//! Real nvcc 13.5 output (`nvcc -arch=sm_80 -fatbin|-cubin`): measured exactly, PTX extracted.

use gpufuse_fatbin::{classify, entries, measure_len, select_ptx, FatbinError, ImageKind};

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

#[test]
fn fatbin_and_cubin_are_measured_to_their_file_size() {
    for name in ["k.fatbin", "k.cubin"] {
        let img = fixture(name);
        assert_eq!(measure_len(&img[..]), Ok(img.len()), "{name}");
        // Trailing bytes after the image do not change the answer.
        let mut padded = img.clone();
        padded.extend_from_slice(&[0xAA; 100]);
        assert_eq!(measure_len(&padded[..]), Ok(img.len()), "{name}");
    }
    assert_eq!(classify(&fixture("k.fatbin")), ImageKind::Fatbin);
    assert_eq!(classify(&fixture("k.cubin")), ImageKind::Cubin);
}

#[test]
fn compressed_ptx_entry_is_extracted() {
    let img = fixture("k.fatbin");
    let es = entries(&img).unwrap();
    assert!(es.iter().any(|e| e.is_ptx() && e.sm == 80));
    assert!(es.iter().any(|e| !e.is_ptx() && e.sm == 80));
    let ptx = select_ptx(&img, 80).unwrap();
    assert!(ptx.contains(".entry _Z4vaddPKfS0_Pfi"), "{ptx}");
    assert!(ptx.contains(".entry _Z5scalePff"));
    assert!(ptx.contains(".target sm_80"));
}

#[test]
fn no_ptx_for_an_older_gpu_or_a_cubin() {
    assert_eq!(
        select_ptx(&fixture("k.fatbin"), 75),
        Err(FatbinError::NoBinaryForGpu(75))
    );
    assert_eq!(
        select_ptx(&fixture("k.cubin"), 80),
        Err(FatbinError::NoBinaryForGpu(80))
    );
}

#[test]
fn truncated_images_are_errors() {
    let img = fixture("k.fatbin");
    assert!(entries(&img[..img.len() / 2]).is_err());
    let cubin = fixture("k.cubin");
    assert_eq!(measure_len(&cubin[..100]), Err(FatbinError::Truncated));
}

/// What a lazy load checks from headers alone agrees with what the loads select: the sm_80
/// fatbin (PTX and SASS for sm_80) has code for sm_80 and later GPUs (its PTX), none for an
/// older one; the sm_80 cubin only for sm_8x GPUs of minor 0 or above.
#[test]
fn code_for_a_gpu_is_known_from_the_headers() {
    use gpufuse_fatbin::has_code_for;
    let fatbin = fixture("k.fatbin");
    let cubin = fixture("k.cubin");
    assert!(has_code_for(&fatbin, 80));
    assert!(has_code_for(&fatbin, 100));
    assert!(!has_code_for(&fatbin, 75));
    assert!(has_code_for(&cubin, 80));
    assert!(has_code_for(&cubin, 86));
    assert!(!has_code_for(&cubin, 90));
    assert!(!has_code_for(&cubin, 75));
    assert!(has_code_for(b".version 8.0\n.target sm_80\0", 75));
    assert!(!has_code_for(b"\x7fELF\x02garbage", 100));
}
