//! `gpufuse status`.

use gpufuse_proto::DeviceKind;

#[derive(clap::Args)]
pub struct StatusArgs {
    #[arg(long, env = "GPUFUSE_SERVER")]
    server: gpufuse_transport::Address,
    #[command(flatten)]
    pub tls: crate::tls::ClientTlsArgs,
    #[arg(long, env = "GPUFUSE_TOKEN", default_value = "")]
    token: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn kind(k: DeviceKind) -> &'static str {
    match k {
        DeviceKind::Emulated => "emu",
        DeviceKind::Cuda => "cuda",
    }
}

pub fn status(a: StatusArgs) -> anyhow::Result<()> {
    use gpufuse_client::{ClientError, Connection};
    let hello = Connection::hello(
        gpufuse_proto::SessionKind::Status,
        a.token.clone(),
        Default::default(),
    );
    let s = match Connection::one_shot(&a.server, &hello)? {
        gpufuse_proto::ServerHello::Status(s) => s,
        gpufuse_proto::ServerHello::PoolStatus(p) => return crate::pool_status::print(&p, a.json),
        gpufuse_proto::ServerHello::Refused { reason } => {
            return Err(ClientError::Refused(reason).into())
        }
        _ => return Err(ClientError::UnexpectedReply.into()),
    };
    if a.json {
        let v = serde_json::json!({
            "compute_policy": s.compute_policy.name(),
            "devices": s.devices.iter().map(|d| serde_json::json!({
                "index": d.index, "name": d.name, "kind": kind(d.kind),
                "total_bytes": d.total_bytes, "used_bytes": d.used_bytes,
                "utilization_percent": d.utilization_percent,
            })).collect::<Vec<_>>(),
            "sessions": s.sessions.iter().map(|x| serde_json::json!({
                "id": x.id, "pid": x.pid, "program": x.program, "tenant": x.subject,
                "worker_pid": x.worker_pid,
                "device": x.device, "used_bytes": x.used_bytes, "limit_bytes": x.limit_bytes,
                "qos": x.qos.name(), "compute_percent": x.compute_percent,
                "device_time_us": x.device_time_us,
                "utilization_percent": x.utilization_percent,
                "queue_p50_us": x.queue_p50_us, "queue_p99_us": x.queue_p99_us,
                "on_device": x.on_device,
                "resident_bytes": x.used_bytes,
                "swapped_host_bytes": x.swapped_host_bytes,
                "swapped_disk_bytes": x.swapped_disk_bytes,
            })).collect::<Vec<_>>(),
            "notes": s.notes,
            "pending": s.pending.iter().map(|w| serde_json::json!({
                "id": w.id, "tenant": w.tenant, "vram_bytes": w.vram_bytes,
                "compute_percent": w.compute_percent, "qos": w.qos, "reason": w.reason,
                "waiting_ms": w.waiting_ms,
            })).collect::<Vec<_>>(),
            "image_cache": {
                "dir": s.image_cache.dir, "limit_bytes": s.image_cache.limit_bytes,
                "entries": s.image_cache.entries, "bytes": s.image_cache.bytes,
                "received": s.image_cache.counts.received,
                "received_bytes": s.image_cache.counts.received_bytes,
                "hits": s.image_cache.counts.hits, "hit_bytes": s.image_cache.counts.hit_bytes,
                "corrupt": s.image_cache.counts.corrupt,
            },
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    println!("devices (compute policy {}):", s.compute_policy.name());
    for d in &s.devices {
        println!(
            "  {} {:<24} {:<4} {:>10.1} MiB used of {:>10.1} MiB, {:>3}% busy",
            d.index,
            d.name,
            kind(d.kind),
            mib(d.used_bytes),
            mib(d.total_bytes),
            d.utilization_percent
        );
    }
    println!("sessions: {}", s.sessions.len());
    for x in &s.sessions {
        let limit = x
            .limit_bytes
            .map_or("none".to_string(), |l| format!("{:.1} MiB", mib(l)));
        let share = x
            .compute_percent
            .map_or("-".to_string(), |c| format!("{c}%"));
        let tenant = x
            .subject
            .as_deref()
            .map_or(String::new(), |t| format!("tenant {t}  "));
        println!(
            "  #{:<4} pid {:<8} worker {:<8} {:>10.1} MiB used, limit {limit}  {tenant}{}",
            x.id,
            x.pid,
            x.worker_pid,
            mib(x.used_bytes),
            x.program
        );
        println!(
            "        qos {:<8} share {:<4} {:>3}% busy, {:.3} s device time, queue p50 {} us p99 {} us{}",
            x.qos.name(),
            share,
            x.utilization_percent,
            x.device_time_us as f64 / 1e6,
            x.queue_p50_us,
            x.queue_p99_us,
            if x.on_device { ", on the device now" } else { "" }
        );
        if x.swapped_host_bytes + x.swapped_disk_bytes > 0 {
            println!(
                "        resident {:.1} MiB, swapped {:.1} MiB to host memory, {:.1} MiB to disk",
                mib(x.used_bytes),
                mib(x.swapped_host_bytes),
                mib(x.swapped_disk_bytes)
            );
        }
    }
    if !s.pending.is_empty() {
        crate::pool_status::print_pending(&s.pending);
    }
    let ic = &s.image_cache;
    let c = &ic.counts;
    match &ic.dir {
        Some(dir) => println!(
            "image cache {dir}: {} images, {:.1} MiB of {:.1} MiB",
            ic.entries,
            mib(ic.bytes),
            mib(ic.limit_bytes)
        ),
        None => println!("image cache: off"),
    }
    println!(
        "  images received {} ({:.1} MiB), found by hash {} ({:.1} MiB), corrupt entries {}",
        c.received,
        mib(c.received_bytes),
        c.hits,
        mib(c.hit_bytes),
        c.corrupt
    );
    for n in &s.notes {
        println!("note: {n}");
    }
    Ok(())
}
