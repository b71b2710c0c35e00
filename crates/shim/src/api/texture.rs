//! Texture and surface objects (`cuTexObjectCreate`, `cuSurfObjectCreate`; libcudart's
//! `cudaCreateTextureObject`/`cudaCreateSurfaceObject` call them) over CUDA arrays (1-D, 2-D,
//! 3-D and layered), linear memory and pitched 2-D memory.
//!
//! The client mints the handle (the value kernels get as a `.u64` parameter) and registers the
//! object with the worker (`TexObjectCreate`, synchronous: a bad descriptor fails here), which
//! keeps a table the VM consults when a kernel runs `tex`, `tld4`, `suld`, `sust`, `txq` or
//! `suq` (crates/ptx/src/tex.rs); `TexObjectDestroy` (quiet, ordered after earlier launches)
//! removes it, and a later kernel using the handle fails with `CUDA_ERROR_ILLEGAL_ADDRESS`.
//! The object reads the memory in place, so copies into the array are seen by later kernels.
//!
//! What the emulated GPU does not do is an error naming it (with `GPUFUSE_LOG` set), never
//! ignored: mipmapped arrays, sRGB, anisotropic filtering, seamless cubemap filtering, resource
//! views that change the format or select part of the array, and unknown flags.

use std::ffi::{c_int, c_uint};

use gpufuse_client::handles::{self, Kind};
use gpufuse_client::state::{ArrayInfo, Inner};
use gpufuse_proto::{TexObjectDesc, TexSampler, TexShape};

use crate::api::array::CUarray;
use crate::api::context::client_err;
use crate::ffi::{out, read};
use crate::global::{session, with_core};
use crate::guard::guard;
use crate::status::{CUresult, INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED};
use gpufuse_proto::DevicePtr;

pub type CUtexObject = u64;
pub type CUsurfObject = u64;

/// `CUDA_RESOURCE_DESC`: the type, a union of the resources, flags (generated from NVIDIA's
/// header, as are the two below).
pub type ResourceDesc = gpufuse_cuda_types::structs::CUDA_RESOURCE_DESC;

/// `CUDA_TEXTURE_DESC`.
pub type TextureDesc = gpufuse_cuda_types::structs::CUDA_TEXTURE_DESC;

/// `CUDA_RESOURCE_VIEW_DESC`.
pub type ResourceViewDesc = gpufuse_cuda_types::structs::CUDA_RESOURCE_VIEW_DESC;

const RESOURCE_TYPE_ARRAY: c_int = 0;
const RESOURCE_TYPE_MIPMAPPED_ARRAY: c_int = 1;
const RESOURCE_TYPE_LINEAR: c_int = 2;
const RESOURCE_TYPE_PITCH2D: c_int = 3;

const TRSF_READ_AS_INTEGER: c_uint = 0x01;
const TRSF_NORMALIZED_COORDINATES: c_uint = 0x02;
const TRSF_SRGB: c_uint = 0x10;
const TRSF_DISABLE_TRILINEAR_OPTIMIZATION: c_uint = 0x20;
const TRSF_SEAMLESS_CUBEMAP: c_uint = 0x40;

const ARRAY3D_LAYERED: u32 = 0x01;
const ARRAY3D_SURFACE_LDST: u32 = 0x02;
const ARRAY3D_CUBEMAP: u32 = 0x04;

/// Texture alignment and texture pitch alignment the device reports (attributes 14 and 51).
const TEXTURE_ALIGNMENT: u64 = 512;
const TEXTURE_PITCH_ALIGNMENT: u64 = 32;

/// Says once on stderr (with `GPUFUSE_LOG` set) what the emulated GPU refused, and returns
/// `status`.
fn refuse(what: &str, status: CUresult) -> CUresult {
    if std::env::var_os("GPUFUSE_LOG").is_some() {
        eprintln!("gpufuse: texture/surface objects: {what} is not supported");
    }
    status
}

/// The descriptors an object was created with (kept in [`TexObjectInfo::descriptors`]).
#[derive(Clone, Copy)]
struct Descriptors {
    resource: ResourceDesc,
    texture: Option<TextureDesc>,
    view: Option<ResourceViewDesc>,
}

