//! Discord's interactions webhook: the Ed25519 signature and timestamp headers and the body.
//! Never accepts a body not signed with the application's key within the replay window; a
//! signed body parses without a panic.
#![no_main]

use antler_fuzz::{DISCORD, WebhookInput, check_parsed, headers, now_secs, run_webhook};
use antler_testkit::discord::{SIGNATURE_HEADER, TIMESTAMP_HEADER, key};
use ed25519_dalek::{Signer, SigningKey, Verifier};
use libfuzzer_sys::fuzz_target;

fn sign(signer: &SigningKey, timestamp: &str, body: &[u8]) -> Vec<u8> {
    let mut signed = timestamp.as_bytes().to_vec();
    signed.extend_from_slice(body);
    hex::encode(signer.sign(&signed).to_bytes()).into_bytes()
}

fuzz_target!(|data: &[u8]| {
    let Some(input) = WebhookInput::read(data) else {
        return;
    };
    let now = now_secs();
    let signed_by = |signer: &SigningKey, at: u64| {
        let ts = at.to_string();
        let sig = sign(signer, &ts, input.body);
        (ts.into_bytes(), sig)
    };
    let (timestamp, signature) = match input.mode {
        0 => (input.field(0).to_vec(), input.field(1).to_vec()),
        1 => signed_by(&key(), now),
        2 => signed_by(&SigningKey::from_bytes(&[7; 32]), now),
        _ => signed_by(&key(), now - 3600),
    };
    let headers = headers(&[
        (TIMESTAMP_HEADER, timestamp.as_slice()),
        (SIGNATURE_HEADER, signature.as_slice()),
    ]);
    let (accepted, parsed) = run_webhook(&*DISCORD, "interactions", &headers, input.body);
    match input.mode {
        0 if accepted => {
            // Accepted: a valid signature by the application's key over timestamp and body.
            let ts = headers.get(TIMESTAMP_HEADER).unwrap().as_bytes();
            let sig = hex::decode(
                headers
                    .get(SIGNATURE_HEADER)
                    .unwrap()
                    .as_bytes()
                    .trim_ascii(),
            )
            .expect("accepted a signature that is not hex");
            let sig = ed25519_dalek::Signature::from_slice(&sig).expect("a 64-byte signature");
            let mut signed = ts.to_vec();
            signed.extend_from_slice(input.body);
            assert!(key().verifying_key().verify(&signed, &sig).is_ok());
        }
        0 => {}
        1 => assert!(accepted),
        _ => assert!(!accepted),
    }
    check_parsed("discord", &parsed);
});
