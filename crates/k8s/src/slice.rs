//! What the driver publishes: one `ResourceSlice` per node (`resource.k8s.io/v1`) with one
//! device per GPU that several claims may share (`allowMultipleAllocations`, KEP-5075
//! consumable capacity), and the `DeviceClass` claims name.
//!
//! Each device has two capacities with a request policy, so the scheduler hands out slices:
//! `memory` (bytes, in steps of 1 MiB, at least 1 MiB) and `compute` (percent, 1 to 100). A
//! request that names no capacity gets the whole device (the policies' default), which is
//! what `gpufuse.dev/gpu: 1` through the class's extended resource name means.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute,
    DeviceCapacity, DeviceClass, DeviceClassSpec, DeviceSelector, ResourcePool, ResourceSlice,
    ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};

use crate::inventory::{Gpu, DRIVER_VERSION};
use crate::quantity;
use crate::DRIVER_NAME;

/// The capacity that holds a slice's memory, in bytes.
pub const MEMORY: &str = "memory";
/// The capacity that holds a slice's compute share, in percent.
pub const COMPUTE: &str = "compute";
/// The smallest memory slice and the granularity of slices.
pub const MEMORY_STEP: u64 = 1 << 20;
/// The device class claims name, and its extended resource name.
pub const DEVICE_CLASS: &str = "gpu.gpufuse.dev";
pub const EXTENDED_RESOURCE: &str = "gpufuse.dev/gpu";

/// The name of a node's slice.
pub fn slice_name(node: &str) -> String {
    format!("{node}-{DRIVER_NAME}")
}

fn string(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.to_string()),
        ..Default::default()
    }
}

fn version(v: &str) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(v.to_string()),
        ..Default::default()
    }
}

/// A GPU as a device of the slice.
pub fn device(gpu: &Gpu) -> Device {
    let (major, minor) = gpu.compute_capability;
    let attributes = BTreeMap::from([
        ("model".to_string(), string(&gpu.model)),
        ("uuid".to_string(), string(&gpu.uuid)),
        (
            "computeCapability".to_string(),
            version(&format!("{major}.{minor}.0")),
        ),
        ("driverVersion".to_string(), version(DRIVER_VERSION)),
        (
            "index".to_string(),
            DeviceAttribute {
                int: Some(i64::from(gpu.index)),
                ..Default::default()
            },
        ),
        (
            "gpufuse.dev/emulated".to_string(),
            DeviceAttribute {
                bool: Some(gpu.emulated),
                ..Default::default()
            },
        ),
    ]);
    let whole = gpu.memory_bytes - gpu.memory_bytes % MEMORY_STEP;
    let capacity = BTreeMap::from([
        (
            MEMORY.to_string(),
            DeviceCapacity {
                value: quantity::bytes(whole),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(quantity::bytes(whole)),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: quantity::bytes(MEMORY_STEP),
                        max: Some(quantity::bytes(whole)),
                        step: Some(quantity::bytes(MEMORY_STEP)),
                    }),
                    valid_values: None,
                }),
            },
        ),
        (
            COMPUTE.to_string(),
            DeviceCapacity {
                value: quantity::plain(100),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(quantity::plain(100)),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: quantity::plain(1),
                        max: Some(quantity::plain(100)),
                        step: Some(quantity::plain(1)),
                    }),
                    valid_values: None,
                }),
            },
        ),
    ]);
    Device {
        name: gpu.name.clone(),
        allow_multiple_allocations: Some(true),
        attributes: Some(attributes),
        capacity: Some(capacity),
        ..Default::default()
    }
}

/// The node's slice. `generation` grows with each change of the node's devices.
pub fn resource_slice(node: &str, gpus: &[Gpu], generation: i64) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(node)),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "gpufuse".to_string(),
            )])),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER_NAME.into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(gpus.iter().map(device).collect()),
            ..Default::default()
        },
    }
}

/// The class claims name: every device of the driver, and `gpufuse.dev/gpu` as its extended
/// resource (a container asking for `gpufuse.dev/gpu: 1` gets a claim for a whole device).
pub fn device_class() -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta {
            name: Some(DEVICE_CLASS.into()),
            ..Default::default()
        },
        spec: DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: format!("device.driver == \"{DRIVER_NAME}\""),
                }),
            }]),
            extended_resource_name: Some(EXTENDED_RESOURCE.into()),
            config: None,
        },
    }
}

/// The device class as YAML (`gpufuse operator device-class`).
pub fn device_class_yaml() -> String {
    serde_saphyr::to_string(&device_class()).expect("a DeviceClass serializes to YAML")
}

