//! Preparing a claim: from the `ResourceClaim`'s allocation (the devices of this node the
//! scheduler picked, and the capacity each request consumed) to a CDI spec whose environment
//! carries a session token bounded to that capacity.
//!
//! The kubelet names a claim only by namespace, name and UID; the allocation is in the claim's
//! status, read from the API server. The token is the node's own kind (`crates/auth`): its
//! `max_vram_bytes` and `max_compute_percent` are the consumed `memory` and `compute`, so the
//! node refuses a session asking for more and gives one asking for nothing exactly the slice,
//! as for `gpufuse run --vram --compute` with such a token.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use kube::api::Api;

use crate::cdi::{self, DeviceGrant};
use crate::inventory::Gpu;
use crate::quantity;
use crate::slice::{COMPUTE, MEMORY};
use crate::{DRIVER_NAME, QUOTA_REFUSED_ANNOTATION};

/// A claim as the kubelet names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// One prepared device: what the kubelet is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedDevice {
    pub request: String,
    pub pool: String,
    pub device: String,
    pub cdi_id: String,
    pub share_id: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("cannot read ResourceClaim {namespace}/{name}")]
    Read {
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("ResourceClaim {0} does not exist")]
    NotFound(String),
    #[error("ResourceClaim {claim} has UID {found}, not {wanted}: it was deleted and made anew")]
    UidMismatch {
        claim: String,
        found: String,
        wanted: String,
    },
    #[error("ResourceClaim {0} is not allocated")]
    NotAllocated(String),
    #[error("ResourceClaim {claim} was allocated device {device}, which this node does not have")]
    UnknownDevice { claim: String, device: String },
    #[error("ResourceClaim {claim}: consumed {capacity}: {source}")]
    Capacity {
        claim: String,
        capacity: String,
        #[source]
        source: quantity::QuantityError,
    },
    #[error("ResourceClaim {claim} asks for {what}, more than device {device} has ({has})")]
    TooLarge {
        claim: String,
        what: String,
        device: String,
        has: String,
    },
    #[error("ResourceClaim {claim} is over its namespace's GPUQuota: {reason}")]
    OverQuota { claim: String, reason: String },
    #[error("cannot issue the claim's session token: {0}")]
    Token(#[from] gpufuse_auth::AuthError),
    #[error(transparent)]
    Cdi(#[from] cdi::CdiError),
    #[error("cannot end the sessions of ResourceClaim {claim} on the node at {node}: {reason}")]
    EndSessions {
        claim: String,
        node: String,
        reason: String,
    },
}

/// What the plugin needs to prepare claims.
pub struct Preparer {
    pub node_name: String,
    pub client: kube::Client,
    pub gpus: Arc<RwLock<Vec<Gpu>>>,
    pub layout: cdi::Layout,
    pub cdi_dir: PathBuf,
    /// The node's token secret (`gpufuse serve --token-secret-file`).
    pub secret: Vec<u8>,
}

/// The slice a request of a claim consumed on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slice {
    pub vram_bytes: u64,
    pub compute_percent: u32,
}

/// The capacity `r` consumed of `gpu`: what the allocation says, or the whole device where it
/// says nothing (a device allocated without consumable capacity is allocated whole).
pub fn consumed(
    claim: &str,
    r: &DeviceRequestAllocationResult,
    gpu: &Gpu,
) -> Result<Slice, PrepareError> {
    let get = |key: &str| -> Result<Option<u64>, PrepareError> {
        r.consumed_capacity
            .as_ref()
            .and_then(|c| c.get(key))
            .map(|q| {
                quantity::parse_quantity(q).map_err(|source| PrepareError::Capacity {
                    claim: claim.into(),
                    capacity: key.into(),
                    source,
                })
            })
            .transpose()
    };
    let whole = gpu.memory_bytes - gpu.memory_bytes % crate::slice::MEMORY_STEP;
    let vram_bytes = get(MEMORY)?.unwrap_or(whole);
    let compute = get(COMPUTE)?.unwrap_or(100);
    let too_large = |what: String, has: String| PrepareError::TooLarge {
        claim: claim.into(),
        what,
        device: gpu.name.clone(),
        has,
    };
    if vram_bytes > whole || vram_bytes == 0 {
        return Err(too_large(
            format!("{vram_bytes} bytes of memory"),
            format!("{whole} bytes"),
        ));
    }
    if !(1..=100).contains(&compute) {
        return Err(too_large(format!("{compute}% of compute"), "100%".into()));
    }
    Ok(Slice {
        vram_bytes,
        compute_percent: compute as u32,
    })
}

