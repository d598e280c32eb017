//! The DCGM fields kiln knows: name, DCGM id, and how (or whether) NVML provides each.
//!
//! Ids and names follow go-dcgm's `dcgm_fields.h`; units follow DCGM's (MiB, W, mJ, MHz, %,
//! ns, ratios 0–1), converted from NVML's (bytes, mW, KiB/s, percent) here.
//!
//! NVML serves far more than its per-reading calls: through nvml-wrapper 0.13's safe
//! `field_values_for` (memory temperature, NVLink bandwidth and error counters, row remapping),
//! `violation_status`, `retired_pages` and the GPU Performance Monitoring API (`gpm_sample` /
//! `gpm_metrics_get`: the `DCGM_FI_PROF_*` activity ratios on Hopper and newer) kiln reads every
//! field of dcgm-exporter's `dcp-metrics-included.csv`, commented rows included, except
//! `DCGM_FI_DEV_VGPU_LICENSE_STATUS` (a vGPU guest's licence, no NVML reading) and the
//! exporter-computed `DCGM_EXP_*` families. A CSV naming one of those is accepted and the
//! field reported at start-up as unavailable.

use kiln_gpu::{DeviceInfo, DeviceSample};

/// A sample value. DCGM prints integer fields with `%d` and double fields with `%f`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// An integer field.
    Int(u64),
    /// A double field (printed with six decimals, as dcgm-exporter does).
    Float(f64),
}

/// Where a field's value comes from.
#[derive(Debug, Clone, Copy)]
pub enum Source {
    /// A reading of the GPU sample.
    Sample(fn(&DeviceSample) -> Option<Value>),
    /// `nvmlSystemGetDriverVersion` (a label field).
    DriverVersion,
    /// `nvmlSystemGetNVMLVersion` (a label field).
    NvmlVersion,
    /// A board or firmware string of the GPU (a label field).
    Info(fn(&DeviceInfo) -> Option<&str>),
    /// The last XID seen on the GPU, 0 before any (`DCGM_FI_DEV_XID_ERRORS`).
    LastXid,
    /// DCGM-only: NVML cannot provide it.
    Unavailable,
}

/// One known DCGM field.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// The DCGM name, e.g. `DCGM_FI_DEV_GPU_TEMP`.
    pub name: &'static str,
    /// The DCGM field id; families are emitted in ascending id, as dcgm-exporter does.
    pub id: u16,
    /// Where the value comes from.
    pub source: Source,
}

const MIB: u64 = 1 << 20;

fn int<T: Into<u64>>(v: Option<T>) -> Option<Value> {
    v.map(|v| Value::Int(v.into()))
}

fn ratio(v: Option<f64>) -> Option<Value> {
    v.map(Value::Float)
}

macro_rules! sample {
    ($f:expr) => {
        Source::Sample($f)
    };
}

macro_rules! info {
    ($field:ident) => {
        Source::Info(|i| i.$field.as_deref())
    };
}

