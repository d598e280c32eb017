//! The unified-memory device nodes CUDA opens first, `/dev/nvidia-uvm` and
//! `/dev/nvidia-uvm-tools` (gpu-operator #2685: validators Ready while CUDA could not start
//! because they were missing). The driver step creates them on the host as upstream's
//! validator does (nvidia-ctk's `create-dev-char-symlinks --create-device-nodes`): character
//! devices with the `nvidia-uvm` major from `/proc/devices`, minors 0 and 1; the toolkit step
//! then checks that the container runtime passed them in.

use std::path::{Path, PathBuf};

use crate::NotReady;

/// The two nodes and their minor numbers.
pub const UVM_NODES: [(&str, u32); 2] = [("nvidia-uvm", 0), ("nvidia-uvm-tools", 1)];

/// Creates a character device node `path` with `major:minor`, mode 0666.
pub type MakeNode = Box<dyn Fn(&Path, u32, u32) -> std::io::Result<()>>;

/// The real [`MakeNode`]: `mknod(path, S_IFCHR | 0666, makedev(major, minor))` (needs
/// `CAP_MKNOD`: the validator runs privileged, as upstream's).
///
/// # Errors
/// The OS error.
pub fn mknod_char(path: &Path, major: u32, minor: u32) -> std::io::Result<()> {
    use rustix::fs::{CWD, FileType, Mode, makedev, mknodat};
    mknodat(
        CWD,
        path,
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o666),
        makedev(major, minor),
    )?;
    Ok(())
}

/// The character-device major of `name` in a `/proc/devices` text (`Character devices:`
/// section, `<major> <name>` lines).
#[must_use]
pub fn char_major(proc_devices: &str, name: &str) -> Option<u32> {
    let mut in_char = false;
    for line in proc_devices.lines() {
        let line = line.trim();
        if line.ends_with("devices:") {
            in_char = line == "Character devices:";
            continue;
        }
        if !in_char {
            continue;
        }
        if let Some((major, n)) = line.split_once(char::is_whitespace)
            && n.trim() == name
        {
            return major.parse().ok();
        }
    }
    None
}

/// Makes sure `dev/nvidia-uvm` and `dev/nvidia-uvm-tools` exist under `dev_root`, creating the
/// missing ones with the `nvidia-uvm` major read from `proc_devices`. Returns the nodes created.
///
/// # Errors
/// [`NotReady::UvmNodes`] naming the node and what is missing: the `nvidia-uvm` kernel module
/// (no entry in `/proc/devices`), or the permission to create it.
pub fn ensure_uvm_nodes(
    dev_root: &Path,
    proc_devices: &Path,
    make: &dyn Fn(&Path, u32, u32) -> std::io::Result<()>,
) -> Result<Vec<PathBuf>, NotReady> {
    let mut created = Vec::new();
    for (name, minor) in UVM_NODES {
        let path = dev_root.join("dev").join(name);
        if path.symlink_metadata().is_ok() {
            continue;
        }
        let text = std::fs::read_to_string(proc_devices).unwrap_or_default();
        let Some(major) = char_major(&text, "nvidia-uvm") else {
            return Err(NotReady::UvmNodes {
                path,
                reason: format!(
                    "the nvidia-uvm kernel module is not loaded ({} lists no nvidia-uvm character device)",
                    proc_devices.display()
                ),
            });
        };
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        make(&path, major, minor).map_err(|e| NotReady::UvmNodes {
            path: path.clone(),
            reason: format!("creating it as character device {major}:{minor} failed: {e}"),
        })?;
        tracing::info!(node = %path.display(), major, minor, "created the CUDA unified-memory device node");
        created.push(path);
    }
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROC_DEVICES: &str = "Character devices:\n  1 mem\n195 nvidia-frontend\n237 nvidia-uvm\n238 nvidia-caps\n\nBlock devices:\n  7 loop\n237 nvidia-uvm-fake-block\n";

    #[test]
    fn the_major_comes_from_the_character_section() {
        assert_eq!(char_major(PROC_DEVICES, "nvidia-uvm"), Some(237));
        assert_eq!(char_major(PROC_DEVICES, "nvidia-frontend"), Some(195));
        assert_eq!(char_major(PROC_DEVICES, "loop"), None);
        assert_eq!(char_major("", "nvidia-uvm"), None);
    }
}
