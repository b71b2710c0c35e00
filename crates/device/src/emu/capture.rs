//! Capturing an emulated device's session state and rebuilding it on a fresh device
//! ([`crate::capture`] describes the image).

use std::collections::HashMap;

use super::{words::Words, EmuDevice};
use crate::capture::{AllocationImage, CaptureRefused, DeviceImage, ModuleImage};
use crate::status::{self, Status};
use crate::Device;

fn refused(status: Status, why: impl Into<String>) -> CaptureRefused {
    CaptureRefused {
        status,
        why: why.into(),
    }
}

pub(super) fn capture(d: &mut EmuDevice) -> Result<DeviceImage, CaptureRefused> {
    capture_with(d, true)
}

/// The layout only: every allocation's contents left empty (rebuilt zeroed).
pub(super) fn capture_layout(d: &mut EmuDevice) -> Result<DeviceImage, CaptureRefused> {
    capture_with(d, false)
}

fn capture_with(d: &mut EmuDevice, contents: bool) -> Result<DeviceImage, CaptureRefused> {
    if !d.evicted.is_empty() {
        return Err(refused(
            status::INVALID_VALUE,
            "some of the session's memory is evicted: bring it back before a capture",
        ));
    }
    if d.allocations.values().any(|w| w.is_shared()) || d.vmm.has_shared(&d.allocations) {
        return Err(CaptureRefused::not_supported(
            "the session has memory another process uses at the same time (managed memory \
             shared with its client's host, a same-host session's cudaMallocManaged, or CUDA \
             IPC memory shared with another session): it cannot be captured, moved or \
             checkpointed",
        ));
    }
    if d.heap.is_some() {
        return Err(CaptureRefused::not_supported(
            "the session's kernels used device-side malloc: the heap's allocator state lives in \
             the interpreter and cannot be captured yet",
        ));
    }
    let allocations = d
        .allocations
        .iter()
        .map(|(&addr, w)| AllocationImage {
            addr,
            size: w.len() as u64,
            contents: if contents { w.to_vec() } else { Vec::new() },
        })
        .collect();
    let (physical, next_physical, reserved) = d.vmm.capture();
    let mut modules: Vec<ModuleImage> = d
        .modules
        .iter()
        .map(|(&id, m)| {
            let mut variables: Vec<(String, u64, u64)> = m
                .variables
                .iter()
                .map(|(n, &(p, s))| (n.clone(), p, s))
                .collect();
            variables.sort();
            ModuleImage {
                id,
                image: m.image.to_vec(),
                variables,
            }
        })
        .collect();
    modules.sort_by_key(|m| m.id);
    let mut textures: Vec<_> = d.texture_descs.iter().map(|(&h, &t)| (h, t)).collect();
    textures.sort_by_key(|t| t.0);
    Ok(DeviceImage {
        window: (d.window_base, d.next, d.window_end),
        allocations,
        physical,
        next_physical,
        reserved,
        modules,
        next_module: d.next_module,
        textures,
        workspace: d.workspace,
    })
}

