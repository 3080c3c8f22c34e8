//! The channel conformance list: what every platform's [`Channel`] must do, written once and run
//! by each channel crate against its own channel (`conformance_tests!(MyConformance)` in its
//! `tests/conformance.rs`).
//!
//! The platform's side of each case (how it signs, what it records, how it rate-limits) is a
//! [`Platform`] in this crate; the channel crate supplies only how to build its channel against
//! the platform's mock API ([`Conformance::channel`]). The cases:
//!
//! 1. [`verifies_signed_recorded_requests`]: the signer reproduces the recorded vectors, and
//!    every recorded payload, signed now as the platform signs it, verifies.
//! 2. [`refuses_tampered_requests`]: a byte changed after signing (Telegram: in the secret, which
//!    is all it sends), or the signature left off, is `Unauthorized`.
//! 3. [`refuses_stale_requests`]: signed before the replay window, refused by the headers alone;
//!    inside it, accepted. Telegram's secret carries no time, which the case checks instead.
//! 4. [`parses_every_fixture`]: each recorded payload parses to what it is (events, a protocol
//!    reply, nothing), events stamped by the channel's clock; garbage is `Malformed`.
//! 5. [`sends_a_reply`]: the reply to a recorded message reaches the mock API with the rendered
//!    text, and the receipt names the message the API created.
//! 6. [`edits_a_sent_message`]: where the channel edits, the edit reaches the API; where it does
//!    not, it says `Unsupported` and sends nothing.
//! 7. [`honours_a_429`]: the platform's documented 429 becomes `RateLimited` with exactly the delay
//!    it named, and once that has passed the same part goes through.

use std::time::Duration;

use antler_channel::{
    Channel, ChannelError, InboundEvent, OutboundMessage, Parsed, Part, Receipt, WebhookRequest,
};

use crate::Call;

/// What a recorded payload parses to.
#[derive(Debug, Clone, PartialEq)]
pub enum Expect {
    /// This many events.
    Events(usize),
    /// Exactly this protocol reply, nothing stored.
    Reply(serde_json::Value),
    /// This many events and an immediate reply (a slash command's acknowledgement, a deferral).
    EventsWithReply(usize),
    /// Nothing (the bot's own echo).
    Ignore,
}

/// A recorded payload (in `channels/<platform>/tests/fixtures`) and what it must parse to.
#[derive(Debug, Clone)]
pub struct Fixture {
    /// The webhook route it comes to (see `Channel::routes`).
    pub route: &'static str,
    /// Its file name.
    pub name: &'static str,
    /// What it parses to.
    pub expect: Expect,
}

/// A recorded signature vector: the exact bytes the platform signed and the headers it sent,
/// at [`crate::VECTOR_TIME`].
#[derive(Debug, Clone)]
pub struct Vector {
    /// The vector's name (its file).
    pub name: &'static str,
    /// The body as sent.
    pub body: Vec<u8>,
    /// The headers as sent.
    pub headers: http::HeaderMap,
}

/// One request that wrote a message, as the mock API recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// It replaced an existing message's text (`editMessageText`, `chat.update`, a `PATCH`).
    pub edit: bool,
    /// The text (markup) it carried.
    pub text: String,
}

impl Written {
    /// What `call` wrote when its path ends with `/<send>` or `/<edit>` (an API of one method
    /// a path, JSON bodies with the text in `text`, as Telegram's and Slack's are).
    #[must_use]
    pub fn by_method(call: &Call, send: &str, edit: &str) -> Option<Self> {
        let method = call.path.rsplit('/').next()?;
        let edit = match method {
            m if m == edit => true,
            m if m == send => false,
            _ => return None,
        };
        let text = call.body["text"].as_str().unwrap_or_default().to_owned();
        Some(Self { edit, text })
    }
}

/// A platform's mock API: started on 127.0.0.1 with the platform module's test credentials,
/// answering as the real API documents and recording every request.
#[async_trait::async_trait]
pub trait MockApi: Send + Sync + Sized {
    /// Starts it, knowing the bot and accepting every message.
    async fn start() -> Self;

    /// The server it runs on.
    fn server(&self) -> &wiremock::MockServer;

