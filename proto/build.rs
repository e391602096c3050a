//! Compiles `floodgate/v1/*.proto` with protox (pure Rust), so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["floodgate/v1/mirror.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
