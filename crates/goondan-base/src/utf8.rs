//! Cutting byte output without splitting a UTF-8 character.
//!
//! `bash` keeps the head and the tail of a capped stream and `http-fetch`
//! keeps the head of a capped body; both decode what they kept lossily, and
//! a character cut in two at the edge would show up as a replacement
//! character. These functions find the edges of the complete characters.
//! Bytes that can never be part of a character (`0xC0`, `0xC1`, `0xF5` and
//! above, stray continuation bytes) are not protected: lossy decoding shows
//! them as they are.

/// The length of `bytes` without a UTF-8 character cut off at its end.
pub(crate) fn complete_prefix_len(bytes: &[u8]) -> usize {
    let len = bytes.len();
    // A character is at most four bytes: its lead is among the last three
    // bytes if it is incomplete.
    for back in 1..=len.min(3) {
        let byte = bytes[len - back];
        if byte & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back for the lead
        }
        let width = match byte {
            0xF0..=0xF4 => 4,
            0xE0..=0xEF => 3,
            0xC2..=0xDF => 2,
            _ => 1,
        };
        return if back < width { len - back } else { len };
    }
    len
}

/// Where `bytes` starts after the continuation bytes of a character whose
/// beginning was cut off (at most three).
pub(crate) fn complete_suffix_start(bytes: &[u8]) -> usize {
    bytes.iter().take(3).take_while(|byte| **byte & 0xC0 == 0x80).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_end_before_a_cut_character() {
        let text = "a가😀".as_bytes(); // 1 + 3 + 4 bytes
        for (cut, end) in [(0, 0), (1, 1), (2, 1), (3, 1), (4, 4), (5, 4), (6, 4), (7, 4), (8, 8)] {
            assert_eq!(complete_prefix_len(&text[..cut]), end, "cut {cut}");
        }
        let text = "a가b".as_bytes();
        assert_eq!(complete_prefix_len(&text[..2]), 1);
        assert_eq!(complete_prefix_len(&text[..3]), 1);
        assert_eq!(complete_prefix_len(&text[..4]), 4);
        assert_eq!(complete_prefix_len(&text[..5]), 5);
        assert_eq!(complete_prefix_len(b""), 0);
        // Invalid bytes are not characters to protect: lossy decoding shows them.
        assert_eq!(complete_prefix_len(&[0xff, 0xfe]), 2);
        assert_eq!(complete_prefix_len(&[0x61, 0xFF]), 2);
        assert_eq!(complete_prefix_len(&[0x61, 0xC0]), 2);
        assert_eq!(complete_prefix_len(&[0x80, 0x80, 0x80, 0x80]), 4);
    }

    #[test]
    fn suffixes_start_after_a_cut_character() {
        let text = "a가b".as_bytes();
        assert_eq!(complete_suffix_start(&text[2..]), 2);
        assert_eq!(complete_suffix_start(&text[3..]), 1);
        assert_eq!(complete_suffix_start(&text[4..]), 0);
        assert_eq!(complete_suffix_start(&[0x80, 0x80, 0x80, 0x80, 0x61]), 3);
    }
}
