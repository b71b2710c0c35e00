//! An in-process stand-in for the Kubernetes API server, for tests and for trying the plugin
//! and the operator without a cluster.
//!
//! It serves the REST paths kube-rs uses (`/api/v1/...`, `/apis/GROUP/VERSION/...`, cluster
//! and namespaced) over plain HTTP on a loopback port, for any resource, from one store of
//! JSON objects: list (with `labelSelector` equality terms and `fieldSelector` on
//! `metadata.name`/`metadata.namespace`), get, create (uid, `resourceVersion`, `generation`,
//! `generateName`), replace (optimistic concurrency on `resourceVersion`), patch (merge and
//! strategic merge as JSON merge patches, JSON patch, server-side apply as a merge that
//! creates), delete, the `status` subresource (writes only `.status`; writes to the object
//! keep its status), and watch from a `resourceVersion` (every event after it, then new ones,
//! as newline-delimited JSON, ended by `timeoutSeconds`).
//!
//! What it does not do: validation, defaulting, admission, field managers, strategic merge's
//! list semantics, pagination (lists come whole), authentication. Tests that pass here have
//! not run against a real API server.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes_body::Body;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::broadcast;

mod bytes_body {
    //! The response body: whole, or a stream of watch lines.
    pub type Body =
        http_body_util::combinators::BoxBody<hyper::body::Bytes, std::convert::Infallible>;
}

/// Where an object lives: its collection (`GROUP/VERSION/RESOURCE`), namespace ("" for
/// cluster-scoped objects) and name.
type Key = (String, String, String);

#[derive(Clone, Debug)]
struct WatchEvent {
    rv: u64,
    collection: String,
    namespace: String,
    kind: &'static str,
    object: Value,
}

#[derive(Default)]
struct Store {
    objects: BTreeMap<Key, Value>,
    rv: u64,
    uid: u64,
    events: Vec<WatchEvent>,
    requests: Vec<String>,
}

/// A running fake API server. Dropping it stops it.
pub struct FakeApiServer {
    addr: SocketAddr,
    store: Arc<Mutex<Store>>,
    changed: broadcast::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A parsed request path.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    collection: String,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

fn parse_path(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (gv, rest) = match parts.as_slice() {
        ["api", v, rest @ ..] => (v.to_string(), rest),
        ["apis", g, v, rest @ ..] => (format!("{g}/{v}"), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, r, more @ ..] => (Some(ns.to_string()), {
            let mut v = vec![*r];
            v.extend_from_slice(more);
            v
        }),
        r => (None, r.to_vec()),
    };
    let (resource, name, status) = match rest.as_slice() {
        [r] => (r.to_string(), None, false),
        [r, n] => (r.to_string(), Some(n.to_string()), false),
        [r, n, "status"] => (r.to_string(), Some(n.to_string()), true),
        _ => return None,
    };
    Some(Target {
        collection: format!("{gv}/{resource}"),
        namespace,
        name,
        status,
    })
}

fn query(uri: &hyper::Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k.to_string(), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A refusal: becomes a `Status` response.
struct Failure(Box<Response<Body>>);

fn fail(code: StatusCode, reason: &str, message: String) -> Failure {
    Failure(Box::new(status(code, reason, message)))
}

fn status(code: StatusCode, reason: &str, message: String) -> Response<Body> {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code.as_u16(),
    });
    respond(code, &body)
}

fn respond(code: StatusCode, body: &Value) -> Response<Body> {
    let bytes = serde_json::to_vec(body).expect("JSON values serialize");
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(full(bytes))
        .expect("a valid response")
}

fn full(bytes: Vec<u8>) -> Body {
    http_body_util::Full::new(hyper::body::Bytes::from(bytes)).boxed()
}

/// RFC 7386 JSON merge patch.
pub fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

fn label_selector_matches(object: &Value, selector: &str) -> bool {
    let labels = &object["metadata"]["labels"];
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        if let Some((k, v)) = term.split_once("!=") {
            labels[k].as_str() != Some(v)
        } else if let Some((k, v)) = term.split_once('=') {
            let v = v.strip_prefix('=').unwrap_or(v);
            labels[k].as_str() == Some(v)
        } else if let Some(k) = term.strip_prefix('!') {
            labels.get(k).is_none()
        } else {
            labels.get(term).is_some()
        }
    })
}

