//! Compiles `zerg/v1/*.proto` with protox (a pure-Rust protobuf compiler), so no `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["zerg/v1/control.proto", "zerg/v1/worker.proto"];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["."])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
