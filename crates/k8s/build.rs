//! Generates the kubelet's gRPC interfaces (DRA v1, plugin registration v1) from the .proto
//! files in `proto/`, with the `protoc` that `protoc-bin-vendored` ships: no system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // prost-build runs the protoc that PROTOC names.
    std::env::set_var("PROTOC", protoc);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(
            &["proto/dra_v1.proto", "proto/pluginregistration_v1.proto"],
            &["proto"],
        )?;
    Ok(())
}