fn field_selector_matches(object: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let Some((k, v)) = term.split_once('=') else {
            return false;
        };
        let v = v.strip_prefix('=').unwrap_or(v);
        match k {
            "metadata.name" => object["metadata"]["name"].as_str() == Some(v),
            "metadata.namespace" => object["metadata"]["namespace"].as_str() == Some(v),
            _ => false,
        }
    })
}

impl Store {
    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn record(&mut self, kind: &'static str, key: &Key, object: &Value) {
        let rv = self.rv;
        self.events.push(WatchEvent {
            rv,
            collection: key.0.clone(),
            namespace: key.1.clone(),
            kind,
            object: object.clone(),
        });
    }

    fn create(&mut self, key: Key, mut object: Value) -> Result<Value, Failure> {
        if self.objects.contains_key(&key) {
            return Err(fail(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{} {:?} already exists", key.0, key.2),
            ));
        }
        let rv = self.next_rv();
        self.uid += 1;
        let meta = object
            .as_object_mut()
            .map(|o| o.entry("metadata").or_insert(json!({})));
        let Some(Value::Object(meta)) = meta else {
            return Err(fail(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "the object has no metadata".into(),
            ));
        };
        meta.insert("name".into(), json!(key.2));
        if !key.1.is_empty() {
            meta.insert("namespace".into(), json!(key.1));
        }
        meta.insert(
            "uid".into(),
            json!(format!("00000000-0000-4000-8000-{:012x}", self.uid)),
        );
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        meta.insert("generation".into(), json!(1));
        meta.insert("creationTimestamp".into(), json!("2026-01-01T00:00:00Z"));
        self.objects.insert(key.clone(), object.clone());
        self.record("ADDED", &key, &object);
        Ok(object)
    }

    /// Stores `new` in place of the object at `key`: `status_only` takes only its status, else
    /// everything but the status.
    fn update(&mut self, key: &Key, mut new: Value, status_only: bool) -> Result<Value, Failure> {
        let Some(old) = self.objects.get(key).cloned() else {
            return Err(Failure(Box::new(not_found(key))));
        };
        if let Some(rv) = new["metadata"]["resourceVersion"].as_str() {
            if Some(rv) != old["metadata"]["resourceVersion"].as_str() {
                return Err(fail(
                    StatusCode::CONFLICT,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on {} {:?}: the object has been modified; please apply your changes to the latest version and try again",
                        key.0, key.2
                    ),
                ));
            }
        }
        let mut merged = old.clone();
        if status_only {
            merged["status"] = new.get("status").cloned().unwrap_or(Value::Null);
        } else {
            let keep_status = old.get("status").cloned();
            let keep_meta = old["metadata"].clone();
            if let Some(o) = new.as_object_mut() {
                o.remove("status");
            }
            merged = new;
            let meta = &mut merged["metadata"];
            for k in [
                "uid",
                "creationTimestamp",
                "name",
                "namespace",
                "generation",
            ] {
                meta[k] = keep_meta[k].clone();
            }
            if let Some(s) = keep_status {
                merged["status"] = s;
            }
            if merged.get("spec") != old.get("spec") {
                let g = old["metadata"]["generation"].as_i64().unwrap_or(1) + 1;
                merged["metadata"]["generation"] = json!(g);
            }
            if merged["metadata"]["namespace"].is_null() {
                if let Some(m) = merged["metadata"].as_object_mut() {
                    m.remove("namespace");
                }
            }
        }
        let rv = self.next_rv();
        merged["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.objects.insert(key.clone(), merged.clone());
        self.record("MODIFIED", key, &merged);
        Ok(merged)
    }
}

fn not_found(key: &Key) -> Response<Body> {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{} {:?} not found", key.0, key.2),
    )
}

