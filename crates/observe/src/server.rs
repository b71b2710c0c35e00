//! The HTTP side: axum on a one-thread tokio runtime of its own, so the processes that mount it
//! keep their thread-based code, plus a sampler thread that feeds [`History`] once a second.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::history::History;
use crate::prices::Prices;
use crate::snapshot::PoolSource;

/// How a process's observer is set up.
#[derive(Clone, Debug)]
pub struct Options {
    pub prices: Prices,
    /// How often the history is sampled (one second; tests may go faster).
    pub sample_every: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            prices: Prices::default(),
            sample_every: Duration::from_secs(1),
        }
    }
}

/// `--http ADDR` and what goes with it: what a process hands [`serve`].
#[derive(Clone, Debug)]
pub struct HttpConfig {
    pub addr: SocketAddr,
    pub options: Options,
}

#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    #[error("cannot serve HTTP on {addr}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the HTTP server's runtime")]
    Runtime(#[source] std::io::Error),
}

struct Shared {
    source: Arc<dyn PoolSource>,
    history: Mutex<History>,
    prices: Prices,
}

fn lock(h: &Mutex<History>) -> std::sync::MutexGuard<'_, History> {
    h.lock().unwrap_or_else(|e| e.into_inner())
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A running observer. It lives as long as the process (its threads are detached).
#[derive(Debug, Clone, Copy)]
pub struct Observer {
    addr: SocketAddr,
}

impl Observer {
    /// The address it listens on (the port chosen, for `:0`).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Serves `/metrics`, `/healthz`, `/readyz`, the JSON API and the dashboard on `addr` for
/// `source`. Binds before it returns, so a taken port is an error here.
pub fn serve(
    addr: SocketAddr,
    source: Arc<dyn PoolSource>,
    options: Options,
) -> Result<Observer, ObserveError> {
    let listener = std::net::TcpListener::bind(addr).map_err(|source| ObserveError::Bind {
        addr: addr.to_string(),
        source,
    })?;
    let local = listener.local_addr().map_err(|source| ObserveError::Bind {
        addr: addr.to_string(),
        source,
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|source| ObserveError::Bind {
            addr: addr.to_string(),
            source,
        })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(ObserveError::Runtime)?;
    let shared = Arc::new(Shared {
        source,
        history: Mutex::new(History::new()),
        prices: options.prices,
    });
    {
        let shared = shared.clone();
        let every = options.sample_every;
        std::thread::Builder::new()
            .name("observe-sampler".into())
            .spawn(move || loop {
                let snap = shared.source.snapshot();
                lock(&shared.history).record(unix_now(), &snap);
                std::thread::sleep(every);
            })
            .map_err(ObserveError::Runtime)?;
    }
    let app = router(shared);
    std::thread::Builder::new()
        .name("observe-http".into())
        .spawn(move || {
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => {
                        if let Err(e) = axum::serve(l, app).await {
                            tracing::warn!("the HTTP server stopped: {e}");
                        }
                    }
                    Err(e) => tracing::warn!("the HTTP server cannot start: {e}"),
                }
            })
        })
        .map_err(ObserveError::Runtime)?;
    tracing::info!("serving metrics and the dashboard on http://{local}/");
    Ok(Observer { addr: local })
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/api/v1/snapshot", get(snapshot))
        .route("/api/v1/history", get(history))
        .route("/api/v1/report", get(report))
        .route("/api/v1/prices", get(prices))
        .route("/", get(|| async { asset("index.html") }))
        .route(
            "/{file}",
            get(|axum::extract::Path(f): axum::extract::Path<String>| async move { asset(&f) }),
        )
        .with_state(shared)
}

async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    let text = crate::metrics::render(&s.source.snapshot());
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
}

async fn readyz(State(s): State<Arc<Shared>>) -> Response {
    if s.source.ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

async fn snapshot(State(s): State<Arc<Shared>>) -> Response {
    Json(s.source.snapshot()).into_response()
}

#[derive(serde::Deserialize)]
struct Since {
    /// Seconds back from now.
    since: Option<u64>,
}

async fn history(State(s): State<Arc<Shared>>, Query(q): Query<Since>) -> Response {
    Json(lock(&s.history).points(q.since.unwrap_or(3600))).into_response()
}

async fn report(State(s): State<Arc<Shared>>, Query(q): Query<Since>) -> Response {
    let r = lock(&s.history).report(unix_now(), q.since.unwrap_or(3600), &s.prices);
    Json(r).into_response()
}

async fn prices(State(s): State<Arc<Shared>>) -> Response {
    Json(s.prices.clone()).into_response()
}

/// The dashboard's files, built into the binary.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../assets/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../assets/app.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../assets/style.css"),
    ),
];

fn asset(name: &str) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, kind, body)) => ([(header::CONTENT_TYPE, *kind)], *body).into_response(),
        None => (StatusCode::NOT_FOUND, format!("no such page: /{name}\n")).into_response(),
    }
}