/// Creates the node's slice or replaces what is published when it differs. Returns whether it
/// wrote anything.
pub async fn publish(client: &kube::Client, slice: &ResourceSlice) -> kube::Result<bool> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let name = slice.metadata.name.clone().unwrap_or_default();
    match api.get_opt(&name).await? {
        None => {
            api.create(&PostParams::default(), slice).await?;
            Ok(true)
        }
        Some(old) if same_devices(&old.spec, &slice.spec) => Ok(false),
        Some(old) => {
            let mut new = slice.clone();
            new.metadata.resource_version = old.metadata.resource_version;
            new.spec.pool.generation = old.spec.pool.generation + 1;
            api.replace(&name, &PostParams::default(), &new).await?;
            Ok(true)
        }
    }
}

/// Whether two slices publish the same thing (the pool's generation aside).
fn same_devices(a: &ResourceSliceSpec, b: &ResourceSliceSpec) -> bool {
    let mut b = b.clone();
    b.pool.generation = a.pool.generation;
    *a == b
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn gpu() -> Gpu {
        Gpu {
            index: 0,
            name: "gpu-0".into(),
            model: "gpufuse emulated B200".into(),
            uuid: "GPU-00112233-4455-6677-8899-aabbccddeeff".into(),
            compute_capability: (10, 0),
            memory_bytes: (16 << 30) + 123,
            emulated: true,
        }
    }

    #[test]
    fn slice_has_one_shareable_device_per_gpu_with_memory_and_compute_capacity() {
        let s = resource_slice("node-a", &[gpu()], 1);
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(v["kind"], "ResourceSlice");
        assert_eq!(v["spec"]["driver"], "gpu.gpufuse.dev");
        assert_eq!(v["spec"]["nodeName"], "node-a");
        assert_eq!(v["spec"]["pool"]["resourceSliceCount"], 1);
        let d = &v["spec"]["devices"][0];
        assert_eq!(d["name"], "gpu-0");
        assert_eq!(d["allowMultipleAllocations"], true);
        assert_eq!(d["capacity"]["memory"]["value"], "16Gi");
        let mem = &d["capacity"]["memory"]["requestPolicy"]["validRange"];
        assert_eq!(mem["min"], "1Mi");
        assert_eq!(mem["step"], "1Mi");
        let compute = &d["capacity"]["compute"];
        assert_eq!(compute["value"], "100");
        assert_eq!(compute["requestPolicy"]["validRange"]["step"], "1");
        assert_eq!(d["attributes"]["model"]["string"], "gpufuse emulated B200");
        assert_eq!(
            d["attributes"]["uuid"]["string"],
            "GPU-00112233-4455-6677-8899-aabbccddeeff"
        );
        assert_eq!(d["attributes"]["computeCapability"]["version"], "10.0.0");
        assert_eq!(d["attributes"]["driverVersion"]["version"], DRIVER_VERSION);
        assert_eq!(d["attributes"]["gpufuse.dev/emulated"]["bool"], true);
    }

    /// The chart's hand-written DeviceClass (deploy/helm/gpufuse/templates/deviceclass.yaml)
    /// is the one `device_class()` makes (`gpufuse operator device-class`): its name, driver
    /// selector and extended resource, Helm's lines (the `if`, the labels) aside.
    #[test]
    fn the_charts_device_class_is_device_class() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/helm/gpufuse/templates/deviceclass.yaml");
        let template = std::fs::read_to_string(&path).unwrap();
        let plain: String = template
            .lines()
            .filter(|l| !l.contains("{{"))
            .map(|l| format!("{l}\n"))
            .collect();
        let chart: serde_json::Value = serde_saphyr::from_str(&plain).unwrap();
        let ours = serde_json::to_value(device_class()).unwrap();
        for key in ["apiVersion", "kind", "spec"] {
            assert_eq!(
                chart[key],
                ours[key],
                "{}: {key} is not what slice::device_class() makes",
                path.display()
            );
        }
        assert_eq!(chart["metadata"]["name"], ours["metadata"]["name"]);
    }

    #[test]
    fn device_class_selects_the_driver_and_names_the_extended_resource() {
        let v = serde_json::to_value(device_class()).unwrap();
        assert_eq!(v["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(v["spec"]["extendedResourceName"], "gpufuse.dev/gpu");
        assert_eq!(
            v["spec"]["selectors"][0]["cel"]["expression"],
            "device.driver == \"gpu.gpufuse.dev\""
        );
    }
}
