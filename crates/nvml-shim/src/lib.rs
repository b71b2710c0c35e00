//! gpufuse's `libnvidia-ml.so.1`: NVML as an application sees its virtual GPU.
//!
//! Devices, names and UUIDs are the gpufuse node's; memory is the calling process's slice when
//! it has a CUDA session (total = its limit, used = what it holds), the device's otherwise;
//! utilization is the session's share of measured device time. Data comes from a one-shot
//! status query to `GPUFUSE_SERVER`, refreshed at most every 100 ms.
//!
//! `nvmlInit` connects and `nvmlShutdown` forgets; nothing happens at load and nothing at exit,
//! so a dead server can never crash an application on its way out.
//!
//! Implemented: devices, the session's memory slice, processes. Every other function of
//! NVIDIA's `nvml.h` is exported too and answers `NVML_ERROR_NOT_SUPPORTED`: `src/generated.rs`
//! and the table `nvml_functions.tsv`, written by `scripts/gen_nvml_exports.py` and checked by
//! `scripts/run-real-clients.sh`.

#![allow(
    non_snake_case,
    non_camel_case_types,
    clippy::missing_safety_doc,
    clippy::not_unsafe_ptr_arg_deref
)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpufuse_proto::{DeviceStatus, NodeStatus};

/// Every other function of NVML's public header (scripts/gen_nvml_exports.py).
pub mod generated;

pub type nvmlReturn_t = c_int;
pub type nvmlDevice_t = *mut c_void;

pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_DRIVER_NOT_LOADED: nvmlReturn_t = 9;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

const REFRESH: Duration = Duration::from_millis(100);
const HANDLE_BASE: usize = 0x6f75_0000;

struct State {
    refs: u32,
    status: Option<(Instant, NodeStatus)>,
}

static STATE: Mutex<State> = Mutex::new(State {
    refs: 0,
    status: None,
});

fn lock() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn fetch() -> Result<NodeStatus, nvmlReturn_t> {
    let addr = std::env::var("GPUFUSE_SERVER").map_err(|_| NVML_ERROR_DRIVER_NOT_LOADED)?;
    let addr = addr.parse().map_err(|_| NVML_ERROR_DRIVER_NOT_LOADED)?;
    let token = std::env::var("GPUFUSE_TOKEN").unwrap_or_default();
    gpufuse_client::Connection::query_status(&addr, token).map_err(|_| NVML_ERROR_DRIVER_NOT_LOADED)
}

/// The current status (refreshed when stale); fails unless initialized.
fn status() -> Result<NodeStatus, nvmlReturn_t> {
    let mut s = lock();
    if s.refs == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    match &s.status {
        Some((t, st)) if t.elapsed() < REFRESH => Ok(st.clone()),
        _ => {
            let st = fetch()?;
            s.status = Some((Instant::now(), st.clone()));
            Ok(st)
        }
    }
}

/// What every function the virtual GPU has no value for answers: `NVML_ERROR_UNINITIALIZED`
/// before `nvmlInit`, `NVML_ERROR_NOT_SUPPORTED` after, as NVIDIA's library does for a query
/// the device lacks.
pub fn not_supported() -> nvmlReturn_t {
    if lock().refs == 0 {
        NVML_ERROR_UNINITIALIZED
    } else {
        NVML_ERROR_NOT_SUPPORTED
    }
}

fn guard(f: impl FnOnce() -> Result<(), nvmlReturn_t>) -> nvmlReturn_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

