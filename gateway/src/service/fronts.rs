//! The generation routes' API front-ends: a Messages or Responses request
//! read into OpenAI's chat form (`wire`), `count_tokens`, and the Responses
//! API's stored objects.

use http::{HeaderMap, Response, StatusCode};
use policies::{PolicyDocument, Tenant};
use serde_json::json;

use super::Front;
use crate::body::GatewayBody;
use crate::error::ApiError;
use crate::openai::{self, Kind};
use crate::request::{json_response, Req};
use crate::wire::{anthropic, responses};
use crate::App;

/// A generation request in OpenAI's form, whatever API it came in on.
pub(super) struct Inbound {
    pub parsed: openai::CompletionRequest,
    /// The body an OpenAI-speaking upstream is sent (the client's own for
    /// OpenAI's routes, the translated chat request for the others).
    pub body: bytes::Bytes,
    pub form: Form,
}

/// What the answer's format needs beyond the OpenAI request.
pub(super) enum Form {
    OpenAi,
    Anthropic,
    Responses(responses::Translated),
}

/// Parses the request of `front` and translates it into OpenAI's chat
/// request (the Messages and Responses APIs), which the one chat parser
/// then bounds and validates.
pub(super) async fn inbound(
    app: &App,
    policy: &PolicyDocument,
    tenant: &Tenant,
    front: Front,
    headers: &HeaderMap,
    body: bytes::Bytes,
) -> Result<Inbound, ApiError> {
    let (chat, form) = match front {
        Front::OpenAi(kind) => {
            let parsed = openai::parse_for(kind, &body, &policy.models)?;
            return Ok(Inbound { parsed, body, form: Form::OpenAi });
        }
        Front::Anthropic => {
            anthropic::check_version(headers)?;
            (anthropic::to_chat(&body, false)?.chat, Form::Anthropic)
        }
        Front::Responses => {
            let previous = match responses::previous_id(&body) {
                Some(id) => app.responses.fetch(&tenant.name, &id).await.map(|s| s.conversation),
                None => None,
            };
            let mut t = responses::to_chat(&body, |_| previous)?;
            (std::mem::take(&mut t.chat), Form::Responses(t))
        }
    };
    let parsed = openai::parse_for(Kind::Chat, &chat, &policy.models)?;
    Ok(Inbound { parsed, body: bytes::Bytes::from(chat), form })
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as admission
/// counts them (the chat template applied), Anthropic's shape.
pub(super) fn count_tokens(
    policy: &PolicyDocument,
    req: &mut Req,
) -> Result<Response<GatewayBody>, ApiError> {
    anthropic::check_version(req.headers())?;
    let body = req.take_read();
    let t = anthropic::to_chat(&body, true)?;
    let parsed = openai::parse_for(Kind::Chat, &t.chat, &policy.models)?;
    if policy.model(&t.model).is_none() {
        return Err(ApiError::ModelNotFound(t.model));
    }
    let tokens = policies::tokens::count(&parsed.prompt);
    Ok(json_response(StatusCode::OK, &json!({"input_tokens": tokens})))
}

/// `GET` / `DELETE /v1/responses/{id}`: the caller's tenant's stored
/// response (another tenant's is not found).
pub(super) async fn stored_response(
    app: &App,
    tenant: &Tenant,
    id: &str,
    delete: bool,
) -> Result<Response<GatewayBody>, ApiError> {
    if delete {
        return match app.responses.remove(&tenant.name, id).await {
            true => {
                Ok(json_response(StatusCode::OK, &json!({"id": id, "object": "response", "deleted": true})))
            }
            false => Err(ApiError::ResponseNotFound(id.to_string())),
        };
    }
    match app.responses.fetch(&tenant.name, id).await {
        Some(stored) => Ok(json_response(StatusCode::OK, &stored.response)),
        None => Err(ApiError::ResponseNotFound(id.to_string())),
    }
}
