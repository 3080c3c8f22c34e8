//! Telegram's webhook: the secret header and the update body. An accepted request carries
//! exactly the configured secret; any body then parses without a panic.
#![no_main]

use antler_fuzz::{TELEGRAM, WebhookInput, check_parsed, headers, run_webhook};
use antler_testkit::telegram::{SECRET, SECRET_HEADER};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(input) = WebhookInput::read(data) else {
        return;
    };
    let secret: &[u8] = match input.mode {
        0 => input.field(0),
        1 => SECRET.as_bytes(),
        _ => b"hook-secret_2",
    };
    let headers = headers(&[(SECRET_HEADER, secret)]);
    let (accepted, parsed) = run_webhook(&*TELEGRAM, "webhook", &headers, input.body);
    match input.mode {
        0 => assert_eq!(
            accepted,
            headers.get(SECRET_HEADER).map(|v| v.as_bytes()) == Some(SECRET.as_bytes())
        ),
        1 => assert!(accepted),
        _ => assert!(!accepted),
    }
    check_parsed("telegram", &parsed);
});
