//! The policy document as text: key paths, the line each is on, what
//! changed between two versions, and tenant keys kept out of what is shown.
//!
//! Key paths are written as in error messages: `tiers.gold.e2e_ms`,
//! `tenants[0].keys[1]`, `brownout.levels[2].tiers.bronze.output_scale`.
//! Tenant API keys (`tenants[i].keys`) are secrets: diffs say how many
//! there are and whether they changed, never what they are.

use std::collections::BTreeMap;
use std::fmt;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// One key whose value differs between two documents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub key: String,
    /// The old value as TOML, `None` when the key was added.
    pub old: Option<String>,
    /// The new value as TOML, `None` when the key was removed.
    pub new: Option<String>,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(unset)".into());
        write!(f, "{}: {} -> {}", self.key, show(&self.old), show(&self.new))
    }
}

/// What changed from `old` to `new`, by key path in path order. A text that
/// is not TOML counts as empty.
pub fn diff(old: &str, new: &str) -> Vec<Change> {
    let (a, b) = (leaves(old), leaves(new));
    let mut out = Vec::new();
    for (key, (value, shown)) in &a {
        match b.get(key) {
            Some((v, _)) if v == value => {}
            Some((_, s)) => {
                out.push(Change { key: key.clone(), old: Some(shown.clone()), new: Some(s.clone()) })
            }
            None => out.push(Change { key: key.clone(), old: Some(shown.clone()), new: None }),
        }
    }
    for (key, (_, shown)) in &b {
        if !a.contains_key(key) {
            out.push(Change { key: key.clone(), old: None, new: Some(shown.clone()) });
        }
    }
    out.sort_by(|x, y| x.key.cmp(&y.key));
    out
}

/// One line for logs and the audit trail: the first few changes and a count.
pub fn summary(changes: &[Change]) -> String {
    const SHOWN: usize = 6;
    if changes.is_empty() {
        return "no changes".into();
    }
    let mut s: Vec<String> = changes.iter().take(SHOWN).map(Change::to_string).collect();
    if changes.len() > SHOWN {
        s.push(format!("and {} more", changes.len() - SHOWN));
    }
    s.join("; ")
}

/// Leaf key paths with their value (to compare) and how it is shown.
fn leaves(text: &str) -> BTreeMap<String, (toml::Value, String)> {
    let mut out = BTreeMap::new();
    if let Ok(table) = toml::from_str::<toml::Table>(text) {
        for (k, v) in &table {
            flatten(k.clone(), v, &mut out);
        }
    }
    out
}

fn flatten(path: String, v: &toml::Value, out: &mut BTreeMap<String, (toml::Value, String)>) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                flatten(format!("{path}.{k}"), v, out);
            }
        }
        toml::Value::Array(a) if a.iter().any(toml::Value::is_table) => {
            for (i, x) in a.iter().enumerate() {
                flatten(format!("{path}[{i}]"), x, out);
            }
        }
        _ => {
            let shown = if is_secret(&path) {
                let n = v.as_array().map_or(1, Vec::len);
                format!("<{n} key{} redacted>", if n == 1 { "" } else { "s" })
            } else {
                v.to_string()
            };
            out.insert(path, (v.clone(), shown));
        }
    }
}

fn is_secret(path: &str) -> bool {
    path.starts_with("tenants[") && path.ends_with(".keys")
}

/// A key path split into table keys and array indices.
#[derive(Debug, PartialEq)]
enum Segment<'a> {
    Key(&'a str),
    Index(usize),
}

fn segments(path: &str) -> Vec<Segment<'_>> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (key, mut rest) = part.split_once('[').map_or((part, ""), |(k, r)| (k, r));
        if !key.is_empty() {
            out.push(Segment::Key(key));
        }
        while let Some((index, tail)) = rest.split_once(']') {
            match index.parse() {
                Ok(i) => out.push(Segment::Index(i)),
                Err(_) => return out,
            }
            rest = tail.strip_prefix('[').unwrap_or(tail);
        }
    }
    out
}

