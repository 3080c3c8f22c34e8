//! Feishu's event webhook, with and without encryption: the timestamp, nonce and signature
//! headers and the body. With an Encrypt Key, never accepts a body whose signature does not
//! match (a URL verification, which Feishu sends unsigned, aside); without one, never accepts
//! an event without the Verification Token. Any body parses without a panic.
#![no_main]

use antler_channel::Parsed;
use antler_fuzz::{
    FEISHU_ENCRYPTED, FEISHU_PLAIN, WebhookInput, check_parsed, headers, now_secs, run_webhook,
};
use antler_testkit::feishu::{
    ENCRYPT_KEY, NONCE, NONCE_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, VERIFICATION_TOKEN,
    sealed_body, signature,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(input) = WebhookInput::read(data) else {
        return;
    };
    let encrypted = input.variant & 1 == 0;
    let channel = if encrypted {
        &*FEISHU_ENCRYPTED
    } else {
        &*FEISHU_PLAIN
    };
    // Signed modes seal the fuzzed plaintext as Feishu does, so the parser sees it.
    let body = if encrypted && input.mode != 0 {
        sealed_body(input.body, ENCRYPT_KEY)
    } else {
        input.body.to_vec()
    };
    let now = now_secs().to_string();
    let (timestamp, nonce, sig) = match input.mode {
        0 => (
            input.field(0).to_vec(),
            input.field(1).to_vec(),
            input.field(2).to_vec(),
        ),
        1 => (
            now.clone().into_bytes(),
            NONCE.as_bytes().to_vec(),
            signature(&now, NONCE, ENCRYPT_KEY, &body).into_bytes(),
        ),
        _ => (
            now.clone().into_bytes(),
            NONCE.as_bytes().to_vec(),
            signature(&now, NONCE, "another-encrypt-key", &body).into_bytes(),
        ),
    };
    let headers = headers(&[
        (TIMESTAMP_HEADER, timestamp.as_slice()),
        (NONCE_HEADER, nonce.as_slice()),
        (SIGNATURE_HEADER, sig.as_slice()),
    ]);
    let (accepted, parsed) = run_webhook(channel, "events", &headers, &body);
    if accepted {
        let url_verification = matches!(parsed, Ok(Parsed::Reply(_)));
        if encrypted && !url_verification {
            let value =
                |name: &str| std::str::from_utf8(headers.get(name).unwrap().as_bytes()).unwrap();
            let expected = signature(
                value(TIMESTAMP_HEADER),
                value(NONCE_HEADER),
                ENCRYPT_KEY,
                &body,
            );
            assert_eq!(
                value(SIGNATURE_HEADER).trim().to_ascii_lowercase(),
                expected
            );
        }
        if !encrypted {
            let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let token = if url_verification {
                event.get("token")
            } else {
                event
                    .pointer("/header/token")
                    .or_else(|| event.get("token"))
            };
            assert_eq!(token.and_then(|t| t.as_str()), Some(VERIFICATION_TOKEN));
        }
    }
    check_parsed("feishu", &parsed);
});
