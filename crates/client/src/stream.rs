//! Streams and events. Creates, records, waits and destroys are quiet; queries and
//! synchronizations are round trips that also report asynchronous errors
//! ([`Inner::synchronize`], [`Inner::query`]). Under stream capture, work is recorded into the
//! graph instead ([`crate::graph`]).

use gpufuse_proto::{ReplyBody, Request};

use crate::error::ClientError;
use crate::graph::Op;
use crate::handles::{self, Kind};
use crate::ipc::{EVENT_DISABLE_TIMING, EVENT_INTERPROCESS};
use crate::state::{Event, Inner, Stream};
use crate::status::{INVALID_HANDLE, INVALID_VALUE, STREAM_CAPTURE_UNSUPPORTED, UNKNOWN};
use crate::work::SyncScope;
use gpufuse_proto::{EventHandle, StreamHandle};

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`: both name the default stream here.
const STREAM_LEGACY: u64 = 1;
const STREAM_PER_THREAD: u64 = 2;

impl Inner {
    /// The id the worker knows for the stream handle `h` (0 = the default stream).
    pub fn stream_id(&self, h: u64) -> Result<u64, ClientError> {
        match h {
            0 | STREAM_LEGACY | STREAM_PER_THREAD => Ok(0),
            h if self.streams.contains_key(&h) => Ok(h),
            _ => Err(INVALID_HANDLE.into()),
        }
    }

    /// The stream's record, `None` for the default stream.
    pub fn stream(&self, h: u64) -> Result<Option<&Stream>, ClientError> {
        let id = self.stream_id(h)?;
        Ok(self.streams.get(&id))
    }

    /// The event handle `h`, checked.
    pub fn event_id(&self, h: u64) -> Result<u64, ClientError> {
        if self.events.contains_key(&h) {
            Ok(h)
        } else {
            Err(INVALID_HANDLE.into())
        }
    }

    /// Synchronous work cannot be captured into a graph.
    pub fn not_capturing(&self, stream: u64) -> Result<(), ClientError> {
        match self.graphs.capturing(stream) {
            Some(_) => Err(STREAM_CAPTURE_UNSUPPORTED.into()),
            None => Ok(()),
        }
    }

    /// `cuStreamCreate` in the current context.
    pub fn create_stream(&mut self, flags: u32, priority: i32) -> Result<u64, ClientError> {
        let (ctx, _) = self.current()?;
        let h = handles::mint(Kind::Stream);
        let priority = priority.clamp(-5, 0);
        self.streams.insert(
            h,
            Stream {
                ctx,
                flags,
                priority,
            },
        );
        self.conn.quiet(&Request::StreamCreate {
            stream: StreamHandle(h),
            flags,
            priority,
        })?;
        Ok(h)
    }

    /// `cuStreamDestroy`.
    pub fn destroy_stream(&mut self, h: u64) -> Result<(), ClientError> {
        if self.streams.remove(&h).is_none() {
            return Err(INVALID_HANDLE.into());
        }
        self.lanes_changed();
        self.conn.quiet(&Request::StreamDestroy {
            stream: StreamHandle(h),
        })
    }

    /// `cuStreamSynchronize`.
    pub fn synchronize_stream(&mut self, h: u64) -> Result<(), ClientError> {
        let id = self.stream_id(h)?;
        self.not_capturing(id)?;
        self.synchronize(SyncScope::Stream(id))
    }

    /// `cuStreamQuery`.
    pub fn query_stream(&mut self, h: u64) -> Result<(), ClientError> {
        let id = self.stream_id(h)?;
        self.not_capturing(id)?;
        self.query(&Request::StreamQuery {
            stream: StreamHandle(id),
        })
    }

    /// Host functions run in stream order: under capture the function is recorded and `false`
    /// returned; otherwise the stream is drained and `true` returned (call it now).
    pub fn host_fn_ready(
        &mut self,
        h: u64,
        capture: Option<(usize, usize)>,
    ) -> Result<bool, ClientError> {
        let id = self.stream_id(h)?;
        if self.graphs.capturing(id).is_some() {
            let (func, user) = capture.ok_or(ClientError::Cuda(STREAM_CAPTURE_UNSUPPORTED))?;
            self.graphs.record(id, Op::HostFn { func, user });
            return Ok(false);
        }
        self.conn.call(&Request::StreamSynchronize {
            stream: StreamHandle(id),
        })?;
        Ok(true)
    }

    /// Waits for a stream's work without the synchronize sequence (a graph's host function
    /// runs after the work before it).
    pub fn drain_stream(&mut self, id: u64) -> Result<(), ClientError> {
        self.conn
            .call(&Request::StreamSynchronize {
                stream: StreamHandle(id),
            })
            .map(|_| ())
    }

    /// A graph's event record node, replayed: records `event` on `stream` if it still exists.
    pub fn replay_event_record(&mut self, event: u64, stream: u64) -> Result<(), ClientError> {
        if !self.events.contains_key(&event) {
            return Ok(());
        }
        self.conn.quiet(&Request::EventRecord {
            event: EventHandle(event),
            stream: StreamHandle(stream),
        })
    }

    /// `cuStreamWaitEvent`.
    pub fn stream_wait_event(&mut self, stream: u64, event: u64) -> Result<(), ClientError> {
        let st = self.stream_id(stream)?;
        let ev = self.event_id(event)?;
        // Waiting on an event recorded during a capture joins that capture (fork/join).
        if let Some(&graph) = self.graphs.captured_events.get(&ev) {
            if self.graphs.graphs.contains_key(&graph) {
                self.graphs.capturing.insert(st, graph);
                self.lanes_changed();
                return Ok(());
            }
        }
        if self.graphs.capturing(st).is_some() {
            return Ok(());
        }
        self.conn.quiet(&Request::StreamWaitEvent {
            stream: StreamHandle(st),
            event: EventHandle(ev),
        })
    }

    /// `cuEventCreate` (needs a current context).
    pub fn create_event(&mut self, flags: u32) -> Result<u64, ClientError> {
        self.current()?;
        if flags & EVENT_INTERPROCESS != 0 && flags & EVENT_DISABLE_TIMING == 0 {
            // CUDA: an interprocess event must be created without timing.
            return Err(INVALID_VALUE.into());
        }
        let h = handles::mint(Kind::Event);
        self.events.insert(
            h,
            Event {
                flags,
                recorded: false,
            },
        );
        self.conn.quiet(&Request::EventCreate {
            event: EventHandle(h),
            flags,
        })?;
        Ok(h)
    }

    /// `cuEventDestroy`.
    pub fn destroy_event(&mut self, h: u64) -> Result<(), ClientError> {
        let h = self.event_id(h)?;
        self.events.remove(&h);
        self.conn.quiet(&Request::EventDestroy {
            event: EventHandle(h),
        })
    }

    /// `cuEventRecord`, or its capture into the stream's graph.
    pub fn record_event(&mut self, event: u64, stream: u64) -> Result<(), ClientError> {
        let ev = self.event_id(event)?;
        let st = self.stream_id(stream)?;
        if let Some(e) = self.events.get_mut(&ev) {
            e.recorded = true;
        }
        if let Some(graph) = self.graphs.capturing(st) {
            self.graphs.captured_events.insert(ev, graph);
            self.graphs.record(st, Op::EventRecord { event: ev });
            return Ok(());
        }
        self.graphs.captured_events.remove(&ev);
        self.conn.quiet(&Request::EventRecord {
            event: EventHandle(ev),
            stream: StreamHandle(st),
        })?;
        if self.events[&ev].flags & EVENT_INTERPROCESS != 0 {
            // Other processes may wait for it as soon as this returns (`crate::ipc`).
            self.synchronize(SyncScope::Event(ev))?;
        }
        Ok(())
    }

    /// `cuEventQuery`.
    pub fn query_event(&mut self, h: u64) -> Result<(), ClientError> {
        let ev = self.event_id(h)?;
        self.query(&Request::EventQuery {
            event: EventHandle(ev),
        })
    }

    /// `cuEventSynchronize`.
    pub fn synchronize_event(&mut self, h: u64) -> Result<(), ClientError> {
        let ev = self.event_id(h)?;
        self.synchronize(SyncScope::Event(ev))
    }

    /// `cuEventElapsedTime`: milliseconds between two recorded events.
    pub fn elapsed(&mut self, start: u64, end: u64) -> Result<f32, ClientError> {
        let a = self.event_id(start)?;
        let b = self.event_id(end)?;
        if [a, b].iter().any(|e| {
            self.events
                .get(e)
                .is_some_and(|ev| ev.flags & EVENT_DISABLE_TIMING != 0)
        }) {
            return Err(INVALID_HANDLE.into());
        }
        match self.conn.call(&Request::EventElapsedTime {
            start: EventHandle(a),
            end: EventHandle(b),
        })? {
            ReplyBody::Elapsed(t) => Ok(t),
            _ => Err(UNKNOWN.into()),
        }
    }
}
