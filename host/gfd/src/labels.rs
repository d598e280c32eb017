//! The label catalogue of upstream GFD (reference `device-plugin.md` §5.3), computed from a GPU
//! inventory snapshot and the device-plugin config. Pure: no IO.

use std::collections::BTreeMap;

use kiln_device_plugin::config::{GPU_RESOURCE, MigStrategy, Sharing, SharingStrategy};
use kiln_gpu::{GpuDevice, SystemInfo};

use crate::{GfdError, mig};

/// Every label key starts with this.
pub const PREFIX: &str = "nvidia.com/";

/// Node labels, key → value, sorted by key.
pub type Labels = BTreeMap<String, String>;

/// What the labels are computed from, besides the GPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelInput {
    /// `flags.migStrategy` (or `--mig-strategy`).
    pub mig_strategy: MigStrategy,
    /// The active sharing of the device-plugin config ([`kiln_device_plugin::config::Config::sharing`]).
    pub sharing: Sharing,
    /// `gfd.timestamp` value in Unix seconds; `None` with `noTimestamp`.
    pub timestamp: Option<u64>,
    /// Raw content of the machine-type file (`/sys/class/dmi/id/product_name`), `None` when
    /// unreadable.
    pub machine: Option<String>,
    /// `gpu.mode` per GPU, in index order (from the PCI class); missing entries are unknown.
    pub pci_modes: Vec<GpuMode>,
    /// MIG device memory in MiB by MIG UUID, where the inventory knows it.
    pub mig_memory_mib: BTreeMap<String, u64>,
}

/// A GPU's PCI display class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuMode {
    /// Class 0x0302 (3D controller).
    Compute,
    /// Class 0x0300 (VGA controller).
    Graphics,
    /// Not readable or another class.
    Unknown,
}

/// Upstream's name cleaning (product and machine): keep `[A-Za-z0-9-_. ]`, trim, turn each run
/// of spaces into `-`. `NVIDIA H100 80GB HBM3` → `NVIDIA-H100-80GB-HBM3`.
#[must_use]
pub fn clean_name(raw: &str) -> String {
    let kept: String = raw
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ' '))
        .collect();
    kept.split_whitespace().collect::<Vec<_>>().join("-")
}

/// The architecture family of a compute capability (upstream's table, v0.18+):
/// 1 tesla, 2 fermi, 3 kepler, 5 maxwell, 6 pascal, 7.0–7.4 volta, 7.5+ turing,
/// 8.0–8.8 ampere, 8.9 ada-lovelace, 9 hopper, 10 and 12 blackwell, else `undefined`.
#[must_use]
pub fn family(major: u32, minor: u32) -> &'static str {
    match (major, minor) {
        (1, _) => "tesla",
        (2, _) => "fermi",
        (3, _) => "kepler",
        (5, _) => "maxwell",
        (6, _) => "pascal",
        (7, m) if m < 5 => "volta",
        (7, _) => "turing",
        (8, m) if m < 9 => "ampere",
        (8, _) => "ada-lovelace",
        (9, _) => "hopper",
        (10 | 12, _) => "blackwell",
        _ => "undefined",
    }
}

/// All labels for one snapshot, each valid for the API server: values computed from hardware
/// strings pass through [`expressible`] (sanitised, or left out with a warning).
///
/// # Errors
/// [`GfdError::DriverVersion`] when the driver version is not `X.Y[.Z]`;
/// [`GfdError::MpsWithMig`] when MPS sharing is configured and a GPU has MIG on (upstream's
/// labeler error).
pub fn make_labels(
    system: &SystemInfo,
    gpus: &[GpuDevice],
    input: &LabelInput,
) -> Result<Labels, GfdError> {
    raw_labels(system, gpus, input).map(expressible)
}

/// `labels` with every key and value valid for the API server (Kubernetes label syntax,
/// [`kiln_input::k8s`]): a value outside it is sanitised
/// ([`kiln_input::k8s::sanitize_label_value`]: invalid characters to `-`, at most 63
/// characters, alphanumeric at both ends; a warning names the label). A label whose key is
/// invalid (MIG keys are built from raw profile names) or whose value has nothing expressible
/// left is left out, with a warning naming it — one bad label must not make the API server
/// refuse the whole patch.
#[must_use]
pub fn expressible(labels: Labels) -> Labels {
    use kiln_input::k8s::{is_label_key, sanitize_label_value};
    let shown = |s: &str| {
        s.chars()
            .take(80)
            .collect::<String>()
            .escape_debug()
            .to_string()
    };
    labels
        .into_iter()
        .filter_map(|(key, value)| {
            if !is_label_key(&key) {
                tracing::warn!(label = %shown(&key), "label key is not a valid Kubernetes label key; not labelled");
                return None;
            }
            match sanitize_label_value(&value) {
                Some(v) if v == value => Some((key, value)),
                Some(v) => {
                    tracing::warn!(label = %key, from = %shown(&value), to = %v, "label value sanitised to the Kubernetes label syntax");
                    Some((key, v))
                }
                None => {
                    tracing::warn!(label = %key, value = %shown(&value), "label value cannot be expressed as a Kubernetes label value; not labelled");
                    None
                }
            }
        })
        .collect()
}

