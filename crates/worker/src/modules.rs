//! Modules as one session holds them: images by content hash (so a module loaded again, or by
//! another context, travels once; behind the session's own images, the node's image cache on
//! disk, `gpufuse_image_cache`, shared by all the node's sessions: a client names an image by
//! hash and sends the bytes only when neither has it), images arriving in parts, the session's
//! module handles (client id -> device module) and function handles (client id -> module and
//! kernel name). Module variables are device memory and are charged like an allocation.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use gpufuse_device::status as st;
use gpufuse_image_cache::{ImageCache, Lookup};
use gpufuse_proto::{ImageCounts, ReplyBody};
use sha2::{Digest, Sha256};

use crate::{Session, R};
use gpufuse_proto::DevicePtr;

/// Images kept for deduplication (by content hash) per session.
const MAX_CACHED_IMAGES: usize = 256;
/// The largest module image accepted in parts (CuPy's thrust module holds about 75 MB).
const MAX_IMAGE_BYTES: u64 = 1 << 30;

/// The node's image cache, as the node handed it to this worker process (none when it did
/// not, or the directory cannot be made: the session then works from its own images).
fn node_cache() -> Option<&'static ImageCache> {
    static CACHE: OnceLock<Option<ImageCache>> = OnceLock::new();
    CACHE
        .get_or_init(|| match ImageCache::from_env() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("the node's image cache is not usable: {e}");
                None
            }
        })
        .as_ref()
}

#[derive(Default)]
pub(crate) struct ModuleBooks {
    pub(crate) images: HashMap<[u8; 32], Vec<u8>>,
    /// An image arriving in parts (`ModuleImagePart`): its hash and the bytes so far.
    pub(crate) partial_image: Option<([u8; 32], Vec<u8>)>,
    /// Client module handle -> device module id.
    pub(crate) modules: HashMap<u64, u64>,
    /// Client function handle -> (client module handle, kernel name).
    pub(crate) functions: HashMap<u64, (u64, Arc<str>)>,
}

impl ModuleBooks {
    /// Keeps `image` under `hash`, clearing the cache when it is full.
    fn cache(&mut self, hash: [u8; 32], image: Vec<u8>) {
        if self.images.len() >= MAX_CACHED_IMAGES {
            self.images.clear();
        }
        self.images.insert(hash, image);
    }
}

/// Keeps an image a client sent (its hash checked) in the node's cache; a failure to write
/// only costs the next session the bytes.
fn keep_on_disk(hash: &[u8; 32], image: &[u8]) {
    if let Some(cache) = node_cache() {
        if let Err(e) = cache.put(hash, image) {
            tracing::warn!("image cache {}: {e}", cache.dir().display());
        }
    }
}

