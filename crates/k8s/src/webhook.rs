//! The mutating admission webhook, for clusters without DRA (before 1.34, or without
//! consumable capacity): a pod labelled `gpufuse.dev/inject: "true"` gets the shims and a
//! session.
//!
//! The patch adds an `emptyDir` volume, an init container (the gpufuse image) that copies the
//! shims into it, and to every container: the volume at `/gpufuse/lib`, `LD_LIBRARY_PATH`
//! with that directory first (before the container's own value), `GPUFUSE_SERVER` (the
//! controller's or node's address), `GPUFUSE_TOKEN` (a token bounded to the slice) and the
//! slice itself (`GPUFUSE_VRAM`, `GPUFUSE_COMPUTE`) from the pod's annotations
//! `gpufuse.dev/vram` (a quantity: `4Gi`) and `gpufuse.dev/compute` (percent). A pod already
//! injected is left alone (the API server may call the webhook again); a bad annotation
//! refuses the pod with a message naming it.

use std::convert::Infallible;
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use json_patch::{AddOperation, Patch, PatchOperation, ReplaceOperation};
use k8s_openapi::api::core::v1::Pod;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use serde_json::{json, Value};

use crate::quantity;

pub const INJECT_LABEL: &str = "gpufuse.dev/inject";
pub const VRAM_ANNOTATION: &str = "gpufuse.dev/vram";
pub const COMPUTE_ANNOTATION: &str = "gpufuse.dev/compute";
/// The init container's name (and the mark of an injected pod).
pub const INIT_CONTAINER: &str = "gpufuse-shim";
pub const VOLUME: &str = "gpufuse-lib";
/// Where the shims are in containers.
pub const LIB_DIR: &str = "/gpufuse/lib";
/// Where the gpufuse image keeps the shims.
pub const IMAGE_LIB_DIR: &str = "/opt/gpufuse/lib";

#[derive(Clone, Debug)]
pub struct WebhookConfig {
    /// `GPUFUSE_SERVER` for the pods.
    pub server: String,
    /// The gpufuse image (it has the shims in [`IMAGE_LIB_DIR`]).
    pub image: String,
    /// The token secret of the nodes the pods reach.
    pub secret: Vec<u8>,
    /// Seconds a token lives (`None`: as long as the pod).
    pub token_ttl: Option<u64>,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn pointer_part(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

fn add(path: String, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: path.parse().expect("a valid JSON pointer"),
        value,
    })
}

fn replace(path: String, value: Value) -> PatchOperation {
    PatchOperation::Replace(ReplaceOperation {
        path: path.parse().expect("a valid JSON pointer"),
        value,
    })
}

/// The webhook's answer to one request.
#[derive(Debug)]
pub struct Verdict {
    pub allowed: bool,
    /// Why not, when not allowed.
    pub message: String,
    pub patch: Option<Patch>,
}

impl Verdict {
    fn allow() -> Verdict {
        Verdict {
            allowed: true,
            message: String::new(),
            patch: None,
        }
    }

    fn deny(message: impl Into<String>) -> Verdict {
        Verdict {
            allowed: false,
            message: message.into(),
            patch: None,
        }
    }
}

/// The slice a pod's annotations ask for.
fn slice(pod: &Pod) -> Result<(Option<u64>, Option<u32>), String> {
    let ann = pod.metadata.annotations.clone().unwrap_or_default();
    let vram = ann
        .get(VRAM_ANNOTATION)
        .map(|v| {
            quantity::parse(v).ok().filter(|&b| b > 0).ok_or_else(|| {
                format!(
                    "annotation {VRAM_ANNOTATION}: {v:?} is not a memory size (like 4Gi or 512Mi)"
                )
            })
        })
        .transpose()?;
    let compute = ann
        .get(COMPUTE_ANNOTATION)
        .map(|v| {
            v.trim()
                .trim_end_matches('%')
                .parse::<u32>()
                .ok()
                .filter(|c| (1..=100).contains(c))
                .ok_or_else(|| {
                    format!(
                        "annotation {COMPUTE_ANNOTATION}: {v:?} is not a percentage from 1 to 100"
                    )
                })
        })
        .transpose()?;
    Ok((vram, compute))
}

