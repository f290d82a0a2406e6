//! The public listener's routes: a path table (matchit) and each path's
//! methods, giving the [`Route`] the stack's layers and the router act on.

use http::Method;

use super::Kind;
use crate::video::routes::VideoRoute;

/// Routes of the public listener; `label` is the metrics label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    Completions(Kind),
    /// Anthropic's Messages API (`POST /v1/messages`).
    Messages,
    /// `POST /v1/messages/count_tokens`.
    CountTokens,
    /// OpenAI's Responses API.
    Responses(ResponsesRoute),
    Embeddings,
    Models,
    Model(String),
    Healthz,
    Readyz,
    /// The live video player's page and files (no key: the page asks).
    Player(crate::player::Asset),
    Video(VideoRoute),
    Diffusion(crate::diffusion::routes::DiffusionRoute),
    /// A known path with another method: the methods it takes.
    WrongMethod(&'static str),
    Unknown,
}

/// The Responses API's routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ResponsesRoute {
    Create,
    Get(String),
    Delete(String),
}

/// What a public path names, before its method is checked.
#[derive(Debug, Clone, Copy)]
enum Endpoint {
    ChatCompletions,
    Messages,
    CountTokens,
    Responses,
    Response,
    Completions,
    Embeddings,
    Models,
    Model,
    Healthz,
    Readyz,
    Images,
    Videos,
    Video,
    VideoContent,
    Streams,
    Stream,
    StreamEvents,
    StreamPause,
    StreamResume,
    StreamPrompt,
    Player(crate::player::Asset),
}

impl Endpoint {
    /// The methods the path takes (a 405's `Allow` header).
    fn methods(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions
            | Endpoint::Messages
            | Endpoint::CountTokens
            | Endpoint::Responses
            | Endpoint::Completions
            | Endpoint::Embeddings
            | Endpoint::Images
            | Endpoint::Streams
            | Endpoint::StreamPause
            | Endpoint::StreamResume
            | Endpoint::StreamPrompt => "POST",
            Endpoint::Videos => "GET, POST",
            Endpoint::Video | Endpoint::Stream | Endpoint::Response => "GET, DELETE",
            Endpoint::Models
            | Endpoint::Model
            | Endpoint::Healthz
            | Endpoint::Readyz
            | Endpoint::VideoContent
            | Endpoint::StreamEvents
            | Endpoint::Player(_) => "GET",
        }
    }
}

/// The public listener's paths (matchit: `{id}` is one segment, `{*model}`
/// the rest of the path, so model ids such as `org/name` work).
fn endpoints() -> &'static matchit::Router<Endpoint> {
    static ROUTER: std::sync::OnceLock<matchit::Router<Endpoint>> = std::sync::OnceLock::new();
    ROUTER.get_or_init(|| {
        use Endpoint as E;
        crate::request::route_table([
            ("/v1/chat/completions", E::ChatCompletions),
            ("/v1/completions", E::Completions),
            ("/v1/messages", E::Messages),
            ("/v1/messages/count_tokens", E::CountTokens),
            ("/v1/responses", E::Responses),
            ("/v1/responses/{id}", E::Response),
            ("/v1/embeddings", E::Embeddings),
            ("/v1/models", E::Models),
            ("/v1/models/{*model}", E::Model),
            ("/healthz", E::Healthz),
            ("/readyz", E::Readyz),
            ("/v1/images/generations", E::Images),
            ("/v1/videos", E::Videos),
            ("/v1/videos/{id}", E::Video),
            ("/v1/videos/{id}/content", E::VideoContent),
            ("/v1/video/streams", E::Streams),
            ("/v1/video/streams/{id}", E::Stream),
            ("/v1/video/streams/{id}/events", E::StreamEvents),
            ("/v1/video/streams/{id}/pause", E::StreamPause),
            ("/v1/video/streams/{id}/resume", E::StreamResume),
            ("/v1/video/streams/{id}/prompt", E::StreamPrompt),
            ("/player", E::Player(crate::player::Asset::Page)),
            ("/player/player.js", E::Player(crate::player::Asset::Script)),
            ("/player/player.css", E::Player(crate::player::Asset::Style)),
        ])
    })
}

