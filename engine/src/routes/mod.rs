//! The engine listener's path table (matchit): which family of routes a
//! path belongs to, and the session or video `{id}` and `{action}` it
//! names. Methods are checked by each family's handler.

pub(crate) mod diffusion;
pub(crate) mod video;

use std::sync::OnceLock;

use engine_api::diffusion as diffusion_api;

/// A family of engine routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Generate,
    Load,
    KvEvents,
    Profile,
    Drain,
    Batching,
    Metrics,
    Healthz,
    Readyz,
    /// `/engine/v1/video/...` (`video::routes`).
    Video,
    /// `/engine/v1/diffusion/...` (`diffusion::routes`).
    Diffusion,
    /// The OpenAI surface (`openai`): chat and text completions, the
    /// model list, and vLLM's `/health` probe.
    ChatCompletions,
    Completions,
    Models,
    Health,
}

/// A path's endpoint, with the `{id}` it names and its action (the last
/// segment for families with several: `""` for the session or video
/// itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Target<'p> {
    pub endpoint: Endpoint,
    pub id: Option<&'p str>,
    pub action: &'p str,
}

fn table() -> &'static matchit::Router<(Endpoint, &'static str)> {
    static ROUTER: OnceLock<matchit::Router<(Endpoint, &'static str)>> = OnceLock::new();
    ROUTER.get_or_init(|| {
        use Endpoint as E;
        let mut router = matchit::Router::new();
        let fixed = [
            (engine_api::GENERATE_PATH, E::Generate),
            (engine_api::LOAD_PATH, E::Load),
            (engine_api::KV_EVENTS_PATH, E::KvEvents),
            (engine_api::PROFILE_PATH, E::Profile),
            (engine_api::DRAIN_PATH, E::Drain),
            (engine_api::BATCHING_PATH, E::Batching),
            ("/metrics", E::Metrics),
            ("/healthz", E::Healthz),
            ("/readyz", E::Readyz),
            ("/v1/chat/completions", E::ChatCompletions),
            ("/v1/completions", E::Completions),
            ("/v1/models", E::Models),
            ("/health", E::Health),
        ];
        let families = [
            ("/engine/v1/video/profile", E::Video, "profile"),
            ("/engine/v1/video/load", E::Video, "load"),
            ("/engine/v1/video/lend", E::Video, "lend"),
            ("/engine/v1/video/sessions", E::Video, "sessions"),
            ("/engine/v1/video/sessions/{id}", E::Video, ""),
            ("/engine/v1/video/sessions/{id}/{action}", E::Video, ""),
            (diffusion_api::IMAGES_PATH, E::Diffusion, "images"),
            (diffusion_api::PROFILE_PATH, E::Diffusion, "profile"),
            ("/engine/v1/diffusion/videos/{id}", E::Diffusion, ""),
            ("/engine/v1/diffusion/videos/{id}/{action}", E::Diffusion, ""),
        ];
        for (path, endpoint) in fixed {
            router.insert(path, (endpoint, "")).expect("the engine route table is valid");
        }
        for (path, endpoint, action) in families {
            router.insert(path, (endpoint, action)).expect("the engine route table is valid");
        }
        router
    })
}

/// The target of `path`, if it is an engine route.
pub(crate) fn find(path: &str) -> Option<Target<'_>> {
    let found = table().at(path).ok()?;
    let (endpoint, action) = *found.value;
    Some(Target {
        endpoint,
        id: found.params.get("id"),
        action: found.params.get("action").unwrap_or(action),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_family_id_and_action() {
        let t = |endpoint, id, action| Some(Target { endpoint, id, action });
        assert_eq!(find("/engine/v1/generate"), t(Endpoint::Generate, None, ""));
        assert_eq!(find("/engine/v1/video/sessions"), t(Endpoint::Video, None, "sessions"));
        assert_eq!(find("/engine/v1/video/sessions/s1"), t(Endpoint::Video, Some("s1"), ""));
        assert_eq!(find("/engine/v1/video/sessions/s1/chunk"), t(Endpoint::Video, Some("s1"), "chunk"));
        assert_eq!(find("/engine/v1/diffusion/videos/v9/state"), t(Endpoint::Diffusion, Some("v9"), "state"));
        assert_eq!(find("/engine/v1/diffusion/images"), t(Endpoint::Diffusion, None, "images"));
        assert_eq!(find("/v1/chat/completions"), t(Endpoint::ChatCompletions, None, ""));
        assert_eq!(find("/v1/models"), t(Endpoint::Models, None, ""));
        assert_eq!(find("/health"), t(Endpoint::Health, None, ""));
        for path in ["/", "/engine/v1", "/engine/v1/video/sessions/s1/chunk/x", "/engine/v1/diffusion/videos"]
        {
            assert_eq!(find(path), None, "{path}");
        }
    }
}