/// The answer to one admission request.
pub fn mutate(config: &WebhookConfig, req: &AdmissionRequest<Pod>) -> Verdict {
    let Some(pod) = &req.object else {
        return Verdict::allow();
    };
    let labelled = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(INJECT_LABEL))
        .is_some_and(|v| v == "true");
    if !labelled {
        return Verdict::allow();
    }
    let Some(spec) = &pod.spec else {
        return Verdict::deny("the pod has no spec");
    };
    if spec
        .init_containers
        .iter()
        .flatten()
        .any(|c| c.name == INIT_CONTAINER)
    {
        return Verdict::allow();
    }
    let (vram, compute) = match slice(pod) {
        Ok(s) => s,
        Err(e) => return Verdict::deny(e),
    };
    let name = pod
        .metadata
        .name
        .clone()
        .or_else(|| pod.metadata.generate_name.clone())
        .unwrap_or_default();
    let namespace = req.namespace.clone().unwrap_or_default();
    let token = match gpufuse_auth::issue(
        &config.secret,
        &gpufuse_auth::Claims {
            subject: format!("{namespace}/{name}"),
            expires: config.token_ttl.map(|t| unix_now() + t),
            max_vram_bytes: vram,
            max_compute_percent: compute,
            ..Default::default()
        },
    ) {
        Ok(t) => t,
        Err(e) => return Verdict::deny(format!("cannot issue a session token: {e}")),
    };

    let mut ops = Vec::new();
    let mount = json!({ "name": VOLUME, "mountPath": LIB_DIR, "readOnly": true });
    let volume = json!({ "name": VOLUME, "emptyDir": {} });
    if spec.volumes.as_ref().is_none_or(|v| v.is_empty()) {
        ops.push(add("/spec/volumes".into(), json!([volume])));
    } else {
        ops.push(add("/spec/volumes/-".into(), volume));
    }
    let init = json!({
        "name": INIT_CONTAINER,
        "image": config.image,
        "command": ["cp", "-a", format!("{IMAGE_LIB_DIR}/."), format!("{LIB_DIR}/")],
        "volumeMounts": [{ "name": VOLUME, "mountPath": LIB_DIR }],
    });
    if spec.init_containers.as_ref().is_none_or(|v| v.is_empty()) {
        ops.push(add("/spec/initContainers".into(), json!([init])));
    } else {
        // First, so the shims are there before any other init container uses CUDA.
        ops.push(add("/spec/initContainers/0".into(), init));
    }
    let mut env = vec![
        ("GPUFUSE_SERVER", config.server.clone()),
        ("GPUFUSE_TOKEN", token),
    ];
    if let Some(v) = vram {
        env.push(("GPUFUSE_VRAM", v.to_string()));
    }
    if let Some(c) = compute {
        env.push(("GPUFUSE_COMPUTE", c.to_string()));
    }
    for (i, c) in spec.containers.iter().enumerate() {
        let base = format!("/spec/containers/{i}");
        let existing = c.env.clone().unwrap_or_default();
        let mut new_env: Vec<Value> = Vec::new();
        let ld = match existing.iter().position(|e| e.name == "LD_LIBRARY_PATH") {
            Some(at) => {
                let old = existing[at].value.clone().unwrap_or_default();
                let value = if old.is_empty() {
                    LIB_DIR.to_string()
                } else {
                    format!("{LIB_DIR}:{old}")
                };
                ops.push(replace(
                    format!("{base}/env/{at}"),
                    json!({ "name": "LD_LIBRARY_PATH", "value": value }),
                ));
                None
            }
            None => Some(json!({ "name": "LD_LIBRARY_PATH", "value": LIB_DIR })),
        };
        new_env.extend(ld);
        for (k, v) in &env {
            match existing.iter().position(|e| e.name == *k) {
                Some(at) => ops.push(replace(
                    format!("{base}/env/{at}"),
                    json!({ "name": k, "value": v }),
                )),
                None => new_env.push(json!({ "name": k, "value": v })),
            }
        }
        if c.env.is_none() {
            ops.push(add(format!("{base}/env"), Value::Array(new_env)));
        } else {
            for e in new_env {
                ops.push(add(format!("{base}/env/-"), e));
            }
        }
        if c.volume_mounts.is_none() {
            ops.push(add(format!("{base}/volumeMounts"), json!([mount])));
        } else {
            ops.push(add(format!("{base}/volumeMounts/-"), mount.clone()));
        }
    }
    ops.push(add(
        format!(
            "/metadata/annotations/{}",
            pointer_part("gpufuse.dev/injected")
        ),
        json!("true"),
    ));
    if pod.metadata.annotations.is_none() {
        // The annotations map itself must exist before a key is added to it.
        ops.insert(
            ops.len() - 1,
            add("/metadata/annotations".into(), json!({})),
        );
    }
    Verdict {
        allowed: true,
        message: String::new(),
        patch: Some(Patch(ops)),
    }
}

