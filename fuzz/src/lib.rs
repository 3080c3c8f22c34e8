//! What the fuzz targets share: the channels under test (set up once, with the fixtures'
//! secrets and keys), the webhook input format, and the property checks on rendered chunks.
//!
//! A webhook target's input is `mode ++ headers ++ 0x00 ++ body`: the first byte picks the
//! mode (and route), the header fields are separated by `0x01`, and without a `0x00` the
//! headers are empty and the rest is the body. The modes:
//!
//! - 0 raw: the header fields are sent as they are; an accepted request must carry a valid
//!   signature (checked here independently of the channel's verifier);
//! - 1 signed: the body is signed now with the fixture key; it must be accepted (where the
//!   platform's verifier accepts any body), then parsed;
//! - 2 wrong key: signed now with another key; it must be refused;
//! - 3 stale: signed with the fixture key an hour ago; it must be refused where the platform
//!   judges age.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::LazyLock;
use std::time::{SystemTime, UNIX_EPOCH};

use antler_channel::render::{Document, Limit, Renderer, Token, chunk, concat};
use antler_channel::{Channel, Parsed, WebhookRequest};

/// Wall-clock milliseconds: Slack's verifier judges age by the wall clock too.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub fn now_secs() -> u64 {
    now_ms() / 1000
}

/// A fuzz input split as the module docs say.
pub struct WebhookInput<'a> {
    pub mode: u8,
    /// The mode byte's upper bits: picks a route or a channel variant.
    pub variant: u8,
    pub fields: Vec<&'a [u8]>,
    pub body: &'a [u8],
}

impl<'a> WebhookInput<'a> {
    pub fn read(data: &'a [u8]) -> Option<Self> {
        let (&first, rest) = data.split_first()?;
        let (head, body) = match rest.iter().position(|b| *b == 0) {
            Some(at) => (&rest[..at], &rest[at + 1..]),
            None => (&[][..], rest),
        };
        Some(WebhookInput {
            mode: first & 3,
            variant: first >> 2,
            fields: head.split(|b| *b == 1).collect(),
            body,
        })
    }

    /// Header field `index` (empty when absent).
    pub fn field(&self, index: usize) -> &'a [u8] {
        self.fields.get(index).copied().unwrap_or_default()
    }
}

/// A header map from `(name, value)` pairs; a value that is not a valid header value is left
/// out (it could not arrive over HTTP).
pub fn headers(pairs: &[(&'static str, &[u8])]) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    for (name, value) in pairs {
        if let Ok(value) = http::HeaderValue::from_bytes(value) {
            map.insert(http::HeaderName::from_static(name), value);
        }
    }
    map
}

/// Verifies and parses `body` on `route`; returns whether it was accepted and the parse
/// result (parsed whatever the verdict: the parser must survive any body).
pub fn run_webhook(
    channel: &dyn Channel,
    route: &str,
    headers: &http::HeaderMap,
    body: &[u8],
) -> (bool, Result<Parsed, antler_channel::ChannelError>) {
    let request = WebhookRequest {
        route,
        headers,
        body,
    };
    let accepted = channel.verify(&request).is_ok();
    let parsed = channel.parse(&request);
    (accepted, parsed)
}

/// Runs `future` to completion on a runtime of its own (the channels' identity lookups
/// against the testkit's mock APIs at start-up).
fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(future)
}

/// The Telegram channel with the fixtures' secret, knowing its bot (from the mock `getMe`).
pub static TELEGRAM: LazyLock<antler_telegram::TelegramChannel> = LazyLock::new(|| {
    use antler_testkit::telegram::{MockTelegram, SECRET, TOKEN};
    block_on(async {
        let api = MockTelegram::start().await;
        let channel = antler_telegram::TelegramChannel::new(
            &antler_telegram::TelegramSettings {
                bot_token: TOKEN.to_owned(),
                webhook_secret: SECRET.to_owned(),
                api_url: api.uri(),
            },
            now_ms,
        )
        .expect("a Telegram channel");
        channel.learn_identity().await.expect("the bot's identity");
        channel
    })
});

/// The Slack channel with the fixtures' signing secret, knowing its bot (mock `auth.test`).
pub static SLACK: LazyLock<antler_slack::SlackChannel> = LazyLock::new(|| {
    use antler_testkit::slack::{MockSlack, SIGNING_SECRET, TOKEN};
    block_on(async {
        let api = MockSlack::start().await;
        let channel = antler_slack::SlackChannel::new(
            &antler_slack::SlackSettings {
                bot_token: TOKEN.to_owned(),
                signing_secret: SIGNING_SECRET.to_owned(),
                api_url: api.api_url(),
                ..antler_slack::SlackSettings::default()
            },
            now_ms,
        )
        .expect("a Slack channel");
        channel.learn_identity().await.expect("the bot's identity");
        channel
    })
});

