//! The gateway crate's modules depend on each other without cycles: each
//! top-level module's `crate::` paths (tests and comments aside) form a
//! graph that must be acyclic, so any module can be read, tested and
//! replaced from the bottom up. Also the tree-wide rule that no script,
//! test or CI step ends a process by its name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[path = "../../engine/tests/common/modgraph.rs"]
mod modgraph;
use modgraph::{code, names, rust_files};

#[test]
fn the_gateway_modules_form_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let top = rel.iter().next().unwrap().to_str().unwrap().trim_end_matches(".rs").to_string();
        if top == "lib" || top == "main" || rel.ends_with("tests.rs") {
            continue;
        }
        let deps = names(&code(&std::fs::read_to_string(f).unwrap()));
        graph.entry(top.clone()).or_default().extend(deps.into_iter().filter(|d| *d != top));
    }
    assert!(graph.len() > 20, "found the modules: {:?}", graph.keys());
    // Depth-first search for a back edge; report the cycle it closes.
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut cycle = path[i..].to_vec();
            cycle.push(m.to_string());
            return Some(cycle);
        }
        if !done.insert(m.to_string()) {
            return None;
        }
        path.push(m.to_string());
        for d in graph.get(m).into_iter().flatten() {
            if let Some(c) = visit(d, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for m in graph.keys() {
        let cycle = visit(m, &graph, &mut Vec::new(), &mut done);
        assert!(cycle.is_none(), "module cycle: {}", cycle.unwrap().join(" -> "));
    }
}

/// Every file of the repository a script, test or CI step can live in (build
/// outputs, benchmark outputs and fetched tools aside).
fn tree_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            if !matches!(
                name.as_str(),
                "target" | ".git" | "bench-out" | "certs" | "node_modules" | "work" | "artifacts"
            ) {
                tree_files(&p, out);
            }
        } else {
            out.push(p);
        }
    }
}

/// On a shared machine a name can match a process the script did not
/// start: scripts, tests and CI end only the process ids (or groups) they
/// started, or stop a service through its own control. Any use of the
/// by-name tools fails this test, with the file and line.
#[test]
fn no_process_is_ended_by_its_name() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    // Spelled in pieces so that this file does not match itself.
    let banned = [["p", "kill"].concat(), ["kill", "all"].concat(), ["pid", "of"].concat()];
    let by_name_pgrep = ["pgrep -", "f"].concat();
    let mut files = Vec::new();
    tree_files(root, &mut files);
    assert!(files.iter().any(|f| f.ends_with("scripts/test-all")), "walked the repository from {root:?}");
    let mut found = Vec::new();
    for f in &files {
        let Ok(text) = std::fs::read_to_string(f) else { continue };
        for (n, line) in text.lines().enumerate() {
            let words = line.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'));
            if words.clone().any(|w| banned.iter().any(|b| w == b)) || line.contains(&by_name_pgrep) {
                found.push(format!("{}:{}: {}", f.strip_prefix(root).unwrap().display(), n + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "processes ended by name:\n{}", found.join("\n"));
}

/// `policies` is the bottom of the workspace: pure decisions every crate
/// runs (gateway, engine, simulator), depending on no crate of ours.
#[test]
fn policies_depends_on_no_crate_of_ours() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let workspace = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let ours: Vec<&str> = workspace
        .lines()
        .filter(|l| l.contains("path = \""))
        .filter_map(|l| l.split('=').next().map(str::trim))
        .collect();
    assert!(ours.contains(&"engine-api"), "the workspace's own crates are path dependencies: {ours:?}");
    let manifest = std::fs::read_to_string(root.join("policies/Cargo.toml")).unwrap();
    let deps = manifest.split("[dependencies]").nth(1).unwrap_or("");
    let deps = deps.split("\n[").next().unwrap_or("");
    for line in deps.lines() {
        let name = line.split('=').next().unwrap_or("").trim();
        assert!(name.is_empty() || !ours.contains(&name), "policies depends on {name}, a crate of ours");
    }
}
