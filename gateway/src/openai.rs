//! The OpenAI request schema, from `openai-wire` (shared with the engine's
//! own OpenAI surface), and how its refusals map onto the gateway's errors.

pub use openai_wire::request::{parse, parse_for, CompletionRequest, Kind};
use openai_wire::ParseError;

use crate::error::ApiError;

impl From<ParseError> for ApiError {
    fn from(e: ParseError) -> Self {
        match e {
            ParseError::InvalidJson(m) => ApiError::InvalidJson(m),
            ParseError::InvalidField { param, message } => ApiError::InvalidField { param, message },
            ParseError::UnknownParameters(p) => ApiError::UnknownParameters(p),
            ParseError::UnsupportedParameter { param, message } => {
                ApiError::UnsupportedParameter { param, message }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_keeps_its_label_field_and_message() {
        let cases = [
            ParseError::InvalidJson("eof".into()),
            ParseError::InvalidField { param: "stop".into(), message: "too many".into() },
            ParseError::UnknownParameters(vec!["zeta".into()]),
            ParseError::UnsupportedParameter { param: "n".into(), message: "no".into() },
        ];
        for e in cases {
            let mapped = ApiError::from(e.clone());
            assert_eq!(
                (mapped.code(), mapped.param(), mapped.to_string()),
                (e.code(), e.param(), e.to_string())
            );
            assert_eq!(mapped.status().as_u16(), e.status());
        }
    }
}
