//! What is wrong with a request body: the four ways the parser refuses
//! one, each a 400 with a stable machine label and the field it names.
//! The gateway maps them onto its own error taxonomy (one variant each);
//! the engine renders them as they are ([`ParseError::body`]).

use serde_json::json;

/// A refused request body.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseError {
    #[error("we could not parse the JSON body of your request: {0}")]
    InvalidJson(String),
    #[error("{message}")]
    InvalidField { param: String, message: String },
    #[error("unrecognized request argument supplied: {}", .0.join(", "))]
    UnknownParameters(Vec<String>),
    #[error("unsupported parameter `{param}`: {message}")]
    UnsupportedParameter { param: String, message: String },
}

impl ParseError {
    /// Stable machine label (the body's `code`).
    pub fn code(&self) -> &'static str {
        match self {
            ParseError::InvalidJson(_) => "invalid_json",
            ParseError::InvalidField { .. } => "invalid_value",
            ParseError::UnknownParameters(_) => "unknown_parameter",
            ParseError::UnsupportedParameter { .. } => "unsupported_parameter",
        }
    }

    /// Always 400: the body is the client's to fix.
    pub fn status(&self) -> u16 {
        400
    }

    /// The request field the error is about, if any.
    pub fn param(&self) -> Option<&str> {
        match self {
            ParseError::InvalidField { param, .. } | ParseError::UnsupportedParameter { param, .. } => {
                Some(param)
            }
            ParseError::UnknownParameters(p) => p.first().map(String::as_str),
            ParseError::InvalidJson(_) => None,
        }
    }

    /// The OpenAI-style error body.
    pub fn body(&self) -> Vec<u8> {
        error_body(&self.to_string(), "invalid_request_error", self.param(), self.code())
    }
}

/// An OpenAI-style error body: `{"error": {"message", "type", "param", "code"}}`.
pub fn error_body(message: &str, kind: &str, param: Option<&str>, code: &str) -> Vec<u8> {
    let body = json!({"error": {"message": message, "type": kind, "param": param, "code": code}});
    serde_json::to_vec(&body).expect("an error body always serialises")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_names_the_field_and_the_label() {
        let e = ParseError::InvalidField { param: "temperature".into(), message: "must be <= 2".into() };
        let b: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(b["error"]["param"], "temperature");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["code"], "invalid_value");
        assert_eq!(b["error"]["message"], "must be <= 2");
        let e = ParseError::UnknownParameters(vec!["a".into(), "b".into()]);
        assert_eq!((e.param(), e.code()), (Some("a"), "unknown_parameter"));
        assert_eq!(ParseError::InvalidJson("x".into()).param(), None);
    }
}