/// The AdmissionReview answering a request. Written here rather than with kube's
/// `AdmissionResponse`, which serializes the patch as an array of numbers where the API server
/// wants base64 (kube-rs issue 1781).
fn response_review(api_version: &str, uid: &str, v: &Verdict) -> Value {
    let mut response = json!({ "uid": uid, "allowed": v.allowed });
    if !v.allowed {
        response["status"] = json!({ "code": 403, "message": v.message, "reason": "Forbidden" });
    }
    if let Some(p) = &v.patch {
        let bytes = serde_json::to_vec(p).expect("a JSON patch serializes");
        response["patchType"] = json!("JSONPatch");
        response["patch"] = json!(B64.encode(bytes));
    }
    json!({ "apiVersion": api_version, "kind": "AdmissionReview", "response": response })
}

/// Answers an `AdmissionReview` body (admission.k8s.io/v1) with the review carrying the
/// response. A body that is not a review gets a refusal that says so.
pub fn review(config: &WebhookConfig, body: &[u8]) -> Value {
    const V1: &str = "admission.k8s.io/v1";
    let review: AdmissionReview<Pod> = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            return response_review(
                V1,
                "",
                &Verdict::deny(format!("not an AdmissionReview of a Pod: {e}")),
            )
        }
    };
    let api_version = review.types.api_version.clone();
    let req: AdmissionRequest<Pod> = match review.try_into() {
        Ok(r) => r,
        Err(e) => {
            return response_review(
                &api_version,
                "",
                &Verdict::deny(format!("the AdmissionReview has no request: {e}")),
            )
        }
    };
    response_review(&api_version, &req.uid, &mutate(config, &req))
}

/// The most an AdmissionReview body may be (the API server's own request limit is 3 MiB).
const MAX_BODY: usize = 4 << 20;

async fn handle(
    config: Arc<WebhookConfig>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |code: StatusCode, body: Vec<u8>| {
        Ok(Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("a valid response"))
    };
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => reply(StatusCode::OK, b"{}".to_vec()),
        (&Method::POST, "/mutate") => {
            let limited = http_body_util::Limited::new(req.into_body(), MAX_BODY);
            let body = match limited.collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    return reply(
                        StatusCode::BAD_REQUEST,
                        format!("{{\"error\":{:?}}}", e.to_string()).into_bytes(),
                    )
                }
            };
            let answer = review(&config, &body);
            reply(
                StatusCode::OK,
                serde_json::to_vec(&answer).expect("an AdmissionReview serializes"),
            )
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            b"{\"error\":\"POST /mutate or GET /healthz\"}".to_vec(),
        ),
    }
}