    /// The base URL a channel is configured with (`api_url`).
    fn api_url(&self) -> String {
        self.server().uri()
    }

    /// What `call` wrote, if it sent or edited a message.
    fn written_by(call: &Call) -> Option<Written>;

    /// Every request that wrote a message (sent or edited it), in order, refused ones included.
    async fn written(&self) -> Vec<Written> {
        crate::calls_of(self.server())
            .await
            .iter()
            .filter_map(Self::written_by)
            .collect()
    }

    /// The id the API gives the message a reply's first part creates.
    fn message_id(&self) -> String;

    /// Makes the next message a reply sends fail with the platform's own 429, naming
    /// `retry_after_secs` (whole seconds) as the platform documents it.
    async fn rate_limit_next_message(&self, retry_after_secs: u64);
}

/// A platform's protocol facts for the conformance cases.
pub trait Platform {
    /// Its mock API.
    type Mock: MockApi;

    /// The channel's name.
    const NAME: &'static str;

    /// How old a signed request may be (`None`: no limit, because nothing in the request says
    /// when it was sent, or the platform documents none and retries for hours).
    const REPLAY_WINDOW: Option<Duration>;

    /// A recorded payload's body as the platform sends it (Feishu: encrypted).
    fn seal(plain: &[u8]) -> Vec<u8> {
        plain.to_vec()
    }

    /// The headers the platform sends `body` with, signed at `at_secs`.
    fn sign(body: &[u8], at_secs: u64) -> http::HeaderMap;

    /// Changes a signed request after signing. By default one letter of the body changes case
    /// (text stays text, JSON stays JSON, base64 stays base64): only the signature can tell.
    fn tamper(body: &mut Vec<u8>, _headers: &mut http::HeaderMap) {
        flip_a_letter(body);
    }

    /// The recorded signature vectors (none for Telegram, which signs nothing).
    fn vectors() -> Vec<Vector>;

    /// The recorded payloads and what each parses to.
    fn fixtures() -> Vec<Fixture>;

    /// The recorded payload whose first event the send and edit cases answer.
    fn answered() -> Fixture;
}

/// The channel crate's side: its channel, set up against the platform's mock API as antler
/// sets it up (the bot's identity learned where the channel asks for it).
#[async_trait::async_trait]
pub trait Conformance {
    /// The platform.
    type Platform: Platform;
    /// The channel under test.
    type Channel: Channel;

    /// The channel for `api`, with `now_ms` as its clock.
    async fn channel(
        api: &<Self::Platform as Platform>::Mock,
        now_ms: fn() -> u64,
    ) -> Self::Channel;
}

/// Generates one test per conformance case for `$conformance` (a [`Conformance`]), in a module
/// `conformance`.
#[macro_export]
macro_rules! conformance_tests {
    ($conformance:ty) => {
        mod conformance {
            use super::*;

            #[test]
            fn verifies_signed_recorded_requests() {
                $crate::block_on($crate::conformance::verifies_signed_recorded_requests::<
                    $conformance,
                >());
            }

            #[test]
            fn refuses_tampered_requests() {
                $crate::block_on($crate::conformance::refuses_tampered_requests::<$conformance>());
            }

            #[test]
            fn refuses_stale_requests() {
                $crate::block_on($crate::conformance::refuses_stale_requests::<$conformance>());
            }

            #[test]
            fn parses_every_fixture() {
                $crate::block_on($crate::conformance::parses_every_fixture::<$conformance>());
            }

            #[test]
            fn sends_a_reply() {
                $crate::block_on($crate::conformance::sends_a_reply::<$conformance>());
            }

            #[test]
            fn edits_a_sent_message() {
                $crate::block_on($crate::conformance::edits_a_sent_message::<$conformance>());
            }

            #[test]
            fn honours_a_429() {
                $crate::block_on($crate::conformance::honours_a_429::<$conformance>());
            }
        }
    };
}

type Mock<C> = <<C as Conformance>::Platform as Platform>::Mock;

/// A payload of `P`'s as the platform would send it at `at_secs`: `(body, headers)`.
fn request_at<P: Platform>(fixture: &Fixture, at_secs: u64) -> (Vec<u8>, http::HeaderMap) {
    let body = P::seal(&plain(P::NAME, fixture.name));
    let headers = P::sign(&body, at_secs);
    (body, headers)
}

