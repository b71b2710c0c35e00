//! Per-stream lanes: quiet kernel launches from several application threads without the
//! session lock.
//!
//! A launch on a stream the application created, or on the calling thread's per-thread default
//! stream (`CU_STREAM_PER_THREAD`, or NULL through a `_ptsz` export), is resolved from a
//! thread-local cache (function handle -> worker id and parameter layout, stream -> lane),
//! packed, and encoded into that stream's lane: a frame buffer with its own small lock. The
//! lanes reach the connection in batches, under the session lock: whoever takes the session
//! lock first moves every lane's frames into the connection ([`crate::state::Session::lock`]),
//! so every other request of any thread (a synchronize, an event, a copy, a launch on the legacy
//! default stream, the 2 ms flusher, a reconnect) goes out after everything any thread queued
//! in a lane before it. A lane that fills takes the session lock to do the same.
//!
//! Why CUDA's semantics hold (the worker runs a session's requests in arrival order):
//! - order within a stream is the lane's order, and a request of that stream that takes the
//!   locked path drains the lane first;
//! - launches on different non-default streams are unordered in CUDA unless an event, a
//!   synchronize or the legacy default stream orders them, and each of those takes the session
//!   lock, which drains every lane first: whatever a thread queued before (happens-before, through
//!   the lane's lock) reaches the worker first;
//! - the legacy default stream (handle 0 or `CU_STREAM_LEGACY` through a plain export), a
//!   capturing stream (it records instead of sending), a launch with attributes, and a session
//!   with managed memory (handed to the device before device work) take the locked path.
//!
//! Validity: everything a lane or the cache relies on is checked under the session lock when a
//! launch on the locked path grants it, and stays valid until the session's lane generation
//! changes. The locked path bumps it ([`Lanes::invalidate`]) whenever something the fast path
//! relies on goes away: a stream is destroyed or starts capturing, a function, module,
//! library or context goes, a device is reset, managed memory appears. A lane checks the
//! generation under its own lock before it takes a frame, so a launch that happens after the
//! change sees it and takes the locked path (which checks the handles again). A launch that
//! races with such a change on another thread is one CUDA leaves unordered: it lands before or
//! after, and the worker checks every handle it names.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use gpufuse_proto::{encode_frame, FrameKind, Launch, ParamSlot, Request, FLAG_QUIET};

use crate::error::ClientError;
use gpufuse_proto::{FunctionHandle, StreamHandle};

/// A lane moves its frames into the connection once it holds this many bytes.
pub const LANE_BYTES: usize = 64 * 1024;

/// Reads the application's arguments for a parameter layout and packs them.
pub type Packer<'p> = dyn FnMut(&[ParamSlot]) -> Result<Vec<u8>, ClientError> + 'p;

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`.
const STREAM_LEGACY: u64 = 1;
const STREAM_PER_THREAD: u64 = 2;

/// The stream a launch names, as the application gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamRef {
    /// The `CUstream` handle (0, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD` or a created one).
    pub handle: u64,
    /// Whether a NULL handle means the per-thread default stream (the `_ptsz` exports).
    pub per_thread_default: bool,
}

impl StreamRef {
    /// A stream handle given to a plain (not `_ptsz`) export.
    pub fn legacy(handle: u64) -> Self {
        Self {
            handle,
            per_thread_default: false,
        }
    }

    /// Which lane this stream's launches may use: `None` for the legacy default stream.
    pub(crate) fn lane_key(self) -> Option<LaneKey> {
        match self.handle {
            0 if self.per_thread_default => Some(LaneKey::PerThread),
            0 | STREAM_LEGACY => None,
            STREAM_PER_THREAD => Some(LaneKey::PerThread),
            h => Some(LaneKey::Stream(h)),
        }
    }
}

/// A lane's identity: a created stream, or the calling thread's per-thread default stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum LaneKey {
    Stream(u64),
    PerThread,
}

/// What a cached launch target needs: the worker's function id and its parameter layout.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) function: u64,
    pub(crate) layout: Arc<[ParamSlot]>,
    /// What its launches may ask, checked before one is queued (a change to the function's
    /// attributes starts a new lane generation).
    pub(crate) limits: crate::launch::LaunchLimits,
}