impl Route {
    pub(crate) fn of(method: &Method, path: &str) -> Self {
        use crate::diffusion::routes::DiffusionRoute as D;
        use Endpoint as E;
        use VideoRoute as V;
        let Ok(found) = endpoints().at(path) else { return Route::Unknown };
        let param = |name: &str| found.params.get(name).unwrap_or_default().to_string();
        let id = || param("id");
        match (*found.value, method) {
            (E::ChatCompletions, &Method::POST) => Route::Completions(Kind::Chat),
            (E::Completions, &Method::POST) => Route::Completions(Kind::Completion),
            (E::Messages, &Method::POST) => Route::Messages,
            (E::CountTokens, &Method::POST) => Route::CountTokens,
            (E::Responses, &Method::POST) => Route::Responses(ResponsesRoute::Create),
            (E::Response, &Method::GET) => Route::Responses(ResponsesRoute::Get(id())),
            (E::Response, &Method::DELETE) => Route::Responses(ResponsesRoute::Delete(id())),
            (E::Embeddings, &Method::POST) => Route::Embeddings,
            (E::Models, &Method::GET) => Route::Models,
            (E::Model, &Method::GET) => Route::Model(param("model")),
            (E::Healthz, &Method::GET) => Route::Healthz,
            (E::Readyz, &Method::GET) => Route::Readyz,
            (E::Images, &Method::POST) => Route::Diffusion(D::Images),
            (E::Videos, &Method::POST) => Route::Diffusion(D::CreateVideo),
            (E::Videos, &Method::GET) => Route::Diffusion(D::ListVideos),
            (E::Video, &Method::GET) => Route::Diffusion(D::Video(id())),
            (E::Video, &Method::DELETE) => Route::Diffusion(D::DeleteVideo(id())),
            (E::VideoContent, &Method::GET) => Route::Diffusion(D::Content(id())),
            (E::Streams, &Method::POST) => Route::Video(V::Create),
            (E::Stream, &Method::GET) => Route::Video(V::Status(id())),
            (E::Stream, &Method::DELETE) => Route::Video(V::Delete(id())),
            (E::StreamEvents, &Method::GET) => Route::Video(V::Events(id())),
            (E::StreamPause, &Method::POST) => Route::Video(V::Pause(id())),
            (E::StreamResume, &Method::POST) => Route::Video(V::Resume(id())),
            (E::StreamPrompt, &Method::POST) => Route::Video(V::Prompt(id())),
            (E::Player(asset), &Method::GET) => Route::Player(asset),
            (endpoint, _) => Route::WrongMethod(endpoint.methods()),
        }
    }

    pub(crate) fn label(&self) -> &'static str {
        match self {
            Route::Completions(Kind::Chat) => "chat_completions",
            Route::Completions(Kind::Completion) => "completions",
            Route::Messages => "messages",
            Route::CountTokens => "count_tokens",
            Route::Responses(_) => "responses",
            Route::Embeddings => "embeddings",
            Route::Models | Route::Model(_) => "models",
            Route::Healthz => "healthz",
            Route::Readyz => "readyz",
            Route::Player(_) => "player",
            Route::Video(_) => "video",
            Route::Diffusion(crate::diffusion::routes::DiffusionRoute::Images) => "images",
            Route::Diffusion(_) => "videos",
            Route::WrongMethod(_) | Route::Unknown => "other",
        }
    }
}

impl Route {
    /// The API whose shapes the route's answers and errors take (`path`:
    /// a wrong method on a Messages path is answered in Anthropic's shape).
    pub(crate) fn dialect(&self, path: &str) -> crate::wire::Dialect {
        match self {
            Route::Messages | Route::CountTokens => crate::wire::Dialect::Anthropic,
            Route::WrongMethod(_) if path.starts_with("/v1/messages") => crate::wire::Dialect::Anthropic,
            _ => crate::wire::Dialect::OpenAi,
        }
    }

