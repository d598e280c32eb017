//! Per-pod GPU memory and SM utilisation from NVML's process lists.
//!
//! NVML reports host pids; `/proc/<pid>/cgroup` names the pod UID (both cgroupfs
//! `.../pod<uid>/...` and systemd `...-pod<uid_with_underscores>.slice` layouts); the kubelet's
//! log directory `/var/log/pods/<namespace>_<pod>_<uid>` turns the UID into a name. This needs
//! the exporter to run with `hostPID: true` and `/var/log/pods` mounted; a process that cannot
//! be mapped is left out (an absent series, never a 0), unlike dcgm-exporter's per-process
//! mode (reference §3.6).

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
};

use kiln_gpu::GpuProcess;

/// A pod, identified the way the node knows it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodKey {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Pod UID.
    pub uid: String,
}

/// What one pod's processes use on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodUsage {
    /// The pod.
    pub pod: PodKey,
    /// Sum of its processes' GPU memory, bytes (processes the driver hides count 0).
    pub memory_bytes: u64,
    /// Sum of its processes' GPU memory, each rounded down to whole MiB first, as
    /// dcgm-exporter sums them for its per-process `DCGM_FI_DEV_FB_USED` (virtual-GPU mode).
    pub memory_mib: u64,
    /// Sum of its processes' SM utilisation, percent; `None` if no process had a sample.
    pub sm_util_pct: Option<u32>,
}

/// Where to look: the host's `/proc` and the kubelet's pod log directory.
#[derive(Debug, Clone)]
pub struct ProcessMapper {
    /// Host `/proc` (visible with `hostPID`).
    pub proc_root: PathBuf,
    /// The kubelet's `/var/log/pods`.
    pub pod_logs_dir: PathBuf,
}

/// The pod UID in a `/proc/<pid>/cgroup` text, dashes restored; `None` outside a pod.
#[must_use]
pub fn pod_uid_from_cgroup(text: &str) -> Option<String> {
    text.lines()
        .flat_map(|line| line.split('/'))
        .find_map(|seg| {
            let after = seg
                .strip_prefix("pod")
                .or_else(|| seg.rsplit_once("-pod").map(|(_, u)| u))?;
            let uid = after.trim_end_matches(".slice").replace('_', "-");
            is_uid(&uid).then_some(uid)
        })
}

fn is_uid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

/// `<namespace>_<pod>_<uid>` → [`PodKey`] (neither namespace nor pod names may contain `_`).
#[must_use]
pub fn parse_pod_log_dir(name: &str) -> Option<PodKey> {
    let mut parts = name.splitn(3, '_');
    let (namespace, pod, uid) = (parts.next()?, parts.next()?, parts.next()?);
    is_uid(uid).then(|| PodKey {
        namespace: namespace.into(),
        pod: pod.into(),
        uid: uid.into(),
    })
}

/// Sums `processes` per pod, given each pid's pod UID and the UID → pod directory.
#[must_use]
pub fn usage_by_pod(
    processes: &[GpuProcess],
    uid_of: impl Fn(u32) -> Option<String>,
    pods: &HashMap<String, PodKey>,
) -> Vec<PodUsage> {
    let mut sums: BTreeMap<PodKey, (u64, u64, Option<u32>)> = BTreeMap::new();
    for p in processes {
        let Some(pod) = uid_of(p.pid).and_then(|uid| pods.get(&uid)) else {
            continue;
        };
        let e = sums.entry(pod.clone()).or_default();
        e.0 += p.used_memory_bytes.unwrap_or(0);
        e.1 += p.used_memory_bytes.unwrap_or(0) >> 20;
        if let Some(u) = p.sm_util_pct {
            e.2 = Some(e.2.unwrap_or(0) + u);
        }
    }
    sums.into_iter()
        .map(|(pod, (memory_bytes, memory_mib, sm_util_pct))| PodUsage {
            pod,
            memory_bytes,
            memory_mib,
            sm_util_pct,
        })
        .collect()
}

