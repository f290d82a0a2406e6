//! The synthetic model's vocabulary: token 0 ends a sequence, every other
//! id is a pronounceable word built from syllables, so output reads as
//! (nonsense) text. Prompts are split exactly the way
//! [`policies::tokens::count`] counts them (four-character pieces of each
//! word), so the engine's KV reservation and the model's context agree.

/// The end-of-sequence token.
pub const EOS: u32 = 0;

const ONSETS: &[&str] =
    &["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "st", "tr", "sh"];
const VOWELS: &[&str] = &["a", "e", "i", "o", "u", "ai", "ou", "ea"];

/// The word for token `id` (`id` ≥ 1): one to three syllables derived from
/// the id alone, so every engine with the same vocabulary size agrees.
pub fn word(id: u32) -> String {
    let mut h = u64::from(id).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5851_F42D_4C95_7F2D;
    let syllables = 1 + (id % 3) as usize;
    let mut w = String::with_capacity(syllables * 3);
    for _ in 0..syllables {
        h = h.rotate_left(17).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        w.push_str(ONSETS[(h % ONSETS.len() as u64) as usize]);
        w.push_str(VOWELS[((h >> 8) % VOWELS.len() as u64) as usize]);
    }
    w
}

/// Token ids of `text` for a vocabulary of `vocab` ids: one id per started
/// four-character piece of each whitespace-separated word, never [`EOS`].
pub fn tokenize(text: &str, vocab: u32) -> Vec<u32> {
    let mut ids = Vec::new();
    for w in text.split_whitespace() {
        let chars: Vec<char> = w.chars().collect();
        for piece in chars.chunks(4) {
            let h = piece.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, c| {
                (h ^ u64::from(u32::from(*c))).wrapping_mul(0x0100_0000_01b3)
            });
            ids.push(1 + (h % u64::from(vocab.max(2) - 1)) as u32);
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenization_agrees_with_the_gateway_count() {
        for text in ["", "a", "hello world", "héllo  wörld\tand more words", "supercalifragilistic x"] {
            let ids = tokenize(text, 1000);
            assert_eq!(ids.len() as u32, policies::tokens::count(text), "{text:?}");
            assert!(ids.iter().all(|&i| (1..1000).contains(&i)));
        }
        assert_eq!(tokenize("same text", 500), tokenize("same text", 500));
    }

    #[test]
    fn words_are_lowercase_letters() {
        for id in 1..500 {
            let w = word(id);
            assert!(!w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase()), "{w}");
        }
    }
}
