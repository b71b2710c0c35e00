//! Images of several translation units' PTX: a program built with `nvcc -rdc=true` (its units'
//! fatbins: `nvcc -rdc=true -gencode arch=compute_80,code=[compute_80,sm_80] -gencode
//! arch=compute_90,code=compute_90 -fatbin` of crates/ptx/tests/fixtures/link/link_{a,b}.cu)
//! and the JIT linker's output.

use gpufuse_fatbin::{
    classify, is_multi_unit, link_image, measure_len, select_units, with_prelinked_ptx,
    FatbinError, ImageKind,
};
use proptest::prelude::*;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn targets(units: &[String]) -> Vec<&str> {
    units
        .iter()
        .map(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix(".target "))
                .unwrap_or("none")
        })
        .collect()
}

#[test]
fn every_unit_of_relocatable_code_keeps_its_ptx() {
    let (linked, a, b) = (
        fixture("k.fatbin"),
        fixture("link_a.fatbin"),
        fixture("link_b.fatbin"),
    );
    let img = with_prelinked_ptx(&linked, &[&a, &b]).unwrap();
    assert_eq!(classify(&img), ImageKind::Fatbin);
    assert_eq!(measure_len(&img[..]), Ok(img.len()));
    assert!(is_multi_unit(&img));
    let units = select_units(&img, 80).unwrap();
    assert_eq!(targets(&units), ["sm_80", "sm_80"]);
    assert!(units[0].contains(".entry _Z5applyPii") && units[1].contains("_Z5scalei("));
    assert_eq!(
        targets(&select_units(&img, 100).unwrap()),
        ["sm_90", "sm_90"]
    );
    assert_eq!(select_units(&img, 75), Err(FatbinError::NoBinaryForGpu(75)));
    // One unit with PTX: nothing to link.
    let one = with_prelinked_ptx(&linked, &[&a]).unwrap();
    assert!(!is_multi_unit(&one));
    assert_eq!(select_units(&one, 80).unwrap().len(), 1);
}

/// A program that launches kernels from the device links libcudadevrt, whose unit (CUDA 13:
/// PTX for sm_121 only) the emulated GPU leaves out, since it provides the device runtime
/// itself: the application's units are what it links, for any device.
#[test]
fn the_device_runtimes_unit_is_left_out() {
    let app = b".version 8.0\n.target sm_80\n.address_size 64\n.extern .func (.param .b32 func_retval0) __cudaCDP2LaunchDeviceV2(.param .b64 a, .param .b64 b);\n.visible .entry k() { ret; }\n";
    let devrt = b".version 9.5\n.target sm_121\n.address_size 64\n.visible .func (.param .b32 func_retval0) __cudaCDP2LaunchDeviceV2(\n.param .b64 a,\n.param .b64 b\n)\n{\nret;\n}\n";
    let other = b".version 9.5\n.target sm_121\n.address_size 64\n.visible .func f() { ret; }\n";
    let img = link_image(&[("app", &app[..]), ("cudadevrt", &devrt[..])]).unwrap();
    for sm in [80, 100, 121] {
        let units = select_units(&img, sm).unwrap();
        assert_eq!(units.len(), 1, "sm_{sm}");
        assert!(units[0].contains(".entry k()"));
    }
    // The device runtime alone (`cuLinkAddFile` of libcudadevrt.a with another input of its
    // own): nothing to run.
    let img = link_image(&[("cudadevrt", &devrt[..]), ("cudadevrt again", &devrt[..])]).unwrap();
    assert_eq!(select_units(&img, 100), Ok(vec![]));
    // Any other unit without code for the device still fails the load.
    let img = link_image(&[("app", &app[..]), ("other", &other[..])]).unwrap();
    assert_eq!(
        select_units(&img, 100),
        Err(FatbinError::NoBinaryForGpu(100))
    );
}

#[test]
fn the_jit_linkers_image_holds_each_input_as_a_unit() {
    let ptx = b".version 8.0\n.target sm_75\n.address_size 64\n.visible .func f() { ret; }\n\0";
    let img = link_image(&[
        ("f.ptx", &ptx[..]),
        ("link_b.fatbin", &fixture("link_b.fatbin")),
    ])
    .unwrap();
    assert_eq!(measure_len(&img[..]), Ok(img.len()));
    assert!(is_multi_unit(&img));
    let units = select_units(&img, 80).unwrap();
    assert_eq!(targets(&units), ["sm_75", "sm_80"]);
    assert_eq!(
        units[0],
        std::str::from_utf8(&ptx[..ptx.len() - 1]).unwrap()
    );
    // A single input is one unit; its image loads like the input.
    let single = link_image(&[("f.ptx", &ptx[..ptx.len() - 1])]).unwrap();
    assert_eq!(select_units(&single, 80).unwrap().len(), 1);
    // Inputs without PTX are named.
    assert_eq!(
        link_image(&[("f.ptx", &ptx[..]), ("k.cubin", &fixture("k.cubin"))]),
        Err(FatbinError::NoPtx("k.cubin".into()))
    );
    assert_eq!(
        link_image(&[("empty", &b"  \n\0"[..])]),
        Err(FatbinError::NoPtx("empty".into()))
    );
}

