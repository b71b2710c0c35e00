//! `gpufuse report`: per-tenant usage and cost over a period, from a process's `--http`
//! address (its in-memory usage ledger, `gpufuse_observe::history`).

use std::time::Duration;

#[derive(clap::Args)]
pub struct ReportArgs {
    /// The `--http` address of the node or controller (host:port or http://host:port).
    #[arg(long, value_name = "ADDR", env = "GPUFUSE_HTTP")]
    http: String,
    /// How far back: 90s, 15m, 1h, 1d (the ledger keeps a day).
    #[arg(long, default_value = "1h", value_parser = gpufuse_observe::report::parse_duration)]
    since: u64,
    /// Print JSON.
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// Print CSV (a line per tenant).
    #[arg(long)]
    csv: bool,
}

/// GETs `path` from an observer at `addr` and decodes its JSON.
pub fn get_json<T: serde::de::DeserializeOwned>(addr: &str, path: &str) -> anyhow::Result<T> {
    let base = if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.trim_end_matches('/').to_string()
    } else {
        format!("http://{addr}")
    };
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let url = format!("{base}{path}");
    let mut r = agent
        .get(&url)
        .call()
        .map_err(|e| anyhow::anyhow!("GET {url}: {e}"))?;
    r.body_mut()
        .read_json()
        .map_err(|e| anyhow::anyhow!("GET {url}: not the answer expected: {e}"))
}

pub fn report(a: ReportArgs) -> anyhow::Result<()> {
    let r: gpufuse_observe::Report =
        get_json(&a.http, &format!("/api/v1/report?since={}", a.since))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else if a.csv {
        print!("{}", gpufuse_observe::report::to_csv(&r));
    } else {
        print!("{}", gpufuse_observe::report::to_text(&r));
    }
    Ok(())
}
