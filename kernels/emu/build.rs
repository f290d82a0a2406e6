//! Compiles kernels/cuda as C++ against cpp/host.h, with a table of entry
//! points (from `kernels::KERNELS`) that `emu_launch` looks names up in.

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let mut cpp = String::new();
    for (k, v) in kernels::defines() {
        let _ = writeln!(cpp, "#define {k} {v}");
    }
    let _ = writeln!(cpp, "#include \"{}\"", manifest.join("cpp/host.h").display());
    cpp.push_str(&kernels::source());
    cpp.push_str("\nstatic const emu_entry emu_table[] = {\n");
    for k in kernels::KERNELS {
        let _ = writeln!(cpp, "    {{\"{k}\", [](void** p) {{ emu_call(&{k}, p); }}}},");
    }
    cpp.push_str(
        "};\n\
         extern \"C\" int emu_launch(const char* name, unsigned gx, unsigned gy, unsigned gz, void** params) {\n\
         \x20   for (const emu_entry& e : emu_table)\n\
         \x20       if (std::strcmp(e.name, name) == 0) return emu_run(e.thunk, gx, gy, gz, params);\n\
         \x20   return -1;\n\
         }\n",
    );
    let file = out.join("kernels_emu.cpp");
    std::fs::write(&file, cpp).expect("writing the emulator source");
    cc::Build::new()
        .cpp(true)
        .file(&file)
        .flag("-std=c++20")
        .flag("-pthread")
        // No fused multiply-adds, so results are the same on every host
        // (the GPU fuses: within the tolerances the tests document).
        .flag("-ffp-contract=off")
        // The sources reinterpret buffers (16-byte vectors over bf16
        // arrays), as CUDA allows.
        .flag("-fno-strict-aliasing")
        .opt_level(2)
        .warnings(false)
        .compile("kernels_emu");
    println!("cargo:rustc-link-lib=pthread");
    println!("cargo:rerun-if-changed=cpp/host.h");
    println!("cargo:rerun-if-changed=../cuda");
    println!("cargo:rerun-if-changed=../src/lib.rs");
}