/// A fixture's bytes as a platform sends them: a form without the file's trailing newline.
fn plain(platform: &str, name: &str) -> Vec<u8> {
    let mut bytes = crate::fixture_bytes(platform, name);
    while bytes.last().is_some_and(u8::is_ascii_whitespace) {
        bytes.pop();
    }
    bytes
}

fn verify<C: Channel>(
    channel: &C,
    route: &str,
    headers: &http::HeaderMap,
    body: &[u8],
) -> Result<(), ChannelError> {
    channel.verify(&WebhookRequest {
        route,
        headers,
        body,
    })
}

fn parse<C: Channel>(
    channel: &C,
    route: &str,
    headers: &http::HeaderMap,
    body: &[u8],
) -> Result<Parsed, ChannelError> {
    channel.parse(&WebhookRequest {
        route,
        headers,
        body,
    })
}

/// Changes the case of the first ASCII letter in the second half of `body`.
pub fn flip_a_letter(body: &mut [u8]) {
    let middle = body.len() / 2;
    let at = (middle..body.len())
        .chain(0..middle)
        .find(|&i| body[i].is_ascii_alphabetic())
        .expect("a body with a letter in it");
    body[at] ^= 0x20;
}

/// The fixtures that hold messages (the requests a forger would want accepted).
fn message_fixtures<P: Platform>() -> Vec<Fixture> {
    P::fixtures()
        .into_iter()
        .filter(|f| {
            matches!(
                f.expect,
                Expect::Events(n) | Expect::EventsWithReply(n) if n > 0
            )
        })
        .collect()
}

/// Case 1: the signer reproduces every recorded vector, and every recorded payload signed now
/// verifies, by its headers and as a whole.
pub async fn verifies_signed_recorded_requests<C: Conformance>() {
    for vector in C::Platform::vectors() {
        let signed = C::Platform::sign(&vector.body, crate::VECTOR_TIME);
        for (name, value) in &vector.headers {
            assert_eq!(
                signed.get(name),
                Some(value),
                "{}: the signer reproduces the recorded {name}",
                vector.name
            );
        }
    }
    let mock = Mock::<C>::start().await;
    let channel = C::channel(&mock, crate::now_ms).await;
    for fixture in C::Platform::fixtures() {
        let (body, headers) = request_at::<C::Platform>(&fixture, crate::now_secs());
        assert_eq!(
            channel.verify_headers(&headers),
            Ok(()),
            "{}: the headers",
            fixture.name
        );
        assert_eq!(
            verify(&channel, fixture.route, &headers, &body),
            Ok(()),
            "{}",
            fixture.name
        );
    }
}

/// Case 2: a request changed after signing, or sent without its signature, is refused.
pub async fn refuses_tampered_requests<C: Conformance>() {
    let mock = Mock::<C>::start().await;
    let channel = C::channel(&mock, crate::now_ms).await;
    for fixture in message_fixtures::<C::Platform>() {
        let (body, headers) = request_at::<C::Platform>(&fixture, crate::now_secs());
        let (mut tampered, mut tampered_headers) = (body.clone(), headers.clone());
        C::Platform::tamper(&mut tampered, &mut tampered_headers);
        assert!(
            tampered != body || tampered_headers != headers,
            "{}: tampering changed nothing",
            fixture.name
        );
        assert_eq!(
            verify(&channel, fixture.route, &tampered_headers, &tampered),
            Err(ChannelError::Unauthorized),
            "{}: tampered",
            fixture.name
        );
        assert_eq!(
            verify(&channel, fixture.route, &http::HeaderMap::new(), &body),
            Err(ChannelError::Unauthorized),
            "{}: unsigned",
            fixture.name
        );
    }
}

