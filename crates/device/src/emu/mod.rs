//! The emulated GPU: device memory in host memory, modules from PTX.
//!
//! Memory is a map of allocations (address -> zeroed buffer) in the session's address window;
//! every access must lie inside one allocation. Allocations are kept as 64-bit words
//! ([`words::Words`]): a launch hands them to the PTX interpreter as `AtomicU64` regions, which
//! the host threads running the launch's blocks share (every access atomic, so a kernel's own
//! races are never undefined behaviour in the host). Modules keep their PTX, its layout and the
//! compiled program; kernels run on the interpreter (`gpufuse_ptx`).

mod capture;
mod vmm;
mod words;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use gpufuse_proto::{DeviceInfo, DeviceKind, FunctionInfo};

use crate::ptx_layout::{self, Layout};
use crate::status::*;
use crate::{
    model, CaptureRefused, Device, DeviceError, DeviceImage, EventId, KernelLaunch, ModuleId,
    StreamId,
};

/// Allocations start at multiples of the texture alignment the device reports (512, attribute
/// 14), so memory from `cuMemAlloc` can back a texture object, as on a GPU.
const ALIGN: u64 = 512;

/// Host memory kernels may reach ([`Device::map_host_arena`]) lies below this: a process's
/// addresses (57 bits at most), under the interpreter's windows of the generic address space
/// (`gpufuse_ptx::FUNCTION_WINDOW` and its neighbours, whose top byte is 0x7B and above).
const HOST_ADDRESS_END: u64 = 1 << 57;

/// Why a loaded module's kernels cannot run: the launch's status and its detail.
#[derive(Debug, Clone)]
struct Unrunnable {
    status: Status,
    why: String,
}

struct Module {
    layout: Layout,
    /// The decoded program, or why the interpreter cannot run it (reported at launch).
    program: Result<gpufuse_ptx::Module, Unrunnable>,
    /// Device addresses of the module's variables.
    variables: HashMap<String, (u64, u64)>,
    /// The image it was loaded from, kept so that a captured session can load it again.
    image: std::sync::Arc<[u8]>,
}

/// One emulated GPU as one session sees it.
pub struct EmuDevice {
    index: u32,
    total: u64,
    allocations: BTreeMap<u64, words::Words>,
    next: u64,
    window_end: u64,
    modules: HashMap<ModuleId, Module>,
    next_module: ModuleId,
    vmm: vmm::Vmm,
    model: &'static model::Model,
    /// Device-side `printf` output not yet taken by the worker.
    output: Vec<u8>,
    /// The session's heap for `malloc`/`free` in kernels: reserved (8 MiB, CUDA's default) by
    /// the first launch of a kernel that can reach them (not any kernel of a module that
    /// holds one: a session with a heap cannot move), kept for the session's life.
    heap: Option<gpufuse_ptx::Heap>,
    /// Live texture and surface objects by handle (`cuTexObjectCreate`, `cuSurfObjectCreate`),
    /// which kernels name in `tex`/`suld`/`sust` (`gpufuse_ptx::DeviceMemory::texture`).
    textures: HashMap<u64, gpufuse_ptx::Texture>,
    /// The grid workspace of cooperative launches (`this_grid().sync()` counts arrivals in
    /// it): 16 bytes of device memory the application's calls never name, allocated by the
    /// first cooperative launch and kept, as the CUDA driver keeps its own.
    workspace: Option<u64>,
    /// What each texture or surface object was created from (for a capture).
    texture_descs: HashMap<u64, gpufuse_proto::TexObjectDesc>,
    /// Allocations whose contents are away (evicted): address -> size.
    evicted: BTreeMap<u64, u64>,
    /// The start of the session's address window.
    window_base: u64,
    /// The allocations the last launch looked up ([`Device::last_launch_touched`]).
    last_touched: Vec<u64>,
    /// The client's host arena ([`Device::host_arena`]), and the words kernels reach it
    /// through at the client's address once it is mapped ([`Device::map_host_arena`]).
    arena: Option<crate::HostSpan>,
    host_mapped: Option<(u64, words::Words)>,
    /// `CU_LIMIT_MALLOC_HEAP_SIZE`: the size of the heap the first launch that needs one makes.
    heap_size: u64,
    /// `CU_LIMIT_PRINTF_FIFO_SIZE`: the device-side `printf` output one launch may produce.
    printf_fifo: usize,
    /// Streams and events: work runs when it is enqueued, so every queue is empty.
    queues: crate::eager::EagerQueues,
    /// Device time the session's launches have taken.
    device_time: Duration,
}

/// Device-side `printf` output one launch may produce (the driver's default printf FIFO); what
/// follows is dropped, as on a GPU whose buffer fills.
const PRINTF_FIFO: usize = model::PRINTF_FIFO_BYTES as usize;
/// `CU_LIMIT_PRINTF_FIFO_SIZE`, `CU_LIMIT_MALLOC_HEAP_SIZE`.
const LIMIT_PRINTF_FIFO_SIZE: u32 = 1;
const LIMIT_MALLOC_HEAP_SIZE: u32 = 2;

/// Device memory as the interpreter sees it during a launch: every allocation's words, by
/// address.
struct Memory<'a> {
    /// Every allocation's words by address, then the client's host arena if it is mapped
    /// (its region follows every allocation's: it lies above the session's window).
    regions: Vec<(u64, &'a [AtomicU64], u64)>,
    /// Which allocations the launch looked up (pre-copy's dirty tracking: a kernel reaches
    /// device memory only through [`gpufuse_ptx::DeviceMemory::region`]), one per allocation.
    touched: Vec<std::sync::atomic::AtomicBool>,
    printed: std::sync::Mutex<Vec<u8>>,
    /// The launch's printf buffer: whole records past it are dropped.
    printf_fifo: usize,
    heap: Option<&'a gpufuse_ptx::Heap>,
    textures: &'a HashMap<u64, gpufuse_ptx::Texture>,
    cancel: Option<&'a std::sync::atomic::AtomicBool>,
}

impl<'a> Memory<'a> {
    fn new(
        allocations: &'a mut BTreeMap<u64, words::Words>,
        host: Option<&'a mut (u64, words::Words)>,
        heap: Option<&'a gpufuse_ptx::Heap>,
        textures: &'a HashMap<u64, gpufuse_ptx::Texture>,
        cancel: Option<&'a std::sync::atomic::AtomicBool>,
    ) -> Self {
        let allocations_len = allocations.len();
        Memory {
            regions: allocations
                .iter_mut()
                .chain(host.map(|(start, w)| (&*start, w)))
                .map(|(&start, w)| (start, w.len() as u64, w))
                .map(|(start, len, w)| (start, w.atomic(), len))
                .collect(),
            touched: std::iter::repeat_with(Default::default)
                .take(allocations_len)
                .collect(),
            printed: std::sync::Mutex::new(Vec::new()),
            printf_fifo: PRINTF_FIFO,
            heap,
            textures,
            cancel,
        }
    }
}

impl gpufuse_ptx::DeviceMemory for Memory<'_> {
    fn region(&self, addr: u64) -> Option<gpufuse_ptx::Region<'_>> {
        let i = self.regions.partition_point(|r| r.0 <= addr);
        let i = i.checked_sub(1)?;
        let &(start, words, len) = self.regions.get(i)?;
        if addr - start >= len {
            return None;
        }
        // Read first: regions looked up again stay shared in every thread's cache.
        if let Some(t) = self.touched.get(i) {
            if !t.load(std::sync::atomic::Ordering::Relaxed) {
                t.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        Some(gpufuse_ptx::Region { start, len, words })
    }

    fn print(&self, text: &[u8]) {
        let mut p = self.printed.lock().unwrap_or_else(|p| p.into_inner());
        // Whole records only, within the launch's printf buffer.
        if p.len() + text.len() <= self.printf_fifo {
            p.extend_from_slice(text);
        }
    }

    fn heap(&self) -> Option<&gpufuse_ptx::Heap> {
        self.heap
    }

    fn texture(&self, handle: u64) -> Option<gpufuse_ptx::Texture> {
        self.textures.get(&handle).copied()
    }

    fn cancel(&self) -> Option<&std::sync::atomic::AtomicBool> {
        self.cancel
    }
}

impl EmuDevice {
    /// Device `index` of `total` bytes; this session's addresses start at `base` (its window).
    pub fn new(index: u32, total: u64, base: u64, window: u64) -> Self {
        Self {
            index,
            total,
            allocations: BTreeMap::new(),
            next: base,
            window_end: base + window,
            modules: HashMap::new(),
            next_module: 1,
            output: Vec::new(),
            heap: None,
            textures: HashMap::new(),
            workspace: None,
            texture_descs: HashMap::new(),
            evicted: BTreeMap::new(),
            window_base: base,
            last_touched: Vec::new(),
            arena: None,
            host_mapped: None,
            heap_size: gpufuse_ptx::DEFAULT_HEAP,
            printf_fifo: PRINTF_FIFO,
            queues: Default::default(),
            device_time: Duration::ZERO,
            vmm: vmm::Vmm::default(),
            model: model::default_model(),
        }
    }

