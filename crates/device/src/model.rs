//! The emulated GPU's device models, as the CUDA driver describes them, with the memory the
//! server was configured with. The default is an NVIDIA B200-class GPU (compute capability 10.0,
//! 148 SMs) because the VM runs PTX and a driver refuses PTX that targets a newer architecture
//! than the device: libraries built for many architectures (CuPy's CUB, for one) embed PTX only
//! for their newest target (`compute_100`), and every older PTX target still loads on a 10.0
//! device. Libraries whose PTX targets a newer architecture (NVIDIA's cuBLAS and cuBLASLt ship
//! `compute_120` PTX only) need a newer model: `--devices emu:1:16GiB:sm_120` loads it, but on a
//! 12.0 device cuBLAS picks, for most GEMM shapes, kernels it ships as SASS only (which no
//! PTX-running device executes). The `future` model (`sm_130`, compute capability 13.0, newer
//! than any architecture CUDA 13.5 knows: nvcc and NVRTC stop at `sm_121`) is a device every
//! library meets through its forward-compatibility path: with no SASS for it anywhere, cuBLAS
//! and cuBLASLt choose among the kernels they ship as PTX, and every GEMM shape runs
//! (`tests/real-clients/test_cublas.py`). Its figures are the B200's. The figures of each other
//! model are the public specifications of the GPU it is named after. Features the emulated
//! GPU does not have (mipmapped textures, peer access, managed memory, IPC,
//! multi-device cooperative launches) are reported as absent (0); cooperative launches are
//! reported and run every block at once (crates/ptx/src/launch.rs); persisting L2 reports the
//! modelled GPU's sizes and its hints change nothing (the VM has no cache); the client answers
//! managed memory itself, and mapped pinned memory is kept like managed memory
//! (crates/shim/src/api/managed.rs). Texture and surface objects of 1-D, 2-D, 3-D, layered and
//! cubemap arrays (layered cubemaps too), linear and pitched memory are sampled by the VM
//! (crates/ptx/src/tex.rs): their size
//! limits are those of a 9.x/10.x GPU.

use crate::status::{Status, INVALID_VALUE, UNSUPPORTED_LIMIT};

/// One emulated GPU model: what `cuDeviceGetAttribute` reports, by the GPU it is named after.
#[derive(Debug, PartialEq)]
pub struct Model {
    /// Compute capability (major, minor).
    pub cc: (i32, i32),
    /// The GPU whose public figures the model reports.
    pub like: &'static str,
    pub sms: i32,
    /// Boost clock, kHz.
    pub clock_khz: i32,
    pub mem_clock_khz: i32,
    pub bus_width_bits: i32,
    pub l2_bytes: i32,
    pub shared_per_sm: i32,
    /// Shared memory a block may opt into (`cudaFuncAttributeMaxDynamicSharedMemorySize`).
    pub shared_per_block_optin: i32,
    pub threads_per_sm: i32,
    pub blocks_per_sm: i32,
}

impl Model {
    /// `sm_100` for compute capability 10.0.
    pub fn arch(&self) -> u32 {
        (self.cc.0 * 10 + self.cc.1) as u32
    }
}

/// The default model's GPU (compute capability 10.0).
const B200: Model = Model {
    cc: (10, 0),
    like: "B200",
    sms: 148,
    clock_khz: 1965000,
    mem_clock_khz: 3996000,
    bus_width_bits: 8192,
    l2_bytes: 132120576,
    shared_per_sm: 233472,
    shared_per_block_optin: 232448,
    threads_per_sm: 2048,
    blocks_per_sm: 32,
};

