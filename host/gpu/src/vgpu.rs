//! vGPU guest detection from a GPU's PCI configuration space, as NVIDIA's GFD does it
//! (`internal/vgpu`): a vGPU exposes a vendor-specific PCI capability (id `0x09`) whose bytes 3–4
//! are `VF`, followed by records; the record list ends with a zero record carrying the host
//! driver's version and branch (10 bytes each, NUL-padded).

use crate::VgpuGuest;

/// Offset of the PCI status register.
const STATUS: usize = 0x06;
/// Status bit: the device has a capability list.
const STATUS_CAP_LIST: u8 = 0x10;
/// Offset of the first capability pointer.
const CAP_LIST: usize = 0x34;
/// Capability id of a vendor-specific capability.
const CAP_VENDOR: u8 = 0x09;
/// First record of the vGPU capability.
const RECORD_START: usize = 5;
/// Length of the host driver version and branch fields.
const FIELD_LEN: usize = 10;

/// The vGPU guest information in `config` (a device's whole 256-byte configuration space),
/// `None` when it carries no vGPU capability or its record list has no driver record.
#[must_use]
pub fn from_pci_config(config: &[u8]) -> Option<VgpuGuest> {
    let cap = vendor_capability(config)?;
    if cap.len() < 5 || cap[3] != b'V' || cap[4] != b'F' {
        return None;
    }
    let mut pos = RECORD_START;
    while *cap.get(pos)? != 0 {
        let len = usize::from(*cap.get(pos + 1)?);
        if len == 0 {
            return None;
        }
        pos += len;
    }
    let text = |from: usize| {
        let raw = cap.get(from..from + FIELD_LEN)?;
        Some(String::from_utf8_lossy(raw).trim_matches('\0').to_owned())
    };
    Some(VgpuGuest {
        host_driver_version: Some(text(pos + 2)?),
        host_driver_branch: Some(text(pos + 2 + FIELD_LEN)?),
    })
}

/// The bytes of the first vendor-specific capability (its length byte is at offset 2).
fn vendor_capability(config: &[u8]) -> Option<&[u8]> {
    if config.len() < 256 || config[STATUS] & STATUS_CAP_LIST == 0 {
        return None;
    }
    let mut visited = [false; 256];
    let mut pos = usize::from(config[CAP_LIST]);
    while pos != 0 && !visited[pos] {
        visited[pos] = true;
        let id = config[pos];
        if id == 0xff {
            return None;
        }
        if id == CAP_VENDOR {
            let len = usize::from(*config.get(pos + 2)?);
            return config.get(pos..pos + len);
        }
        pos = usize::from(*config.get(pos + 1)?);
    }
    None
}

/// The sysfs directory name of an NVML PCI bus id: `00000000:8D:00.0` → `0000:8d:00.0`.
#[must_use]
pub fn sysfs_address(bus_id: &str) -> String {
    let lower = bus_id.to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => lower,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A configuration space with a power-management capability at 0x40 and, behind it, a
    /// vendor capability at 0x60 holding one 4-byte record and the driver record.
    fn config(signature: &[u8; 2]) -> Vec<u8> {
        let mut c = vec![0u8; 256];
        c[STATUS] = STATUS_CAP_LIST;
        c[CAP_LIST] = 0x40;
        c[0x40..0x42].copy_from_slice(&[0x01, 0x60]);
        let mut cap = vec![CAP_VENDOR, 0x00, 0, signature[0], signature[1]];
        cap.extend([7, 4, 0xaa, 0xbb]); // a record of 4 bytes
        cap.extend([0, 0]); // the driver record
        cap.extend(b"550.54.16\0");
        cap.extend(b"r550_00\0\0\0");
        cap[2] = cap.len() as u8;
        c[0x60..0x60 + cap.len()].copy_from_slice(&cap);
        c
    }

    #[test]
    fn the_driver_record_gives_the_host_version_and_branch() {
        let g = from_pci_config(&config(b"VF")).unwrap();
        assert_eq!(g.host_driver_version.as_deref(), Some("550.54.16"));
        assert_eq!(g.host_driver_branch.as_deref(), Some("r550_00"));
    }

    #[test]
    fn other_devices_and_short_or_looping_spaces_are_not_vgpus() {
        assert_eq!(from_pci_config(&config(b"XX")), None);
        assert_eq!(from_pci_config(&config(b"VF")[..64]), None);
        let mut no_list = config(b"VF");
        no_list[STATUS] = 0;
        assert_eq!(from_pci_config(&no_list), None);
        let mut looping = config(b"VF");
        looping[0x41] = 0x40;
        assert_eq!(from_pci_config(&looping), None);
        let mut truncated = config(b"VF");
        truncated[0x62] = 12;
        assert_eq!(from_pci_config(&truncated), None);
    }

    #[test]
    fn sysfs_addresses_have_a_four_digit_lowercase_domain() {
        assert_eq!(sysfs_address("00000000:8D:00.0"), "0000:8d:00.0");
        assert_eq!(sysfs_address("0000:3b:00.0"), "0000:3b:00.0");
    }
}