    /// The same device as another model (`--devices emu:N:SIZE:sm_120`).
    pub fn with_model(mut self, model: &'static model::Model) -> Self {
        self.model = model;
        self
    }

    fn find(&self, ptr: u64, len: u64) -> Option<(u64, usize)> {
        let (&base, buf) = self.allocations.range(..=ptr).next_back()?;
        let size = buf.len() as u64;
        let off = ptr - base;
        (off.checked_add(len)? <= size && (len > 0 || off < size.max(1)))
            .then_some((base, off as usize))
    }

    /// The pieces of `[ptr, ptr+len)` as (address, length), each inside one allocation: one
    /// piece, or several across virtual-memory mappings that follow each other without a gap
    /// (a range `cuMemMap` made contiguous; separate allocations never join). None if any
    /// byte is outside.
    fn pieces(&self, ptr: u64, len: u64) -> Option<Vec<(u64, u64)>> {
        if self.find(ptr, len).is_some() {
            return Some(vec![(ptr, len)]);
        }
        let end = ptr.checked_add(len)?;
        let (&base, buf) = self.allocations.range(..=ptr).next_back()?;
        let mut at_end = base + buf.len() as u64;
        if ptr >= at_end || !self.vmm.is_mapped(base) {
            return None;
        }
        let mut out = vec![(ptr, at_end - ptr)];
        while at_end < end {
            let next = self.allocations.get(&at_end)?;
            if !self.vmm.is_mapped(at_end) || next.len() == 0 {
                return None;
            }
            let n = (next.len() as u64).min(end - at_end);
            out.push((at_end, n));
            at_end += next.len() as u64;
        }
        Some(out)
    }

    /// The bytes of `[ptr, ptr+len)` in place, inside one allocation of the device's own
    /// memory (shared allocations are never viewed as bytes: [`words::Words::bytes`]).
    fn slice_mut(&mut self, ptr: u64, len: u64) -> Result<&mut [u8], Status> {
        let (base, off) = self.find(ptr, len).ok_or(INVALID_VALUE)?;
        let buf = self.allocations.get_mut(&base).ok_or(INVALID_VALUE)?;
        let bytes = buf.bytes_mut().ok_or(INVALID_VALUE)?;
        Ok(&mut bytes[off..off + len as usize])
    }

    fn slice(&self, ptr: u64, len: u64) -> Result<&[u8], Status> {
        let (base, off) = self.find(ptr, len).ok_or(INVALID_VALUE)?;
        let buf = self.allocations.get(&base).ok_or(INVALID_VALUE)?;
        let bytes = buf.bytes().ok_or(INVALID_VALUE)?;
        Ok(&bytes[off..off + len as usize])
    }

    /// Writes `data` at `ptr`, inside one allocation (own or shared words).
    fn write_in_one(&mut self, ptr: u64, data: &[u8]) -> Result<(), Status> {
        let (base, off) = self.find(ptr, data.len() as u64).ok_or(INVALID_VALUE)?;
        let buf = self.allocations.get_mut(&base).ok_or(INVALID_VALUE)?;
        buf.write_at(off, data);
        Ok(())
    }

    /// Reads `out.len()` bytes at `ptr`, inside one allocation (own or shared words).
    fn read_in_one(&self, ptr: u64, out: &mut [u8]) -> Result<(), Status> {
        let (base, off) = self.find(ptr, out.len() as u64).ok_or(INVALID_VALUE)?;
        let buf = self.allocations.get(&base).ok_or(INVALID_VALUE)?;
        buf.read_at(off, out);
        Ok(())
    }

    /// Whether `ptr` lies in an allocation whose words another process shares.
    fn in_shared(&self, ptr: u64) -> bool {
        self.allocations
            .range(..=ptr)
            .next_back()
            .is_some_and(|(_, w)| w.is_shared())
    }
}

/// Shared allocations ([`Device::alloc_shared`]) start on this boundary, a multiple of every
/// host page size, so the client can map its pages at the same address.
const SHARED_ALIGN: u64 = 64 << 10;

impl Device for EmuDevice {
    fn info(&self, limit: Option<u64>) -> DeviceInfo {
        DeviceInfo {
            index: self.index,
            name: model::NAME.to_string(),
            kind: DeviceKind::Emulated,
            uuid: model::uuid(self.index),
            total_mem: limit.map_or(self.total, |l| l.min(self.total)),
            attributes: model::attributes(self.model, self.index),
        }
    }

    fn alloc(&mut self, size: u64) -> Result<u64, Status> {
        if size == 0 {
            return Err(INVALID_VALUE);
        }
        let rounded = size.checked_add(ALIGN - 1).ok_or(OUT_OF_MEMORY)? / ALIGN * ALIGN;
        if size > self.total || self.next + rounded > self.window_end {
            return Err(OUT_OF_MEMORY);
        }
        let size = usize::try_from(size).map_err(|_| OUT_OF_MEMORY)?;
        let buf = words::Words::zeroed(size).ok_or(OUT_OF_MEMORY)?;
        let ptr = self.next;
        self.next += rounded;
        self.allocations.insert(ptr, buf);
        Ok(ptr)
    }

    fn free(&mut self, ptr: u64) -> Result<u64, Status> {
        if let Some(len) = self.evicted.remove(&ptr) {
            return Ok(len);
        }
        if self.vmm.is_mapped(ptr) {
            return Err(INVALID_VALUE);
        }
        self.allocations
            .remove(&ptr)
            .map(|b| b.len() as u64)
            .ok_or(INVALID_VALUE)
    }

    fn contains(&self, ptr: u64, len: u64) -> bool {
        self.find(ptr, len).is_some() || self.pieces(ptr, len).is_some()
    }

    fn write(&mut self, dst: u64, data: &[u8]) -> Result<(), Status> {
        if self.write_in_one(dst, data).is_ok() {
            return Ok(());
        }
        let mut rest = data;
        for (at, n) in self.pieces(dst, data.len() as u64).ok_or(INVALID_VALUE)? {
            let (here, after) = rest.split_at(n as usize);
            self.write_in_one(at, here)?;
            rest = after;
        }
        Ok(())
    }

    fn read(&mut self, src: u64, out: &mut [u8]) -> Result<(), Status> {
        if self.read_in_one(src, out).is_ok() {
            return Ok(());
        }
        let mut rest = &mut out[..];
        for (at, n) in self.pieces(src, rest.len() as u64).ok_or(INVALID_VALUE)? {
            let (here, after) = rest.split_at_mut(n as usize);
            self.read_in_one(at, here)?;
            rest = after;
        }
        Ok(())
    }

    fn alloc_shared(&mut self, size: u64, backing: crate::HostSpan) -> Result<u64, Status> {
        if size == 0 || size > self.total {
            return Err(INVALID_VALUE);
        }
        let len = usize::try_from(size).map_err(|_| INVALID_VALUE)?;
        // The worker hands a block of the client's host arena, which it keeps mapped for as
        // long as this device lives (`Device::alloc_shared`'s contract).
        let words = words::Words::shared(backing, len).ok_or(INVALID_VALUE)?;
        let ptr = self
            .next
            .checked_next_multiple_of(SHARED_ALIGN)
            .ok_or(OUT_OF_MEMORY)?;
        let rounded = size
            .checked_next_multiple_of(SHARED_ALIGN)
            .ok_or(OUT_OF_MEMORY)?;
        if ptr
            .checked_add(rounded)
            .is_none_or(|end| end > self.window_end)
        {
            return Err(OUT_OF_MEMORY);
        }
        self.next = ptr + rounded;
        self.allocations.insert(ptr, words);
        Ok(ptr)
    }

    fn share(&mut self, ptr: u64, backing: crate::HostSpan) -> Result<(), Status> {
        let own = self.allocations.get(&ptr).ok_or(INVALID_VALUE)?;
        let bytes = own.bytes().ok_or(INVALID_VALUE)?;
        // The caller keeps `backing` mapped for as long as the allocation lives
        // (`Device::share`'s contract).
        let mut words = words::Words::shared(backing, own.len()).ok_or(INVALID_VALUE)?;
        words.write_at(0, bytes);
        self.allocations.insert(ptr, words);
        Ok(())
    }

    fn share_physical(&mut self, physical: u64, backing: crate::HostSpan) -> Result<(), Status> {
        self.vmm.share(physical, backing, &mut self.allocations)
    }

