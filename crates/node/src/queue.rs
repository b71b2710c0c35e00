//! A device's launch queue as the node's threads use it: the [`LaunchPolicy`] behind a mutex,
//! a condition variable for the sessions waiting their turn, the clock, and the sessions'
//! lease offers (`gpufuse_transport::lease_offer`): a session that ends a lease while nobody
//! else waits is offered the next one, which its worker takes without asking; before the
//! device goes to anyone else every offer is revoked, and one found taken makes its session
//! the device's holder until its `Done`.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gpufuse_proto::ComputePolicy;
use gpufuse_transport::lease_offer::{LeaseOffer, Revoked};

use crate::launch_policy::{LaunchPolicy, Poll, Usage, QUANTUM_US};

/// The longest a waiting session sleeps before it looks at the queue again, whatever happens.
const MAX_WAIT: Duration = Duration::from_millis(50);

#[derive(Debug)]
pub struct DeviceQueue {
    policy: Mutex<LaunchPolicy>,
    /// The lease offers of the sessions on this device. Locked only while `policy` is held.
    offers: Mutex<HashMap<u64, Arc<LeaseOffer>>>,
    turn: Condvar,
    epoch: Instant,
}

impl DeviceQueue {
    pub fn new(policy: ComputePolicy) -> Self {
        Self {
            policy: Mutex::new(LaunchPolicy::new(policy)),
            offers: Mutex::new(HashMap::new()),
            turn: Condvar::new(),
            epoch: Instant::now(),
        }
    }

    /// Microseconds since the queue was made: the launch policy's clock.
    pub fn now(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    pub fn lock(&self) -> MutexGuard<'_, LaunchPolicy> {
        self.policy.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn offers(&self) -> MutexGuard<'_, HashMap<u64, Arc<LeaseOffer>>> {
        self.offers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Session `id`'s worker reads lease offers in `offer`.
    pub fn register_offer(&self, id: u64, offer: Arc<LeaseOffer>) {
        let _s = self.lock();
        self.offers().insert(id, offer);
    }

    /// Session `id` leaves this device (it moved): its offer word, withdrawn unless already
    /// taken (then the lease it took ends on the device it moved to, which learns of it then).
    pub fn unregister_offer(&self, id: u64) -> Option<Arc<LeaseOffer>> {
        let _s = self.lock();
        let offer = self.offers().remove(&id)?;
        offer.revoke();
        Some(offer)
    }

    /// Session `id` asks or reports: what its parked leases used is charged, and a lease it
    /// took from an offer is known from now on (it holds the device).
    fn absorb(&self, s: &mut LaunchPolicy, id: u64, now: u64) {
        let offers = self.offers();
        let Some(o) = offers.get(&id) else {
            return;
        };
        let taken = o.settle();
        charge_parked(s, id, o, now);
        if taken {
            s.take_lease(id, now);
        }
    }

    /// Before the device may go to `id`: every other session's offer is revoked (what its
    /// parked leases used is charged), and one found taken makes its session the holder.
    fn revoke_others(&self, s: &mut LaunchPolicy, id: u64, now: u64) {
        for (&other, offer) in self.offers().iter() {
            if other == id {
                continue;
            }
            let found = offer.revoke();
            if found != Revoked::Nothing {
                charge_parked(s, other, offer, now);
            }
            if found == Revoked::Taken {
                offer.settle();
                s.take_lease(other, now);
            }
        }
    }

    /// Blocks until session `id` holds the device; returns its quantum in microseconds.
    pub fn acquire(&self, id: u64) -> u64 {
        let mut s = self.lock();
        self.absorb(&mut s, id, self.now());
        self.wait_turn(s, id)
    }

    /// Session `id` ends its lease after `used_us` and queues again at once; blocks until it
    /// holds the device again.
    pub fn renew(&self, id: u64, used_us: u64) -> u64 {
        let mut s = self.lock();
        let now = self.now();
        self.absorb(&mut s, id, now);
        s.requeue(id, used_us, now);
        self.turn.notify_all();
        self.wait_turn(s, id)
    }

    fn wait_turn(&self, mut s: MutexGuard<'_, LaunchPolicy>, id: u64) -> u64 {
        loop {
            let now = self.now();
            self.revoke_others(&mut s, id, now);
            match s.poll(id, now) {
                Poll::Granted { quantum_us } => return quantum_us,
                Poll::Wait { until } => {
                    let wait = until.map_or(MAX_WAIT, |u| {
                        Duration::from_micros(u.saturating_sub(now).max(1)).min(MAX_WAIT)
                    });
                    s = self
                        .turn
                        .wait_timeout(s, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
    }

    /// Session `id` ends its lease after `used_us` of measured device time. If nobody else
    /// waits and it may run now, its next lease is offered to it.
    pub fn done(&self, id: u64, used_us: u64) {
        let now = self.now();
        let mut s = self.lock();
        self.absorb(&mut s, id, now);
        s.done(id, used_us, now);
        if s.may_offer(id, now) {
            if let Some(o) = self.offers().get(&id) {
                o.offer(QUANTUM_US);
            }
        }
        drop(s);
        self.turn.notify_all();
    }

    /// Session `id` is gone: it leaves the queue, and the device if it held it.
    pub fn remove(&self, id: u64) {
        let mut s = self.lock();
        s.remove(id);
        self.offers().remove(&id);
        drop(s);
        self.turn.notify_all();
    }

    /// What session `id` has used, and whether it holds the device now.
    pub fn usage(&self, id: u64) -> (Usage, bool) {
        let now = self.now();
        let mut s = self.lock();
        // What its parked leases used, so that the answer is up to date.
        if let Some(o) = self.offers().get(&id) {
            charge_parked(&mut s, id, o, now);
        }
        (s.usage(id, now), s.running() == Some(id))
    }
}

/// Charges session `id` what the leases it parked in `offer` used, each counted as a lease
/// with no wait (`gpufuse_transport::lease_offer`).
fn charge_parked(s: &mut LaunchPolicy, id: u64, offer: &LeaseOffer, now: u64) {
    s.charge(id, offer.take_charges(), now);
    s.offered_leases(id, offer.take_parked());
}
