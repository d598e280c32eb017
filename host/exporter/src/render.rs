//! Builds the GPU families of a scrape from a [`Snapshot`] and an [`Attribution`] (pure); the
//! encoders in [`crate::exposition`] write them.
//!
//! Layout follows dcgm-exporter (reference §1.2–1.3): families in ascending DCGM field id, GPUs
//! in index order, labels `gpu, UUID, pci_bus_id, device, modelName[, GPU_I_PROFILE, GPU_I_ID],
//! Hostname`, then the CSV's label fields by name, then the sample's attributes by name
//! (`container`, `err_code`, `mig_device_uuid`, `namespace`, `pod`). Samples NVML does not
//! provide are left out. kiln's own families follow: `kiln_gpu_pod_info` (one series per
//! container using each GPU, value 1) and `kiln_gpu_xid_errors_total` (XIDs per GPU and number),
//! and with process metrics on, `kiln_gpu_pod_fb_used_mib` / `kiln_gpu_pod_sm_util` (see
//! [`crate::process`]).
//!
//! # MIG
//! On a GPU with MIG on, a field NVML answers per MIG device (today the framebuffer fields) is
//! emitted once per MIG device instead of once for the GPU, as dcgm-exporter does for GPU
//! instances: `UUID` stays the parent's, `GPU_I_PROFILE` / `GPU_I_ID` name the instance (each
//! only when known: NVML through nvml-wrapper 0.13 gives the profile but not the instance id),
//! and `mig_device_uuid` carries the MIG device's own UUID, which keeps series apart when the
//! instance id is unknown. Pod labels come from the pods allocated that MIG device. Fields NVML
//! only answers for the whole GPU (clocks, temperature, power, …) stay on the GPU's series,
//! attributed to every pod on any of its MIG devices; dcgm-exporter instead repeats them on
//! every instance.

use kiln_gpu::{MigDevice, MigSample};
use prometheus::proto::{Metric, MetricFamily};

use crate::{
    attribution::{Attribution, PodRef},
    catalogue::{Catalogue, MetricType},
    exposition::{Kind, Labels, family, sample},
    fields::{Source, Value},
    process::PodUsage,
    snapshot::{GpuSnapshot, Snapshot},
};

/// Presentation choices that do not depend on the sample.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// `Hostname` label value; `None` leaves the label out (`--no-hostname`).
    pub hostname: Option<String>,
    /// Replace runs of blanks in `modelName` with `-` (`--replace-blanks-in-model-name`).
    pub replace_blanks_in_model_name: bool,
    /// One copy of each sample per container using the GPU (`--kubernetes-virtual-gpus`),
    /// instead of one series carrying the owner's labels.
    pub per_pod: bool,
}

/// Name of the info metric joining GPUs to every container that uses them.
pub const POD_INFO: &str = "kiln_gpu_pod_info";
/// Name of the XID counter.
pub const XID_TOTAL: &str = "kiln_gpu_xid_errors_total";
/// Label carrying a MIG device's own UUID on its series.
pub const MIG_UUID_LABEL: &str = "mig_device_uuid";

