//! The controller inside `gpufuse serve`: the pool of one node in the same process.
//!
//! `gpufuse serve` is a controller and a node in one process, with no configuration: the node
//! reports to the controller by a call instead of a link (a report before every placement, so
//! the books are exact), and asks it to place each `Cuda` hello its listeners receive; the
//! controller answers with the placement a redirect would carry, and the node admits the
//! session at once, as it would with the grant. So a standalone server has the pool's
//! policies, quotas, pending queue and preemption, and its clients need no redirect.

use gpufuse_proto::{ClientHello, Grant, NodeReport, PoolPendingView};

use crate::link::parts;
use crate::place;
use crate::Controller;

/// The link id under which the in-process node is registered (network links count from 1).
const LOCAL_LINK: u64 = 0;

impl Controller {
    /// Starts the controller's ticker without listening: its only node is in this process.
    pub fn start_embedded(&self) {
        self.start_ticker();
    }

    /// The key grants and end orders are signed with (the in-process node checks end
    /// orders with it, as a node given it at registration does).
    pub fn grant_key(&self) -> Vec<u8> {
        self.0.grant_key.to_vec()
    }

    /// The in-process node's report: the first registers it, later ones are its heartbeats.
    pub fn report_local(&self, report: &NodeReport) {
        let mut b = self.books();
        let now = self.now();
        let (spec, sessions, loads) = parts(report);
        if b.links.get(&report.name) == Some(&LOCAL_LINK) {
            b.pool.report(&report.name, &sessions, &loads, now);
        } else {
            tracing::debug!(
                "node {} registered in process: {} device(s)",
                spec.name,
                spec.devices.len()
            );
            b.links.insert(spec.name.clone(), LOCAL_LINK);
            b.pool.register_node(spec, &sessions, &loads, now);
        }
        self.reschedule(&mut b);
    }

    /// Places a `Cuda` hello on the in-process node (waiting while nothing fits, until its
    /// wait ends or `hung_up` says the client left): the grant a redirect would carry.
    pub fn place_local(
        &self,
        hello: &ClientHello,
        hung_up: &mut dyn FnMut() -> bool,
    ) -> Result<Grant, String> {
        place::decide(self, hello, hung_up).map(|p| place::grant_of(&p))
    }

    /// A `Check` hello: whether the session passes the quotas (`Err` names the limit), and
    /// whether it would wait for capacity (`true`) rather than be refused when nothing fits.
    pub fn check_local(&self, hello: &ClientHello) -> Result<bool, String> {
        place::check_waits(self, hello)
    }

    /// The requests waiting for capacity, oldest first within each QoS.
    pub fn pending(&self) -> Vec<PoolPendingView> {
        self.snapshot().pending
    }
}
