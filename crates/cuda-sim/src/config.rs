//! The environment the simulated driver reads at `cuInit`.

/// The simulated machine.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Config {
    pub devices: usize,
    /// Memory per device, bytes.
    pub mem: u64,
    /// Host/device copy rates, GB/s (bytes per nanosecond).
    pub pinned_gbps: f64,
    pub pageable_gbps: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            devices: 1,
            mem: 8 << 30,
            pinned_gbps: 50.0,
            pageable_gbps: 8.0,
        }
    }
}

/// The most devices `GPUFUSE_SIM_DEVICES` may ask for.
const MAX_DEVICES: usize = 64;

impl Config {
    /// The configuration the environment gives, or what is wrong with it.
    pub fn from_env() -> Result<Config, String> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let mut c = Config::default();
        if let Some(v) = get("GPUFUSE_SIM_DEVICES") {
            c.devices = v
                .trim()
                .parse()
                .ok()
                .filter(|&n| n <= MAX_DEVICES)
                .ok_or(format!(
                    "GPUFUSE_SIM_DEVICES={v}: expected 0 to {MAX_DEVICES}"
                ))?;
        }
        if let Some(v) = get("GPUFUSE_SIM_MEM") {
            c.mem = parse_bytes(&v)
                .filter(|&b| b > 0)
                .ok_or(format!("GPUFUSE_SIM_MEM={v}: expected bytes, like 8GiB"))?;
        }
        for (key, slot) in [
            ("GPUFUSE_SIM_PINNED_GBPS", &mut c.pinned_gbps),
            ("GPUFUSE_SIM_PAGEABLE_GBPS", &mut c.pageable_gbps),
        ] {
            if let Some(v) = get(key) {
                *slot = v
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|r| r.is_finite() && *r > 0.0)
                    .ok_or(format!("{key}={v}: expected a positive rate in GB/s"))?;
            }
        }
        Ok(c)
    }
}

/// `8589934592`, `8G`, `8GiB`, `512M`, ... (suffixes are binary multiples).
pub(crate) fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let n: u64 = s[..digits].parse().ok()?;
    let shift = match s[digits..].trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_rates_parse() {
        assert_eq!(parse_bytes("8GiB"), Some(8 << 30));
        assert_eq!(parse_bytes("512 M"), Some(512 << 20));
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("lots"), None);
        let c = Config::from_lookup(|k| match k {
            "GPUFUSE_SIM_DEVICES" => Some("3".into()),
            "GPUFUSE_SIM_PINNED_GBPS" => Some("25.5".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!((c.devices, c.pinned_gbps, c.mem), (3, 25.5, 8 << 30));
        assert!(
            Config::from_lookup(|k| (k == "GPUFUSE_SIM_PAGEABLE_GBPS").then(|| "0".into()))
                .is_err()
        );
        assert!(Config::from_lookup(|k| (k == "GPUFUSE_SIM_DEVICES").then(|| "x".into())).is_err());
    }
}
