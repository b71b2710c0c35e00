//! `nvrtcGetCUBINSize` and `nvrtcGetCUBIN` over a stand-in NVRTC: Rust functions of NVRTC's
//! signatures, installed where the `dlsym` hook records a program's own NVRTC
//! ([`FROM_HANDLE`]), whose "program" is a [`Fake`] saying what NVRTC holds for it.

use std::ffi::c_char;
use std::sync::{Mutex, MutexGuard};

use gpufuse_fatbin::{classify, entries, has_code_for, measure_len, select_cubin, ImageKind};

use super::*;

/// What the stand-in NVRTC has for a program: each image, or the error it answers instead.
struct Fake {
    cubin: Result<Vec<u8>, NvrtcResult>,
    ptx: Result<Vec<u8>, NvrtcResult>,
}

impl Fake {
    fn program(&self) -> Program {
        self as *const Fake as Program
    }
}

/// `nvrtcGetCUBIN`'s `NVRTC_ERROR_INVALID_PROGRAM`, as the stand-in answers it.
const INVALID_PROGRAM: NvrtcResult = 5;

/// # Safety
/// `prog` is a live [`Fake`]; `size` is writable.
unsafe fn fake_size(
    prog: Program,
    size: *mut usize,
    pick: fn(&Fake) -> &Result<Vec<u8>, NvrtcResult>,
) -> NvrtcResult {
    // SAFETY: the tests pass only live `Fake`s as programs (# Safety).
    match pick(unsafe { &*(prog as *const Fake) }) {
        Ok(image) => {
            // SAFETY: the interposer passes a writable size (# Safety).
            unsafe { size.write(image.len()) };
            NVRTC_SUCCESS
        }
        Err(e) => *e,
    }
}

/// # Safety
/// `prog` is a live [`Fake`]; `out` has room for the image [`fake_size`] measured.
unsafe fn fake_get(
    prog: Program,
    out: *mut c_char,
    pick: fn(&Fake) -> &Result<Vec<u8>, NvrtcResult>,
) -> NvrtcResult {
    // SAFETY: the tests pass only live `Fake`s as programs (# Safety).
    match pick(unsafe { &*(prog as *const Fake) }) {
        Ok(image) => {
            // SAFETY: the caller made room for the size `fake_size` gave (# Safety).
            unsafe { std::ptr::copy_nonoverlapping(image.as_ptr(), out.cast(), image.len()) };
            NVRTC_SUCCESS
        }
        Err(e) => *e,
    }
}

unsafe extern "C" fn cubin_size(prog: Program, size: *mut usize) -> NvrtcResult {
    // SAFETY: the interposer passes the program and size it was given (see `fake_size`).
    unsafe { fake_size(prog, size, |f| &f.cubin) }
}

unsafe extern "C" fn cubin_get(prog: Program, out: *mut c_char) -> NvrtcResult {
    // SAFETY: as `cubin_size`; the room is what `cubin_size` said.
    unsafe { fake_get(prog, out, |f| &f.cubin) }
}

unsafe extern "C" fn ptx_size(prog: Program, size: *mut usize) -> NvrtcResult {
    // SAFETY: as `cubin_size`.
    unsafe { fake_size(prog, size, |f| &f.ptx) }
}

unsafe extern "C" fn ptx_get(prog: Program, out: *mut c_char) -> NvrtcResult {
    // SAFETY: as `cubin_get`.
    unsafe { fake_get(prog, out, |f| &f.ptx) }
}

/// Installs the stand-in NVRTC (once per process) and serializes the tests, which read and
/// set `GPUFUSE_NVRTC_PTX`.
fn stand_in() -> MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    FROM_HANDLE.get_or_init(|| FromHandle {
        cubin_size,
        cubin: cubin_get,
        ptx_size,
        ptx: ptx_get,
    });
    std::env::remove_var("GPUFUSE_NVRTC_PTX");
    guard
}

/// The headers of a 64-bit cubin for `sm` as nvcc 13 writes them (CUDA ELF ABI version 8:
/// the architecture in bits 8-15 of `e_flags`).
fn cubin(sm: u32) -> Vec<u8> {
    let mut elf = vec![0u8; 64];
    elf[..4].copy_from_slice(b"\x7fELF");
    elf[4] = 2;
    elf[7] = 0x41;
    elf[8] = 8;
    elf[18..20].copy_from_slice(&190u16.to_le_bytes());
    elf[48..52].copy_from_slice(&(0x0600_0002 | sm << 8).to_le_bytes());
    elf
}

const PTX: &[u8] =
    b"//\n.version 9.0\n.target sm_100\n.address_size 64\n\n.visible .entry k()\n{\n\tret;\n}\n\0";

