//! Telegram HTML and plain text: the two renderers that share one walk over the document.

use super::Renderer;
use super::chunk::Token;
use super::document::{Block, Document, Inline};
use super::writer::TokenWriter;

/// Telegram's `parse_mode=HTML`: `<b>`, `<i>`, `<s>`, `<code>`, `<pre>`, `<a href>` and
/// `<blockquote>`, with only `&`, `<` and `>` escaped in text (and `"` in links).
///
/// Headings become bold lines, lists become `• ` / `1. ` lines indented by nesting, a rule a
/// line of `———`, and a table aligned text in `<pre>`.
///
/// Never the nestings the Bot API refuses (Formatting options: bold, italic and strikethrough
/// "can contain and can be part of any other entities, except pre and code"; "blockquote [...]
/// entities can't be nested"; "All other entities can't contain each other"): inline code
/// inside bold, italic, strikethrough, a heading or a link is its escaped text without
/// `<code>`, and a quote inside a quote continues the outer `<blockquote>`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TelegramHtml;

/// Text without markup: the re-send when a platform rejects the markup, and the rendering for
/// platforms without any. Links become `text (url)`, quotes `> ` lines.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlainText;

impl Renderer for TelegramHtml {
    fn render(&self, doc: &Document) -> Vec<Token> {
        walk(doc, true)
    }
}

impl Renderer for PlainText {
    fn render(&self, doc: &Document) -> Vec<Token> {
        walk(doc, false)
    }
}

fn walk(doc: &Document, html: bool) -> Vec<Token> {
    let mut walker = Walker {
        html,
        out: Vec::new(),
        indent: String::new(),
        quoted: false,
        formatted: 0,
    };
    walker.blocks(&doc.blocks, "\n\n");
    walker.out
}

struct Walker {
    html: bool,
    out: Vec<Token>,
    /// What starts every continuation line: spaces under list markers, `> ` in plain quotes.
    indent: String,
    /// Inside a `<blockquote>`: Telegram refuses another one in it.
    quoted: bool,
    /// How many `<b>`, `<i>`, `<s>` or `<a>` are open: Telegram refuses `<code>` in any.
    formatted: usize,
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
    /// Opens a tag; [`PlainText`] has none.
    fn open_tag(&mut self, open: String, close: &str) {
        if self.html {
            // Code's text is escaped: without its tags it reads as text, never as markup.
            self.out.push(Token::Open {
                open,
                close: close.to_owned(),
                verbatim: false,
            });
        }
    }

    /// Closes the innermost tag.
    fn close_tag(&mut self) {
        if self.html {
            self.out.push(Token::Close);
        }
    }

    /// User text: escaped for HTML, with each entity an atom the chunker never splits.
    fn text(&mut self, text: &str) {
        if !self.html {
            return self.raw(text);
        }
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
            Block::Heading { content, .. } => {
                self.open_tag("<b>".to_owned(), "</b>");
                self.formatted += 1;
                self.inlines(content);
                self.formatted -= 1;
                self.close_tag();
            }
            Block::Code { language, text } => {
                match language.as_deref().filter(|l| is_class_safe(l)) {
                    Some(language) => self.open_tag(
                        format!("<pre><code class=\"language-{language}\">"),
                        "</code></pre>",
                    ),
                    None => self.open_tag("<pre>".to_owned(), "</pre>"),
                }
                self.text(text);
                self.close_tag();
            }
            Block::Quote(blocks) => {
                if self.html && self.quoted {
                    // Already in a <blockquote>; its text continues the outer one.
                    self.blocks(blocks, "\n");
                } else if self.html {
                    self.open_tag("<blockquote>".to_owned(), "</blockquote>");
                    self.quoted = true;
                    self.blocks(blocks, "\n");
                    self.quoted = false;
                    self.close_tag();
                } else {
                    self.prefixed_quote(blocks);
                }
            }
            Block::List { start, items } => self.list(*start, items, "• "),
            Block::Rule => self.raw("———"),
            Block::Table(rows) => self.table(rows),
        }
    }

    /// Tables become aligned plain text: chat clients have no table markup.
    fn table(&mut self, rows: &[Vec<Vec<Inline>>]) {
        let text = table_text(rows);
        self.open_tag("<pre>".to_owned(), "</pre>");
        self.text(&text);
        self.close_tag();
    }

    fn inlines(&mut self, content: &[Inline]) {
        for inline in content {
            self.inline(inline);
        }
    }

    fn inline(&mut self, inline: &Inline) {
        let (open, close, content) = match inline {
            Inline::Text(text) => return self.text(text),
            Inline::LineBreak => return self.newline(),
            Inline::Code(code) if self.formatted > 0 => return self.text(code),
            Inline::Code(code) => {
                self.open_tag("<code>".to_owned(), "</code>");
                self.text(code);
                return self.close_tag();
            }
            Inline::Link { url, content } => {
                if !self.html {
                    self.inlines(content);
                    let label = plain(content);
                    if label != *url && Some(label.as_str()) != url.strip_prefix("mailto:") {
                        self.raw(&format!(" ({url})"));
                    }
                    return;
                }
                (
                    format!("<a href=\"{}\">", escape_attr(url)),
                    "</a>",
                    content,
                )
            }
            Inline::Bold(content) => ("<b>".to_owned(), "</b>", content),
            Inline::Italic(content) => ("<i>".to_owned(), "</i>", content),
            Inline::Strike(content) => ("<s>".to_owned(), "</s>", content),
        };
        self.open_tag(open, close);
        self.formatted += 1;
        self.inlines(content);
        self.formatted -= 1;
        self.close_tag();
    }
}

/// A language name is put in a class attribute only if it cannot break out of it.
fn is_class_safe(language: &str) -> bool {
    language
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '_' | '.' | '#'))
}

fn escape_attr(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A table as aligned plain text (cells stripped of formatting, a rule under the header
/// row), for renderers of platforms without table markup.
pub(super) fn table_text(rows: &[Vec<Vec<Inline>>]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| plain(cell)).collect())
        .collect();
    let columns = cells.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            cells
                .iter()
                .filter_map(|row| row.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut lines = Vec::new();
    for (r, row) in cells.iter().enumerate() {
        let line: Vec<String> = (0..columns)
            .map(|c| {
                let cell = row.get(c).map_or("", String::as_str);
                format!("{cell:<width$}", width = widths[c])
            })
            .collect();
        lines.push(line.join(" | ").trim_end().to_owned());
        if r == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            lines.push(rule.join("-+-"));
        }
    }
    lines.join("\n")
}

/// The text of inline content with all formatting dropped, on one line: a label or a table
/// cell holds no line break (one inside a quote would write the quote's `> ` into it).
pub(super) fn plain(content: &[Inline]) -> String {
    let mut out = String::new();
    for inline in content {
        match inline {
            Inline::Text(text) | Inline::Code(text) => {
                out.extend(text.chars().map(|c| if c == '\n' { ' ' } else { c }));
            }
            Inline::LineBreak => out.push(' '),
            Inline::Bold(inner) | Inline::Italic(inner) | Inline::Strike(inner) => {
                out.push_str(&plain(inner));
            }
            Inline::Link { content, .. } => out.push_str(&plain(content)),
        }
    }
    out
}
