//! How work reaches the device and how the host waits for it: the one choke point where managed
//! memory moves to the device before device work ([`Inner::device_work`] and its siblings), and
//! the one synchronize sequence ([`Inner::synchronize`]: the call, the first asynchronous error
//! since the last one, managed memory back to the host).

use gpufuse_proto::Request;

use crate::error::ClientError;
use crate::state::Inner;
use gpufuse_proto::{ContextHandle, EventHandle, StreamHandle};

/// What a synchronizing call waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncScope {
    /// All work of a context's device (`cuCtxSynchronize`); 0: the current context.
    Context(u64),
    /// One stream's work (`cuStreamSynchronize`).
    Stream(u64),
    /// Work up to an event (`cuEventSynchronize`).
    Event(u64),
}

impl Inner {
    /// Queues quiet device work (a launch, copy or memset), handing managed memory to the
    /// device first if the host had it.
    pub fn device_work(&mut self, req: &Request) -> Result<(), ClientError> {
        self.managed_to_device()?;
        self.conn.quiet(req)?;
        self.send_if_shared()
    }

    /// With managed memory shared with the device, device work goes out at once: the host may
    /// be waiting for what a kernel writes there (a flag it spins on) without calling into
    /// the driver again.
    fn send_if_shared(&mut self) -> Result<(), ClientError> {
        match self.shared_count {
            0 => Ok(()),
            _ => self.conn.flush(),
        }
    }

    /// [`Inner::device_work`] for a request whose last field is bulk data sent from `tail`.
    pub fn device_work_with_tail(&mut self, req: &Request, tail: &[u8]) -> Result<(), ClientError> {
        self.managed_to_device()?;
        self.conn.quiet_with_tail(req, tail)?;
        self.send_if_shared()
    }

    /// Device work answered with data (a 2-D device-to-host copy): managed memory goes to the
    /// device first, as for quiet work.
    pub fn device_call(&mut self, req: &Request) -> Result<gpufuse_proto::ReplyBody, ClientError> {
        self.managed_to_device()?;
        self.conn.call(req)
    }

    /// The last `max` launches the worker received (diagnostics and component tests).
    pub fn launch_log(
        &mut self,
        max: u32,
    ) -> Result<Vec<gpufuse_proto::LaunchRecord>, ClientError> {
        match self.conn.call(&Request::DebugLaunchLog { max })? {
            gpufuse_proto::ReplyBody::Launches(l) => Ok(l),
            _ => Err(ClientError::UnexpectedReply),
        }
    }

    /// Waits for `scope`'s work; returns the first asynchronous error since the last
    /// synchronizing call, and hands managed memory back to the host.
    pub fn synchronize(&mut self, scope: SyncScope) -> Result<(), ClientError> {
        let req = match scope {
            SyncScope::Context(ctx) => {
                let ctx = if ctx == 0 {
                    crate::state::current_context()
                } else {
                    ctx
                };
                self.context_device(ctx)?;
                Request::CtxSynchronize {
                    ctx: ContextHandle(ctx),
                }
            }
            SyncScope::Stream(stream) => Request::StreamSynchronize {
                stream: StreamHandle(stream),
            },
            SyncScope::Event(event) => Request::EventSynchronize {
                event: EventHandle(event),
            },
        };
        self.conn.call(&req)?;
        self.synchronized()
    }

    /// A status-only query (`cuStreamQuery`, `cuEventQuery`): `Ok` when the work is done,
    /// `NOT_READY` while it runs; either way the first asynchronous error comes first.
    pub fn query(&mut self, req: &Request) -> Result<(), ClientError> {
        self.conn.call(req)?;
        self.take_async_error()
    }

    /// The first asynchronous error since the last synchronizing call, as an error.
    pub fn take_async_error(&mut self) -> Result<(), ClientError> {
        match self.conn.take_async_error() {
            Some(e) => Err(ClientError::Cuda(e)),
            None => Ok(()),
        }
    }

    /// What every synchronizing call does once the device's work is done.
    pub(crate) fn synchronized(&mut self) -> Result<(), ClientError> {
        self.take_async_error()?;
        self.managed_to_host()
    }
}
