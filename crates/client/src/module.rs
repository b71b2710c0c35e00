//! Modules, libraries, kernels and functions. Images load lazily, as NVIDIA's driver loads
//! them by default since CUDA 12.2 (`CUDA_MODULE_LOADING=LAZY`): a fatbin or cubin the
//! application loads is kept here and reaches the worker only when one of its kernels or
//! variables is first asked for; `CUDA_MODULE_LOADING=EAGER` loads at once, and PTX text
//! always does (its JIT errors are what a caller of `cuModuleLoadData` checks). At its first
//! use an image goes by content hash: the worker answers from its session's images or the
//! node's image cache (`gpufuse_image_cache`), and asks for the bytes only when neither has it
//! (large ones then travel in parts). A function's parameter layout comes back with it and is
//! cached. Each module keeps its image, so that a library can be loaded again after a device
//! reset and a reconnected session can load everything again on another worker.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use gpufuse_proto::{ReplyBody, Request};
use sha2::{Digest, Sha256};

use crate::error::ClientError;
use crate::handles::{self, Kind};
use crate::state::{Function, Inner, Kernel, Library, Module};
use crate::status::{INVALID_HANDLE, INVALID_IMAGE, NO_BINARY_FOR_GPU, OUT_OF_MEMORY, UNKNOWN};
use gpufuse_proto::{DevicePtr, FunctionHandle, ModuleHandle};

/// Images above this size travel in parts (a frame carries at most 64 MiB and change).
const IMAGE_PART: usize = 32 << 20;

/// Whether fatbins and cubins load lazily: `CUDA_MODULE_LOADING` unset or anything but
/// `EAGER` (NVIDIA's driver: lazy by default since CUDA 12.2), read once per process.
pub fn lazy_loading() -> bool {
    static LAZY: OnceLock<bool> = OnceLock::new();
    *LAZY.get_or_init(|| {
        !std::env::var("CUDA_MODULE_LOADING").is_ok_and(|v| v.trim().eq_ignore_ascii_case("EAGER"))
    })
}

/// Whether `image` waits for its first use: a fatbin or a cubin, in lazy mode. Its headers
/// were checked when it was measured (a malformed one fails the load at once); what is inside
/// is checked by the worker when it loads, and a failure then is returned by that first use,
/// as NVIDIA's lazy loading returns it.
fn loads_lazily(image: &[u8]) -> bool {
    const ELF: [u8; 4] = [0x7f, b'E', b'L', b'F'];
    const FATBIN: [u8; 4] = 0xBA55_ED50u32.to_le_bytes();
    lazy_loading() && (image.starts_with(&ELF) || image.starts_with(&FATBIN))
}

/// Where a module stands with the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadState {
    /// Registered by the application, not needed yet: the worker has not seen it.
    Pending,
    Loaded,
    /// Loading failed with this status (the image has no code the device can run, or is
    /// malformed inside); every use returns it.
    Failed(i32),
}

impl Inner {
    /// Loads `image` as module `module` on the worker, by content hash: the bytes go only if
    /// the worker (its session or its node's image cache) does not have them.
    pub(crate) fn send_module(
        &mut self,
        module: u64,
        device: u32,
        image: &[u8],
    ) -> Result<(), ClientError> {
        let hash: [u8; 32] = Sha256::digest(image).into();
        let mut send = false;
        loop {
            // An image larger than a frame goes ahead in parts; the load then names it by hash.
            let parts = send && image.len() > IMAGE_PART;
            if parts {
                for (i, data) in image.chunks(IMAGE_PART).enumerate() {
                    let part = Request::ModuleImagePart {
                        hash,
                        total: image.len() as u64,
                        offset: (i * IMAGE_PART) as u64,
                        data,
                    };
                    self.conn.quiet(&part)?;
                }
            }
            let req = Request::ModuleLoad {
                module: ModuleHandle(module),
                device,
                hash,
                image: (send && !parts).then_some(image),
            };
            match self.conn.call(&req)? {
                ReplyBody::NeedImage if !send => send = true,
                ReplyBody::NeedImage => return Err(INVALID_IMAGE.into()),
                ReplyBody::None => break,
                _ => return Err(UNKNOWN.into()),
            }
        }
        Ok(())
    }

    /// Registers `image` on `device`: a new module, loaded on the worker now or (lazily) at
    /// its first use.
    fn load(
        &mut self,
        device: u32,
        image: Arc<[u8]>,
        library: Option<u64>,
    ) -> Result<u64, ClientError> {
        let module = handles::mint(Kind::Module);
        let lazy = loads_lazily(&image);
        self.modules.insert(
            module,
            Module {
                device,
                functions: HashMap::new(),
                library,
                image,
                globals: HashMap::new(),
                order: 0,
                state: LoadState::Pending,
            },
        );
        if !lazy {
            if let Err(e) = self.ensure_loaded(module) {
                self.modules.remove(&module);
                return Err(e);
            }
        }
        Ok(module)
    }

