//! Slack mrkdwn: the markup of a `chat.postMessage` `text`.

use super::Renderer;
use super::chunk::Token;
use super::document::{Block, Document, Inline};
use super::telegram_html::{plain, table_text};
use super::writer::TokenWriter;

/// Slack's mrkdwn: `*bold*`, `_italic_`, `~strike~`, `` `code` ``, ```` ``` ```` code blocks
/// (their language dropped: Slack ignores it) and `<url|text>` links, with only `&`, `<` and
/// `>` escaped in text.
///
/// Headings become bold lines, lists `• ` / `1. ` lines indented by nesting, quotes `> ` on
/// every line, a rule a line of `———`, and a table aligned text in a code block. A link's text
/// loses its formatting (Slack shows a label as it is), and a link whose text is its URL is
/// written `<url>`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SlackMrkdwn;

impl Renderer for SlackMrkdwn {
    fn render(&self, doc: &Document) -> Vec<Token> {
        let mut walker = Walker {
            out: Vec::new(),
            indent: String::new(),
            open: Vec::new(),
        };
        walker.blocks(&doc.blocks, "\n\n");
        walker.out
    }
}

/// The kinds of span that may not nest in themselves: `*a *b* c*` would end the bold early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    Bold,
    Italic,
    Strike,
}

struct Walker {
    out: Vec<Token>,
    /// What starts every continuation line: spaces under list markers, `> ` in quotes.
    indent: String,
    /// The styles open around the current position.
    open: Vec<Style>,
}

impl TokenWriter for Walker {
    fn tokens(&mut self) -> &mut Vec<Token> {
        &mut self.out
    }

    fn indent(&mut self) -> &mut String {
        &mut self.indent
    }

    fn block(&mut self, block: &Block) {
        self.write_block(block);
    }
}

impl Walker {
    /// User text: `&`, `<` and `>` as entities, each an atom the chunker never splits; line
    /// breaks continue the current indentation (a quote's `> `).
    fn text(&mut self, text: &str) {
        for (i, line) in text.split('\n').enumerate() {
            if i > 0 {
                self.newline();
            }
            self.escaped(line);
        }
    }

    /// Text escaped as [`Walker::text`] does, its line breaks kept as they are.
    fn escaped(&mut self, text: &str) {
        let mut rest = text;
        while let Some(at) = rest.find(['&', '<', '>']) {
            self.raw(&rest[..at]);
            let entity = match rest.as_bytes()[at] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                _ => "&gt;",
            };
            self.out.push(Token::Atom(entity.to_owned()));
            rest = &rest[at + 1..];
        }
        self.raw(rest);
    }

    fn write_block(&mut self, block: &Block) {
        match block {
            Block::Paragraph(content) => self.inlines(content),
            Block::Heading { content, .. } => self.styled(Style::Bold, content),
            Block::Code { text, .. } => self.code_block(text),
            Block::Quote(blocks) => self.prefixed_quote(blocks),
            Block::List { start, items } => self.list(*start, items, "• "),
            Block::Rule => self.raw("———"),
            Block::Table(rows) => self.table(rows),
        }
    }

    /// Code verbatim: a list's or quote's indentation would become part of the code, so its
    /// lines start at the margin.
    fn code_block(&mut self, text: &str) {
        self.open_code("```\n", "\n```");
        self.escaped(text);
        self.close();
    }

    /// Tables become aligned text in a code block: Slack has no table markup.
    fn table(&mut self, rows: &[Vec<Vec<Inline>>]) {
        let text = table_text(rows);
        self.code_block(&text);
    }

    fn inlines(&mut self, content: &[Inline]) {
        for inline in content {
            self.inline(inline);
        }
    }

    /// `content` in the style's markup, unless that style is already open around it.
    fn styled(&mut self, style: Style, content: &[Inline]) {
        if self.open.contains(&style) {
            return self.inlines(content);
        }
        let mark = match style {
            Style::Bold => "*",
            Style::Italic => "_",
            Style::Strike => "~",
        };
        self.open(mark, mark);
        self.open.push(style);
        self.inlines(content);
        self.open.pop();
        self.close();
    }

    fn inline(&mut self, inline: &Inline) {
        match inline {
            Inline::Text(text) => self.text(text),
            Inline::LineBreak => self.newline(),
            Inline::Code(code) => {
                self.open_code("`", "`");
                self.text(code);
                self.close();
            }
            Inline::Link { url, content } => self.link(url, content),
            Inline::Bold(content) => self.styled(Style::Bold, content),
            Inline::Italic(content) => self.styled(Style::Italic, content),
            Inline::Strike(content) => self.styled(Style::Strike, content),
        }
    }

    fn link(&mut self, url: &str, content: &[Inline]) {
        let target = link_target(url);
        let label = plain(content);
        if label == url || Some(label.as_str()) == url.strip_prefix("mailto:") || label.is_empty() {
            // Slack shows the URL itself. The address holds no space or line break, so a chunk
            // ends inside it only when it is longer than a message (then each part is a link).
            self.open("<", ">");
            for (i, part) in target.split("&amp;").enumerate() {
                if i > 0 {
                    self.out.push(Token::Atom("&amp;".to_owned()));
                }
                self.raw(part);
            }
            self.close();
            return;
        }
        self.open(&format!("<{target}|"), ">");
        self.text(&label);
        self.close();
    }
}

/// A URL as it may stand between `<` and `|`: `&` as Slack's entity, and the characters that
/// would end the link (`|`, `<`, `>`) or give a chunk a place to end inside it (whitespace)
/// percent-encoded, which keeps the address the same.
fn link_target(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    for c in url.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '|' => out.push_str("%7C"),
            '<' => out.push_str("%3C"),
            '>' => out.push_str("%3E"),
            ' ' => out.push_str("%20"),
            '\t' => out.push_str("%09"),
            '\n' => out.push_str("%0A"),
            '\r' => out.push_str("%0D"),
            c => out.push(c),
        }
    }
    out
}