/// What the interposer gives for `fake`: `nvrtcGetCUBINSize`'s status and size, then
/// `nvrtcGetCUBIN`'s status and the bytes it wrote, checked to stay within that size.
fn given(fake: &Fake) -> (NvrtcResult, Vec<u8>) {
    let mut size = usize::MAX;
    // SAFETY: a live stand-in program and a writable size.
    let st = unsafe { nvrtcGetCUBINSize(fake.program(), &mut size) };
    if st != NVRTC_SUCCESS {
        assert_eq!(size, usize::MAX, "a failure wrote a size");
        // SAFETY: a live stand-in program; NVRTC fails before it writes anything.
        let again = unsafe { nvrtcGetCUBIN(fake.program(), [0u8; 8].as_mut_ptr().cast()) };
        assert_eq!(again, st, "nvrtcGetCUBIN fails as nvrtcGetCUBINSize did");
        return (st, Vec::new());
    }
    let mut buf = vec![0xa5u8; size + 64];
    // SAFETY: `buf` has room for the size nvrtcGetCUBINSize gave.
    let st = unsafe { nvrtcGetCUBIN(fake.program(), buf.as_mut_ptr().cast()) };
    assert!(
        buf[size..].iter().all(|&b| b == 0xa5),
        "nvrtcGetCUBIN wrote past the size nvrtcGetCUBINSize gave"
    );
    buf.truncate(size);
    (st, buf)
}

#[test]
fn a_cubin_comes_back_as_a_fatbin_of_the_cubin_and_its_ptx() {
    let _g = stand_in();
    let fake = Fake {
        cubin: Ok(cubin(100)),
        ptx: Ok(PTX.to_vec()),
    };
    let (st, img) = given(&fake);
    assert_eq!(st, NVRTC_SUCCESS);
    assert_eq!(classify(&img), ImageKind::Fatbin);
    assert_eq!(measure_len(&img[..]), Ok(img.len()));
    let found = entries(&img).unwrap();
    assert_eq!(found.len(), 2);
    assert!(!found[0].is_ptx() && found[0].sm == 100);
    assert!(found[1].is_ptx() && found[1].cubin_twin && found[1].sm == 100);
    // The PTX as NVRTC gave it, for the emulated GPU.
    assert_eq!(
        gpufuse_fatbin::select_ptx(&img, 100).unwrap().as_bytes(),
        &PTX[..PTX.len() - 1]
    );
    // The cubin as NVRTC gave it, for a GPU of its architecture.
    let (sm, sass) = select_cubin(&img, 100).unwrap().unwrap();
    assert_eq!(sm, 100);
    assert_eq!(&sass[..64], &cubin(100)[..]);
    // Both run only where the cubin would: a GPU of another major version gets neither.
    assert!(has_code_for(&img, 100) && has_code_for(&img, 103));
    assert!(!has_code_for(&img, 90) && !has_code_for(&img, 120));
}

#[test]
fn without_ptx_the_cubin_is_given_unchanged() {
    let _g = stand_in();
    // A program compiled with `-dlto` has no PTX: NVRTC answers nvrtcGetPTXSize with an error.
    let fake = Fake {
        cubin: Ok(cubin(90)),
        ptx: Err(INVALID_PROGRAM),
    };
    assert_eq!(given(&fake), (NVRTC_SUCCESS, cubin(90)));
}

#[test]
fn an_image_that_is_not_a_cubin_is_given_unchanged() {
    let _g = stand_in();
    // LTO IR, say: not an ELF, so there is no architecture to give the PTX.
    let not_elf = b"\x7fNVVM not an ELF".to_vec();
    let fake = Fake {
        cubin: Ok(not_elf.clone()),
        ptx: Ok(PTX.to_vec()),
    };
    assert_eq!(given(&fake), (NVRTC_SUCCESS, not_elf));
    // Nor is PTX with no text.
    let fake = Fake {
        cubin: Ok(cubin(100)),
        ptx: Ok(b"\n\0".to_vec()),
    };
    assert_eq!(given(&fake), (NVRTC_SUCCESS, cubin(100)));
}

#[test]
fn nvrtc_errors_are_returned_as_they_are() {
    let _g = stand_in();
    let fake = Fake {
        cubin: Err(INVALID_PROGRAM),
        ptx: Ok(PTX.to_vec()),
    };
    assert_eq!(given(&fake), (INVALID_PROGRAM, Vec::new()));
}

#[test]
fn null_outputs_are_invalid_input() {
    let _g = stand_in();
    let fake = Fake {
        cubin: Ok(cubin(100)),
        ptx: Ok(PTX.to_vec()),
    };
    // SAFETY: a live stand-in program; the NULL outputs are what is tested.
    unsafe {
        assert_eq!(
            nvrtcGetCUBINSize(fake.program(), std::ptr::null_mut()),
            NVRTC_ERROR_INVALID_INPUT
        );
        assert_eq!(
            nvrtcGetCUBIN(fake.program(), std::ptr::null_mut()),
            NVRTC_ERROR_INVALID_INPUT
        );
    }
}

#[test]
fn gpufuse_nvrtc_ptx_0_gives_nvrtc_s_cubin() {
    let _g = stand_in();
    let fake = Fake {
        cubin: Ok(cubin(100)),
        ptx: Ok(PTX.to_vec()),
    };
    std::env::set_var("GPUFUSE_NVRTC_PTX", "0");
    let off = given(&fake);
    std::env::set_var("GPUFUSE_NVRTC_PTX", "1");
    let on = given(&fake);
    std::env::remove_var("GPUFUSE_NVRTC_PTX");
    assert_eq!(off, (NVRTC_SUCCESS, cubin(100)));
    assert_eq!(on.0, NVRTC_SUCCESS);
    assert_eq!(classify(&on.1), ImageKind::Fatbin);
}
