//! Contexts, streams and events as one session holds them. The device runs a session's work
//! in submission order, so streams need no device state: the worker checks handles, and an
//! event records the moment its place in that order was reached (what `cuEventElapsedTime`
//! measures).

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use gpufuse_device::status as st;
use gpufuse_proto::ReplyBody;

use crate::{Session, R};

#[derive(Default)]
pub(crate) struct SyncBooks {
    pub(crate) contexts: HashSet<u64>,
    pub(crate) streams: HashSet<u64>,
    /// Event handle -> when it was last recorded.
    pub(crate) events: HashMap<u64, Option<Instant>>,
}

impl SyncBooks {
    pub(crate) fn clear(&mut self) {
        self.streams.clear();
        self.events.clear();
        self.contexts.clear();
    }
}

impl Session<'_> {
    /// A session sees one device, its ordinal 0, whichever of the node's devices serves it.
    pub(crate) fn check_device(&self, device: u32) -> R<()> {
        if device == 0 {
            Ok(())
        } else {
            Err(101) // CUDA_ERROR_INVALID_DEVICE
        }
    }

    pub(crate) fn check_stream(&self, stream: u64) -> R<()> {
        if stream == 0 || self.sync.streams.contains(&stream) {
            Ok(())
        } else {
            Err(st::INVALID_HANDLE)
        }
    }

    pub(crate) fn ctx_create(&mut self, ctx: u64, device: u32) -> R<()> {
        self.check_device(device)?;
        self.sync.contexts.insert(ctx);
        Ok(())
    }

    pub(crate) fn ctx_destroy(&mut self, ctx: u64) -> R<()> {
        self.sync.contexts.remove(&ctx).then_some(()).ok_or(201)
    }

    pub(crate) fn stream_destroy(&mut self, stream: u64) -> R<()> {
        self.sync
            .streams
            .remove(&stream)
            .then_some(())
            .ok_or(st::INVALID_HANDLE)
    }

    fn check_event(&self, event: u64) -> R<Option<Instant>> {
        self.sync
            .events
            .get(&event)
            .copied()
            .ok_or(st::INVALID_HANDLE)
    }

    pub(crate) fn stream_wait_event(&mut self, stream: u64, event: u64) -> R<()> {
        self.check_stream(stream)?;
        self.check_event(event).map(|_| ())
    }

    pub(crate) fn event_destroy(&mut self, event: u64) -> R<()> {
        self.sync
            .events
            .remove(&event)
            .map(|_| ())
            .ok_or(st::INVALID_HANDLE)
    }

    pub(crate) fn event_record(&mut self, event: u64, stream: u64) -> R<()> {
        self.check_stream(stream)?;
        *self.sync.events.get_mut(&event).ok_or(st::INVALID_HANDLE)? = Some(Instant::now());
        Ok(())
    }

    pub(crate) fn event_query(&mut self, event: u64) -> R<()> {
        self.check_event(event).map(|_| ())
    }

    pub(crate) fn event_elapsed(&mut self, start: u64, end: u64) -> R<ReplyBody> {
        let a = self.check_event(start)?.ok_or(st::INVALID_HANDLE)?;
        let b = self.check_event(end)?.ok_or(st::INVALID_HANDLE)?;
        let ms = if b >= a {
            (b - a).as_secs_f32() * 1e3
        } else {
            -((a - b).as_secs_f32() * 1e3)
        };
        Ok(ReplyBody::Elapsed(ms))
    }
}