/// Case 3: a request signed before the replay window is refused (by its headers alone, before
/// the body is read); one signed just inside it is accepted. Where the platform's request
/// carries no time (Telegram), the case checks that: the request is the same whenever made.
pub async fn refuses_stale_requests<C: Conformance>() {
    let mock = Mock::<C>::start().await;
    let channel = C::channel(&mock, crate::now_ms).await;
    let now = crate::now_secs();
    for fixture in message_fixtures::<C::Platform>() {
        match C::Platform::REPLAY_WINDOW {
            Some(window) => {
                let window = window.as_secs();
                let (body, stale) = request_at::<C::Platform>(&fixture, now - window - 60);
                assert_eq!(
                    channel.verify_headers(&stale),
                    Err(ChannelError::Unauthorized),
                    "{}: stale headers",
                    fixture.name
                );
                assert_eq!(
                    verify(&channel, fixture.route, &stale, &body),
                    Err(ChannelError::Unauthorized),
                    "{}: stale",
                    fixture.name
                );
                let (body, recent) = request_at::<C::Platform>(&fixture, now - window + 60);
                assert_eq!(
                    verify(&channel, fixture.route, &recent, &body),
                    Ok(()),
                    "{}: inside the window",
                    fixture.name
                );
            }
            None => {
                let (body, yesterday) = request_at::<C::Platform>(&fixture, now - 86_400);
                assert_eq!(
                    verify(&channel, fixture.route, &yesterday, &body),
                    Ok(()),
                    "{}: signed a day ago",
                    fixture.name
                );
            }
        }
    }
}

/// Case 4: every recorded payload parses to what it is; events carry the channel's name, a
/// conversation of its own, an id and the channel clock's time; garbage is `Malformed`.
pub async fn parses_every_fixture<C: Conformance>() {
    let mock = Mock::<C>::start().await;
    let channel = C::channel(&mock, crate::now_ms).await;
    let before = crate::now_ms();
    let fixtures = C::Platform::fixtures();
    assert!(!fixtures.is_empty());
    for fixture in &fixtures {
        let (body, headers) = request_at::<C::Platform>(fixture, crate::now_secs());
        let parsed = parse(&channel, fixture.route, &headers, &body)
            .unwrap_or_else(|e| panic!("{}: {e}", fixture.name));
        let events = match (&fixture.expect, parsed) {
            (Expect::Events(n), Parsed::Events(events)) => {
                assert_eq!(events.len(), *n, "{}", fixture.name);
                events
            }
            (Expect::EventsWithReply(n), Parsed::EventsWithReply { events, reply }) => {
                assert_eq!(events.len(), *n, "{}", fixture.name);
                assert!(reply.is_object(), "{}: {reply}", fixture.name);
                events
            }
            (Expect::Reply(expected), Parsed::Reply(reply)) => {
                assert_eq!(&reply, expected, "{}", fixture.name);
                Vec::new()
            }
            (Expect::Ignore, Parsed::Ignore) => Vec::new(),
            (expected, parsed) => panic!("{}: expected {expected:?}, got {parsed:?}", fixture.name),
        };
        let after = crate::now_ms();
        for event in events {
            assert_eq!(event.channel, C::Platform::NAME, "{}", fixture.name);
            assert!(
                event
                    .conversation
                    .as_str()
                    .starts_with(&format!("{}:", C::Platform::NAME)),
                "{}: {}",
                fixture.name,
                event.conversation
            );
            assert!(!event.event_id.is_empty(), "{}", fixture.name);
            assert!(!event.text.is_empty(), "{}", fixture.name);
            assert!(
                (before..=after).contains(&event.received_at_ms),
                "{}: stamped by the channel's clock",
                fixture.name
            );
        }
    }
    let route = fixtures[0].route;
    let garbage = C::Platform::seal(b"{not json");
    assert!(
        matches!(
            parse(&channel, route, &http::HeaderMap::new(), &garbage),
            Err(ChannelError::Malformed(_))
        ),
        "garbage is malformed"
    );
}

/// The first event of the payload the send and edit cases answer.
fn answered_event<C: Conformance>(channel: &C::Channel) -> InboundEvent {
    let fixture = C::Platform::answered();
    let (body, headers) = request_at::<C::Platform>(&fixture, crate::now_secs());
    match parse(channel, fixture.route, &headers, &body) {
        Ok(Parsed::Events(mut events) | Parsed::EventsWithReply { mut events, .. })
            if !events.is_empty() =>
        {
            events.remove(0)
        }
        other => panic!("{} holds no event: {other:?}", fixture.name),
    }
}

