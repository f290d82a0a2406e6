//! `multipart/form-data` bodies (RFC 7578) as the OpenAI clients send them
//! for `POST /v1/videos`: text fields only, bounded by the body limit the
//! layers above already applied.

use std::collections::BTreeMap;

/// Most fields one form may have.
const MAX_FIELDS: usize = 32;

/// The boundary of a `multipart/form-data` content type.
pub fn boundary(content_type: &str) -> Option<String> {
    let (kind, params) = content_type.split_once(';')?;
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        k.trim().eq_ignore_ascii_case("boundary").then(|| v.trim().trim_matches('"').to_string())
    })
}

/// A form's text fields by name. A file part is refused with its field
/// name (`Err(Some(name))`); a malformed body is `Err(None)`.
pub fn fields(body: &[u8], boundary: &str) -> Result<BTreeMap<String, String>, Option<String>> {
    if boundary.is_empty() || boundary.len() > 70 {
        return Err(None);
    }
    let delim = format!("--{boundary}");
    let text = std::str::from_utf8(body).map_err(|_| None)?;
    let mut out = BTreeMap::new();
    let mut parts = text.split(delim.as_str());
    parts.next(); // preamble
    for part in parts {
        if part.starts_with("--") {
            return Ok(out); // the closing delimiter
        }
        let part = part.strip_prefix("\r\n").ok_or(None)?;
        let (head, value) = part.split_once("\r\n\r\n").ok_or(None)?;
        let value = value.strip_suffix("\r\n").ok_or(None)?;
        let disposition = head
            .split("\r\n")
            .find(|l| l.to_ascii_lowercase().starts_with("content-disposition:"))
            .ok_or(None)?;
        let param = |name: &str| {
            disposition.split(';').find_map(|p| {
                let (k, v) = p.trim().split_once('=')?;
                (k.trim() == name).then(|| v.trim().trim_matches('"').to_string())
            })
        };
        let name = param("name").ok_or(None)?;
        if param("filename").is_some() {
            return Err(Some(name));
        }
        if out.len() >= MAX_FIELDS {
            return Err(None);
        }
        out.insert(name, value.to_string());
    }
    Err(None) // no closing delimiter
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_text_fields_and_refuses_files() {
        let ct = "multipart/form-data; boundary=\"xyz\"";
        let b = boundary(ct).unwrap();
        assert_eq!(b, "xyz");
        let body = "--xyz\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\na cat\r\non a mat\r\n--xyz\r\nContent-Disposition: form-data; name=\"seconds\"\r\n\r\n4\r\n--xyz--\r\n";
        let f = fields(body.as_bytes(), &b).unwrap();
        assert_eq!(f["prompt"], "a cat\r\non a mat");
        assert_eq!(f["seconds"], "4");
        let file = "--xyz\r\nContent-Disposition: form-data; name=\"input_reference\"; filename=\"a.png\"\r\n\r\nPNG\r\n--xyz--\r\n";
        assert_eq!(fields(file.as_bytes(), &b), Err(Some("input_reference".into())));
        assert_eq!(fields(b"--xyz\r\nbroken", &b), Err(None));
        assert_eq!(boundary("application/json"), None);
    }

    fn form(n: usize) -> String {
        let mut body: String = (0..n)
            .map(|i| format!("--b\r\nContent-Disposition: form-data; name=\"f{i}\"\r\n\r\nv\r\n"))
            .collect();
        body.push_str("--b--\r\n");
        body
    }

    #[test]
    fn fields_and_the_boundary_are_bounded() {
        assert_eq!(fields(form(MAX_FIELDS).as_bytes(), "b").map(|f| f.len()), Ok(MAX_FIELDS));
        assert_eq!(fields(form(MAX_FIELDS + 1).as_bytes(), "b"), Err(None), "one field too many");
        let long = "x".repeat(71);
        let body =
            format!("--{long}\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nv\r\n--{long}--\r\n");
        assert_eq!(
            fields(body.as_bytes(), &long),
            Err(None),
            "RFC 2046 boundaries are at most 70 characters"
        );
        assert!(fields(body.replace(&long, &long[..70]).as_bytes(), &long[..70]).is_ok());
    }
}
