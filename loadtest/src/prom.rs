//! Checks on Prometheus text the gateway's and the engine's tests share.

/// Families of `text` (`# TYPE` lines) that have no `# HELP` line.
pub fn undescribed(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split_whitespace().next())
        .filter(|name| !text.contains(&format!("# HELP {name} ")))
        .collect()
}

/// The metric names a metrics module declares (`pub const X: &str = "…";`
/// lines of its `source`) that `help` has no text for.
pub fn missing_help<'a>(source: &'a str, help: &[(&str, &str)]) -> (usize, Vec<&'a str>) {
    let names: Vec<&str> = source
        .lines()
        .filter_map(|l| l.strip_prefix("pub const ")?.split_once(": &str = \"")?.1.strip_suffix("\";"))
        .collect();
    let missing = names.iter().copied().filter(|n| !help.iter().any(|(h, _)| h == n)).collect();
    (names.len(), missing)
}

#[cfg(test)]
mod tests {
    #[test]
    fn families_without_help_are_found() {
        let text = "# HELP a_total A.\n# TYPE a_total counter\na_total 1\n# TYPE b gauge\nb 2\n";
        assert_eq!(super::undescribed(text), vec!["b"]);
        let source = "pub const A: &str = \"a_total\";\npub const B: &str = \"b\";\nconst C: &str = \"c\";\n";
        assert_eq!(super::missing_help(source, &[("a_total", "A.")]), (2, vec!["b"]));
    }
}
