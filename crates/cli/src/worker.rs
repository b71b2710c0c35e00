//! `gpufuse worker`: one session, in its own process. Its stdin is the client's connection and
//! its stdout the control socket to the node; it logs to stderr only.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use gpufuse_device::cuda::CudaDevice;
use gpufuse_device::emu::EmuDevice;
use gpufuse_device::Device;
use gpufuse_transport::{Conn, Stream};
use gpufuse_worker::ControlLedger;

#[derive(clap::Args)]
pub struct WorkerArgs {
    #[arg(long)]
    session: u64,
    #[arg(long)]
    device_index: u32,
    #[arg(long)]
    device_total: u64,
    #[arg(long)]
    window_base: u64,
    #[arg(long)]
    window_size: u64,
    #[arg(long)]
    limit: Option<u64>,
    /// The connection is a TCP socket (otherwise a unix socket).
    #[arg(long)]
    tcp: bool,
    /// `emu` (the emulated GPU) or `cuda` (an NVIDIA GPU through its driver).
    #[arg(long, default_value = "emu")]
    backend: String,
    /// The emulated device's model by compute capability (`120` for sm_120).
    #[arg(long, default_value_t = 100)]
    arch: u32,
    /// The session's tenant (its token's subject), for the logs' session span.
    #[arg(long, default_value = "-")]
    tenant: String,
    /// The node's command socket (evict, migrate), an inherited descriptor.
    #[arg(long)]
    commands_fd: Option<i32>,
    /// The session's lease offers from the node (a sealed memfd), an inherited descriptor.
    #[arg(long)]
    lease_fd: Option<i32>,
    /// Idle this long, the session's memory moves to host memory.
    #[arg(long)]
    idle_ttl_ms: Option<u64>,
    /// Idle this long, it moves on to disk (with --swap-dir).
    #[arg(long)]
    idle_disk_ttl_ms: Option<u64>,
    #[arg(long)]
    swap_dir: Option<std::path::PathBuf>,
    /// The node promises more device memory than it has (`--vram-oversubscribe`).
    #[arg(long)]
    oversubscribed: bool,
    /// The session moves in from another node: the connection brings its state, and its
    /// client resumes it with this key (`docs/migration.md`).
    #[arg(long)]
    incoming_key: Option<u64>,
}

pub fn worker(a: WorkerArgs) -> anyhow::Result<()> {
    // Every line this thread logs carries the session: one session's story can be followed
    // across the node's log and its worker's.
    let _span = tracing::info_span!(
        "session",
        id = a.session,
        tenant = %a.tenant,
        node = %gpufuse_observe::snapshot::host_name(),
        device = a.device_index
    )
    .entered();
    let client = std::io::stdin().as_fd().try_clone_to_owned()?;
    let control = std::io::stdout().as_fd().try_clone_to_owned()?;
    let conn = Conn::new(Stream::from_fd(client, a.tcp));
    let control = UnixStream::from(control);
    // Backstop to the parent-death signal the node sets: the worker ends when its node's end
    // of the control socket closes (the node died), whatever the worker is doing.
    let watched = control.try_clone()?;
    let session = a.session;
    std::thread::spawn(move || {
        use std::os::fd::AsFd;
        gpufuse_transport::wait_for_hang_up(watched.as_fd());
        tracing::warn!(session, "the node is gone: ending the session");
        std::process::exit(1);
    });
    let mut ledger = ControlLedger::new(control);
    if let Some(fd) = a.lease_fd {
        if fd < 3 || !std::path::Path::new(&format!("/proc/self/fd/{fd}")).exists() {
            anyhow::bail!("--lease-fd {fd} is not an open descriptor of this process");
        }
        // SAFETY: the node passed this descriptor (a memfd it made for this worker, checked
        // open above) and nothing else in this process owns it.
        let owned = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        match gpufuse_transport::lease_offer::LeaseOffer::adopt(owned) {
            Ok(offer) => ledger = ledger.with_offers(offer),
            Err(e) => tracing::warn!("the node's lease offers are unusable: {e}"),
        }
    }
    let mut device: Box<dyn Device> = match a.backend.as_str() {
        "cuda" => {
            let opened = gpufuse_cuda_driver::Driver::load().and_then(|driver| {
                CudaDevice::new(driver, a.device_index, a.window_base, a.window_size)
            });
            match opened {
                Ok(d) => Box::new(d),
                Err(e) => {
                    let reason = format!("GPU {} could not be opened: {e}", a.device_index);
                    tracing::warn!(session = a.session, "{reason}");
                    let _ = gpufuse_worker::refuse(conn, reason);
                    return Ok(());
                }
            }
        }
        _ => {
            let Some(model) = gpufuse_device::model::by_arch(a.arch) else {
                let reason = format!("no emulated model sm_{}", a.arch);
                let _ = gpufuse_worker::refuse(conn, reason);
                return Ok(());
            };
            Box::new(
                EmuDevice::new(a.device_index, a.device_total, a.window_base, a.window_size)
                    .with_model(model),
            )
        }
    };
    tracing::debug!(session = a.session, backend = %a.backend, "worker serving");
    if let Some(fd) = a.commands_fd {
        if fd < 3 || !std::path::Path::new(&format!("/proc/self/fd/{fd}")).exists() {
            anyhow::bail!("--commands-fd {fd} is not an open descriptor of this process");
        }
    }
    let commands = a.commands_fd.map(|fd| {
        // SAFETY: the node passed this descriptor (a socket it made for this worker, checked
        // open above) and nothing else in this process owns it.
        let owned = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        UnixStream::from(owned)
    });
    let (backend, total, base, size, arch) = (
        a.backend.clone(),
        a.device_total,
        a.window_base,
        a.window_size,
        a.arch,
    );
    let open_device: gpufuse_worker::DeviceOpener = Box::new(move |index| {
        // A device of the same kind, window and model: where the session moves.
        match backend.as_str() {
            "cuda" => {
                let driver = gpufuse_cuda_driver::Driver::load().map_err(|e| e.to_string())?;
                let d = CudaDevice::new(driver, index, base, size).map_err(|e| e.to_string())?;
                Ok(Box::new(d) as Box<dyn Device>)
            }
            _ => {
                let model = gpufuse_device::model::by_arch(arch)
                    .ok_or_else(|| format!("no emulated model sm_{arch}"))?;
                Ok(Box::new(
                    EmuDevice::new(index, total, base, size).with_model(model),
                ))
            }
        }
    });
    let elastic = gpufuse_worker::Elastic {
        config: gpufuse_worker::ElasticConfig {
            idle_ttl: a.idle_ttl_ms.map(std::time::Duration::from_millis),
            idle_disk_ttl: a.idle_disk_ttl_ms.map(std::time::Duration::from_millis),
            swap_dir: a.swap_dir,
            oversubscribed: a.oversubscribed,
        },
        commands,
        open_device: Some(open_device),
    };
    let result = match a.incoming_key {
        Some(key) => gpufuse_worker::serve_incoming(
            conn,
            a.session,
            a.device_index,
            device.as_mut(),
            &mut ledger,
            a.limit,
            elastic,
            key,
        ),
        None => gpufuse_worker::serve_elastic(
            conn,
            a.session,
            device.as_mut(),
            &mut ledger,
            a.limit,
            elastic,
        ),
    };
    if let Err(e) = &result {
        tracing::warn!(session = a.session, "session ended: {e}");
    }
    Ok(())
}