fn raw_labels(
    system: &SystemInfo,
    gpus: &[GpuDevice],
    input: &LabelInput,
) -> Result<Labels, GfdError> {
    let mut l = Labels::new();
    let mut put = |k: &str, v: String| {
        l.insert(format!("{PREFIX}{k}"), v);
    };
    if let Some(ts) = input.timestamp {
        put("gfd.timestamp", ts.to_string());
    }
    // Upstream's vGPU labeler runs beside the device labeler, GPUs or not.
    vgpu_labels(gpus, &mut put);
    if gpus.is_empty() {
        return Ok(l);
    }
    if let Some(clique) = clique_label(gpus) {
        put("gpu.clique", clique);
    }
    driver_labels(&system.driver_version, &mut put)?;
    cuda_labels(&system.cuda_version, &mut put);
    put(
        "gpu.machine",
        input
            .machine
            .as_deref()
            .map(clean_name)
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| "unknown".into()),
    );
    put(
        "mig.capable",
        gpus.iter().any(|g| g.mig_enabled.is_some()).to_string(),
    );
    let mps = input.sharing.strategy == SharingStrategy::Mps;
    if mps && let Some(g) = gpus.iter().find(|g| g.mig_enabled == Some(true)) {
        return Err(GfdError::MpsWithMig { index: g.index });
    }
    put("mps.capable", mps.to_string());
    put("gpu.mode", mode_label(gpus, &input.pci_modes).into());
    match input.mig_strategy {
        MigStrategy::None => full_gpu_labels(gpus.iter(), &input.sharing, &mut l),
        MigStrategy::Single => {
            l.insert(format!("{PREFIX}mig.strategy"), "single".into());
            if gpus.iter().all(|g| g.mig_enabled != Some(true)) {
                full_gpu_labels(gpus.iter(), &input.sharing, &mut l);
            } else {
                mig::single_labels(gpus, input, &mut l);
            }
        }
        MigStrategy::Mixed => {
            l.insert(format!("{PREFIX}mig.strategy"), "mixed".into());
            full_gpu_labels(
                gpus.iter().filter(|g| g.mig_enabled != Some(true)),
                &input.sharing,
                &mut l,
            );
            mig::mixed_labels(gpus, input, &mut l);
        }
    }
    Ok(l)
}

/// `vgpu.present` (any GPU a vGPU seen from a virtual machine) and, from the last such GPU
/// whose PCI capability names them, `vgpu.host-driver-version` / `vgpu.host-driver-branch`
/// (upstream's vGPU labeler: the last device wins).
fn vgpu_labels(gpus: &[GpuDevice], put: &mut impl FnMut(&str, String)) {
    put(
        "vgpu.present",
        gpus.iter().any(|g| g.vgpu.is_some()).to_string(),
    );
    if let Some(v) = gpus.iter().rev().find_map(|g| g.vgpu.as_ref()) {
        if let Some(version) = &v.host_driver_version {
            put("vgpu.host-driver-version", version.clone());
        }
        if let Some(branch) = &v.host_driver_branch {
            put("vgpu.host-driver-branch", branch.clone());
        }
    }
}

/// `gpu.clique`: `<cluster UUID>.<clique id>` when every GPU registered in a multi-node NVLink
/// fabric names the same cluster and clique (upstream's IMEX labeler); `None` when no GPU is,
/// or, with a warning, when they disagree.
fn clique_label(gpus: &[GpuDevice]) -> Option<String> {
    use std::collections::BTreeSet;
    let cliques: Vec<&kiln_gpu::Clique> = gpus.iter().filter_map(|g| g.clique.as_ref()).collect();
    let clusters: BTreeSet<&str> = cliques.iter().map(|c| c.cluster_uuid.as_str()).collect();
    let ids: BTreeSet<u32> = cliques.iter().map(|c| c.clique_id).collect();
    if clusters.len() > 1 || ids.len() > 1 {
        tracing::warn!(
            ?clusters,
            ?ids,
            "GPUs in different NVLink clusters or cliques: gpu.clique not labelled"
        );
        return None;
    }
    Some(format!("{}.{}", clusters.first()?, ids.first()?))
}

