//! Moving a session to another device of its node, inside its worker, with pre-copy: the
//! client keeps its connection and its handles, and the session keeps running while its
//! memory is copied.
//!
//! 1. *Begin* ([`Session::precopy_begin`]): the session's layout
//!    ([`gpufuse_device::Device::capture_layout`]: ranges, modules, VMM books, textures, no
//!    contents) is rebuilt on the target at the same addresses, zeroed.
//! 2. *Rounds* ([`Session::precopy_step`], between requests, a bounded number of bytes at a
//!    time): every chunk of every range is copied once; what device work could have written
//!    since (see [`Dirt`]) is queued again; further rounds copy what is dirty, until the dirty
//!    set is small or stops shrinking.
//! 3. *Stop* ([`Session::precopy_finish`]): between requests, the dirty remainder is copied,
//!    the layout checked unchanged (a session that allocated, freed or loaded meanwhile is
//!    captured and rebuilt whole instead), and the session switches to the target.
//!
//! Anything that cannot move refuses the move before anything changed. The same rounds move a
//! session to another node ([`MoveTarget`]: `remote.rs` sends what they copy to the worker
//! there); `docs/migration.md` describes both.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use gpufuse_device::{Device, DeviceImage};
use gpufuse_proto::{MoveFigures, Request};

use crate::{DeviceSlot, Session};
use gpufuse_proto::DevicePtr;

/// Opens the node's device `index` for this session (same address window, same model): how a
/// worker gets the target of a move.
pub type DeviceOpener = Box<dyn FnMut(u32) -> Result<Box<dyn Device>, String> + Send>;

/// Where a move copies the session: a fresh device of this node, or the worker on another
/// node that takes the session over (`remote.rs`).
pub trait MoveTarget {
    /// Builds `image` (a layout without contents, or a whole capture), starting over.
    fn rebuild(&mut self, image: &DeviceImage) -> Result<(), String>;
    /// Writes `data` at `addr`, inside what the last rebuild built.
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), String>;
}

impl MoveTarget for Box<dyn Device> {
    fn rebuild(&mut self, image: &DeviceImage) -> Result<(), String> {
        Device::rebuild(&mut **self, image).map_err(|e| e.to_string())
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), String> {
        Device::write(&mut **self, addr, data).map_err(|s| {
            format!(
                "copying {} bytes at {addr:#x} to the target failed (CUDA status {s})",
                data.len()
            )
        })
    }
}

/// Makes a move's target fresh again (the session's layout changed during pre-copy): a new
/// device in its place, or the same remote worker, which starts over at the next layout.
pub type Reopen<'a, T> = &'a mut dyn FnMut(&mut T) -> Result<(), String>;

/// The unit of dirty tracking and copying: ranges are copied and marked dirty in chunks of
/// this size (the last chunk of a range may be shorter).
pub const CHUNK: u64 = 1 << 20;
/// Bytes copied in one gap between requests while the session runs: the longest pause
/// pre-copy adds to a request is one such copy.
pub const STEP_BYTES: u64 = 8 * CHUNK;
/// A dirty set at most this large is copied in the stop (a few milliseconds at memory speed).
pub const STOP_BYTES: u64 = 16 * CHUNK;
/// Rounds after which the move stops whatever is dirty (a session that writes faster than
/// the copy never converges).
pub const MAX_ROUNDS: u32 = 8;
/// Times the pre-copy starts over on a fresh target because the session's layout changed.
const MAX_RESTARTS: u32 = 3;

/// What device memory a request could have written: pre-copy's dirty rule. A copy or memset
/// writes its destination; a launch writes what the device says it reached
/// ([`Device::last_launch_touched`]), or anything when the device cannot tell; requests that
/// change the layout (allocations, modules, VMM, textures, a reset) count as writing
/// everything, and the layout check at each round's end starts over on a fresh target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dirt {
    Nothing,
    Range { start: u64, len: u64 },
    Launch,
    Everything,
}

