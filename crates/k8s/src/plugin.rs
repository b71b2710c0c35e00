//! The kubelet side of the DRA driver: the `DRAPlugin` gRPC service (v1) on a unix socket,
//! and plugin registration through the kubelet's registration directory.
//!
//! Registration follows the kubelet's plugin watcher: the plugin listens on
//! `<registry dir>/gpu.gpufuse.dev-reg.sock` with the `pluginregistration.Registration`
//! service; the kubelet finds the socket, asks `GetInfo` (type `DRAPlugin`, the driver's
//! name, the DRA socket's path, the service versions: `v1.DRAPlugin`) and reports the outcome
//! with `NotifyRegistrationStatus`. Then it calls `NodePrepareResources` before a pod with a
//! claim starts and `NodeUnprepareResources` after it ends; each answers every claim it was
//! given, failures inside the answer.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use crate::grpc::dra::dra_plugin_server::{DraPlugin, DraPluginServer};
use crate::grpc::dra::{
    Claim, Device, NodePrepareResourceResponse, NodePrepareResourcesRequest,
    NodePrepareResourcesResponse, NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest,
    NodeUnprepareResourcesResponse,
};
use crate::grpc::registration::registration_server::{Registration, RegistrationServer};
use crate::grpc::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use crate::prepare::{ClaimRef, Preparer};
use crate::DRIVER_NAME;

/// The plugin type the kubelet's DRA plugin handler registers.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The service versions the plugin serves, as the kubelet names them.
pub const SUPPORTED_VERSIONS: &[&str] = &["v1.DRAPlugin"];

/// Where the plugin's sockets go.
#[derive(Clone, Debug)]
pub struct Sockets {
    /// The DRA service's socket (`/var/lib/kubelet/plugins/gpu.gpufuse.dev/dra.sock`).
    pub dra: PathBuf,
    /// The registration socket (`/var/lib/kubelet/plugins_registry/gpu.gpufuse.dev-reg.sock`).
    pub registration: PathBuf,
}

impl Sockets {
    /// The kubelet's usual layout under `kubelet_dir` (`/var/lib/kubelet`).
    pub fn under(kubelet_dir: &Path) -> Sockets {
        Sockets {
            dra: kubelet_dir
                .join("plugins")
                .join(DRIVER_NAME)
                .join("dra.sock"),
            registration: kubelet_dir
                .join("plugins_registry")
                .join(format!("{DRIVER_NAME}-reg.sock")),
        }
    }
}

fn claim_ref(c: &Claim) -> Result<ClaimRef, String> {
    let missing = [
        ("namespace", &c.namespace),
        ("uid", &c.uid),
        ("name", &c.name),
    ]
    .iter()
    .filter(|(_, v)| v.is_empty())
    .map(|(k, _)| *k)
    .collect::<Vec<_>>();
    if !missing.is_empty() {
        return Err(format!("the claim has no {}", missing.join(", ")));
    }
    Ok(ClaimRef {
        namespace: c.namespace.clone(),
        name: c.name.clone(),
        uid: c.uid.clone(),
    })
}

/// The `DRAPlugin` service.
pub struct DraService {
    pub preparer: Arc<Preparer>,
}

#[tonic::async_trait]
impl DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let mut claims = HashMap::new();
        for c in request.into_inner().claims {
            let answer = match claim_ref(&c) {
                Err(e) => failed(e),
                Ok(r) => match self.preparer.prepare(&r).await {
                    Ok(devices) => NodePrepareResourceResponse {
                        devices: devices
                            .into_iter()
                            .map(|d| Device {
                                request_names: vec![d.request],
                                pool_name: d.pool,
                                device_name: d.device,
                                cdi_device_ids: vec![d.cdi_id],
                                share_id: d.share_id,
                            })
                            .collect(),
                        error: String::new(),
                    },
                    Err(e) => {
                        tracing::warn!("cannot prepare {}/{}: {e}", r.namespace, r.name);
                        failed(crate::error_chain(&e))
                    }
                },
            };
            claims.insert(c.uid.clone(), answer);
        }
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let mut claims = HashMap::new();
        for c in request.into_inner().claims {
            let error = match claim_ref(&c) {
                Err(e) => e,
                Ok(r) => {
                    let preparer = self.preparer.clone();
                    // Blocking: it waits for the node to end the claim's sessions.
                    match tokio::task::spawn_blocking(move || preparer.unprepare(&r)).await {
                        Ok(Ok(())) => String::new(),
                        Ok(Err(e)) => crate::error_chain(&e),
                        Err(e) => format!("unprepare failed: {e}"),
                    }
                }
            };
            claims.insert(c.uid.clone(), NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}

fn failed(error: String) -> NodePrepareResourceResponse {
    NodePrepareResourceResponse {
        devices: Vec::new(),
        error,
    }
}

/// The `Registration` service. `registered` reports the kubelet's last word.
pub struct RegistrationService {
    pub dra_socket: PathBuf,
    pub registered: tokio::sync::watch::Sender<Option<Result<(), String>>>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: DRIVER_NAME.into(),
            endpoint: self.dra_socket.display().to_string(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|s| s.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let s = request.into_inner();
        let outcome = if s.plugin_registered {
            tracing::info!("the kubelet registered the {DRIVER_NAME} plugin");
            Ok(())
        } else {
            tracing::error!("the kubelet did not register the plugin: {}", s.error);
            Err(s.error)
        };
        self.registered.send_replace(Some(outcome));
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// Binds a unix socket, replacing a stale one (a previous instance's), and creating its
/// directory.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    UnixListener::bind(path)
}

/// A running plugin.
pub struct Running {
    pub registered: tokio::sync::watch::Receiver<Option<Result<(), String>>>,
    pub task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

/// Serves both sockets until `shutdown` resolves; the sockets are removed then (the kubelet
/// unregisters a plugin whose registration socket disappears).
pub fn serve(
    preparer: Arc<Preparer>,
    sockets: Sockets,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<Running> {
    let dra = bind(&sockets.dra)?;
    let reg = bind(&sockets.registration)?;
    let (tx, rx) = tokio::sync::watch::channel(None);
    let registration = RegistrationService {
        dra_socket: sockets.dra.clone(),
        registered: tx,
    };
    let (stop_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let mut stop_dra = stop_tx.subscribe();
    let mut stop_reg = stop_tx.subscribe();
    let task = tokio::spawn(async move {
        let dra_server = tonic::transport::Server::builder()
            .add_service(DraPluginServer::new(DraService { preparer }))
            .serve_with_incoming_shutdown(UnixListenerStream::new(dra), async move {
                let _ = stop_dra.recv().await;
            });
        let reg_server = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(registration))
            .serve_with_incoming_shutdown(UnixListenerStream::new(reg), async move {
                let _ = stop_reg.recv().await;
            });
        let stopper = async move {
            shutdown.await;
            let _ = stop_tx.send(());
        };
        let (a, b, ()) = tokio::join!(dra_server, reg_server, stopper);
        let _ = std::fs::remove_file(&sockets.registration);
        let _ = std::fs::remove_file(&sockets.dra);
        a.and(b)
    });
    Ok(Running {
        registered: rx,
        task,
    })
}
