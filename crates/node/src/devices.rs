//! `--devices auto|emu:N[:SIZE][:sm_XX]|cuda`.

use std::str::FromStr;

use gpufuse_device::model;
use gpufuse_proto::DeviceKind;

use crate::DeviceState;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    /// NVIDIA GPUs when a driver and a GPU are present, otherwise one emulated GPU.
    Auto,
    /// `count` emulated GPUs of `size` bytes, of the model with compute capability `arch`
    /// (`100` for sm_100: `gpufuse_device::model::MODELS`).
    Emulated { count: u32, size: u64, arch: u32 },
    /// NVIDIA GPUs through the driver; an error without one.
    Cuda,
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceSpecError {
    #[error(
        "bad --devices {0:?}: expected auto, cuda or emu:N[:SIZE][:MODEL] (e.g. emu:2:16GiB or \
         emu:1:16GiB:sm_120; models: {models})",
        models = model::arch_list()
    )]
    Bad(String),
    #[error("--devices cuda: {0}")]
    NoDriver(gpufuse_cuda_driver::DriverError),
    #[error("--devices cuda: NVIDIA's driver is present but reports no GPU")]
    NoGpu,
}

const DEFAULT_SIZE: u64 = 16 << 30;

/// The sizes [`parse_size`] accepts, for error messages.
pub const SIZE_FORMS: &str =
    "a number of bytes with an optional unit B, KiB (K, KB), MiB (M, MB), \
GiB (G, GB) or TiB (T, TB), all powers of 1024, e.g. 4GiB, 1.5GiB, 512MiB or 1000000";

/// Parses `16GiB`, `1.5GiB`, `512MiB`, `2G`, `1000000` (units are powers of 1024; a fraction
/// of a byte is dropped).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() || frac.len() > 9 || (num.contains('.') && frac.is_empty()) {
        return None;
    }
    let int: u64 = int.parse().ok()?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    let frac_bytes = if frac.is_empty() {
        0
    } else {
        let digits: u128 = frac.parse().ok()?;
        digits * u128::from(mult) / 10u128.pow(frac.len() as u32)
    };
    u64::try_from(u128::from(int) * u128::from(mult) + frac_bytes).ok()
}

impl FromStr for DeviceSpec {
    type Err = DeviceSpecError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || DeviceSpecError::Bad(s.to_string());
        match s {
            "auto" => Ok(DeviceSpec::Auto),
            "cuda" => Ok(DeviceSpec::Cuda),
            _ => {
                let rest = s.strip_prefix("emu").ok_or_else(bad)?;
                let mut parts = rest
                    .trim_start_matches(':')
                    .split(':')
                    .filter(|p| !p.is_empty());
                let count = parts
                    .next()
                    .map_or(Some(1), |c| c.parse().ok())
                    .ok_or_else(bad)?;
                let (mut size, mut arch) = (None, None);
                for part in parts {
                    match part.strip_prefix("sm_") {
                        Some(sm) if arch.is_none() => {
                            let sm = sm.parse().ok().filter(|&sm| model::by_arch(sm).is_some());
                            arch = Some(sm.ok_or_else(bad)?);
                        }
                        None if size.is_none() && arch.is_none() => {
                            size = Some(parse_size(part).ok_or_else(bad)?);
                        }
                        _ => return Err(bad()),
                    }
                }
                let size = size.unwrap_or(DEFAULT_SIZE);
                let arch = arch.unwrap_or(model::default_model().arch());
                if count == 0 || count > 16 || size == 0 {
                    return Err(bad());
                }
                Ok(DeviceSpec::Emulated { count, size, arch })
            }
        }
    }
}

fn emulated(count: u32, size: u64, arch: u32) -> Vec<DeviceState> {
    let m = model::by_arch(arch).unwrap_or(model::default_model());
    (0..count)
        .map(|i| DeviceState {
            name: model::NAME.to_string(),
            kind: DeviceKind::Emulated,
            total: size,
            used: 0,
            promised: 0,
            uuid: model::uuid(i),
            pci: model::pci(i),
            peak_tflops: model::peak_tflops(m),
            compute_capability: (m.cc.0 as u32, m.cc.1 as u32),
        })
        .collect()
}

