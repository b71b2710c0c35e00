//! The worker's line to its node: the device's memory ledger and its launch queue live in the
//! node, because several sessions (worker processes) share one device. Over a socket pair, in
//! the same framing as every other connection: [`ControlRequest`] frames (kind `Control`)
//! answered by [`ControlAnswer`] frames (kind `ControlReply`) with the request's id.

use std::os::unix::net::UnixStream;

use gpufuse_proto::{
    decode_owned, encode_frame, ControlAnswer, ControlRequest, FrameKind, ImageCounts,
};
use gpufuse_transport::lease_offer::LeaseOffer;
use gpufuse_transport::{Conn, Stream};

/// The device memory ledger as a worker sees it.
pub trait Ledger {
    /// Reserves `bytes`; false if the device cannot hold them.
    fn reserve(&mut self, bytes: u64) -> bool;
    fn release(&mut self, bytes: u64);
    /// Bytes in use on the device by every session.
    fn device_used(&mut self) -> u64;
    /// Waits until this session may launch on the device; returns the lease's quantum in
    /// microseconds. A device nobody else uses is always free.
    fn acquire(&mut self) -> u64 {
        u64::MAX
    }
    /// Ends the lease; its launches ran for `micros` of device time.
    fn done(&mut self, _micros: u64) {}
    /// Ends the lease and waits for the next one; returns its quantum.
    fn renew(&mut self, micros: u64) -> u64 {
        self.done(micros);
        self.acquire()
    }
    /// Reports how much of the session's memory is in host memory and on disk.
    fn swapped(&mut self, _host: u64, _disk: u64) {}
    /// Reserves `bytes` for a session that holds no device memory now: the node may wait for
    /// others to make room (oversubscription).
    fn reserve_waiting(&mut self, bytes: u64) -> bool {
        self.reserve(bytes)
    }
    /// Reports module images received or found in the node's image cache since the last
    /// report.
    fn images(&mut self, _counts: ImageCounts) {}
}

/// The ledger in the node, reached over the control socket, and the session's lease offers
/// (`gpufuse_transport::lease_offer`): a lease the node offered is taken without asking.
pub struct ControlLedger {
    conn: Conn,
    next_id: u64,
    out: Vec<u8>,
    offer: Option<LeaseOffer>,
    /// The lease held now was taken from an offer.
    offered: bool,
}

impl ControlLedger {
    pub fn new(control: UnixStream) -> Self {
        Self {
            conn: Conn::new(Stream::Unix(control)),
            next_id: 1,
            out: Vec::with_capacity(64),
            offer: None,
            offered: false,
        }
    }

    /// The same ledger, taking the leases the node offers in `offer`.
    pub fn with_offers(mut self, offer: LeaseOffer) -> Self {
        self.offer = Some(offer);
        self
    }

    /// A request the node does not answer (`Done`).
    fn tell(&mut self, req: ControlRequest) {
        let id = self.next_id;
        self.next_id += 1;
        self.out.clear();
        encode_frame(&mut self.out, FrameKind::Control, 0, id, &req);
        let _ = self.conn.send(&self.out);
    }

    /// One request and its answer; `None` if the node is gone or answered nonsense.
    fn ask(&mut self, req: ControlRequest) -> Option<ControlAnswer> {
        let id = self.next_id;
        self.next_id += 1;
        self.out.clear();
        encode_frame(&mut self.out, FrameKind::Control, 0, id, &req);
        self.conn.send(&self.out).ok()?;
        let (h, body) = self.conn.recv().ok()?;
        if h.kind != FrameKind::ControlReply || h.request_id != id {
            return None;
        }
        decode_owned(body).ok()
    }
}

impl Ledger for ControlLedger {
    fn reserve(&mut self, bytes: u64) -> bool {
        self.ask(ControlRequest::Reserve { bytes })
            .is_some_and(|a| a.ok)
    }
    fn release(&mut self, bytes: u64) {
        let _ = self.ask(ControlRequest::Release { bytes });
    }
    fn device_used(&mut self) -> u64 {
        self.ask(ControlRequest::DeviceUsed).map_or(0, |a| a.value)
    }
    fn images(&mut self, counts: ImageCounts) {
        let _ = self.ask(ControlRequest::Images(counts));
    }
    fn acquire(&mut self) -> u64 {
        if let Some(quantum) = self.offer.as_ref().and_then(|o| o.take()) {
            self.offered = true;
            return quantum;
        }
        // Without a node there is nobody to share with: run.
        self.ask(ControlRequest::Acquire)
            .map_or(u64::MAX, |a| a.value)
    }
    fn done(&mut self, micros: u64) {
        // A lease taken from an offer is parked, its time left for the node to collect.
        if std::mem::take(&mut self.offered) && self.offer.as_ref().is_some_and(|o| o.park(micros))
        {
            return;
        }
        self.tell(ControlRequest::Done { micros });
    }
    fn renew(&mut self, micros: u64) -> u64 {
        self.offered = false;
        self.ask(ControlRequest::Renew { micros })
            .map_or(u64::MAX, |a| a.value)
    }
    fn swapped(&mut self, host: u64, disk: u64) {
        let _ = self.ask(ControlRequest::Swapped { host, disk });
    }
    fn reserve_waiting(&mut self, bytes: u64) -> bool {
        self.ask(ControlRequest::ReserveWaiting { bytes })
            .is_some_and(|a| a.ok)
    }
}

/// A ledger for a device nobody else uses (component tests, single-session runs).
#[derive(Debug)]
pub struct LocalLedger {
    pub total: u64,
    pub used: u64,
}

impl Ledger for LocalLedger {
    fn reserve(&mut self, bytes: u64) -> bool {
        match self.used.checked_add(bytes) {
            Some(u) if u <= self.total => {
                self.used = u;
                true
            }
            _ => false,
        }
    }
    fn release(&mut self, bytes: u64) {
        self.used = self.used.saturating_sub(bytes);
    }
    fn device_used(&mut self) -> u64 {
        self.used
    }
}
