//! The synthetic model's vocabulary: token 0 ends a sequence, every other
//! id is a short pronounceable word, so output reads as (nonsense) text.
//! Prompts are split exactly the way [`policies::tokens::count`] counts
//! them (four-character pieces of each word), so the engine's KV
//! reservation and the model's context agree.
//!
//! Words round-trip: the word of each id up to [`ROUND_TRIP_IDS`] is one
//! piece of at most four letters (consonant-vowel shapes: `ba`, `bab`,
//! `baba`), and [`tokenize`] maps that piece (in any case) back to the id.
//! So a generated answer resent in the next prompt tokenizes into the very
//! tokens the engine generated, and the pages holding their K/V can serve
//! the next turn from the prefix cache (the scheduler names them when the
//! sequence ends). Ids past that (vocabularies over 12,100) get longer
//! words that do not round-trip; the scheduler stops naming output at the
//! first such word.

/// The end-of-sequence token.
pub const EOS: u32 = 0;

const CONSONANTS: &[u8; 20] = b"bcdfghjklmnprstvwxyz";
const VOWELS: &[u8; 5] = b"aeiou";
const CV: u32 = 20 * 5;
const CVC: u32 = CV * 20;
const CVCV: u32 = CVC * 5;

/// Ids whose word is one piece that [`tokenize`] maps back to the id.
pub const ROUND_TRIP_IDS: u32 = CV + CVC + CVCV;

/// The word for token `id` (`id` ≥ 1), derived from the id alone, so every
/// engine with the same vocabulary size agrees.
pub fn word(id: u32) -> String {
    let n = id.saturating_sub(1);
    let (letters, mut k) = match n {
        n if n < CV => (2, n),
        n if n < CV + CVC => (3, n - CV),
        n if n < ROUND_TRIP_IDS => (4, n - CV - CVC),
        n => return long_word(n),
    };
    // Letters from the last: each consonant takes a base-20 digit, each
    // vowel a base-5 one.
    let mut w = [0u8; 4];
    for i in (0..letters).rev() {
        if i % 2 == 0 {
            w[i] = CONSONANTS[(k % 20) as usize];
            k /= 20;
        } else {
            w[i] = VOWELS[(k % 5) as usize];
            k /= 5;
        }
    }
    String::from_utf8_lossy(&w[..letters]).into_owned()
}

/// The id of a vocabulary word of one to four letters (any case), if
/// `piece` is one.
fn id_of(piece: &str) -> Option<u32> {
    let b = piece.as_bytes();
    let base = match b.len() {
        2 => 0,
        3 => CV,
        4 => CV + CVC,
        _ => return None,
    };
    let mut k = 0u32;
    for (i, c) in b.iter().enumerate() {
        let c = c.to_ascii_lowercase();
        if i % 2 == 0 {
            k = k * 20 + CONSONANTS.iter().position(|&x| x == c)? as u32;
        } else {
            k = k * 5 + VOWELS.iter().position(|&x| x == c)? as u32;
        }
    }
    Some(1 + base + k)
}

/// Words for ids past [`ROUND_TRIP_IDS`]: two to four syllables.
fn long_word(n: u32) -> String {
    let mut h = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5851_F42D_4C95_7F2D;
    let mut w = String::with_capacity(8);
    for _ in 0..2 + n % 3 {
        h = h.rotate_left(17).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        w.push(CONSONANTS[(h % 20) as usize] as char);
        w.push(VOWELS[((h >> 8) % 5) as usize] as char);
        w.push(CONSONANTS[((h >> 16) % 20) as usize] as char);
    }
    w
}

/// Token ids of `text` for a vocabulary of `vocab` ids: one id per started
/// four-character piece of each whitespace-separated word, never [`EOS`]. A
/// piece that is a vocabulary word is that word's id; any other is hashed
/// onto the vocabulary.
pub fn tokenize(text: &str, vocab: u32) -> Vec<u32> {
    let mut ids = Vec::new();
    for w in text.split_whitespace() {
        let chars: Vec<char> = w.chars().collect();
        for piece in chars.chunks(4) {
            let s: String = piece.iter().collect();
            if let Some(id) = id_of(&s).filter(|&id| id < vocab) {
                ids.push(id);
                continue;
            }
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
        for id in (1..500).chain(ROUND_TRIP_IDS - 5..ROUND_TRIP_IDS + 500) {
            let w = word(id);
            assert!(!w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase()), "{w}");
        }
    }

    #[test]
    fn every_word_of_the_default_vocabulary_tokenizes_back_to_its_id() {
        let vocab = 8192;
        let mut seen = std::collections::HashSet::new();
        for id in 1..vocab {
            let w = word(id);
            assert!(w.len() <= 4 && seen.insert(w.clone()), "id {id}: {w:?} is one unique piece");
            assert_eq!(policies::tokens::count(&w), 1);
            assert_eq!(tokenize(&w, vocab), [id], "{w}");
            // As the engine emits it: capitalised first, space-led after.
            let cap = w[..1].to_uppercase() + &w[1..];
            assert_eq!(tokenize(&format!("{cap} {w}"), vocab), [id, id]);
        }
        // A generated answer resent after its prompt is the same tokens.
        let answer: Vec<u32> = vec![17, 2_000, 8_191, 5, 640];
        let text: String = answer.iter().map(|&id| format!(" {}", word(id))).collect();
        let prompt = "<|user|>\nsome question here\n<|assistant|>\n";
        let mut want = tokenize(prompt, vocab);
        want.extend(&answer);
        assert_eq!(tokenize(&format!("{prompt}{text}"), vocab), want);
    }

    #[test]
    fn ids_past_the_round_trip_range_have_longer_words_and_are_never_mistaken() {
        let w = word(ROUND_TRIP_IDS + 1);
        assert!(w.len() > 4, "{w}");
        // A vocabulary word beyond a small vocabulary is hashed, inside it.
        assert!(tokenize(&word(9_000), 100).iter().all(|&i| (1..100).contains(&i)));
    }
}
