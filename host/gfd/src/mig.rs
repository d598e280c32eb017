//! MIG labels: `single` rewrites `nvidia.com/gpu.*` to the one MIG profile of the node;
//! `mixed` adds `nvidia.com/mig-<profile>.*` per profile (reference `device-plugin.md` §5.3).
//!
//! From the GPU seam kiln knows each MIG device's profile, its attributes (multiprocessors and
//! engines, NVML's `nvmlDeviceGetAttributes`: upstream's `multiprocessors` and
//! `engines.{copy,decoder,encoder,jpeg,ofa}` labels) and, where the inventory has a sample, its
//! memory; the slice counts come from the profile name (`1g.10gb` → 1 GPU slice; `1c.3g.40gb`
//! → 1 compute and 3 GPU slices). A profile whose devices' attributes are unknown gets no
//! attribute labels.

use std::collections::BTreeMap;

use kiln_gpu::{GpuDevice, MigAttributes};

use crate::labels::{
    LabelInput, Labels, PREFIX, clean_name, compute_labels, shared_product, sharing_labels,
};

/// `(gi, ci)` slice counts from a profile name, `None` when it is not `[<c>c.]<g>g.<mem>`.
#[must_use]
pub fn profile_slices(profile: &str) -> Option<(u32, u32)> {
    let mut parts = profile.split('.');
    let first = parts.next()?;
    let (ci, gi_part) = match first.strip_suffix('c') {
        Some(c) => (Some(c.parse().ok()?), parts.next()?),
        None => (None, first),
    };
    let gi: u32 = gi_part.strip_suffix('g')?.parse().ok()?;
    Some((gi, ci.unwrap_or(gi)))
}

/// One MIG profile on one GPU model.
struct Profile<'a> {
    gpu: &'a GpuDevice,
    count: usize,
    memory_mib: Option<u64>,
    attributes: Option<MigAttributes>,
}

fn profiles<'a>(gpus: &'a [GpuDevice], input: &LabelInput) -> BTreeMap<String, Profile<'a>> {
    let mut out: BTreeMap<String, Profile<'a>> = BTreeMap::new();
    for g in gpus.iter().filter(|g| g.mig_enabled == Some(true)) {
        for m in &g.mig_devices {
            let Some(p) = m.profile.as_deref() else {
                tracing::warn!(mig = %m.uuid, "MIG device without a profile name: not labelled");
                continue;
            };
            let e = out.entry(p.replace('+', ".")).or_insert(Profile {
                gpu: g,
                count: 0,
                memory_mib: None,
                attributes: None,
            });
            e.count += 1;
            e.attributes = e.attributes.or(m.attributes);
            e.memory_mib = e
                .memory_mib
                .or_else(|| input.mig_memory_mib.get(&m.uuid).copied());
        }
    }
    out
}

fn profile_labels(
    key: &str,
    resource: &str,
    profile: &str,
    p: &Profile<'_>,
    input: &LabelInput,
    l: &mut Labels,
) {
    let mut put = |k: &str, v: String| {
        l.insert(format!("{PREFIX}{key}.{k}"), v);
    };
    let base = format!("{}-MIG-{profile}", clean_name(&p.gpu.name));
    put("product", shared_product(base, &input.sharing, resource));
    put("count", p.count.to_string());
    let (replicas, strategy) = sharing_labels(&input.sharing, resource);
    put("replicas", replicas);
    put("sharing-strategy", strategy);
    if let Some(mib) = p.memory_mib {
        put("memory", mib.to_string());
    }
    if let Some((gi, ci)) = profile_slices(profile) {
        put("slices.gi", gi.to_string());
        put("slices.ci", ci.to_string());
    }
    if let Some(a) = p.attributes {
        put("multiprocessors", a.multiprocessors.to_string());
        put("engines.copy", a.copy_engines.to_string());
        put("engines.decoder", a.decoders.to_string());
        put("engines.encoder", a.encoders.to_string());
        put("engines.jpeg", a.jpeg_engines.to_string());
        put("engines.ofa", a.ofa_engines.to_string());
    }
}

/// `single`: valid when every GPU has MIG on, each has MIG devices, and all share one
/// profile; then `nvidia.com/gpu.*` describes that profile. Otherwise upstream's
/// `<model>-MIG-INVALID` labels.
pub(crate) fn single_labels(gpus: &[GpuDevice], input: &LabelInput, l: &mut Labels) {
    let all_on = gpus
        .iter()
        .all(|g| g.mig_enabled == Some(true) && !g.mig_devices.is_empty());
    let all_named = gpus
        .iter()
        .flat_map(|g| &g.mig_devices)
        .all(|m| m.profile.is_some());
    let found = profiles(gpus, input);
    if all_on && all_named && found.len() == 1 {
        let (profile, p) = found.iter().next().expect("one profile");
        profile_labels("gpu", "nvidia.com/gpu", profile, p, input, l);
        let mut put = |k: &str, v: String| {
            l.insert(format!("{PREFIX}gpu.{k}"), v);
        };
        compute_labels(p.gpu, &mut put);
        return;
    }
    tracing::warn!(
        "MIG strategy single needs every GPU in MIG mode with one profile: labelling the layout invalid"
    );
    let model = gpus
        .first()
        .map(|g| clean_name(&g.name))
        .unwrap_or_default();
    for (k, v) in [
        ("product", format!("{model}-MIG-INVALID")),
        ("count", "0".into()),
        ("replicas", "0".into()),
        ("sharing-strategy", String::new()),
        ("memory", "0".into()),
    ] {
        l.insert(format!("{PREFIX}gpu.{k}"), v);
    }
}

/// `mixed`: `nvidia.com/mig-<profile>.*` per profile (`+` written as `.`), for the resource
/// `nvidia.com/mig-<profile>`.
pub(crate) fn mixed_labels(gpus: &[GpuDevice], input: &LabelInput, l: &mut Labels) {
    for (profile, p) in &profiles(gpus, input) {
        let key = format!("mig-{profile}");
        let resource = format!("{PREFIX}{key}");
        profile_labels(&key, &resource, profile, p, input, l);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_come_from_the_profile_name() {
        assert_eq!(profile_slices("1g.10gb"), Some((1, 1)));
        assert_eq!(profile_slices("3g.40gb"), Some((3, 3)));
        assert_eq!(profile_slices("1c.3g.40gb"), Some((3, 1)));
        assert_eq!(profile_slices("1g.10gb.me"), Some((1, 1)));
        assert_eq!(profile_slices("bogus"), None);
    }
}