impl Dirt {
    /// The rule for one request (before it runs).
    pub fn of(req: &Request) -> Dirt {
        use Request::*;
        let rect = |ptr: u64, pitch: u64, width: u64, height: u64| Dirt::Range {
            start: ptr,
            len: pitch
                .saturating_mul(height.saturating_sub(1))
                .saturating_add(width),
        };
        match req {
            MemcpyHtoD {
                dst: DevicePtr(dst),
                data,
                ..
            } => Dirt::Range {
                start: *dst,
                len: data.len() as u64,
            },
            MemcpyDtoD {
                dst: DevicePtr(dst),
                size,
                ..
            } => Dirt::Range {
                start: *dst,
                len: *size,
            },
            Memcpy2DDtoD {
                dst, width, height, ..
            }
            | Memcpy2DHtoD {
                dst, width, height, ..
            } => rect(dst.ptr.get(), dst.pitch, *width, *height),
            Memset {
                dst: DevicePtr(dst),
                elem_size,
                count,
                ..
            } => Dirt::Range {
                start: *dst,
                len: count.saturating_mul(u64::from(*elem_size)),
            },
            Memset2D {
                dst,
                elem_size,
                width,
                height,
                ..
            } => rect(
                dst.ptr.get(),
                dst.pitch,
                width.saturating_mul(u64::from(*elem_size)),
                *height,
            ),
            LaunchKernel(_) => Dirt::Launch,
            _ if !crate::residency::touches_memory(req) => Dirt::Nothing,
            MemcpyDtoH { .. }
            | MemcpyDtoHAsync { .. }
            | Memcpy2DDtoH { .. }
            | MemGetInfo { .. }
            | ModuleGetFunction { .. }
            | ModuleGetGlobal { .. }
            | ModuleImagePart { .. }
            | DebugLaunchLog { .. } => Dirt::Nothing,
            _ => Dirt::Everything,
        }
    }
}

/// A move in progress: the target being filled while the session runs.
pub struct PreCopy<T: MoveTarget = Box<dyn Device>> {
    target: T,
    /// The layout the target was built from.
    layout: DeviceImage,
    /// The layout's ranges: start -> length.
    ranges: BTreeMap<u64, u64>,
    /// Chunks (their start addresses) this round has still to copy.
    current: BTreeSet<u64>,
    /// Chunks written since they were copied (for the next round or the stop).
    dirty: BTreeSet<u64>,
    rounds: u32,
    /// The dirty bytes at the end of the last round.
    last_dirty: Option<u64>,
    precopied: u64,
    restarts: u32,
    /// Set once the rounds are over: the move stops at the next gap.
    ready: bool,
    /// The layout changed: the next gap starts over on a fresh target.
    restart: bool,
    started: Instant,
}

impl<T: MoveTarget> PreCopy<T> {
    /// The target, the move given up.
    pub fn into_target(self) -> T {
        self.target
    }

    fn chunks(&self, start: u64) -> impl Iterator<Item = u64> + '_ {
        let len = self.ranges.get(&start).copied().unwrap_or(0);
        (0..len.div_ceil(CHUNK)).map(move |k| start + k * CHUNK)
    }

    fn chunk_len(&self, chunk: u64) -> u64 {
        self.ranges
            .range(..=chunk)
            .next_back()
            .map_or(0, |(&s, &l)| (s + l).saturating_sub(chunk).min(CHUNK))
    }

    fn dirty_chunk(&mut self, chunk: u64) {
        if !self.current.contains(&chunk) {
            self.dirty.insert(chunk);
        }
    }

    fn dirty_range(&mut self, start: u64) {
        let chunks: Vec<u64> = self.chunks(start).collect();
        for c in chunks {
            self.dirty_chunk(c);
        }
    }

    /// Records what a request (or a launch, given what it reached) could have written.
    fn note(&mut self, dirt: Dirt, touched: Option<Vec<u64>>) {
        match dirt {
            Dirt::Nothing => {}
            Dirt::Range { start, len } => {
                if len == 0 {
                    return;
                }
                let end = start.saturating_add(len);
                let hit: Vec<(u64, u64)> = self
                    .ranges
                    .range(..end)
                    .rev()
                    .take_while(|(&s, &l)| s + l > start)
                    .map(|(&s, &l)| (s, l))
                    .collect();
                for (s, l) in hit {
                    let from = start.max(s);
                    let to = end.min(s + l);
                    let first = s + (from - s) / CHUNK * CHUNK;
                    let mut c = first;
                    while c < to {
                        self.dirty_chunk(c);
                        c += CHUNK;
                    }
                }
            }
            Dirt::Launch => match touched {
                Some(starts) => {
                    for s in starts {
                        self.dirty_range(s);
                    }
                }
                None => self.note(Dirt::Everything, None),
            },
            Dirt::Everything => {
                let starts: Vec<u64> = self.ranges.keys().copied().collect();
                for s in starts {
                    self.dirty_range(s);
                }
            }
        }
    }

    /// Bytes of the chunks in `set`.
    fn bytes_of(&self, set: &BTreeSet<u64>) -> u64 {
        set.iter().map(|&c| self.chunk_len(c)).sum()
    }

    /// Whether the rounds are over (the move stops at the next gap).
    pub fn ready(&self) -> bool {
        self.ready
    }
}

