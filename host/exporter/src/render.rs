//! Builds the GPU families of a scrape from a [`Snapshot`] and an [`Attribution`] (pure); the
//! encoders in [`crate::exposition`] write them.
//!
//! Layout follows dcgm-exporter (reference §1.2–1.3): families in ascending DCGM field id, GPUs
//! in index order, labels `gpu, UUID, pci_bus_id, device, modelName[, GPU_I_PROFILE, GPU_I_ID],
//! hostname` (`Hostname` before dcgm-exporter 4.8.3, NVIDIA/dcgm-exporter #655; kept with
//! [`RenderOptions::legacy_hostname_label`]), then the CSV's label fields and the pod's own
//! labels (with `--kubernetes-enable-pod-labels`) merged by name, then the sample's attributes
//! by name (`container`, `err_code`, `err_msg`, `mig_device_uuid`, `namespace`, `pod`,
//! `pod_uid`, `vgpu`). In virtual-GPU mode ([`RenderOptions::per_pod`]) each sample is copied
//! per container and replica, and [`PER_PROCESS_FIELDS`] carry each pod's own processes'
//! values. A pod label whose sanitised name equals another label of the series is left
//! out (dcgm-exporter would print the name twice). Samples NVML does not provide are left out. kiln's own families follow: `kiln_gpu_pod_info` (one series per
//! container using each GPU, value 1) and `kiln_gpu_xid_errors_total` (XIDs per GPU and number),
//! and with [`RenderOptions::process_metrics`], `kiln_gpu_pod_fb_used_mib` /
//! `kiln_gpu_pod_sm_util` (see [`crate::process`]).
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
//! every instance. In virtual-GPU mode a MIG device's [`PER_PROCESS_FIELDS`] series carry each
//! pod's own processes' values as a whole GPU's do, from the MIG device's process list (memory
//! only: NVML has no per-process utilisation there, so `DCGM_FI_DEV_GPU_UTIL` would read 0),
//! following dcgm-exporter's `processMIGEnabledGPU` and `createPerProcessMetrics`; the
//! GPU-level series of a MIG GPU are copied per pod.

use kiln_gpu::{MigDevice, MigSample};
use prometheus::proto::{Metric, MetricFamily};

use crate::{
    attribution::{Attribution, PodMeta, PodRef, Share},
    catalogue::{Catalogue, MetricType},
    exposition::{Kind, Labels, family, sample},
    fields::{Source, Value},
    process::PodUsage,
    snapshot::{GpuSnapshot, Snapshot},
    xid,
};

/// Presentation choices that do not depend on the sample.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// Host label value; `None` leaves the label out (`--no-hostname`).
    pub hostname: Option<String>,
    /// Name the host label `Hostname`, as dcgm-exporter did before 4.8.3, instead of
    /// `hostname` (`--legacy-hostname-label`).
    pub legacy_hostname_label: bool,
    /// Replace runs of blanks in `modelName` with `-` (`--replace-blanks-in-model-name`).
    pub replace_blanks_in_model_name: bool,
    /// Virtual-GPU mode (`--kubernetes-virtual-gpus`): one copy of each sample per container
    /// and replica using the GPU, instead of one series carrying the owner's labels; see
    /// [`PER_PROCESS_FIELDS`] for the two fields that carry each pod's own processes' values.
    pub per_pod: bool,
    /// Emit kiln's `kiln_gpu_pod_fb_used_mib` / `kiln_gpu_pod_sm_util`
    /// (`--kubernetes-process-metrics`).
    pub process_metrics: bool,
}

/// The fields that, in virtual-GPU mode, carry each pod's own processes' values
/// (dcgm-exporter's `isPerProcessMetric`), on a GPU without MIG and on each MIG device (GPU
/// instance) that pods hold: the device-level series without pod labels, then one series per
/// container and replica with the sum over the pod's processes on that GPU or MIG device (SM
/// utilisation in percent, GPU only; memory in MiB, each process rounded down first),
/// `pod_uid` always (empty when unknown) and `vgpu` for a replica. A pod with no process there
/// reads 0. Where NVML cannot list a MIG GPU's devices' processes, the values are copied per
/// pod as for other fields (dcgm-exporter's `processMIGEnabledGPU` then gives nothing).
pub const PER_PROCESS_FIELDS: [&str; 2] = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"];

