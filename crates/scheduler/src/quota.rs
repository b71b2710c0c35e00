//! Tenant quotas, from a TOML file (`gpufuse controller --quota-file FILE`):
//!
//! ```toml
//! # Every tenant not named below (omit the table for no limit).
//! [default]
//! sessions = 4
//!
//! [tenants.alice]
//! vram = "64GiB"              # total VRAM of alice's sessions (their slices)
//! compute = 200               # total compute shares, in percent of one GPU
//! sessions = 10               # sessions at once
//! max_session_vram = "16GiB"  # one session's slice at most; also the slice of a session that asks for none
//! max_session_compute = 50    # one session's compute share at most
//! ```
//!
//! Sizes are a number of bytes or a string with a unit (B, KiB, MiB, GiB, TiB; powers of
//! 1024). Unknown keys are errors, so a misspelt limit is not silently ignored.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};

use crate::Request;

/// The limits of one tenant; an absent limit is no limit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantQuota {
    #[serde(default, deserialize_with = "size_opt")]
    pub vram: Option<u64>,
    pub compute: Option<u32>,
    pub sessions: Option<u32>,
    #[serde(default, deserialize_with = "size_opt")]
    pub max_session_vram: Option<u64>,
    pub max_session_compute: Option<u32>,
}

/// A quota file: per-tenant limits and the limits of every other tenant.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaFile {
    #[serde(default)]
    pub default: Option<TenantQuota>,
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantQuota>,
}

/// What a tenant's sessions hold now (running, starting and lost sessions alike: a lost
/// node's sessions may still run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TenantUsage {
    pub vram: u64,
    pub compute: u32,
    pub sessions: u32,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuotaError {
    #[error("bad quota file: {0}")]
    Parse(String),
    /// Over a limit: the message names the tenant, the limit, what is held and what was asked.
    #[error("{0}")]
    Over(String),
}

/// Parses `16GiB`, `1.5GiB`, `512MiB`, `2G`, `1000000` (units are powers of 1024).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => (1u64 << 30) as f64,
        "t" | "tb" | "tib" => (1u64 << 40) as f64,
        _ => return None,
    };
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') {
        return None;
    }
    let v: f64 = num.parse().ok()?;
    let bytes = v * mult;
    (bytes.is_finite() && bytes < u64::MAX as f64).then_some(bytes as u64)
}

fn size_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Bytes(u64),
        Text(String),
    }
    match Option::<Size>::deserialize(d)? {
        None => Ok(None),
        Some(Size::Bytes(b)) => Ok(Some(b)),
        Some(Size::Text(t)) => parse_size(&t).map(Some).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "bad size {t:?}: expected bytes or a number with B, KiB, MiB, GiB or TiB"
            ))
        }),
    }
}

/// Bytes as an operator reads them: `512 B`, `1.5 GiB`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{b} B")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[unit])
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

impl QuotaFile {
    /// Parses a quota file's text.
    pub fn parse(text: &str) -> Result<Self, QuotaError> {
        toml::from_str(text).map_err(|e| QuotaError::Parse(e.to_string().trim().to_string()))
    }

    /// Sets `tenant`'s own limits (`None`: the default's apply again). What the Kubernetes
    /// operator does with a namespace's `GPUQuota`.
    pub fn set_tenant(&mut self, tenant: &str, quota: Option<TenantQuota>) {
        match quota {
            Some(q) => self.tenants.insert(tenant.to_string(), q),
            None => self.tenants.remove(tenant),
        };
    }

    /// The limits that apply to `tenant`.
    pub fn for_tenant(&self, tenant: &str) -> Option<&TenantQuota> {
        self.tenants.get(tenant).or(self.default.as_ref())
    }

    /// Whether `tenant`'s compute is limited (a total or a per-session maximum, in percent).
    pub fn limits_compute(&self, tenant: &str) -> bool {
        self.for_tenant(tenant)
            .is_some_and(|q| q.compute.is_some() || q.max_session_compute.is_some())
    }

    /// The request as it will be charged: a tenant with a per-session VRAM maximum gives a
    /// session that asked for no slice that maximum. Errors name the limit that is exceeded
    /// (per-session maxima here; totals in [`QuotaFile::admit`]).
    pub fn shape(&self, req: &Request) -> Result<Request, QuotaError> {
        let mut req = req.clone();
        let Some(q) = self.for_tenant(&req.tenant) else {
            return Ok(req);
        };
        let t = &req.tenant;
        if let Some(max) = q.max_session_vram {
            match req.vram_bytes {
                Some(v) if v > max => {
                    return Err(QuotaError::Over(format!(
                        "tenant {t:?} may ask for at most {} of VRAM per session (max_session_vram), and {} was asked for",
                        human_bytes(max),
                        human_bytes(v)
                    )))
                }
                Some(_) => {}
                None => req.vram_bytes = Some(max),
            }
        }
        if let (Some(max), Some(c)) = (q.max_session_compute, req.compute_percent) {
            if c > max {
                return Err(QuotaError::Over(format!(
                    "tenant {t:?} may ask for at most {max}% compute per session (max_session_compute), and {c}% was asked for"
                )));
            }
        }
        if q.vram.is_some() && req.vram_bytes.is_none() {
            return Err(QuotaError::Over(format!(
                "tenant {t:?} has a VRAM quota (vram), so its sessions must ask for a slice (--vram)"
            )));
        }
        Ok(req)
    }

