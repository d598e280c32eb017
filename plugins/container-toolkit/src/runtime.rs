//! The toolkit's runtime wiring (upstream `transformForRuntime`, gpu-operator.md §3.2 step 6).

use kiln_plugin_std::ClusterPolicySpec;
use kiln_plugin_std::env::{get_env, set_env};
use kiln_plugin_std::k8s_openapi::api::core::v1::{Container, PodSpec};
use kiln_plugin_std::kiln_core::context::ContainerRuntime;
use kiln_plugin_std::pod::{add_mounts, add_volume, host_path_volume, mount};

/// Where the top-level runtime config directory is mounted in the container.
pub const CONFIG_DIR: &str = "/runtime/config-dir/";
/// Where the drop-in config directory is mounted.
pub const DROP_IN_DIR: &str = "/runtime/config-dir.d/";
/// Where the runtime socket directory is mounted.
pub const SOCKET_DIR: &str = "/runtime/sock-dir/";
/// Where the NRI socket directory is mounted.
pub const NRI_DIR: &str = "/runtime/nri-sock-dir/";
/// Default NRI socket on the host.
pub const DEFAULT_NRI_SOCKET: &str = "/var/run/nri/nri.sock";

/// `path.Base` / `path.Dir` of a host path.
fn split(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(0) => ("/", &path[1..]),
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (".", path),
    }
}

/// Env prefix of the runtime-specific variables (`CONTAINERD_CONFIG`, …).
fn prefix(rt: ContainerRuntime) -> &'static str {
    match rt {
        ContainerRuntime::Containerd => "CONTAINERD",
        ContainerRuntime::Crio => "CRIO",
        ContainerRuntime::Docker => "DOCKER",
    }
}