/// The Discord channel with the fixtures' public key (it needs no identity).
pub static DISCORD: LazyLock<antler_discord::DiscordChannel> = LazyLock::new(|| {
    use antler_testkit::discord::{APPLICATION_ID, BOT_TOKEN, public_key_hex};
    antler_discord::DiscordChannel::new(
        &antler_discord::DiscordSettings {
            application_id: APPLICATION_ID.to_owned(),
            public_key: public_key_hex(),
            bot_token: BOT_TOKEN.to_owned(),
            api_url: "http://127.0.0.1:9".to_owned(),
            allowed_guilds: Vec::new(),
        },
        now_ms,
    )
    .expect("a Discord channel")
});

fn feishu(encrypt: bool, cards: bool) -> antler_feishu::FeishuChannel {
    use antler_testkit::feishu::{APP_ID, APP_SECRET, ENCRYPT_KEY, MockFeishu, VERIFICATION_TOKEN};
    block_on(async {
        let api = MockFeishu::start().await;
        let channel = antler_feishu::FeishuChannel::new(
            &antler_feishu::FeishuSettings {
                app_id: APP_ID.to_owned(),
                app_secret: APP_SECRET.to_owned(),
                verification_token: VERIFICATION_TOKEN.to_owned(),
                encrypt_key: encrypt.then(|| ENCRYPT_KEY.to_owned()),
                api_url: api.uri(),
                cards,
                websocket: false,
            },
            now_ms,
        )
        .expect("a Feishu channel");
        channel.learn_identity().await.expect("the bot's identity");
        channel
    })
}

/// The Feishu channel with encryption (and cards).
pub static FEISHU_ENCRYPTED: LazyLock<antler_feishu::FeishuChannel> =
    LazyLock::new(|| feishu(true, true));
/// The Feishu channel without encryption, answering in plain text.
pub static FEISHU_PLAIN: LazyLock<antler_feishu::FeishuChannel> =
    LazyLock::new(|| feishu(false, false));

/// Renderer input: the first byte picks a small limit (so splitting happens often), the rest
/// is the Markdown. `None` when the input is not UTF-8 or holds the sentinels below.
pub fn render_input(data: &[u8]) -> Option<(usize, &str)> {
    let (&first, rest) = data.split_first()?;
    let markdown = std::str::from_utf8(rest).ok()?;
    if markdown.contains([OPEN_MARK, CLOSE_MARK]) {
        return None;
    }
    Some((8 + usize::from(first), markdown))
}

const OPEN_MARK: char = '\u{E000}';
const CLOSE_MARK: char = '\u{E001}';

fn without_whitespace(text: &str) -> String {
    text.chars().filter(|c| !c.is_whitespace()).collect()
}

/// The chunker's promises for one rendering at `limit`, checked on the renderer's tokens with
/// every span's markup replaced by one-character sentinels (so markup and text are told apart
/// exactly): every chunk within `limit`, every chunk's spans balanced on their own, and the
/// text (and atoms) of the token stream all there, in order, modulo whitespace (the chunker
/// drops the whitespace at a boundary). Returns the real chunks at `limit`.
pub fn check_chunking(renderer: &dyn Renderer, markdown: &str, limit: Limit) -> Vec<String> {
    let tokens = renderer.render(&Document::parse(markdown));
    let mut depth = 0usize;
    let mut text = String::new();
    let marked: Vec<Token> = tokens
        .iter()
        .map(|token| match token {
            Token::Open { .. } => {
                depth += 1;
                Token::Open {
                    open: OPEN_MARK.to_string(),
                    close: CLOSE_MARK.to_string(),
                    verbatim: true,
                }
            }
            Token::Close => {
                assert!(depth > 0, "a Close without an Open: {tokens:?}");
                depth -= 1;
                Token::Close
            }
            Token::Text(t) | Token::Atom(t) | Token::Prefix(t) => {
                text.push_str(t);
                token.clone()
            }
        })
        .collect();
    assert_eq!(depth, 0, "unbalanced token stream: {tokens:?}");

    let max = match limit {
        Limit::Chars(n) | Limit::Utf16(n) | Limit::Bytes(n) => n,
    };
    let check_sizes = |chunks: &[String]| {
        for chunk in chunks {
            assert!(
                limit.measure(chunk) <= max,
                "a chunk over {limit:?}: {} {chunk:?}",
                limit.measure(chunk)
            );
            assert!(!chunk.trim().is_empty(), "an empty chunk: {chunk:?}");
        }
    };
    // The sentinels are one character (three bytes), so a limit that fits the real markup
    // may not fit them and the other way round: only successes are compared.
    if let Ok(chunks) = chunk(&marked, limit) {
        check_sizes(&chunks);
        let mut joined = String::new();
        for chunk in &chunks {
            let mut open = 0usize;
            for c in chunk.chars() {
                if c == OPEN_MARK {
                    open += 1;
                } else if c == CLOSE_MARK {
                    assert!(open > 0, "a chunk closes a span it did not open: {chunk:?}");
                    open -= 1;
                } else {
                    joined.push(c);
                }
            }
            assert_eq!(open, 0, "a chunk leaves a span open: {chunk:?}");
        }
        assert_eq!(
            without_whitespace(&joined),
            without_whitespace(&text),
            "text lost or changed by chunking"
        );
    }
    match chunk(&tokens, limit) {
        Ok(chunks) => {
            check_sizes(&chunks);
            chunks
        }
        Err(_) => Vec::new(),
    }
}

