//! `kiln device-plugin config-manager`: copies the config chosen by the node label into the
//! file the plugin (and GFD) read, and signals them (reference §3).
//!
//! Differences from upstream (§9.7): the destination is replaced atomically instead of being a
//! symlink (no dangling link, issue #364); in the sidecar a missing key is logged and the
//! current file kept rather than crash-looping; label values arrive only after the node
//! watch has synced (#1540, #1645).

use std::path::PathBuf;

use tokio::sync::mpsc;

use crate::selection::{ConfigDir, SelectError, write_if_changed};

/// What the manager does with a chosen config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagerOptions {
    /// Where configs come from.
    pub dir: ConfigDir,
    /// `CONFIG_FILE_DST`.
    pub dst: PathBuf,
    /// Signal the consumer after a change (sidecar).
    pub send_signal: bool,
    /// Signal number (1 = SIGHUP).
    pub signal: i32,
    /// The process to signal: matched against `argv[0]`'s file name; `nvidia-device-plugin`
    /// also matches `kiln device-plugin` and `gpu-feature-discovery` matches `kiln gfd`.
    pub process_to_signal: String,
}

/// Why a label value could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// No config for this label.
    #[error(transparent)]
    Select(#[from] SelectError),
    /// The destination could not be written.
    #[error("writing {path}")]
    Write {
        /// Destination.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The label stream ended before any value (oneshot).
    #[error("the node watch ended before the label could be read")]
    NoLabel,
}

impl ManagerOptions {
    /// Chooses and writes the config for `label`; signals the consumer when the file changed
    /// and `send_signal` is set. Returns whether the file changed.
    ///
    /// # Errors
    /// [`ManagerError`]; the destination is then left as it was.
    pub fn apply(&self, label: Option<&str>) -> Result<bool, ManagerError> {
        let sel = self.dir.select(label)?;
        let changed =
            write_if_changed(&self.dst, &sel.text).map_err(|source| ManagerError::Write {
                path: self.dst.clone(),
                source,
            })?;
        let name = sel.name.as_deref().unwrap_or("<empty>");
        if !changed {
            tracing::info!(config = name, "Already configured. Skipping update...");
            return Ok(false);
        }
        tracing::info!(config = name, dst = %self.dst.display(), "Updated config");
        if self.send_signal {
            match find_process(&self.process_to_signal) {
                Some(pid) => match send_signal(pid, self.signal) {
                    Ok(()) => tracing::info!(
                        pid,
                        signal = self.signal,
                        "Signalled {}",
                        self.process_to_signal
                    ),
                    Err(e) => tracing::error!(pid, "sending signal {}: {e}", self.signal),
                },
                None => tracing::warn!("no process {} to signal", self.process_to_signal),
            }
        }
        Ok(true)
    }

    /// Applies every label value from `labels` (sent after the node watch synced). With
    /// `oneshot`, returns after the first value (errors included); otherwise errors are logged
    /// and the current config is kept until the next value.
    ///
    /// # Errors
    /// Oneshot only: the first value's [`ManagerError`], or [`ManagerError::NoLabel`].
    pub async fn run(
        &self,
        mut labels: mpsc::Receiver<Option<String>>,
        oneshot: bool,
    ) -> Result<(), ManagerError> {
        while let Some(label) = labels.recv().await {
            tracing::info!(label = ?label, "node label {} is", crate::selection::NODE_LABEL);
            match self.apply(label.as_deref()) {
                Ok(_) if oneshot => return Ok(()),
                Err(e) if oneshot => return Err(e),
                Ok(_) => {}
                Err(e) => tracing::error!("{e}; keeping the current config"),
            }
        }
        if oneshot {
            Err(ManagerError::NoLabel)
        } else {
            Ok(())
        }
    }
}

/// True when `argv` is the process `target` names (see [`ManagerOptions::process_to_signal`]).
#[must_use]
pub fn matches_process(argv: &[&str], target: &str) -> bool {
    let Some(first) = argv.first() else {
        return false;
    };
    let base = first.rsplit('/').next().unwrap_or(first);
    if base == target {
        return true;
    }
    let sub = match target {
        "nvidia-device-plugin" => "device-plugin",
        "gpu-feature-discovery" => "gfd",
        _ => return false,
    };
    base == "kiln"
        && argv.get(1) == Some(&sub)
        && argv.get(2).is_none_or(|a| *a != "config-manager")
}

/// The lowest pid in `/proc` whose command line matches `target`, other than this process.
#[must_use]
pub fn find_process(target: &str) -> Option<i32> {
    let me = std::process::id();
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|p| *p != me)
        .collect();
    pids.sort_unstable();
    pids.into_iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|raw| {
                let text = String::from_utf8_lossy(&raw);
                let argv: Vec<&str> = text.split('\0').filter(|a| !a.is_empty()).collect();
                matches_process(&argv, target)
            })
        })
        .and_then(|p| i32::try_from(p).ok())
}

