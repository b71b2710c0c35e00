//! Moving a session to another device of its node, inside its worker: the client keeps its
//! connection and its handles; the session's device state is captured
//! ([`gpufuse_device::Device::capture`]), rebuilt on a fresh device of the target
//! ([`gpufuse_device::Device::rebuild`]) at the same addresses, and the session switches to it.
//! Anything that cannot move refuses the move before anything changed. Moving between nodes
//! is designed in `docs/migration.md`.

use std::time::{Duration, Instant};

use gpufuse_device::Device;

use crate::{DeviceSlot, Session};

/// Opens the node's device `index` for this session (same address window, same model): how a
/// worker gets the target of a move.
pub type DeviceOpener = Box<dyn FnMut(u32) -> Result<Box<dyn Device>, String> + Send>;

impl Session<'_> {
    /// Moves the session onto `target` (a fresh device of the same window). Returns the time
    /// the session was stopped for; on an error nothing changed.
    pub fn migrate_to(&mut self, mut target: Box<dyn Device>) -> Result<Duration, String> {
        let stopped = Instant::now();
        self.end_lease();
        self.ensure_resident().map_err(|s| {
            format!("the session's memory cannot come back to move it (CUDA status {s})")
        })?;
        let image = self.device.capture().map_err(|e| e.to_string())?;
        target.rebuild(&image).map_err(|e| e.to_string())?;
        // Output the old device had not handed over yet travels with the session.
        let pending = self.device.take_output();
        let mut old = std::mem::replace(&mut self.device, DeviceSlot::Moved(target));
        for (ptr, _) in old.resident() {
            if old.free(ptr).is_err() {
                // Mapped VMM memory and the device's own ranges: dropped with their contents.
                let _ = old.evict(ptr);
            }
        }
        if !pending.is_empty() {
            tracing::debug!(
                bytes = pending.len(),
                "device output carried across the move"
            );
            self.carried_output = pending;
        }
        tracing::info!(
            bytes = image.bytes(),
            stop = ?stopped.elapsed(),
            "session moved to another device"
        );
        Ok(stopped.elapsed())
    }
}