/// One stream's queued frames.
#[derive(Debug)]
pub struct Lane {
    /// The worker's id of the stream (0 for a per-thread default stream).
    stream: u64,
    buf: Mutex<LaneBuf>,
}

#[derive(Debug)]
struct LaneBuf {
    out: Vec<u8>,
    /// The lane generation it was last granted at; any other means "take the locked path".
    generation: u64,
    /// Whether the registry holds it (so a drain sees it).
    registered: bool,
}

impl Lane {
    fn new(stream: u64) -> Self {
        Self {
            stream,
            buf: Mutex::new(LaneBuf {
                out: Vec::new(),
                generation: 0,
                registered: false,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LaneBuf> {
        self.buf.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A session's lanes.
#[derive(Debug)]
pub struct Lanes {
    /// Unique per session object: thread-local caches name the session they hold handles of
    /// (a forked child's new session never uses its parent's).
    uid: u64,
    generation: AtomicU64,
    /// How many lanes hold frames (none: a drain has nothing to do).
    nonempty: AtomicUsize,
    registry: Mutex<Registry>,
}

#[derive(Debug, Default)]
struct Registry {
    lanes: Vec<Arc<Lane>>,
    by_stream: HashMap<u64, Arc<Lane>>,
}

/// What a launch on the fast path did.
pub(crate) enum Fast {
    /// Queued in its lane; `true`: the lane is full and should be drained.
    Queued(bool),
    /// The lane path does not apply (or no longer): take the locked path, with the parameters
    /// if they were already packed.
    Locked(Option<Vec<u8>>),
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
}

/// A thread's view of one session's lanes, valid for one generation.
#[derive(Default)]
struct Cache {
    uid: u64,
    generation: u64,
    functions: HashMap<u64, Target, HandleHash>,
    streams: HashMap<u64, Arc<Lane>, HandleHash>,
    /// This thread's per-thread default stream lane (kept across generations: its frames must
    /// stay in one lane).
    per_thread: Option<Arc<Lane>>,
}

impl Cache {
    /// The cache for session `uid` at `generation` (cleared if it held another's).
    fn at(&mut self, uid: u64, generation: u64) -> &mut Self {
        if self.uid != uid {
            *self = Cache {
                uid,
                generation,
                ..Default::default()
            };
        } else if self.generation != generation {
            self.functions.clear();
            self.streams.clear();
            self.generation = generation;
        }
        self
    }
}

static NEXT_UID: AtomicU64 = AtomicU64::new(1);

/// Hashes the client's handles for the thread caches: a handle is a kind and a process-wide
/// counter ([`crate::handles`]), never chosen by anyone else, so one multiplication spreads
/// them (the default hasher's flood resistance costs a launch more than its lookups do).
#[derive(Default, Clone, Copy)]
struct HandleHash;

impl std::hash::BuildHasher for HandleHash {
    type Hasher = HandleHasher;
    fn build_hasher(&self) -> HandleHasher {
        HandleHasher(0)
    }
}

struct HandleHasher(u64);

impl std::hash::Hasher for HandleHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

impl Default for Lanes {
    fn default() -> Self {
        Self::new()
    }
}

impl Lanes {
    pub fn new() -> Self {
        Self {
            uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
            generation: AtomicU64::new(1),
            nonempty: AtomicUsize::new(0),
            registry: Mutex::new(Registry::default()),
        }
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Something the fast path relies on changed (called with the session lock held): every
    /// lane and every thread's cache must be granted again by the locked path.
    pub fn invalidate(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The current generation.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether any lane holds frames.
    pub fn pending(&self) -> bool {
        self.nonempty.load(Ordering::Acquire) != 0
    }

    /// Appends every lane's frames to `out` (called with the session lock held, so nothing
    /// else is sent meanwhile). Lanes that are empty and can take no more frames (stale, or
    /// of a thread that has ended) leave the registry.
    pub(crate) fn drain_into(&self, out: &mut Vec<u8>) {
        if !self.pending() {
            return;
        }
        let generation = self.generation();
        let mut reg = self.registry();
        let mut dead = false;
        for lane in &reg.lanes {
            let mut b = lane.lock();
            if !b.out.is_empty() {
                out.extend_from_slice(&b.out);
                b.out.clear();
                if b.out.capacity() > 4 * LANE_BYTES {
                    b.out.shrink_to(LANE_BYTES + 4096);
                }
                self.nonempty.fetch_sub(1, Ordering::AcqRel);
            } else if b.generation != generation || Arc::strong_count(lane) == 1 {
                // Stale, or a per-thread lane whose thread has ended: nothing can queue into
                // it any more.
                b.registered = false;
                dead = true;
            }
        }
        if dead {
            reg.lanes.retain(|l| l.lock().registered);
            reg.by_stream.retain(|_, l| l.lock().registered);
        }
    }

    /// The fast path: `f` (a `CUfunction` or `CUkernel` handle) launched on `stream` through
    /// its lane, if this thread's cache holds both and the lane is valid. `pack` reads the
    /// application's arguments for a layout.
    pub(crate) fn try_launch(
        &self,
        f: u64,
        stream: StreamRef,
        dims: ([u32; 3], [u32; 3], u32),
        pack: &mut Packer<'_>,
    ) -> Result<Fast, ClientError> {
        let Some(key) = stream.lane_key() else {
            return Ok(Fast::Locked(None));
        };
        let generation = self.generation();
        // Everything below runs on this thread's cache, borrowed: nothing shared is touched
        // but the lane's lock (and, once per batch, the count of lanes with frames). In a
        // thread-local destructor at thread exit the cache is gone: the locked path serves.
        let fast = CACHE.try_with(|c| {
            let mut c = c.borrow_mut();
            let c = c.at(self.uid, generation);
            let Some(target) = c.functions.get(&f) else {
                return Ok(Fast::Locked(None));
            };
            let lane = match key {
                LaneKey::PerThread => c.per_thread.as_ref(),
                LaneKey::Stream(h) => c.streams.get(&h),
            };
            let Some(lane) = lane else {
                return Ok(Fast::Locked(None));
            };
            target.limits.check(dims.0, dims.1, dims.2)?;
            self.queue(lane, target, dims, pack)
        });
        fast.unwrap_or(Ok(Fast::Locked(None)))
    }

    fn queue(
        &self,
        lane: &Lane,
        target: &Target,
        dims: ([u32; 3], [u32; 3], u32),
        pack: &mut Packer<'_>,
    ) -> Result<Fast, ClientError> {
        let params = pack(&target.layout)?;
        let mut b = lane.lock();
        if b.generation != self.generation() || !b.registered {
            return Ok(Fast::Locked(Some(params)));
        }
        let was_empty = b.out.is_empty();
        let (grid, block, shared_mem) = dims;
        encode_frame(
            &mut b.out,
            FrameKind::Request,
            FLAG_QUIET,
            0,
            &Request::LaunchKernel(Launch {
                function: FunctionHandle(target.function),
                grid,
                block,
                shared_mem,
                stream: StreamHandle(lane.stream),
                params: &params,
                attributes: Vec::new(),
            }),
        );
        if was_empty {
            self.nonempty.fetch_add(1, Ordering::AcqRel);
        }
        Ok(Fast::Queued(b.out.len() >= LANE_BYTES))
    }

    /// Grants this thread the lane of `key` (worker stream id `stream`) and the cache entry of
    /// `f` (called on the locked path, with the session lock held, once it has checked that
    /// the launch may use a lane).
    pub(crate) fn grant(&self, key: LaneKey, stream: u64, f: u64, target: Target) {
        let generation = self.generation();
        let mut reg = self.registry();
        // In a thread-local destructor the cache is gone: nothing is granted, and the
        // launch stays on the locked path.
        let _ = CACHE.try_with(|c| {
            let mut c = c.borrow_mut();
            let c = c.at(self.uid, generation);
            let lane = match key {
                LaneKey::PerThread => c
                    .per_thread
                    .get_or_insert_with(|| Arc::new(Lane::new(stream)))
                    .clone(),
                LaneKey::Stream(h) => {
                    let lane = reg
                        .by_stream
                        .entry(h)
                        .or_insert_with(|| Arc::new(Lane::new(stream)))
                        .clone();
                    c.streams.insert(h, lane.clone());
                    lane
                }
            };
            let mut b = lane.lock();
            b.generation = generation;
            if !b.registered {
                b.registered = true;
                drop(b);
                reg.lanes.push(lane);
            }
            c.functions.insert(f, target);
        });
    }

    /// How many lanes the registry holds (tests).
    pub fn registered(&self) -> usize {
        self.registry().lanes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target {
            function: 7,
            layout: Arc::from(vec![ParamSlot { offset: 0, size: 4 }]),
            limits: crate::launch::LaunchLimits {
                threads: 1024,
                block: [1024, 1024, 64],
                grid: [i32::MAX as u32, 65535, 65535],
                dynamic_shared: 49152,
            },
        }
    }

    fn pack4(layout: &[ParamSlot]) -> Result<Vec<u8>, ClientError> {
        assert_eq!(layout.len(), 1);
        Ok(vec![1, 2, 3, 4])
    }

    const DIMS: ([u32; 3], [u32; 3], u32) = ([1, 1, 1], [1, 1, 1], 0);

    fn decode_all(mut bytes: &[u8]) -> Vec<(u64, u64)> {
        let mut seen = Vec::new();
        while !bytes.is_empty() {
            let header = gpufuse_proto::FrameHeader::decode(
                bytes[..gpufuse_proto::HEADER_LEN].try_into().unwrap(),
            )
            .unwrap();
            let end = gpufuse_proto::HEADER_LEN + header.len as usize;
            let req: Request =
                gpufuse_proto::decode_request(&header, &bytes[gpufuse_proto::HEADER_LEN..end])
                    .unwrap();
            assert!(header.is_quiet());
            match req {
                Request::LaunchKernel(l) => seen.push((l.stream.get(), l.grid[0] as u64)),
                other => panic!("unexpected {other:?}"),
            }
            bytes = &bytes[end..];
        }
        seen
    }

    #[test]
    fn legacy_default_stream_never_uses_a_lane() {
        assert_eq!(StreamRef::legacy(0).lane_key(), None);
        assert_eq!(StreamRef::legacy(STREAM_LEGACY).lane_key(), None);
        let ptsz = StreamRef {
            handle: 0,
            per_thread_default: true,
        };
        assert_eq!(ptsz.lane_key(), Some(LaneKey::PerThread));
        assert_eq!(
            StreamRef::legacy(STREAM_PER_THREAD).lane_key(),
            Some(LaneKey::PerThread)
        );
        assert_eq!(StreamRef::legacy(99).lane_key(), Some(LaneKey::Stream(99)));
    }

    #[test]
    fn nothing_is_queued_before_the_locked_path_grants_the_lane() {
        let lanes = Lanes::new();
        let r = lanes
            .try_launch(5, StreamRef::legacy(99), DIMS, &mut pack4)
            .unwrap();
        assert!(matches!(r, Fast::Locked(None)));
        assert!(!lanes.pending());
    }

    #[test]
    fn a_lane_keeps_its_stream_order_and_a_drain_takes_everything() {
        let lanes = Lanes::new();
        lanes.grant(LaneKey::Stream(99), 99, 5, target());
        for i in 1..=3u32 {
            let r = lanes
                .try_launch(
                    5,
                    StreamRef::legacy(99),
                    ([i, 1, 1], [1, 1, 1], 0),
                    &mut pack4,
                )
                .unwrap();
            assert!(matches!(r, Fast::Queued(false)));
        }
        assert!(lanes.pending());
        let mut out = Vec::new();
        lanes.drain_into(&mut out);
        assert_eq!(decode_all(&out), vec![(99, 1), (99, 2), (99, 3)]);
        assert!(!lanes.pending());
        out.clear();
        lanes.drain_into(&mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn invalidation_sends_the_next_launch_to_the_locked_path_with_its_packed_parameters() {
        let lanes = Lanes::new();
        lanes.grant(LaneKey::Stream(99), 99, 5, target());
        lanes
            .try_launch(5, StreamRef::legacy(99), DIMS, &mut pack4)
            .unwrap();
        lanes.invalidate();
        // The thread cache is cleared by the new generation: nothing packed yet.
        let r = lanes
            .try_launch(5, StreamRef::legacy(99), DIMS, &mut pack4)
            .unwrap();
        assert!(matches!(r, Fast::Locked(None)));
        // The frame queued before the change still goes out, then the stale lane leaves the
        // registry once empty.
        let mut out = Vec::new();
        lanes.drain_into(&mut out);
        assert_eq!(decode_all(&out).len(), 1);
        assert_eq!(lanes.registered(), 1);
        lanes.grant(LaneKey::Stream(5), 5, 5, target());
        lanes
            .try_launch(5, StreamRef::legacy(5), DIMS, &mut pack4)
            .unwrap();
        lanes.drain_into(&mut out);
        assert_eq!(lanes.registered(), 1, "the stale, empty lane of 99 is gone");
    }

    #[test]
    fn a_lane_invalidated_after_the_cache_was_read_returns_the_packed_parameters() {
        let lanes = Lanes::new();
        lanes.grant(LaneKey::Stream(99), 99, 5, target());
        let mut packed_then_invalidated = |layout: &[ParamSlot]| {
            // Another thread's locked path changes something while this one packs.
            lanes.invalidate();
            pack4(layout)
        };
        let r = lanes
            .try_launch(5, StreamRef::legacy(99), DIMS, &mut packed_then_invalidated)
            .unwrap();
        match r {
            Fast::Locked(Some(p)) => assert_eq!(p, vec![1, 2, 3, 4]),
            _ => panic!("expected the locked path with packed parameters"),
        }
        assert!(!lanes.pending());
    }

    #[test]
    fn per_thread_default_streams_have_one_lane_per_thread() {
        let lanes = Arc::new(Lanes::new());
        let ptsz = StreamRef {
            handle: 0,
            per_thread_default: true,
        };
        lanes.grant(LaneKey::PerThread, 0, 5, target());
        lanes.try_launch(5, ptsz, DIMS, &mut pack4).unwrap();
        let other = lanes.clone();
        std::thread::spawn(move || {
            // Another thread has no grant of its own yet.
            let r = other.try_launch(5, ptsz, DIMS, &mut pack4).unwrap();
            assert!(matches!(r, Fast::Locked(None)));
            other.grant(LaneKey::PerThread, 0, 5, target());
            let r = other
                .try_launch(5, StreamRef::legacy(STREAM_PER_THREAD), DIMS, &mut pack4)
                .unwrap();
            assert!(matches!(r, Fast::Queued(false)));
        })
        .join()
        .unwrap();
        assert_eq!(lanes.registered(), 2);
        let mut out = Vec::new();
        lanes.drain_into(&mut out);
        assert_eq!(decode_all(&out), vec![(0, 1), (0, 1)]);
    }

    #[test]
    fn a_full_lane_says_so() {
        let lanes = Lanes::new();
        lanes.grant(LaneKey::Stream(99), 99, 5, target());
        let mut full = false;
        for _ in 0..LANE_BYTES {
            if let Fast::Queued(f) = lanes
                .try_launch(5, StreamRef::legacy(99), DIMS, &mut pack4)
                .unwrap()
            {
                if f {
                    full = true;
                    break;
                }
            }
        }
        assert!(full);
    }

    #[test]
    fn a_cache_of_another_session_is_not_used() {
        let a = Lanes::new();
        let b = Lanes::new();
        a.grant(LaneKey::Stream(99), 99, 5, target());
        let r = b
            .try_launch(5, StreamRef::legacy(99), DIMS, &mut pack4)
            .unwrap();
        assert!(matches!(r, Fast::Locked(None)));
    }
}