/// Every GPU family (DCGM fields, then kiln's) with at least one sample, in output order.
#[must_use]
pub fn render_gpus(
    catalogue: &Catalogue,
    snap: &Snapshot,
    attribution: &Attribution,
    opts: &RenderOptions,
) -> Vec<MetricFamily> {
    let ctx = Ctx {
        snap,
        cat: catalogue,
        opts,
        attribution,
    };
    let bases: Vec<Labels> = snap
        .gpus
        .iter()
        .map(|g| ctx.identity(g, None, true))
        .collect();
    let mut out = Vec::with_capacity(catalogue.metrics.len() + 4);
    for metric in &catalogue.metrics {
        let kind = match metric.kind {
            MetricType::Gauge => Kind::Gauge,
            MetricType::Counter => Kind::Counter,
        };
        let mut samples = Vec::new();
        for (gpu, base) in snap.gpus.iter().zip(&bases) {
            if let Source::Sample(get) = metric.field.source
                && gpu.mig.iter().any(|m| get(&m.sample).is_some())
            {
                for (dev, mig) in mig_pairs(gpu) {
                    if let Some(value) = get(&mig.sample) {
                        let base = ctx.identity(gpu, Some(dev), true);
                        let pods = attribution.mig_pods(&dev.uuid);
                        ctx.push(
                            &mut samples,
                            kind,
                            &base,
                            pods,
                            None,
                            Some(&dev.uuid),
                            value,
                        );
                    }
                }
                continue;
            }
            let Some(value) = field_value(metric.field.source, gpu) else {
                continue;
            };
            let err_code =
                matches!(metric.field.source, Source::LastXid).then(|| gpu.last_xid.to_string());
            let pods = attribution.pods(gpu.device.index);
            ctx.push(
                &mut samples,
                kind,
                base,
                pods,
                err_code.as_deref(),
                None,
                value,
            );
        }
        out.extend(family(metric.field.name, &metric.help, kind, samples));
    }
    out.extend(ctx.pod_info());
    out.extend(ctx.xids());
    out.extend(ctx.pod_usage());
    out
}

/// Each MIG device of `gpu` with its sample (matched by UUID).
fn mig_pairs(gpu: &GpuSnapshot) -> impl Iterator<Item = (&MigDevice, &MigSample)> {
    gpu.device
        .mig_devices
        .iter()
        .filter_map(|d| gpu.mig.iter().find(|m| m.uuid == d.uuid).map(|m| (d, m)))
}

fn field_value(source: Source, gpu: &GpuSnapshot) -> Option<Value> {
    let sample = gpu.sample.as_ref()?;
    match source {
        Source::Sample(get) => get(sample),
        Source::LastXid => Some(Value::Int(gpu.last_xid)),
        Source::DriverVersion | Source::NvmlVersion | Source::Unavailable => None,
    }
}

struct Ctx<'a> {
    snap: &'a Snapshot,
    cat: &'a Catalogue,
    opts: &'a RenderOptions,
    attribution: &'a Attribution,
}

