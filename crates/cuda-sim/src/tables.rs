//! Fixed answers: device attributes, context limits, function attributes.

use gpufuse_cuda_types::{short as E, CUresult};

pub(crate) const DEVICE_NAME: &str = "gpufuse simulated GPU";
pub(crate) const DRIVER_VERSION: i32 = 13000;
/// The VMM granularity (minimum and recommended).
pub(crate) const GRANULARITY: u64 = 2 << 20;
pub(crate) const SMS: i32 = 132;
pub(crate) const MAX_THREADS_PER_BLOCK: u32 = 1024;
pub(crate) const THREADS_PER_SM: u32 = 2048;
pub(crate) const BLOCKS_PER_SM: u32 = 32;
/// Shared memory per block without opting in, and the most a block may opt into.
pub(crate) const SHARED_PER_BLOCK: u64 = 49152;
pub(crate) const SHARED_PER_BLOCK_OPTIN: u64 = 232448;
pub(crate) const SHARED_PER_SM: u64 = 233472;
/// The greatest `CUdevice_attribute` (CUDA 13.0).
pub(crate) const MAX_DEVICE_ATTRIBUTE: i32 = 161;
/// Stream priorities: least (0) and greatest (-5).
pub(crate) const PRIORITY_LEAST: i32 = 0;
pub(crate) const PRIORITY_GREATEST: i32 = -5;
/// The PTX ISA the driver (13.0) knows and the newest `.target` the device runs.
pub(crate) const MAX_PTX_VERSION: (u32, u32) = (9, 0);
pub(crate) const DEVICE_ARCH: u32 = 90;

/// `cuDeviceGetAttribute` for device `ordinal`: the H200's figures as its driver reports them,
/// 0 for features the device lacks; `CUDA_ERROR_INVALID_VALUE` outside 1..=161.
pub(crate) fn device_attribute(attr: i32, ordinal: usize) -> Result<i32, CUresult> {
    if !(1..=MAX_DEVICE_ATTRIBUTE).contains(&attr) {
        return Err(E::INVALID_VALUE);
    }
    let v = match attr {
        1 => MAX_THREADS_PER_BLOCK as i32,
        2 | 3 => 1024, // max block dim x, y
        4 => 64,       // max block dim z
        5 => i32::MAX, // max grid dim x
        6 | 7 => 65535,
        8 => SHARED_PER_BLOCK as i32,
        9 => 65536,     // total constant memory
        10 => 32,       // warp size
        11 => i32::MAX, // max pitch
        12 => 65536,    // registers per block
        13 => 1980000,  // clock rate, kHz
        14 => 512,      // texture alignment
        15 => 1,        // gpu overlap
        16 => SMS,
        17 => 0, // kernel exec timeout
        18 => 0, // integrated
        19 => 1, // can map host memory
        20 => 0, // compute mode: default
        21 => 131072,
        22 => 131072,
        23 => 65536,
        24..=26 => 16384,
        27 | 28 => 32768,
        29 => 2048,
        30 => 512,                   // surface alignment
        31 => 1,                     // concurrent kernels
        32 => 1,                     // ECC
        33 => 0x40 + ordinal as i32, // PCI bus
        34 => 0,                     // PCI device
        35 => 0,                     // TCC
        36 => 3201000,               // memory clock, kHz
        37 => 6016,                  // memory bus width
        38 => 62914560,              // L2 bytes
        39 => THREADS_PER_SM as i32,
        40 => 3, // async engines
        41 => 1, // unified addressing
        42 => 32768,
        43 => 2048,
        45 | 46 => 32768,
        47 | 48 => 8192,
        49 => 32768,
        50 => 0, // PCI domain
        51 => 32,
        52 | 53 => 32768,
        54 => 2046,
        55 => 32768,
        56 => 131072,
        57 => 65536,
        58..=60 => 16384,
        61 => 32768,
        62 => 2048,
        63 | 64 => 32768,
        65 => 2048,
        66 | 67 => 32768,
        68 => 2046,
        69 => 268435456,
        70 => 131072,
        71 => 65000,
        72 => 2097120,
        73 | 74 => 32768, // mipmapped 2-D texture width, height
        75 => 9,          // compute capability major
        76 => 0,          // minor
        77 => 32768,      // mipmapped 1-D texture width
        78 => 1,          // stream priorities
        79 | 80 => 1,     // global, local L1 cache
        81 => SHARED_PER_SM as i32,
        82 => 65536,
        83 => 1, // managed memory
        84 => 0, // multi-GPU board
        85 => ordinal as i32,
        86 => 0, // host native atomics
        87 => 2, // single:double performance ratio
        88 => 0, // pageable memory access
        89 => 1, // concurrent managed access
        90 => 1, // compute preemption
        91 => 0, // host pointer for registered memory
        92..=94 => 1,
        95 => 1, // cooperative launch
        96 => 0, // cooperative multi-device launch
        97 => SHARED_PER_BLOCK_OPTIN as i32,
        98 => 1,  // flush remote writes
        99 => 1,  // host register supported
        100 => 0, // pageable memory uses host page tables
        101 => 1, // direct managed memory access from host
        102 => 1, // virtual memory management
        103 => 1, // POSIX file descriptor handles
        104 | 105 => 0,
        106 => BLOCKS_PER_SM as i32,
        107 => 1,
        108 => 62914560 / 4 * 3, // max persisting L2
        109 => 134213632,        // max access policy window
        110 => 1,                // GPUDirect RDMA
        111 => 1024,             // reserved shared memory per block
        112..=114 => 1,
        115 => 1, // memory pools
        116 => 1,
        117 | 118 => 0,
        119 => 1, // mempool handle types
        120 => 1, // cluster launch
        121 => 0, // deferred mapping of CUDA arrays
        122 | 123 => 1,
        124 => 0,
        125 => 1, // IPC events
        126 => 4, // mem sync domains
        127..=129 => 0,
        130 => 0,  // NUMA config: none
        131 => -1, // NUMA id
        132 => 1,  // multicast
        133 => 0,
        134 => -1, // host NUMA id
        _ => 0,
    };
    Ok(v)
}