/// Name of the info metric joining GPUs to every container that uses them.
pub const POD_INFO: &str = "kiln_gpu_pod_info";
/// Name of the XID counter.
pub const XID_TOTAL: &str = "kiln_gpu_xid_errors_total";
/// Label carrying a MIG device's own UUID on its series.
pub const MIG_UUID_LABEL: &str = "mig_device_uuid";
/// The host label, as dcgm-exporter 4.8.3 and later name it.
pub const HOSTNAME_LABEL: &str = "hostname";
/// The host label before dcgm-exporter 4.8.3 ([`RenderOptions::legacy_hostname_label`]).
pub const LEGACY_HOSTNAME_LABEL: &str = "Hostname";

/// The per-sample attributes of one series: XID code, MIG device, pod.
#[derive(Clone, Copy, Default)]
struct Attrs<'a> {
    pod: Option<&'a PodRef>,
    /// The pod's own labels, merged into the CSV label fields.
    labels: &'a [(String, String)],
    uid: Option<&'a str>,
    vgpu: Option<u32>,
    err_code: Option<u64>,
    mig_uuid: Option<&'a str>,
}

impl<'a> Attrs<'a> {
    /// `pod` with its UID and labels from `meta`.
    fn of(pod: &'a PodRef, meta: Option<&'a PodMeta>) -> Self {
        Self {
            pod: Some(pod),
            labels: meta.map_or(&[][..], |m| m.labels.as_slice()),
            uid: meta.and_then(|m| m.uid.as_deref()),
            ..Self::default()
        }
    }
}

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
                        let targets = Targets {
                            pods: attribution.mig_pods(&dev.uuid),
                            shares: attribution.mig_shares(&dev.uuid),
                        };
                        let attrs = Attrs {
                            mig_uuid: Some(&dev.uuid),
                            ..Attrs::default()
                        };
                        if opts.per_pod
                            && PER_PROCESS_FIELDS.contains(&metric.field.name)
                            && !gpu.mig_processes_failed
                            && !targets.shares.is_empty()
                        {
                            let usage = gpu
                                .mig_pod_usage
                                .iter()
                                .find(|u| u.uuid == dev.uuid)
                                .map_or(&[][..], |u| u.pods.as_slice());
                            samples.push(sample(kind, with_attributes(&base, 0, attrs), value));
                            let per = PerProcess {
                                field: metric.field.name,
                                usage,
                                shares: targets.shares,
                            };
                            ctx.push_per_process(&mut samples, kind, &base, per, attrs);
                            continue;
                        }
                        ctx.push(&mut samples, kind, &base, targets, attrs, value);
                    }
                }
                continue;
            }
            let Some(value) = field_value(metric.field.source, gpu) else {
                continue;
            };
            let attrs = Attrs {
                err_code: matches!(metric.field.source, Source::LastXid).then_some(gpu.last_xid),
                ..Attrs::default()
            };
            let index = gpu.device.index;
            let targets = Targets {
                pods: attribution.pods(index),
                shares: attribution.shares(index),
            };
            if opts.per_pod
                && PER_PROCESS_FIELDS.contains(&metric.field.name)
                && gpu.device.mig_devices.is_empty()
                && !targets.shares.is_empty()
            {
                samples.push(sample(kind, base.clone(), value));
                let per = PerProcess {
                    field: metric.field.name,
                    usage: &gpu.pod_usage,
                    shares: targets.shares,
                };
                ctx.push_per_process(&mut samples, kind, base, per, attrs);
                continue;
            }
            ctx.push(&mut samples, kind, base, targets, attrs, value);
        }
        out.extend(family(metric.field.name, &metric.help, kind, samples));
    }
    out.extend(ctx.pod_info());
    out.extend(ctx.xids());
    if opts.process_metrics {
        out.extend(ctx.pod_usage());
    }
    out
}

/// Who a GPU's (or MIG device's) series go to: the containers (default mode: the first owns
/// the series) and the (container, replica) shares (virtual-GPU mode: one series each).
#[derive(Clone, Copy)]
struct Targets<'a> {
    pods: &'a [PodRef],
    shares: &'a [Share],
}