/// The 1-based line of `path` in `text`: where its key is written, or the
/// nearest enclosing key that is written (a missing key's table).
pub fn line_of(text: &str, path: &str) -> Option<usize> {
    let root = DeTable::parse(text).ok()?;
    let mut at = None;
    let mut value: Option<&Spanned<DeValue<'_>>> = None;
    for seg in segments(path) {
        match seg {
            Segment::Key(k) => {
                let table = match value.map(Spanned::get_ref) {
                    None => root.get_ref(),
                    Some(DeValue::Table(t)) => t,
                    Some(_) => break,
                };
                let Some((key, v)) = table.iter().find(|(key, _)| key.get_ref() == k) else { break };
                at = Some(key.span().start);
                value = Some(v);
            }
            Segment::Index(i) => {
                let Some(DeValue::Array(a)) = value.map(Spanned::get_ref) else { break };
                let Some(item) = a.get(i) else { break };
                at = Some(item.span().start);
                value = Some(item);
            }
        }
    }
    at.map(|offset| line_at(text, offset))
}

/// The 1-based line and column of byte `offset`.
pub fn line_at(text: &str, offset: usize) -> usize {
    line_column(text, offset).0
}

pub(crate) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before.chars().count() - before.rfind('\n').map_or(0, |p| before[..=p].chars().count()) + 1;
    (line, column)
}

/// `text` with every tenant API key replaced by `"<redacted>"`, for showing
/// the active document to an admin.
pub fn redact_keys(text: &str) -> String {
    let Ok(root) = DeTable::parse(text) else { return String::new() };
    let mut spans = Vec::new();
    if let Some(DeValue::Array(tenants)) =
        root.get_ref().iter().find(|(k, _)| k.get_ref() == "tenants").map(|(_, v)| v.get_ref())
    {
        for tenant in tenants.iter() {
            let DeValue::Table(t) = tenant.get_ref() else { continue };
            if let Some(DeValue::Array(keys)) =
                t.iter().find(|(k, _)| k.get_ref() == "keys").map(|(_, v)| v.get_ref())
            {
                spans.extend(keys.iter().map(Spanned::span));
            }
        }
    }
    spans.sort_by_key(|s| std::cmp::Reverse(s.start));
    let mut out = text.to_string();
    for s in spans {
        out.replace_range(s, "\"<redacted>\"");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = r#"
[[models]]
id = "m1"

[tiers.gold]
ttft_ms = 500
degradations = ["greedy"]

[[tenants]]
name = "acme"
tier = "gold"
keys = ["sk-secret-1", "sk-secret-2"]
"#;

    #[test]
    fn splits_key_paths() {
        use Segment::*;
        assert_eq!(segments("tiers.gold.e2e_ms"), vec![Key("tiers"), Key("gold"), Key("e2e_ms")]);
        assert_eq!(segments("tenants[0].keys[1]"), vec![Key("tenants"), Index(0), Key("keys"), Index(1)]);
        assert_eq!(segments("a[1][2]"), vec![Key("a"), Index(1), Index(2)]);
    }

    #[test]
    fn finds_the_line_of_a_key_path() {
        assert_eq!(line_of(OLD, "tiers.gold.ttft_ms"), Some(6));
        assert_eq!(line_of(OLD, "tenants[0].tier"), Some(11));
        assert_eq!(line_of(OLD, "tenants[0].keys[1]"), Some(12));
        // A missing key points at its table.
        assert_eq!(line_of(OLD, "tiers.gold.e2e_ms"), Some(5));
        assert_eq!(line_of("not toml [", "tiers"), None);
    }

    #[test]
    fn diff_names_changed_added_and_removed_keys() {
        let new = OLD
            .replace("ttft_ms = 500", "ttft_ms = 250\ne2e_ms = 9000")
            .replace("degradations = [\"greedy\"]\n", "");
        let changes = diff(OLD, &new);
        let shown: Vec<String> = changes.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            vec![
                "tiers.gold.degradations: [\"greedy\"] -> (unset)",
                "tiers.gold.e2e_ms: (unset) -> 9000",
                "tiers.gold.ttft_ms: 500 -> 250",
            ]
        );
        assert!(diff(OLD, OLD).is_empty());
        assert_eq!(summary(&[]), "no changes");
        assert!(summary(&changes).starts_with("tiers.gold.degradations"));
    }

    #[test]
    fn keys_never_appear_in_diffs_or_shown_text() {
        let new = OLD.replace("sk-secret-2", "sk-secret-3");
        let changes = diff(OLD, &new);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(changes[0].to_string(), "tenants[0].keys: <2 keys redacted> -> <2 keys redacted>");
        let shown = redact_keys(OLD);
        assert!(!shown.contains("sk-secret"), "{shown}");
        assert!(shown.contains(r#"keys = ["<redacted>", "<redacted>"]"#), "{shown}");
        assert!(shown.contains("ttft_ms = 500"));
    }
}
