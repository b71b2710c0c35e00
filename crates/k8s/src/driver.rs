//! The DRA driver as a process: reads the node's GPUs from `gpufuse serve`, serves the
//! kubelet plugin, and keeps the node's ResourceSlice published.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::cdi::Layout;
use crate::inventory::{self, Gpu};
use crate::plugin::{self, Sockets};
use crate::prepare::Preparer;
use crate::slice;

#[derive(Clone, Debug)]
pub struct DriverConfig {
    /// The Kubernetes node this runs on (the slice's `nodeName` and pool).
    pub node_name: String,
    pub sockets: Sockets,
    pub cdi_dir: PathBuf,
    pub layout: Layout,
    pub secret: Vec<u8>,
    /// How often the node's devices are read again and the slice checked.
    pub resync: Duration,
}

/// Reads the node's devices, waiting for the node to answer (it may start after the plugin).
async fn devices(config: &DriverConfig, deadline: Duration) -> anyhow::Result<Vec<Gpu>> {
    let start = tokio::time::Instant::now();
    loop {
        let server = config.layout.host_server.clone();
        let token = own_token(&config.secret)?;
        let r = tokio::task::spawn_blocking(move || inventory::query(&server, &token)).await?;
        match r {
            Ok(g) => return Ok(g),
            Err(e) if start.elapsed() >= deadline => return Err(e),
            Err(e) => {
                tracing::info!("waiting for the gpufuse node: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// The plugin's own token for status queries to a node that checks tokens.
fn own_token(secret: &[u8]) -> anyhow::Result<String> {
    Ok(gpufuse_auth::issue(
        secret,
        &gpufuse_auth::Claims {
            subject: format!("{}-plugin", crate::DRIVER_NAME),
            expires: None,
            max_vram_bytes: Some(0),
            max_compute_percent: None,
            ..Default::default()
        },
    )?)
}

/// Runs the driver until `shutdown`.
pub async fn run(
    config: DriverConfig,
    client: kube::Client,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let gpus = devices(&config, Duration::from_secs(60)).await?;
    tracing::info!(
        "the node has {} GPU(s): {}",
        gpus.len(),
        gpus.iter()
            .map(|g| format!("{} ({}, {})", g.name, g.model, g.uuid))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let shared = Arc::new(RwLock::new(gpus));
    let preparer = Arc::new(Preparer {
        node_name: config.node_name.clone(),
        client: client.clone(),
        gpus: shared.clone(),
        layout: config.layout.clone(),
        cdi_dir: config.cdi_dir.clone(),
        secret: config.secret.clone(),
    });
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let running = plugin::serve(preparer, config.sockets.clone(), async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    })?;
    tracing::info!(
        "serving the kubelet: {} (registration {})",
        config.sockets.dra.display(),
        config.sockets.registration.display()
    );
    let mut tick = tokio::time::interval(config.resync);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop_rx.changed() => break,
        }
        match devices(&config, Duration::ZERO).await {
            Ok(g) => *shared.write().unwrap_or_else(|e| e.into_inner()) = g,
            Err(e) => {
                tracing::warn!("cannot read the node's devices (the slice stays as it was): {e}")
            }
        }
        let gpus = shared.read().unwrap_or_else(|e| e.into_inner()).clone();
        match slice::publish(&client, &slice::resource_slice(&config.node_name, &gpus, 1)).await {
            Ok(true) => tracing::info!(
                "published ResourceSlice {}",
                slice::slice_name(&config.node_name)
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!(
                "cannot publish the ResourceSlice: {}",
                crate::error_chain(&e)
            ),
        }
    }
    running.task.await??;
    Ok(())
}
