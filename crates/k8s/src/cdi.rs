//! CDI (Container Device Interface) specs: what the container runtime does to a container
//! that gets one of our devices.
//!
//! A prepared claim gets one spec file, `<cdi dir>/gpufuse.dev-gpu_<claim uid>.json`, with one
//! CDI device per allocated GPU. Its container edits are everything `gpufuse run` does to a
//! process: the shims' directory mounted and first on `LD_LIBRARY_PATH`, the node's address
//! (and its socket's directory mounted, for a unix socket), the session token, and the slice.
//! The format is the CDI specification's JSON (version 0.6.0); the runtime (containerd, CRI-O)
//! reads the file by the fully qualified device names the plugin returns to the kubelet.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The CDI vendor/class of our devices: names are `gpufuse.dev/gpu=<device>`.
pub const KIND: &str = "gpufuse.dev/gpu";
/// The CDI specification version the files declare.
pub const CDI_VERSION: &str = "0.6.0";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<Device>,
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub container_edits: ContainerEdits,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `NAME=value`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

impl ContainerEdits {
    fn is_empty(&self) -> bool {
        self.env.is_empty() && self.mounts.is_empty()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// Where the node and the shims are, on the host and inside containers.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The directory with `libcuda.so.1` and `libnvidia-ml.so.1` on the host.
    pub host_lib_dir: PathBuf,
    /// Where that directory is mounted in the container.
    pub container_lib_dir: PathBuf,
    /// The node's address as the host sees it (`unix:PATH` or `tcp:HOST:PORT`).
    pub host_server: gpufuse_transport::Address,
    /// The node's address inside the container. For `unix:PATH`, the socket's directory on
    /// the host is mounted at `PATH`'s directory.
    pub container_server: gpufuse_transport::Address,
}

/// What one device of a claim carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceGrant {
    /// CDI device name (unique per claim and device).
    pub cdi_name: String,
    pub token: String,
    pub vram_bytes: u64,
    pub compute_percent: u32,
    /// The GPU's UUID, for the container's information (`GPUFUSE_VISIBLE_DEVICES`).
    pub uuid: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("cannot write the CDI spec {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot remove the CDI spec {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the node address {0} has no directory to mount")]
    SocketWithoutDirectory(String),
}

/// The fully qualified CDI device id the kubelet passes to the runtime.
pub fn qualified(name: &str) -> String {
    format!("{KIND}={name}")
}

/// The CDI device name of a claim's device. CDI names allow `[A-Za-z0-9_.:-]`; a claim UID is
/// a UUID and a device name a DNS label, so both fit.
pub fn device_name(claim_uid: &str, device: &str) -> String {
    format!("claim-{claim_uid}-{device}")
}

/// The spec file of a claim.
pub fn spec_path(dir: &Path, claim_uid: &str) -> PathBuf {
    // The node looks for the same file to honour the claim's token (gpufuse_auth).
    gpufuse_auth::claim_spec_path(dir, claim_uid)
        .unwrap_or_else(|| dir.join(format!("gpufuse.dev-gpu_{claim_uid}.json")))
}

fn address_text(a: &gpufuse_transport::Address) -> String {
    a.to_string()
}

/// The spec of a claim's devices.
pub fn spec(layout: &Layout, grants: &[DeviceGrant]) -> Result<Spec, CdiError> {
    let lib = layout.container_lib_dir.display().to_string();
    let mut mounts = vec![Mount {
        host_path: layout.host_lib_dir.display().to_string(),
        container_path: lib.clone(),
        options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "bind".into()],
    }];
    if let (Some(host), Some(inside)) = (
        socket_dir(&layout.host_server)?,
        socket_dir(&layout.container_server)?,
    ) {
        mounts.push(Mount {
            host_path: host,
            container_path: inside,
            options: vec!["rw".into(), "nosuid".into(), "nodev".into(), "bind".into()],
        });
    }
    let devices = grants
        .iter()
        .map(|g| Device {
            name: g.cdi_name.clone(),
            annotations: BTreeMap::new(),
            container_edits: ContainerEdits {
                env: vec![
                    format!("GPUFUSE_TOKEN={}", g.token),
                    format!("GPUFUSE_VRAM={}", g.vram_bytes),
                    format!("GPUFUSE_COMPUTE={}", g.compute_percent),
                    format!("GPUFUSE_VISIBLE_DEVICES={}", g.uuid),
                ],
                mounts: Vec::new(),
            },
        })
        .collect();
    Ok(Spec {
        cdi_version: CDI_VERSION.into(),
        kind: KIND.into(),
        devices,
        container_edits: ContainerEdits {
            env: vec![
                format!("LD_LIBRARY_PATH={lib}:/usr/local/nvidia/lib64:/usr/local/nvidia/lib"),
                format!("GPUFUSE_SERVER={}", address_text(&layout.container_server)),
            ],
            mounts,
        },
    })
}