    fn create_physical_shared(
        &mut self,
        size: u64,
        backing: crate::HostSpan,
    ) -> Result<u64, Status> {
        self.vmm.create_shared(size, backing)
    }

    fn set_limit(&mut self, limit: u32, value: u64) -> Result<(), Status> {
        match limit {
            LIMIT_PRINTF_FIFO_SIZE => {
                self.printf_fifo = usize::try_from(value).map_err(|_| INVALID_VALUE)?;
                Ok(())
            }
            // Once a kernel has its heap, the heap stays (NVIDIA's driver refuses the same).
            LIMIT_MALLOC_HEAP_SIZE if self.heap.is_some() => Err(INVALID_VALUE),
            LIMIT_MALLOC_HEAP_SIZE => {
                if value > self.total {
                    return Err(OUT_OF_MEMORY);
                }
                self.heap_size = value.max(ALIGN);
                Ok(())
            }
            _ => Err(INVALID_VALUE),
        }
    }

    fn limit(&mut self, limit: u32) -> Result<u64, Status> {
        match limit {
            LIMIT_PRINTF_FIFO_SIZE => Ok(self.printf_fifo as u64),
            LIMIT_MALLOC_HEAP_SIZE => Ok(self.heap_size),
            _ => model::default_limit(self.model, limit),
        }
    }

    fn occupancy(
        &mut self,
        module: ModuleId,
        function: &str,
        q: crate::Occupancy,
    ) -> Result<i32, Status> {
        let m = self.modules.get(&module).ok_or(INVALID_HANDLE)?;
        if !m.layout.kernels.iter().any(|k| k.name == function) {
            return Err(NOT_FOUND);
        }
        let info = m.program.as_ref().ok().and_then(|p| p.kernel(function));
        let max_threads = info.and_then(|i| i.max_threads).unwrap_or(1024).min(1024);
        if q.block == 0 {
            return Err(INVALID_VALUE);
        }
        // A block larger than the function allows, or with more dynamic shared memory than it
        // opted into, fits nowhere (NVIDIA's driver answers 0 too).
        if q.block > max_threads || q.dyn_smem > u64::from(q.max_dyn_smem) {
            return Ok(0);
        }
        let shared = info.map_or(0, |i| i.static_shared_bytes as u64) + q.dyn_smem;
        let u = model::BlockUse {
            threads: u64::from(q.block),
            registers: model::REGISTERS_PER_THREAD,
            shared,
        };
        Ok(i32::try_from(model::blocks_per_sm(self.model, u)).unwrap_or(i32::MAX))
    }

    fn host_arena(
        &mut self,
        arena: crate::HostSpan,
        _pin_map: Option<crate::HostSpan>,
    ) -> Result<(), Status> {
        // The mapping of an earlier arena is the client's no more: it maps the new one.
        self.host_mapped = None;
        self.arena = Some(arena);
        Ok(())
    }

    fn map_host_arena(&mut self, base: u64) -> Result<(), Status> {
        let arena = self.arena.ok_or(INVALID_VALUE)?;
        let len = arena.len() as u64;
        let end = base.checked_add(len).ok_or(INVALID_VALUE)?;
        if len == 0 || !base.is_multiple_of(ALIGN) {
            return Err(INVALID_VALUE);
        }
        // Above every device address of the session (allocations, reservations and the heap
        // all lie in its window; launches look regions up in address order), and below the
        // interpreter's own windows of the generic address space (shared, local, parameter
        // memory, function addresses). A client maps its arena high (mmap's top-down
        // placement), above every session window (`gpufuse_node::ledger`).
        if base < self.window_end || end > HOST_ADDRESS_END {
            return Err(NOT_SUPPORTED);
        }
        let words = words::Words::shared(arena, arena.len()).ok_or(INVALID_VALUE)?;
        self.host_mapped = Some((base, words));
        Ok(())
    }

    fn view(&self, src: u64, len: u64) -> Option<&[u8]> {
        self.slice(src, len).ok()
    }

    fn view_mut(&mut self, dst: u64, len: u64) -> Option<&mut [u8]> {
        self.slice_mut(dst, len).ok()
    }

    fn copy(&mut self, dst: u64, src: u64, len: u64, stream: StreamId) -> Result<(), Status> {
        self.queues.check_stream(stream)?;
        let mut data = vec![0u8; usize::try_from(len).map_err(|_| INVALID_VALUE)?];
        self.read(src, &mut data)?;
        self.write(dst, &data)
    }

    fn memset(
        &mut self,
        dst: u64,
        value: u32,
        elem_size: u8,
        count: u64,
        stream: StreamId,
    ) -> Result<(), Status> {
        self.queues.check_stream(stream)?;
        let len = count.checked_mul(elem_size as u64).ok_or(INVALID_VALUE)?;
        let pieces = self.pieces(dst, len).ok_or(INVALID_VALUE)?;
        if pieces.len() > 1 || self.in_shared(dst) {
            // Across mappings, or into words another process shares: the pattern written
            // whole, piece by piece (word by word into shared words).
            let mut pattern = vec![0u8; usize::try_from(len).map_err(|_| INVALID_VALUE)?];
            let bytes = value.to_le_bytes();
            let e = elem_size as usize;
            if !matches!(e, 1 | 2 | 4) {
                return Err(INVALID_VALUE);
            }
            pattern
                .chunks_exact_mut(e)
                .for_each(|c| c.copy_from_slice(&bytes[..e]));
            return self.write(dst, &pattern);
        }
        let s = self.slice_mut(dst, len)?;
        match elem_size {
            1 => s.fill(value as u8),
            2 => s
                .chunks_exact_mut(2)
                .for_each(|c| c.copy_from_slice(&(value as u16).to_le_bytes())),
            4 => s
                .chunks_exact_mut(4)
                .for_each(|c| c.copy_from_slice(&value.to_le_bytes())),
            _ => return Err(INVALID_VALUE),
        }
        Ok(())
    }

    fn load_module(&mut self, image: &[u8]) -> Result<ModuleId, DeviceError> {
        let sm = self.model.arch();
        let (layout, program) = match gpufuse_fatbin::select_units(image, sm) {
            Ok(units) => {
                units.iter().for_each(|ptx| dump_ptx(ptx));
                // One parse gives the layout and the program. PTX that does not parse is
                // refused at load, as NVIDIA's JIT refuses it; an instruction the VM lacks
                // fails only the launches of the kernels that reach it. Several units
                // (relocatable device code, the JIT linker's image) are linked first.
                let program = ptx_layout::load_units(&units).map_err(|e| {
                    tracing::warn!("module refused: {e}");
                    let status = match e {
                        gpufuse_ptx::PtxError::Link(_) => INVALID_IMAGE,
                        _ => INVALID_PTX,
                    };
                    DeviceError::new(status, e.to_string())
                })?;
                (ptx_layout::from_module(&program), Ok(program))
            }
            // A GPU of this compute capability would run the image's SASS: load it, list its
            // kernels from the cubin, and fail only their launches.
            Err(gpufuse_fatbin::FatbinError::NoBinaryForGpu(_)) => {
                let Some((cubin_sm, cubin)) =
                    gpufuse_fatbin::select_cubin(image, sm).map_err(|_| INVALID_IMAGE)?
                else {
                    tracing::debug!(
                        "module refused (no code for sm_{sm}): {}",
                        image_summary(image)
                    );
                    return Err(NO_BINARY_FOR_GPU.into());
                };
                let info = gpufuse_fatbin::cubin_info(&cubin).map_err(|_| INVALID_IMAGE)?;
                let why = format!(
                    "the module holds this kernel only as SASS for sm_{cubin_sm} and no PTX for \
                     compute capability {sm} or below; the emulated GPU runs PTX only"
                );
                (
                    ptx_layout::from_cubin(&info),
                    Err(Unrunnable {
                        status: NO_BINARY_FOR_GPU,
                        why,
                    }),
                )
            }
            Err(gpufuse_fatbin::FatbinError::UnsupportedPtxVersion(..)) => {
                return Err(UNSUPPORTED_PTX_VERSION.into())
            }
            Err(_) => return Err(INVALID_IMAGE.into()),
        };
        let mut variables = HashMap::new();
        for v in &layout.variables {
            let ptr = self.alloc(v.size.max(1))?;
            if let Some(init) = &v.init {
                let n = init.len().min(v.size as usize);
                self.write(ptr, &init[..n])?;
            }
            variables.insert(v.name.clone(), (ptr, v.size));
        }
        let id = self.next_module;
        self.next_module += 1;
        self.modules.insert(
            id,
            Module {
                layout,
                program,
                variables,
                image: image.into(),
            },
        );
        Ok(id)
    }