proptest! {
    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = select_units(&bytes, 80);
        let _ = is_multi_unit(&bytes);
        let _ = link_image(&[("x", &bytes)]);
        let _ = with_prelinked_ptx(&bytes, &[&bytes]);
        let _ = gpufuse_fatbin::fatbins_in_object(&bytes);
    }
}

/// `nvcc -rdc=true -arch=sm_80 -c` of tests/real-clients/rdc/rdc_lib.cu (its fatbin in the
/// `__nv_relfatbin` section) and `ar rcs` of it: the JIT linker's object and library inputs.
#[test]
fn fatbins_come_out_of_objects_and_libraries() {
    for name in ["rdc_lib.o", "librdc.a"] {
        let fatbins = gpufuse_fatbin::fatbins_in_object(&fixture(name)).unwrap();
        assert_eq!(fatbins.len(), 1, "{name}");
        let (member, f) = &fatbins[0];
        assert_eq!(member, if name == "librdc.a" { "rdc_lib.o" } else { "" });
        assert_eq!(measure_len(&f[..]), Ok(f.len()));
        let units = select_units(&link_image(&[(name, f)]).unwrap(), 80).unwrap();
        assert!(
            units[0].contains(".visible .global .align 4 .u32 bias = 5;"),
            "{}",
            units[0]
        );
    }
    assert!(gpufuse_fatbin::fatbins_in_object(b"not an object").is_err());
}

/// What gpufuse's NVRTC interposer hands a program for `nvrtcGetCUBIN`: the cubin (for a GPU
/// of its architecture) and the PTX (for the emulated GPU) in one fatbin.
#[test]
fn a_cubin_and_its_ptx_make_one_fatbin() {
    let cubin = fixture("k.cubin");
    let sm = gpufuse_fatbin::cubin_sm(&cubin).unwrap();
    let ptx = b"//\n.version 8.0\n.target sm_80\n.address_size 64\n\n.visible .entry k()\n{\n\tret;\n}\n\0";
    let img = gpufuse_fatbin::cubin_with_ptx(&cubin, ptx).unwrap();
    assert_eq!(classify(&img), ImageKind::Fatbin);
    assert_eq!(measure_len(&img[..]), Ok(img.len()));
    assert!(!is_multi_unit(&img));
    // The PTX runs where the cubin would: a GPU of its major version and a minor not below.
    let text = gpufuse_fatbin::select_ptx(&img, sm).unwrap();
    assert_eq!(text.as_bytes(), &ptx[..ptx.len() - 1]);
    assert_eq!(
        gpufuse_fatbin::select_ptx(&img, sm + 9 - sm % 10).unwrap(),
        text
    );
    assert_eq!(select_units(&img, sm).unwrap(), [text]);
    assert!(gpufuse_fatbin::has_code_for(&img, sm));
    let (got_sm, sass) = gpufuse_fatbin::select_cubin(&img, sm).unwrap().unwrap();
    assert_eq!(got_sm, sm);
    assert_eq!(&sass[..cubin.len()], &cubin[..]);
    assert!(sass[cubin.len()..].iter().all(|&b| b == 0) && sass.len() % 8 == 0);
    // Nowhere else, as NVIDIA's driver refuses a cubin for another GPU, PTX or not.
    let newer = (sm / 10 + 1) * 10;
    assert!(!gpufuse_fatbin::has_code_for(&img, newer));
    assert_eq!(
        gpufuse_fatbin::select_ptx(&img, newer),
        Err(FatbinError::NoBinaryForGpu(newer))
    );
    assert_eq!(
        select_units(&img, newer),
        Err(FatbinError::NoBinaryForGpu(newer))
    );
    // Not a linker input, as the cubin is not.
    assert_eq!(
        link_image(&[("lib.cubin", &img)]),
        Err(FatbinError::NoPtx("lib.cubin".to_string()))
    );
    // Not a cubin, or no PTX: an error, never a panic.
    assert!(gpufuse_fatbin::cubin_with_ptx(ptx, ptx).is_err());
    assert!(gpufuse_fatbin::cubin_with_ptx(&cubin, b"\0").is_err());
    assert!(gpufuse_fatbin::cubin_with_ptx(&cubin, &cubin).is_err());
    assert!(gpufuse_fatbin::cubin_with_ptx(&[], ptx).is_err());
}
