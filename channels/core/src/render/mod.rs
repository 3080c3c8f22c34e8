//! Rendering an answer for a platform: Markdown in, chunks of platform markup out.
//!
//! The model's Markdown is parsed once into a [`Document`]. A [`Renderer`] turns the document
//! into a stream of [`Token`]s: text already escaped for the platform, with every span of
//! formatting as an [`Token::Open`] (its opening and closing markup) ended by a
//! [`Token::Close`], and every escape sequence as an unsplittable [`Token::Atom`]. [`chunk`]
//! splits that stream at a platform's [`Limit`], closing the spans open at each boundary and
//! reopening them in the next chunk, so every chunk is valid markup on its own.
//!
//! ```
//! use antler_channel::render::{chunk, Document, Limit, Renderer, TelegramHtml};
//!
//! let doc = Document::parse("**hi** <there>");
//! let chunks = chunk(&TelegramHtml.render(&doc), Limit::Utf16(4096)).unwrap();
//! assert_eq!(chunks, ["<b>hi</b> &lt;there&gt;"]);
//! ```
//!
//! # Adding a platform
//!
//! A new renderer implements [`Renderer`] and needs nothing else from the chunker:
//!
//! - Slack mrkdwn ([`SlackMrkdwn`]): bold is `Open { open: "*", close: "*", .. }`, a code
//!   block `Open { open: "```\n", close: "\n```", verbatim: true }`, a link
//!   `Open { open: "<url|", close: ">", .. }`; `&`, `<` and `>` in text are emitted as
//!   `Atom("&amp;")` and so on.
//! - Discord Markdown ([`DiscordMarkdown`]): bold is `Open { open: "**", close: "**", .. }`, a
//!   code block `Open { open: "```rust\n", close: "\n```", verbatim: true }`; a backslash
//!   escape such as `\*` is an `Atom`, so it is never split from the character it escapes.
//! - Feishu card Markdown ([`FeishuMarkdown`]): bold is `Open { open: "**", close: "**", .. }`,
//!   a link `Open { open: "[", close: "](url)", .. }`, and characters that would format are
//!   HTML entities (`Atom("&#42;")`), which card Markdown decodes.
//!
//! A span is `verbatim` when its text is written as it is (code in Markdown): the chunker
//! keeps its markup whatever it costs, where it may drop a long link's rather than fail.
//!
//! What starts a line before its content, a quote's `> ` or the spaces under a list marker, is
//! a [`Token::Prefix`]: a chunk that starts on such a line writes it before the spans it
//! reopens, so `> _text_` stays a quote line.
//!
//! The chunker counts the markup itself against the limit, prefers paragraph breaks
//! (`"\n\n"`), then line breaks, then spaces inside [`Token::Text`], and never splits a
//! [`Token::Atom`] or a character.

mod chunk;
mod discord_markdown;
mod document;
mod feishu_markdown;
mod markdown;
mod slack_mrkdwn;
mod telegram_html;
mod writer;

pub use chunk::{ChunkError, Limit, Token, chunk, concat};
pub use discord_markdown::DiscordMarkdown;
pub use document::{Block, Document, Inline};
pub use feishu_markdown::FeishuMarkdown;
pub use slack_mrkdwn::SlackMrkdwn;
pub use telegram_html::{PlainText, TelegramHtml};

/// Markdown as a platform's messages: parsed, rendered with `renderer` and chunked at `limit`.
/// Blank Markdown gives no parts.
pub fn parts(
    markdown: &str,
    renderer: &dyn Renderer,
    limit: Limit,
) -> Result<Vec<String>, ChunkError> {
    chunk(&renderer.render(&Document::parse(markdown)), limit)
}

/// Turns a [`Document`] into platform markup as a token stream for [`chunk`] or [`concat`].
pub trait Renderer {
    /// Renders `doc`. The stream must be balanced: one [`Token::Close`] per [`Token::Open`].
    fn render(&self, doc: &Document) -> Vec<Token>;
}
