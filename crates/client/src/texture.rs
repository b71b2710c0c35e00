//! Texture and surface objects: the client mints the handle (the value kernels get), the worker
//! checks that the memory the descriptor names lies in one allocation.

use gpufuse_proto::{Request, TexObjectDesc};

use crate::error::ClientError;
use crate::handles::{self, Kind};
use crate::state::{Inner, TexObjectInfo};
use crate::status::INVALID_HANDLE;
use gpufuse_proto::TexHandle;

impl Inner {
    /// `cuTexObjectCreate` (`kind` [`Kind::TexObject`]) or `cuSurfObjectCreate`
    /// ([`Kind::SurfObject`]): the new object's handle. `descriptors` are the application's own
    /// descriptors, kept for `cuTexObjectGet*Desc`.
    pub fn create_tex_object(
        &mut self,
        kind: Kind,
        desc: TexObjectDesc,
        descriptors: std::sync::Arc<dyn std::any::Any + Send + Sync>,
    ) -> Result<u64, ClientError> {
        let handle = handles::mint(kind);
        self.conn.call(&Request::TexObjectCreate {
            handle: TexHandle(handle),
            desc,
        })?;
        self.textures.insert(
            handle,
            TexObjectInfo {
                ptr: desc.ptr.get(),
                descriptors,
            },
        );
        Ok(handle)
    }

    /// Records CUDA array `h` (its linear device memory and shape).
    pub fn insert_array(&mut self, h: u64, info: crate::state::ArrayInfo) {
        self.arrays.insert(h, info);
    }

    /// CUDA array `h`.
    pub fn array(&self, h: u64) -> Option<crate::state::ArrayInfo> {
        self.arrays.get(&h).copied()
    }

    /// Forgets CUDA array `h` (its memory is freed by the caller).
    pub fn remove_array(&mut self, h: u64) -> Option<crate::state::ArrayInfo> {
        self.arrays.remove(&h)
    }

    /// A texture or surface object.
    pub fn tex_object(&self, handle: u64) -> Option<&TexObjectInfo> {
        self.textures.get(&handle)
    }

    /// `cuTexObjectDestroy`, `cuSurfObjectDestroy`.
    pub fn destroy_tex_object(&mut self, kind: Kind, handle: u64) -> Result<(), ClientError> {
        if !handles::is(handle, kind) || self.textures.remove(&handle).is_none() {
            return Err(INVALID_HANDLE.into());
        }
        self.conn.quiet(&Request::TexObjectDestroy {
            handle: TexHandle(handle),
        })
    }
}