    /// Whether the route answers only to a tenant's key (the auth layer).
    pub(crate) fn needs_key(&self) -> bool {
        matches!(
            self,
            Route::Completions(_)
                | Route::Messages
                | Route::CountTokens
                | Route::Responses(_)
                | Route::Embeddings
                | Route::Models
                | Route::Model(_)
                | Route::Video(_)
                | Route::Diffusion(_)
        )
    }

    /// Whether the route's requests carry a body it reads (the body layer).
    pub(crate) fn takes_body(&self) -> bool {
        matches!(
            self,
            Route::Completions(_)
                | Route::Messages
                | Route::CountTokens
                | Route::Responses(ResponsesRoute::Create)
                | Route::Embeddings
                | Route::Video(VideoRoute::Create | VideoRoute::Prompt(_))
        ) || matches!(self, Route::Diffusion(d) if d.takes_body())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diffusion::routes::DiffusionRoute as D;

    #[test]
    fn paths_and_methods_give_their_routes() {
        let of = |m: &str, p: &str| Route::of(&Method::from_bytes(m.as_bytes()).unwrap(), p);
        assert_eq!(of("POST", "/v1/chat/completions"), Route::Completions(Kind::Chat));
        assert_eq!(of("POST", "/v1/completions"), Route::Completions(Kind::Completion));
        assert_eq!(of("GET", "/v1/models"), Route::Models);
        assert_eq!(of("POST", "/v1/messages"), Route::Messages);
        assert_eq!(of("POST", "/v1/messages/count_tokens"), Route::CountTokens);
        assert_eq!(of("POST", "/v1/responses"), Route::Responses(ResponsesRoute::Create));
        assert_eq!(
            of("DELETE", "/v1/responses/resp_1"),
            Route::Responses(ResponsesRoute::Delete("resp_1".into()))
        );
        assert_eq!(of("GET", "/v1/messages"), Route::WrongMethod("POST"));
        // Model ids may hold slashes (`org/name`); an empty one is no model.
        assert_eq!(
            of("GET", "/v1/models/meta-llama/Llama-3.1-8B"),
            Route::Model("meta-llama/Llama-3.1-8B".into())
        );
        assert_eq!(of("GET", "/v1/models/"), Route::Unknown);
        assert_eq!(of("GET", "/v1/videos"), Route::Diffusion(D::ListVideos));
        assert_eq!(of("POST", "/v1/videos"), Route::Diffusion(D::CreateVideo));
        assert_eq!(of("DELETE", "/v1/videos/v_1"), Route::Diffusion(D::DeleteVideo("v_1".into())));
        assert_eq!(of("GET", "/v1/videos/v_1/content"), Route::Diffusion(D::Content("v_1".into())));
        assert_eq!(
            of("POST", "/v1/video/streams/vs_1/prompt"),
            Route::Video(VideoRoute::Prompt("vs_1".into()))
        );
        assert_eq!(
            of("GET", "/v1/video/streams/vs_1/events"),
            Route::Video(VideoRoute::Events("vs_1".into()))
        );
        // A known path with another method; paths that are not ours.
        assert_eq!(of("GET", "/v1/chat/completions"), Route::WrongMethod("POST"));
        assert_eq!(of("PUT", "/v1/video/streams/vs_1"), Route::WrongMethod("GET, DELETE"));
        assert_eq!(of("DELETE", "/v1/videos"), Route::WrongMethod("GET, POST"));
        assert_eq!(of("GET", "/v1/images/generations"), Route::WrongMethod("POST"));
        for path in
            ["/", "/v1", "/v1/chat", "/v1/videos/a/b", "/v1/video/streams/a/rewind", "/v1/chat/completions/x"]
        {
            assert_eq!(of("GET", path), Route::Unknown, "{path}");
        }
    }
}