impl Ctx<'_> {
    /// `gpu,UUID,pci_bus_id,device,modelName[,GPU_I_PROFILE,GPU_I_ID][,Hostname]` and, with
    /// `with_fields`, the CSV label fields (sorted by name).
    fn identity(&self, gpu: &GpuSnapshot, mig: Option<&MigDevice>, with_fields: bool) -> Labels {
        let d = &gpu.device;
        let model = if self.opts.replace_blanks_in_model_name {
            d.name.split_whitespace().collect::<Vec<_>>().join("-")
        } else {
            d.name.clone()
        };
        let mut l: Labels = Vec::with_capacity(10);
        l.push(("gpu", d.index.to_string()));
        l.push(("UUID", d.uuid.clone()));
        l.push(("pci_bus_id", d.pci_bus_id.clone()));
        l.push(("device", format!("nvidia{}", d.index)));
        l.push(("modelName", model));
        if let Some(m) = mig {
            if let Some(p) = &m.profile {
                l.push(("GPU_I_PROFILE", p.clone()));
            }
            if let Some(gi) = m.gpu_instance_id {
                l.push(("GPU_I_ID", gi.to_string()));
            }
        }
        if let Some(h) = &self.opts.hostname {
            l.push(("Hostname", h.clone()));
        }
        if with_fields {
            for f in &self.cat.labels {
                let value = match (f.source, &self.snap.system) {
                    (Source::DriverVersion, Some(sys)) => sys.driver_version.as_str(),
                    (Source::NvmlVersion, Some(sys)) => sys.nvml_version.as_str(),
                    _ => "",
                };
                l.push((f.name, value.to_owned()));
            }
        }
        l
    }

    /// One sample per target pod (the owner, or every pod with `per_pod`; none → unlabelled).
    #[allow(clippy::too_many_arguments)]
    fn push(
        &self,
        out: &mut Vec<Metric>,
        kind: Kind,
        base: &Labels,
        pods: &[PodRef],
        err_code: Option<&str>,
        mig_uuid: Option<&str>,
        value: Value,
    ) {
        let targets: Vec<Option<&PodRef>> = match (self.opts.per_pod, pods) {
            (_, []) => vec![None],
            (false, [owner, ..]) => vec![Some(owner)],
            (true, all) => all.iter().map(Some).collect(),
        };
        for pod in targets {
            let labels = with_attributes(base, pod, err_code, mig_uuid);
            out.push(sample(kind, labels, value));
        }
    }

    fn pod_info(&self) -> Option<MetricFamily> {
        let mut samples = Vec::new();
        for gpu in &self.snap.gpus {
            let base = self.identity(gpu, None, false);
            for pod in self.attribution.pods(gpu.device.index) {
                let labels = with_attributes(&base, Some(pod), None, None);
                samples.push(sample(Kind::Gauge, labels, Value::Int(1)));
            }
        }
        family(
            POD_INFO,
            "One series (value 1) per container using the GPU; join on UUID for per-pod views of shared GPUs.",
            Kind::Gauge,
            samples,
        )
    }

    fn xids(&self) -> Option<MetricFamily> {
        let mut samples = Vec::new();
        for gpu in &self.snap.gpus {
            let base = self.identity(gpu, None, false);
            for (xid, n) in &gpu.xid_counts {
                let mut labels = base.clone();
                labels.push(("xid", xid.to_string()));
                samples.push(sample(Kind::Counter, labels, Value::Int(*n)));
            }
        }
        family(
            XID_TOTAL,
            "XID errors seen since the exporter started, per GPU and XID.",
            Kind::Counter,
            samples,
        )
    }

    fn pod_usage(&self) -> Vec<MetricFamily> {
        type Get = fn(&PodUsage) -> Option<Value>;
        let families: [(&str, &str, Get); 2] = [
            (
                "kiln_gpu_pod_fb_used_mib",
                "GPU memory used by the pod's processes (in MiB).",
                |u| Some(Value::Int(u.memory_bytes >> 20)),
            ),
            (
                "kiln_gpu_pod_sm_util",
                "SM utilization of the pod's processes (in %).",
                |u| u.sm_util_pct.map(|v| Value::Int(v.into())),
            ),
        ];
        let mut out = Vec::new();
        for (name, help, get) in families {
            let mut samples = Vec::new();
            for gpu in &self.snap.gpus {
                let base = self.identity(gpu, None, false);
                for u in &gpu.pod_usage {
                    let Some(v) = get(u) else { continue };
                    let mut labels = base.clone();
                    labels.push(("namespace", u.pod.namespace.clone()));
                    labels.push(("pod", u.pod.pod.clone()));
                    labels.push(("pod_uid", u.pod.uid.clone()));
                    samples.push(sample(Kind::Gauge, labels, v));
                }
            }
            out.extend(family(name, help, Kind::Gauge, samples));
        }
        out
    }
}

/// `base` plus the sample's attributes in name order.
fn with_attributes(
    base: &Labels,
    pod: Option<&PodRef>,
    err_code: Option<&str>,
    mig_uuid: Option<&str>,
) -> Labels {
    let mut l = Vec::with_capacity(base.len() + 4);
    l.extend(base.iter().cloned());
    if let Some(p) = pod {
        l.push(("container", p.container.clone()));
    }
    if let Some(e) = err_code {
        l.push(("err_code", e.to_owned()));
    }
    if let Some(m) = mig_uuid {
        l.push((MIG_UUID_LABEL, m.to_owned()));
    }
    if let Some(p) = pod {
        l.push(("namespace", p.namespace.clone()));
        l.push(("pod", p.pod.clone()));
    }
    l
}