fn driver_labels(version: &str, put: &mut impl FnMut(&str, String)) -> Result<(), GfdError> {
    let parts: Vec<&str> = version.split('.').collect();
    let numeric = parts
        .iter()
        .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()));
    if !(2..=3).contains(&parts.len()) || !numeric {
        return Err(GfdError::DriverVersion(version.to_owned()));
    }
    let rev = parts.get(2).copied().unwrap_or("").to_owned();
    put("cuda.driver.major", parts[0].into());
    put("cuda.driver.minor", parts[1].into());
    put("cuda.driver.rev", rev.clone());
    put("cuda.driver-version.major", parts[0].into());
    put("cuda.driver-version.minor", parts[1].into());
    put("cuda.driver-version.revision", rev);
    put("cuda.driver-version.full", version.into());
    Ok(())
}

/// `cuda_version` is NVML's CUDA driver API version as `M.m` (upstream labels it "runtime").
fn cuda_labels(cuda: &str, put: &mut impl FnMut(&str, String)) {
    let (major, minor) = cuda.split_once('.').unwrap_or((cuda, "0"));
    put("cuda.runtime.major", major.into());
    put("cuda.runtime.minor", minor.into());
    put("cuda.runtime-version.major", major.into());
    put("cuda.runtime-version.minor", minor.into());
    put("cuda.runtime-version.full", format!("{major}.{minor}"));
}

fn mode_label(gpus: &[GpuDevice], modes: &[GpuMode]) -> &'static str {
    let mut seen = (0..gpus.len()).map(|i| modes.get(i).copied().unwrap_or(GpuMode::Unknown));
    let first = seen.next().unwrap_or(GpuMode::Unknown);
    if seen.any(|m| m != first) {
        return "unknown";
    }
    match first {
        GpuMode::Compute => "compute",
        GpuMode::Graphics => "graphics",
        GpuMode::Unknown => "unknown",
    }
}

/// `<base>` with `-SHARED` appended when the resource is shared (replicas > 1) under its own
/// name; a renamed resource (`<name>.shared`) keeps the plain product name (upstream rule).
pub(crate) fn shared_product(base: String, sharing: &Sharing, resource: &str) -> String {
    match sharing.get(resource) {
        Some(r) if r.replicas > 1 && !r.is_renamed() => format!("{base}-SHARED"),
        _ => base,
    }
}

/// The replicas / sharing-strategy pair of a resource.
pub(crate) fn sharing_labels(sharing: &Sharing, resource: &str) -> (String, String) {
    let replicas = sharing.replicas(resource);
    let strategy = if replicas > 1 {
        sharing.strategy_for(resource)
    } else {
        SharingStrategy::None
    };
    (replicas.to_string(), strategy.as_str().to_owned())
}

/// `nvidia.com/gpu.*` for full GPUs. GPUs are grouped by model in index order; with several
/// models each writes the same keys and the last model wins, as upstream (a warning is
/// logged). MIG-enabled GPUs count but advertise 0 replicas (upstream's full-GPU labeler).
fn full_gpu_labels<'a>(
    gpus: impl Iterator<Item = &'a GpuDevice>,
    sharing: &Sharing,
    l: &mut Labels,
) {
    let mut models: Vec<(&str, Vec<&GpuDevice>)> = Vec::new();
    for g in gpus {
        match models.iter_mut().find(|(n, _)| *n == g.name) {
            Some((_, v)) => v.push(g),
            None => models.push((&g.name, vec![g])),
        }
    }
    if models.len() > 1 {
        tracing::warn!(
            models = ?models.iter().map(|m| m.0).collect::<Vec<_>>(),
            "Multiple device types detected; the last model's gpu.* labels win"
        );
    }
    let Some((name, devs)) = models.last() else {
        return;
    };
    let g = devs[0];
    let mut put = |k: &str, v: String| {
        l.insert(format!("{PREFIX}gpu.{k}"), v);
    };
    put(
        "product",
        shared_product(clean_name(name), sharing, GPU_RESOURCE),
    );
    put("count", devs.len().to_string());
    let (replicas, strategy) = sharing_labels(sharing, GPU_RESOURCE);
    let replicas = if g.mig_enabled == Some(true) {
        "0".into()
    } else {
        replicas
    };
    put("replicas", replicas);
    put("sharing-strategy", strategy);
    let mib = g.memory_total_bytes >> 20;
    if mib > 0 {
        put("memory", mib.to_string());
    }
    compute_labels(g, &mut put);
}

/// `family`, `compute.major`, `compute.minor`; omitted when the major is 0.
pub(crate) fn compute_labels(g: &GpuDevice, put: &mut impl FnMut(&str, String)) {
    let (major, minor) = g.compute_capability;
    if major == 0 {
        return;
    }
    put("family", family(major, minor).into());
    put("compute.major", major.to_string());
    put("compute.minor", minor.to_string());
}