/// The reply to `event`, as a turn makes it.
fn reply_to(event: &InboundEvent, text: &str) -> OutboundMessage {
    OutboundMessage {
        prompts: Vec::new(),
        idempotency_key: "conformance:1:0".to_owned(),
        conversation: event.conversation.clone(),
        thread_id: "conformance".to_owned(),
        text: text.to_owned(),
        reply_to: event.reply_to.clone(),
        files: Vec::new(),
        reply_context: event.reply_context.clone(),
    }
}

/// The answer's Markdown: it needs the platform's markup and escaping.
const ANSWER: &str = "**Done**: web-api restarted & healthy";

/// Renders [`ANSWER`] and sends its first part.
async fn send_first_part<C: Channel>(
    channel: &C,
    message: &OutboundMessage,
) -> (String, Result<Receipt, ChannelError>) {
    let parts = channel.render(&message.text).expect("the answer renders");
    let body = parts.first().expect("one part at least").clone();
    let sent = channel
        .send(
            message,
            Part {
                buttons: &[],
                index: 0,
                body: &body,
            },
        )
        .await;
    (body, sent)
}

/// Case 5: the reply to a recorded message reaches the API once, with the rendered text; the
/// receipt names the message the API created.
pub async fn sends_a_reply<C: Conformance>() {
    let mock = Mock::<C>::start().await;
    let channel = C::channel(&mock, crate::now_ms).await;
    let message = reply_to(&answered_event::<C>(&channel), ANSWER);
    let (body, sent) = send_first_part(&channel, &message).await;
    let receipt = sent.expect("sent");
    assert_eq!(receipt.platform_message_id, mock.message_id());
    let written = mock.written().await;
    assert_eq!(written.len(), 1, "{written:?}");
    assert_eq!(written[0].text, body);
}

/// Case 6: where the channel edits (its limits name an edit rate), an edit of the sent message
/// reaches the API with the new text; elsewhere it is `Unsupported` and nothing is sent.
pub async fn edits_a_sent_message<C: Conformance>() {
    let mock = Mock::<C>::start().await;
    let channel = C::channel(&mock, crate::now_ms).await;
    let message = reply_to(&answered_event::<C>(&channel), ANSWER);
    let (_, sent) = send_first_part(&channel, &message).await;
    let receipt = sent.expect("sent");
    let edited = channel.render("**Done**, and checked").expect("renders")[0].clone();
    let result = channel
        .edit(
            &message,
            &receipt,
            Part {
                buttons: &[],
                index: 0,
                body: &edited,
            },
        )
        .await;
    let written = mock.written().await;
    if channel.limits().edits.is_some() {
        assert_eq!(result, Ok(()));
        assert_eq!(written.len(), 2, "{written:?}");
        assert_eq!(
            written[1],
            Written {
                edit: true,
                text: edited
            }
        );
    } else {
        assert_eq!(result, Err(ChannelError::Unsupported));
        assert_eq!(written.len(), 1, "nothing more was sent: {written:?}");
    }
}

/// Case 7: the platform's 429 is `RateLimited` with exactly the delay it named (not a default:
/// 2 s is no platform's default), and once the delay has passed the same part goes through.
pub async fn honours_a_429<C: Conformance>() {
    const RETRY_AFTER: u64 = 2;
    let mock = Mock::<C>::start().await;
    let channel = C::channel(&mock, crate::now_ms).await;
    let message = reply_to(&answered_event::<C>(&channel), ANSWER);
    mock.rate_limit_next_message(RETRY_AFTER).await;
    let (body, refused) = send_first_part(&channel, &message).await;
    assert_eq!(
        refused,
        Err(ChannelError::RateLimited {
            retry_after: Duration::from_secs(RETRY_AFTER)
        })
    );
    assert!(refused.as_ref().is_err_and(ChannelError::is_retryable));
    // Waiting out the delay, as delivery does.
    tokio::time::sleep(Duration::from_secs(RETRY_AFTER)).await;
    let (_, sent) = send_first_part(&channel, &message).await;
    assert_eq!(sent.map(|r| r.platform_message_id), Ok(mock.message_id()));
    let written = mock.written().await;
    assert_eq!(
        written.len(),
        2,
        "one refused attempt, one delivery: {written:?}"
    );
    assert!(written.iter().all(|w| w.text == body));
}