fn out<T>(p: *mut T, v: T) -> Result<(), nvmlReturn_t> {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-NULL; NVML's contract says it points to writable storage for a T.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

fn out_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), nvmlReturn_t> {
    if buf.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if s.len() + 1 > len as usize {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: NVML's contract: `buf` holds `len` bytes; we write s.len() + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

fn device(st: &NodeStatus, h: nvmlDevice_t) -> Result<&DeviceStatus, nvmlReturn_t> {
    let i = (h as usize)
        .checked_sub(HANDLE_BASE)
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    st.devices.get(i).ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

/// (total, used) as this process sees the device: its session's slice if it has one.
fn memory(st: &NodeStatus, d: &DeviceStatus) -> (u64, u64) {
    let pid = std::process::id();
    let mine = st
        .sessions
        .iter()
        .find(|s| s.pid == pid && s.device == d.index);
    match mine {
        Some(s) => (s.limit_bytes.unwrap_or(d.total_bytes), s.used_bytes),
        None => {
            let limit = std::env::var("GPUFUSE_VRAM")
                .ok()
                .and_then(|v| v.parse::<u64>().ok());
            match limit {
                Some(l) => (l.min(d.total_bytes), 0),
                None => (d.total_bytes, d.used_bytes),
            }
        }
    }
}

fn init() -> Result<(), nvmlReturn_t> {
    let st = fetch()?;
    let mut s = lock();
    s.refs += 1;
    s.status = Some((Instant::now(), st));
    Ok(())
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    guard(init)
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> nvmlReturn_t {
    guard(init)
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    guard(init)
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guard(|| {
        let mut s = lock();
        if s.refs == 0 {
            return Err(NVML_ERROR_UNINITIALIZED);
        }
        s.refs -= 1;
        if s.refs == 0 {
            s.status = None;
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(r: nvmlReturn_t) -> *const c_char {
    let s: &'static [u8] = match r {
        NVML_SUCCESS => b"Success\0",
        NVML_ERROR_UNINITIALIZED => b"Uninitialized\0",
        NVML_ERROR_INVALID_ARGUMENT => b"Invalid Argument\0",
        NVML_ERROR_NOT_SUPPORTED => b"Not Supported\0",
        NVML_ERROR_NOT_FOUND => b"Not Found\0",
        NVML_ERROR_INSUFFICIENT_SIZE => b"Insufficient Size\0",
        NVML_ERROR_DRIVER_NOT_LOADED => b"Driver Not Loaded (gpufuse server unreachable)\0",
        _ => b"Unknown Error\0",
    };
    s.as_ptr().cast()
}

#[no_mangle]
pub extern "C" fn nvmlSystemGetDriverVersion(buf: *mut c_char, len: c_uint) -> nvmlReturn_t {
    guard(|| out_str(buf, len, "580.00-gpufuse"))
}

#[no_mangle]
pub extern "C" fn nvmlSystemGetNVMLVersion(buf: *mut c_char, len: c_uint) -> nvmlReturn_t {
    guard(|| out_str(buf, len, "13.580.00"))
}

#[no_mangle]
pub extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> nvmlReturn_t {
    guard(|| out(v, 13050))
}

#[no_mangle]
pub extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> nvmlReturn_t {
    guard(|| out(v, 13050))
}

fn count(n: *mut c_uint) -> Result<(), nvmlReturn_t> {
    out(n, status()?.devices.len() as c_uint)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetCount_v2(n: *mut c_uint) -> nvmlReturn_t {
    guard(|| count(n))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetCount(n: *mut c_uint) -> nvmlReturn_t {
    guard(|| count(n))
}

fn by_index(i: c_uint, h: *mut nvmlDevice_t) -> Result<(), nvmlReturn_t> {
    if i as usize >= status()?.devices.len() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    out(h, (HANDLE_BASE + i as usize) as nvmlDevice_t)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByIndex_v2(i: c_uint, h: *mut nvmlDevice_t) -> nvmlReturn_t {
    guard(|| by_index(i, h))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByIndex(i: c_uint, h: *mut nvmlDevice_t) -> nvmlReturn_t {
    guard(|| by_index(i, h))
}

use gpufuse_proto::uuid_text as uuid_string;

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    h: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        if uuid.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: NVML's contract: a NUL-terminated string.
        let want = unsafe { std::ffi::CStr::from_ptr(uuid) }
            .to_string_lossy()
            .into_owned();
        let st = status()?;
        let i = st
            .devices
            .iter()
            .position(|d| uuid_string(&d.uuid) == want)
            .ok_or(NVML_ERROR_NOT_FOUND)?;
        out(h, (HANDLE_BASE + i) as nvmlDevice_t)
    })
}

/// Parses a PCI bus id as NVML accepts it (`domain:bus:device.function`, the domain
/// optional, any width of hex digits) into (domain, bus, device).
fn parse_bus_id(s: &str) -> Option<(u32, u32, u32)> {
    let (head, function) = s.rsplit_once('.')?;
    u32::from_str_radix(function, 16).ok()?;
    let parts: Vec<&str> = head.split(':').collect();
    let hex = |p: &str| u32::from_str_radix(p, 16).ok();
    match parts.as_slice() {
        [d, b, v] => Some((hex(d)?, hex(b)?, hex(v)?)),
        [b, v] => Some((0, hex(b)?, hex(v)?)),
        _ => None,
    }
}

fn by_bus_id(id: *const c_char, h: *mut nvmlDevice_t) -> Result<(), nvmlReturn_t> {
    if id.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: NVML's contract: a NUL-terminated string.
    let want = unsafe { std::ffi::CStr::from_ptr(id) }.to_string_lossy();
    let want = parse_bus_id(want.trim()).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    let st = status()?;
    let i = st
        .devices
        .iter()
        .position(|d| d.pci == want)
        .ok_or(NVML_ERROR_NOT_FOUND)?;
    out(h, (HANDLE_BASE + i) as nvmlDevice_t)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    id: *const c_char,
    h: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| by_bus_id(id, h))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByPciBusId(
    id: *const c_char,
    h: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| by_bus_id(id, h))
}

/// `nvmlGpuP2PStatus_t`: `NVML_P2P_STATUS_OK` and `NVML_P2P_STATUS_NOT_SUPPORTED`.
const P2P_STATUS_OK: c_uint = 0;
const P2P_STATUS_NOT_SUPPORTED: c_uint = 5;

/// Peer-to-peer status between two of the session's devices, for every capability: a device
/// with itself is OK (NCCL asks every pair, itself included, and gives up on an error); two
/// devices have no peer access, as `cuDeviceCanAccessPeer` answers.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetP2PStatus(
    a: nvmlDevice_t,
    b: nvmlDevice_t,
    _index: c_uint,
    p2p: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let st = status()?;
        let (a, b) = (device(&st, a)?.index, device(&st, b)?.index);
        out(
            p2p,
            if a == b {
                P2P_STATUS_OK
            } else {
                P2P_STATUS_NOT_SUPPORTED
            },
        )
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetIndex(h: nvmlDevice_t, i: *mut c_uint) -> nvmlReturn_t {
    guard(|| {
        let st = status()?;
        out(i, device(&st, h)?.index)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetName(
    h: nvmlDevice_t,
    buf: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let st = status()?;
        out_str(buf, len, &device(&st, h)?.name)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetUUID(
    h: nvmlDevice_t,
    buf: *mut c_char,
    len: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let st = status()?;
        out_str(buf, len, &uuid_string(&device(&st, h)?.uuid))
    })
}

/// `nvmlMemory_t`.
#[repr(C)]
pub struct nvmlMemory_t {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetMemoryInfo(h: nvmlDevice_t, m: *mut nvmlMemory_t) -> nvmlReturn_t {
    guard(|| {
        let st = status()?;
        let (total, used) = memory(&st, device(&st, h)?);
        out(
            m,
            nvmlMemory_t {
                total,
                free: total.saturating_sub(used),
                used,
            },
        )
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    h: nvmlDevice_t,
    m: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    guard(|| {
        let st = status()?;
        let (total, used) = memory(&st, device(&st, h)?);
        if m.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-NULL; the caller set `version` and owns the struct.
        let version = unsafe { (*m).version };
        out(
            m,
            nvmlMemory_v2_t {
                version,
                total,
                reserved: 0,
                free: total.saturating_sub(used),
                used,
            },
        )
    })
}

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetUtilizationRates(
    h: nvmlDevice_t,
    u: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    guard(|| {
        let st = status()?;
        let d = device(&st, h)?;
        let pid = std::process::id();
        let gpu = st
            .sessions
            .iter()
            .find(|s| s.pid == pid && s.device == d.index)
            .map_or(d.utilization_percent, |s| s.utilization_percent);
        let (total, used) = memory(&st, d);
        let mem = (used * 100).checked_div(total).unwrap_or(0) as c_uint;
        out(u, nvmlUtilization_t { gpu, memory: mem })
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetCudaComputeCapability(
    h: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    guard(|| {
        let st = status()?;
        let (a, b) = device(&st, h)?.compute_capability;
        out(major, a as c_int)?;
        out(minor, b as c_int)
    })
}

/// `nvmlPciInfo_t`.
#[repr(C)]
pub struct nvmlPciInfo_t {
    pub bus_id_legacy: [u8; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub bus_id: [u8; 32],
}

fn pci_info(h: nvmlDevice_t, p: *mut nvmlPciInfo_t) -> Result<(), nvmlReturn_t> {
    let st = status()?;
    let (domain, bus, dev) = device(&st, h)?.pci;
    let id = format!("{domain:08x}:{bus:02x}:{dev:02x}.0");
    let mut legacy = [0u8; 16];
    let short = format!("{domain:04x}:{bus:02x}:{dev:02x}.0");
    legacy[..short.len().min(15)].copy_from_slice(&short.as_bytes()[..short.len().min(15)]);
    let mut full = [0u8; 32];
    full[..id.len().min(31)].copy_from_slice(&id.as_bytes()[..id.len().min(31)]);
    out(
        p,
        nvmlPciInfo_t {
            bus_id_legacy: legacy,
            domain,
            bus,
            device: dev,
            pci_device_id: 0x20b0_10de,
            pci_sub_system_id: 0,
            bus_id: full,
        },
    )
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetPciInfo_v3(h: nvmlDevice_t, p: *mut nvmlPciInfo_t) -> nvmlReturn_t {
    guard(|| pci_info(h, p))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetPciInfo_v2(h: nvmlDevice_t, p: *mut nvmlPciInfo_t) -> nvmlReturn_t {
    guard(|| pci_info(h, p))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetPciInfo(h: nvmlDevice_t, p: *mut nvmlPciInfo_t) -> nvmlReturn_t {
    guard(|| pci_info(h, p))
}

/// `nvmlProcessInfo_t` (v2/v3 layout).
#[repr(C)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
}

/// The sessions on device `h` (each a process of the virtual GPU), written as `T`s.
fn processes<T>(
    h: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(c_uint, u64) -> T,
) -> Result<(), nvmlReturn_t> {
    let st = status()?;
    let d = device(&st, h)?;
    let procs: Vec<_> = st.sessions.iter().filter(|s| s.device == d.index).collect();
    if count.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-NULL; NVML's contract: the capacity of `infos`.
    let cap = unsafe { *count } as usize;
    out(count, procs.len() as c_uint)?;
    if cap < procs.len() {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if !procs.is_empty() && infos.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    for (i, s) in procs.iter().enumerate() {
        // SAFETY: `infos` holds `cap` >= procs.len() entries.
        unsafe { infos.add(i).write_unaligned(make(s.pid, s.used_bytes)) };
    }
    Ok(())
}

fn process_v2(pid: c_uint, used: u64) -> nvmlProcessInfo_t {
    nvmlProcessInfo_t {
        pid,
        used_gpu_memory: used,
        gpu_instance_id: u32::MAX,
        compute_instance_id: u32::MAX,
    }
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    h: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    guard(|| processes(h, count, infos, process_v2))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    h: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    guard(|| processes(h, count, infos, process_v2))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    h: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    guard(|| {
        processes(h, count, infos, |pid, used| nvmlProcessInfo_v1_t {
            pid,
            used_gpu_memory: used,
        })
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetTemperature(
    h: nvmlDevice_t,
    _sensor: c_int,
    t: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        device(&status()?, h)?;
        out(t, 40)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetPowerUsage(_h: nvmlDevice_t, _mw: *mut c_uint) -> nvmlReturn_t {
    NVML_ERROR_NOT_SUPPORTED
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetMinorNumber(h: nvmlDevice_t, n: *mut c_uint) -> nvmlReturn_t {
    guard(|| {
        let st = status()?;
        out(n, device(&st, h)?.index)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetComputeMode(h: nvmlDevice_t, m: *mut c_int) -> nvmlReturn_t {
    guard(|| {
        device(&status()?, h)?;
        out(m, 0)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetPersistenceMode(h: nvmlDevice_t, m: *mut c_int) -> nvmlReturn_t {
    guard(|| {
        device(&status()?, h)?;
        out(m, 1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_before_init_are_uninitialized_not_crashes() {
        let mut n = 0;
        assert_eq!(nvmlDeviceGetCount_v2(&mut n), NVML_ERROR_UNINITIALIZED);
        assert_eq!(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
    }

    #[test]
    fn bus_ids_parse_in_every_form_nvml_accepts() {
        assert_eq!(parse_bus_id("00000000:40:00.0"), Some((0, 0x40, 0)));
        assert_eq!(parse_bus_id("0000:40:00.0"), Some((0, 0x40, 0)));
        assert_eq!(parse_bus_id("40:1f.0"), Some((0, 0x40, 0x1f)));
        assert_eq!(parse_bus_id("40:00"), None);
        assert_eq!(parse_bus_id("zz:00.0"), None);
    }

    #[test]
    fn every_function_of_the_header_is_exported() {
        // The generated table covers the header; lib.rs's hand-written ones are among them.
        assert!(generated::ALL.len() > 400);
        assert!(generated::ALL.contains(&"nvmlDeviceGetNvLinkRemoteDeviceType"));
        assert_eq!(
            generated::nvmlDeviceGetNvLinkRemoteDeviceType(),
            NVML_ERROR_UNINITIALIZED
        );
    }

    #[test]
    fn uuids_print_like_nvidia_smi() {
        let u = [
            0x67, 0x22, 0xcb, 0xcf, 0xc6, 0x61, 0xf2, 0x92, 0x74, 0xd6, 0xed, 0x23, 0x2a, 0x32,
            0x13, 0x1c,
        ];
        assert_eq!(uuid_string(&u), "GPU-6722cbcf-c661-f292-74d6-ed232a32131c");
    }
}
