//! Contexts, streams and events as one session holds them. The worker checks every handle
//! against the session's own tables, then hands the stream or event to the device, which
//! orders the work ([`gpufuse_device::Device`]: enqueued, never waited for unless the
//! application waits). A wait that finds a fault of work in flight (an illegal address)
//! poisons the session as a failed launch does.

use std::collections::HashSet;

use gpufuse_device::status as st;
use gpufuse_proto::ReplyBody;

use crate::{Session, R};

#[derive(Default)]
pub(crate) struct SyncBooks {
    pub(crate) contexts: HashSet<u64>,
    pub(crate) streams: HashSet<u64>,
    pub(crate) events: HashSet<u64>,
}

/// Faults that poison a GPU context until it is reset: every later call fails with them.
pub(crate) fn is_fault(e: st::Status) -> bool {
    matches!(
        e,
        st::ILLEGAL_ADDRESS | st::MISALIGNED_ADDRESS | st::ASSERT | st::LAUNCH_FAILED
    )
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

    fn check_event(&self, event: u64) -> R<()> {
        match self.sync.events.contains(&event) {
            true => Ok(()),
            false => Err(st::INVALID_HANDLE),
        }
    }

    /// A wait's result: a fault poisons the session.
    pub(crate) fn waited(&mut self, r: R<()>) -> R<()> {
        if let Err(e) = r {
            if is_fault(e) {
                self.sticky = Some(e);
            }
        }
        r
    }

    pub(crate) fn ctx_create(&mut self, ctx: u64, device: u32) -> R<()> {
        self.check_device(device)?;
        self.sync.contexts.insert(ctx);
        Ok(())
    }

    pub(crate) fn ctx_destroy(&mut self, ctx: u64) -> R<()> {
        self.sync.contexts.remove(&ctx).then_some(()).ok_or(201)
    }

    pub(crate) fn stream_create(&mut self, stream: u64, flags: u32, priority: i32) -> R<()> {
        if stream == 0 || self.sync.streams.contains(&stream) {
            return Err(st::INVALID_VALUE);
        }
        self.device.create_stream(stream, flags, priority)?;
        self.sync.streams.insert(stream);
        Ok(())
    }

    pub(crate) fn stream_destroy(&mut self, stream: u64) -> R<()> {
        if !self.sync.streams.remove(&stream) {
            return Err(st::INVALID_HANDLE);
        }
        self.device.destroy_stream(stream)
    }

    pub(crate) fn stream_synchronize(&mut self, stream: u64) -> R<()> {
        self.check_stream(stream)?;
        let r = self.device.sync_stream(stream);
        self.waited(r)
    }

    pub(crate) fn stream_query(&mut self, stream: u64) -> R<()> {
        self.check_stream(stream)?;
        match self.device.stream_done(stream) {
            Ok(true) => Ok(()),
            Ok(false) => Err(st::NOT_READY),
            Err(e) => self.waited(Err(e)),
        }
    }

    pub(crate) fn ctx_synchronize(&mut self) -> R<()> {
        let r = self.device.synchronize();
        self.waited(r)
    }

    pub(crate) fn stream_wait_event(&mut self, stream: u64, event: u64) -> R<()> {
        self.check_stream(stream)?;
        self.check_event(event)?;
        self.device.wait_event(stream, event)
    }

    pub(crate) fn event_create(&mut self, event: u64, flags: u32) -> R<()> {
        // The worker's own ids (`memory::ARENA_EVENTS`) are not the client's to take.
        if self.sync.events.contains(&event)
            || event & crate::memory::ARENA_EVENTS == crate::memory::ARENA_EVENTS
        {
            return Err(st::INVALID_VALUE);
        }
        self.device.create_event(event, flags)?;
        self.sync.events.insert(event);
        Ok(())
    }

    pub(crate) fn event_destroy(&mut self, event: u64) -> R<()> {
        if !self.sync.events.remove(&event) {
            return Err(st::INVALID_HANDLE);
        }
        self.device.destroy_event(event)
    }

    pub(crate) fn event_record(&mut self, event: u64, stream: u64) -> R<()> {
        self.check_stream(stream)?;
        self.check_event(event)?;
        self.device.record(event, stream)
    }

    pub(crate) fn event_query(&mut self, event: u64) -> R<()> {
        self.check_event(event)?;
        match self.device.event_done(event) {
            Ok(true) => Ok(()),
            Ok(false) => Err(st::NOT_READY),
            Err(e) => self.waited(Err(e)),
        }
    }

    pub(crate) fn event_synchronize(&mut self, event: u64) -> R<()> {
        self.check_event(event)?;
        let r = self.device.sync_event(event);
        self.waited(r)
    }

    pub(crate) fn event_elapsed(&mut self, start: u64, end: u64) -> R<ReplyBody> {
        self.check_event(start)?;
        self.check_event(end)?;
        Ok(ReplyBody::Elapsed(self.device.elapsed(start, end)?))
    }

    /// When each event's last record completed, as a time ago (`None`: never recorded), for a
    /// move.
    pub(crate) fn event_ages(&mut self) -> Vec<(u64, Option<std::time::Duration>)> {
        let mut events: Vec<u64> = self.sync.events.iter().copied().collect();
        events.sort_unstable();
        events
            .into_iter()
            .map(|e| (e, self.device.event_age(e)))
            .collect()
    }

    /// Makes the session's streams and events (its books, with `ages` for the events) on the
    /// device it now runs on: a move's destination. What the device refuses is logged; the
    /// session goes on (a later call naming it fails there).
    pub(crate) fn rebuild_sync(&mut self, ages: &[(u64, Option<std::time::Duration>)]) {
        self.device_changed();
        // The worker's arena events were the old device's (nothing is pending at a move).
        self.memory.arena_pending.clear();
        self.memory.arena_events.clear();
        let mut streams: Vec<u64> = self.sync.streams.iter().copied().collect();
        streams.sort_unstable();
        for s in streams {
            if let Err(e) = self.device.create_stream(s, 0, 0) {
                tracing::warn!(stream = s, status = e, "the stream could not be made again");
            }
        }
        self.sync.events = ages.iter().map(|&(e, _)| e).collect();
        for &(e, age) in ages {
            let made = self.device.create_event(e, 0);
            let aged = match age {
                Some(age) => made.and_then(|()| self.device.set_event_age(e, age)),
                None => made,
            };
            if let Err(status) = aged {
                tracing::warn!(event = e, status, "the event could not be made again");
            }
        }
        self.rebuild_graphs();
    }

    /// Streams and events the device holds for the session, forgotten (a reset, the end).
    pub(crate) fn release_sync(&mut self) {
        for s in self.sync.streams.drain().collect::<Vec<_>>() {
            let _ = self.device.destroy_stream(s);
        }
        for e in self.sync.events.drain().collect::<Vec<_>>() {
            let _ = self.device.destroy_event(e);
        }
        self.sync.contexts.clear();
    }
}
