//! The options every gpufuse daemon takes to be observed: `--http ADDR` (metrics, health,
//! dashboard; `gpufuse_observe`) and `--prices FILE` (what the cost report charges).

#[derive(clap::Args, Clone, Debug)]
pub struct HttpArgs {
    /// Serve /metrics (Prometheus), /healthz, /readyz, the JSON API and the web dashboard (/)
    /// on this address, e.g. 127.0.0.1:9400 or 0.0.0.0:9400 (no TLS, no authentication: bind
    /// it where only operators reach it).
    #[arg(long, value_name = "ADDR")]
    pub http: Option<std::net::SocketAddr>,
    /// Prices for the cost report (TOML; defaults and format in docs/observability.md).
    #[arg(long, value_name = "FILE", requires = "http")]
    pub prices: Option<std::path::PathBuf>,
}

impl HttpArgs {
    pub fn config(&self) -> anyhow::Result<Option<gpufuse_observe::HttpConfig>> {
        let Some(addr) = self.http else {
            return Ok(None);
        };
        let prices = match &self.prices {
            Some(p) => gpufuse_observe::Prices::load(p)?,
            None => gpufuse_observe::Prices::default(),
        };
        Ok(Some(gpufuse_observe::HttpConfig {
            addr,
            options: gpufuse_observe::Options {
                prices,
                ..Default::default()
            },
        }))
    }
}