    /// Loads module `m` on the worker if it has not been yet (its first use). A status the
    /// load failed with stays with the module; a failed connection or a device out of memory
    /// leaves it to be tried again.
    pub(crate) fn ensure_loaded(&mut self, m: u64) -> Result<(), ClientError> {
        let module = self.modules.get(&m).ok_or(INVALID_HANDLE)?;
        match module.state {
            LoadState::Loaded => return Ok(()),
            LoadState::Failed(s) => return Err(s.into()),
            LoadState::Pending => {}
        }
        let (device, image) = (module.device, module.image.clone());
        let result = self.send_module(m, device, &image);
        let order = self.next_order();
        if let Some(module) = self.modules.get_mut(&m) {
            match &result {
                Ok(()) => {
                    module.state = LoadState::Loaded;
                    module.order = order;
                }
                Err(ClientError::Cuda(s)) if *s != OUT_OF_MEMORY => {
                    module.state = LoadState::Failed(*s)
                }
                Err(_) => {}
            }
        }
        result
    }

    /// Whether module `m` is loaded on the worker (not waiting for its first use).
    pub fn module_loaded(&self, m: u64) -> bool {
        self.modules
            .get(&m)
            .is_some_and(|m| m.state == LoadState::Loaded)
    }

    /// `cuModuleLoadData`: loads `image` in the current context.
    pub fn load_module(&mut self, image: impl Into<Arc<[u8]>>) -> Result<u64, ClientError> {
        let (_, device) = self.current()?;
        self.load(device, image.into(), None)
    }

    /// `cuModuleUnload`.
    pub fn unload_module(&mut self, m: u64) -> Result<(), ClientError> {
        let module = self.modules.remove(&m).ok_or(INVALID_HANDLE)?;
        self.functions.retain(|_, f| f.module != m);
        self.lanes_changed();
        if module.state != LoadState::Loaded {
            return Ok(());
        }
        self.conn.quiet(&Request::ModuleUnload {
            module: ModuleHandle(m),
        })
    }

    /// The function `name` of module `m`, fetched from the worker once.
    pub fn function(&mut self, m: u64, name: &str) -> Result<u64, ClientError> {
        let module = self.modules.get(&m).ok_or(INVALID_HANDLE)?;
        if let Some(&f) = module.functions.get(name) {
            return Ok(f);
        }
        self.ensure_loaded(m)?;
        let f = handles::mint(Kind::Function);
        let req = Request::ModuleGetFunction {
            module: ModuleHandle(m),
            name,
            function: FunctionHandle(f),
        };
        let ReplyBody::Function(info) = self.conn.call(&req)? else {
            return Err(UNKNOWN.into());
        };
        self.functions.insert(
            f,
            Function {
                module: m,
                name: name.to_string(),
                info,
            },
        );
        if let Some(module) = self.modules.get_mut(&m) {
            module.functions.insert(name.to_string(), f);
        }
        Ok(f)
    }

    /// A module's global `name`: (address, size).
    pub fn global(&mut self, m: u64, name: &str) -> Result<(u64, u64), ClientError> {
        let device = self.modules.get(&m).ok_or(INVALID_HANDLE)?.device;
        self.ensure_loaded(m)?;
        match self.conn.call(&Request::ModuleGetGlobal {
            module: ModuleHandle(m),
            name,
        })? {
            ReplyBody::Global {
                ptr: DevicePtr(ptr),
                size,
            } => {
                self.note_global(ptr, size, device, m);
                if let Some(module) = self.modules.get_mut(&m) {
                    module.globals.insert(name.to_string(), ptr);
                }
                Ok((ptr, size))
            }
            _ => Err(UNKNOWN.into()),
        }
    }

    /// The device libraries load on: the current context's, or device 0's primary context.
    fn library_device(&mut self) -> Result<u32, ClientError> {
        match self.current() {
            Ok((_, d)) => Ok(d),
            Err(_) => {
                self.ensure_primary(0)?;
                Ok(0)
            }
        }
    }

    /// `cuLibraryLoadData`. The driver loads a library's code into a context lazily
    /// (CUDA_MODULE_LOADING=LAZY, the default): an image with no code for this GPU loads, and
    /// only its use fails. cuBLAS loads such images (sm_6x SASS only) in cublasCreate. In
    /// eager mode the load happens here and a failure is kept for the library's uses.
    pub fn load_library(&mut self, image: impl Into<Arc<[u8]>>) -> Result<u64, ClientError> {
        let device = self.library_device()?;
        let lib = handles::mint(Kind::Library);
        let image: Arc<[u8]> = image.into();
        let module = match self.load(device, image.clone(), Some(lib)) {
            Err(ClientError::Cuda(NO_BINARY_FOR_GPU)) => Err(NO_BINARY_FOR_GPU),
            r => Ok(r?),
        };
        self.libraries.insert(
            lib,
            Library {
                module,
                device,
                image,
                kernels: HashMap::new(),
            },
        );
        Ok(lib)
    }

