//! Renders the GPU families of a scrape body from a [`Snapshot`] and an [`Attribution`] (pure).
//!
//! Layout follows dcgm-exporter (reference §1.2–1.3): families in ascending DCGM field id, GPUs
//! in index order, labels `gpu, UUID, pci_bus_id, device, modelName, Hostname`, then the CSV's
//! label fields by name, then the sample's attributes by name (`container`, `err_code`,
//! `namespace`, `pod`). Samples NVML does not provide are left out. kiln's own families follow:
//! `kiln_gpu_pod_info` (one series per container using each GPU, value 1) and
//! `kiln_gpu_xid_errors_total` (XIDs per GPU and number), and with process metrics on,
//! `kiln_gpu_pod_fb_used_mib` / `kiln_gpu_pod_sm_util` (see [`crate::process`]).

use crate::{
    attribution::{Attribution, PodRef},
    catalogue::{Catalogue, MetricType},
    exposition::{Format, Kind, push_label, write_header, write_sample},
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

/// Appends every GPU family (DCGM fields, then kiln's) to `out`. No `# EOF`.
pub fn render_gpus(
    out: &mut String,
    format: Format,
    catalogue: &Catalogue,
    snap: &Snapshot,
    attribution: &Attribution,
    opts: &RenderOptions,
) {
    let bases: Vec<String> = snap
        .gpus
        .iter()
        .map(|g| base_labels(g, snap, catalogue, opts, true))
        .collect();
    for metric in &catalogue.metrics {
        let kind = match metric.kind {
            MetricType::Gauge => Kind::Gauge,
            MetricType::Counter => Kind::Counter,
        };
        let mut header = false;
        for (gpu, base) in snap.gpus.iter().zip(&bases) {
            let Some(value) = field_value(metric.field.source, gpu) else {
                continue;
            };
            if !header {
                write_header(out, format, metric.field.name, &metric.help, kind);
                header = true;
            }
            let err_code =
                matches!(metric.field.source, Source::LastXid).then(|| gpu.last_xid.to_string());
            let pods = attribution.pods(gpu.device.index);
            let targets: Vec<Option<&PodRef>> = match (opts.per_pod, pods) {
                (_, []) => vec![None],
                (false, [owner, ..]) => vec![Some(owner)],
                (true, all) => all.iter().map(Some).collect(),
            };
            for pod in targets {
                let labels = sample_labels(base, pod, err_code.as_deref());
                write_sample(out, metric.field.name, &labels, value);
            }
        }
    }
    render_pod_info(out, format, snap, attribution, catalogue, opts);
    render_xids(out, format, snap, catalogue, opts);
    render_pod_usage(out, format, snap, catalogue, opts);
}

fn field_value(source: Source, gpu: &GpuSnapshot) -> Option<Value> {
    let sample = gpu.sample.as_ref()?;
    match source {
        Source::Sample(get) => get(sample),
        Source::LastXid => Some(Value::Int(gpu.last_xid)),
        Source::DriverVersion | Source::NvmlVersion | Source::Unavailable => None,
    }
}

/// `gpu,UUID,pci_bus_id,device,modelName[,Hostname]` and, with `with_fields`, the CSV label
/// fields (sorted by name), without braces.
fn base_labels(
    gpu: &GpuSnapshot,
    snap: &Snapshot,
    cat: &Catalogue,
    opts: &RenderOptions,
    with_fields: bool,
) -> String {
    let d = &gpu.device;
    let model = if opts.replace_blanks_in_model_name {
        d.name.split_whitespace().collect::<Vec<_>>().join("-")
    } else {
        d.name.clone()
    };
    let mut s = String::with_capacity(256);
    push_label(&mut s, true, "gpu", &d.index.to_string());
    push_label(&mut s, false, "UUID", &d.uuid);
    push_label(&mut s, false, "pci_bus_id", &d.pci_bus_id);
    push_label(&mut s, false, "device", &format!("nvidia{}", d.index));
    push_label(&mut s, false, "modelName", &model);
    if let Some(h) = &opts.hostname {
        push_label(&mut s, false, "Hostname", h);
    }
    if with_fields {
        for f in &cat.labels {
            let value = match (f.source, &snap.system) {
                (Source::DriverVersion, Some(sys)) => sys.driver_version.as_str(),
                (Source::NvmlVersion, Some(sys)) => sys.nvml_version.as_str(),
                _ => "",
            };
            push_label(&mut s, false, f.name, value);
        }
    }
    s
}

/// Base labels plus the sample's attributes in name order.
fn sample_labels(base: &str, pod: Option<&PodRef>, err_code: Option<&str>) -> String {
    let mut s = String::with_capacity(base.len() + 96);
    s.push_str(base);
    if let Some(p) = pod {
        push_label(&mut s, false, "container", &p.container);
    }
    if let Some(e) = err_code {
        push_label(&mut s, false, "err_code", e);
    }
    if let Some(p) = pod {
        push_label(&mut s, false, "namespace", &p.namespace);
        push_label(&mut s, false, "pod", &p.pod);
    }
    s
}

fn render_pod_info(
    out: &mut String,
    format: Format,
    snap: &Snapshot,
    attribution: &Attribution,
    cat: &Catalogue,
    opts: &RenderOptions,
) {
    if attribution.gpus_in_use() == 0 {
        return;
    }
    write_header(
        out,
        format,
        POD_INFO,
        "One series (value 1) per container using the GPU; join on UUID for per-pod views of shared GPUs.",
        Kind::Gauge,
    );
    for gpu in &snap.gpus {
        let base = base_labels(gpu, snap, cat, opts, false);
        for pod in attribution.pods(gpu.device.index) {
            write_sample(
                out,
                POD_INFO,
                &sample_labels(&base, Some(pod), None),
                Value::Int(1),
            );
        }
    }
}

fn render_xids(
    out: &mut String,
    format: Format,
    snap: &Snapshot,
    cat: &Catalogue,
    opts: &RenderOptions,
) {
    if snap.gpus.iter().all(|g| g.xid_counts.is_empty()) {
        return;
    }
    write_header(
        out,
        format,
        XID_TOTAL,
        "XID errors seen since the exporter started, per GPU and XID.",
        Kind::Counter,
    );
    for gpu in &snap.gpus {
        let base = base_labels(gpu, snap, cat, opts, false);
        for (xid, n) in &gpu.xid_counts {
            let mut labels = base.clone();
            push_label(&mut labels, false, "xid", &xid.to_string());
            write_sample(out, XID_TOTAL, &labels, Value::Int(*n));
        }
    }
}

fn render_pod_usage(
    out: &mut String,
    format: Format,
    snap: &Snapshot,
    cat: &Catalogue,
    opts: &RenderOptions,
) {
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
    for (name, help, get) in families {
        let mut header = false;
        for gpu in &snap.gpus {
            let base = base_labels(gpu, snap, cat, opts, false);
            for u in &gpu.pod_usage {
                let Some(v) = get(u) else { continue };
                if !header {
                    write_header(out, format, name, help, Kind::Gauge);
                    header = true;
                }
                let mut labels = base.clone();
                push_label(&mut labels, false, "namespace", &u.pod.namespace);
                push_label(&mut labels, false, "pod", &u.pod.pod);
                push_label(&mut labels, false, "pod_uid", &u.pod.uid);
                write_sample(out, name, &labels, v);
            }
        }
    }
}