pub(super) fn rebuild(d: &mut EmuDevice, image: &DeviceImage) -> Result<(), CaptureRefused> {
    if !d.allocations.is_empty() || !d.modules.is_empty() || !d.textures.is_empty() {
        return Err(refused(
            status::INVALID_VALUE,
            "a session is rebuilt on a fresh device only",
        ));
    }
    let (base, next, end) = image.window;
    if base != d.window_base || end != d.window_end || !(base..=end).contains(&next) {
        return Err(refused(
            status::INVALID_VALUE,
            format!(
                "the image's address window {base:#x}..{end:#x} is not this device's \
                 {:#x}..{:#x}",
                d.window_base, d.window_end
            ),
        ));
    }
    let oom = || {
        refused(
            status::OUT_OF_MEMORY,
            "the host has no room for the session",
        )
    };
    for a in &image.allocations {
        // No contents: a layout image ([`crate::Device::capture_layout`]), rebuilt zeroed.
        let layout_only = a.contents.is_empty();
        if (!layout_only && a.contents.len() as u64 != a.size)
            || a.addr < base
            || a.addr.saturating_add(a.size) > end
        {
            return Err(refused(
                status::INVALID_VALUE,
                format!("allocation {:#x} of {} bytes is malformed", a.addr, a.size),
            ));
        }
        let words = if layout_only {
            Words::zeroed(usize::try_from(a.size).map_err(|_| oom())?)
        } else {
            Words::from_bytes(&a.contents)
        };
        d.allocations.insert(a.addr, words.ok_or_else(oom)?);
    }
    d.vmm
        .rebuild(&image.physical, image.next_physical, &image.reserved)
        .map_err(|s| refused(s, "VMM books do not rebuild"))?;
    // Modules load again from their images; the variables `load_module` makes are dropped for
    // the captured ones (their contents came with the allocations above).
    d.next = next;
    for m in &image.modules {
        let fresh = d.load_module(&m.image).map_err(|e| {
            refused(
                e.status,
                format!(
                    "module {} does not load again on this device: {}",
                    m.id,
                    e.detail()
                ),
            )
        })?;
        let mut module = d.modules.remove(&fresh).ok_or_else(oom)?;
        for (ptr, _) in module.variables.values() {
            d.allocations.remove(ptr);
        }
        let mut variables = HashMap::new();
        for (name, ptr, size) in &m.variables {
            if !d.allocations.contains_key(ptr) {
                return Err(refused(
                    status::INVALID_VALUE,
                    format!("module {} variable {name} has no allocation", m.id),
                ));
            }
            variables.insert(name.clone(), (*ptr, *size));
        }
        module.variables = variables;
        d.modules.insert(m.id, module);
    }
    d.next = next;
    d.next_module = image.next_module;
    for (handle, desc) in &image.textures {
        d.create_texture(*handle, desc)
            .map_err(|s| refused(s, format!("texture object {handle:#x} does not rebuild")))?;
    }
    d.workspace = image.workspace;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emu::vmm::GRANULARITY;
    use crate::KernelLaunch;

    const BASE: u64 = 0x2000_0000_0000;
    const WINDOW: u64 = 1 << 40;
    /// A module variable and a kernel that adds to it and writes through a pointer.
    const PTX: &str = ".version 8.0\n.target sm_80\n.address_size 64\n\
        .global .align 4 .u32 counter = 7;\n\
        .visible .entry bump(.param .u64 p)\n{\n.reg .b32 %r<3>;\n.reg .b64 %rd<3>;\n\
        mov.u64 %rd1, counter;\nld.global.u32 %r1, [%rd1];\nadd.u32 %r1, %r1, 1;\n\
        st.global.u32 [%rd1], %r1;\nld.param.u64 %rd2, [p];\nst.global.u32 [%rd2], %r1;\nret;\n}\n\0";

    fn bump(d: &mut EmuDevice, m: u64, out: u64) -> u32 {
        d.launch(&KernelLaunch {
            module: m,
            function: "bump",
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_mem: 0,
            params: &out.to_le_bytes(),
            stream: 0,
            cooperative: false,
            cancel: None,
        })
        .unwrap();
        let mut v = [0u8; 4];
        d.read(out, &mut v).unwrap();
        u32::from_le_bytes(v)
    }

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// Allocations, module variables (after kernels changed them), VMM memory mapped and
    /// unmapped, reservations and texture objects rebuild on another device at the same
    /// addresses and ids, through the encoded image; kernels go on from the same state.
    #[test]
    fn a_session_rebuilds_on_another_device_at_the_same_addresses() {
        let mut a = EmuDevice::new(0, 1 << 30, BASE, WINDOW);
        let m = a.load_module(PTX.as_bytes()).unwrap();
        let out = a.alloc(64).unwrap();
        assert_eq!(bump(&mut a, m, out), 8);
        let big = a.alloc(3 << 20).unwrap();
        a.write(big, &pattern(3 << 20, 1)).unwrap();
        let range = a.reserve(4 * GRANULARITY, 0).unwrap();
        let mapped = a.create_physical(GRANULARITY).unwrap();
        a.map(range, mapped).unwrap();
        a.write(range, &pattern(GRANULARITY as usize, 2)).unwrap();
        let parked = a.create_physical(GRANULARITY).unwrap();
        a.map(range + GRANULARITY, parked).unwrap();
        a.write(range + GRANULARITY + 9, b"parked").unwrap();
        a.unmap(range + GRANULARITY, GRANULARITY).unwrap();
        let desc = gpufuse_proto::TexObjectDesc {
            ptr: gpufuse_proto::DevicePtr(big),
            format: 0x20,
            channels: 1,
            shape: gpufuse_proto::TexShape::Linear,
            width: 1024,
            height: 1,
            depth: 1,
            pitch: 4096,
            sampler: None,
        };
        a.create_texture(0x77, &desc).unwrap();

        let image = a.capture().unwrap();
        let bytes = image.encode();
        let image = DeviceImage::decode(&bytes).unwrap();
        let mut b = EmuDevice::new(1, 1 << 30, BASE, WINDOW);
        b.rebuild(&image).unwrap();

        let mut got = vec![0u8; 3 << 20];
        b.read(big, &mut got).unwrap();
        assert_eq!(got, pattern(3 << 20, 1));
        let mut got = vec![0u8; GRANULARITY as usize];
        b.read(range, &mut got).unwrap();
        assert_eq!(got, pattern(GRANULARITY as usize, 2));
        assert_eq!(
            b.global(m, "counter").unwrap(),
            a.global(m, "counter").unwrap()
        );
        assert_eq!(bump(&mut b, m, out), 9, "the variable kept its value");
        // The parked physical memory maps again with its data; the texture handle exists.
        b.map(range + 2 * GRANULARITY, parked).unwrap();
        let mut word = [0u8; 6];
        b.read(range + 2 * GRANULARITY + 9, &mut word).unwrap();
        assert_eq!(&word, b"parked");
        b.destroy_texture(0x77).unwrap();
        // New allocations do not collide with rebuilt ones.
        let next = b.alloc(16).unwrap();
        assert!(next >= image.window.1);
        assert_eq!(b.load_module(PTX.as_bytes()).unwrap(), image.next_module);

        // A rebuild needs a fresh device of the same window.
        assert!(b.rebuild(&image).is_err());
        let mut elsewhere = EmuDevice::new(1, 1 << 30, BASE + WINDOW, WINDOW);
        assert!(elsewhere.rebuild(&image).is_err());
        let mut wrong = bytes.clone();
        wrong[8] = 9;
        assert!(matches!(
            DeviceImage::decode(&wrong),
            Err(crate::capture::ImageError::Version(9))
        ));
    }

    /// A module with a kernel that calls device `malloc` and one that does not: launching the
    /// plain one makes no heap (the session stays movable, with nothing the application did
    /// not ask for); once the other runs, a capture refuses with the reason.
    #[test]
    fn only_a_kernel_that_reaches_malloc_makes_the_session_unmovable() {
        const HEAP_PTX: &str = ".version 8.0\n.target sm_80\n.address_size 64\n\
            .extern .func (.param .b64 func_retval0) malloc(.param .b64 malloc_param_0);\n\
            .visible .entry plain(.param .u64 p)\n{\n.reg .b32 %r<2>;\n.reg .b64 %rd<2>;\n\
            ld.param.u64 %rd1, [p];\nmov.u32 %r1, 5;\nst.global.u32 [%rd1], %r1;\nret;\n}\n\
            .func (.param .b64 r) take(.param .b64 n)\n{\n.reg .b64 %rd<3>;\n\
            ld.param.u64 %rd1, [n];\n{\n.param .b64 a0;\nst.param.b64 [a0], %rd1;\n\
            .param .b64 r0;\ncall.uni (r0), malloc, (a0);\nld.param.b64 %rd2, [r0];\n}\n\
            st.param.b64 [r], %rd2;\nret;\n}\n\
            .visible .entry grab(.param .u64 p)\n{\n.reg .b64 %rd<3>;\n\
            ld.param.u64 %rd1, [p];\n{\n.param .b64 a0;\nst.param.b64 [a0], 16;\n\
            .param .b64 r0;\ncall.uni (r0), take, (a0);\nld.param.b64 %rd2, [r0];\n}\n\
            st.global.u64 [%rd1], %rd2;\nret;\n}\n\0";
        let mut d = EmuDevice::new(0, 1 << 30, BASE, WINDOW);
        let m = d.load_module(HEAP_PTX.as_bytes()).unwrap();
        let out = d.alloc(64).unwrap();
        let launch = |d: &mut EmuDevice, function| {
            d.launch(&KernelLaunch {
                module: m,
                function,
                grid: [1, 1, 1],
                block: [1, 1, 1],
                shared_mem: 0,
                params: &out.to_le_bytes(),
                stream: 0,
                cooperative: false,
                cancel: None,
            })
            .unwrap();
        };
        launch(&mut d, "plain");
        let ranges = d.resident().len();
        d.capture().expect("no heap: the session can move");
        launch(&mut d, "grab");
        let mut p = [0u8; 8];
        d.read(out, &mut p).unwrap();
        assert_ne!(
            u64::from_le_bytes(p),
            0,
            "malloc (through a call) gave a block"
        );
        assert_eq!(
            d.resident().len(),
            ranges + 1,
            "the heap, a range of its own"
        );
        let e = d.capture().unwrap_err();
        assert_eq!(e.status, status::NOT_SUPPORTED);
        assert!(e.why.contains("device-side malloc"), "{}", e.why);
        assert!(d.capture_layout().is_err());
    }

    /// Evicted contents leave device memory and come back at the same address, intact; a
    /// capture waits for them.
    #[test]
    fn evicted_contents_come_back_at_the_same_address() {
        let mut d = EmuDevice::new(0, 1 << 30, BASE, WINDOW);
        let p = d.alloc(100_003).unwrap();
        d.write(p, &pattern(100_003, 5)).unwrap();
        assert_eq!(d.resident(), vec![(p, 100_003)]);
        let away = d.evict(p).unwrap();
        assert!(d.resident().is_empty() && !d.contains(p, 1));
        assert!(d.capture().is_err());
        assert_eq!(d.bring_back(p, &away[1..]), Err(status::INVALID_VALUE));
        d.bring_back(p, &away).unwrap();
        let mut got = vec![0u8; 100_003];
        d.read(p, &mut got).unwrap();
        assert_eq!(got, pattern(100_003, 5));
    }

    /// A layout image rebuilds the ranges zeroed at the same addresses (pre-copy fills them);
    /// a launch reports the ranges it looked up and not the ones it never reached.
    #[test]
    fn a_layout_rebuilds_zeroed_and_launches_name_what_they_touched() {
        let mut a = EmuDevice::new(0, 1 << 30, BASE, WINDOW);
        let m = a.load_module(PTX.as_bytes()).unwrap();
        let out = a.alloc(64).unwrap();
        let untouched = a.alloc(1 << 20).unwrap();
        a.write(untouched, &pattern(1 << 20, 3)).unwrap();
        assert_eq!(a.last_launch_touched(), Some(vec![]));
        assert_eq!(bump(&mut a, m, out), 8);
        let (counter, _) = a.global(m, "counter").unwrap();
        let mut touched = a.last_launch_touched().unwrap();
        touched.sort();
        let mut want = vec![out, counter];
        want.sort();
        assert_eq!(
            touched, want,
            "the variable and the output, not the big range"
        );

        let layout = a.capture_layout().unwrap();
        assert!(layout.allocations.iter().all(|x| x.contents.is_empty()));
        let mut b = EmuDevice::new(1, 1 << 30, BASE, WINDOW);
        b.rebuild(&layout).unwrap();
        assert_eq!(b.resident(), a.resident());
        let mut got = vec![1u8; 1 << 20];
        b.read(untouched, &mut got).unwrap();
        assert!(got.iter().all(|&x| x == 0));
        b.write(untouched, a.view(untouched, 1 << 20).unwrap())
            .unwrap();
        b.write(counter, a.view(counter, 4).unwrap()).unwrap();
        assert_eq!(bump(&mut b, m, out), 9);
        b.read(untouched, &mut got).unwrap();
        assert_eq!(got, pattern(1 << 20, 3));
    }
}
