//! `gpufuse status --server CONTROLLER`: the pool view (schema: docs/pool.md).

use gpufuse_proto::PoolStatus;

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("-".into(), |v| v.to_string())
}

pub fn print(p: &PoolStatus, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(p)?);
        return Ok(());
    }
    println!("pool (policy {}): {} node(s)", p.policy, p.nodes.len());
    for n in &p.nodes {
        let labels: Vec<String> = n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let state = if n.cordoned {
            format!("{},cordoned", n.state)
        } else {
            n.state.clone()
        };
        println!(
            "  {} {:<5} {}  labels [{}]  last report {} ms ago",
            n.name,
            state,
            n.address,
            labels.join(","),
            n.last_heard_ms
        );
        for d in &n.devices {
            println!(
                "    {} {:<28} {:>7.2} GiB promised, {:>7.2} GiB used of {:>7.2} GiB, {:>3}% compute promised, {:>3}% busy, {} session(s)",
                d.index,
                d.model,
                gib(d.memory_promised_bytes),
                gib(d.memory_used_bytes),
                gib(d.memory_total_bytes),
                d.compute_promised_percent,
                d.utilization_percent,
                d.sessions
            );
        }
    }
    println!("sessions: {}", p.sessions.len());
    for s in &p.sessions {
        let at = match (&s.node, s.device) {
            (Some(n), Some(d)) => format!("{n}/{d}"),
            _ => "-".into(),
        };
        println!(
            "  #{:<6} {:<8} tenant {:<12} on {:<16} vram {:>9} compute {:>4} qos {:<8} node session {}{}",
            s.id,
            s.state,
            s.tenant,
            at,
            s.vram_limit_bytes.map_or("-".into(), |b| format!("{:.2}G", gib(b))),
            opt(s.compute_percent.map(|c| format!("{c}%"))),
            s.qos,
            opt(s.node_session),
            // Admitted by its node on a Kubernetes claim's token: it stays on its device.
            s.claim
                .as_ref()
                .map_or(String::new(), |uid| format!(" claim {uid}"))
        );
    }
    print_pending(&p.pending);
    Ok(())
}

/// The sessions waiting for capacity, and why (a pool's, or `gpufuse serve`'s own).
pub fn print_pending(pending: &[gpufuse_proto::PoolPendingView]) {
    println!("pending: {}", pending.len());
    for w in pending {
        println!(
            "  #{:<6} tenant {:<12} waiting {:.1} s: {}",
            w.id,
            w.tenant,
            w.waiting_ms as f64 / 1000.0,
            w.reason
        );
    }
}