impl FakeApiServer {
    /// Starts a server on a free loopback port.
    pub async fn start() -> std::io::Result<FakeApiServer> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let store = Arc::new(Mutex::new(Store::default()));
        let (changed, _) = broadcast::channel(1024);
        let task = {
            let store = store.clone();
            let changed = changed.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let store = store.clone();
                    let changed = changed.clone();
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |req| {
                            let store = store.clone();
                            let changed = changed.clone();
                            async move { Ok::<_, Infallible>(handle(req, store, changed).await) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                            .await;
                    });
                }
            })
        };
        Ok(FakeApiServer {
            addr,
            store,
            changed,
            task,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube client of this server (default namespace `default`).
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url().parse().expect("a valid URL"));
        kube::Client::try_from(config).expect("a client for a plain HTTP URL")
    }

    /// The object at `collection` (`GROUP/VERSION/RESOURCE`, or `v1/pods`), `namespace` (""
    /// for cluster-scoped) and `name`.
    pub fn get(&self, collection: &str, namespace: &str, name: &str) -> Option<Value> {
        let s = self.store.lock().unwrap_or_else(|e| e.into_inner());
        s.objects
            .get(&(collection.into(), namespace.into(), name.into()))
            .cloned()
    }

    /// Every object of a collection, in every namespace.
    pub fn list(&self, collection: &str) -> Vec<Value> {
        let s = self.store.lock().unwrap_or_else(|e| e.into_inner());
        s.objects
            .iter()
            .filter(|((c, _, _), _)| c == collection)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Creates an object directly (as another client would).
    pub fn insert(&self, collection: &str, namespace: &str, object: Value) -> Value {
        let name = object["metadata"]["name"]
            .as_str()
            .expect("objects inserted by tests are named")
            .to_string();
        let mut s = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let created = s
            .create((collection.into(), namespace.into(), name), object)
            .unwrap_or_else(|_| panic!("cannot insert into {collection}"));
        drop(s);
        let _ = self.changed.send(());
        created
    }

    /// Writes an object's status directly (as the scheduler would).
    pub fn set_status(
        &self,
        collection: &str,
        namespace: &str,
        name: &str,
        status: Value,
    ) -> Value {
        let key = (collection.into(), namespace.into(), name.into());
        let mut s = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let updated = s
            .update(&key, json!({ "status": status }), true)
            .unwrap_or_else(|_| panic!("no {collection} {name}"));
        drop(s);
        let _ = self.changed.send(());
        updated
    }

    /// The requests served so far, as `METHOD PATH?QUERY`.
    pub fn requests(&self) -> Vec<String> {
        self.store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .requests
            .clone()
    }
}