/// `cuCtxGetLimit`: the driver's defaults.
pub(crate) fn limit(limit: i32) -> Result<usize, CUresult> {
    Ok(match limit {
        0 => 1024,    // CU_LIMIT_STACK_SIZE
        1 => 8650752, // CU_LIMIT_PRINTF_FIFO_SIZE
        2 => 8388608, // CU_LIMIT_MALLOC_HEAP_SIZE
        3 => 2,       // CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH
        4 => 2048,    // CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT
        5 => 64,      // CU_LIMIT_MAX_L2_FETCH_GRANULARITY
        6..=9 => 0,   // persisting L2, shared memory, CIG (unset)
        _ => return Err(E::INVALID_VALUE),
    })
}

/// Blocks of `block` threads with `shared` bytes (static and dynamic) one multiprocessor
/// holds at once: `min(2048 / block, 32)`, and the shared-memory limit.
pub(crate) fn occupancy(block: u32, shared: u64) -> u32 {
    if block == 0 {
        return 0;
    }
    let warps = block.div_ceil(32);
    let by_threads = (THREADS_PER_SM / 32) / warps;
    let mut n = by_threads.min(BLOCKS_PER_SM);
    if shared > 0 {
        let per_block = (shared + 1024).div_ceil(128) * 128;
        n = n.min((SHARED_PER_SM / per_block) as u32);
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_cover_the_range() {
        for a in 1..=MAX_DEVICE_ATTRIBUTE {
            assert!(device_attribute(a, 0).is_ok());
        }
        assert_eq!(device_attribute(0, 0), Err(E::INVALID_VALUE));
        assert_eq!(device_attribute(162, 0), Err(E::INVALID_VALUE));
        assert_eq!(device_attribute(75, 0), Ok(9));
        assert_eq!(occupancy(256, 0), 8);
        assert_eq!(occupancy(32, 0), 32);
        assert_eq!(occupancy(1024, 100 << 10), 2);
    }
}
