//! The Encrypt Key's two uses: decrypting event bodies and checking their signature.

use base64::Engine;
use cbc::cipher::block_padding::Pkcs7;
use cbc::cipher::{BlockDecryptMut, KeyIvInit};
use sha2::{Digest, Sha256};

type Decryptor = cbc::Decryptor<aes::Aes256>;

/// The AES-256 key of an Encrypt Key: its SHA-256.
pub(crate) fn aes_key(encrypt_key: &str) -> [u8; 32] {
    Sha256::digest(encrypt_key.as_bytes()).into()
}

/// Decrypts an `{"encrypt": …}` value: base64 of a 16-byte IV followed by AES-256-CBC
/// ciphertext with PKCS#7 padding. `None` for anything that is not exactly that.
pub(crate) fn decrypt(key: &[u8; 32], encrypted: &str) -> Option<Vec<u8>> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(encrypted.trim())
        .ok()?;
    if raw.len() < 32 {
        // An IV and at least one block.
        return None;
    }
    let (iv, ciphertext) = raw.split_at(16);
    Decryptor::new_from_slices(key, iv)
        .ok()?
        .decrypt_padded_vec_mut::<Pkcs7>(ciphertext)
        .ok()
}

/// `X-Lark-Signature`: hex SHA-256 of timestamp, nonce, Encrypt Key and the raw body, joined
/// (a plain hash, not an HMAC).
pub(crate) fn signature(timestamp: &str, nonce: &str, encrypt_key: &str, body: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(timestamp.as_bytes());
    hash.update(nonce.as_bytes());
    hash.update(encrypt_key.as_bytes());
    hash.update(body);
    hex::encode(hash.finalize())
}

#[cfg(test)]
mod tests {
    use antler_testkit::feishu::encrypt;

    use super::*;

    #[test]
    fn round_trip_and_garbage() {
        let key = aes_key("k");
        let sealed = encrypt(b"{\"a\":1}", "k", [7; 16]);
        assert_eq!(decrypt(&key, &sealed).unwrap(), b"{\"a\":1}");
        assert_eq!(decrypt(&aes_key("other"), &sealed), None);
        assert_eq!(decrypt(&key, "not base64!"), None);
        assert_eq!(decrypt(&key, "AAAA"), None);
        // An IV and a block and a half.
        let ragged = base64::engine::general_purpose::STANDARD.encode([0u8; 40]);
        assert_eq!(decrypt(&key, &ragged), None);
    }

    #[test]
    fn signature_is_sha256_of_the_concatenation() {
        // sha256("") is well known; the parts are simply concatenated.
        assert_eq!(
            signature("", "", "", b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            signature("1", "2", "3", b"4"),
            signature("12", "", "34", b"")
        );
    }
}