impl ProcessMapper {
    /// Reads the pod directory once (call once per poll).
    #[must_use]
    pub fn pod_directory(&self) -> HashMap<String, PodKey> {
        let Ok(entries) = std::fs::read_dir(&self.pod_logs_dir) else {
            return HashMap::new();
        };
        entries
            .filter_map(|e| parse_pod_log_dir(e.ok()?.file_name().to_str()?))
            .map(|k| (k.uid.clone(), k))
            .collect()
    }

    /// The pod UID of host pid `pid`, from its cgroup file.
    #[must_use]
    pub fn pod_uid(&self, pid: u32) -> Option<String> {
        let text =
            std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("cgroup")).ok()?;
        pod_uid_from_cgroup(&text)
    }

    /// Per-pod usage of one GPU's processes.
    #[must_use]
    pub fn usage(&self, processes: &[GpuProcess], pods: &HashMap<String, PodKey>) -> Vec<PodUsage> {
        usage_by_pod(processes, |pid| self.pod_uid(pid), pods)
    }
}

/// The default mapper over `/proc` and `/var/log/pods`.
impl Default for ProcessMapper {
    fn default() -> Self {
        Self {
            proc_root: Path::new("/proc").into(),
            pod_logs_dir: Path::new("/var/log/pods").into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f3c2a1e-9b7d-4c11-8e2f-6a5b4c3d2e1f";

    #[test]
    fn cgroup_layouts() {
        let v1 = format!("12:memory:/kubepods/burstable/pod{UID}/3f2e1d\n0::/\n");
        assert_eq!(pod_uid_from_cgroup(&v1).as_deref(), Some(UID));
        let sd = format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-ab.scope\n",
            UID.replace('-', "_")
        );
        assert_eq!(pod_uid_from_cgroup(&sd).as_deref(), Some(UID));
        assert_eq!(
            pod_uid_from_cgroup("0::/user.slice/user-1000.slice/session-2.scope\n"),
            None
        );
    }

    #[test]
    fn pod_log_dir_names() {
        let k = parse_pod_log_dir(&format!("ml_trainer-0_{UID}")).unwrap();
        assert_eq!(
            (k.namespace.as_str(), k.pod.as_str(), k.uid.as_str()),
            ("ml", "trainer-0", UID)
        );
        assert_eq!(parse_pod_log_dir("ml_trainer-0_nope"), None);
    }

    #[test]
    fn usage_sums_per_pod_and_skips_unmapped_processes() {
        let pod = PodKey {
            namespace: "ml".into(),
            pod: "p".into(),
            uid: UID.into(),
        };
        let pods = HashMap::from([(UID.to_owned(), pod.clone())]);
        let procs = [
            GpuProcess {
                pid: 1,
                used_memory_bytes: Some(100),
                sm_util_pct: Some(10),
            },
            GpuProcess {
                pid: 2,
                used_memory_bytes: Some((1 << 20) + 50),
                sm_util_pct: None,
            },
            GpuProcess {
                pid: 3,
                used_memory_bytes: Some(999),
                sm_util_pct: Some(99),
            },
        ];
        let usage = usage_by_pod(&procs, |pid| (pid < 3).then(|| UID.to_owned()), &pods);
        assert_eq!(
            usage,
            [PodUsage {
                pod,
                memory_bytes: (1 << 20) + 150,
                memory_mib: 1,
                sm_util_pct: Some(10)
            }]
        );
    }

    #[test]
    fn mapper_reads_proc_and_pod_logs() {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = dir.path().join("proc");
        std::fs::create_dir_all(proc_root.join("42")).unwrap();
        std::fs::write(
            proc_root.join("42/cgroup"),
            format!("0::/kubepods/pod{UID}/c\n"),
        )
        .unwrap();
        let logs = dir.path().join("pods");
        std::fs::create_dir_all(logs.join(format!("ml_trainer-0_{UID}"))).unwrap();
        let m = ProcessMapper {
            proc_root,
            pod_logs_dir: logs,
        };
        let usage = m.usage(
            &[GpuProcess {
                pid: 42,
                used_memory_bytes: Some(1 << 20),
                sm_util_pct: Some(5),
            }],
            &m.pod_directory(),
        );
        assert_eq!(usage.len(), 1);
        assert_eq!(usage[0].pod.pod, "trainer-0");
        assert_eq!(usage[0].memory_bytes, 1 << 20);
    }
}
