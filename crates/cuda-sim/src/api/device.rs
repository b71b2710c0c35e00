//! Initialization, devices, contexts.

use std::ffi::{c_char, c_int, c_uint, CString};
use std::sync::LazyLock;

use gpufuse_cuda_types::{short as E, CUresult, RESULTS};

use super::{CUdevice, Handle};
use crate::ffi;
use crate::guard::{call, Flow, Need};
use crate::state::{handle, id_of, set_current, Context, Kind};
use crate::tables;

/// Every result's name, NUL-terminated, for `cuGetErrorName`'s static strings.
static NAMES: LazyLock<Vec<(CUresult, CString)>> = LazyLock::new(|| {
    RESULTS
        .iter()
        .filter_map(|&(code, name)| Some((code, CString::new(name).ok()?)))
        .collect()
});

/// Device `ordinal`'s UUID: fixed bytes and the ordinal, shaped as a version-4 UUID.
fn uuid(ordinal: usize) -> [u8; 16] {
    let mut u = *b"gpufuse-sim\0\0\0\0\0";
    u[12..16].copy_from_slice(&(ordinal as u32).to_be_bytes());
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

export! {
    /// `cuInit`: reads the environment (see the crate docs) the first time.
    fn cuInit(flags: c_uint) {
        call(Need::Nothing, |s| {
            s.init(flags)?;
            Ok(Flow::Done)
        })
    }

    /// `cuGetErrorName`.
    fn cuGetErrorName(error: CUresult, p_str: *mut *const c_char) {
        call(Need::Nothing, |_| {
            let name = NAMES.iter().find(|(c, _)| *c == error).map(|(_, n)| n.as_ptr());
            // SAFETY: `p_str` is NULL or writable (this export's contract).
            unsafe { ffi::put(p_str, name.unwrap_or(std::ptr::null())) }?;
            name.map(|_| Flow::Done).ok_or(E::INVALID_VALUE)
        })
    }

    /// `cuDriverGetVersion`: 13000 (CUDA 13.0).
    fn cuDriverGetVersion(version: *mut c_int) {
        call(Need::Nothing, |_| {
            // SAFETY: `version` is NULL or writable (this export's contract).
            unsafe { ffi::put(version, tables::DRIVER_VERSION) }?;
            Ok(Flow::Done)
        })
    }

    /// `cuDeviceGetCount`.
    fn cuDeviceGetCount(count: *mut c_int) {
        call(Need::Init, |s| {
            // SAFETY: `count` is NULL or writable (this export's contract).
            unsafe { ffi::put(count, s.devices.len() as c_int) }?;
            Ok(Flow::Done)
        })
    }

    /// `cuDeviceGet`.
    fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) {
        call(Need::Init, |s| {
            if device.is_null() {
                return Err(E::INVALID_VALUE);
            }
            let d = s.device(ordinal)?;
            // SAFETY: `device` is non-NULL and writable (this export's contract).
            unsafe { ffi::put(device, d as CUdevice) }?;
            Ok(Flow::Done)
        })
    }

    /// `cuDeviceGetName`: "gpufuse simulated GPU".
    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) {
        call(Need::Init, |s| {
            if name.is_null() || len <= 0 {
                return Err(E::INVALID_VALUE);
            }
            s.device(dev)?;
            // SAFETY: `name` is writable for `len` bytes (this export's contract).
            unsafe { ffi::put_str(name, len, tables::DEVICE_NAME) }?;
            Ok(Flow::Done)
        })
    }

    /// `cuDeviceTotalMem_v2`: `GPUFUSE_SIM_MEM`.
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) {
        call(Need::Init, |s| {
            if bytes.is_null() {
                return Err(E::INVALID_VALUE);
            }
            s.device(dev)?;
            // SAFETY: `bytes` is non-NULL and writable (this export's contract).
            unsafe { ffi::put(bytes, s.cfg.mem as usize) }?;
            Ok(Flow::Done)
        })
    }

    /// `cuDeviceGetAttribute`: an H200's figures (see `tables::device_attribute`).
    fn cuDeviceGetAttribute(pi: *mut c_int, attrib: c_int, dev: CUdevice) {
        call(Need::Init, |s| {
            if pi.is_null() {
                return Err(E::INVALID_VALUE);
            }
            let d = s.device(dev)?;
            let v = tables::device_attribute(attrib, d)?;
            // SAFETY: `pi` is non-NULL and writable (this export's contract).
            unsafe { ffi::put(pi, v) }?;
            Ok(Flow::Done)
        })
    }

    /// `cuDeviceGetUuid_v2`: 16 bytes derived from the ordinal.
    fn cuDeviceGetUuid_v2(uuid_out: *mut std::ffi::c_void, dev: CUdevice) {
        call(Need::Init, |s| {
            if uuid_out.is_null() {
                return Err(E::INVALID_VALUE);
            }
            let d = s.device(dev)?;
            // SAFETY: a `CUuuid` is 16 bytes; `uuid_out` is non-NULL and writable for one.
            unsafe { ffi::put(uuid_out.cast::<[u8; 16]>(), uuid(d)) }?;
            Ok(Flow::Done)
        })
    }

    /// `cuDevicePrimaryCtxRetain`.
    fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, dev: CUdevice) {
        call(Need::Init, |s| {
            if pctx.is_null() {
                return Err(E::INVALID_VALUE);
            }
            let d = s.device(dev)?;
            let id = match s.devices[d].primary {
                Some(id) => id,
                None => {
                    let id = s.new_id();
                    s.contexts.insert(
                        id,
                        Context {
                            device: d,
                            null_end: 0,
                            all_end: 0,
                            retired_blocking_end: 0,
                            fault: None,
                        },
                    );
                    s.devices[d].primary = Some(id);
                    id
                }
            };
            // SAFETY: `pctx` is non-NULL and writable (this export's contract).
            unsafe { ffi::put(pctx, handle(Kind::Ctx, id)) }?;
            Ok(Flow::Done)
        })
    }

    /// `cuCtxSetCurrent`: per thread; NULL unsets.
    fn cuCtxSetCurrent(ctx: Handle) {
        call(Need::Init, |s| {
            if ctx.is_null() {
                set_current(0);
                return Ok(Flow::Done);
            }
            let id = id_of(Kind::Ctx, ctx)
                .filter(|id| s.contexts.contains_key(id))
                .ok_or(E::INVALID_CONTEXT)?;
            set_current(id);
            Ok(Flow::Done)
        })
    }

    /// `cuCtxSynchronize`: until all of the current context's work has completed; its pending
    /// asynchronous error, if any.
    fn cuCtxSynchronize() {
        call(Need::Init, |s| {
            let ctx = s.current()?;
            s.stats.ctx_synchronizes += 1;
            s.forbid_during_capture(ctx)?;
            Ok(Flow::Until {
                t: s.contexts[&ctx].all_end,
                fault_ctx: Some(ctx),
            })
        })
    }

    /// `cuCtxGetLimit`: the driver's defaults.
    fn cuCtxGetLimit(pvalue: *mut usize, limit: c_int) {
        call(Need::Init, |s| {
            if pvalue.is_null() {
                return Err(E::INVALID_VALUE);
            }
            s.current()?;
            let v = tables::limit(limit)?;
            // SAFETY: `pvalue` is non-NULL and writable (this export's contract).
            unsafe { ffi::put(pvalue, v) }?;
            Ok(Flow::Done)
        })
    }

    /// `cuCtxGetStreamPriorityRange`: (0, -5); either pointer may be NULL.
    fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) {
        call(Need::Init, |s| {
            s.current()?;
            // SAFETY: each pointer is NULL or writable (this export's contract).
            unsafe {
                ffi::put_opt(least, tables::PRIORITY_LEAST);
                ffi::put_opt(greatest, tables::PRIORITY_GREATEST);
            }
            Ok(Flow::Done)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_differ_by_ordinal() {
        assert_ne!(uuid(0), uuid(1));
        assert_eq!(uuid(3)[6] >> 4, 4);
    }
}
