//! Compiles `zerg/v1/*.proto` with protox (a pure-Rust protobuf compiler), so no `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["zerg/v1/control.proto", "zerg/v1/worker.proto"];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["."])?;
    // The encoded descriptors, for gRPC reflection (`grpcurl list` without the .proto files).
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("zerg_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
