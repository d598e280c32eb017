//! Compiles the vendored kubelet DRA v1, DRA health v1alpha1 and plugin-registration v1 protos
//! with protox (no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/dra/v1/api.proto",
        "proto/dra-health/v1alpha1/api.proto",
        "proto/pluginregistration/v1/api.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