    fn unload_module(&mut self, module: ModuleId) -> Result<(), Status> {
        let m = self.modules.remove(&module).ok_or(INVALID_HANDLE)?;
        for (ptr, _) in m.variables.values() {
            let _ = self.free(*ptr);
        }
        Ok(())
    }

    fn create_physical(&mut self, size: u64) -> Result<u64, Status> {
        if size > self.total {
            return Err(OUT_OF_MEMORY);
        }
        self.vmm.create(size)
    }

    fn release_physical(&mut self, physical: u64) -> Result<(), Status> {
        self.vmm.release(physical)
    }

    fn reserve(&mut self, size: u64, align: u64) -> Result<u64, Status> {
        if size == 0
            || !size.is_multiple_of(vmm::GRANULARITY)
            || (align != 0 && !align.is_power_of_two())
        {
            return Err(INVALID_VALUE);
        }
        let align = align.max(vmm::GRANULARITY);
        let ptr = self.next.div_ceil(align) * align;
        let end = ptr.checked_add(size).ok_or(OUT_OF_MEMORY)?;
        if end > self.window_end {
            return Err(OUT_OF_MEMORY);
        }
        self.next = end;
        self.vmm.reserve(ptr, size);
        Ok(ptr)
    }

    fn unreserve(&mut self, ptr: u64, size: u64) -> Result<(), Status> {
        self.vmm.unreserve(ptr, size)
    }

    fn map(&mut self, ptr: u64, physical: u64) -> Result<(), Status> {
        self.vmm.map(ptr, physical, &mut self.allocations)
    }

    fn unmap(&mut self, ptr: u64, size: u64) -> Result<(), Status> {
        self.vmm.unmap(ptr, size, &mut self.allocations)
    }

    fn module_bytes(&self, module: ModuleId) -> u64 {
        self.modules.get(&module).map_or(0, |m| {
            m.variables.values().map(|&(_, size)| size.max(1)).sum()
        })
    }

    fn function(&mut self, module: ModuleId, name: &str) -> Result<FunctionInfo, Status> {
        let m = self.modules.get(&module).ok_or(INVALID_HANDLE)?;
        let k = m
            .layout
            .kernels
            .iter()
            .find(|k| k.name == name)
            .ok_or(NOT_FOUND)?;
        // From the decoded program when it parsed; a module whose program did not parse still
        // loads (its launches fail, naming what the VM lacks).
        let info = m.program.as_ref().ok().and_then(|p| p.kernel(name));
        let static_shared = info.map_or(0, |i| i.static_shared_bytes as i32);
        let max_threads = info.and_then(|i| i.max_threads).unwrap_or(1024).min(1024) as i32;
        let ptx_arch = m
            .program
            .as_ref()
            .map_or(self.model.arch() as i32, |p| p.target_sm() as i32);
        let attributes = vec![
            (0, max_threads),
            (1, static_shared),
            (2, 0),  // constant bytes
            (3, 0),  // local bytes
            (4, 32), // registers
            (5, ptx_arch),
            (6, self.model.arch() as i32), // binary version: JIT-compiled for the device
            (7, 0),                        // cache mode CA
            (8, model::SHARED_PER_BLOCK - static_shared),
            (9, -1), // preferred carveout
            (10, 0), // cluster size must be set
            (11, 0), // required cluster width, height, depth
            (12, 0),
            (13, 0),
            (14, 0), // non-portable cluster size allowed
            (15, 0), // cluster scheduling policy
            // CUDA 13's: libcudart 13.5's cudaFuncGetAttributes asks for them, and Thrust's
            // radix sort fails on an error (NVIDIA's radixSortThrust sample).
            (16, 0), // device node update supported
            (17, 0), // shared memory mode: CU_SHARED_MEMORY_MODE_DEFAULT
        ];
        Ok(FunctionInfo {
            params: k.params.clone(),
            attributes,
        })
    }

    fn global(&mut self, module: ModuleId, name: &str) -> Result<(u64, u64), Status> {
        let m = self.modules.get(&module).ok_or(INVALID_HANDLE)?;
        m.variables.get(name).copied().ok_or(NOT_FOUND)
    }

    fn create_stream(&mut self, stream: StreamId, _flags: u32, _prio: i32) -> Result<(), Status> {
        self.queues.create_stream(stream)
    }

    fn destroy_stream(&mut self, stream: StreamId) -> Result<(), Status> {
        self.queues.destroy_stream(stream)
    }

    fn create_event(&mut self, event: EventId, flags: u32) -> Result<(), Status> {
        self.queues.create_event(event, flags)
    }

    fn destroy_event(&mut self, event: EventId) -> Result<(), Status> {
        self.queues.destroy_event(event)
    }

    fn record(&mut self, event: EventId, stream: StreamId) -> Result<(), Status> {
        self.queues.record(event, stream)
    }

    fn wait_event(&mut self, stream: StreamId, event: EventId) -> Result<(), Status> {
        self.queues.wait_event(stream, event)
    }

    fn event_done(&mut self, event: EventId) -> Result<bool, Status> {
        self.queues.check_event(event).map(|()| true)
    }

    fn sync_event(&mut self, event: EventId) -> Result<(), Status> {
        self.queues.check_event(event)
    }

    fn elapsed(&mut self, start: EventId, end: EventId) -> Result<f32, Status> {
        self.queues.elapsed(start, end)
    }

    fn stream_done(&mut self, stream: StreamId) -> Result<bool, Status> {
        self.queues.check_stream(stream).map(|()| true)
    }

    fn sync_stream(&mut self, stream: StreamId) -> Result<(), Status> {
        self.queues.check_stream(stream)
    }

    fn synchronize(&mut self) -> Result<(), Status> {
        Ok(())
    }

    fn event_age(&mut self, event: EventId) -> Option<Duration> {
        self.queues.event_age(event)
    }

    fn set_event_age(&mut self, event: EventId, age: Duration) -> Result<(), Status> {
        self.queues.set_event_age(event, age)
    }

    fn device_time(&mut self) -> Duration {
        self.device_time
    }

    fn launch(&mut self, l: &KernelLaunch) -> Result<(), DeviceError> {
        self.queues.check_stream(l.stream)?;
        self.last_touched.clear();
        let m = self.modules.get(&l.module).ok_or(INVALID_HANDLE)?;
        let k = m
            .layout
            .kernels
            .iter()
            .find(|k| k.name == l.function)
            .ok_or(INVALID_HANDLE)?;
        let threads = l.block.iter().map(|&d| d as u64).product::<u64>();
        if threads == 0
            || threads > 1024
            || l.block[2] > 64
            || l.grid[1] > 65535
            || l.grid[2] > 65535
            || l.grid.contains(&0)
        {
            // What NVIDIA's driver answers cuLaunchKernel with a block or grid it cannot run.
            return Err(DeviceError::new(
                INVALID_VALUE,
                format!(
                    "launch configuration grid {:?} block {:?} is out of range",
                    l.grid, l.block
                ),
            ));
        }
        if l.shared_mem as i64 > self.model.shared_per_block_optin as i64 {
            return Err(INVALID_VALUE.into());
        }
        let need = k
            .params
            .iter()
            .map(|p| p.offset + p.size)
            .max()
            .unwrap_or(0) as usize;
        if l.params.len() < need {
            return Err(INVALID_VALUE.into());
        }
        let program = match &m.program {
            Ok(p) => p,
            Err(u) => {
                return Err(DeviceError::new(
                    u.status,
                    format!("{}: {}", l.function, u.why),
                ));
            }
        };
        let cfg = gpufuse_ptx::LaunchConfig {
            grid: l.grid,
            block: l.block,
            dynamic_shared_bytes: l.shared_mem,
        };
        if l.cooperative {
            let smem = program
                .kernel(l.function)
                .map_or(0, |i| i.static_shared_bytes as u64)
                + l.shared_mem as u64;
            let fits = model::coresident_blocks(self.model, threads, smem);
            let blocks = l.grid.iter().map(|&d| d as u64).product::<u64>();
            if blocks > fits {
                return Err(DeviceError::new(
                    COOPERATIVE_LAUNCH_TOO_LARGE,
                    format!(
                        "{}: cooperative grid of {blocks} blocks, the device holds {fits} of \
                         {threads} threads at once",
                        l.function
                    ),
                ));
            }
        }
        if self.heap.is_none() && program.kernel_uses_heap(l.function) {
            // Device memory like any allocation, but the application's calls never name it
            // (as on a GPU, heap blocks are not for cudaMemcpy or cudaFree).
            let size = self.heap_size;
            let base = self.alloc(size)?;
            self.heap = Some(gpufuse_ptx::Heap::new(base, size));
        }
        if l.cooperative && self.workspace.is_none() {
            self.workspace = Some(self.alloc(16)?);
        }
        let Some(m) = self.modules.get(&l.module) else {
            return Err(INVALID_HANDLE.into());
        };
        let Ok(program) = &m.program else {
            return Err(INVALID_HANDLE.into());
        };
        let variables = &m.variables;
        let mut mem = Memory::new(
            &mut self.allocations,
            self.host_mapped.as_mut(),
            self.heap.as_ref(),
            &self.textures,
            l.cancel,
        );
        mem.printf_fifo = self.printf_fifo;
        let workspace = self.workspace.filter(|_| l.cooperative);
        let symbols = |name: &str| variables.get(name).map(|&(p, _)| p);
        let threads = gpufuse_ptx::default_threads();
        let result = program.launch_with(
            l.function, &cfg, l.params, &mem, &symbols, threads, workspace,
        );
        self.last_touched = mem
            .regions
            .iter()
            .zip(&mem.touched)
            .filter(|(_, t)| t.load(std::sync::atomic::Ordering::Relaxed))
            .map(|(r, _)| r.0)
            .collect();
        // printf output reaches the application even when the launch then faults.
        let printed = mem.printed.into_inner().unwrap_or_else(|p| p.into_inner());
        if self.output.len() < 16 * self.printf_fifo {
            self.output.extend_from_slice(&printed);
        }
        match result {
            Ok(stats) => {
                self.device_time += stats.elapsed;
                Ok(())
            }
            Err(e) => {
                let status = match e {
                    gpufuse_ptx::ExecError::IllegalAddress(_) => ILLEGAL_ADDRESS,
                    gpufuse_ptx::ExecError::MisalignedAddress(_) => MISALIGNED_ADDRESS,
                    gpufuse_ptx::ExecError::Assert(_) => ASSERT,
                    gpufuse_ptx::ExecError::Trap | gpufuse_ptx::ExecError::StackOverflow => {
                        LAUNCH_FAILED
                    }
                    gpufuse_ptx::ExecError::InvalidLaunch(_) => INVALID_VALUE,
                    gpufuse_ptx::ExecError::NoKernel(_) => INVALID_HANDLE,
                    gpufuse_ptx::ExecError::Unsupported(_) => NOT_SUPPORTED,
                    // A texture or surface object that does not exist, or a surface access
                    // out of range with `.trap`: a fault like an illegal address.
                    gpufuse_ptx::ExecError::Texture(_) => ILLEGAL_ADDRESS,
                    gpufuse_ptx::ExecError::Deadlock(_) => LAUNCH_FAILED,
                    // Stopped because the session is ending: nobody waits for the status.
                    gpufuse_ptx::ExecError::Cancelled => LAUNCH_FAILED,
                };
                Err(DeviceError::new(status, e.to_string()))
            }
        }
    }

    fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    fn create_texture(
        &mut self,
        handle: u64,
        desc: &gpufuse_proto::TexObjectDesc,
    ) -> Result<(), Status> {
        let t = texture(desc)?;
        if handle == 0 || self.textures.contains_key(&handle) {
            return Err(INVALID_VALUE);
        }
        self.textures.insert(handle, t);
        self.texture_descs.insert(handle, *desc);
        Ok(())
    }

    fn destroy_texture(&mut self, handle: u64) -> Result<(), Status> {
        self.texture_descs.remove(&handle);
        self.textures
            .remove(&handle)
            .map(|_| ())
            .ok_or(INVALID_HANDLE)
    }

    fn resident(&self) -> Vec<(u64, u64)> {
        // Shared allocations are pages of the client's host memory, not the device's: they
        // stay where they are (never evicted).
        self.allocations
            .iter()
            .filter(|(_, w)| !w.is_shared())
            .map(|(&a, w)| (a, w.len() as u64))
            .chain(
                self.vmm
                    .unmapped()
                    .map(|(id, size)| (vmm::PHYSICAL_KEY | id, size)),
            )
            .collect()
    }

    fn evict(&mut self, ptr: u64) -> Result<Vec<u8>, Status> {
        if self.allocations.get(&ptr).is_some_and(|w| w.is_shared()) {
            // Memory the client uses at the same time cannot move away behind its back.
            return Err(NOT_SUPPORTED);
        }
        let words = if ptr & vmm::PHYSICAL_KEY != 0 {
            self.vmm.take_unmapped(ptr & !vmm::PHYSICAL_KEY)
        } else {
            self.allocations.remove(&ptr)
        }
        .ok_or(INVALID_VALUE)?;
        // A copy, as a GPU's would be (device to host), and the device memory goes back.
        let contents = words.to_vec();
        self.evicted.insert(ptr, contents.len() as u64);
        Ok(contents)
    }

    fn bring_back(&mut self, ptr: u64, contents: &[u8]) -> Result<(), Status> {
        if self.evicted.get(&ptr) != Some(&(contents.len() as u64)) {
            return Err(INVALID_VALUE);
        }
        let words = words::Words::from_bytes(contents).ok_or(OUT_OF_MEMORY)?;
        if ptr & vmm::PHYSICAL_KEY != 0 {
            self.vmm.put_unmapped(ptr & !vmm::PHYSICAL_KEY, words)?;
        } else {
            self.allocations.insert(ptr, words);
        }
        self.evicted.remove(&ptr);
        Ok(())
    }

    fn capture(&mut self) -> Result<DeviceImage, CaptureRefused> {
        capture::capture(self)
    }

    fn rebuild(&mut self, image: &DeviceImage) -> Result<(), CaptureRefused> {
        capture::rebuild(self, image)
    }

    fn capture_layout(&mut self) -> Result<DeviceImage, CaptureRefused> {
        capture::capture_layout(self)
    }

    fn last_launch_touched(&self) -> Option<Vec<u64>> {
        Some(self.last_touched.clone())
    }

    fn detach_memory(&mut self) -> Option<Box<dyn Send>> {
        Some(Box::new(std::mem::take(&mut self.allocations)))
    }
}

/// The interpreter's view of a texture or surface object; an option it does not honour is
/// `CUDA_ERROR_INVALID_VALUE` (the shim has already refused what it knows to be unsupported).
fn texture(d: &gpufuse_proto::TexObjectDesc) -> Result<gpufuse_ptx::Texture, Status> {
    use gpufuse_proto::TexShape;
    use gpufuse_ptx::{AddressMode, Shape, TexFormat};
    let format = match d.format {
        0x01 => TexFormat::U8,
        0x02 => TexFormat::U16,
        0x03 => TexFormat::U32,
        0x08 => TexFormat::S8,
        0x09 => TexFormat::S16,
        0x0a => TexFormat::S32,
        0x10 => TexFormat::F16,
        0x20 => TexFormat::F32,
        _ => return Err(INVALID_VALUE),
    };
    if !matches!(d.channels, 1 | 2 | 4) || d.width == 0 || d.height == 0 || d.depth == 0 {
        return Err(INVALID_VALUE);
    }
    let shape = match d.shape {
        TexShape::Linear => Shape::Linear,
        TexShape::D1 => Shape::D1,
        TexShape::D2 => Shape::D2,
        TexShape::D3 => Shape::D3,
        TexShape::Layered1 => Shape::A1,
        TexShape::Layered2 => Shape::A2,
    };
    let sampler = match d.sampler {
        None => None,
        Some(s) => {
            let mode = |m: u32| {
                Ok(match m {
                    0 => AddressMode::Wrap,
                    1 => AddressMode::Clamp,
                    2 => AddressMode::Mirror,
                    3 => AddressMode::Border,
                    _ => return Err(INVALID_VALUE),
                })
            };
            if s.filter > 1 || s.flags & !3 != 0 {
                return Err(INVALID_VALUE);
            }
            Some(gpufuse_ptx::Sampler {
                address: [
                    mode(s.address[0])?,
                    mode(s.address[1])?,
                    mode(s.address[2])?,
                ],
                linear: s.filter == 1,
                normalized_float: s.flags & 1 == 0,
                normalized_coords: s.flags & 2 != 0,
                border: s.border,
            })
        }
    };
    let slice = d.pitch.checked_mul(d.height).ok_or(INVALID_VALUE)?;
    Ok(gpufuse_ptx::Texture {
        addr: d.ptr.get(),
        format,
        channels: d.channels as u8,
        shape,
        width: d.width,
        height: d.height,
        depth: d.depth,
        pitch: d.pitch,
        slice,
        sampler,
    })
}

/// What an image holds, for a log line: `fatbin: elf:sm_90 ptx:sm_120 ...`.
fn image_summary(image: &[u8]) -> String {
    match gpufuse_fatbin::entries(image) {
        Ok(entries) => {
            let list: Vec<String> = entries
                .iter()
                .map(|e| format!("{}:sm_{}", if e.is_ptx() { "ptx" } else { "elf" }, e.sm))
                .collect();
            format!("fatbin: {}", list.join(" "))
        }
        Err(_) => match gpufuse_fatbin::cubin_sm(image) {
            Some(sm) => format!("cubin for sm_{sm}"),
            None => format!("{:?} image", gpufuse_fatbin::classify(image)),
        },
    }
}