async fn handle(
    req: Request<Incoming>,
    store: Arc<Mutex<Store>>,
    changed: broadcast::Sender<()>,
) -> Response<Body> {
    let method = req.method().clone();
    let uri = req.uri().clone();
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    store
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .requests
        .push(format!("{method} {uri}"));
    let Some(target) = parse_path(uri.path()) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("the fake API server does not serve {}", uri.path()),
        );
    };
    let q = query(&uri);
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    let parsed: Option<Value> = if body.is_empty() {
        None
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => Some(v),
            Err(e) => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("the body is not JSON: {e}"),
                )
            }
        }
    };
    let ns = target.namespace.clone().unwrap_or_default();
    let response = {
        let mut s = store.lock().unwrap_or_else(|e| e.into_inner());
        match (&method, &target.name) {
            (&Method::GET, None)
                if matches!(q.get("watch").map(String::as_str), Some("true" | "1")) =>
            {
                drop(s);
                return watch(target, q, store.clone(), changed.subscribe());
            }
            (&Method::GET, None) => {
                let items: Vec<Value> = s
                    .objects
                    .iter()
                    .filter(|((c, n, _), _)| {
                        *c == target.collection && (target.namespace.is_none() || *n == ns)
                    })
                    .map(|(_, v)| v)
                    .filter(|v| {
                        q.get("labelSelector")
                            .is_none_or(|sel| label_selector_matches(v, sel))
                    })
                    .filter(|v| {
                        q.get("fieldSelector")
                            .is_none_or(|sel| field_selector_matches(v, sel))
                    })
                    .cloned()
                    .collect();
                respond(
                    StatusCode::OK,
                    &json!({
                        "apiVersion": target.collection.rsplit_once('/').map(|x| x.0).unwrap_or(""),
                        "kind": "List",
                        "metadata": { "resourceVersion": s.rv.to_string() },
                        "items": items,
                    }),
                )
            }
            (&Method::GET, Some(name)) => {
                match s
                    .objects
                    .get(&(target.collection.clone(), ns.clone(), name.clone()))
                {
                    Some(v) => respond(StatusCode::OK, v),
                    None => not_found(&(target.collection.clone(), ns, name.clone())),
                }
            }
            (&Method::POST, None) => {
                let Some(mut object) = parsed else {
                    return status(StatusCode::BAD_REQUEST, "BadRequest", "no body".into());
                };
                let name = match object["metadata"]["name"].as_str() {
                    Some(n) => n.to_string(),
                    None => match object["metadata"]["generateName"].as_str() {
                        Some(prefix) => {
                            let n = format!("{prefix}{:05x}", s.rv + 1);
                            object["metadata"]["name"] = json!(n);
                            n
                        }
                        None => {
                            return status(
                                StatusCode::UNPROCESSABLE_ENTITY,
                                "Invalid",
                                "metadata.name or metadata.generateName is required".into(),
                            )
                        }
                    },
                };
                match s.create((target.collection.clone(), ns, name), object) {
                    Ok(v) => respond(StatusCode::CREATED, &v),
                    Err(Failure(r)) => *r,
                }
            }
            (&Method::PUT, Some(name)) => {
                let Some(object) = parsed else {
                    return status(StatusCode::BAD_REQUEST, "BadRequest", "no body".into());
                };
                let key = (target.collection.clone(), ns, name.clone());
                match s.update(&key, object, target.status) {
                    Ok(v) => respond(StatusCode::OK, &v),
                    Err(Failure(r)) => *r,
                }
            }
            (&Method::PATCH, Some(name)) => {
                let Some(patch) = parsed else {
                    return status(StatusCode::BAD_REQUEST, "BadRequest", "no body".into());
                };
                let key = (target.collection.clone(), ns.clone(), name.clone());
                let apply = content_type.starts_with("application/apply-patch");
                match s.objects.get(&key).cloned() {
                    None if apply && !target.status => match s.create(key, patch) {
                        Ok(v) => respond(StatusCode::CREATED, &v),
                        Err(Failure(r)) => *r,
                    },
                    None => not_found(&key),
                    Some(mut current) => {
                        if content_type.starts_with("application/json-patch") {
                            let p: json_patch::Patch = match serde_json::from_value(patch) {
                                Ok(p) => p,
                                Err(e) => {
                                    return status(
                                        StatusCode::BAD_REQUEST,
                                        "BadRequest",
                                        e.to_string(),
                                    )
                                }
                            };
                            if let Err(e) = json_patch::patch(&mut current, &p) {
                                return status(
                                    StatusCode::UNPROCESSABLE_ENTITY,
                                    "Invalid",
                                    e.to_string(),
                                );
                            }
                        } else {
                            merge(&mut current, &patch);
                        }
                        // A patch applies to the stored version, whatever it says.
                        current["metadata"]["resourceVersion"] = Value::Null;
                        if let Some(m) = current["metadata"].as_object_mut() {
                            m.remove("resourceVersion");
                        }
                        match s.update(&key, current, target.status) {
                            Ok(v) => respond(StatusCode::OK, &v),
                            Err(Failure(r)) => *r,
                        }
                    }
                }
            }
            (&Method::DELETE, Some(name)) => {
                let key = (target.collection.clone(), ns, name.clone());
                match s.objects.remove(&key) {
                    Some(v) => {
                        s.next_rv();
                        s.record("DELETED", &key, &v);
                        respond(StatusCode::OK, &v)
                    }
                    None => not_found(&key),
                }
            }
            _ => status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                format!(
                    "{method} {} is not served by the fake API server",
                    uri.path()
                ),
            ),
        }
    };
    if matches!(
        method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    ) {
        let _ = changed.send(());
    }
    response
}