/// The whole rendering in one piece (what the chunks together must say).
pub fn rendered(renderer: &dyn Renderer, markdown: &str) -> String {
    concat(&renderer.render(&Document::parse(markdown)))
}

/// The tags Telegram's HTML parse mode takes, of those the renderer writes.
const TELEGRAM_TAGS: [&str; 8] = ["b", "i", "s", "u", "code", "pre", "a", "blockquote"];

/// Checks `html` is Telegram HTML on its own: only known tags, balanced and properly nested,
/// attributes only where Telegram takes them, `&` only in the entities Telegram knows, no
/// stray `<` or `>`, and no nesting Telegram refuses. Returns the visible text (tags removed,
/// entities decoded).
pub fn check_telegram_html(html: &str) -> String {
    assert!(
        !antler_testkit::telegram::refused_nesting(html),
        "a nesting Telegram refuses: {html:?}"
    );
    let mut open: Vec<&str> = Vec::new();
    let mut visible = String::new();
    let mut rest = html;
    while let Some(c) = rest.chars().next() {
        match c {
            '<' => {
                let end = rest
                    .find('>')
                    .unwrap_or_else(|| panic!("an unclosed tag: {html:?}"));
                let tag = &rest[1..end];
                rest = &rest[end + 1..];
                if let Some(name) = tag.strip_prefix('/') {
                    assert_eq!(open.pop(), Some(name), "a misnested close: {html:?}");
                    continue;
                }
                let (name, attributes) = tag.split_once(' ').unwrap_or((tag, ""));
                assert!(TELEGRAM_TAGS.contains(&name), "tag {name:?} in {html:?}");
                match name {
                    "a" => assert!(attributes.starts_with("href=\""), "{html:?}"),
                    "code" => assert!(
                        attributes.is_empty() || attributes.starts_with("class=\"language-"),
                        "{html:?}"
                    ),
                    _ => assert!(attributes.is_empty(), "{html:?}"),
                }
                if !attributes.is_empty() {
                    // One quoted value, closing the tag, with nothing in it that ends it early.
                    let first = attributes.find('"').unwrap_or(attributes.len());
                    assert!(
                        first + 1 < attributes.len() && attributes.ends_with('"'),
                        "an attribute unclosed: {html:?}"
                    );
                    let inner = &attributes[first + 1..attributes.len() - 1];
                    assert!(!inner.contains(['"', '<', '>']), "{html:?}");
                }
                open.push(name);
            }
            '>' => panic!("a stray '>' in {html:?}"),
            '&' => {
                let (entity, decoded) = [
                    ("&amp;", '&'),
                    ("&lt;", '<'),
                    ("&gt;", '>'),
                    ("&quot;", '"'),
                ]
                .into_iter()
                .find(|(entity, _)| rest.starts_with(entity))
                .unwrap_or_else(|| panic!("a bare '&' in {html:?}"));
                visible.push(decoded);
                rest = &rest[entity.len()..];
            }
            c => {
                visible.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    assert!(open.is_empty(), "tags left open: {open:?} in {html:?}");
    visible
}

/// Asserts the chunks say what the whole rendering says, modulo whitespace, with `visible`
/// giving a piece of markup's visible text.
pub fn assert_no_text_lost(chunks: &[String], whole: &str, visible: impl Fn(&str) -> String) {
    let joined: String = chunks.iter().map(|chunk| visible(chunk)).collect();
    assert_eq!(
        without_whitespace(&joined),
        without_whitespace(&visible(whole)),
        "text lost or changed by chunking"
    );
}

/// A parse result the gateway can use: every event belongs to `channel` and names a
/// conversation of that channel.
pub fn check_parsed(channel: &str, parsed: &Result<Parsed, antler_channel::ChannelError>) {
    if let Ok(Parsed::Events(events) | Parsed::EventsWithReply { events, .. }) = parsed {
        for event in events {
            assert_eq!(event.channel, channel, "{event:?}");
            assert_eq!(event.conversation.channel(), channel, "{event:?}");
        }
    }
}