/// The models `--devices emu:N:SIZE:sm_XX` can name.
pub const MODELS: &[Model] = &[
    Model {
        cc: (8, 0),
        like: "A100 SXM4",
        sms: 108,
        clock_khz: 1410000,
        mem_clock_khz: 1215000,
        bus_width_bits: 5120,
        l2_bytes: 41943040,
        shared_per_sm: 167936,
        shared_per_block_optin: 166912,
        threads_per_sm: 2048,
        blocks_per_sm: 32,
    },
    // The NVIDIA H200 as its driver (580) reported it on the GPU lane (the conformance
    // fixture): the H100's GH100 with more, faster memory and 60 MiB of L2.
    Model {
        cc: (9, 0),
        like: "H200",
        sms: 132,
        clock_khz: 1980000,
        mem_clock_khz: 3201000,
        bus_width_bits: 6016,
        l2_bytes: 62914560,
        shared_per_sm: 233472,
        shared_per_block_optin: 232448,
        threads_per_sm: 2048,
        blocks_per_sm: 32,
    },
    B200,
    Model {
        cc: (12, 0),
        like: "RTX PRO 6000 Blackwell",
        sms: 188,
        clock_khz: 2617000,
        mem_clock_khz: 14001000,
        bus_width_bits: 512,
        l2_bytes: 134217728,
        shared_per_sm: 102400,
        shared_per_block_optin: 101376,
        threads_per_sm: 1536,
        blocks_per_sm: 24,
    },
    // The future model: the B200's figures at a compute capability no library has SASS for.
    Model {
        cc: (13, 0),
        like: "future",
        ..B200
    },
];

/// The default model: compute capability 10.0.
pub fn default_model() -> &'static Model {
    by_arch(100).expect("sm_100 is in MODELS")
}

/// The model for `sm_XX`, if there is one.
pub fn by_arch(arch: u32) -> Option<&'static Model> {
    MODELS.iter().find(|m| m.arch() == arch)
}