/// Serves the webhook on `listener` until the task is dropped: HTTPS with `tls`, plain HTTP
/// without (for tests and for a TLS-terminating proxy in front).
pub async fn serve(
    config: WebhookConfig,
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> std::io::Result<()> {
    let config = Arc::new(config);
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    loop {
        let (stream, peer) = listener.accept().await?;
        let config = config.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |r| handle(config.clone(), r));
            let http = hyper::server::conn::http1::Builder::new();
            let result = match acceptor {
                Some(a) => {
                    match tokio::time::timeout(std::time::Duration::from_secs(10), a.accept(stream))
                        .await
                    {
                        Ok(Ok(tls)) => http
                            .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                            .await
                            .map_err(|e| e.to_string()),
                        Ok(Err(e)) => Err(format!("TLS handshake: {e}")),
                        Err(_) => Err("TLS handshake timed out".into()),
                    }
                }
                None => http
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await
                    .map_err(|e| e.to_string()),
            };
            if let Err(e) = result {
                tracing::debug!("webhook connection from {peer}: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn config() -> WebhookConfig {
        WebhookConfig {
            server: "tcp:gpufuse-controller.gpufuse:7070".into(),
            image: "gpufuse:test".into(),
            secret: SECRET.to_vec(),
            token_ttl: None,
        }
    }

    /// An AdmissionReview as the API server sends it (admission.k8s.io/v1).
    fn review_json(pod: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "team-a",
                "operation": "CREATE",
                "userInfo": {"username": "admin", "groups": ["system:authenticated"]},
                "object": pod,
                "oldObject": null,
                "dryRun": false,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
            }
        }))
        .unwrap()
    }

    fn pod(labels: Value, annotations: Value, env: Value) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "trainer", "namespace": "team-a", "labels": labels, "annotations": annotations},
            "spec": {"containers": [
                {"name": "main", "image": "python:3.12", "env": env},
                {"name": "side", "image": "busybox"}
            ]}
        })
    }

    fn patched(body: &[u8]) -> (Value, Value) {
        let out = review(&config(), body);
        let resp = out["response"].clone();
        let original: Value =
            serde_json::from_slice::<Value>(body).unwrap()["request"]["object"].clone();
        let mut pod = original;
        if let Some(p) = resp["patch"].as_str() {
            let bytes = B64.decode(p).unwrap();
            let patch: Patch = serde_json::from_slice(&bytes).unwrap();
            json_patch::patch(&mut pod, &patch).unwrap();
        }
        (resp, pod)
    }

    fn env_of(pod: &Value, container: usize, name: &str) -> Option<String> {
        pod["spec"]["containers"][container]["env"]
            .as_array()?
            .iter()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str().map(String::from))
    }

    #[test]
    fn a_labelled_pod_gets_the_shims_a_token_and_its_slice() {
        let body = review_json(pod(
            json!({"gpufuse.dev/inject": "true"}),
            json!({"gpufuse.dev/vram": "4Gi", "gpufuse.dev/compute": "30"}),
            json!([{"name": "LD_LIBRARY_PATH", "value": "/opt/lib"}]),
        ));
        let (resp, pod) = patched(&body);
        assert_eq!(resp["allowed"], true, "{resp}");
        assert_eq!(resp["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(resp["patchType"], "JSONPatch");
        assert_eq!(pod["spec"]["initContainers"][0]["name"], INIT_CONTAINER);
        assert_eq!(pod["spec"]["initContainers"][0]["image"], "gpufuse:test");
        assert_eq!(pod["spec"]["volumes"][0]["name"], VOLUME);
        assert_eq!(
            env_of(&pod, 0, "LD_LIBRARY_PATH").as_deref(),
            Some("/gpufuse/lib:/opt/lib")
        );
        assert_eq!(
            env_of(&pod, 1, "LD_LIBRARY_PATH").as_deref(),
            Some("/gpufuse/lib")
        );
        assert_eq!(
            env_of(&pod, 1, "GPUFUSE_SERVER").as_deref(),
            Some("tcp:gpufuse-controller.gpufuse:7070")
        );
        assert_eq!(
            env_of(&pod, 0, "GPUFUSE_VRAM").as_deref(),
            Some("4294967296")
        );
        assert_eq!(env_of(&pod, 0, "GPUFUSE_COMPUTE").as_deref(), Some("30"));
        assert_eq!(
            pod["spec"]["containers"][1]["volumeMounts"][0]["mountPath"],
            LIB_DIR
        );
        let token = env_of(&pod, 0, "GPUFUSE_TOKEN").unwrap();
        let claims = gpufuse_auth::verify(SECRET, &token, 0).unwrap();
        assert_eq!(claims.subject, "team-a/trainer");
        assert_eq!(claims.max_vram_bytes, Some(4 << 30));
        assert_eq!(claims.max_compute_percent, Some(30));
        assert_eq!(
            pod["metadata"]["annotations"]["gpufuse.dev/injected"],
            "true"
        );
    }

    #[test]
    fn unlabelled_and_already_injected_pods_are_left_alone() {
        let (resp, _) = patched(&review_json(pod(json!({}), json!({}), json!([]))));
        assert_eq!(resp["allowed"], true);
        assert!(resp.get("patch").is_none());
        let mut p = pod(json!({"gpufuse.dev/inject": "true"}), json!({}), json!([]));
        p["spec"]["initContainers"] = json!([{"name": INIT_CONTAINER, "image": "x"}]);
        let (resp, _) = patched(&review_json(p));
        assert_eq!(resp["allowed"], true);
        assert!(resp.get("patch").is_none());
    }

    #[test]
    fn bad_annotations_refuse_the_pod_naming_them() {
        for (k, v) in [("gpufuse.dev/vram", "lots"), ("gpufuse.dev/compute", "250")] {
            let (resp, _) = patched(&review_json(pod(
                json!({"gpufuse.dev/inject": "true"}),
                json!({ k: v }),
                json!([]),
            )));
            assert_eq!(resp["allowed"], false);
            assert!(
                resp["status"]["message"].as_str().unwrap().contains(k),
                "{resp}"
            );
        }
    }

    #[test]
    fn a_pod_without_annotations_or_env_is_patched_validly() {
        let mut p = pod(
            json!({"gpufuse.dev/inject": "true"}),
            json!(null),
            json!(null),
        );
        p["metadata"].as_object_mut().unwrap().remove("annotations");
        p["spec"]["containers"][0]
            .as_object_mut()
            .unwrap()
            .remove("env");
        let (resp, pod) = patched(&review_json(p));
        assert_eq!(resp["allowed"], true, "{resp}");
        assert_eq!(
            env_of(&pod, 0, "LD_LIBRARY_PATH").as_deref(),
            Some("/gpufuse/lib")
        );
        assert!(env_of(&pod, 0, "GPUFUSE_VRAM").is_none());
    }

    #[test]
    fn garbage_is_an_invalid_review_not_a_panic() {
        let out = review(&config(), b"{not json");
        assert_eq!(out["response"]["allowed"], false);
    }
}
