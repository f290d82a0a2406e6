//! The engine's modules are layered, bottom to top, and every `crate::`
//! path (tests and comments aside) points down the layers: a module can be
//! read, tested and replaced knowing only what is below it. The layers:
//!
//! 1. foundations: `clock`, `stop`, `stats`, `metrics`, `body`, `kv`;
//! 2. `models`: the LM and video models as host math;
//! 3. `gpu`: the models' GPU implementations (stubs without CUDA);
//! 4. `backend`: the scheduler's `Backend` and its emulated, cpu and cuda
//!    adapters;
//! 5. serving: `scheduler`, `video` (sessions), `diffusion` (jobs), then
//!    `http` (what handlers share), `openai`, `routes`, `server`,
//!    `registry`, `cli`;
//! 6. `tools`: offline commands (`engine profile`, `gpu-check`,
//!    `gpu-bench`).
//!
//! The crate root (`lib.rs`: the `Engine` and its start) sits on top.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Bottom to top; a module may name only modules before it (and `api`,
/// the re-exported `engine-api` crate).
const LAYERS: [&str; 20] = [
    "api",
    "clock",
    "stop",
    "stats",
    "metrics",
    "body",
    "kv",
    "models",
    "gpu",
    "backend",
    "scheduler",
    "video",
    "diffusion",
    "http",
    "openai",
    "routes",
    "server",
    "registry",
    "cli",
    "tools",
];

#[path = "common/modgraph.rs"]
mod modgraph;
use modgraph::{code, names, rust_files};

/// Each top-level module and the modules its code names, with the file
/// that names each.
fn graph() -> BTreeMap<String, BTreeMap<String, String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let top = rel.iter().next().unwrap().to_str().unwrap().trim_end_matches(".rs").to_string();
        if top == "lib" || top == "main" || rel.ends_with("tests.rs") {
            continue;
        }
        let entry = graph.entry(top.clone()).or_default();
        for d in names(&code(&std::fs::read_to_string(f).unwrap())) {
            if d != top {
                entry.entry(d).or_insert_with(|| rel.display().to_string());
            }
        }
    }
    graph
}

#[test]
fn every_engine_module_names_only_the_layers_below_it() {
    let graph = graph();
    let modules: BTreeSet<&str> = graph.keys().map(String::as_str).collect();
    let listed: BTreeSet<&str> = LAYERS.iter().copied().filter(|m| *m != "api").collect();
    assert_eq!(modules, listed, "every top-level module is in LAYERS, and only those");
    let rank = |m: &str| LAYERS.iter().position(|l| *l == m);
    let mut upward = Vec::new();
    for (m, deps) in &graph {
        let own = rank(m).unwrap();
        // Names that are not modules (items of the crate root) are not edges.
        for (d, file) in deps.iter().filter(|(d, _)| rank(d).is_some()) {
            if rank(d).unwrap() >= own {
                upward.push(format!("{file}: {m} names {d}, a layer above it"));
            }
        }
    }
    assert!(upward.is_empty(), "imports pointing up the layers:\n{}", upward.join("\n"));
}

#[test]
fn the_layer_check_sees_an_upward_import() {
    // The parser the layer test rests on: grouped, nested and plain paths,
    // comments and test modules skipped.
    let text = "use crate::{gpu::video::X, kv, models::{lm, video}};\n// crate::tools\nfn f() { crate::server::serve(); }\n#[cfg(test)]\nmod tests {\n    use crate::cli;\n}\n";
    let got = names(&code(text));
    let want: BTreeSet<String> = ["gpu", "kv", "models", "server"].iter().map(|s| s.to_string()).collect();
    assert_eq!(got, want);
}