/// A per-process field's series for one GPU or MIG device: the field (one of
/// [`PER_PROCESS_FIELDS`]), the per-pod usage of that device's processes (a MIG device's has no
/// utilisation, so `DCGM_FI_DEV_GPU_UTIL` reads 0 there, as dcgm-exporter's
/// `processMIGEnabledGPU` reads memory only) and the shares to emit.
#[derive(Clone, Copy)]
struct PerProcess<'a> {
    field: &'a str,
    usage: &'a [PodUsage],
    shares: &'a [Share],
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
        Source::DriverVersion | Source::NvmlVersion | Source::Info(_) | Source::Unavailable => None,
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
            let name = if self.opts.legacy_hostname_label {
                LEGACY_HOSTNAME_LABEL
            } else {
                HOSTNAME_LABEL
            };
            l.push((name, h.clone()));
        }
        if with_fields {
            for f in &self.cat.labels {
                let value = match (f.source, &self.snap.system) {
                    (Source::DriverVersion, Some(sys)) => sys.driver_version.as_str(),
                    (Source::NvmlVersion, Some(sys)) => sys.nvml_version.as_str(),
                    // A string the GPU does not have: no label, as dcgm-exporter skips blanks.
                    (Source::Info(get), _) => match get(&d.info) {
                        Some(v) if !v.is_empty() => v,
                        _ => continue,
                    },
                    _ => "",
                };
                l.push((f.name, value.to_owned()));
            }
        }
        l
    }

    /// One sample per target: the owner (default mode, with the pod's labels), or each
    /// (container, replica) share (`per_pod`, with `vgpu` and without pod labels, as
    /// dcgm-exporter's virtual-GPU mode); none → unlabelled.
    fn push(
        &self,
        out: &mut Vec<Metric>,
        kind: Kind,
        base: &Labels,
        targets: Targets<'_>,
        attrs: Attrs<'_>,
        value: Value,
    ) {
        let all: Vec<Attrs<'_>> = match (self.opts.per_pod, targets.pods) {
            (_, []) => vec![attrs],
            (false, [owner, ..]) => vec![Attrs {
                err_code: attrs.err_code,
                mig_uuid: attrs.mig_uuid,
                ..Attrs::of(owner, self.attribution.meta(owner))
            }],
            (true, _) => targets
                .shares
                .iter()
                .map(|s| Attrs {
                    pod: Some(&s.pod),
                    uid: self.attribution.meta(&s.pod).and_then(|m| m.uid.as_deref()),
                    vgpu: s.vgpu,
                    ..attrs
                })
                .collect(),
        };
        for attrs in all {
            let labels = with_attributes(base, self.label_fields(base, &attrs), attrs);
            out.push(sample(kind, labels, value));
        }
    }

    /// How many CSV label fields end `base` (those the GPU has a value for), when the pod's
    /// labels are to be merged into them; 0 otherwise.
    fn label_fields(&self, base: &Labels, attrs: &Attrs<'_>) -> usize {
        if attrs.labels.is_empty() {
            return 0;
        }
        base.iter()
            .rev()
            .take_while(|(k, _)| self.cat.labels.iter().any(|f| f.name == *k))
            .count()
    }

    /// One sample per share of `per` with the sum over its pod's processes of the field; the
    /// pod is found in the usage by namespace and name, its UID in the pod log directory, then
    /// the API server's metadata, else empty. `attrs` carries what every sample keeps (the MIG
    /// device).
    fn push_per_process(
        &self,
        out: &mut Vec<Metric>,
        kind: Kind,
        base: &Labels,
        per: PerProcess<'_>,
        attrs: Attrs<'_>,
    ) {
        let PerProcess {
            field,
            usage,
            shares,
        } = per;
        for s in shares {
            let usage = usage
                .iter()
                .find(|u| u.pod.namespace == s.pod.namespace && u.pod.pod == s.pod.pod);
            let value = match (field, usage) {
                (_, None) => 0,
                ("DCGM_FI_DEV_FB_USED", Some(u)) => u.memory_mib,
                (_, Some(u)) => u.sm_util_pct.map_or(0, u64::from),
            };
            let uid = usage
                .map(|u| u.pod.uid.as_str())
                .or_else(|| {
                    self.snap
                        .pod_uids
                        .iter()
                        .find(|((ns, name), _)| *ns == s.pod.namespace && *name == s.pod.pod)
                        .map(|(_, uid)| uid.as_str())
                })
                .or_else(|| self.attribution.meta(&s.pod).and_then(|m| m.uid.as_deref()))
                .unwrap_or("");
            let attrs = Attrs {
                pod: Some(&s.pod),
                uid: Some(uid),
                vgpu: s.vgpu,
                mig_uuid: attrs.mig_uuid,
                ..Attrs::default()
            };
            out.push(sample(
                kind,
                with_attributes(base, 0, attrs),
                Value::Int(value),
            ));
        }
    }

    fn pod_info(&self) -> Option<MetricFamily> {
        let mut samples = Vec::new();
        for gpu in &self.snap.gpus {
            let base = self.identity(gpu, None, false);
            for pod in self.attribution.pods(gpu.device.index) {
                let attrs = Attrs::of(pod, self.attribution.meta(pod));
                let labels = with_attributes(&base, 0, attrs);
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

/// `base` plus the pod's labels merged (by name) into its last `fields` labels (the CSV label
/// fields), then the sample's attributes in name order. Pod labels whose name the series
/// already has are skipped.
fn with_attributes(base: &Labels, fields: usize, a: Attrs<'_>) -> Labels {
    const ATTRS: [&str; 8] = [
        "container",
        "err_code",
        "err_msg",
        MIG_UUID_LABEL,
        "namespace",
        "pod",
        "pod_uid",
        "vgpu",
    ];
    let pod_labels = a.labels;
    let mut l = Vec::with_capacity(base.len() + 6 + pod_labels.len());
    if pod_labels.is_empty() {
        l.extend(base.iter().cloned());
    } else {
        let split = base.len().saturating_sub(fields);
        let (head, tail) = base.split_at(split);
        l.extend(head.iter().cloned());
        let taken = |n: &str| base.iter().any(|(k, _)| *k == n) || ATTRS.contains(&n);
        let mut extra = pod_labels
            .iter()
            .filter(|(k, _)| !taken(k))
            .filter_map(|(k, v)| Some((intern(k)?, v.clone())))
            .peekable();
        let mut tail = tail.iter().cloned().peekable();
        loop {
            let next = match (tail.peek(), extra.peek()) {
                (Some(t), Some(e)) if e.0 < t.0 => extra.next(),
                (Some(_), _) => tail.next(),
                (None, Some(_)) => extra.next(),
                (None, None) => break,
            };
            l.extend(next);
        }
    }
    if let Some(p) = a.pod {
        l.push(("container", p.container.clone()));
    }
    if let Some(e) = a.err_code {
        l.push(("err_code", e.to_string()));
        l.push(("err_msg", xid::message(e).to_owned()));
    }
    if let Some(m) = a.mig_uuid {
        l.push((MIG_UUID_LABEL, m.to_owned()));
    }
    if let Some(p) = a.pod {
        l.push(("namespace", p.namespace.clone()));
        l.push(("pod", p.pod.clone()));
        if let Some(uid) = a.uid {
            l.push(("pod_uid", uid.to_owned()));
        }
        if let Some(v) = a.vgpu {
            l.push(("vgpu", v.to_string()));
        }
    }
    l
}

/// The most distinct pod label names the exporter keeps (see [`intern`]).
pub const MAX_POD_LABEL_NAMES: usize = 4096;

/// A `'static` copy of a pod label name: label names are `&'static str` in [`Labels`], and pod
/// label names are few and long-lived, so each distinct name is kept once, for the life of the
/// process. `None` (the label is left out) once [`MAX_POD_LABEL_NAMES`] names are kept, which
/// bounds the memory a churn of label names can take; narrow `--kubernetes-pod-label-allowlist-regex`.
fn intern(name: &str) -> Option<&'static str> {
    use std::{collections::BTreeSet, sync::Mutex};
    static NAMES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut names = NAMES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(n) = names.get(name) {
        return Some(n);
    }
    if names.len() >= MAX_POD_LABEL_NAMES {
        return None;
    }
    let kept: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(kept);
    Some(kept)
}