impl Preparer {
    /// Prepares one claim: writes its CDI spec and returns its devices.
    pub async fn prepare(&self, c: &ClaimRef) -> Result<Vec<PreparedDevice>, PrepareError> {
        let qualified = format!("{}/{}", c.namespace, c.name);
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &c.namespace);
        let claim = api
            .get_opt(&c.name)
            .await
            .map_err(|source| PrepareError::Read {
                namespace: c.namespace.clone(),
                name: c.name.clone(),
                source: Box::new(source),
            })?
            .ok_or_else(|| PrepareError::NotFound(qualified.clone()))?;
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        if uid != c.uid {
            return Err(PrepareError::UidMismatch {
                claim: qualified,
                found: uid,
                wanted: c.uid.clone(),
            });
        }
        if let Some(reason) = claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(QUOTA_REFUSED_ANNOTATION))
        {
            return Err(PrepareError::OverQuota {
                claim: qualified,
                reason: reason.clone(),
            });
        }
        let results = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .map(|d| d.results.clone().unwrap_or_default())
            .ok_or_else(|| PrepareError::NotAllocated(qualified.clone()))?;
        let gpus = self.gpus.read().unwrap_or_else(|e| e.into_inner()).clone();
        let mut grants = Vec::new();
        let mut prepared = Vec::new();
        for r in results
            .iter()
            .filter(|r| r.driver == DRIVER_NAME && r.pool == self.node_name)
        {
            let gpu = gpus.iter().find(|g| g.name == r.device).ok_or_else(|| {
                PrepareError::UnknownDevice {
                    claim: qualified.clone(),
                    device: r.device.clone(),
                }
            })?;
            let slice = consumed(&qualified, r, gpu)?;
            let token = gpufuse_auth::issue(
                &self.secret,
                &gpufuse_auth::Claims {
                    subject: qualified.clone(),
                    expires: None,
                    max_vram_bytes: Some(slice.vram_bytes),
                    max_compute_percent: Some(slice.compute_percent),
                    // Honoured only while this claim is prepared, and only on its device.
                    claim: Some(c.uid.clone()),
                    device: Some(gpu.uuid.clone()),
                },
            )?;
            // A request may get the same device twice only with distinct share ids.
            let part = match &r.share_id {
                Some(s) => format!("{}-{}-{s}", r.request, r.device),
                None => format!("{}-{}", r.request, r.device),
            };
            let cdi_name = cdi::device_name(&c.uid, &sanitize(&part));
            grants.push(DeviceGrant {
                cdi_name: cdi_name.clone(),
                token,
                vram_bytes: slice.vram_bytes,
                compute_percent: slice.compute_percent,
                uuid: gpu.uuid.clone(),
            });
            prepared.push(PreparedDevice {
                request: r.request.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
                cdi_id: cdi::qualified(&cdi_name),
                share_id: r.share_id.clone(),
            });
        }
        let spec = cdi::spec(&self.layout, &grants)?;
        cdi::write(&self.cdi_dir, &c.uid, &spec)?;
        tracing::info!(
            "prepared ResourceClaim {qualified} ({}): {} device(s)",
            c.uid,
            prepared.len()
        );
        Ok(prepared)
    }

    /// Unprepares one claim: its CDI spec is removed, so the node honours its token no more,
    /// then the node ends the sessions the claim's pods still have open.
    pub fn unprepare(&self, c: &ClaimRef) -> Result<(), PrepareError> {
        cdi::remove(&self.cdi_dir, &c.uid)?;
        let ended = self.end_sessions(c)?;
        tracing::info!(
            "unprepared ResourceClaim {}/{} ({}): {ended} session(s) ended",
            c.namespace,
            c.name,
            c.uid
        );
        Ok(())
    }

    /// Asks the node to end every session opened with claim `c`'s token.
    fn end_sessions(&self, c: &ClaimRef) -> Result<u32, PrepareError> {
        use gpufuse_proto::{ServerHello, SessionKind};
        let qualified = format!("{}/{}", c.namespace, c.name);
        let node = &self.layout.host_server;
        let failed = |reason: String| PrepareError::EndSessions {
            claim: qualified.clone(),
            node: node.to_string(),
            reason,
        };
        let token = gpufuse_auth::issue(
            &self.secret,
            &gpufuse_auth::Claims {
                subject: qualified.clone(),
                claim: Some(c.uid.clone()),
                ..Default::default()
            },
        )?;
        let hello =
            gpufuse_client::Connection::hello(SessionKind::EndClaim, token, Default::default());
        match gpufuse_client::Connection::one_shot(node, &hello) {
            Ok(ServerHello::ClaimEnded { sessions }) => Ok(sessions),
            Ok(ServerHello::Refused { reason }) => Err(failed(reason)),
            Ok(other) => Err(failed(format!("unexpected answer {other:?}"))),
            // No node listening: it has no sessions (its workers end with it).
            Err(e @ gpufuse_client::ClientError::Connect { .. }) => {
                tracing::warn!(
                    "ResourceClaim {qualified}: no node at {node} to end its sessions ({}): none to end",
                    crate::error_chain(&e)
                );
                Ok(0)
            }
            Err(e) => Err(failed(crate::error_chain(&e))),
        }
    }
}

