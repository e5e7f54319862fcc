//! Translates the WGSL shaders in shaders/ to SPIR-V (OUT_DIR/<name>.spv) with naga, validating
//! them first, so a shader mistake is a build error rather than a run-time one.

use std::path::Path;

const SHADERS: [&str; 3] = ["frame", "boxes", "labels"];

fn main() {
    let out_dir = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR for build scripts");
    for name in SHADERS {
        let source_path = format!("shaders/{name}.wgsl");
        println!("cargo:rerun-if-changed={source_path}");
        let source = std::fs::read_to_string(&source_path)
            .unwrap_or_else(|e| panic!("reading {source_path}: {e}"));
        let words = translate(&source_path, &source);
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let out = Path::new(&out_dir).join(format!("{name}.spv"));
        std::fs::write(&out, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
    }
}

fn translate(path: &str, source: &str) -> Vec<u32> {
    let module = naga::front::wgsl::parse_str(source)
        .unwrap_or_else(|e| panic!("{}", e.emit_to_string_with_path(source, path)));
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::empty(),
    )
    .validate(&module)
    .unwrap_or_else(|e| panic!("{path}: {}", e.emit_to_string_with_path(source, path)));
    // ADJUST_COORDINATE_SPACE (in the defaults) flips clip-space y, so the shaders keep WGSL's
    // convention (y up) and the rows of the target still run top to bottom.
    let options = naga::back::spv::Options::default();
    naga::back::spv::write_vec(&module, &info, &options, None)
        .unwrap_or_else(|e| panic!("{path}: SPIR-V output failed: {e}"))
}