// SAFETY: the descriptors are the application's bytes, kept to be handed back; the pointers in
// them (array handles) are values the shim looks up in its tables, never dereferenced here.
unsafe impl Send for Descriptors {}
// SAFETY: as above; nothing reachable through a shared `Descriptors` is ever dereferenced.
unsafe impl Sync for Descriptors {}

fn format_bytes(format: c_int) -> Option<u64> {
    Some(match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => return None,
    })
}

/// The memory, format and shape a resource descriptor names.
fn resource(g: &Inner, r: &ResourceDesc, surface: bool) -> Result<TexObjectDesc, CUresult> {
    if r.flags != 0 {
        return Err(INVALID_VALUE);
    }
    let fmt = |format: c_int, channels: c_uint| -> Result<(c_int, u32, u64), CUresult> {
        let bytes = format_bytes(format).ok_or_else(|| {
            refuse(
                &format!("array format {format:#x} (only 8/16/32-bit integers, half and float)"),
                INVALID_VALUE,
            )
        })?;
        if !matches!(channels, 1 | 2 | 4) {
            return Err(INVALID_VALUE);
        }
        Ok((format, channels, bytes * u64::from(channels)))
    };
    let blank = |ptr, format, channels, shape, (width, height, depth), pitch| TexObjectDesc {
        ptr,
        format,
        channels,
        shape,
        width,
        height,
        depth,
        pitch,
        sampler: None,
    };
    // SAFETY (each read of `r.res` below): every member of the union is plain data (integers,
    // pointers used only as handles), so any bits the application wrote are a valid value.
    match r.res_type {
        RESOURCE_TYPE_ARRAY => {
            // SAFETY: see above.
            let h_array: CUarray = unsafe { r.res.array.h_array };
            let a: ArrayInfo = crate::api::array::array(g, h_array)?;
            let cubemap = a.flags & ARRAY3D_CUBEMAP != 0;
            let layered_cubemap = cubemap && a.flags & ARRAY3D_LAYERED != 0;
            if cubemap
                && (a.width != a.height
                    || (!layered_cubemap && a.depth != 6)
                    || (layered_cubemap && (a.depth == 0 || !a.depth.is_multiple_of(6))))
            {
                // A cubemap is six square faces, a layered one six per cubemap.
                return Err(INVALID_VALUE);
            }
            if surface && a.flags & ARRAY3D_SURFACE_LDST == 0 {
                // CUDA requires CUDA_ARRAY3D_SURFACE_LDST (cudaArraySurfaceLoadStore).
                return Err(INVALID_VALUE);
            }
            // A cubemap's faces are the six layers of a 2-D layered array (cubemap `n` of a
            // layered one: layers 6n..6n+6); `tex.cube`/`tex.acube` pick the face from the
            // direction they are given.
            let layered = a.flags & ARRAY3D_LAYERED != 0 || cubemap;
            let shape = match (layered, a.height, a.depth) {
                (false, 0, _) => TexShape::D1,
                (false, _, 0) => TexShape::D2,
                (false, _, _) => TexShape::D3,
                (true, 0, _) => TexShape::Layered1,
                (true, _, _) => TexShape::Layered2,
            };
            Ok(blank(
                DevicePtr(a.ptr),
                a.format,
                a.channels,
                shape,
                (a.width, a.height.max(1), a.depth.max(1)),
                a.pitch,
            ))
        }
        RESOURCE_TYPE_MIPMAPPED_ARRAY => Err(refuse("a mipmapped array", NOT_SUPPORTED)),
        RESOURCE_TYPE_LINEAR | RESOURCE_TYPE_PITCH2D if surface => Err(INVALID_VALUE),
        RESOURCE_TYPE_LINEAR => {
            // SAFETY: see above.
            let l = unsafe { r.res.linear };
            let (ptr, (format, channels, elem)) = (l.dev_ptr, fmt(l.format, l.num_channels)?);
            let size = l.size_in_bytes as u64;
            if ptr % TEXTURE_ALIGNMENT != 0 || size < elem {
                return Err(INVALID_VALUE);
            }
            let width = size / elem;
            Ok(blank(
                DevicePtr(ptr),
                format,
                channels,
                TexShape::Linear,
                (width, 1, 1),
                width * elem,
            ))
        }
        RESOURCE_TYPE_PITCH2D => {
            // SAFETY: see above.
            let p = unsafe { r.res.pitch2d };
            let (ptr, (format, channels, elem)) = (p.dev_ptr, fmt(p.format, p.num_channels)?);
            let (width, height, pitch) = (p.width as u64, p.height as u64, p.pitch_in_bytes as u64);
            if ptr % TEXTURE_ALIGNMENT != 0
                || pitch % TEXTURE_PITCH_ALIGNMENT != 0
                || width == 0
                || height == 0
                || pitch < width.saturating_mul(elem)
            {
                return Err(INVALID_VALUE);
            }
            Ok(blank(
                DevicePtr(ptr),
                format,
                channels,
                TexShape::D2,
                (width, height, 1),
                pitch,
            ))
        }
        _ => Err(INVALID_VALUE),
    }
}