/// Request names may hold `/` (`request/subrequest`); CDI names may not.
fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.:-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use std::collections::BTreeMap;

    fn gpu() -> Gpu {
        Gpu {
            index: 0,
            name: "gpu-0".into(),
            model: "m".into(),
            uuid: "GPU-x".into(),
            compute_capability: (10, 0),
            memory_bytes: 16 << 30,
            emulated: true,
        }
    }

    fn result(consumed: Option<&[(&str, &str)]>) -> DeviceRequestAllocationResult {
        DeviceRequestAllocationResult {
            request: "gpu".into(),
            driver: DRIVER_NAME.into(),
            pool: "node-a".into(),
            device: "gpu-0".into(),
            consumed_capacity: consumed.map(|c| {
                c.iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect::<BTreeMap<_, _>>()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn consumed_capacity_is_the_slice_and_none_is_the_whole_device() {
        let s = consumed(
            "c",
            &result(Some(&[("memory", "4Gi"), ("compute", "30")])),
            &gpu(),
        );
        assert_eq!(
            s.unwrap(),
            Slice {
                vram_bytes: 4 << 30,
                compute_percent: 30
            }
        );
        let whole = consumed("c", &result(None), &gpu()).unwrap();
        assert_eq!(whole.vram_bytes, 16 << 30);
        assert_eq!(whole.compute_percent, 100);
    }

    #[test]
    fn capacity_beyond_the_device_or_unparsable_is_refused() {
        assert!(matches!(
            consumed("c", &result(Some(&[("memory", "17Gi")])), &gpu()),
            Err(PrepareError::TooLarge { .. })
        ));
        assert!(matches!(
            consumed("c", &result(Some(&[("compute", "101")])), &gpu()),
            Err(PrepareError::TooLarge { .. })
        ));
        assert!(matches!(
            consumed("c", &result(Some(&[("memory", "lots")])), &gpu()),
            Err(PrepareError::Capacity { .. })
        ));
    }

    #[test]
    fn sanitized_names_fit_cdi() {
        assert_eq!(sanitize("gpu/a-gpu-0"), "gpu_a-gpu-0");
    }
}