fn socket_dir(a: &gpufuse_transport::Address) -> Result<Option<String>, CdiError> {
    let text = a.to_string();
    let Some(path) = text.strip_prefix("unix:") else {
        return Ok(None);
    };
    Path::new(path)
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map(|p| Some(p.display().to_string()))
        .ok_or(CdiError::SocketWithoutDirectory(text.clone()))
}

/// Writes a claim's spec (atomically: a temporary file renamed into place, so the runtime
/// never reads half a spec).
pub fn write(dir: &Path, claim_uid: &str, spec: &Spec) -> Result<PathBuf, CdiError> {
    let path = spec_path(dir, claim_uid);
    let tmp = dir.join(format!(".gpufuse.dev-gpu_{claim_uid}.json.tmp"));
    let body = serde_json::to_vec_pretty(spec).expect("a CDI spec serializes");
    let werr = |source| CdiError::Write {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(werr)?;
    std::fs::write(&tmp, body).map_err(werr)?;
    std::fs::rename(&tmp, &path).map_err(werr)?;
    Ok(path)
}

/// Removes a claim's spec; a spec that is not there is not an error (unprepare is repeated).
pub fn remove(dir: &Path, claim_uid: &str) -> Result<(), CdiError> {
    let path = spec_path(dir, claim_uid);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(CdiError::Remove { path, source }),
    }
}

/// The environment a container gets from the spec for one of its devices: the spec's edits,
/// then the device's, later ones winning (as the runtime applies them).
pub fn environment(spec: &Spec, device: &str) -> Option<Vec<(String, String)>> {
    let d = spec.devices.iter().find(|d| d.name == device)?;
    let mut env: Vec<(String, String)> = Vec::new();
    for kv in spec
        .container_edits
        .env
        .iter()
        .chain(&d.container_edits.env)
    {
        let (k, v) = kv.split_once('=')?;
        env.retain(|(old, _)| old != k);
        env.push((k.to_string(), v.to_string()));
    }
    Some(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout {
            host_lib_dir: "/var/lib/gpufuse/lib".into(),
            container_lib_dir: "/usr/local/gpufuse/lib".into(),
            host_server: "unix:/run/gpufuse/node.sock".parse().unwrap(),
            container_server: "unix:/var/run/gpufuse/node.sock".parse().unwrap(),
        }
    }

    fn grant() -> DeviceGrant {
        DeviceGrant {
            cdi_name: device_name("0b0e5c1e-1111-2222-3333-444455556666", "gpu-0"),
            token: "gf1.x.y".into(),
            vram_bytes: 4 << 30,
            compute_percent: 30,
            uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
        }
    }

    #[test]
    fn spec_mounts_the_shims_and_the_socket_and_sets_the_slice() {
        let s = spec(&layout(), &[grant()]).unwrap();
        assert_eq!(s.kind, "gpufuse.dev/gpu");
        let m = &s.container_edits.mounts;
        assert_eq!(m[0].host_path, "/var/lib/gpufuse/lib");
        assert_eq!(m[0].container_path, "/usr/local/gpufuse/lib");
        assert_eq!(m[1].host_path, "/run/gpufuse");
        assert_eq!(m[1].container_path, "/var/run/gpufuse");
        let env = environment(&s, &grant().cdi_name).unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(
            get("GPUFUSE_SERVER"),
            Some("unix:/var/run/gpufuse/node.sock")
        );
        assert_eq!(get("GPUFUSE_VRAM"), Some("4294967296"));
        assert_eq!(get("GPUFUSE_COMPUTE"), Some("30"));
        assert_eq!(get("GPUFUSE_TOKEN"), Some("gf1.x.y"));
        assert!(get("LD_LIBRARY_PATH")
            .unwrap()
            .starts_with("/usr/local/gpufuse/lib:"));
        assert_eq!(
            qualified(&grant().cdi_name),
            "gpufuse.dev/gpu=claim-0b0e5c1e-1111-2222-3333-444455556666-gpu-0"
        );
    }

    #[test]
    fn a_tcp_node_mounts_no_socket() {
        let mut l = layout();
        l.host_server = "tcp:10.0.0.1:7070".parse().unwrap();
        l.container_server = l.host_server.clone();
        let s = spec(&l, &[grant()]).unwrap();
        assert_eq!(s.container_edits.mounts.len(), 1);
    }

    #[test]
    fn write_and_remove_are_idempotent() {
        let dir = std::env::temp_dir().join(format!("gpufuse-cdi-{}", std::process::id()));
        let s = spec(&layout(), &[grant()]).unwrap();
        let p = write(&dir, "u1", &s).unwrap();
        write(&dir, "u1", &s).unwrap();
        let back: Spec = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        assert_eq!(back, s);
        remove(&dir, "u1").unwrap();
        remove(&dir, "u1").unwrap();
        assert!(!p.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
