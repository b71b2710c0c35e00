//! What every test binary of the simulated driver shares: the driver loaded through
//! `GPUFUSE_CUDA_DRIVER` from the cdylib cargo built next to the test executable, the test
//! double's own exports, memory helpers and a PTX module.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use gpufuse_cuda_driver::{CUdevice, Driver, DriverError, Function, HostSpan, Module};
use gpufuse_cuda_sim::SimStats;

pub const G: usize = 2 << 20;

pub struct Sim {
    pub d: Driver,
    pub dev: CUdevice,
    pub lib: libloading::Library,
    pub path: PathBuf,
    pub module: Module,
}

/// The simulated driver cargo built with the tests: `target/<profile>/deps/` (beside the test
/// executable) holds the cdylib `cargo test` builds; `target/<profile>/` holds the one `cargo
/// build` leaves there, which `cargo test` does not refresh. The newer of the two.
pub fn lib_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps directory");
    let candidates = [
        Some(deps.join("libgpufuse_cuda_sim.so")),
        deps.parent().map(|p| p.join("libgpufuse_cuda_sim.so")),
    ];
    candidates
        .into_iter()
        .flatten()
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max_by_key(|(t, _)| *t)
        .map(|(_, p)| p)
        .expect(
            "libgpufuse_cuda_sim.so next to the test executable (cargo builds it with the tests)",
        )
}

pub const PTX: &str = r#"
.version 8.0
.target sm_90
.address_size 64

.global .align 4 .u32 magic = 0xC0FFEE;
.global .align 8 .b8 table[64];
.const .align 4 .u32 coeffs[2] = {3, 4};

.visible .entry sim_add_u32(.param .u64 p, .param .u32 n, .param .u32 v) { ret; }
.visible .entry spin_us20() { ret; }
.visible .entry spin_us1000() { ret; }
.visible .entry spin_us2000() { ret; }
.visible .entry spin_us3000() { ret; }
.visible .entry spin_us10000() { ret; }
.visible .entry quick() { ret; }
.visible .entry mixed(.param .u8 a, .param .align 8 .b8 s[12], .param .f64 d)
.maxntid 256, 1, 1
{
    .shared .align 4 .b8 tile[4096];
    ret;
}
"#;

pub fn ptx_image(src: &str) -> Vec<u8> {
    let mut v = src.as_bytes().to_vec();
    v.push(0);
    v
}

static SIM: OnceLock<Sim> = OnceLock::new();
static SERIAL: Mutex<()> = Mutex::new(());

/// The loaded driver, with the device's primary context current on this thread. Tests of a
/// binary share one simulated machine, so they run one at a time (the guard), each starting
/// with an idle machine.
pub fn sim_with(env: &[(&str, &str)]) -> (MutexGuard<'static, ()>, &'static Sim) {
    let guard = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let s = SIM.get_or_init(|| {
        let path = lib_path();
        std::env::set_var("GPUFUSE_CUDA_DRIVER", &path);
        for (k, v) in env {
            std::env::set_var(k, v);
        }
        let d = Driver::load().expect("the simulated driver loads");
        // SAFETY: the library `Driver::load` just loaded (a second handle to it).
        let lib = unsafe { libloading::Library::new(&path) }.expect("reopen the simulated driver");
        let dev = d.device(0).unwrap();
        d.primary_context(dev).unwrap();
        let module = d.load_module(&ptx_image(PTX)).unwrap();
        Sim {
            d,
            dev,
            lib,
            path,
            module,
        }
    });
    s.d.primary_context(s.dev).unwrap();
    s.d.synchronize().unwrap();
    (guard, s)
}

/// The `CUresult` of a failed call.
pub fn code<T: std::fmt::Debug>(r: Result<T, DriverError>) -> i32 {
    match r {
        Err(e) => Driver::status(&e),
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
    }
}

/// A raw export of the simulated driver, for calls the wrappers never make (NULL pointers).
pub fn sym<T: Copy>(s: &Sim, name: &str) -> T {
    let name = format!("{name}\0");
    // SAFETY: `T` is the export's C signature (the caller names both).
    *unsafe { s.lib.get::<T>(name.as_bytes()) }.unwrap_or_else(|_| panic!("{name} is exported"))
}