/// The sampler a texture descriptor asks for.
fn sampler(d: &TextureDesc, desc: &TexObjectDesc) -> Result<TexSampler, CUresult> {
    let known = TRSF_READ_AS_INTEGER
        | TRSF_NORMALIZED_COORDINATES
        | TRSF_SRGB
        | TRSF_DISABLE_TRILINEAR_OPTIMIZATION
        | TRSF_SEAMLESS_CUBEMAP;
    if d.flags & !known != 0 {
        return Err(INVALID_VALUE);
    }
    if d.flags & TRSF_SRGB != 0 {
        return Err(refuse("sRGB conversion (CU_TRSF_SRGB)", NOT_SUPPORTED));
    }
    if d.flags & TRSF_SEAMLESS_CUBEMAP != 0 {
        return Err(refuse(
            "seamless cubemap filtering (CU_TRSF_SEAMLESS_CUBEMAP)",
            NOT_SUPPORTED,
        ));
    }
    if d.max_anisotropy > 1 {
        return Err(refuse(
            "anisotropic filtering (maxAnisotropy > 1)",
            NOT_SUPPORTED,
        ));
    }
    if !(0..=1).contains(&d.filter_mode) || d.address_mode.iter().any(|m| !(0..=3).contains(m)) {
        return Err(INVALID_VALUE);
    }
    let normalized = d.flags & TRSF_NORMALIZED_COORDINATES != 0;
    let mut address = d.address_mode.map(|m| m as u32);
    if !normalized {
        // Wrap and mirror exist only for normalized coordinates; otherwise they clamp.
        for m in &mut address {
            if *m == 0 || *m == 2 {
                *m = 1;
            }
        }
    }
    let integer = !matches!(desc.format, 0x10 | 0x20);
    let as_integer =
        integer && (d.flags & TRSF_READ_AS_INTEGER != 0 || matches!(desc.format, 0x03 | 0x0a));
    if d.filter_mode == 1 && as_integer {
        // Linear filtering needs float results: float data, or 8/16-bit integers read as
        // normalized floats.
        return Err(INVALID_VALUE);
    }
    Ok(TexSampler {
        address,
        filter: d.filter_mode as u32,
        flags: d.flags & (TRSF_READ_AS_INTEGER | TRSF_NORMALIZED_COORDINATES),
        border: d.border_color,
    })
}

/// A resource view is accepted only where it changes nothing: the resource's own format and
/// size, its only mipmap level and all of its layers.
fn check_view(v: &ResourceViewDesc, desc: &TexObjectDesc) -> Result<(), CUresult> {
    let layers = matches!(desc.shape, TexShape::Layered1 | TexShape::Layered2);
    let depth = if matches!(desc.shape, TexShape::D3) || layers {
        desc.depth
    } else {
        0
    };
    let height = if matches!(
        desc.shape,
        TexShape::Layered1 | TexShape::D1 | TexShape::Linear
    ) {
        0
    } else {
        desc.height
    };
    let same = v.format == 0
        && v.width as u64 == desc.width
        && (v.height as u64 == height || (v.height == 0 && height <= 1))
        && (v.depth as u64 == depth || (v.depth == 0 && depth <= 1))
        && v.first_mipmap_level == 0
        && v.last_mipmap_level == 0
        && v.first_layer == 0
        && (!layers || v.last_layer == 0 || u64::from(v.last_layer) + 1 == desc.depth);
    if same {
        Ok(())
    } else {
        Err(refuse(
            "a resource view that changes the format or selects part of the resource",
            NOT_SUPPORTED,
        ))
    }
}

