//! NVIDIA's CUDA driver, loaded at run time, so building gpufuse needs no CUDA.
//!
//! Two layers (as cudarc does it): [`raw`] holds the C entry points resolved from
//! `libcuda.so.1`; [`Driver`] wraps each in a function returning `Result<_, DriverError>`.
//! Raw pointers do not leave this crate's wrappers except as device addresses (`u64`) and
//! opaque handles.
//!
//! It must never load gpufuse's own shim (which is also called `libcuda.so.1`): a library
//! that exports `gpufuse_shim_version` is refused. The library is loaded with `libloading`;
//! `GPUFUSE_CUDA_DRIVER=PATH` names the one library to try instead (the simulated driver of
//! `gpufuse-cuda-sim`, in tests).
//!
//! A [`HostSpan`] is host memory the driver copies to and from by raw pointer: memory another
//! process writes too (the client's host arena), which no Rust reference may alias.

mod raw;

use std::ffi::{c_int, c_void, CString};

pub use raw::{CUdevice, CUdeviceptr, CUresult};

macro_rules! handles {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name(*mut c_void);
        // SAFETY: driver handles are opaque and valid on any thread of the process.
        unsafe impl Send for $name {}
        // SAFETY: as above; the driver synchronizes access to its own objects.
        unsafe impl Sync for $name {}
        impl $name {
            /// The NULL handle (the default stream, for `Stream`).
            pub const NULL: Self = Self(std::ptr::null_mut());
        }
    )*};
}

handles! {
    /// A context.
    Context;
    /// A loaded module.
    Module;
    /// A kernel in a module.
    Function;
    /// A stream.
    Stream;
    /// An event.
    Event;
    /// An executable graph (`cuGraphInstantiate`'s).
    GraphExec;
}

/// Host memory copies reach through a raw pointer: memory another process may write at the same
/// time (a client's host arena, shared with its worker), which no Rust reference may alias.
/// The driver reads and writes it directly; [`HostSpan::copy_to`] and [`HostSpan::copy_from`]
/// copy it without making a reference to it.
#[derive(Clone, Copy, Debug)]
pub struct HostSpan {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a span is an address and a length; the memory it names is mapped in the whole
// process (`new`'s contract), so any thread may hand it to the driver.
unsafe impl Send for HostSpan {}

impl HostSpan {
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as long as the span (or a
    /// copy of it) is used.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Self {
        Self { ptr, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of the first byte.
    pub fn addr(&self) -> *mut u8 {
        self.ptr
    }

    /// `[offset, offset + len)` of this span, if it lies inside it.
    pub fn sub(&self, offset: usize, len: usize) -> Option<HostSpan> {
        (offset.checked_add(len)? <= self.len).then(|| HostSpan {
            ptr: self.ptr.wrapping_add(offset),
            len,
        })
    }

    /// Copies the span's first `dst.len()` bytes (at most its length) into `dst`.
    pub fn copy_to(&self, dst: &mut [u8]) {
        let n = dst.len().min(self.len);
        // SAFETY: `new`'s contract makes `ptr` readable for `len` >= `n` bytes; `dst` is a
        // distinct, writable buffer of at least `n` bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, dst.as_mut_ptr(), n) }
    }

    /// Copies `src` (at most the span's length) to the span's start.
    pub fn copy_from(&self, src: &[u8]) {
        let n = src.len().min(self.len);
        // SAFETY: `new`'s contract makes `ptr` writable for `len` >= `n` bytes; `src` is a
        // distinct buffer.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr, n) }
    }
}

/// Why the driver could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("NVIDIA's CUDA driver (libcuda.so.1) was not found: {0}")]
    NotFound(String),
    #[error(
        "libcuda.so.1 found first on the library path is gpufuse's own shim, not NVIDIA's driver"
    )]
    IsShim,
    #[error("NVIDIA's driver lacks {0}")]
    MissingSymbol(&'static str),
    #[error("CUDA error {code} ({name}) in {call}")]
    Cuda {
        call: &'static str,
        code: CUresult,
        name: String,
    },
}

impl DriverError {
    /// `CUDA_ERROR_INVALID_VALUE` for `call`, found before the driver was called.
    fn invalid_value(call: &'static str) -> Self {
        DriverError::Cuda {
            call,
            code: 1,
            name: "CUDA_ERROR_INVALID_VALUE".into(),
        }
    }
}

/// The loaded driver.
pub struct Driver {
    fns: raw::Fns,
    _lib: libloading::Library,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Driver")
    }
}