impl Session<'_> {
    /// Unloads a device module and gives back what its variables were charged (the device
    /// says how much, as it did at load).
    pub(crate) fn unload_module(&mut self, id: u64) -> R<()> {
        let bytes = self.device.module_bytes(id);
        self.device.unload_module(id)?;
        self.uncharge(bytes);
        Ok(())
    }

    /// Unloads every module and forgets every function (reset, end of session).
    pub(crate) fn release_modules(&mut self) {
        let modules: Vec<u64> = self.modules.modules.drain().map(|(_, id)| id).collect();
        for id in modules {
            let _ = self.unload_module(id);
        }
        self.modules.functions.clear();
    }

    pub(crate) fn module_load(
        &mut self,
        module: u64,
        hash: [u8; 32],
        image: Option<&[u8]>,
    ) -> R<ReplyBody> {
        let image = match image {
            Some(img) => {
                if Sha256::digest(img).as_slice() != hash {
                    return Err(st::INVALID_VALUE);
                }
                if !self.modules.images.contains_key(&hash) {
                    self.modules.cache(hash, img.to_vec());
                    keep_on_disk(&hash, img);
                }
                self.ledger.images(ImageCounts {
                    received: 1,
                    received_bytes: img.len() as u64,
                    ..Default::default()
                });
                img.to_vec()
            }
            None => match self.modules.images.get(&hash) {
                Some(img) => img.clone(),
                None => match node_cache().map(|c| c.get(&hash)) {
                    Some(Lookup::Hit(img)) => {
                        self.ledger.images(ImageCounts {
                            hits: 1,
                            hit_bytes: img.len() as u64,
                            ..Default::default()
                        });
                        self.modules.cache(hash, img.clone());
                        img
                    }
                    Some(Lookup::Corrupt) => {
                        tracing::warn!("a corrupt image cache entry was dropped");
                        self.ledger.images(ImageCounts {
                            corrupt: 1,
                            ..Default::default()
                        });
                        return Ok(ReplyBody::NeedImage);
                    }
                    Some(Lookup::Miss) | None => return Ok(ReplyBody::NeedImage),
                },
            },
        };
        let id = self.device.load_module(&image)?;
        // Module variables are device memory: charged like an allocation.
        let bytes = self.device.module_bytes(id);
        if let Err(e) = self.charge(bytes) {
            let _ = self.device.unload_module(id);
            return Err(e);
        }
        if let Some(old) = self.modules.modules.insert(module, id) {
            let _ = self.unload_module(old);
        }
        Ok(ReplyBody::None)
    }

    pub(crate) fn module_image_part(
        &mut self,
        hash: [u8; 32],
        total: u64,
        offset: u64,
        data: &[u8],
    ) -> R<()> {
        if total > MAX_IMAGE_BYTES {
            return Err(st::INVALID_VALUE);
        }
        let mut part = match self.modules.partial_image.take() {
            Some((h, bytes)) if h == hash && bytes.len() as u64 == offset => bytes,
            _ if offset == 0 => Vec::new(),
            _ => return Err(st::INVALID_VALUE),
        };
        if offset + data.len() as u64 > total {
            return Err(st::INVALID_VALUE);
        }
        part.extend_from_slice(data);
        if part.len() as u64 == total {
            if Sha256::digest(&part).as_slice() != hash {
                return Err(st::INVALID_VALUE);
            }
            keep_on_disk(&hash, &part);
            self.ledger.images(ImageCounts {
                received: 1,
                received_bytes: total,
                ..Default::default()
            });
            self.modules.cache(hash, part);
        } else {
            self.modules.partial_image = Some((hash, part));
        }
        Ok(())
    }

    pub(crate) fn module_unload(&mut self, module: u64) -> R<()> {
        // The device's graphs that launch its kernels go first (the worker runs them node by
        // node from now on, and those launches fail as launches of an unloaded module do).
        self.graphs_leave_module(module);
        let id = self
            .modules
            .modules
            .remove(&module)
            .ok_or(st::INVALID_HANDLE)?;
        self.modules.functions.retain(|_, (m, _)| *m != module);
        self.unload_module(id)
    }

    pub(crate) fn module_get_function(
        &mut self,
        module: u64,
        name: &str,
        function: u64,
    ) -> R<ReplyBody> {
        let id = *self
            .modules
            .modules
            .get(&module)
            .ok_or(st::INVALID_HANDLE)?;
        let info = self.device.function(id, name)?;
        self.modules
            .functions
            .insert(function, (module, name.into()));
        Ok(ReplyBody::Function(info))
    }

    pub(crate) fn module_get_global(&mut self, module: u64, name: &str) -> R<ReplyBody> {
        let id = *self
            .modules
            .modules
            .get(&module)
            .ok_or(st::INVALID_HANDLE)?;
        let (ptr, size) = self.device.global(id, name)?;
        Ok(ReplyBody::Global {
            ptr: DevicePtr(ptr),
            size,
        })
    }

    /// The device module and kernel name a function handle names.
    pub(crate) fn kernel(&self, function: u64) -> R<(u64, Arc<str>)> {
        let (module, name) = self
            .modules
            .functions
            .get(&function)
            .map(|(m, n)| (*m, n.clone()))
            .ok_or(st::INVALID_HANDLE)?;
        let id = *self
            .modules
            .modules
            .get(&module)
            .ok_or(st::INVALID_HANDLE)?;
        Ok((id, name))
    }
}