/// `sm_80, sm_90, ...`: for error messages and help.
pub fn arch_list() -> String {
    MODELS
        .iter()
        .map(|m| format!("sm_{}", m.arch()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Compute capability of the default model.
pub const CC: (i32, i32) = (10, 0);
/// Shared memory per block without opting in (bytes), the same on every model.
pub const SHARED_PER_BLOCK: i32 = 49152;
pub const NAME: &str = "gpufuse emulated GPU";
/// PCI domain, bus and device of emulated device `index` (also in the integrity check).
pub fn pci(index: u32) -> (u32, u32, u32) {
    (0, 0x40 + index, 0)
}

/// Every `CUdevice_attribute` id from 1 to 161 (CUDA 13.5) and its value.
pub fn attributes(m: &Model, index: u32) -> Vec<(i32, i32)> {
    let (domain, bus, device) = pci(index);
    let known: &[(i32, i32)] = &[
        (1, 1024),             // max threads per block
        (2, 1024),             // max block dim x
        (3, 1024),             // max block dim y
        (4, 64),               // max block dim z
        (5, 2147483647),       // max grid dim x
        (6, 65535),            // max grid dim y
        (7, 65535),            // max grid dim z
        (8, SHARED_PER_BLOCK), // shared memory per block
        (9, 65536),            // total constant memory
        (10, 32),              // warp size
        (11, 2147483647),      // max pitch
        (12, 65536),           // registers per block
        (13, m.clock_khz),     // clock rate, kHz
        (14, 512),             // texture alignment
        (15, 1),               // gpu overlap
        (16, m.sms),           // multiprocessors
        (17, 0),               // kernel exec timeout
        (18, 0),               // integrated
        (19, 1),               // can map host memory: mapped pinned memory moves like managed
        (20, 0),               // compute mode default
        // Texture and surface sizes (those of compute capability 9.x and 10.x GPUs); mipmapped
        // textures are not supported (0).
        (21, 131072), // 1-D texture width
        (22, 131072), // 2-D texture width, height
        (23, 65536),
        (24, 16384), // 3-D texture width, height, depth
        (25, 16384),
        (26, 16384),
        (27, 32768), // layered 2-D texture width, height, layers
        (28, 32768),
        (29, 2048),
        (30, 512), // surface alignment
        (31, 1),   // concurrent kernels
        (32, 0),   // ECC
        (33, bus as i32),
        (34, device as i32),
        (35, 0),               // TCC
        (36, m.mem_clock_khz), // memory clock, kHz
        (37, m.bus_width_bits),
        (38, m.l2_bytes),
        (39, m.threads_per_sm),
        (40, 3),     // async engines
        (41, 1),     // unified addressing
        (42, 32768), // layered 1-D texture width, layers
        (43, 2048),
        (45, 32768), // 2-D gather width, height
        (46, 32768),
        (47, 8192), // 3-D texture alternate width, height, depth
        (48, 8192),
        (49, 32768),
        (50, domain as i32),
        (52, 32768), // cubemap texture width; layered: width, cubemaps x 6
        (53, 32768),
        (54, 2046),
        (51, 32),     // texture pitch alignment
        (55, 32768),  // 1-D surface width
        (56, 131072), // 2-D surface width, height
        (57, 65536),
        (58, 16384), // 3-D surface width, height, depth
        (59, 16384),
        (60, 16384),
        (61, 32768), // layered 1-D surface width, layers
        (62, 2048),
        (63, 32768), // layered 2-D surface width, height, layers
        (64, 32768),
        (65, 2048),
        (66, 32768), // cubemap surface width; layered: width, cubemaps x 6
        (67, 32768),
        (68, 2046),
        (69, 268435456), // 1-D texture of linear memory: elements
        (70, 131072),    // 2-D texture of pitched memory: width, height, pitch
        (71, 65000),
        (72, 2097120),
        (75, m.cc.0),
        (76, m.cc.1),
        (78, 1), // stream priorities
        (79, 1), // global L1 cache
        (80, 1), // local L1 cache
        (81, m.shared_per_sm),
        (82, 65536), // registers per multiprocessor
        (83, 0),     // managed memory: no
        (84, 0),     // multi-GPU board
        (85, 0),
        (86, 0), // host native atomics
        (87, 2), // single:double performance ratio
        (88, 0), // pageable memory access
        (89, 0), // concurrent managed access
        (90, 1), // compute preemption
        (91, 0),
        (95, 1), // cooperative launch: every block resident (crates/ptx/src/launch.rs)
        (96, 0), // cooperative multi-device launch: no (deprecated by CUDA)
        (97, m.shared_per_block_optin),
        (98, 0),
        (99, 1),  // host register supported
        (102, 1), // virtual memory management (cuMemCreate/cuMemMap; copies across adjacent mappings)
        (103, 1), // POSIX file descriptor handles (cuMemExportToShareableHandle: gpufuse_transport::ipc)
        (106, m.blocks_per_sm),
        // Generic compression: compressible cuMemCreate allocations are kept as such (the
        // client reports them so); compression changes bandwidth on a GPU, never contents.
        (107, 1),
        // Persisting L2: the figures of the GPU modelled (a quarter of L2 may persist, windows
        // up to 128 MiB); the VM has no cache, so hints are accepted and change nothing.
        (108, m.l2_bytes / 4),
        (109, 128 << 20),
        (111, 1024), // reserved shared memory per block
        (115, 1),    // memory pools supported
        (119, 1),    // mempool handle types: POSIX file descriptors (gpufuse_client::ipc)
        (120, 0),    // cluster launch
        (125, 1),    // IPC events (gpufuse_client::ipc)
        (126, 1),    // mem sync domains
        (130, 0),    // NUMA config: none
        (131, -1),   // NUMA id
        (134, -1),   // host NUMA id
    ];
    (1..=161)
        .map(|id| {
            (
                id,
                known.iter().find(|(k, _)| *k == id).map_or(0, |&(_, v)| v),
            )
        })
        .collect()
}

/// Registers the VM reports for every kernel (`CU_FUNC_ATTRIBUTE_NUM_REGS`).
pub const REGISTERS_PER_THREAD: u64 = 32;

/// What a kernel asks of a multiprocessor: the inputs of an occupancy figure.
#[derive(Clone, Copy, Debug)]
pub struct BlockUse {
    /// Threads per block.
    pub threads: u64,
    /// Registers per thread (`CU_FUNC_ATTRIBUTE_NUM_REGS`).
    pub registers: u64,
    /// Static plus dynamic shared memory per block, bytes.
    pub shared: u64,
}

/// Registers are given to warps in units of 256; a multiprocessor's 64 Ki registers are four
/// banks of 16 Ki, one per warp scheduler, and a warp's registers come from one bank.
const REGISTER_UNIT: u64 = 256;
const REGISTER_BANKS: u64 = 4;
const REGISTERS_PER_BANK: u64 = 16384;
/// Shared memory is given to blocks in units of 128 bytes, each block with the driver's
/// reservation on top (`CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK`, 1 KiB).
const SHARED_UNIT: u64 = 128;
const SHARED_RESERVED_PER_BLOCK: u64 = 1024;

/// Blocks one multiprocessor of model `m` holds at once: what
/// `cuOccupancyMaxActiveBlocksPerMultiprocessor` reports, by NVIDIA's published rules (the
/// CUDA occupancy calculator's): the least of the warp, block, register and shared-memory
/// limits. The one place the emulated GPU decides occupancy: the client asks the device
/// (`Device::occupancy`), and cooperative launches are checked with it.
pub fn blocks_per_sm(m: &Model, u: BlockUse) -> u64 {
    if u.threads == 0 {
        return 0;
    }
    let warps = u.threads.div_ceil(32);
    let by_warps = (m.threads_per_sm as u64 / 32) / warps;
    let by_blocks = m.blocks_per_sm as u64;
    let by_registers = if u.registers == 0 {
        u64::MAX
    } else {
        let per_warp = (u.registers * 32).div_ceil(REGISTER_UNIT) * REGISTER_UNIT;
        let warps_in_registers = REGISTER_BANKS * (REGISTERS_PER_BANK / per_warp);
        warps_in_registers / warps
    };
    let shared = (u.shared + SHARED_RESERVED_PER_BLOCK).div_ceil(SHARED_UNIT) * SHARED_UNIT;
    let by_shared = if u.shared == 0 {
        u64::MAX
    } else {
        m.shared_per_sm as u64 / shared
    };
    by_warps.min(by_blocks).min(by_registers).min(by_shared)
}

/// Blocks of `threads` threads using `shared` bytes of shared memory each that the device holds
/// at once ([`blocks_per_sm`] times the multiprocessors): a cooperative launch may have no more.
pub fn coresident_blocks(m: &Model, threads: u64, shared: u64) -> u64 {
    let u = BlockUse {
        threads: threads.max(1),
        registers: REGISTERS_PER_THREAD,
        shared,
    };
    blocks_per_sm(m, u) * m.sms as u64
}

/// The driver's value of each `CUlimit` before an application sets it, or the error it
/// answers, by limit: stack size, printf FIFO, malloc heap, device-runtime sync depth, pending
/// launches, L2 fetch granularity, persisting L2 size, shared memory of the context, CIG
/// enabled, CIG shared-memory fallback. As NVIDIA's driver 580 answers on an H200
/// (tests/conformance/fixtures): the sync depth is `CUDA_ERROR_UNSUPPORTED_LIMIT` from compute
/// capability 9.0 on (no synchronizing child grids there), the CIG fallback is too for a
/// context that is not CIG, the context's shared memory is what a block may opt into, and a
/// limit the driver does not know (`CU_LIMIT_PER_BLOCK_MEMORY_SIZE` and later: CUDA 13.5's
/// header, newer than the driver) is `CUDA_ERROR_INVALID_VALUE`.
pub fn default_limit(m: &Model, limit: u32) -> Result<u64, Status> {
    Ok(match limit {
        0 => 1024,
        1 => PRINTF_FIFO_BYTES,
        2 => 8 << 20,
        3 if m.cc.0 >= 9 => return Err(UNSUPPORTED_LIMIT),
        3 => 2,
        4 => 2048,
        5 => 64,
        6 => 0,
        7 => m.shared_per_block_optin as u64,
        8 => 0,
        9 => return Err(UNSUPPORTED_LIMIT),
        _ => return Err(INVALID_VALUE),
    })
}

/// `CU_LIMIT_PRINTF_FIFO_SIZE` before an application sets it: NVIDIA's driver 580 answers
/// 8,650,752 bytes (H200).
pub const PRINTF_FIFO_BYTES: u64 = 8_650_752;

/// Peak FP32 throughput in TFLOPS of a GPU with `sms` multiprocessors at `clock_khz`: FP32
/// lanes per multiprocessor by compute capability (64 on 7.x and 8.0, 128 from 8.6 on), two
/// FLOPs per fused multiply-add. A `--tflops` request is converted to a share of this.
pub fn fp32_tflops(sms: i32, clock_khz: i32, cc: (i32, i32)) -> f64 {
    let lanes = match cc {
        (7, _) | (8, 0) => 64.0,
        _ => 128.0,
    };
    f64::from(sms.max(0)) * lanes * 2.0 * f64::from(clock_khz.max(0)) * 1e3 / 1e12
}

/// A model's peak FP32 TFLOPS (the default, 148 SMs at 1965 MHz: 74.4).
pub fn peak_tflops(m: &Model) -> f64 {
    fp32_tflops(m.sms, m.clock_khz, m.cc)
}

/// A stable UUID for emulated device `index` (version-4 layout, fixed bytes).
pub fn uuid(index: u32) -> [u8; 16] {
    let mut u = *b"gpufuse-emu-dev0";
    u[15] = b'0' + (index % 10) as u8;
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_attribute_is_answered_once() {
        for m in MODELS {
            let a = attributes(m, 0);
            assert_eq!(a.len(), 161);
            assert!(a.iter().enumerate().all(|(i, &(id, _))| id == i as i32 + 1));
            let get = |id| a[id as usize - 1].1;
            assert_eq!((get(75), get(76)), m.cc);
            assert_eq!(get(10), 32);
            assert_eq!(get(41), 1);
            assert_eq!(get(115), 1);
            assert!(get(97) <= get(81), "{}: opt-in shared fits an SM", m.like);
            assert_eq!((get(95), get(96)), (1, 0));
            assert!(get(108) > 0 && get(108) < get(38));
        }
        assert_eq!(default_model().cc, CC);
    }

    #[test]
    fn coresident_blocks_follow_occupancy() {
        let m = default_model();
        // 2048 threads per SM: 8 blocks of 256, by threads and registers alike.
        assert_eq!(coresident_blocks(m, 256, 0), 8 * m.sms as u64);
        // 32 blocks per SM at most.
        assert_eq!(coresident_blocks(m, 32, 0), 32 * m.sms as u64);
        // Shared memory: two blocks of 100 KB fit a 228 KB SM.
        assert_eq!(coresident_blocks(m, 64, 100_000), 2 * m.sms as u64);
    }

    #[test]
    fn occupancy_follows_the_allocation_units() {
        let h100 = by_arch(90).unwrap();
        let u = |threads, registers, shared| BlockUse {
            threads,
            registers,
            shared,
        };
        // 255 registers: 8192 a warp, two warps a bank, eight warps an SM: one block of 256.
        assert_eq!(blocks_per_sm(h100, u(256, 255, 0)), 1);
        // 64 registers: 2048 a warp, 32 warps: four blocks of 256.
        assert_eq!(blocks_per_sm(h100, u(256, 64, 0)), 4);
        // A block of 33 threads takes two warps.
        assert_eq!(blocks_per_sm(h100, u(33, 32, 0)), 32);
        assert_eq!(blocks_per_sm(h100, u(65, 32, 0)), 21);
        // Each block's shared memory has 1 KiB reserved on top, in 128-byte units.
        assert_eq!(blocks_per_sm(h100, u(128, 32, 115_000)), 2);
        assert_eq!(blocks_per_sm(h100, u(128, 32, 116_000)), 1);
        assert_eq!(blocks_per_sm(h100, u(0, 32, 0)), 0);
    }

    #[test]
    fn models_by_arch() {
        assert_eq!(by_arch(120).map(|m| m.cc), Some((12, 0)));
        assert!(by_arch(75).is_none());
        assert_eq!(arch_list(), "sm_80, sm_90, sm_100, sm_120, sm_130");
        assert!((peak_tflops(default_model()) - 74.4).abs() < 0.1);
    }
}
