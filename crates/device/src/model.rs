//! The emulated GPU's device model: an NVIDIA B200-class GPU (compute capability 10.0, 148 SMs)
//! as the CUDA driver describes it, with the memory the server was configured with. 10.0 because
//! the VM runs PTX, and a driver refuses PTX that targets a newer architecture than the device:
//! libraries built for many architectures (CuPy's CUB, for one) embed PTX only for the newest
//! (`compute_100`), and every older PTX target still loads on a 10.0 device. Features the
//! emulated GPU does not have (textures, surfaces, peer access, managed memory, mapped host
//! memory, IPC, cooperative launches) are reported as absent (0).

/// Compute capability: the PTX that nvcc, NVRTC and CuPy emit for it is what the VM runs.
pub const CC: (i32, i32) = (10, 0);
/// Shared memory per block without opting in, and the opt-in maximum (bytes).
pub const SHARED_PER_BLOCK: i32 = 49152;
pub const SHARED_PER_BLOCK_OPTIN: i32 = 232448;
pub const NAME: &str = "gpufuse emulated GPU";
/// PCI domain, bus and device of emulated device `index` (also in the integrity check).
pub fn pci(index: u32) -> (u32, u32, u32) {
    (0, 0x40 + index, 0)
}

/// Every `CUdevice_attribute` id from 1 to 161 (CUDA 13.5) and its value.
pub fn attributes(index: u32) -> Vec<(i32, i32)> {
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
        (13, 1965000),         // clock rate, kHz
        (14, 512),             // texture alignment
        (15, 1),               // gpu overlap
        (16, 148),             // multiprocessors
        (17, 0),               // kernel exec timeout
        (18, 0),               // integrated
        (19, 0),               // can map host memory: no (the device may be on another host)
        (20, 0),               // compute mode default
        (30, 512),             // surface alignment
        (31, 1),               // concurrent kernels
        (32, 0),               // ECC
        (33, bus as i32),
        (34, device as i32),
        (35, 0),         // TCC
        (36, 3996000),   // memory clock, kHz
        (37, 8192),      // memory bus width
        (38, 132120576), // L2 cache, bytes
        (39, 2048),      // max threads per multiprocessor
        (40, 3),         // async engines
        (41, 1),         // unified addressing
        (50, domain as i32),
        (51, 32), // texture pitch alignment
        (75, CC.0),
        (76, CC.1),
        (78, 1),      // stream priorities
        (79, 1),      // global L1 cache
        (80, 1),      // local L1 cache
        (81, 233472), // shared memory per multiprocessor
        (82, 65536),  // registers per multiprocessor
        (83, 0),      // managed memory: no
        (84, 0),      // multi-GPU board
        (85, 0),
        (86, 0), // host native atomics
        (87, 2), // single:double performance ratio
        (88, 0), // pageable memory access
        (89, 0), // concurrent managed access
        (90, 1), // compute preemption
        (91, 0),
        (95, 0), // cooperative launch: no (not yet in the VM)
        (96, 0),
        (97, SHARED_PER_BLOCK_OPTIN),
        (98, 0),
        (99, 1),     // host register supported
        (102, 0),    // virtual memory management: not exposed to clients yet
        (106, 32),   // max blocks per multiprocessor
        (108, 0),    // max persisting L2
        (109, 0),    // max access policy window
        (111, 1024), // reserved shared memory per block
        (115, 1),    // memory pools supported
        (119, 0),    // mempool handle types
        (120, 0),    // cluster launch
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

/// A stable UUID for emulated device `index` (version-4 layout, fixed bytes).
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

/// The emulated GPU's peak FP32 TFLOPS, from its model (148 SMs at 1965 MHz: 74.4).
pub fn peak_tflops() -> f64 {
    let attr = |a: i32| {
        attributes(0)
            .iter()
            .find(|(k, _)| *k == a)
            .map_or(0, |&(_, v)| v)
    };
    fp32_tflops(attr(16), attr(13), CC)
}

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
        let a = attributes(0);
        assert_eq!(a.len(), 161);
        assert!(a.iter().enumerate().all(|(i, &(id, _))| id == i as i32 + 1));
        let get = |id| a[id as usize - 1].1;
        assert_eq!((get(75), get(76)), CC);
        assert_eq!(get(10), 32);
        assert_eq!(get(41), 1);
        assert_eq!(get(115), 1);
    }
}
