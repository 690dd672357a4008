//! The key `bench` and `scenario` open their sessions with.

/// A fixed, deterministic key of `len` bytes that every algorithm accepts:
/// the bytes are pairwise distinct for `len` ≤ 256 (61 is odd, so
/// `i * 61 + 3` is a bijection mod 256), so an XTS key's halves differ.
/// Only timing is measured with it: its value does not matter otherwise.
pub fn key(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(61).wrapping_add(3))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::key;

    #[test]
    fn xts_halves_differ() {
        let k = key(64);
        assert_eq!(k.len(), 64);
        assert_ne!(k[..32], k[32..]);
        assert_eq!(key(16), k[..16]);
    }
}