/// A watch: every event of the collection after `resourceVersion` (all objects as `ADDED`
/// when it is absent or `0`), then new ones as they happen, until `timeoutSeconds`.
fn watch(
    target: Target,
    q: BTreeMap<String, String>,
    store: Arc<Mutex<Store>>,
    mut changed: broadcast::Receiver<()>,
) -> Response<Body> {
    let (tx, rx) = tokio::sync::mpsc::channel::<
        Result<hyper::body::Frame<hyper::body::Bytes>, Infallible>,
    >(64);
    let timeout = Duration::from_secs(
        q.get("timeoutSeconds")
            .and_then(|t| t.parse().ok())
            .unwrap_or(300),
    );
    let from: Option<u64> = q
        .get("resourceVersion")
        .and_then(|r| r.parse().ok())
        .filter(|&r| r != 0);
    let label = q.get("labelSelector").cloned();
    let field = q.get("fieldSelector").cloned();
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + timeout;
        let matches = |collection: &str, namespace: &str, object: &Value| {
            collection == target.collection
                && target.namespace.as_deref().is_none_or(|n| n == namespace)
                && label
                    .as_deref()
                    .is_none_or(|s| label_selector_matches(object, s))
                && field
                    .as_deref()
                    .is_none_or(|s| field_selector_matches(object, s))
        };
        let mut last = match from {
            Some(rv) => rv,
            None => {
                let (lines, rv) = {
                    let s = store.lock().unwrap_or_else(|e| e.into_inner());
                    let lines: Vec<Value> = s
                        .objects
                        .iter()
                        .filter(|((c, n, _), v)| matches(c, n, v))
                        .map(|(_, v)| json!({"type": "ADDED", "object": v}))
                        .collect();
                    (lines, s.rv)
                };
                for l in lines {
                    if send_line(&tx, &l).await.is_err() {
                        return;
                    }
                }
                rv
            }
        };
        loop {
            let pending: Vec<WatchEvent> = {
                let s = store.lock().unwrap_or_else(|e| e.into_inner());
                s.events.iter().filter(|e| e.rv > last).cloned().collect()
            };
            for e in pending {
                last = last.max(e.rv);
                if matches(&e.collection, &e.namespace, &e.object) {
                    let line = json!({"type": e.kind, "object": e.object});
                    if send_line(&tx, &line).await.is_err() {
                        return;
                    }
                }
            }
            tokio::select! {
                r = changed.recv() => {
                    if let Err(broadcast::error::RecvError::Closed) = r {
                        return;
                    }
                }
                () = tokio::time::sleep_until(deadline) => return,
                () = tx.closed() => return,
            }
        }
    });
    let body = http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(body.boxed())
        .expect("a valid response")
}

async fn send_line(
    tx: &tokio::sync::mpsc::Sender<Result<hyper::body::Frame<hyper::body::Bytes>, Infallible>>,
    line: &Value,
) -> Result<(), ()> {
    let mut bytes = serde_json::to_vec(line).expect("JSON values serialize");
    bytes.push(b'\n');
    tx.send(Ok(hyper::body::Frame::data(bytes.into())))
        .await
        .map_err(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_collections_namespaces_and_subresources() {
        assert_eq!(
            parse_path("/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status"),
            Some(Target {
                collection: "resource.k8s.io/v1/resourceclaims".into(),
                namespace: Some("ns".into()),
                name: Some("c".into()),
                status: true
            })
        );
        assert_eq!(
            parse_path("/api/v1/nodes"),
            Some(Target {
                collection: "v1/nodes".into(),
                namespace: None,
                name: None,
                status: false
            })
        );
        assert_eq!(parse_path("/healthz"), None);
    }

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut v = json!({"a": {"b": 1, "c": 2}, "d": [1]});
        merge(&mut v, &json!({"a": {"b": null, "e": 3}, "d": [2]}));
        assert_eq!(v, json!({"a": {"c": 2, "e": 3}, "d": [2]}));
    }

    #[test]
    fn selectors_match_labels_and_names() {
        let o = json!({"metadata": {"name": "n", "labels": {"a": "1"}}});
        assert!(label_selector_matches(&o, "a=1"));
        assert!(label_selector_matches(&o, "a==1,a"));
        assert!(!label_selector_matches(&o, "a!=1"));
        assert!(!label_selector_matches(&o, "b"));
        assert!(field_selector_matches(&o, "metadata.name=n"));
        assert!(!field_selector_matches(&o, "spec.x=n"));
    }
}