    /// `cuLibraryUnload`.
    pub fn unload_library(&mut self, lib: u64) -> Result<(), ClientError> {
        let l = self.libraries.remove(&lib).ok_or(INVALID_HANDLE)?;
        self.kernels.retain(|_, k| k.library != lib);
        self.lanes_changed();
        match l.module {
            Ok(m) => self.unload_module(m),
            Err(_) => Ok(()),
        }
    }

    /// A library's module (or the status loading it gave).
    pub fn library_module(&self, lib: u64) -> Result<u64, ClientError> {
        let m = self.libraries.get(&lib).ok_or(INVALID_HANDLE)?.module?;
        match self.modules.get(&m).map(|m| m.state) {
            Some(LoadState::Failed(s)) => Err(s.into()),
            _ => Ok(m),
        }
    }

    /// `cuLibraryGetKernel`: the kernel `name` of library `lib`.
    pub fn library_kernel(&mut self, lib: u64, name: &str) -> Result<u64, ClientError> {
        let l = self.libraries.get(&lib).ok_or(INVALID_HANDLE)?;
        if let Some(&k) = l.kernels.get(name) {
            return Ok(k);
        }
        let module = l.module?;
        let f = self.function(module, name)?;
        let k = handles::mint(Kind::Kernel);
        self.kernels.insert(
            k,
            Kernel {
                library: lib,
                function: f,
            },
        );
        if let Some(l) = self.libraries.get_mut(&lib) {
            l.kernels.insert(name.to_string(), k);
        }
        Ok(k)
    }

    /// A kernel's (library, function).
    pub fn kernel(&self, k: u64) -> Result<Kernel, ClientError> {
        Ok(self.kernels.get(&k).ok_or(INVALID_HANDLE)?.clone())
    }

    /// Resolves a `CUfunction` or `CUkernel` to the function id the worker knows.
    pub fn resolve_function(&self, f: u64) -> Option<u64> {
        if handles::is(f, Kind::Kernel) {
            return self.kernels.get(&f).map(|k| k.function);
        }
        self.functions.contains_key(&f).then_some(f)
    }

    /// The device module `m` is loaded on and the image it was loaded from.
    pub fn module_image(&self, m: u64) -> Option<(u32, Arc<[u8]>)> {
        self.modules.get(&m).map(|m| (m.device, m.image.clone()))
    }

    /// The device module `m` is loaded on.
    pub fn module_device(&self, m: u64) -> Option<u32> {
        self.modules.get(&m).map(|m| m.device)
    }

    /// The function a `CUfunction` or `CUkernel` names.
    pub fn function_info(&self, f: u64) -> Result<&Function, ClientError> {
        let id = self.resolve_function(f).ok_or(INVALID_HANDLE)?;
        Ok(self.functions.get(&id).ok_or(INVALID_HANDLE)?)
    }

    /// The function a `CUfunction` or `CUkernel` names, to change its attributes. Streams'
    /// lanes check launches against the attributes they were granted with, so they are
    /// invalidated: the next launch of every lane takes the locked path again.
    pub fn function_info_mut(&mut self, f: u64) -> Result<&mut Function, ClientError> {
        let id = self.resolve_function(f).ok_or(INVALID_HANDLE)?;
        self.lanes.invalidate();
        Ok(self.functions.get_mut(&id).ok_or(INVALID_HANDLE)?)
    }

    /// After a device reset: the modules on `device` are gone.
    pub(crate) fn forget_device_modules(&mut self, device: u32) {
        let modules: Vec<u64> = self
            .modules
            .iter()
            .filter(|(_, m)| m.device == device)
            .map(|(&k, _)| k)
            .collect();
        for m in modules {
            self.modules.remove(&m);
            self.functions.retain(|_, f| f.module != m);
        }
    }

    /// After a device reset: libraries are context-independent, so each library on `device` is
    /// loaded again (fresh module variables, as in a new context) and its kernels point at the
    /// new module's functions. A library or kernel that fails to load again keeps the failure.
    pub(crate) fn reload_libraries(&mut self, device: u32) {
        let libs: Vec<(u64, Arc<[u8]>)> = self
            .libraries
            .iter()
            .filter(|(_, l)| l.device == device)
            .map(|(&h, l)| (h, l.image.clone()))
            .collect();
        for (lib, image) in libs {
            let module = self.load(device, image, Some(lib)).map_err(|e| e.status());
            let names: Vec<(String, u64)> = self.libraries[&lib]
                .kernels
                .iter()
                .map(|(n, &k)| (n.clone(), k))
                .collect();
            for (name, k) in names {
                match module
                    .map_err(ClientError::Cuda)
                    .and_then(|m| self.function(m, &name))
                {
                    Ok(f) => {
                        if let Some(kernel) = self.kernels.get_mut(&k) {
                            kernel.function = f;
                        }
                    }
                    Err(_) => {
                        self.kernels.remove(&k);
                        if let Some(l) = self.libraries.get_mut(&lib) {
                            l.kernels.remove(&name);
                        }
                    }
                }
            }
            if let Some(l) = self.libraries.get_mut(&lib) {
                l.module = module;
            }
        }
    }
}
