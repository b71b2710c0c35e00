//! A gpufuse node that joins the pool as its Kubernetes node (`gpufuse node --kubernetes`):
//! named after it (the DaemonSet's `spec.nodeName`), with the Node object's labels, so the
//! controller knows it by the name a `GPUPool`'s members have, and `gpufuse run --selector`
//! matches the labels a `GPUPool`'s `nodeSelector` matches. Read once, when the node starts.

use std::collections::BTreeMap;

use anyhow::Context;
use k8s_openapi::api::core::v1::Node;
use kube::Api;

/// The labels of Kubernetes node `name`, as a gpufuse node's labels. A label gpufuse cannot
/// carry (an empty key, or a `;`, which Kubernetes does not allow either) is left out.
pub async fn node_labels(
    client: kube::Client,
    name: &str,
) -> anyhow::Result<BTreeMap<String, String>> {
    let nodes: Api<Node> = Api::all(client);
    let node = nodes
        .get(name)
        .await
        .with_context(|| format!("cannot read Kubernetes node {name:?}"))?;
    let mut labels = node.metadata.labels.unwrap_or_default();
    labels.retain(|k, v| {
        let carried = !k.is_empty() && !k.contains(';') && !v.contains(';');
        if !carried {
            tracing::warn!("node {name}'s label {k:?}={v:?} is not a gpufuse label; left out");
        }
        carried
    });
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_api::FakeApiServer;
    use serde_json::json;

    #[tokio::test]
    async fn a_nodes_labels_come_from_its_node_object() {
        let api = FakeApiServer::start().await.unwrap();
        api.insert(
            "v1/nodes",
            "",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-7", "labels": {
                "gpufuse.dev/pool": "inference",
                "kubernetes.io/hostname": "gpu-7",
                "bad;key": "x",
            }}}),
        );
        api.insert(
            "v1/nodes",
            "",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bare"}}),
        );
        let labels = node_labels(api.client(), "gpu-7").await.unwrap();
        assert_eq!(
            labels,
            BTreeMap::from([
                ("gpufuse.dev/pool".to_string(), "inference".to_string()),
                ("kubernetes.io/hostname".to_string(), "gpu-7".to_string()),
            ])
        );
        assert!(node_labels(api.client(), "bare").await.unwrap().is_empty());
        let e = node_labels(api.client(), "nowhere").await.unwrap_err();
        assert!(format!("{e:#}").contains("\"nowhere\""), "{e:#}");
    }
}
