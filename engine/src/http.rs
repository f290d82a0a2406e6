//! What every HTTP handler of the engine shares: the response body type,
//! the request size bound, reading a JSON body and answering JSON or a
//! typed error. Below the handlers (`openai`, `routes`) and the server.

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;

use crate::api::ErrorBody;
use crate::body::ChannelBody;

/// Response body of every engine route.
pub type EngineBody = Either<Full<Bytes>, ChannelBody>;

/// Largest generate request body accepted (prompts are long, not huge).
pub(crate) const MAX_REQUEST_BYTES: usize = 16 << 20;

/// A JSON body of at most `MAX_REQUEST_BYTES`, or the 400 to answer with.
pub(crate) async fn read_json<T: serde::de::DeserializeOwned>(
    req: Request<Incoming>,
) -> Result<T, Response<EngineBody>> {
    let bytes = match Limited::new(req.into_body(), MAX_REQUEST_BYTES).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => return Err(error(StatusCode::BAD_REQUEST, "invalid_request", &e.to_string())),
    };
    serde_json::from_slice(&bytes)
        .map_err(|e| error(StatusCode::BAD_REQUEST, "invalid_request", &e.to_string()))
}

pub(crate) fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response<EngineBody> {
    let body = serde_json::to_vec(value).expect("engine JSON always serialises");
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Either::Left(Full::new(Bytes::from(body))))
        .expect("static response parts are valid")
}

pub(crate) fn error(status: StatusCode, code: &str, message: &str) -> Response<EngineBody> {
    json(status, &ErrorBody { code: code.to_string(), message: message.to_string() })
}