pub fn stats(s: &Sim) -> SimStats {
    let f: unsafe extern "C" fn(*mut SimStats) -> i32 = sym(s, "gpufuse_sim_stats");
    let mut out = SimStats::default();
    // SAFETY: `out` is a writable `SimStats`.
    assert_eq!(unsafe { f(&mut out) }, 0);
    out
}

pub fn reset_stats(s: &Sim) {
    let f: unsafe extern "C" fn() -> i32 = sym(s, "gpufuse_sim_reset_stats");
    // SAFETY: no arguments.
    assert_eq!(unsafe { f() }, 0);
}

/// `size` bytes (rounded to the granularity) of fresh device memory, mapped with access.
pub struct DevMem<'a> {
    pub s: &'a Sim,
    pub va: u64,
    pub size: usize,
    handle: u64,
}

impl<'a> DevMem<'a> {
    pub fn new(s: &'a Sim, size: usize) -> Self {
        let size = size.next_multiple_of(G);
        let va = s.d.reserve(size, 0).unwrap();
        let handle = s.d.map_new(s.dev, va, size).unwrap();
        DevMem {
            s,
            va,
            size,
            handle,
        }
    }
}

impl Drop for DevMem<'_> {
    fn drop(&mut self) {
        let _ = self.s.d.synchronize();
        self.s
            .d
            .unmap_release(self.va, self.size, self.handle)
            .unwrap();
        self.s.d.free_reservation(self.va, self.size).unwrap();
    }
}

/// Host memory page-locked with the driver while it lives.
pub struct Pinned<'a> {
    pub s: &'a Sim,
    pub buf: Box<[u8]>,
}

impl<'a> Pinned<'a> {
    pub fn new(s: &'a Sim, len: usize, fill: u8) -> Self {
        let mut p = Pinned {
            s,
            buf: vec![fill; len].into_boxed_slice(),
        };
        let span = p.span();
        s.d.host_register(span).unwrap();
        p
    }

    pub fn span(&mut self) -> HostSpan {
        // SAFETY: the buffer lives as long as `self`, which unregisters it before freeing it,
        // and the tests synchronize before reading what the driver wrote.
        unsafe { HostSpan::new(self.buf.as_mut_ptr(), self.buf.len()) }
    }

    /// The buffer as it is now (what the driver has written so far).
    pub fn read(&self) -> Vec<u8> {
        // SAFETY: a volatile read of our own buffer, which the driver may write when an op
        // completes inside one of its calls (never concurrently with this thread's reads,
        // since those calls happen on this thread).
        (0..self.buf.len())
            .map(|i| unsafe { std::ptr::read_volatile(self.buf.as_ptr().add(i)) })
            .collect()
    }
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        let _ = self.s.d.synchronize();
        let span = self.span();
        self.s.d.host_unregister(span).unwrap();
    }
}

pub fn function(s: &Sim, name: &str) -> Function {
    s.d.function(s.module, name).unwrap()
}

/// `sim_add_u32(ptr, n, value)`'s packed parameters.
pub fn add_params(ptr: u64, n: u32, value: u32) -> Vec<u8> {
    let mut p = ptr.to_le_bytes().to_vec();
    p.extend(n.to_le_bytes());
    p.extend(value.to_le_bytes());
    p
}

pub fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect()
}

/// Fails the current attempt of a [`timed`] check with a message.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($msg:tt)*) => {
        let ok: bool = $cond;
        if !ok {
            return Err(format!($($msg)*));
        }
    };
}

/// Runs a check with wall-clock bounds up to three times, passing if one attempt does: a
/// machine busy with other work can stretch a wall-clock measurement, and no attempt passes
/// by chance when the behaviour is wrong. Each attempt must leave the machine idle.
pub fn timed<T>(what: &str, mut attempt: impl FnMut() -> Result<T, String>) -> T {
    let mut failures = Vec::new();
    for _ in 0..3 {
        match attempt() {
            Ok(v) => return v,
            Err(e) => failures.push(e),
        }
    }
    panic!("{what}: {failures:?}");
}
