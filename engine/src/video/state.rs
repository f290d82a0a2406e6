//! The state plane of a video session (SlackServe §4.4, TurboServe §6.1):
//! what a session's state is on the wire, its version, and the pieces an
//! asynchronous transfer moves.
//!
//! A session's state is the model state ([`StreamState`], small: the
//! prompt conditioning, the attention sink and the latent window) plus a
//! paged KV window ([`Kv`]): `KV_PAGES` pages, one rewritten per generated
//! chunk (a rolling window). The emulated and cpu backends model the KV
//! window's size with `--video-state-mib` (0: none), so that moving a
//! session costs what moving a real one would.
//!
//! The wire form: u32 LE length of a JSON [`Meta`], the meta, the model
//! state (`state_len` bytes), then the KV pages the meta lists
//! (`included`), each `kv_page_bytes` long. A full copy lists every page;
//! a delta (`base` set) lists only the pages rewritten since `base`, so the
//! last step of an asynchronous transfer moves one chunk's worth.

use serde::{Deserialize, Serialize};

pub use engine_api::video::Version;

use super::model::{Resolution, StreamState};
use super::VideoError;

/// Pages of a session's KV window.
pub const KV_PAGES: usize = 8;
/// Largest KV page accepted (a session's KV at most 8 × this).
pub const MAX_PAGE_BYTES: usize = 256 << 20;

/// The paged KV window.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Kv {
    pub pages: Vec<Vec<u8>>,
    /// The page the next chunk rewrites.
    pub cursor: usize,
}

impl Kv {
    /// `total` bytes in [`KV_PAGES`] pages (none for 0).
    pub fn new(total: usize) -> Self {
        let page = total / KV_PAGES;
        if page == 0 {
            return Self::default();
        }
        Self { pages: vec![vec![0u8; page]; KV_PAGES], cursor: 0 }
    }

    pub fn bytes(&self) -> usize {
        self.pages.iter().map(Vec::len).sum()
    }

    /// A chunk was generated (the `chunks`-th of its prompt): it rewrites
    /// the oldest page.
    pub fn advance(&mut self, chunks: u64) {
        if self.pages.is_empty() {
            return;
        }
        let fill = (chunks as u8).wrapping_mul(31).wrapping_add(self.cursor as u8);
        self.pages[self.cursor].fill(fill);
        self.cursor = (self.cursor + 1) % self.pages.len();
    }

    /// The pages rewritten by the last `n` chunks (all of them when `n`
    /// reaches the window).
    pub fn recent(&self, n: u64) -> Vec<usize> {
        let len = self.pages.len();
        if n as usize >= len {
            return (0..len).collect();
        }
        (0..n as usize).map(|k| (self.cursor + len - 1 - k) % len).collect()
    }
}

/// What travels with a session's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub prompt: String,
    pub resolution: Resolution,
    pub latent_frames: u32,
    pub epoch: u32,
    pub credit: f64,
    /// Bytes of the model state after the meta (absent: all the rest).
    #[serde(default)]
    pub state_len: Option<u64>,
    #[serde(default)]
    pub kv_pages: u32,
    #[serde(default)]
    pub kv_page_bytes: u64,
    #[serde(default)]
    pub kv_cursor: u32,
    /// The KV pages that follow, in order.
    #[serde(default)]
    pub included: Vec<u32>,
    /// A delta: only what changed since this version.
    #[serde(default)]
    pub base: Option<Version>,
}

/// A parsed, checked wire form.
#[derive(Debug, Clone, PartialEq)]
pub struct Wire {
    pub meta: Meta,
    pub state: StreamState,
    pub state_bytes: Vec<u8>,
    pub pages: Vec<(usize, Vec<u8>)>,
}

impl Wire {
    pub fn version(&self) -> Version {
        Version { epoch: self.meta.epoch, chunks: self.state.chunks }
    }
}

/// The wire form of a session: `include` lists the KV pages to send.
pub fn encode(meta: &Meta, state: &[u8], kv: &Kv, include: &[usize]) -> Vec<u8> {
    let meta = Meta {
        state_len: Some(state.len() as u64),
        kv_pages: kv.pages.len() as u32,
        kv_page_bytes: kv.pages.first().map_or(0, |p| p.len() as u64),
        kv_cursor: kv.cursor as u32,
        included: include.iter().map(|&i| i as u32).collect(),
        ..meta.clone()
    };
    let meta = serde_json::to_vec(&meta).expect("meta serialises");
    let mut out =
        Vec::with_capacity(4 + meta.len() + state.len() + include.len() * kv.bytes() / KV_PAGES.max(1));
    out.extend_from_slice(&(meta.len() as u32).to_le_bytes());
    out.extend_from_slice(&meta);
    out.extend_from_slice(state);
    for &i in include {
        out.extend_from_slice(&kv.pages[i]);
    }
    out
}

