//! The standard plugins as one component, a **standard bundle**
//! (`kiln_plugin_std::STANDARD_BUNDLE_NAME`): the plugin host loads it under each standard
//! plugin's name and calls it with the context's `state` set to that name, which selects the
//! plugin's transform.
//!
//! Why one component: the standard plugins share most of their code (the SDK, the ClusterPolicy
//! spec and `apps/v1` DaemonSet parsers and serializers). Built as twenty components, each call
//! of a render ran its own compiled copy of that code, cold in the CPU's caches after the other
//! plugins' calls; measured on the upstream sample, parsing the 1.7 KB spec took about 50 µs
//! cold against about 12 µs when the same plugin ran again. One component, compiled once, keeps
//! that code hot while every call still runs in a fresh sandbox.
//!
//! `kiln-bundled-plugins` builds this crate with `--cfg kiln_standard_bundle`, which turns off
//! each plugin crate's own exports (`kiln_plugin_std::export_operand!`); built without it (or
//! natively) the plugin crates are ordinary standalone plugins.
//!
//! After the `;` come the bundled plugins configured by settings (`kiln_plugin_std::Plugin`),
//! which a policy names in a state's `then:` chain (`node-placement`).

kiln_plugin_std::export_standard_bundle!(
    kiln_plugin_cc_manager::CcManager,
    kiln_plugin_container_toolkit::ContainerToolkit,
    kiln_plugin_dcgm::Dcgm,
    kiln_plugin_dcgm_dra::DcgmDra,
    kiln_plugin_dcgm_exporter::DcgmExporter,
    kiln_plugin_dcgm_exporter_dra::DcgmExporterDra,
    kiln_plugin_device_plugin::DevicePlugin,
    kiln_plugin_dra_driver::DraDriver,
    kiln_plugin_dra_validation::DraValidation,
    kiln_plugin_driver::Driver,
    kiln_plugin_gpu_feature_discovery::GpuFeatureDiscovery,
    kiln_plugin_kata_device_plugin::KataDevicePlugin,
    kiln_plugin_kata_manager::KataManager,
    kiln_plugin_mig_manager::MigManager,
    kiln_plugin_mps_control_daemon::MpsControlDaemon,
    kiln_plugin_node_status_exporter::NodeStatusExporter,
    kiln_plugin_operator_metrics::OperatorMetrics,
    kiln_plugin_operator_validation::OperatorValidation,
    kiln_plugin_pre_requisites::PreRequisites,
    kiln_plugin_sandbox_device_plugin::SandboxDevicePlugin,
    kiln_plugin_sandbox_validation::SandboxValidation,
    kiln_plugin_vfio_manager::VfioManager,
    kiln_plugin_vgpu_device_manager::VgpuDeviceManager,
    kiln_plugin_vgpu_manager::VgpuManager;
    kiln_plugin_node_placement::NodePlacement,
);
