//! Device ids as device plugins hand them to the kubelet, and which resource names count as GPUs.
//!
//! Follows dcgm-exporter's pod mapper (reference §3.2, §3.4) for the id shapes, and widens its
//! resource list with `nvidia.com/gpu.shared` (its issue #151).

/// What a pod-resources device id points at, before it is resolved against the node's GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceRef {
    /// A whole GPU by UUID: `GPU-<uuid>`, or a time-slicing/MPS replica `GPU-<uuid>::<n>`.
    GpuUuid {
        /// `GPU-<uuid>`, without the replica suffix.
        uuid: String,
        /// The replica number after `::`, if any.
        replica: Option<u32>,
    },
    /// A MIG device by its own UUID: `MIG-<uuid>` or `MIG-<uuid>::<n>`; the parent GPU is found
    /// through the inventory's MIG devices.
    MigUuid {
        /// `MIG-<uuid>`, without the replica suffix.
        uuid: String,
        /// The replica number after `::`, if any (EKS reports shared MIG devices so).
        replica: Option<u32>,
    },
    /// A MIG device in the pre-R470 form `MIG-GPU-<uuid>/<gi>/<ci>`.
    MigOfGpu {
        /// The parent `GPU-<uuid>`.
        gpu_uuid: String,
        /// GPU-instance id.
        gpu_instance: u32,
    },
    /// A GPU by NVML index: `nvidia<N>`, `<N>`, GKE's `nvidia<N>/vgpu<K>` (time-sharing) or
    /// `nvidia<N>/gi<G>[/vgpu<K>]` (MIG).
    Index {
        /// NVML index.
        index: u32,
        /// GPU-instance id for the MIG form.
        gpu_instance: Option<u32>,
        /// The `vgpu` replica, if any.
        replica: Option<u32>,
    },
}

impl DeviceRef {
    /// The shared-GPU replica the id names (`::<n>` or GKE's `/vgpu<n>`): dcgm-exporter's
    /// `vgpu` label in virtual-GPU mode (its `getSharedGPU`); `None` for an unshared device.
    #[must_use]
    pub fn replica(&self) -> Option<u32> {
        match self {
            Self::GpuUuid { replica, .. }
            | Self::MigUuid { replica, .. }
            | Self::Index { replica, .. } => *replica,
            Self::MigOfGpu { .. } => None,
        }
    }
}

/// Parses one device id; `None` for shapes that name no NVIDIA GPU.
#[must_use]
pub fn parse_device_id(id: &str) -> Option<DeviceRef> {
    let id = id.trim();
    if let Some(rest) = id.strip_prefix("MIG-GPU-") {
        let mut parts = rest.split('/');
        let uuid = parts.next()?;
        let gpu_instance = parts.next()?.parse().ok()?;
        return Some(DeviceRef::MigOfGpu {
            gpu_uuid: format!("GPU-{uuid}"),
            gpu_instance,
        });
    }
    if id.starts_with("MIG-") {
        let (uuid, replica) = split_replica(id)?;
        return Some(DeviceRef::MigUuid {
            uuid: uuid.to_owned(),
            replica,
        });
    }
    if id.starts_with("GPU-") {
        let (uuid, replica) = split_replica(id)?;
        return Some(DeviceRef::GpuUuid {
            uuid: uuid.to_owned(),
            replica,
        });
    }
    parse_index_form(id)
}

/// `X` or `X::N` → (`X`, N); `None` when the suffix is not a number or `X` is too short.
fn split_replica(id: &str) -> Option<(&str, Option<u32>)> {
    let (base, replica) = match id.split_once("::") {
        Some((base, n)) => (base, Some(n.parse().ok()?)),
        None => (id, None),
    };
    (base.len() > 4).then_some((base, replica))
}

