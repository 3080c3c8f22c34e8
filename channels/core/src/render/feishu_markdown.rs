//! Feishu (Lark) card Markdown: the markup of a message card's `markdown` element.

use super::Renderer;
use super::chunk::Token;
use super::document::Document;
use super::markdown::{Dialect, render};

/// The Markdown a Feishu card's `markdown` element shows: `**bold**`, `*italic*`,
/// `~~strike~~`, `` `code` ``, fenced code blocks with their language and `[text](url)` links.
///
/// Headings become bold lines, lists `- ` / `1. ` lines indented by nesting, quotes `> ` on every
/// line, a rule a line of `———`, and a table aligned text in a code block. A link's text loses
/// its formatting (a label is shown as it is).
///
/// # Escaping
///
/// Card Markdown decodes HTML entities, so every character of user text that it could read as
/// markup is written as one, each an atom the chunker never splits: `&` `<` `>` as `&amp;`
/// `&lt;` `&gt;` (a `<` would otherwise start one of the card's tags, `<at>`, `<font>`,
/// `<link>`), and `*` `_` `~` `` ` `` `[` `]` as the numeric entities `&#42;` `&#95;` `&#126;`
/// `&#96;` `&#91;` `&#93;`. They are escaped everywhere in text, not only where they would
/// format: whether `a*b*c` formats depends on the renderer's flanking rules, which Feishu does
/// not document. Code (inline and blocks) is written verbatim, as code is shown; its fence is
/// made longer than any run of backticks inside it so it cannot be closed early.
#[derive(Debug, Clone, Copy, Default)]
pub struct FeishuMarkdown;

const FEISHU: Dialect = Dialect {
    escape: entity,
    max_heading: 0,
};

impl Renderer for FeishuMarkdown {
    fn render(&self, doc: &Document) -> Vec<Token> {
        render(doc, &FEISHU)
    }
}

/// The entity for a character card Markdown could read as markup, if it is one (wherever it
/// stands).
fn entity(c: char, _at_line_start: bool) -> Option<&'static str> {
    Some(match c {
        '&' => "&amp;",
        '<' => "&lt;",
        '>' => "&gt;",
        '*' => "&#42;",
        '_' => "&#95;",
        '~' => "&#126;",
        '`' => "&#96;",
        '[' => "&#91;",
        ']' => "&#93;",
        _ => return None,
    })
}
