//! Texture and surface objects as one session holds them: the handles the client minted,
//! each checked to read memory that lies in one of the session's allocations.

use gpufuse_device::status as st;

use crate::{Session, R};

/// The bytes a texture or surface object spans from its first element: whole rows and slices
/// but the last, whose row ends at its last element.
fn texture_span(d: &gpufuse_proto::TexObjectDesc) -> R<u64> {
    let elem = match d.format {
        0x01 | 0x08 => 1u64,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => return Err(st::INVALID_VALUE),
    } * u64::from(d.channels);
    let row = d.width.checked_mul(elem).ok_or(st::INVALID_VALUE)?;
    if d.width == 0 || d.height == 0 || d.depth == 0 || d.pitch < row {
        return Err(st::INVALID_VALUE);
    }
    let slice = d.pitch.checked_mul(d.height).ok_or(st::INVALID_VALUE)?;
    slice
        .checked_mul(d.depth - 1)
        .and_then(|s| s.checked_add(d.pitch.checked_mul(d.height - 1)?))
        .and_then(|s| s.checked_add(row))
        .ok_or(st::INVALID_VALUE)
}

impl Session<'_> {
    pub(crate) fn tex_object_create(
        &mut self,
        handle: u64,
        desc: &gpufuse_proto::TexObjectDesc,
    ) -> R<()> {
        if self.textures.contains_key(&handle) {
            return Err(st::INVALID_VALUE);
        }
        self.check_range(desc.ptr.get(), texture_span(desc)?)?;
        self.device.create_texture(handle, desc)?;
        self.textures.insert(handle, *desc);
        Ok(())
    }

    pub(crate) fn tex_object_destroy(&mut self, handle: u64) -> R<()> {
        if self.textures.remove(&handle).is_none() {
            return Err(st::INVALID_HANDLE);
        }
        self.device.destroy_texture(handle)
    }

    /// Forgets every texture and surface object (reset, end of session).
    pub(crate) fn release_textures(&mut self) {
        for (h, _) in std::mem::take(&mut self.textures) {
            let _ = self.device.destroy_texture(h);
        }
    }
}