/// Sends signal number `signal` to `pid`.
///
/// # Errors
/// An invalid pid/signal or the `kill(2)` error.
pub fn send_signal(pid: i32, signal: i32) -> std::io::Result<()> {
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidInput, "invalid pid or signal");
    let pid = rustix::process::Pid::from_raw(pid).ok_or_else(bad)?;
    let sig = rustix::process::Signal::from_named_raw(signal).ok_or_else(bad)?;
    rustix::process::kill_process(pid, sig).map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_names_match_kiln_subcommands() {
        assert!(matches_process(
            &["/usr/bin/nvidia-device-plugin"],
            "nvidia-device-plugin"
        ));
        assert!(matches_process(
            &["kiln", "device-plugin"],
            "nvidia-device-plugin"
        ));
        assert!(matches_process(
            &["/bin/kiln", "device-plugin", "--x"],
            "nvidia-device-plugin"
        ));
        assert!(!matches_process(
            &["kiln", "device-plugin", "config-manager"],
            "nvidia-device-plugin"
        ));
        assert!(matches_process(&["kiln", "gfd"], "gpu-feature-discovery"));
        assert!(matches_process(
            &["/usr/local/bin/kiln", "gfd", "--oneshot=false"],
            "gpu-feature-discovery"
        ));
        assert!(matches_process(
            &["/usr/bin/gpu-feature-discovery"],
            "gpu-feature-discovery"
        ));
        // GFD's own config-manager sidecar runs `kiln device-plugin config-manager`.
        assert!(!matches_process(
            &["kiln", "device-plugin", "config-manager"],
            "gpu-feature-discovery"
        ));
        assert!(!matches_process(&["kiln", "gfd"], "nvidia-device-plugin"));
        assert!(!matches_process(
            &["kiln", "exporter"],
            "nvidia-device-plugin"
        ));
        assert!(!matches_process(&[], "x"));
    }

    #[tokio::test]
    async fn sidecar_keeps_the_file_on_a_missing_key_and_oneshot_reports_it() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("available");
        std::fs::create_dir(&src).unwrap();
        std::fs::write(src.join("default"), "version: v1\n").unwrap();
        std::fs::write(src.join("ts5"), "sharing: {}\n").unwrap();
        let m = ManagerOptions {
            dir: ConfigDir {
                dir: src,
                default_config: None,
                fallbacks: vec!["named".into()],
            },
            dst: t.path().join("config/config.yaml"),
            send_signal: false,
            signal: 1,
            process_to_signal: "nvidia-device-plugin".into(),
        };
        let (tx, rx) = mpsc::channel(4);
        for l in [None, Some("missing".to_owned()), Some("ts5".to_owned())] {
            tx.send(l).await.unwrap();
        }
        drop(tx);
        m.run(rx, false).await.unwrap();
        assert_eq!(std::fs::read_to_string(&m.dst).unwrap(), "sharing: {}\n");
        assert!(!m.apply(Some("ts5")).unwrap());

        let (tx, rx) = mpsc::channel(1);
        tx.send(Some("missing".into())).await.unwrap();
        let e = m.run(rx, true).await.unwrap_err();
        assert_eq!(e.to_string(), "specified config missing does not exist");
        assert_eq!(std::fs::read_to_string(&m.dst).unwrap(), "sharing: {}\n");
    }
}
