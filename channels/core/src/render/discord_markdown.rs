//! Discord Markdown: the markup of a message's `content`.

use super::Renderer;
use super::chunk::Token;
use super::document::Document;
use super::markdown::{Dialect, render};

/// The Markdown Discord shows in a message: `**bold**`, `*italic*`, `~~strike~~`,
/// `` `code` ``, fenced code blocks with their language, `#` to `###` headings, `- ` and `1. `
/// lists, `> ` quotes and `[text](url)` links; mostly the model's Markdown as it is.
///
/// Headings deeper than `###` become bold lines, a rule a line of `———`, a table aligned text
/// in a code block (Discord has no table markup). A link's text loses its formatting.
///
/// # Escaping
///
/// Discord reads a backslash before any punctuation as that character, so every character of
/// user text that could format is written with one, each escape an atom the chunker never
/// splits: `\` `*` `_` `~` `` ` `` `|` (spoilers) `[` `]` `<` `>` (mentions, quotes), and `#`,
/// `-`, `+` at the start of a line (headings, lists). Mentions cannot ping anyway (the channel
/// sends `allowed_mentions` empty). Code is written verbatim, its fence longer than any run of
/// backticks inside it.
#[derive(Debug, Clone, Copy, Default)]
pub struct DiscordMarkdown;

const DISCORD: Dialect = Dialect {
    escape,
    max_heading: 3,
};

impl Renderer for DiscordMarkdown {
    fn render(&self, doc: &Document) -> Vec<Token> {
        render(doc, &DISCORD)
    }
}

/// The backslash escape of a character Discord could read as markup.
fn escape(c: char, at_line_start: bool) -> Option<&'static str> {
    Some(match c {
        '\\' => "\\\\",
        '*' => "\\*",
        '_' => "\\_",
        '~' => "\\~",
        '`' => "\\`",
        '|' => "\\|",
        '[' => "\\[",
        ']' => "\\]",
        '<' => "\\<",
        '>' => "\\>",
        '#' if at_line_start => "\\#",
        '-' if at_line_start => "\\-",
        '+' if at_line_start => "\\+",
        _ => return None,
    })
}
