//! Where the `engine` executable that `gateway up` starts is.
//!
//! The gateway links no engine code: its children are the workspace's
//! `engine` binary, found (in this order) at `$GATEWAY_ENGINE_BIN`, or
//! beside the gateway's own executable (`target/<profile>/engine`, where
//! cargo puts both). When it is missing there and the gateway runs under
//! cargo (`cargo run -p gateway -- up` sets `CARGO`), it is built first
//! with `cargo build -p engine` of the same profile, its output on stderr.

use std::path::{Path, PathBuf};

/// The environment variable that names the engine executable.
pub const ENGINE_BIN_ENV: &str = "GATEWAY_ENGINE_BIN";

/// The engine executable, built first if it is missing and cargo is here.
pub fn locate() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(ENGINE_BIN_ENV).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("{ENGINE_BIN_ENV}={}: no such file", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("finding the gateway executable: {e}"))?;
    let dir = exe.parent().ok_or("the gateway executable has no directory")?;
    // Test binaries live one level down, in `target/<profile>/deps`.
    let dir = if dir.ends_with("deps") { dir.parent().unwrap_or(dir) } else { dir };
    let beside = dir.join(format!("engine{}", std::env::consts::EXE_SUFFIX));
    if beside.is_file() {
        return Ok(beside);
    }
    build_with_cargo(dir)?;
    if beside.is_file() {
        Ok(beside)
    } else {
        Err(format!(
            "no engine executable at {} (build it: cargo build --release -p engine, or set {ENGINE_BIN_ENV})",
            beside.display()
        ))
    }
}

/// `cargo build -p engine` for the profile whose output directory is
/// `dir`, when the gateway runs under cargo; else nothing.
fn build_with_cargo(dir: &Path) -> Result<(), String> {
    let (Some(cargo), Some(manifest)) = (std::env::var_os("CARGO"), std::env::var_os("CARGO_MANIFEST_DIR"))
    else {
        return Ok(());
    };
    eprintln!("gateway: building the engine executable (cargo build -p engine) ...");
    let mut cmd = std::process::Command::new(cargo);
    cmd.args(["build", "-p", "engine"]).current_dir(manifest).stdout(std::process::Stdio::null());
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let status = cmd.status().map_err(|e| format!("running cargo build -p engine: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("cargo build -p engine failed ({status})"))
    }
}
