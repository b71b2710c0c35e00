//! The C entry points of NVIDIA's driver, resolved by name at load time.
#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::DriverError;

pub use gpufuse_cuda_types::CUresult;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;

/// `CUmemAllocationProp`: pinned device memory on one device.
#[repr(C)]
pub struct MemAllocationProp {
    kind: c_int,
    handle_types: c_int,
    location_type: c_int,
    location_id: c_int,
    win32: *mut c_void,
    compression: u8,
    gpu_direct_rdma: u8,
    usage: u16,
    reserved: [u8; 4],
}

impl MemAllocationProp {
    pub fn pinned_on(dev: CUdevice) -> Self {
        Self {
            kind: 1,          // CU_MEM_ALLOCATION_TYPE_PINNED
            handle_types: 0,  // none
            location_type: 1, // CU_MEM_LOCATION_TYPE_DEVICE
            location_id: dev,
            win32: std::ptr::null_mut(),
            compression: 0,
            gpu_direct_rdma: 0,
            usage: 0,
            reserved: [0; 4],
        }
    }
}

const _: () = assert!(std::mem::size_of::<MemAllocationProp>() == 32);

/// `CUmemAccessDesc`: read/write for one device.
#[repr(C)]
pub struct MemAccessDesc {
    location_type: c_int,
    location_id: c_int,
    flags: c_int,
}

impl MemAccessDesc {
    pub fn read_write_on(dev: CUdevice) -> Self {
        Self {
            location_type: 1,
            location_id: dev,
            flags: 3,
        }
    }
}

macro_rules! fns {
    (required { $($name:ident: fn($($arg:ty),*);)* } optional { $($opt:ident: fn($($oarg:ty),*);)* }) => {
        pub struct Fns {
            $(pub $name: unsafe extern "C" fn($($arg),*) -> CUresult,)*
            $(pub $opt: Option<unsafe extern "C" fn($($oarg),*) -> CUresult>,)*
        }

        impl Fns {
            pub fn load(lib: &libloading::Library) -> Result<Self, DriverError> {
                Ok(Self {
                    $($name: {
                        // SAFETY: the symbol is a driver entry point with exactly this signature (cuda.h).
                        let s = unsafe { lib.get::<unsafe extern "C" fn($($arg),*) -> CUresult>(concat!(stringify!($name), "\0").as_bytes()) };
                        *s.map_err(|_| DriverError::MissingSymbol(stringify!($name)))?
                    },)*
                    $($opt: {
                        // SAFETY: as above; absent in older drivers.
                        let s = unsafe { lib.get::<unsafe extern "C" fn($($oarg),*) -> CUresult>(concat!(stringify!($opt), "\0").as_bytes()) };
                        s.ok().map(|s| *s)
                    },)*
                })
            }
        }
    };
}

fns! {
    required {
    cuInit: fn(c_uint);
    cuGetErrorName: fn(CUresult, *mut *const c_char);
    cuDriverGetVersion: fn(*mut c_int);
    cuDeviceGetCount: fn(*mut c_int);
    cuDeviceGet: fn(*mut CUdevice, c_int);
    cuDeviceGetName: fn(*mut c_char, c_int, CUdevice);
    cuDeviceTotalMem_v2: fn(*mut usize, CUdevice);
    cuDeviceGetAttribute: fn(*mut c_int, c_int, CUdevice);
    cuDeviceGetUuid_v2: fn(*mut c_void, CUdevice);
    cuDevicePrimaryCtxRetain: fn(*mut CUcontext, CUdevice);
    cuCtxSetCurrent: fn(CUcontext);
    cuCtxSynchronize: fn();
    cuMemGetAllocationGranularity: fn(*mut usize, *const MemAllocationProp, c_int);
    cuMemAddressReserve: fn(*mut CUdeviceptr, usize, usize, CUdeviceptr, u64);
    cuMemAddressFree: fn(CUdeviceptr, usize);
    cuMemCreate: fn(*mut u64, usize, *const MemAllocationProp, u64);
    cuMemRelease: fn(u64);
    cuMemMap: fn(CUdeviceptr, usize, usize, u64, u64);
    cuMemUnmap: fn(CUdeviceptr, usize);
    cuMemSetAccess: fn(CUdeviceptr, usize, *const MemAccessDesc, usize);
    cuMemcpyHtoD_v2: fn(CUdeviceptr, *const c_void, usize);
    cuMemHostRegister_v2: fn(*mut c_void, usize, c_uint);
    cuMemHostUnregister: fn(*mut c_void);
    cuMemcpyDtoH_v2: fn(*mut c_void, CUdeviceptr, usize);
    cuMemcpyDtoD_v2: fn(CUdeviceptr, CUdeviceptr, usize);
    cuMemsetD8_v2: fn(CUdeviceptr, u8, usize);
    cuMemsetD32_v2: fn(CUdeviceptr, u32, usize);
    cuMemsetD16_v2: fn(CUdeviceptr, u16, usize);
    cuModuleGetGlobal_v2: fn(*mut CUdeviceptr, *mut usize, CUmodule, *const c_char);
    cuModuleLoadData: fn(*mut CUmodule, *const c_void);
    cuModuleUnload: fn(CUmodule);
    cuModuleGetFunction: fn(*mut CUfunction, CUmodule, *const c_char);
    cuFuncGetAttribute: fn(*mut c_int, c_int, CUfunction);
    cuFuncSetAttribute: fn(CUfunction, c_int, c_int);
    cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags: fn(*mut c_int, CUfunction, c_int, usize, c_uint);
    cuCtxGetLimit: fn(*mut usize, c_int);
    cuLaunchCooperativeKernel: fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void);
    cuLaunchKernel: fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void);
    cuStreamCreateWithPriority: fn(*mut CUstream, c_uint, c_int);
    cuStreamDestroy_v2: fn(CUstream);
    cuStreamSynchronize: fn(CUstream);
    cuEventCreate: fn(*mut CUevent, c_uint);
    cuEventRecord: fn(CUevent, CUstream);
    cuEventSynchronize: fn(CUevent);
    cuEventElapsedTime: fn(*mut f32, CUevent, CUevent);
    cuEventDestroy_v2: fn(CUevent);
    cuEventQuery: fn(CUevent);
    cuStreamQuery: fn(CUstream);
    cuStreamWaitEvent: fn(CUstream, CUevent, c_uint);
    cuCtxGetStreamPriorityRange: fn(*mut c_int, *mut c_int);
    cuMemcpyHtoDAsync_v2: fn(CUdeviceptr, *const c_void, usize, CUstream);
    cuMemcpyDtoHAsync_v2: fn(*mut c_void, CUdeviceptr, usize, CUstream);
    cuMemcpyDtoDAsync_v2: fn(CUdeviceptr, CUdeviceptr, usize, CUstream);
    cuMemsetD8Async: fn(CUdeviceptr, u8, usize, CUstream);
    cuMemsetD16Async: fn(CUdeviceptr, u16, usize, CUstream);
    cuMemsetD32Async: fn(CUdeviceptr, u32, usize, CUstream);
    cuStreamBeginCapture_v2: fn(CUstream, c_int);
    cuStreamEndCapture: fn(CUstream, *mut CUgraph);
    cuGraphInstantiateWithFlags: fn(*mut CUgraphExec, CUgraph, u64);
    cuGraphLaunch: fn(CUgraphExec, CUstream);
    cuGraphExecDestroy: fn(CUgraphExec);
    cuGraphDestroy: fn(CUgraph);
    }
    optional {
        cuFuncGetParamInfo: fn(CUfunction, usize, *mut usize, *mut usize);
    }
}