/// Every field kiln recognises, in id order.
pub const FIELDS: &[Field] = &[
    Field {
        name: "DCGM_FI_DRIVER_VERSION",
        id: 1,
        source: Source::DriverVersion,
    },
    Field {
        name: "DCGM_FI_NVML_VERSION",
        id: 2,
        source: Source::NvmlVersion,
    },
    Field {
        name: "DCGM_FI_DEV_BRAND",
        id: 51,
        source: info!(brand),
    },
    Field {
        name: "DCGM_FI_DEV_SERIAL",
        id: 53,
        source: info!(serial),
    },
    Field {
        name: "DCGM_FI_DEV_OEM_INFOROM_VER",
        id: 56,
        source: info!(inforom_oem_version),
    },
    Field {
        name: "DCGM_FI_DEV_ECC_INFOROM_VER",
        id: 80,
        source: info!(inforom_ecc_version),
    },
    Field {
        name: "DCGM_FI_DEV_POWER_INFOROM_VER",
        id: 81,
        source: info!(inforom_power_version),
    },
    Field {
        name: "DCGM_FI_DEV_INFOROM_IMAGE_VER",
        id: 82,
        source: info!(inforom_image_version),
    },
    Field {
        name: "DCGM_FI_DEV_VBIOS_VERSION",
        id: 85,
        source: info!(vbios_version),
    },
    Field {
        name: "DCGM_FI_DEV_SM_CLOCK",
        id: 100,
        source: sample!(|s| int(s.sm_clock_mhz)),
    },
    Field {
        name: "DCGM_FI_DEV_MEM_CLOCK",
        id: 101,
        source: sample!(|s| int(s.mem_clock_mhz)),
    },
    Field {
        name: "DCGM_FI_DEV_MEMORY_TEMP",
        id: 140,
        source: sample!(|s| int(s.memory_temp_c)),
    },
    Field {
        name: "DCGM_FI_DEV_GPU_TEMP",
        id: 150,
        source: sample!(|s| int(s.gpu_temp_c)),
    },
    Field {
        name: "DCGM_FI_DEV_POWER_USAGE",
        id: 155,
        source: sample!(|s| s
            .power_usage_mw
            .map(|mw| Value::Float(f64::from(mw) / 1000.0))),
    },
    Field {
        name: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        id: 156,
        source: sample!(|s| int(s.total_energy_mj)),
    },
    Field {
        name: "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
        id: 200,
        source: sample!(|s| int(s.pcie_tx_kib_per_s)),
    },
    Field {
        name: "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        id: 201,
        source: sample!(|s| int(s.pcie_rx_kib_per_s)),
    },
    Field {
        name: "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        id: 202,
        source: sample!(|s| int(s.pcie_replay_count)),
    },
    Field {
        name: "DCGM_FI_DEV_GPU_UTIL",
        id: 203,
        source: sample!(|s| int(s.gpu_util_pct)),
    },
    Field {
        name: "DCGM_FI_DEV_MEM_COPY_UTIL",
        id: 204,
        source: sample!(|s| int(s.mem_copy_util_pct)),
    },
    Field {
        name: "DCGM_FI_DEV_ENC_UTIL",
        id: 206,
        source: sample!(|s| int(s.enc_util_pct)),
    },
    Field {
        name: "DCGM_FI_DEV_DEC_UTIL",
        id: 207,
        source: sample!(|s| int(s.dec_util_pct)),
    },
    Field {
        name: "DCGM_FI_DEV_XID_ERRORS",
        id: 230,
        source: Source::LastXid,
    },
    Field {
        name: "DCGM_FI_DEV_POWER_VIOLATION",
        id: 240,
        source: sample!(|s| int(s.power_violation_ns)),
    },
    Field {
        name: "DCGM_FI_DEV_THERMAL_VIOLATION",
        id: 241,
        source: sample!(|s| int(s.thermal_violation_ns)),
    },
    Field {
        name: "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
        id: 242,
        source: sample!(|s| int(s.sync_boost_violation_ns)),
    },
    Field {
        name: "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
        id: 243,
        source: sample!(|s| int(s.board_limit_violation_ns)),
    },
    Field {
        name: "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
        id: 244,
        source: sample!(|s| int(s.low_util_violation_ns)),
    },
    Field {
        name: "DCGM_FI_DEV_RELIABILITY_VIOLATION",
        id: 245,
        source: sample!(|s| int(s.reliability_violation_ns)),
    },
    Field {
        name: "DCGM_FI_DEV_FB_TOTAL",
        id: 250,
        source: sample!(|s| int(s.fb_total_bytes.map(|b| b / MIB))),
    },
    Field {
        name: "DCGM_FI_DEV_FB_FREE",
        id: 251,
        source: sample!(|s| int(s.fb_free_bytes.map(|b| b / MIB))),
    },
    Field {
        name: "DCGM_FI_DEV_FB_USED",
        id: 252,
        source: sample!(|s| int(s.fb_used_bytes.map(|b| b / MIB))),
    },
    Field {
        name: "DCGM_FI_DEV_FB_RESERVED",
        id: 253,
        source: sample!(|s| int(s.fb_reserved_bytes.map(|b| b / MIB))),
    },
    Field {
        name: "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        id: 310,
        source: sample!(|s| int(s.ecc_sbe_volatile)),
    },
    Field {
        name: "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        id: 311,
        source: sample!(|s| int(s.ecc_dbe_volatile)),
    },
    Field {
        name: "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        id: 312,
        source: sample!(|s| int(s.ecc_sbe_aggregate)),
    },
    Field {
        name: "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        id: 313,
        source: sample!(|s| int(s.ecc_dbe_aggregate)),
    },
    Field {
        name: "DCGM_FI_DEV_RETIRED_SBE",
        id: 390,
        source: sample!(|s| int(s.retired_pages_sbe)),
    },
    Field {
        name: "DCGM_FI_DEV_RETIRED_DBE",
        id: 391,
        source: sample!(|s| int(s.retired_pages_dbe)),
    },
    Field {
        name: "DCGM_FI_DEV_RETIRED_PENDING",
        id: 392,
        source: sample!(|s| int(s.retired_pages_pending)),
    },
    Field {
        name: "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        id: 393,
        source: sample!(|s| int(s.remapped_rows_uncorrectable)),
    },
    Field {
        name: "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        id: 394,
        source: sample!(|s| int(s.remapped_rows_correctable)),
    },
    Field {
        name: "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        id: 395,
        source: sample!(|s| int(s.row_remap_failure)),
    },
    Field {
        name: "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        id: 409,
        source: sample!(|s| int(s.nvlink_crc_flit_errors)),
    },
    Field {
        name: "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        id: 419,
        source: sample!(|s| int(s.nvlink_crc_data_errors)),
    },
    Field {
        name: "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        id: 429,
        source: sample!(|s| int(s.nvlink_replay_errors)),
    },
    Field {
        name: "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        id: 439,
        source: sample!(|s| int(s.nvlink_recovery_errors)),
    },
    Field {
        name: "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0",
        id: 440,
        source: sample!(|s| int(s.nvlink_bandwidth_l0)),
    },
    Field {
        name: "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        id: 449,
        source: sample!(|s| int(s.nvlink_bandwidth_total)),
    },
    Field {
        name: "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        id: 526,
        source: Source::Unavailable,
    },
    Field {
        name: "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        id: 1001,
        source: sample!(|s| ratio(s.gr_engine_active)),
    },
    Field {
        name: "DCGM_FI_PROF_SM_ACTIVE",
        id: 1002,
        source: sample!(|s| ratio(s.sm_active)),
    },
    Field {
        name: "DCGM_FI_PROF_SM_OCCUPANCY",
        id: 1003,
        source: sample!(|s| ratio(s.sm_occupancy)),
    },
    Field {
        name: "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        id: 1004,
        source: sample!(|s| ratio(s.tensor_active)),
    },
    Field {
        name: "DCGM_FI_PROF_DRAM_ACTIVE",
        id: 1005,
        source: sample!(|s| ratio(s.dram_active)),
    },
    Field {
        name: "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        id: 1006,
        source: sample!(|s| ratio(s.fp64_active)),
    },
    Field {
        name: "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        id: 1007,
        source: sample!(|s| ratio(s.fp32_active)),
    },
    Field {
        name: "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        id: 1008,
        source: sample!(|s| ratio(s.fp16_active)),
    },
    Field {
        name: "DCGM_FI_PROF_PCIE_TX_BYTES",
        id: 1009,
        source: sample!(|s| int(s.pcie_tx_kib_per_s.map(|k| u64::from(k) * 1024))),
    },
    Field {
        name: "DCGM_FI_PROF_PCIE_RX_BYTES",
        id: 1010,
        source: sample!(|s| int(s.pcie_rx_kib_per_s.map(|k| u64::from(k) * 1024))),
    },
    Field {
        name: "DCGM_EXP_XID_ERRORS_COUNT",
        id: 9001,
        source: Source::Unavailable,
    },
    Field {
        name: "DCGM_EXP_CLOCK_EVENTS_COUNT",
        id: 9002,
        source: Source::Unavailable,
    },
    Field {
        name: "DCGM_EXP_GPU_HEALTH_STATUS",
        id: 9003,
        source: Source::Unavailable,
    },
    Field {
        name: "DCGM_EXP_P2P_STATUS",
        id: 9004,
        source: Source::Unavailable,
    },
];