/// Parses and checks a wire form (untrusted input: it may come from
/// anywhere): the meta within bounds, the model state of exactly the shape
/// the model expects, the KV pages as listed.
pub fn parse(bytes: &[u8]) -> Result<Wire, VideoError> {
    let bad = || VideoError::BadState;
    let len =
        bytes.get(..4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize).ok_or_else(bad)?;
    let end = len.checked_add(4).ok_or_else(bad)?;
    let meta: Meta = bytes.get(4..end).and_then(|m| serde_json::from_slice(m).ok()).ok_or_else(bad)?;
    let rest = &bytes[end..];
    let page_bytes = usize::try_from(meta.kv_page_bytes).map_err(|_| bad())?;
    let pages_total = meta.kv_pages as usize;
    let kv_len = page_bytes.checked_mul(meta.included.len()).ok_or_else(bad)?;
    let state_len = match meta.state_len {
        Some(n) => usize::try_from(n).map_err(|_| bad())?,
        None => rest.len().checked_sub(kv_len).ok_or_else(bad)?,
    };
    if state_len.checked_add(kv_len) != Some(rest.len()) {
        return Err(bad());
    }
    let kv_ok = page_bytes <= MAX_PAGE_BYTES
        && pages_total <= KV_PAGES
        && (pages_total == 0) == (page_bytes == 0)
        && (meta.kv_cursor as usize) < pages_total.max(1)
        && meta.included.iter().all(|&i| (i as usize) < pages_total)
        && {
            let mut seen = meta.included.clone();
            seen.sort_unstable();
            seen.dedup();
            seen.len() == meta.included.len()
        }
        && (meta.base.is_some() || meta.included.len() == pages_total);
    let state_bytes = rest[..state_len].to_vec();
    // A state of the wrong shape would index out of bounds in the model; a
    // huge chunk would exhaust memory.
    let state = StreamState::from_bytes(&state_bytes).ok_or_else(bad)?;
    let shape_ok = (1..=super::MAX_LATENT_FRAMES).contains(&meta.latent_frames)
        && meta.prompt.len() <= super::MAX_PROMPT_BYTES
        && meta.credit.is_finite()
        && state.fits(meta.resolution, meta.latent_frames as usize);
    if !(kv_ok && shape_ok) {
        return Err(bad());
    }
    let pages = meta
        .included
        .iter()
        .zip(rest[state_len..].chunks(page_bytes.max(1)))
        .map(|(&i, p)| (i as usize, p.to_vec()))
        .collect();
    Ok(Wire { meta, state, state_bytes, pages })
}

/// The KV window a full wire form carries.
pub fn kv_of(wire: &Wire) -> Kv {
    let mut kv = Kv {
        pages: vec![vec![0u8; wire.meta.kv_page_bytes as usize]; wire.meta.kv_pages as usize],
        cursor: wire.meta.kv_cursor as usize,
    };
    apply_pages(&mut kv, wire);
    kv
}

/// Writes a wire form's pages into `kv` and takes its cursor.
pub fn apply_pages(kv: &mut Kv, wire: &Wire) {
    for (i, p) in &wire.pages {
        if let Some(page) = kv.pages.get_mut(*i) {
            *page = p.clone();
        }
    }
    kv.cursor = wire.meta.kv_cursor as usize;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Meta {
        Meta {
            prompt: "a cat".into(),
            resolution: Resolution::Tiny,
            latent_frames: 1,
            epoch: 2,
            credit: 1.5,
            state_len: None,
            kv_pages: 0,
            kv_page_bytes: 0,
            kv_cursor: 0,
            included: vec![],
            base: None,
        }
    }

    #[test]
    fn a_full_copy_round_trips_and_a_delta_carries_only_the_recent_pages() {
        let state = StreamState::new("a cat");
        let mut kv = Kv::new(8 * 1024);
        for c in 1..=3 {
            kv.advance(c);
        }
        let full =
            parse(&encode(&meta(), &state.to_bytes(), &kv, &(0..KV_PAGES).collect::<Vec<_>>())).unwrap();
        assert_eq!(kv_of(&full), kv);
        assert_eq!(full.state, state);
        // Two more chunks: the delta since the copy has their two pages.
        let mut later = kv.clone();
        later.advance(4);
        later.advance(5);
        let delta_meta = Meta { base: Some(Version { epoch: 2, chunks: 0 }), ..meta() };
        let bytes = encode(&delta_meta, &state.to_bytes(), &later, &later.recent(2));
        assert!(bytes.len() < 3 * 1024 + state.to_bytes().len() + 512, "{}", bytes.len());
        let delta = parse(&bytes).unwrap();
        let mut staged = kv_of(&full);
        apply_pages(&mut staged, &delta);
        assert_eq!(staged, later, "copy + delta = the source's window");
    }

    #[test]
    fn malformed_wire_forms_are_refused() {
        let state = StreamState::new("x").to_bytes();
        let kv = Kv::new(8 * 64);
        let good = encode(&meta(), &state, &kv, &(0..KV_PAGES).collect::<Vec<_>>());
        assert!(parse(&good).is_ok());
        assert_eq!(parse(&good[..good.len() - 1]), Err(VideoError::BadState), "a short page");
        // A full copy must carry every page; indexes in range, no repeats.
        for include in [vec![0usize, 1], vec![0, 0, 1, 2, 3, 4, 5, 6]] {
            let bytes = encode(&meta(), &state, &kv, &include);
            assert_eq!(parse(&bytes), Err(VideoError::BadState), "{include:?}");
        }
        assert_eq!(parse(&[1, 0, 0, 0]), Err(VideoError::BadState));
    }
}
