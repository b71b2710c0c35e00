//! Seeing the pool: what a gpufuse process (`gpufuse serve`, a node, the controller) shows to
//! operators over HTTP (`--http ADDR`).
//!
//! - `/metrics`: Prometheus series ([`metrics::METRIC_NAMES`], the contract), `/healthz`,
//!   `/readyz`;
//! - `/api/v1/snapshot`, `/history`, `/report`, `/prices`: JSON for the dashboard, `gpufuse
//!   report` and scripts;
//! - `/`: the web dashboard, its files built into the binary (`assets/`).
//!
//! A process mounts it with one call, [`serve`], handing it a [`PoolSource`] that returns a
//! [`PoolSnapshot`] of its state; every figure is computed from snapshots, so nothing here
//! touches the launch path. The server runs on a one-thread tokio runtime of its own (the
//! gpufuse daemons are thread-based) and keeps an hour of usage, and a day of per-tenant
//! usage for cost reports, in memory ([`history`]): no database to run.
//!
//! The server is axum; `/metrics` is prometheus-client's collector over a snapshot taken per
//! scrape ([`metrics`]). The node's [`PoolSource`] is `crates/node/src/observed.rs`, the
//! controller's `gpufuse_controller::observed`. Also here: prices ([`prices`], a TOML file),
//! the cost report's formats ([`report`]), and `gpufuse top`'s model ([`top`]). Operators'
//! guide: `docs/observability.md`.
//!
//! It must not hold a source's locks longer than a snapshot takes, and must never be in the
//! way of sessions: a failing HTTP server logs and leaves the process serving.

#![forbid(unsafe_code)]

pub mod history;
pub mod metrics;
pub mod prices;
pub mod report;
mod server;
pub mod snapshot;
pub mod top;

pub use history::{Point, Report, TenantReport};
pub use prices::{Prices, PricesError};
pub use server::{serve, HttpConfig, ObserveError, Observer, Options};
pub use snapshot::{
    ControllerSnapshot, DeviceSnapshot, Histogram, ImageCacheSnapshot, NodeSnapshot,
    PendingSnapshot, PoolSnapshot, PoolSource, SessionSnapshot,
};