/// Where NVIDIA's driver is looked for, in order: the loader path, then the usual locations.
const CANDIDATES: &[&str] = &[
    "libcuda.so.1",
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/lib/wsl/lib/libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",
];

impl Driver {
    /// Loads NVIDIA's driver and calls `cuInit(0)`.
    /// `GPUFUSE_CUDA_DRIVER=PATH` names the one library to try instead of the usual places.
    pub fn load() -> Result<Self, DriverError> {
        let mut last = String::from("no candidate path");
        let mut saw_shim = false;
        let chosen = std::env::var("GPUFUSE_CUDA_DRIVER").ok();
        let candidates: Vec<&str> = match &chosen {
            Some(p) => vec![p.as_str()],
            None => CANDIDATES.to_vec(),
        };
        for path in candidates.iter().copied() {
            // SAFETY: loading NVIDIA's driver runs its initializers, which have no preconditions.
            let lib = match unsafe { libloading::Library::new(path) } {
                Ok(l) => l,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            // SAFETY: only probing for the symbol's presence; it is never called.
            if unsafe { lib.get::<*const c_void>(b"gpufuse_shim_version\0") }.is_ok() {
                saw_shim = true;
                continue;
            }
            let fns = raw::Fns::load(&lib)?;
            let d = Driver { fns, _lib: lib };
            // SAFETY: cuInit takes flags by value.
            d.check("cuInit", unsafe { (d.fns.cuInit)(0) })?;
            return Ok(d);
        }
        Err(if saw_shim {
            DriverError::IsShim
        } else {
            DriverError::NotFound(format!("looked in {} ({last})", candidates.join(", ")))
        })
    }

    fn check(&self, call: &'static str, code: CUresult) -> Result<(), DriverError> {
        if code == 0 {
            return Ok(());
        }
        let mut p: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: cuGetErrorName writes a static string pointer or leaves it NULL.
        unsafe { (self.fns.cuGetErrorName)(code, &mut p) };
        let name = if p.is_null() {
            "unknown".to_string()
        } else {
            // SAFETY: the driver returns a NUL-terminated static string.
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned()
        };
        Err(DriverError::Cuda { call, code, name })
    }

    /// The status of a failed call, for forwarding to a client.
    pub fn status(e: &DriverError) -> CUresult {
        match e {
            DriverError::Cuda { code, .. } => *code,
            _ => gpufuse_cuda_types::CUDA_ERROR_UNKNOWN,
        }
    }

    pub fn driver_version(&self) -> Result<i32, DriverError> {
        let mut v = 0;
        // SAFETY: valid out-pointer.
        self.check("cuDriverGetVersion", unsafe {
            (self.fns.cuDriverGetVersion)(&mut v)
        })?;
        Ok(v)
    }

    pub fn device_count(&self) -> Result<i32, DriverError> {
        let mut n = 0;
        // SAFETY: valid out-pointer.
        self.check("cuDeviceGetCount", unsafe {
            (self.fns.cuDeviceGetCount)(&mut n)
        })?;
        Ok(n)
    }

    pub fn device(&self, ordinal: i32) -> Result<CUdevice, DriverError> {
        let mut d = 0;
        // SAFETY: valid out-pointer.
        self.check("cuDeviceGet", unsafe {
            (self.fns.cuDeviceGet)(&mut d, ordinal)
        })?;
        Ok(d)
    }

    pub fn device_name(&self, dev: CUdevice) -> Result<String, DriverError> {
        let mut buf = [0u8; 256];
        // SAFETY: the buffer holds 256 bytes, as passed.
        self.check("cuDeviceGetName", unsafe {
            (self.fns.cuDeviceGetName)(buf.as_mut_ptr().cast(), 256, dev)
        })?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }

    pub fn total_mem(&self, dev: CUdevice) -> Result<u64, DriverError> {
        let mut b = 0usize;
        // SAFETY: valid out-pointer.
        self.check("cuDeviceTotalMem_v2", unsafe {
            (self.fns.cuDeviceTotalMem_v2)(&mut b, dev)
        })?;
        Ok(b as u64)
    }

    pub fn attribute(&self, dev: CUdevice, attr: i32) -> Result<i32, DriverError> {
        let mut v = 0;
        // SAFETY: valid out-pointer.
        self.check("cuDeviceGetAttribute", unsafe {
            (self.fns.cuDeviceGetAttribute)(&mut v, attr, dev)
        })?;
        Ok(v)
    }

    pub fn uuid(&self, dev: CUdevice) -> Result<[u8; 16], DriverError> {
        let mut u = [0u8; 16];
        // SAFETY: CUuuid is 16 bytes.
        self.check("cuDeviceGetUuid_v2", unsafe {
            (self.fns.cuDeviceGetUuid_v2)(u.as_mut_ptr().cast(), dev)
        })?;
        Ok(u)
    }

    /// Retains the device's primary context and makes it current on this thread.
    pub fn primary_context(&self, dev: CUdevice) -> Result<Context, DriverError> {
        let mut c = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.check("cuDevicePrimaryCtxRetain", unsafe {
            (self.fns.cuDevicePrimaryCtxRetain)(&mut c, dev)
        })?;
        // SAFETY: a context the driver just returned.
        self.check("cuCtxSetCurrent", unsafe { (self.fns.cuCtxSetCurrent)(c) })?;
        Ok(Context(c))
    }

    pub fn synchronize(&self) -> Result<(), DriverError> {
        // SAFETY: no arguments.
        self.check("cuCtxSynchronize", unsafe { (self.fns.cuCtxSynchronize)() })
    }

    // ---- virtual memory management: stable addresses, physical memory mapped underneath ----

    /// The granularity physical allocations on `dev` are rounded to.
    pub fn granularity(&self, dev: CUdevice) -> Result<usize, DriverError> {
        let prop = raw::MemAllocationProp::pinned_on(dev);
        let mut g = 0usize;
        // SAFETY: valid property struct and out-pointer; option 0 = minimum granularity.
        self.check("cuMemGetAllocationGranularity", unsafe {
            (self.fns.cuMemGetAllocationGranularity)(&mut g, &prop, 0)
        })?;
        Ok(g)
    }

    /// Reserves `size` bytes of device address space, at `hint` if possible.
    pub fn reserve(&self, size: usize, hint: u64) -> Result<u64, DriverError> {
        let mut p = 0u64;
        // SAFETY: valid out-pointer; alignment 0 = default.
        self.check("cuMemAddressReserve", unsafe {
            (self.fns.cuMemAddressReserve)(&mut p, size, 0, hint, 0)
        })?;
        Ok(p)
    }

    /// Creates `size` bytes of physical memory on `dev`, maps it at `addr` (reserved) and
    /// enables read/write access. Returns the physical handle.
    pub fn map_new(&self, dev: CUdevice, addr: u64, size: usize) -> Result<u64, DriverError> {
        let prop = raw::MemAllocationProp::pinned_on(dev);
        let mut handle = 0u64;
        // SAFETY: valid out-pointer and property struct.
        self.check("cuMemCreate", unsafe {
            (self.fns.cuMemCreate)(&mut handle, size, &prop, 0)
        })?;
        // SAFETY: `addr` is a reservation of at least `size` bytes owned by the caller.
        if let Err(e) = self.check("cuMemMap", unsafe {
            (self.fns.cuMemMap)(addr, size, 0, handle, 0)
        }) {
            // SAFETY: the handle was just created and is not mapped.
            unsafe { (self.fns.cuMemRelease)(handle) };
            return Err(e);
        }
        let access = raw::MemAccessDesc::read_write_on(dev);
        // SAFETY: the range was just mapped.
        self.check("cuMemSetAccess", unsafe {
            (self.fns.cuMemSetAccess)(addr, size, &access, 1)
        })?;
        Ok(handle)
    }

    /// Unmaps `[addr, addr+size)` and releases its physical handle.
    pub fn unmap_release(&self, addr: u64, size: usize, handle: u64) -> Result<(), DriverError> {
        // SAFETY: the caller mapped exactly this range with this handle.
        self.check("cuMemUnmap", unsafe { (self.fns.cuMemUnmap)(addr, size) })?;
        // SAFETY: the handle is no longer mapped.
        self.check("cuMemRelease", unsafe { (self.fns.cuMemRelease)(handle) })
    }

    pub fn free_reservation(&self, addr: u64, size: usize) -> Result<(), DriverError> {
        // SAFETY: the caller reserved exactly this range and unmapped it.
        self.check("cuMemAddressFree", unsafe {
            (self.fns.cuMemAddressFree)(addr, size)
        })
    }

    pub fn htod(&self, dst: u64, src: &[u8]) -> Result<(), DriverError> {
        // SAFETY: `src` is readable for its length; `dst` was validated by the caller.
        self.check("cuMemcpyHtoD_v2", unsafe {
            (self.fns.cuMemcpyHtoD_v2)(dst, src.as_ptr().cast(), src.len())
        })
    }

    pub fn dtoh(&self, dst: &mut [u8], src: u64) -> Result<(), DriverError> {
        // SAFETY: `dst` is writable for its length; `src` was validated by the caller.
        self.check("cuMemcpyDtoH_v2", unsafe {
            (self.fns.cuMemcpyDtoH_v2)(dst.as_mut_ptr().cast(), src, dst.len())
        })
    }

    /// A host-to-device copy from a [`HostSpan`].
    pub fn htod_span(&self, dst: u64, src: HostSpan) -> Result<(), DriverError> {
        // SAFETY: `HostSpan::new`'s contract makes the span readable; `dst` was validated by
        // the caller.
        self.check("cuMemcpyHtoD_v2", unsafe {
            (self.fns.cuMemcpyHtoD_v2)(dst, src.ptr.cast(), src.len)
        })
    }

    /// A device-to-host copy into a [`HostSpan`].
    pub fn dtoh_span(&self, dst: HostSpan, src: u64) -> Result<(), DriverError> {
        // SAFETY: `HostSpan::new`'s contract makes the span writable; `src` was validated by
        // the caller.
        self.check("cuMemcpyDtoH_v2", unsafe {
            (self.fns.cuMemcpyDtoH_v2)(dst.ptr.cast(), src, dst.len)
        })
    }

    /// Page-locks `span` for the driver (`cuMemHostRegister`, no flags): copies from and to
    /// it then run as DMA instead of through the driver's staging buffers.
    pub fn host_register(&self, span: HostSpan) -> Result<(), DriverError> {
        // SAFETY: `HostSpan::new`'s contract: the range is mapped for as long as the span is
        // used, which includes until `host_unregister`.
        self.check("cuMemHostRegister_v2", unsafe {
            (self.fns.cuMemHostRegister_v2)(span.ptr.cast(), span.len, 0)
        })
    }

    /// Undoes [`Driver::host_register`].
    pub fn host_unregister(&self, span: HostSpan) -> Result<(), DriverError> {
        // SAFETY: the driver only looks the address up among its registrations.
        self.check("cuMemHostUnregister", unsafe {
            (self.fns.cuMemHostUnregister)(span.ptr.cast())
        })
    }

    pub fn dtod(&self, dst: u64, src: u64, len: usize) -> Result<(), DriverError> {
        // SAFETY: both ranges were validated by the caller.
        self.check("cuMemcpyDtoD_v2", unsafe {
            (self.fns.cuMemcpyDtoD_v2)(dst, src, len)
        })
    }

    pub fn memset_d8(&self, dst: u64, value: u8, count: usize) -> Result<(), DriverError> {
        // SAFETY: the range was validated by the caller.
        self.check("cuMemsetD8_v2", unsafe {
            (self.fns.cuMemsetD8_v2)(dst, value, count)
        })
    }

    pub fn memset_d32(&self, dst: u64, value: u32, count: usize) -> Result<(), DriverError> {
        // SAFETY: the range was validated by the caller.
        self.check("cuMemsetD32_v2", unsafe {
            (self.fns.cuMemsetD32_v2)(dst, value, count)
        })
    }

    pub fn memset_d16(&self, dst: u64, value: u16, count: usize) -> Result<(), DriverError> {
        // SAFETY: the range was validated by the caller.
        self.check("cuMemsetD16_v2", unsafe {
            (self.fns.cuMemsetD16_v2)(dst, value, count)
        })
    }

    /// A module variable's device address and size.
    pub fn global(&self, m: Module, name: &str) -> Result<(u64, u64), DriverError> {
        let name =
            CString::new(name).map_err(|_| DriverError::invalid_value("cuModuleGetGlobal"))?;
        let (mut ptr, mut size) = (0u64, 0usize);
        // SAFETY: valid module, name and out-pointers.
        self.check("cuModuleGetGlobal_v2", unsafe {
            (self.fns.cuModuleGetGlobal_v2)(&mut ptr, &mut size, m.0, name.as_ptr())
        })?;
        Ok((ptr, size as u64))
    }

    pub fn load_module(&self, image: &[u8]) -> Result<Module, DriverError> {
        let mut m = std::ptr::null_mut();
        // SAFETY: `image` is a complete module image (a PTX image ends in NUL).
        self.check("cuModuleLoadData", unsafe {
            (self.fns.cuModuleLoadData)(&mut m, image.as_ptr().cast())
        })?;
        Ok(Module(m))
    }

    pub fn unload_module(&self, m: Module) -> Result<(), DriverError> {
        // SAFETY: a module this driver loaded.
        self.check("cuModuleUnload", unsafe { (self.fns.cuModuleUnload)(m.0) })
    }

    pub fn function(&self, m: Module, name: &str) -> Result<Function, DriverError> {
        let name =
            CString::new(name).map_err(|_| DriverError::invalid_value("cuModuleGetFunction"))?;
        let mut f = std::ptr::null_mut();
        // SAFETY: valid module, name and out-pointer.
        self.check("cuModuleGetFunction", unsafe {
            (self.fns.cuModuleGetFunction)(&mut f, m.0, name.as_ptr())
        })?;
        Ok(Function(f))
    }

    /// The parameter layout of `f` as (offset, size), from `cuFuncGetParamInfo` (driver >= 12.4).
    pub fn param_layout(&self, f: Function) -> Result<Vec<(u32, u32)>, DriverError> {
        let get = self
            .fns
            .cuFuncGetParamInfo
            .ok_or(DriverError::MissingSymbol("cuFuncGetParamInfo"))?;
        let mut out = Vec::new();
        for i in 0..4096usize {
            let (mut off, mut size) = (0usize, 0usize);
            // SAFETY: valid function and out-pointers.
            match unsafe { get(f.0, i, &mut off, &mut size) } {
                0 => out.push((off as u32, size as u32)),
                _ => break,
            }
        }
        Ok(out)
    }

    pub fn function_attribute(&self, f: Function, attr: i32) -> Result<i32, DriverError> {
        let mut v = 0;
        // SAFETY: valid function and out-pointer.
        self.check("cuFuncGetAttribute", unsafe {
            (self.fns.cuFuncGetAttribute)(&mut v, attr, f.0)
        })?;
        Ok(v)
    }

    /// Blocks of `block` threads using `dyn_smem` bytes of dynamic shared memory that one
    /// multiprocessor holds at once (`cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags`).
    pub fn occupancy(
        &self,
        f: Function,
        block: i32,
        dyn_smem: usize,
        flags: u32,
    ) -> Result<i32, DriverError> {
        let mut n = 0;
        let occupancy = self
            .fns
            .cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags;
        // SAFETY: valid function and out-pointer; the rest are plain integers.
        let r = unsafe { occupancy(&mut n, f.0, block, dyn_smem, flags) };
        self.check("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", r)?;
        Ok(n)
    }

    /// The current context's value of a `CUlimit` (`cuCtxGetLimit`).
    pub fn limit(&self, limit: i32) -> Result<usize, DriverError> {
        let mut v = 0usize;
        // SAFETY: a valid out-pointer; the limit is a plain integer the driver checks.
        self.check("cuCtxGetLimit", unsafe {
            (self.fns.cuCtxGetLimit)(&mut v, limit)
        })?;
        Ok(v)
    }

    /// Sets a function attribute (`cuFuncSetAttribute`).
    pub fn set_function_attribute(
        &self,
        f: Function,
        attr: i32,
        value: i32,
    ) -> Result<(), DriverError> {
        // SAFETY: a valid function; the attribute and value are plain integers.
        self.check("cuFuncSetAttribute", unsafe {
            (self.fns.cuFuncSetAttribute)(f.0, attr, value)
        })
    }

    /// A cooperative launch (`cuLaunchCooperativeKernel`, which takes no packed buffer):
    /// `params` is the packed parameter buffer and `layout` its parameters' (offset, size).
    #[allow(clippy::too_many_arguments)]
    pub fn launch_cooperative(
        &self,
        f: Function,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        stream: Stream,
        params: &[u8],
        layout: &[(u32, u32)],
    ) -> Result<(), DriverError> {
        let mut buf = params.to_vec();
        let mut args: Vec<*mut c_void> = Vec::with_capacity(layout.len());
        for &(offset, size) in layout {
            if offset as usize + size as usize > buf.len() {
                return Err(DriverError::invalid_value("cuLaunchCooperativeKernel"));
            }
            args.push(buf[offset as usize..].as_mut_ptr().cast());
        }
        // SAFETY: each pointer points at its parameter's bytes inside `buf`, which outlives
        // the call (the driver copies the parameters at launch).
        let r = unsafe {
            (self.fns.cuLaunchCooperativeKernel)(
                f.0,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared,
                stream.0,
                args.as_mut_ptr(),
            )
        };
        self.check("cuLaunchCooperativeKernel", r)
    }

    pub fn launch(
        &self,
        f: Function,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        stream: Stream,
        params: &[u8],
    ) -> Result<(), DriverError> {
        let mut buf = params.to_vec();
        let mut len = buf.len();
        let extra: [*mut c_void; 5] = [
            std::ptr::without_provenance_mut(1), // CU_LAUNCH_PARAM_BUFFER_POINTER
            buf.as_mut_ptr().cast(),
            std::ptr::without_provenance_mut(2), // CU_LAUNCH_PARAM_BUFFER_SIZE
            (&mut len as *mut usize).cast(),
            std::ptr::null_mut(),
        ];
        // SAFETY: `extra` is a well-formed CU_LAUNCH_PARAM list over live locals.
        let r = unsafe {
            (self.fns.cuLaunchKernel)(
                f.0,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared,
                stream.0,
                std::ptr::null_mut(),
                extra.as_ptr().cast_mut(),
            )
        };
        self.check("cuLaunchKernel", r)
    }

    pub fn stream_create(&self, flags: u32, priority: c_int) -> Result<Stream, DriverError> {
        let mut s = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.check("cuStreamCreateWithPriority", unsafe {
            (self.fns.cuStreamCreateWithPriority)(&mut s, flags, priority)
        })?;
        Ok(Stream(s))
    }

    pub fn stream_destroy(&self, s: Stream) -> Result<(), DriverError> {
        // SAFETY: a stream this driver created.
        self.check("cuStreamDestroy_v2", unsafe {
            (self.fns.cuStreamDestroy_v2)(s.0)
        })
    }

    pub fn stream_synchronize(&self, s: Stream) -> Result<(), DriverError> {
        // SAFETY: a valid stream or NULL.
        self.check("cuStreamSynchronize", unsafe {
            (self.fns.cuStreamSynchronize)(s.0)
        })
    }

    pub fn event_create(&self, flags: u32) -> Result<Event, DriverError> {
        let mut e = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.check("cuEventCreate", unsafe {
            (self.fns.cuEventCreate)(&mut e, flags)
        })?;
        Ok(Event(e))
    }

    pub fn event_record(&self, e: Event, s: Stream) -> Result<(), DriverError> {
        // SAFETY: valid event and stream.
        self.check("cuEventRecord", unsafe {
            (self.fns.cuEventRecord)(e.0, s.0)
        })
    }

    pub fn event_synchronize(&self, e: Event) -> Result<(), DriverError> {
        // SAFETY: valid event.
        self.check("cuEventSynchronize", unsafe {
            (self.fns.cuEventSynchronize)(e.0)
        })
    }

    pub fn event_elapsed_ms(&self, a: Event, b: Event) -> Result<f32, DriverError> {
        let mut ms = 0f32;
        // SAFETY: valid events and out-pointer.
        self.check("cuEventElapsedTime", unsafe {
            (self.fns.cuEventElapsedTime)(&mut ms, a.0, b.0)
        })?;
        Ok(ms)
    }

    pub fn event_destroy(&self, e: Event) -> Result<(), DriverError> {
        // SAFETY: an event this driver created.
        self.check("cuEventDestroy_v2", unsafe {
            (self.fns.cuEventDestroy_v2)(e.0)
        })
    }

    /// Whether `e` has completed (`cuEventQuery`): `Ok(false)` while work before it runs.
    pub fn event_query(&self, e: Event) -> Result<bool, DriverError> {
        // SAFETY: valid event.
        match unsafe { (self.fns.cuEventQuery)(e.0) } {
            NOT_READY => Ok(false),
            r => self.check("cuEventQuery", r).map(|()| true),
        }
    }

    /// Whether all work on `s` has completed (`cuStreamQuery`).
    pub fn stream_query(&self, s: Stream) -> Result<bool, DriverError> {
        // SAFETY: a valid stream or NULL.
        match unsafe { (self.fns.cuStreamQuery)(s.0) } {
            NOT_READY => Ok(false),
            r => self.check("cuStreamQuery", r).map(|()| true),
        }
    }

    /// Later work on `s` waits for `e` (`cuStreamWaitEvent`).
    pub fn stream_wait_event(&self, s: Stream, e: Event) -> Result<(), DriverError> {
        // SAFETY: valid stream (or NULL) and event.
        self.check("cuStreamWaitEvent", unsafe {
            (self.fns.cuStreamWaitEvent)(s.0, e.0, 0)
        })
    }

    /// The context's stream priorities: (least, greatest); greater priority is a lower number.
    pub fn stream_priority_range(&self) -> Result<(i32, i32), DriverError> {
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: valid out-pointers.
        self.check("cuCtxGetStreamPriorityRange", unsafe {
            (self.fns.cuCtxGetStreamPriorityRange)(&mut least, &mut greatest)
        })?;
        Ok((least, greatest))
    }

    /// A host-to-device copy enqueued on `s`. From pageable memory the driver has read `src`
    /// when this returns; from page-locked memory (a registered [`HostSpan`]) the copy is DMA
    /// that runs later, and `src` must stay as it is until the stream has passed it.
    pub fn htod_async(&self, dst: u64, src: HostSpan, s: Stream) -> Result<(), DriverError> {
        // SAFETY: `HostSpan::new`'s contract makes the span readable for as long as the copy
        // runs (the caller keeps it until the stream passed it); `dst` was validated.
        self.check("cuMemcpyHtoDAsync_v2", unsafe {
            (self.fns.cuMemcpyHtoDAsync_v2)(dst, src.ptr.cast(), src.len, s.0)
        })
    }

    /// A device-to-host copy enqueued on `s` (as [`Driver::htod_async`]: into pageable memory
    /// it has completed when this returns).
    pub fn dtoh_async(&self, dst: HostSpan, src: u64, s: Stream) -> Result<(), DriverError> {
        // SAFETY: as `htod_async`, for writing.
        self.check("cuMemcpyDtoHAsync_v2", unsafe {
            (self.fns.cuMemcpyDtoHAsync_v2)(dst.ptr.cast(), src, dst.len, s.0)
        })
    }

    /// [`Driver::htod_async`] from a buffer of this process: pageable memory, which the
    /// driver has read when this returns, so the buffer may go right after.
    pub fn htod_async_bytes(&self, dst: u64, src: &[u8], s: Stream) -> Result<(), DriverError> {
        // SAFETY: `src` is readable for its length for the whole call, and the driver takes
        // pageable memory before returning (CUDA's rule for asynchronous copies from it).
        self.check("cuMemcpyHtoDAsync_v2", unsafe {
            (self.fns.cuMemcpyHtoDAsync_v2)(dst, src.as_ptr().cast(), src.len(), s.0)
        })
    }

    /// [`Driver::dtoh_async`] into a buffer of this process, then waits for `s`: the bytes are
    /// in `dst` when this returns.
    pub fn dtoh_bytes_on(&self, dst: &mut [u8], src: u64, s: Stream) -> Result<(), DriverError> {
        // SAFETY: `dst` is writable for its length for the whole call, which does not return
        // before the copy has completed (the stream is synchronized below).
        self.check("cuMemcpyDtoHAsync_v2", unsafe {
            (self.fns.cuMemcpyDtoHAsync_v2)(dst.as_mut_ptr().cast(), src, dst.len(), s.0)
        })?;
        self.stream_synchronize(s)
    }

    pub fn dtod_async(&self, dst: u64, src: u64, len: usize, s: Stream) -> Result<(), DriverError> {
        // SAFETY: both ranges were validated by the caller.
        self.check("cuMemcpyDtoDAsync_v2", unsafe {
            (self.fns.cuMemcpyDtoDAsync_v2)(dst, src, len, s.0)
        })
    }

    /// `count` elements of `elem_size` (1, 2 or 4) bytes set to `value`, enqueued on `s`.
    pub fn memset_async(
        &self,
        dst: u64,
        value: u32,
        elem_size: u8,
        count: usize,
        s: Stream,
    ) -> Result<(), DriverError> {
        // SAFETY: the range was validated by the caller.
        unsafe {
            match elem_size {
                1 => self.check(
                    "cuMemsetD8Async",
                    (self.fns.cuMemsetD8Async)(dst, value as u8, count, s.0),
                ),
                2 => self.check(
                    "cuMemsetD16Async",
                    (self.fns.cuMemsetD16Async)(dst, value as u16, count, s.0),
                ),
                _ => self.check(
                    "cuMemsetD32Async",
                    (self.fns.cuMemsetD32Async)(dst, value, count, s.0),
                ),
            }
        }
    }

    /// Starts recording `s`'s work into a graph instead of running it (thread-local mode:
    /// other threads of the process are not disturbed).
    pub fn begin_capture(&self, s: Stream) -> Result<(), DriverError> {
        // SAFETY: a valid, non-NULL stream. CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1.
        self.check("cuStreamBeginCapture_v2", unsafe {
            (self.fns.cuStreamBeginCapture_v2)(s.0, 1)
        })
    }

    /// Ends [`Driver::begin_capture`] and makes the recorded work an executable graph.
    pub fn end_capture(&self, s: Stream) -> Result<GraphExec, DriverError> {
        let mut g = std::ptr::null_mut();
        // SAFETY: valid stream and out-pointer.
        self.check("cuStreamEndCapture", unsafe {
            (self.fns.cuStreamEndCapture)(s.0, &mut g)
        })?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: `g` is the graph just captured; valid out-pointer.
        let r = unsafe { (self.fns.cuGraphInstantiateWithFlags)(&mut exec, g, 0) };
        // SAFETY: the executable graph keeps what it needs of `g`.
        unsafe { (self.fns.cuGraphDestroy)(g) };
        self.check("cuGraphInstantiateWithFlags", r)?;
        Ok(GraphExec(exec))
    }

    /// Enqueues the whole executable graph on `s`: one call, however many nodes.
    pub fn graph_launch(&self, g: GraphExec, s: Stream) -> Result<(), DriverError> {
        // SAFETY: a graph this driver instantiated; a valid stream or NULL.
        self.check("cuGraphLaunch", unsafe {
            (self.fns.cuGraphLaunch)(g.0, s.0)
        })
    }

    pub fn graph_destroy(&self, g: GraphExec) -> Result<(), DriverError> {
        // SAFETY: a graph this driver instantiated, destroyed once.
        self.check("cuGraphExecDestroy", unsafe {
            (self.fns.cuGraphExecDestroy)(g.0)
        })
    }
}

/// `CUDA_ERROR_NOT_READY`: a query's "not yet".
const NOT_READY: CUresult = 600;

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without NVIDIA's driver the answer is a clear error, not a crash.
    #[test]
    fn load_without_a_driver_names_what_is_missing() {
        match Driver::load() {
            Ok(d) => assert!(d.device_count().is_ok()),
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("libcuda.so.1") || msg.contains("CUDA error"),
                    "{msg}"
                );
            }
        }
    }
}
