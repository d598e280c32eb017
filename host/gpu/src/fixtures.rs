//! Ready-made [`crate::FakeBackend`] fixtures, for tests and for trying the agents without a GPU
//! (write one to a file and pass `--gpu-backend fake:<file>`). The format is described in the
//! [`crate::fake`](crate::FakeBackend) module docs.

/// One NVIDIA H100 80GB (compute capability 9.0, no MIG field) on driver 550.144.03, CUDA 12.4.
/// Its UUID is `GPU-11111111-2222-3333-4444-555555555555`.
pub const ONE_H100: &str = r#"driver_version: "550.144.03"
cuda_version: "12.4"
gpus:
  - uuid: GPU-11111111-2222-3333-4444-555555555555
    name: NVIDIA H100 80GB HBM3
    memory_total_mib: 81559
    compute_capability: "9.0"
"#;

#[cfg(test)]
mod tests {
    use crate::{FakeBackend, GpuInventory};

    #[test]
    fn one_h100_parses_to_one_gpu() {
        let fake = FakeBackend::new(serde_yaml_ng::from_str(super::ONE_H100).unwrap());
        let gpus = fake.devices().unwrap();
        assert_eq!(gpus.len(), 1);
        assert_eq!(gpus[0].uuid, "GPU-11111111-2222-3333-4444-555555555555");
        assert_eq!(gpus[0].memory_total_bytes, 81559 << 20);
        assert_eq!(gpus[0].compute_capability, (9, 0));
        assert_eq!(fake.system().unwrap().driver_version, "550.144.03");
    }
}
