//! What a device-hour costs: a price per GPU model and a multiplier per QoS, read from a TOML
//! file (`--prices FILE`), with documented defaults (`docs/observability.md`).
//!
//! ```toml
//! currency = "USD"
//! default_gpu_hour = 2.0        # a model no entry matches
//! vram_gib_hour = 0.0           # an extra charge per GiB-hour of memory slice
//! [models]                      # matched as a case-insensitive substring of the model name;
//! "H100" = 2.5                  # the longest matching key wins
//! [qos]
//! low = 0.6
//! medium = 1.0
//! high = 1.3
//! critical = 1.6
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Prices {
    pub currency: String,
    /// Price of one whole GPU for an hour when no `models` key matches.
    pub default_gpu_hour: f64,
    /// Price of a GiB of memory slice for an hour (0 by default: memory is in the GPU's price).
    pub vram_gib_hour: f64,
    /// Price of one whole GPU for an hour, by model-name substring.
    pub models: BTreeMap<String, f64>,
    /// Multiplier by QoS (`low`, `medium`, `high`, `critical`); 1 where absent.
    pub qos: BTreeMap<String, f64>,
}

impl Default for Prices {
    fn default() -> Self {
        let models = [
            ("B200", 5.0),
            ("H200", 3.5),
            ("H100", 2.5),
            ("A100", 1.5),
            ("L40S", 1.0),
            ("L4", 0.7),
            ("emulated", 0.1),
        ];
        let qos = [
            ("low", 0.6),
            ("medium", 1.0),
            ("high", 1.3),
            ("critical", 1.6),
        ];
        Self {
            currency: "USD".into(),
            default_gpu_hour: 2.0,
            vram_gib_hour: 0.0,
            models: models.iter().map(|&(k, v)| (k.to_string(), v)).collect(),
            qos: qos.iter().map(|&(k, v)| (k.to_string(), v)).collect(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PricesError {
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
}

impl Prices {
    /// Reads a price file; keys it leaves out keep their defaults, unknown keys are errors.
    pub fn load(path: &std::path::Path) -> Result<Self, PricesError> {
        let text = std::fs::read_to_string(path).map_err(|source| PricesError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text).map_err(|message| PricesError::Parse {
            path: path.display().to_string(),
            message,
        })
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let p: Prices = toml::from_str(text).map_err(|e| e.to_string())?;
        for (k, v) in p.models.iter().chain(p.qos.iter()) {
            if !v.is_finite() || *v < 0.0 {
                return Err(format!("{k}: a price is a number of at least 0, not {v}"));
            }
        }
        for k in p.qos.keys() {
            if !["low", "medium", "high", "critical"].contains(&k.as_str()) {
                return Err(format!("unknown QoS {k:?} (low, medium, high or critical)"));
            }
        }
        Ok(p)
    }

    /// One whole GPU of `model` for an hour.
    pub fn gpu_hour(&self, model: &str) -> f64 {
        let m = model.to_ascii_lowercase();
        self.models
            .iter()
            .filter(|(k, _)| m.contains(&k.to_ascii_lowercase()))
            .max_by_key(|(k, _)| k.len())
            .map_or(self.default_gpu_hour, |(_, &v)| v)
    }

    pub fn qos_multiplier(&self, qos: &str) -> f64 {
        self.qos.get(qos).copied().unwrap_or(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_matching_model_key_wins() {
        let p = Prices::default();
        assert_eq!(p.gpu_hour("NVIDIA H100 80GB HBM3"), 2.5);
        assert_eq!(p.gpu_hour("NVIDIA L40S"), 1.0);
        assert_eq!(p.gpu_hour("NVIDIA L4"), 0.7);
        assert_eq!(p.gpu_hour("gpufuse emulated GPU"), 0.1);
        assert_eq!(p.gpu_hour("Some Other GPU"), 2.0);
    }

    #[test]
    fn a_file_overrides_what_it_names_and_keeps_the_rest() {
        let p = Prices::parse("default_gpu_hour = 3.0\n[models]\n\"RTX 4090\" = 0.4\n").unwrap();
        assert_eq!(p.gpu_hour("NVIDIA GeForce RTX 4090"), 0.4);
        assert_eq!(p.gpu_hour("unknown"), 3.0);
        assert_eq!(p.qos_multiplier("high"), 1.3);
    }

    #[test]
    fn unknown_keys_and_bad_prices_are_errors_naming_them() {
        let e = Prices::parse("gpu_hours = 1").unwrap_err();
        assert!(e.contains("gpu_hours"), "{e}");
        let e = Prices::parse("[qos]\nurgent = 2").unwrap_err();
        assert!(e.contains("urgent"), "{e}");
        let e = Prices::parse("[models]\nA100 = -1").unwrap_err();
        assert!(e.contains("A100"), "{e}");
    }
}
