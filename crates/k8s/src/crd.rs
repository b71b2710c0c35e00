//! The pool's own resources: `GPUPool` (which nodes form a pool and how it places and
//! oversubscribes) and `GPUQuota` (a namespace's totals and per-claim maxima). Their YAML is
//! generated from these types (`gpufuse operator crds`) and checked in under
//! `deploy/helm/gpufuse/crds/`; a test fails when the two drift apart.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of gpufuse's resources.
pub const GROUP: &str = "gpufuse.dev";

/// How the pool controller places sessions on the pool's nodes (`gpufuse controller
/// --policy`, for these nodes only); absent: the controller's own policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Placement {
    /// The fullest GPU that fits first: sessions pack onto few GPUs, whole GPUs stay free for
    /// large requests (`binpack`).
    Binpack,
    /// The emptiest, least busy GPU first: the least interference (`spread`).
    Spread,
    /// The fullest node, the emptiest GPU on it (`balanced`).
    Balanced,
    /// The former name of `Binpack`.
    Pack,
}

impl Placement {
    /// The scheduler's policy.
    pub fn policy(self) -> gpufuse_scheduler::Policy {
        match self {
            Placement::Binpack | Placement::Pack => gpufuse_scheduler::Policy::Binpack,
            Placement::Spread => gpufuse_scheduler::Policy::Spread,
            Placement::Balanced => gpufuse_scheduler::Policy::Balanced,
        }
    }
}

/// How far a pool may promise more than it has, as its status counts capacity. What a node
/// promises is its own (`gpufuse node --vram-oversubscribe`; compute never past 100% of a
/// device), and the node enforces it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Oversubscription {
    /// Memory the pool may promise, in percent of what its GPUs have (100: none).
    #[serde(default = "hundred")]
    #[schemars(range(min = 100, max = 1000))]
    pub memory_percent: u32,
    /// Compute shares the pool may promise, in percent of its GPUs' time (100: none).
    #[serde(default = "hundred")]
    #[schemars(range(min = 100, max = 1000))]
    pub compute_percent: u32,
}

fn hundred() -> u32 {
    100
}

impl Default for Oversubscription {
    fn default() -> Self {
        Oversubscription {
            memory_percent: 100,
            compute_percent: 100,
        }
    }
}

/// A pool of GPUs: the gpufuse nodes whose Kubernetes nodes match the selector.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "gpufuse.dev",
    version = "v1alpha1",
    kind = "GPUPool",
    plural = "gpupools",
    shortname = "gpool",
    status = "GPUPoolStatus",
    printcolumn = r#"{"name":"Devices","type":"integer","jsonPath":".status.devices"}"#,
    printcolumn = r#"{"name":"Used memory","type":"string","jsonPath":".status.used.memory"}"#,
    printcolumn = r#"{"name":"Available memory","type":"string","jsonPath":".status.available.memory"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GPUPoolSpec {
    /// Labels a node must have to be in the pool (every node when empty).
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// Absent: the controller's own policy (`gpufuse controller --policy`, balanced by
    /// default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    #[serde(default)]
    pub oversubscription: Oversubscription,
}

/// Amounts of a pool or a quota.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Amounts {
    /// Memory, as a quantity (`12Gi`).
    pub memory: Quantity,
    /// Compute, in percent of one GPU (a pool of 4 GPUs has 400).
    pub compute: u64,
    /// Claims.
    pub claims: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GPUPoolStatus {
    pub nodes: u32,
    pub devices: u32,
    /// What the pool may promise (its GPUs, times the oversubscription).
    pub capacity: Amounts,
    /// What allocated claims on the pool's nodes hold.
    pub used: Amounts,
    /// `capacity - used`.
    pub available: Amounts,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Limits of a quota; each absent one is no limit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// Percent of one GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claims: Option<u64>,
}

/// A namespace's share of the pool: totals over its claims and maxima per claim. A claim that
/// would pass them is refused (an Event on the claim says why) and its pod does not start.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "gpufuse.dev",
    version = "v1alpha1",
    kind = "GPUQuota",
    plural = "gpuquotas",
    shortname = "gquota",
    namespaced,
    status = "GPUQuotaStatus",
    printcolumn = r#"{"name":"Used memory","type":"string","jsonPath":".status.used.memory"}"#,
    printcolumn = r#"{"name":"Available memory","type":"string","jsonPath":".status.available.memory"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GPUQuotaSpec {
    #[serde(default)]
    pub total: Limits,
    #[serde(default)]
    pub per_claim: Limits,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GPUQuotaStatus {
    pub used: Amounts,
    /// What is left under `total` (absent limits: nothing is written for them).
    pub available: Limits,
    /// Claims of the namespace refused for this quota.
    pub refused: u64,
}

/// Both CRDs as one YAML stream, as checked in.
pub fn crds_yaml() -> String {
    let header =
        "# Generated by `gpufuse operator crds` from crates/k8s/src/crd.rs; do not edit.\n";
    let mut out = String::new();
    for crd in [GPUPool::crd(), GPUQuota::crd()] {
        out.push_str("---\n");
        out.push_str(header);
        out.push_str(&serde_saphyr::to_string(&crd).expect("a CRD serializes to YAML"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checked-in CRDs are what the types generate. `GPUFUSE_BLESS=1` rewrites them.
    #[test]
    fn checked_in_crds_match_the_types() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/helm/gpufuse/crds/gpufuse.dev.yaml");
        let generated = crds_yaml();
        if std::env::var_os("GPUFUSE_BLESS").is_some() {
            std::fs::write(&path, &generated).unwrap();
        }
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            checked_in == generated,
            "{} is not what crates/k8s/src/crd.rs generates: run `GPUFUSE_BLESS=1 cargo test --release -p gpufuse-k8s crd` (or `gpufuse operator crds > {}`)",
            path.display(),
            path.display()
        );
    }

    #[test]
    fn crds_are_cluster_and_namespace_scoped_with_status() {
        let pool = serde_json::to_value(GPUPool::crd()).unwrap();
        assert_eq!(pool["spec"]["scope"], "Cluster");
        assert_eq!(pool["spec"]["names"]["kind"], "GPUPool");
        assert!(pool["spec"]["versions"][0]["subresources"]["status"].is_object());
        let quota = serde_json::to_value(GPUQuota::crd()).unwrap();
        assert_eq!(quota["spec"]["scope"], "Namespaced");
        let spec = &quota["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert!(spec["properties"]["perClaim"].is_object(), "{spec}");
    }
}
