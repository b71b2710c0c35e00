//! The node's GPUs as the DRA driver publishes them: read from the `gpufuse serve` node's
//! status (the same devices, sizes and UUIDs its sessions see).

use gpufuse_proto::{DeviceKind, DeviceStatus, NodeStatus};

/// One GPU of the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// The node's device index (`gpufuse status`).
    pub index: u32,
    /// The device's name in the ResourceSlice: `gpu-<index>`.
    pub name: String,
    /// The model, as `cuDeviceGetName` reports it.
    pub model: String,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as `nvidia-smi -L` writes UUIDs.
    pub uuid: String,
    pub compute_capability: (u32, u32),
    pub memory_bytes: u64,
    pub emulated: bool,
}

/// The version the driver publishes as `driverVersion`: gpufuse's own (the node's driver is
/// gpufuse's, for emulated and remoted GPUs alike).
pub const DRIVER_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The device name a node's device index has in the ResourceSlice.
pub fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// A UUID in NVIDIA's text form.
pub use gpufuse_proto::uuid_text;

impl Gpu {
    pub fn from_status(d: &DeviceStatus) -> Gpu {
        Gpu {
            index: d.index,
            name: device_name(d.index),
            model: d.name.clone(),
            uuid: uuid_text(&d.uuid),
            compute_capability: d.compute_capability,
            memory_bytes: d.total_bytes,
            emulated: d.kind == DeviceKind::Emulated,
        }
    }
}

/// The GPUs of a node's status.
pub fn from_status(s: &NodeStatus) -> Vec<Gpu> {
    s.devices.iter().map(Gpu::from_status).collect()
}

/// Asks the node at `server` for its devices.
pub fn query(server: &gpufuse_transport::Address, token: &str) -> anyhow::Result<Vec<Gpu>> {
    let status =
        gpufuse_client::Connection::query_status(server, token.to_string()).map_err(|e| {
            anyhow::anyhow!("cannot read the devices of the gpufuse node at {server}: {e}")
        })?;
    Ok(from_status(&status))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_read_as_nvidia_writes_them() {
        let u: [u8; 16] = core::array::from_fn(|i| i as u8 * 17);
        assert_eq!(uuid_text(&u), "GPU-00112233-4455-6677-8899-aabbccddeeff");
    }
}