/// Upstream `getRuntimeConfigFiles`: the top-level config (override `<X>_CONFIG`, else
/// `RUNTIME_CONFIG`) and the drop-in file (override `RUNTIME_DROP_IN_CONFIG`; docker has none).
fn config_files(ctr: &Container, rt: ContainerRuntime) -> (String, Option<String>) {
    let (top, drop_in) = match rt {
        ContainerRuntime::Containerd => (
            "/etc/containerd/config.toml",
            Some("/etc/containerd/conf.d/99-nvidia.toml"),
        ),
        ContainerRuntime::Crio => (
            "/etc/crio/config.toml",
            Some("/etc/crio/crio.conf.d/99-nvidia.conf"),
        ),
        ContainerRuntime::Docker => ("/etc/docker/daemon.json", None),
    };
    let nonempty = |name: &str| {
        get_env(ctr, name)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    let top = nonempty(&format!("{}_CONFIG", prefix(rt)))
        .or_else(|| nonempty("RUNTIME_CONFIG"))
        .unwrap_or_else(|| top.to_string());
    let drop_in = drop_in.map(|d| nonempty("RUNTIME_DROP_IN_CONFIG").unwrap_or_else(|| d.into()));
    (top, drop_in)
}

/// Upstream `getRuntimeSocketFile`: containerd (override `CONTAINERD_SOCKET`) and docker
/// (override `DOCKER_SOCKET`); CRI-O has none.
fn socket_file(ctr: &Container, rt: ContainerRuntime) -> Option<String> {
    let default = match rt {
        ContainerRuntime::Containerd => "/run/containerd/containerd.sock",
        ContainerRuntime::Docker => "/var/run/docker.sock",
        ContainerRuntime::Crio => return None,
    };
    let over = get_env(ctr, &format!("{}_SOCKET", prefix(rt))).filter(|v| !v.is_empty());
    Some(over.unwrap_or(default).to_string())
}

/// Rewrite each `file=<path>` entry of a `RUNTIME_CONFIG_SOURCE` list to `file=/host<path>`;
/// other entries (`command`, a bare `file`) stay as they are.
pub fn rewrite_config_source(value: &str) -> String {
    value
        .split(',')
        .map(|s| match s.split_once('=') {
            Some(("file", p)) => format!("file=/host/{}", p.trim_start_matches('/')),
            _ => s.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Upstream `transformForRuntime` on container `idx` of `pod` (26.7): `RUNTIME`, then either
/// the NRI socket wiring (NRI plugin enabled; no config or socket mounts) or
/// `CONTAINERD_RUNTIME_CLASS` (containerd), the top-level config, the drop-in config, the
/// `RUNTIME_CONFIG_SOURCE` rewrite and the runtime socket, each with its hostPath volume.
pub fn transform_for_runtime(
    pod: &mut PodSpec,
    idx: usize,
    spec: &ClusterPolicySpec,
    rt: ContainerRuntime,
) {
    let name = rt.as_str();
    let ctr = &mut pod.containers[idx];
    set_env(ctr, "RUNTIME", name);
    let mut volumes = Vec::new();
    if spec.cdi.nri_plugin_enabled() {
        let host = get_env(ctr, "NRI_SOCKET")
            .filter(|v| !v.is_empty())
            .unwrap_or(DEFAULT_NRI_SOCKET)
            .to_string();
        let (dir, base) = split(&host);
        set_env(ctr, "NRI_SOCKET", format!("{NRI_DIR}{base}"));
        add_mounts(ctr, &[mount("nri-socket", NRI_DIR)]);
        volumes.push(host_path_volume(
            "nri-socket",
            dir,
            Some("DirectoryOrCreate"),
        ));
    } else {
        if rt == ContainerRuntime::Containerd {
            set_env(ctr, "CONTAINERD_RUNTIME_CLASS", spec.runtime_class());
        }
        let (top, drop_in) = config_files(ctr, rt);
        let (dir, base) = split(&top);
        set_env(ctr, "RUNTIME_CONFIG", format!("{CONFIG_DIR}{base}"));
        set_env(
            ctr,
            &format!("{}_CONFIG", prefix(rt)),
            format!("{CONFIG_DIR}{base}"),
        );
        let vol = format!("{name}-config");
        add_mounts(ctr, &[mount(&vol, CONFIG_DIR)]);
        volumes.push(host_path_volume(&vol, dir, Some("DirectoryOrCreate")));
        if let Some(drop_in) = drop_in {
            let (dir, base) = split(&drop_in);
            set_env(
                ctr,
                "RUNTIME_DROP_IN_CONFIG",
                format!("{DROP_IN_DIR}{base}"),
            );
            set_env(ctr, "RUNTIME_DROP_IN_CONFIG_HOST_PATH", drop_in.as_str());
            let vol = format!("{name}-drop-in-config");
            add_mounts(ctr, &[mount(&vol, DROP_IN_DIR)]);
            volumes.push(host_path_volume(&vol, dir, Some("DirectoryOrCreate")));
        }
        if let Some(src) = get_env(ctr, "RUNTIME_CONFIG_SOURCE").filter(|v| !v.is_empty()) {
            let rewritten = rewrite_config_source(src);
            set_env(ctr, "RUNTIME_CONFIG_SOURCE", rewritten);
        }
        if let Some(sock) = socket_file(ctr, rt) {
            let (dir, base) = split(&sock);
            set_env(ctr, "RUNTIME_SOCKET", format!("{SOCKET_DIR}{base}"));
            set_env(
                ctr,
                &format!("{}_SOCKET", prefix(rt)),
                format!("{SOCKET_DIR}{base}"),
            );
            let vol = format!("{name}-socket");
            add_mounts(ctr, &[mount(&vol, SOCKET_DIR)]);
            volumes.push(host_path_volume(&vol, dir, None));
        }
    }
    for v in volumes {
        add_volume(pod, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_source_rewrite() {
        assert_eq!(
            rewrite_config_source("file=/path/to/custom/source/config.toml,command"),
            "file=/host/path/to/custom/source/config.toml,command"
        );
        assert_eq!(rewrite_config_source("file,command"), "file,command");
        assert_eq!(rewrite_config_source("command"), "command");
    }

    #[test]
    fn path_split() {
        assert_eq!(split("/var/run/nri/nri.sock"), ("/var/run/nri", "nri.sock"));
        assert_eq!(split("/x.sock"), ("/", "x.sock"));
    }
}