/// Looks a field up by its DCGM name.
#[must_use]
pub fn field_by_name(name: &str) -> Option<&'static Field> {
    FIELDS.iter().find(|f| f.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_in_id_order_without_duplicates() {
        assert!(FIELDS.windows(2).all(|w| w[0].id < w[1].id));
        let mut names: Vec<_> = FIELDS.iter().map(|f| f.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FIELDS.len());
    }

    #[test]
    fn units_are_converted_to_dcgm_units() {
        let s = DeviceSample {
            power_usage_mw: Some(72345),
            fb_used_bytes: Some(3 * MIB + 5),
            pcie_tx_kib_per_s: Some(2),
            ..DeviceSample::default()
        };
        let get = |n| match field_by_name(n).unwrap().source {
            Source::Sample(f) => f(&s),
            _ => panic!("{n} is not a sample field"),
        };
        assert_eq!(get("DCGM_FI_DEV_POWER_USAGE"), Some(Value::Float(72.345)));
        assert_eq!(get("DCGM_FI_DEV_FB_USED"), Some(Value::Int(3)));
        assert_eq!(get("DCGM_FI_PROF_PCIE_TX_BYTES"), Some(Value::Int(2048)));
        assert_eq!(get("DCGM_FI_DEV_GPU_TEMP"), None);
    }
}