fn parse_index_form(id: &str) -> Option<DeviceRef> {
    let mut parts = id.split('/');
    let head = parts.next()?;
    let index = head.strip_prefix("nvidia").unwrap_or(head).parse().ok()?;
    let (mut gpu_instance, mut replica) = (None, None);
    for part in parts {
        if let Some(g) = part.strip_prefix("gi") {
            gpu_instance = Some(g.parse().ok()?);
        } else if let Some(k) = part.strip_prefix("vgpu") {
            replica = Some(k.parse().ok()?);
        } else {
            return None;
        }
    }
    Some(DeviceRef::Index {
        index,
        gpu_instance,
        replica,
    })
}

/// Whether a pod-resources `resource_name` is an NVIDIA GPU resource: `nvidia.com/gpu`,
/// `nvidia.com/gpu.shared` (time-slicing with `renameByDefault`), any `nvidia.com/mig-*`, or
/// one of the `extra` names (`--nvidia-resource-names`).
#[must_use]
pub fn is_gpu_resource(name: &str, extra: &[String]) -> bool {
    matches!(name, "nvidia.com/gpu" | "nvidia.com/gpu.shared")
        || name.starts_with("nvidia.com/mig-")
        || extra.iter().any(|e| e == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: &str = "GPU-11111111-2222-3333-4444-555555555555";

    #[test]
    fn gpu_uuid_forms() {
        assert_eq!(
            parse_device_id(U),
            Some(DeviceRef::GpuUuid {
                uuid: U.into(),
                replica: None
            })
        );
        assert_eq!(
            parse_device_id(&format!("{U}::3")),
            Some(DeviceRef::GpuUuid {
                uuid: U.into(),
                replica: Some(3)
            })
        );
        assert_eq!(parse_device_id(&format!("{U}::x")), None);
        assert_eq!(parse_device_id("GPU-"), None);
    }

    #[test]
    fn mig_forms() {
        let m = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
        assert_eq!(
            parse_device_id(m),
            Some(DeviceRef::MigUuid {
                uuid: m.into(),
                replica: None
            })
        );
        let shared = parse_device_id(&format!("{m}::1")).unwrap();
        assert_eq!(
            shared,
            DeviceRef::MigUuid {
                uuid: m.into(),
                replica: Some(1)
            }
        );
        assert_eq!(shared.replica(), Some(1));
        assert_eq!(
            parse_device_id("MIG-GPU-11111111-2222-3333-4444-555555555555/3/0"),
            Some(DeviceRef::MigOfGpu {
                gpu_uuid: U.into(),
                gpu_instance: 3
            })
        );
        assert_eq!(parse_device_id("MIG-GPU-1111/x/0"), None);
    }

    #[test]
    fn index_forms() {
        let idx = |index, gpu_instance, replica| {
            Some(DeviceRef::Index {
                index,
                gpu_instance,
                replica,
            })
        };
        assert_eq!(parse_device_id("nvidia0"), idx(0, None, None));
        assert_eq!(parse_device_id("3"), idx(3, None, None));
        assert_eq!(parse_device_id("nvidia1/vgpu4"), idx(1, None, Some(4)));
        assert_eq!(parse_device_id("nvidia1/vgpu4").unwrap().replica(), Some(4));
        assert_eq!(parse_device_id("nvidia2/gi7"), idx(2, Some(7), None));
        assert_eq!(
            parse_device_id("nvidia2/gi7/vgpu1"),
            idx(2, Some(7), Some(1))
        );
        for bad in ["nvidiaX", "nvidia0/ci1", "amd0", "", "nvidia0/gi"] {
            assert_eq!(parse_device_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn resource_names() {
        let extra = vec!["example.com/gpu".to_owned()];
        for yes in [
            "nvidia.com/gpu",
            "nvidia.com/gpu.shared",
            "nvidia.com/mig-1g.10gb",
            "example.com/gpu",
        ] {
            assert!(is_gpu_resource(yes, &extra), "{yes}");
        }
        for no in ["nvidia.com/gpux", "amd.com/gpu", "cpu", "nvidia.com/mig"] {
            assert!(!is_gpu_resource(no, &extra), "{no}");
        }
    }
}