fn ranges_of(layout: &DeviceImage) -> BTreeMap<u64, u64> {
    layout
        .allocations
        .iter()
        .map(|a| (a.addr, a.size))
        .collect()
}

/// Copies `[addr, addr + len)` from `from` to `to`: in place where the backend lets (a host
/// view), else through a buffer.
fn copy_between<T: MoveTarget>(
    from: &mut dyn Device,
    to: &mut T,
    addr: u64,
    len: u64,
) -> Result<(), String> {
    if let Some(src) = from.view(addr, len) {
        return to.write(addr, src);
    }
    let mut buf = vec![0u8; usize::try_from(len).map_err(|_| "a chunk too large".to_string())?];
    from.read(addr, &mut buf).map_err(|s| {
        format!("reading {len} bytes at {addr:#x} to move them failed (CUDA status {s})")
    })?;
    to.write(addr, &buf)
}

impl Session<'_> {
    fn resident_for_move(&mut self) -> Result<(), String> {
        self.ensure_resident().map_err(|s| {
            format!("the session's memory cannot come back to move it (CUDA status {s})")
        })
    }

    /// The session runs on `target` from now on; the old device's memory is freed.
    pub(crate) fn switch_to(&mut self, target: Box<dyn Device>) {
        // Output the old device had not handed over yet travels with the session.
        let pending = self.device.take_output();
        self.forget_arena_events();
        let ages = self.event_ages();
        match std::mem::replace(&mut self.device, DeviceSlot::Moved(target)) {
            // A device the session moved to before: dropped whole, off the session's path
            // (giving a large range's pages back takes a while).
            DeviceSlot::Moved(old) => {
                // If no thread can start, the closure (and the device) is dropped here.
                let _ = std::thread::Builder::new()
                    .name("gpufuse-drop-device".into())
                    .spawn(move || drop(old));
            }
            DeviceSlot::Given(old) => {
                if let Some(memory) = old.detach_memory() {
                    let _ = std::thread::Builder::new()
                        .name("gpufuse-drop-device".into())
                        .spawn(move || drop(memory));
                }
                for &(e, _) in &ages {
                    let _ = old.destroy_event(e);
                }
                for &s in &self.sync.streams {
                    let _ = old.destroy_stream(s);
                }
                for (ptr, _) in old.resident() {
                    if old.free(ptr).is_err() {
                        // Mapped VMM memory and the device's own ranges: dropped with their
                        // contents.
                        let _ = old.evict(ptr);
                    }
                }
            }
        }
        self.rebuild_sync(&ages);
        if !pending.is_empty() {
            tracing::debug!(
                bytes = pending.len(),
                "device output carried across the move"
            );
            self.carried_output.extend_from_slice(&pending);
        }
    }

    /// Starts a move with pre-copy onto `target` (a fresh device of the same window): the
    /// session's layout is built there. Nothing changes on the session's own device; an error
    /// says why the session cannot move.
    pub fn precopy_begin<T: MoveTarget>(&mut self, mut target: T) -> Result<PreCopy<T>, String> {
        let started = Instant::now();
        self.resident_for_move()?;
        let layout = self.device.capture_layout().map_err(|e| e.to_string())?;
        target.rebuild(&layout)?;
        let ranges = ranges_of(&layout);
        let mut p = PreCopy {
            target,
            layout,
            ranges,
            current: BTreeSet::new(),
            dirty: BTreeSet::new(),
            rounds: 1,
            last_dirty: None,
            precopied: 0,
            restarts: 0,
            ready: false,
            restart: false,
            started,
        };
        p.current = p.ranges.keys().flat_map(|&s| p.chunks(s)).collect();
        Ok(p)
    }

    /// Records what the request that just ran could have written (`dirt`, from
    /// [`Dirt::of`] before it ran).
    pub fn precopy_note<T: MoveTarget>(&self, p: &mut PreCopy<T>, dirt: Dirt) {
        let touched = if dirt == Dirt::Launch {
            self.device.last_launch_touched()
        } else {
            None
        };
        if dirt == Dirt::Everything {
            // Perhaps a layout change: looked at when the round ends.
            // (Unmapped VMM physical memory is resident without being a range.)
            let unmapped = p.layout.physical.iter().filter(|x| x.mapped_at.is_none());
            p.restart =
                p.restart || self.device.resident().len() != p.ranges.len() + unmapped.count();
        }
        p.note(dirt, touched);
    }

    /// One gap's worth of pre-copy: up to [`STEP_BYTES`] copied, and the round's end when it
    /// comes (the rounds end when the dirty set is small or stops shrinking). `reopen` makes
    /// the target fresh when the layout changed. An error abandons the move (nothing changed).
    pub fn precopy_step<T: MoveTarget>(
        &mut self,
        p: &mut PreCopy<T>,
        reopen: Reopen<'_, T>,
    ) -> Result<(), String> {
        if p.ready {
            return Ok(());
        }
        if p.restart {
            p.restart = false;
            let layout = self.device.capture_layout().map_err(|e| e.to_string())?;
            if layout != p.layout {
                if p.restarts >= MAX_RESTARTS {
                    // The stop captures the session whole.
                    p.ready = true;
                    return Ok(());
                }
                reopen(&mut p.target)?;
                self.resident_for_move()?;
                p.target.rebuild(&layout)?;
                p.ranges = ranges_of(&layout);
                p.layout = layout;
                p.dirty.clear();
                p.current = p.ranges.keys().flat_map(|&s| p.chunks(s)).collect();
                p.restarts += 1;
                tracing::debug!(
                    restarts = p.restarts,
                    "layout changed: pre-copy starts over"
                );
            }
        }
        let mut copied = 0u64;
        while copied < STEP_BYTES {
            let Some(chunk) = p.current.pop_first() else {
                break;
            };
            let len = p.chunk_len(chunk);
            copy_between(&mut *self.device, &mut p.target, chunk, len)?;
            copied += len;
        }
        p.precopied += copied;
        if p.current.is_empty() {
            // The round's end: the layout must be the one the target has.
            if self.device.capture_layout().map_err(|e| e.to_string())? != p.layout {
                p.restart = true;
                return Ok(());
            }
            let dirty = p.bytes_of(&p.dirty);
            let shrinking = p.last_dirty.is_none_or(|last| dirty < last);
            tracing::debug!(round = p.rounds, dirty, "pre-copy round done");
            if dirty <= STOP_BYTES || !shrinking || p.rounds >= MAX_ROUNDS {
                p.ready = true;
            } else {
                p.current = std::mem::take(&mut p.dirty);
                p.last_dirty = Some(dirty);
                p.rounds += 1;
            }
        }
        Ok(())
    }

    /// The stop: copies what is still dirty and checks the layout; the caller then switches
    /// to the target (or hands the session to it). A session whose layout changed since the
    /// target was built is captured whole and rebuilt on the target made fresh by `reopen`.
    /// On an error nothing changed. Returns the figures (the stop so far) and the target.
    pub fn precopy_finish<T: MoveTarget>(
        &mut self,
        mut p: PreCopy<T>,
        reopen: Reopen<'_, T>,
    ) -> Result<(MoveFigures, T), String> {
        let stopped = Instant::now();
        self.end_lease();
        self.resident_for_move()?;
        let layout = self.device.capture_layout().map_err(|e| e.to_string())?;
        let bytes: u64 = layout.allocations.iter().map(|a| a.size).sum();
        let stop_bytes = if layout != p.layout {
            reopen(&mut p.target)?;
            let image = self.device.capture().map_err(|e| e.to_string())?;
            p.target.rebuild(&image)?;
            tracing::info!(
                bytes = image.bytes(),
                "the layout changed during pre-copy: moved whole"
            );
            bytes
        } else {
            let left: BTreeSet<u64> = std::mem::take(&mut p.current)
                .into_iter()
                .chain(std::mem::take(&mut p.dirty))
                .collect();
            let mut copied = 0;
            for chunk in left {
                let len = p.chunk_len(chunk);
                copy_between(&mut *self.device, &mut p.target, chunk, len)?;
                copied += len;
            }
            copied
        };
        let stop = stopped.elapsed();
        tracing::info!(
            bytes,
            precopied = p.precopied,
            stop_bytes,
            rounds = p.rounds,
            ?stop,
            total = ?p.started.elapsed(),
            "session moved to another device with pre-copy"
        );
        Ok((
            MoveFigures {
                stop_us: u64::try_from(stop.as_micros()).unwrap_or(u64::MAX),
                rounds: p.rounds,
                bytes,
                precopied_bytes: p.precopied,
                stop_bytes,
            },
            p.target,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufuse_device::capture::AllocationImage;
    use gpufuse_device::emu::EmuDevice;

    fn precopy_over(ranges: &[(u64, u64)]) -> PreCopy {
        let target: Box<dyn Device> = Box::new(EmuDevice::new(0, 1 << 30, 0, 1 << 40));
        let layout = DeviceImage {
            window: (0, 0, u64::MAX),
            allocations: ranges
                .iter()
                .map(|&(addr, size)| AllocationImage {
                    addr,
                    size,
                    contents: Vec::new(),
                })
                .collect(),
            physical: vec![],
            next_physical: 0,
            reserved: vec![],
            modules: vec![],
            next_module: 1,
            textures: vec![],
            workspace: None,
        };
        PreCopy {
            target,
            ranges: ranges_of(&layout),
            layout,
            current: BTreeSet::new(),
            dirty: BTreeSet::new(),
            rounds: 1,
            last_dirty: None,
            precopied: 0,
            restarts: 0,
            ready: false,
            restart: false,
            started: Instant::now(),
        }
    }

    /// Writes dirty exactly the chunks they overlap; a launch the ranges it reached, or all
    /// when the device cannot tell; chunks still to copy this round are not queued twice.
    #[test]
    fn the_dirty_rule_marks_the_chunks_written() {
        let big = 0x1000_0000;
        let small = 0x2000_0000;
        let mut p = precopy_over(&[(big, 3 * CHUNK + 5), (small, 100)]);
        p.note(
            Dirt::Range {
                start: big + CHUNK - 1,
                len: 2,
            },
            None,
        );
        assert_eq!(p.dirty, BTreeSet::from([big, big + CHUNK]));
        p.note(
            Dirt::Range {
                start: big + 3 * CHUNK + 4,
                len: 1 << 40,
            },
            None,
        );
        assert!(p.dirty.contains(&(big + 3 * CHUNK)));
        assert_eq!(p.bytes_of(&BTreeSet::from([big + 3 * CHUNK])), 5);
        p.dirty.clear();
        p.note(Dirt::Launch, Some(vec![small]));
        assert_eq!(p.dirty, BTreeSet::from([small]));
        p.note(Dirt::Launch, None);
        assert_eq!(p.dirty.len(), 5);
        p.dirty.clear();
        p.current.insert(small);
        p.note(Dirt::Everything, None);
        assert!(!p.dirty.contains(&small) && p.dirty.len() == 4);
        p.note(
            Dirt::Range {
                start: 0x3000_0000,
                len: 10,
            },
            None,
        );
        assert_eq!(p.dirty.len(), 4, "outside every range: nothing");
    }
}
