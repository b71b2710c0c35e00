//! Shared by the integration tests: claims shaped like the API server's, a gRPC client of the
//! plugin's unix sockets (as the kubelet connects), temporary directories.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tonic::transport::{Channel, Endpoint};

pub const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
pub const CLAIMS: &str = "resource.k8s.io/v1/resourceclaims";
pub const SLICES: &str = "resource.k8s.io/v1/resourceslices";

/// A fresh directory under the system's temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Short: unix socket paths are limited to 107 bytes.
        let p = std::env::temp_dir().join(format!("gfk-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A gRPC channel over a unix socket.
pub async fn channel(path: &Path) -> Channel {
    let path = path.to_path_buf();
    Endpoint::from_static("http://kubelet.invalid")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
        .expect("connect to the plugin's socket")
}

/// A ResourceClaim as the scheduler leaves it: spec with one request of the class, status
/// with the allocation (device, pool, consumed capacity, share id) and the pod it is
/// reserved for.
pub fn claim(namespace: &str, name: &str, _node: &str, memory: &str, compute: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{
            "name": "gpu",
            "exactly": {
                "deviceClassName": "gpu.gpufuse.dev",
                "allocationMode": "ExactCount",
                "count": 1,
                "capacity": {"requests": {"memory": memory, "compute": compute}}
            }
        }]}},
    })
}

pub fn allocation(node: &str, memory: &str, compute: &str, share: &str) -> Value {
    allocation_on(node, "gpu-0", memory, compute, share)
}

/// [`allocation`] of device `device` (`gpu-N`).
pub fn allocation_on(node: &str, device: &str, memory: &str, compute: &str, share: &str) -> Value {
    json!({
        "allocation": {
            "devices": {"results": [{
                "request": "gpu",
                "driver": "gpu.gpufuse.dev",
                "pool": node,
                "device": device,
                "shareID": share,
                "consumedCapacity": {"memory": memory, "compute": compute}
            }]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}
            ]}]}
        },
        "reservedFor": [{"resource": "pods", "name": "trainer", "uid": "7d2c33b4-0000-4000-8000-000000000001"}]
    })
}
