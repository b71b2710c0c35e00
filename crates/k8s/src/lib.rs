//! gpufuse on Kubernetes (`docs/kubernetes.md`).
//!
//! - [`plugin`], [`prepare`], [`cdi`], [`slice`](mod@slice), [`inventory`]: the DRA kubelet plugin.
//!   It publishes the node's GPUs in one `ResourceSlice` per node (driver `gpu.gpufuse.dev`, one
//!   shareable device per GPU with `memory` and `compute` consumable capacity; [`slice`](mod@slice)
//!   also writes the `DeviceClass`), serves the kubelet's `DRAPlugin` v1 and plugin-registration
//!   gRPC services on unix sockets ([`plugin`]), and prepares a claim ([`prepare`], [`cdi`]): its
//!   allocation, read from the API server, becomes a CDI spec that mounts the shims and points the
//!   container at the node with a token bounded to the capacity the claim consumed: the node
//!   enforces it as it does `gpufuse run --vram --compute`.
//! - [`crd`], [`operator`]: the `GPUPool` and `GPUQuota` resources (their YAML checked in
//!   under `deploy/helm/gpufuse/crds`), reconciled into a [`operator::PoolBackend`] (the pool's
//!   scheduler), with status written back and claims over quota refused with an Event.
//!   `gpufuse controller --kubernetes` runs the operator in the controller over
//!   `ControllerPool`, the controller's own ledger, so claims and sessions share one quota and
//!   a `GPUPool`'s `placement` is the policy of a node group of its nodes in the controller's
//!   scheduler.
//! - [`node_labels`]: a gpufuse node joining the pool as its Kubernetes node
//!   (`gpufuse node --kubernetes`): the Node object's labels.
//! - [`webhook`]: the mutating admission webhook that injects the shims into pods, for clusters
//!   without DRA.
//! - [`fake_api`]: an in-process stand-in for the Kubernetes API server that the tests (and
//!   anyone without a cluster) run the above against: list, watch from a resourceVersion,
//!   create, replace, patch, status.
//!
//! Written here by hand: quantities ([`quantity`]; k8s-openapi keeps them as strings), the
//! CDI spec's JSON (a handful of fields; the CDI project's libraries are Go) and the fake API
//! server (kube's own mock is per-request expectations, which cannot run a watch-driven
//! operator). The gRPC code is generated from the kubelet's .proto files (`proto/`) by tonic,
//! with a vendored protoc.
//!
//! Nothing here must run on a node's hot path: the plugin and the operator only hand out
//! tokens and write Kubernetes objects; sessions go to `gpufuse serve` as always.

#![forbid(unsafe_code)]

pub mod cdi;
pub mod crd;
pub mod driver;
pub mod fake_api;
pub mod inventory;
pub mod node_labels;
pub mod operator;
pub mod plugin;
pub mod prepare;
pub mod quantity;
pub mod slice;
pub mod webhook;

/// Generated from the kubelet's .proto files by `build.rs`.
#[allow(clippy::all, missing_docs)]
pub mod grpc {
    /// `k8s.io/kubelet/pkg/apis/dra/v1`.
    pub mod dra {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    /// `k8s.io/kubelet/pkg/apis/pluginregistration/v1`.
    pub mod registration {
        tonic::include_proto!("pluginregistration");
    }
}

/// The DRA driver's name: ResourceSlices, allocations and the kubelet plugin carry it.
pub const DRIVER_NAME: &str = "gpu.gpufuse.dev";

/// The annotation the operator puts on a ResourceClaim over its namespace's `GPUQuota` (its
/// value is the reason); the plugin refuses to prepare such a claim.
pub const QUOTA_REFUSED_ANNOTATION: &str = "gpufuse.dev/quota-refused";

/// An error and its causes on one line (the kubelet shows this text in the pod's events).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}