impl DeviceSpec {
    /// The devices to serve, and notes for the log and `gpufuse status`.
    pub fn resolve(&self) -> Result<(Vec<DeviceState>, Vec<String>), DeviceSpecError> {
        match self {
            DeviceSpec::Emulated { count, size, arch } => {
                Ok((emulated(*count, *size, *arch), vec![]))
            }
            DeviceSpec::Cuda => {
                let d = gpufuse_cuda_driver::Driver::load().map_err(DeviceSpecError::NoDriver)?;
                let gpus = real_gpus(&d);
                if gpus.is_empty() {
                    return Err(DeviceSpecError::NoGpu);
                }
                Ok((gpus, vec![]))
            }
            DeviceSpec::Auto => {
                let why = match gpufuse_cuda_driver::Driver::load() {
                    Err(e) => format!("no NVIDIA GPU available ({e})"),
                    Ok(d) => {
                        let gpus = real_gpus(&d);
                        if !gpus.is_empty() {
                            return Ok((gpus, vec![]));
                        }
                        "NVIDIA's driver reports no GPU".to_string()
                    }
                };
                Ok((
                    emulated(1, DEFAULT_SIZE, model::default_model().arch()),
                    vec![format!(
                        "devices auto: {why}; serving one emulated GPU of 16 GiB"
                    )],
                ))
            }
        }
    }
}

/// Every GPU the driver can open, described for the node's ledger.
fn real_gpus(d: &gpufuse_cuda_driver::Driver) -> Vec<DeviceState> {
    let n = d.device_count().unwrap_or(0).max(0);
    (0..n)
        .filter_map(|i| {
            let dev = d.device(i).ok()?;
            let attr = |a| d.attribute(dev, a).unwrap_or(0) as u32;
            Some(DeviceState {
                name: d.device_name(dev).ok()?,
                kind: DeviceKind::Cuda,
                total: d.total_mem(dev).ok()?,
                used: 0,
                promised: 0,
                uuid: d.uuid(dev).ok()?,
                pci: (attr(50), attr(33), attr(34)),
                peak_tflops: model::fp32_tflops(
                    attr(16) as i32,
                    attr(13) as i32,
                    (attr(75) as i32, attr(76) as i32),
                ),
                compute_capability: (attr(75), attr(76)),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        assert_eq!(
            "emu:2:16GiB".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Emulated {
                count: 2,
                size: 16 << 30,
                arch: 100,
            }
        );
        assert_eq!(
            "emu:1".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Emulated {
                count: 1,
                size: 16 << 30,
                arch: 100,
            }
        );
        assert_eq!(
            "emu".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Emulated {
                count: 1,
                size: 16 << 30,
                arch: 100,
            }
        );
        assert_eq!("auto".parse::<DeviceSpec>().unwrap(), DeviceSpec::Auto);
        assert_eq!(
            "emu:1:8GiB:sm_120".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Emulated {
                count: 1,
                size: 8 << 30,
                arch: 120,
            }
        );
        assert_eq!(
            "emu:2:sm_90".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Emulated {
                count: 2,
                size: 16 << 30,
                arch: 90,
            }
        );
        let (devices, _) = "emu:1:1GiB:sm_120"
            .parse::<DeviceSpec>()
            .unwrap()
            .resolve()
            .unwrap();
        assert_eq!(devices[0].compute_capability, (12, 0));
        let err = "emu:1:1G:sm_75"
            .parse::<DeviceSpec>()
            .unwrap_err()
            .to_string();
        assert!(err.contains("sm_120"), "the error lists the models: {err}");
        for bad in [
            "emu:0",
            "emu:x",
            "emu:1:lots",
            "gpu",
            "emu:1:1G:3",
            "emu:1:1G:sm_75",
            "emu:1:sm_100:1G",
            "emu:1:1G:sm_100:sm_90",
        ] {
            assert!(bad.parse::<DeviceSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("1000000"), Some(1_000_000));
        assert_eq!(parse_size("12 parsecs"), None);
        assert_eq!(parse_size("1.5GiB"), Some(3 << 29));
        assert_eq!(parse_size("0.5 MiB"), Some(1 << 19));
        assert_eq!(parse_size("1.25k"), Some(1280));
        assert_eq!(parse_size("2.7"), Some(2));
        for bad in [
            "abc",
            "",
            ".5G",
            "1.G",
            "1..5G",
            "1.5.2G",
            "1.0000000001G",
            "99999999TiB",
        ] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }

    #[test]
    fn cuda_without_a_driver_names_the_driver() {
        if let Err(e) = DeviceSpec::Cuda.resolve() {
            let msg = e.to_string();
            assert!(
                msg.contains("libcuda.so.1") || msg.contains("GPU") || msg.contains("backend"),
                "{msg}"
            );
        }
    }
}