fn create(
    kind: Kind,
    r: &ResourceDesc,
    t: Option<&TextureDesc>,
    view: Option<&ResourceViewDesc>,
) -> Result<u64, CUresult> {
    let s = session()?;
    let mut g = s.lock();
    let mut desc = resource(&g, r, kind == Kind::SurfObject)?;
    if let Some(t) = t {
        desc.sampler = Some(sampler(t, &desc)?);
    }
    if let Some(v) = view {
        check_view(v, &desc)?;
    }
    let descriptors = std::sync::Arc::new(Descriptors {
        resource: *r,
        texture: t.copied(),
        view: view.copied(),
    });
    g.create_tex_object(kind, desc, descriptors)
        .map_err(client_err)
}

fn destroy(kind: Kind, handle: u64) -> Result<(), CUresult> {
    with_core(|g| g.destroy_tex_object(kind, handle))
}

fn info(kind: Kind, handle: u64) -> Result<Descriptors, CUresult> {
    let s = session()?;
    let g = s.lock();
    if !handles::is(handle, kind) {
        return Err(INVALID_HANDLE);
    }
    let i = g.tex_object(handle).ok_or(INVALID_HANDLE)?;
    i.descriptors
        .downcast_ref::<Descriptors>()
        .copied()
        .ok_or(INVALID_HANDLE)
}

#[no_mangle]
pub unsafe extern "C" fn cuTexObjectCreate(
    tex: *mut CUtexObject,
    res: *const ResourceDesc,
    desc: *const TextureDesc,
    view: *const ResourceViewDesc,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let (r, d) = (read(res)?, read(desc)?);
        let v = if view.is_null() {
            None
        } else {
            Some(read(view)?)
        };
        if tex.is_null() {
            return Err(INVALID_VALUE);
        }
        let h = create(Kind::TexObject, &r, Some(&d), v.as_ref())?;
        out(tex, h)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuTexObjectDestroy(tex: CUtexObject) -> CUresult {
    guard(|| destroy(Kind::TexObject, tex))
}

#[no_mangle]
pub unsafe extern "C" fn cuTexObjectGetResourceDesc(
    res: *mut ResourceDesc,
    tex: CUtexObject,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let i = info(Kind::TexObject, tex)?;
        out(res, i.resource)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuTexObjectGetTextureDesc(
    desc: *mut TextureDesc,
    tex: CUtexObject,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let i = info(Kind::TexObject, tex)?;
        out(desc, i.texture.ok_or(INVALID_HANDLE)?)
    })
}

/// The view given at creation; an object made without one has none (`CUDA_ERROR_INVALID_VALUE`).
#[no_mangle]
pub unsafe extern "C" fn cuTexObjectGetResourceViewDesc(
    view: *mut ResourceViewDesc,
    tex: CUtexObject,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let i = info(Kind::TexObject, tex)?;
        out(view, i.view.ok_or(INVALID_VALUE)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuSurfObjectCreate(
    surf: *mut CUsurfObject,
    res: *const ResourceDesc,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let r = read(res)?;
        if surf.is_null() {
            return Err(INVALID_VALUE);
        }
        let h = create(Kind::SurfObject, &r, None, None)?;
        out(surf, h)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuSurfObjectDestroy(surf: CUsurfObject) -> CUresult {
    guard(|| destroy(Kind::SurfObject, surf))
}

#[no_mangle]
pub unsafe extern "C" fn cuSurfObjectGetResourceDesc(
    res: *mut ResourceDesc,
    surf: CUsurfObject,
) -> CUresult {
    // SAFETY: the pointers are this call's own arguments, valid as the CUDA API contract says.
    guard(|| unsafe {
        let i = info(Kind::SurfObject, surf)?;
        out(res, i.resource)
    })
}

include!(concat!(env!("OUT_DIR"), "/aliases_texture.rs"));