    /// Whether a session charged `req` may start while the tenant holds `usage`.
    pub fn admit(&self, req: &Request, usage: TenantUsage) -> Result<(), QuotaError> {
        let Some(q) = self.for_tenant(&req.tenant) else {
            return Ok(());
        };
        let t = &req.tenant;
        if let Some(max) = q.sessions {
            if usage.sessions + 1 > max {
                return Err(QuotaError::Over(format!(
                    "tenant {t:?} is at its session quota (sessions = {max}): {} session(s) hold it",
                    usage.sessions
                )));
            }
        }
        if let (Some(max), Some(v)) = (q.vram, req.vram_bytes) {
            if usage.vram.saturating_add(v) > max {
                return Err(QuotaError::Over(format!(
                    "tenant {t:?} would exceed its VRAM quota (vram = {}): {} is held and {} was asked for",
                    human_bytes(max),
                    human_bytes(usage.vram),
                    human_bytes(v)
                )));
            }
        }
        if let (Some(max), Some(c)) = (q.compute, req.compute_percent) {
            if usage.compute + c > max {
                return Err(QuotaError::Over(format!(
                    "tenant {t:?} would exceed its compute quota (compute = {max}%): {}% is held and {c}% was asked for",
                    usage.compute
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_file_parses_sizes_and_rejects_unknown_keys() {
        let q = QuotaFile::parse(
            "[default]\nsessions = 2\n[tenants.alice]\nvram = \"1.5GiB\"\nmax_session_vram = 1048576\ncompute = 150\n",
        )
        .unwrap();
        let a = &q.tenants["alice"];
        assert_eq!(a.vram, Some(3 << 29));
        assert_eq!(a.max_session_vram, Some(1 << 20));
        assert_eq!(a.compute, Some(150));
        assert_eq!(q.for_tenant("bob").unwrap().sessions, Some(2));
        let e = QuotaFile::parse("[tenants.alice]\nvrma = 5\n").unwrap_err();
        assert!(e.to_string().contains("vrma"), "{e}");
        let e = QuotaFile::parse("[tenants.alice]\nvram = \"5 parsecs\"\n").unwrap_err();
        assert!(e.to_string().contains("parsecs"), "{e}");
    }

    #[test]
    fn over_quota_errors_name_the_limit() {
        let q = QuotaFile::parse(
            "[tenants.a]\nvram = \"4GiB\"\nsessions = 2\ncompute = 100\nmax_session_vram = \"2GiB\"\nmax_session_compute = 60\n",
        )
        .unwrap();
        let req = |v: Option<u64>, c: Option<u32>| Request {
            tenant: "a".into(),
            vram_bytes: v,
            compute_percent: c,
            ..Default::default()
        };
        let e = q.shape(&req(Some(3 << 30), None)).unwrap_err();
        assert!(e.to_string().contains("max_session_vram"), "{e}");
        let e = q.shape(&req(Some(1 << 30), Some(70))).unwrap_err();
        assert!(e.to_string().contains("max_session_compute"), "{e}");
        // No slice asked: the per-session maximum is the slice.
        assert_eq!(q.shape(&req(None, None)).unwrap().vram_bytes, Some(2 << 30));
        let shaped = q.shape(&req(Some(2 << 30), Some(50))).unwrap();
        let held = TenantUsage {
            vram: 3 << 30,
            compute: 10,
            sessions: 1,
        };
        let e = q.admit(&shaped, held).unwrap_err();
        assert!(e.to_string().contains("vram = 4 GiB"), "{e}");
        let held = TenantUsage {
            vram: 0,
            compute: 60,
            sessions: 1,
        };
        let e = q.admit(&shaped, held).unwrap_err();
        assert!(e.to_string().contains("compute = 100%"), "{e}");
        let held = TenantUsage {
            vram: 0,
            compute: 0,
            sessions: 2,
        };
        let e = q.admit(&shaped, held).unwrap_err();
        assert!(e.to_string().contains("sessions = 2"), "{e}");
        assert!(q.admit(&shaped, TenantUsage::default()).is_ok());
        // A tenant with no entry and no default has no limits.
        let free = Request {
            tenant: "zed".into(),
            vram_bytes: Some(1 << 40),
            ..Default::default()
        };
        assert!(q.admit(&free, TenantUsage::default()).is_ok());
    }
}
