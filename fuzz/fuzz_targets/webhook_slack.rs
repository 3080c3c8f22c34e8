//! Slack's webhooks (events, slash commands, interactions): the timestamp and signature
//! headers and the body. Never accepts a body not signed with the signing secret within the
//! replay window; a signed body parses without a panic.
#![no_main]

use antler_fuzz::{SLACK, WebhookInput, check_parsed, headers, now_secs, run_webhook};
use antler_testkit::slack::{SIGNATURE_HEADER, SIGNING_SECRET, TIMESTAMP_HEADER, signature};
use libfuzzer_sys::fuzz_target;

const ROUTES: [&str; 3] = ["events", "commands", "interactions"];

fuzz_target!(|data: &[u8]| {
    let Some(input) = WebhookInput::read(data) else {
        return;
    };
    let route = ROUTES[usize::from(input.variant) % ROUTES.len()];
    let now = now_secs();
    let (timestamp, sig) = match input.mode {
        0 => (input.field(0).to_vec(), input.field(1).to_vec()),
        1 => {
            let ts = now.to_string();
            let sig = signature(SIGNING_SECRET, &ts, input.body);
            (ts.into_bytes(), sig.into_bytes())
        }
        2 => {
            let ts = now.to_string();
            let sig = signature("8f742231b10e8888abcd99yyyzzz85a6", &ts, input.body);
            (ts.into_bytes(), sig.into_bytes())
        }
        _ => {
            let ts = (now - 3600).to_string();
            let sig = signature(SIGNING_SECRET, &ts, input.body);
            (ts.into_bytes(), sig.into_bytes())
        }
    };
    let headers = headers(&[
        (TIMESTAMP_HEADER, timestamp.as_slice()),
        (SIGNATURE_HEADER, sig.as_slice()),
    ]);
    let (accepted, parsed) = run_webhook(&*SLACK, route, &headers, input.body);
    match input.mode {
        0 if accepted => {
            // Accepted: the signature is the secret's over this body at a recent timestamp.
            let ts = std::str::from_utf8(&timestamp).unwrap().trim();
            let age = i64::try_from(now).unwrap() - ts.parse::<i64>().unwrap();
            assert!(age.abs() <= 300, "accepted at age {age}");
            let expected = signature(SIGNING_SECRET, ts, input.body);
            let given = std::str::from_utf8(&sig).unwrap().trim();
            assert!(given.eq_ignore_ascii_case(&expected), "accepted {given:?}");
        }
        0 => {}
        1 => assert_eq!(accepted, std::str::from_utf8(input.body).is_ok()),
        _ => assert!(!accepted),
    }
    check_parsed("slack", &parsed);
});
