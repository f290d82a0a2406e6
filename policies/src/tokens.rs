//! Token counting shared by the gateway (estimates, usage) and the emulated
//! engine (usage it reports).
//!
//! The bundled synthetic models have no real vocabulary, so a token is
//! defined the way OpenAI's own rule of thumb does: about four characters of
//! English text. The count is deterministic, so the gateway's estimate and the
//! engine's reported `prompt_tokens` agree exactly for the same text.

/// Estimated number of tokens in `text`: one token per started run of four
/// non-whitespace characters in each word, and at least one for non-empty
/// text. "hello world" → 4 tokens (2 + 2); "" → 0.
pub fn count(text: &str) -> u32 {
    let n: usize = text.split_whitespace().map(|w| w.chars().count().div_ceil(4)).sum();
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::count;

    #[test]
    fn counts_four_character_pieces_per_word() {
        assert_eq!(count(""), 0);
        assert_eq!(count("   "), 0);
        assert_eq!(count("a"), 1);
        assert_eq!(count("abcd"), 1);
        assert_eq!(count("abcde"), 2);
        assert_eq!(count("hello world"), 4);
        assert_eq!(count("héllo"), 2, "counts characters, not bytes");
    }
}
