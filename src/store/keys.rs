//! Unambiguous keys made of several parts.
//!
//! Each part is written as its length (4 bytes, big-endian) followed by its bytes, so different
//! tuples never give the same key: with a separator, conversation `a:b` + id `c` and
//! conversation `a` + id `b:c` would both be `a:b:c`. The encoding of a tuple's first parts is
//! a prefix of the whole tuple's encoding, so "every key of this thread" is a prefix scan.
//! Numbers are big-endian, so they sort in numeric order within their prefix.

/// Appends one length-prefixed part.
fn push_part(key: &mut Vec<u8>, part: &[u8]) {
    // Parts are ids and keys bounded far below 4 GiB by the request limits; saturating keeps
    // this total, and a part that long could not be stored anyway.
    let len = u32::try_from(part.len()).unwrap_or(u32::MAX);
    key.extend_from_slice(&len.to_be_bytes());
    key.extend_from_slice(part);
}

/// The key of a tuple of byte strings.
#[must_use]
pub(super) fn tuple(parts: &[&[u8]]) -> Vec<u8> {
    let mut key = Vec::with_capacity(parts.iter().map(|p| p.len() + 4).sum());
    for part in parts {
        push_part(&mut key, part);
    }
    key
}

/// The key of a string followed by a number (a thread's message `index`, ...).
#[must_use]
pub(super) fn with_index(prefix: &str, index: u64) -> Vec<u8> {
    let mut key = tuple(&[prefix.as_bytes()]);
    key.extend_from_slice(&index.to_be_bytes());
    key
}

/// The first `count` parts of a tuple key and the bytes after them (a number's, for
/// [`with_index`] keys); `None` when `key` is not such a tuple.
pub(super) fn split(key: &[u8], count: usize) -> Option<(Vec<&[u8]>, &[u8])> {
    let mut parts = Vec::with_capacity(count);
    let mut rest = key;
    for _ in 0..count {
        let (len, tail) = rest.split_first_chunk::<4>()?;
        let len = usize::try_from(u32::from_be_bytes(*len)).ok()?;
        if tail.len() < len {
            return None;
        }
        let (part, tail) = tail.split_at(len);
        parts.push(part);
        rest = tail;
    }
    Some((parts, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_that_would_join_alike_give_different_keys() {
        assert_ne!(tuple(&[b"victim:b", b"c"]), tuple(&[b"victim", b"b:c"]));
        assert_ne!(tuple(&[b"ab", b""]), tuple(&[b"a", b"b"]));
        assert_eq!(tuple(&[b"a", b"b"]), tuple(&[b"a", b"b"]));
    }

    #[test]
    fn a_prefix_tuple_is_a_key_prefix_and_indexes_sort_numerically() {
        let thread = tuple(&[b"t1"]);
        let first = with_index("t1", 2);
        let later = with_index("t1", 10);
        assert!(first.starts_with(&thread) && later.starts_with(&thread));
        assert!(first < later);
        assert!(!with_index("t10", 0).starts_with(&thread));
    }
}