/// A diagnostic: with `GPUFUSE_EMU_DUMP_PTX=DIR`, every loaded module's PTX is written to
/// `DIR/<sha256 prefix>.ptx`.
fn dump_ptx(ptx: &str) {
    use sha2::{Digest, Sha256};
    let Some(dir) = std::env::var_os("GPUFUSE_EMU_DUMP_PTX") else {
        return;
    };
    let hash = Sha256::digest(ptx.as_bytes());
    let name: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
    let path = std::path::Path::new(&dir).join(format!("{name}.ptx"));
    if let Err(e) = std::fs::write(&path, ptx) {
        tracing::warn!("cannot dump PTX to {}: {e}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> EmuDevice {
        EmuDevice::new(0, 1 << 30, 0x1000_0000_0000, 1 << 40)
    }

    #[test]
    fn memory_round_trips_and_is_bounds_checked() {
        let mut d = dev();
        let p = d.alloc(1000).unwrap();
        d.write(p + 10, &[1, 2, 3]).unwrap();
        let mut out = [0u8; 3];
        d.read(p + 10, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3]);
        assert_eq!(d.write(p + 999, &[1, 2]), Err(INVALID_VALUE));
        assert_eq!(d.read(p + 5000, &mut out), Err(INVALID_VALUE));
        d.memset(p, 0xAABB_CCDD, 4, 250, 0).unwrap();
        d.read(p, &mut out).unwrap();
        assert_eq!(out, [0xDD, 0xCC, 0xBB]);
        assert_eq!(d.free(p + 1), Err(INVALID_VALUE));
        assert_eq!(d.free(p), Ok(1000));
        assert_eq!(d.alloc(2 << 30), Err(OUT_OF_MEMORY));
    }

    /// Copies and memsets across virtual-memory mappings that follow each other (PyTorch's
    /// expandable segments); separate allocations never join, and a gap ends the range.
    #[test]
    fn ranges_span_adjacent_mappings_only() {
        use vmm::GRANULARITY as G;
        let mut d = dev();
        let range = d.reserve(4 * G, 0).unwrap();
        for i in 0..2 {
            let p = d.create_physical(G).unwrap();
            d.map(range + i * G, p).unwrap();
        }
        let across = range + G - 3;
        assert!(d.contains(across, 6));
        d.write(across, b"abcdef").unwrap();
        let mut out = [0u8; 6];
        d.read(across, &mut out).unwrap();
        assert_eq!(&out, b"abcdef");
        d.memset(across - 1, 0x0102_0304, 4, 2, 0).unwrap();
        d.read(across - 1, &mut out).unwrap();
        assert_eq!(out, [4, 3, 2, 1, 4, 3]);
        d.copy(range, across - 1, 6, 0).unwrap();
        let mut back = [0u8; 6];
        d.read(range, &mut back).unwrap();
        assert_eq!(back, out);
        // The third granule is unmapped: a range into it is refused.
        assert!(!d.contains(range + 2 * G - 2, 4));
        assert_eq!(d.write(range + 2 * G - 2, &[0; 4]), Err(INVALID_VALUE));
        // Two plain allocations that happen to be adjacent do not join.
        let a = d.alloc(ALIGN).unwrap();
        let b = d.alloc(ALIGN).unwrap();
        assert_eq!(b, a + ALIGN);
        assert!(!d.contains(a + ALIGN - 2, 4));
    }

    #[test]
    fn modules_give_layouts_and_globals() {
        let mut d = dev();
        let ptx = b".version 8.0\n.target sm_80\n.address_size 64\n.global .align 4 .u32 counter = 7;\n.visible .entry k(.param .u64 a, .param .u32 b)\n{ ret; }\n\0";
        let m = d.load_module(ptx).unwrap();
        let f = d.function(m, "k").unwrap();
        assert_eq!(
            f.params
                .iter()
                .map(|p| (p.offset, p.size))
                .collect::<Vec<_>>(),
            vec![(0, 8), (8, 4)]
        );
        let (ptr, size) = d.global(m, "counter").unwrap();
        let mut v = [0u8; 4];
        d.read(ptr, &mut v).unwrap();
        assert_eq!((u32::from_le_bytes(v), size), (7, 4));
        assert_eq!(d.function(m, "nope"), Err(NOT_FOUND));
        assert_eq!(
            d.load_module(b"\x7fELF\x02garbage").map_err(|e| e.status),
            Err(NO_BINARY_FOR_GPU)
        );
    }

    /// A block or grid the GPU cannot run is CUDA_ERROR_INVALID_VALUE, as NVIDIA's driver
    /// answers cuLaunchKernel (it was 9, which is no CUresult at all); the edges still run.
    #[test]
    fn a_launch_configuration_out_of_range_is_invalid_value() {
        let mut d = dev();
        let ptx =
            b".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k()\n{ ret; }\n\0";
        let m = d.load_module(ptx).unwrap();
        let launch = |d: &mut EmuDevice, grid: [u32; 3], block: [u32; 3]| {
            d.launch(&KernelLaunch {
                module: m,
                function: "k",
                grid,
                block,
                shared_mem: 0,
                params: &[],
                stream: 0,
                cooperative: false,
                cancel: None,
            })
            .map(|_| ())
            .map_err(|e| e.status)
        };
        for (grid, block) in [
            ([1, 1, 1], [0, 1, 1]),
            ([1, 1, 1], [1025, 1, 1]),
            ([1, 1, 1], [32, 32, 2]),
            ([1, 1, 1], [1, 1, 65]),
            ([0, 1, 1], [32, 1, 1]),
            ([1, 65536, 1], [32, 1, 1]),
            ([1, 1, 65536], [32, 1, 1]),
        ] {
            assert_eq!(
                launch(&mut d, grid, block),
                Err(INVALID_VALUE),
                "grid {grid:?} block {block:?}"
            );
        }
        launch(&mut d, [1, 1, 1], [1024, 1, 1]).unwrap();
        launch(&mut d, [1, 65535, 1], [1, 1, 64]).unwrap();
        assert_eq!(INVALID_VALUE, gpufuse_cuda_types::CUDA_ERROR_INVALID_VALUE);
    }

    /// A fatbin with SASS for this GPU's architecture and PTX only for a newer one (how cuBLAS
    /// ships its kernels) loads as on a GPU: kernels, parameter layouts and variables from the
    /// cubin; only a launch fails, with CUDA_ERROR_NO_BINARY_FOR_GPU naming the kernel.
    #[test]
    fn sass_only_modules_load_and_refuse_only_launches() {
        let mut d = dev();
        let image = include_bytes!("../../tests/fixtures/sass_only.fatbin");
        let m = d.load_module(image).unwrap();
        let params = |d: &mut EmuDevice, k: &str| {
            let f = d.function(m, k).unwrap();
            f.params
                .iter()
                .map(|p| (p.offset, p.size))
                .collect::<Vec<_>>()
        };
        assert_eq!(params(&mut d, "scale"), [(0, 8), (8, 4), (12, 4)]);
        assert_eq!(params(&mut d, "mixed"), [(0, 1), (8, 16), (24, 8)]);
        let (bias, size) = d.global(m, "bias").unwrap();
        assert_eq!(size, 16);
        let mut v = [0u8; 16];
        d.read(bias, &mut v).unwrap();
        assert_eq!(v[4..8], 2.0f32.to_le_bytes());
        assert_eq!(d.global(m, "launches").unwrap().1, 4);
        let launch = KernelLaunch {
            module: m,
            function: "scale",
            grid: [1, 1, 1],
            block: [32, 1, 1],
            shared_mem: 0,
            params: &[0; 16],
            stream: 0,
            cooperative: false,
            cancel: None,
        };
        let e = d.launch(&launch).unwrap_err();
        assert_eq!(e.status, NO_BINARY_FOR_GPU);
        let why = e.detail();
        assert!(why.contains("scale") && why.contains("sm_100"), "{why}");
    }

    /// The reference kernels (crates/ptx/tests/fixtures), loaded as a PTX image.
    fn fixtures(d: &mut EmuDevice) -> ModuleId {
        let ptx = include_str!("../../../ptx/tests/fixtures/kernels.ptx");
        d.load_module(format!("{ptx}\0").as_bytes()).unwrap()
    }

    fn run(
        d: &mut EmuDevice,
        m: ModuleId,
        name: &str,
        grid: u32,
        block: u32,
        params: &[u8],
    ) -> Result<(), DeviceError> {
        d.launch(&KernelLaunch {
            module: m,
            function: name,
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            shared_mem: 0,
            params,
            stream: 0,
            cooperative: false,
            cancel: None,
        })
    }

    /// Blocks run in parallel over the device's memory: atomics are exact under contention,
    /// and neighbouring byte stores from different blocks all land.
    #[test]
    fn parallel_blocks_share_device_memory_exactly() {
        let mut d = dev();
        let m = fixtures(&mut d);
        let (blocks, threads) = (48u32, 256u32);
        let total = blocks * threads;
        let c = d.alloc(64).unwrap();
        let wide = d.alloc(8).unwrap();
        let f = d.alloc(4).unwrap();
        let bytes = d.alloc(total as u64).unwrap();
        let params: Vec<u8> = [c, wide, f, bytes]
            .iter()
            .flat_map(|p| p.to_le_bytes())
            .collect();
        run(&mut d, m, "contend", blocks, threads, &params).unwrap();
        let mut out = [0u8; 28];
        d.read(c, &mut out).unwrap();
        let got: Vec<u32> = out
            .chunks(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let sum = |k: u32| (0..total).filter(|g| g % 3 == k).sum::<u32>();
        assert_eq!(
            got,
            [total, sum(0), sum(1), sum(2), total - 1, total, 2 * total]
        );
        let mut w = [0u8; 8];
        d.read(wide, &mut w).unwrap();
        assert_eq!(u64::from_le_bytes(w), total as u64 * ((1 << 32) + 1));
        let mut b = vec![0u8; total as usize];
        d.read(bytes, &mut b).unwrap();
        assert!(b
            .iter()
            .enumerate()
            .all(|(g, &x)| x == (g as u32 * 7) as u8));
    }

    /// A shared allocation (managed memory a same-host client uses at the same time): the
    /// device's atomics and another party's atomics on the same words lose nothing, copies
    /// and memsets go word by word, it is never viewed as bytes, evicted or captured, and
    /// freeing it leaves the backing memory alone.
    #[test]
    fn shared_allocations_are_one_coherence_domain_with_their_owner() {
        let ptx = r#"
.version 8.0
.target sm_90
.address_size 64
.visible .entry addmany(.param .u64 p)
{
    .reg .u64 %rd<2>;
    .reg .u32 %r<4>;
    .reg .pred %p<2>;
    ld.param.u64 %rd1, [p];
    mov.u32 %r1, 0;
LOOP:
    atom.sys.global.add.u32 %r2, [%rd1], 1;
    add.u32 %r1, %r1, 1;
    setp.lt.u32 %p1, %r1, 100;
    @%p1 bra LOOP;
    ret;
}
"#;
        let mut d = dev();
        let m = d.load_module(format!("{ptx}\0").as_bytes()).unwrap();
        let backing: Vec<AtomicU64> = (0..16).map(|_| AtomicU64::new(0)).collect();
        let span = words::test_span(&backing);
        assert_eq!(d.alloc_shared(0, span), Err(INVALID_VALUE));
        assert_eq!(
            d.alloc_shared(129, span),
            Err(INVALID_VALUE),
            "longer than its backing"
        );
        let own = d.alloc(100).unwrap();
        let p = d.alloc_shared(128, span).unwrap();
        assert_eq!(p % SHARED_ALIGN, 0);
        assert!(p >= own + 100);
        // The host side adds to the same counter while the kernel runs.
        let (blocks, threads, host_adds) = (8u32, 64u32, 50_000u64);
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..host_adds {
                    backing[0].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            });
            run(&mut d, m, "addmany", blocks, threads, &p.to_le_bytes()).unwrap();
        });
        let mut counter = [0u8; 4];
        d.read(p, &mut counter).unwrap();
        let want = (blocks * threads * 100) as u64 + host_adds;
        assert_eq!(u32::from_le_bytes(counter) as u64, want);
        // Copies and memsets reach the backing words; the device never views them as bytes.
        d.write(p + 9, b"abc").unwrap();
        assert_eq!(
            backing[1].load(std::sync::atomic::Ordering::SeqCst) >> 8 & 0xff_ffff,
            0x636261
        );
        d.memset(p + 16, 0x7f, 1, 8, 0).unwrap();
        assert_eq!(
            backing[2].load(std::sync::atomic::Ordering::SeqCst),
            0x7f7f_7f7f_7f7f_7f7f
        );
        d.copy(own, p + 16, 8, 0).unwrap();
        let mut back = [0u8; 8];
        d.read(own, &mut back).unwrap();
        assert_eq!(back, [0x7f; 8]);
        assert!(d.view(p, 8).is_none() && d.view_mut(p, 8).is_none());
        assert!(
            d.write(p + 120, &[0; 9]).is_err(),
            "bounds are the allocation's"
        );
        // Elastic features leave it alone or refuse.
        assert!(d.resident().iter().all(|&(a, _)| a != p));
        assert_eq!(d.evict(p), Err(NOT_SUPPORTED));
        let refused = d.capture().unwrap_err();
        assert_eq!(refused.status, NOT_SUPPORTED);
        assert!(refused.why.contains("shared"), "{}", refused.why);
        assert_eq!(d.free(p), Ok(128));
        assert!(!d.contains(p, 1));
        assert_eq!(
            backing[2].load(std::sync::atomic::Ordering::SeqCst),
            0x7f7f_7f7f_7f7f_7f7f,
            "freeing leaves the backing alone"
        );
        assert!(
            d.capture().is_ok(),
            "without shared memory the session captures again"
        );
    }

    /// POSIX-fd export and import of physical memory: exported memory keeps its contents
    /// (mapped or not), imported memory is another process's words; neither is evicted or
    /// captured.
    #[test]
    fn shared_physical_memory_keeps_its_contents_and_never_leaves() {
        let mut d = dev();
        let size = vmm::GRANULARITY;
        let n = (size / 8) as usize;
        let id = d.create_physical(size).unwrap();
        let va = d.reserve(2 * size, size).unwrap();
        d.map(va, id).unwrap();
        d.write(va + 16, b"exported").unwrap();
        let backing: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
        d.share_physical(id, words::test_span(&backing)).unwrap();
        assert_eq!(
            backing[2]
                .load(std::sync::atomic::Ordering::SeqCst)
                .to_le_bytes(),
            *b"exported"
        );
        assert!(
            d.capture().is_err(),
            "shared physical memory is not captured"
        );
        d.unmap(va, size).unwrap();
        assert!(d
            .resident()
            .iter()
            .all(|&(a, _)| a & vmm::PHYSICAL_KEY == 0));
        assert_eq!(d.evict(vmm::PHYSICAL_KEY | id), Err(INVALID_VALUE));
        // Imported: the other side's words, mapped where this side wants them.
        let other: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
        other[1].store(
            u64::from_le_bytes(*b"imported"),
            std::sync::atomic::Ordering::SeqCst,
        );
        assert_eq!(
            d.create_physical_shared(size - 8, words::test_span(&other)),
            Err(INVALID_VALUE),
            "whole granules only"
        );
        let imported = d
            .create_physical_shared(size, words::test_span(&other))
            .unwrap();
        d.map(va + size, imported).unwrap();
        let mut got = [0u8; 8];
        d.read(va + size + 8, &mut got).unwrap();
        assert_eq!(&got, b"imported");
        d.unmap(va + size, size).unwrap();
        d.release_physical(imported).unwrap();
        d.release_physical(id).unwrap();
        assert!(d.capture().is_ok(), "nothing shared is left");
    }

    /// CUDA IPC's export: an allocation moved into memory another process maps keeps its
    /// address and contents, and its words are then that memory's.
    #[test]
    fn a_shared_allocation_keeps_its_address_and_contents_in_its_new_memory() {
        let mut d = dev();
        let p = d.alloc(20).unwrap();
        d.write(p, b"hello, other process").unwrap();
        let backing: Vec<AtomicU64> = (0..3).map(|_| AtomicU64::new(0)).collect();
        let short: Vec<AtomicU64> = (0..2).map(|_| AtomicU64::new(0)).collect();
        assert_eq!(d.share(p, words::test_span(&short)), Err(INVALID_VALUE));
        assert_eq!(
            d.share(p + 8, words::test_span(&backing)),
            Err(INVALID_VALUE)
        );
        d.share(p, words::test_span(&backing)).unwrap();
        assert_eq!(
            backing[0]
                .load(std::sync::atomic::Ordering::SeqCst)
                .to_le_bytes(),
            *b"hello, o"
        );
        assert_eq!(
            d.share(p, words::test_span(&backing)),
            Err(INVALID_VALUE),
            "already shared"
        );
        // The other process writes; the device reads its words.
        backing[1].store(
            u64::from_le_bytes(*b"THER PRO"),
            std::sync::atomic::Ordering::SeqCst,
        );
        let mut out = [0u8; 20];
        d.read(p, &mut out).unwrap();
        assert_eq!(&out, b"hello, oTHER PROcess");
        assert!(d.view(p, 8).is_none());
        assert!(d.resident().iter().all(|&(a, _)| a != p));
        assert_eq!(d.free(p), Ok(20));
    }

    /// The client's host arena mapped at its own address (page-locked memory under unified
    /// addressing): kernels read and write it there, with atomics the host's meet; it is no
    /// allocation (not contained, not resident, no capture refused); a range that would
    /// overlap the session's window is refused, and a new arena drops the mapping.
    #[test]
    fn the_host_arena_is_reachable_by_kernels_at_the_clients_address() {
        let ptx = r#"
.version 8.0
.target sm_90
.address_size 64
.visible .entry bump(.param .u64 p)
{
    .reg .u64 %rd<2>;
    .reg .u32 %r<4>;
    ld.param.u64 %rd1, [p];
    ld.global.u32 %r1, [%rd1+8];
    st.global.u32 [%rd1+12], %r1;
    atom.sys.global.add.u32 %r2, [%rd1], 1;
    ret;
}
"#;
        let mut d = dev();
        let m = d.load_module(format!("{ptx}\0").as_bytes()).unwrap();
        let backing: Vec<AtomicU64> = (0..512).map(|_| AtomicU64::new(0)).collect();
        let span = words::test_span(&backing);
        let base = 0x7f00_0000_0000u64;
        assert_eq!(d.map_host_arena(base), Err(INVALID_VALUE), "no arena yet");
        d.host_arena(span, None).unwrap();
        assert_eq!(
            d.map_host_arena(0x1000_0000_0000 + 4096),
            Err(NOT_SUPPORTED),
            "inside the session's window"
        );
        assert_eq!(d.map_host_arena(base + 8), Err(INVALID_VALUE), "misaligned");
        d.map_host_arena(base).unwrap();
        let own = d.alloc(64).unwrap();
        backing[1].store(0x55 | (9 << 32), std::sync::atomic::Ordering::SeqCst);
        run(&mut d, m, "bump", 4, 32, &base.to_le_bytes()).unwrap();
        assert_eq!(backing[0].load(std::sync::atomic::Ordering::SeqCst), 128);
        assert_eq!(
            backing[1].load(std::sync::atomic::Ordering::SeqCst),
            0x55 | (0x55 << 32),
            "the kernel read and wrote the host's words"
        );
        let top = base + (backing.len() * 8) as u64;
        let e = run(&mut d, m, "bump", 1, 1, &(top - 8).to_le_bytes()).unwrap_err();
        assert_eq!(e.status, ILLEGAL_ADDRESS, "bounds are the arena's");
        assert!(!d.contains(base, 8), "host memory is no allocation");
        assert!(d.resident().iter().all(|&(a, _)| a == own));
        assert!(d.capture().is_ok());
        let other: Vec<AtomicU64> = (0..8).map(|_| AtomicU64::new(0)).collect();
        d.host_arena(words::test_span(&other), None).unwrap();
        let e = run(&mut d, m, "bump", 1, 1, &base.to_le_bytes()).unwrap_err();
        assert_eq!(
            e.status, ILLEGAL_ADDRESS,
            "a new arena is not mapped until asked"
        );
    }

    /// An illegal address in one block of a parallel launch fails it with
    /// CUDA_ERROR_ILLEGAL_ADDRESS; the failure is described for the worker's log.
    #[test]
    fn illegal_address_in_one_block_fails_the_launch() {
        let mut d = dev();
        let m = fixtures(&mut d);
        let p = d.alloc(64 * 128 * 4).unwrap();
        let params = |bad: i32| [p.to_le_bytes().as_slice(), &bad.to_le_bytes()].concat();
        let e = run(&mut d, m, "oob_block", 64, 128, &params(41)).unwrap_err();
        assert_eq!(e.status, ILLEGAL_ADDRESS);
        assert!(e.detail().contains("illegal address"), "{e}");
        run(&mut d, m, "oob_block", 64, 128, &params(-1)).unwrap();
    }

    /// A misaligned load fails with CUDA_ERROR_MISALIGNED_ADDRESS, a failed device-side
    /// `assert()` with CUDA_ERROR_ASSERT carrying its message.
    #[test]
    fn misaligned_access_and_device_assert_fail_with_their_status() {
        let mut d = dev();
        let ptx = ".version 8.0\n.target sm_80\n.address_size 64\n\
            .extern .func __assertfail(.param .b64 a, .param .b64 b, .param .b32 c, \
            .param .b64 d, .param .b64 e);\n\
            .global .align 1 .b8 $str[6] = {120, 32, 60, 32, 51, 0};\n\
            .visible .entry odd(.param .u64 p)\n{\n.reg .b32 %r<2>;\n.reg .b64 %rd<2>;\n\
            ld.param.u64 %rd1, [p];\nld.global.u32 %r1, [%rd1+2];\nret;\n}\n\
            .visible .entry fails(.param .u64 p)\n{\n.reg .b32 %r<2>;\n.reg .b64 %rd<4>;\n\
            mov.u64 %rd1, $str;\ncvta.global.u64 %rd2, %rd1;\n{\n.param .b64 param0;\n\
            st.param.b64 [param0], %rd2;\n.param .b64 param1;\nst.param.b64 [param1], %rd2;\n\
            .param .b32 param2;\nst.param.b32 [param2], 7;\n.param .b64 param3;\n\
            st.param.b64 [param3], %rd2;\n.param .b64 param4;\nst.param.b64 [param4], 1;\n\
            call.uni __assertfail, (param0, param1, param2, param3, param4);\n}\nret;\n}\n\0";
        let m = d.load_module(ptx.as_bytes()).unwrap();
        let p = d.alloc(64).unwrap();
        let e = run(&mut d, m, "odd", 1, 32, &p.to_le_bytes()).unwrap_err();
        assert_eq!(e.status, MISALIGNED_ADDRESS);
        assert!(e.detail().contains("misaligned address"), "{e}");
        let e = run(&mut d, m, "fails", 1, 1, &p.to_le_bytes()).unwrap_err();
        assert_eq!(e.status, ASSERT);
        let why = e.detail();
        assert!(why.contains("Assertion `x < 3` failed"), "{why}");
    }

    /// PTX with line information (`nvcc -lineinfo`: a `.loc` line before each statement) loads
    /// and its kernels store what they compute (the `.loc` line once swallowed the statement
    /// after it, so such kernels ran and stored nothing); managed variables are marked.
    #[test]
    fn line_information_and_managed_variables() {
        let mut d = dev();
        let ptx = include_str!("../../../ptx/tests/fixtures/kernels.lineinfo.ptx");
        let m = d.load_module(format!("{ptx}\0").as_bytes()).unwrap();
        let n = 64u32;
        let (a, b, c) = (
            d.alloc(256).unwrap(),
            d.alloc(256).unwrap(),
            d.alloc(256).unwrap(),
        );
        let xs: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
        d.write(a, &xs).unwrap();
        d.write(b, &xs).unwrap();
        let params: Vec<u8> = [a, b, c]
            .iter()
            .flat_map(|p| p.to_le_bytes())
            .chain(n.to_le_bytes())
            .collect();
        run(&mut d, m, "vadd", 1, n, &params).unwrap();
        let mut out = vec![0u8; 256];
        d.read(c, &mut out).unwrap();
        let got: Vec<f32> = out
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(got, (0..n).map(|i| 2.0 * i as f32).collect::<Vec<_>>());

        let ptx = ".version 9.0\n.target sm_80\n.address_size 64\n\
            .global .attribute(.managed) .align 4 .u32 counter = 3;\n\
            .global .align 4 .u32 plain;\n.visible .entry k() { ret; }\n";
        let m = d.load_module(format!("{ptx}\0").as_bytes()).unwrap();
        let vars = &d.modules[&m].layout.variables;
        assert_eq!(
            vars.iter()
                .map(|v| (v.name.as_str(), v.managed))
                .collect::<Vec<_>>(),
            [("counter", true), ("plain", false)]
        );
        let (ptr, size) = d.global(m, "counter").unwrap();
        let mut v = [0u8; 4];
        d.read(ptr, &mut v).unwrap();
        assert_eq!((u32::from_le_bytes(v), size), (3, 4));

        // PTX that does not parse is refused at load, with the reason.
        let bad = ".version 9.0\n.target sm_80\n.address_size 64\n.bogus 1;\n\0";
        let e = d.load_module(bad.as_bytes()).unwrap_err();
        assert_eq!(e.status, INVALID_PTX);
        let why = e.detail();
        assert!(why.contains("line 4") && why.contains(".bogus"), "{why}");
    }
}
