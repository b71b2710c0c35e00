//! Streams and events of a device that runs each piece of work when it is enqueued (the
//! emulated GPU): every queue is empty whenever the worker looks, so a record completes at
//! once and its time is the moment it was made, after everything enqueued before it.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use crate::status::{INVALID_HANDLE, INVALID_VALUE};
use crate::{EventId, StreamId};

/// `CU_EVENT_DISABLE_TIMING`.
const DISABLE_TIMING: u32 = 2;

struct Event {
    timing: bool,
    recorded: Option<Instant>,
}

#[derive(Default)]
pub struct EagerQueues {
    streams: HashSet<StreamId>,
    events: HashMap<EventId, Event>,
}

impl EagerQueues {
    pub fn check_stream(&self, stream: StreamId) -> Result<(), crate::Status> {
        match stream == 0 || self.streams.contains(&stream) {
            true => Ok(()),
            false => Err(INVALID_HANDLE),
        }
    }

    pub fn create_stream(&mut self, stream: StreamId) -> Result<(), crate::Status> {
        match stream != 0 && self.streams.insert(stream) {
            true => Ok(()),
            false => Err(INVALID_VALUE),
        }
    }

    pub fn destroy_stream(&mut self, stream: StreamId) -> Result<(), crate::Status> {
        self.streams
            .remove(&stream)
            .then_some(())
            .ok_or(INVALID_HANDLE)
    }

    pub fn create_event(&mut self, event: EventId, flags: u32) -> Result<(), crate::Status> {
        let e = Event {
            timing: flags & DISABLE_TIMING == 0,
            recorded: None,
        };
        match self.events.insert(event, e) {
            None => Ok(()),
            Some(_) => Err(INVALID_VALUE),
        }
    }

    pub fn destroy_event(&mut self, event: EventId) -> Result<(), crate::Status> {
        self.events.remove(&event).map(|_| ()).ok_or(INVALID_HANDLE)
    }

    pub fn record(&mut self, event: EventId, stream: StreamId) -> Result<(), crate::Status> {
        self.check_stream(stream)?;
        let e = self.events.get_mut(&event).ok_or(INVALID_HANDLE)?;
        e.recorded = Some(Instant::now());
        Ok(())
    }

    /// Checks both handles: the wait itself is already over.
    pub fn wait_event(&self, stream: StreamId, event: EventId) -> Result<(), crate::Status> {
        self.check_stream(stream)?;
        self.check_event(event)
    }

    pub fn check_event(&self, event: EventId) -> Result<(), crate::Status> {
        self.events.get(&event).map(|_| ()).ok_or(INVALID_HANDLE)
    }

    pub fn event_age(&self, event: EventId) -> Option<std::time::Duration> {
        Some(self.events.get(&event)?.recorded?.elapsed())
    }

    pub fn set_event_age(
        &mut self,
        event: EventId,
        age: std::time::Duration,
    ) -> Result<(), crate::Status> {
        let e = self.events.get_mut(&event).ok_or(INVALID_HANDLE)?;
        let now = Instant::now();
        e.recorded = Some(now.checked_sub(age).unwrap_or(now));
        Ok(())
    }

    pub fn elapsed(&self, start: EventId, end: EventId) -> Result<f32, crate::Status> {
        let time = |id| {
            let e = self.events.get(&id).ok_or(INVALID_HANDLE)?;
            match (e.timing, e.recorded) {
                (true, Some(t)) => Ok(t),
                _ => Err(INVALID_HANDLE),
            }
        };
        let (a, b) = (time(start)?, time(end)?);
        Ok(match b >= a {
            true => (b - a).as_secs_f32() * 1e3,
            false => -((a - b).as_secs_f32() * 1e3),
        })
    }
}
