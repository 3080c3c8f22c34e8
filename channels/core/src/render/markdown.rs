//! The Markdown dialects of chat platforms (Discord messages, Feishu cards): one walker over
//! the [`Document`], with what differs between them, escaping and headings, in a [`Dialect`].
//!
//! What they share: `**bold**`, `*italic*`, `~~strike~~`, `` `code` `` (a longer backtick
//! string, padded, when the code holds backticks), fenced code blocks with their language, at
//! the margin and with a fence longer than any backtick run inside, `- ` and `1. ` lists
//! indented by nesting, `> ` quotes on every line, `[text](url)` links (the text plain, the
//! target percent-encoded where it could end the link), a rule as `———` and a table as aligned
//! text in a code block. A style is never nested in itself (`**a **b** c**` would end early).

use super::chunk::Token;
use super::document::{Block, Document, Inline};
use super::telegram_html::{plain, table_text};
use super::writer::TokenWriter;

/// What a dialect does its own way.
#[derive(Debug)]
pub(super) struct Dialect {
    /// The escape of a character of user text that the platform could read as markup, if it
    /// is one; the flag says whether the character starts a line (after its indentation).
    /// Each escape becomes an atom the chunker never splits.
    pub(super) escape: fn(char, bool) -> Option<&'static str>,
    /// Headings up to this level are written as `#` markup; deeper ones (all, when 0) become
    /// bold lines.
    pub(super) max_heading: u8,
}

/// `doc` in `dialect`.
pub(super) fn render(doc: &Document, dialect: &Dialect) -> Vec<Token> {
    let mut walker = Walker {
        dialect,
        out: Vec::new(),
        indent: String::new(),
        open: Vec::new(),
    };
    walker.blocks(&doc.blocks, "\n\n");
    walker.out
}

/// The kinds of span that may not nest in themselves: `**a **b** c**` would end the bold early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    Bold,
    Italic,
    Strike,
}

struct Walker<'a> {
    dialect: &'a Dialect,
    out: Vec<Token>,
    /// What starts every continuation line: spaces under list markers, `> ` in quotes.
    indent: String,
    /// The styles open around the current position.
    open: Vec<Style>,
}

impl TokenWriter for Walker<'_> {
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

impl Walker<'_> {
    /// User text, escaped; line breaks continue the current indentation (a quote's `> `).
    fn text(&mut self, text: &str) {
        for (i, line) in text.split('\n').enumerate() {
            if i > 0 {
                self.newline();
            }
            let mut at_start = self.at_line_start();
            let mut rest = line;
            loop {
                let escape = self.dialect.escape;
                let found = rest
                    .char_indices()
                    .find(|&(at, c)| escape(c, at_start && at == 0).is_some());
                let Some((at, c)) = found else { break };
                self.raw(&rest[..at]);
                if let Some(escaped) = escape(c, at_start && at == 0) {
                    self.out.push(Token::Atom(escaped.to_owned()));
                }
                at_start = false;
                rest = &rest[at + c.len_utf8()..];
            }
            self.raw(rest);
        }
    }

    fn write_block(&mut self, block: &Block) {
        match block {
            Block::Paragraph(content) => self.inlines(content),
            Block::Heading { level, content } if *level <= self.dialect.max_heading => {
                self.raw(&format!("{} ", "#".repeat(usize::from(*level))));
                self.inlines(content);
            }
            Block::Heading { content, .. } => self.styled(Style::Bold, content),
            Block::Code { language, text } => self.code_block(language.as_deref(), text),
            Block::Quote(blocks) => self.prefixed_quote(blocks),
            Block::List { start, items } => self.list(*start, items, "- "),
            Block::Rule => self.raw("———"),
            Block::Table(rows) => self.table(rows),
        }
    }

    /// Code verbatim, at the margin: a list's or quote's indentation would become part of it.
    /// The fence stays the same in every chunk, so it keeps its language when reopened.
    fn code_block(&mut self, language: Option<&str>, text: &str) {
        self.start_at_margin();
        let text = short_backtick_runs(text);
        let fence = "`".repeat(longest_backtick_run(&text).max(2) + 1);
        let language = language.filter(|l| is_language_safe(l)).unwrap_or("");
        self.open_code(&format!("{fence}{language}\n"), &format!("\n{fence}"));
        self.raw(&text);
        self.close();
    }

    /// Moves to the margin: drops the current line's indentation while nothing else is on it,
    /// else (a list item's marker) starts a new line. A fence after a quote's `> ` or a
    /// marker opens no code block, so its backticks would show as text.
    fn start_at_margin(&mut self) {
        if !self.at_line_start() {
            self.raw("\n");
            return;
        }
        if let Some(Token::Prefix(_)) = self.out.last() {
            self.out.pop();
        }
    }

    /// Tables become aligned text in a code block: neither dialect has table markup.
    fn table(&mut self, rows: &[Vec<Vec<Inline>>]) {
        let text = table_text(rows);
        self.code_block(None, &text);
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
            Style::Bold => "**",
            Style::Italic => "*",
            Style::Strike => "~~",
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
                // CommonMark's rule: a longer backtick string, padded with spaces, holds
                // backticks of its own.
                let code = short_backtick_runs(code);
                let run = longest_backtick_run(&code);
                if run == 0 {
                    self.open_code("`", "`");
                } else {
                    let ticks = "`".repeat(run + 1);
                    self.open_code(&format!("{ticks} "), &format!(" {ticks}"));
                }
                self.raw(&code.replace('\n', " "));
                self.close();
            }
            Inline::Link { url, content } => self.link(url, content),
            Inline::Bold(content) => self.styled(Style::Bold, content),
            Inline::Italic(content) => self.styled(Style::Italic, content),
            Inline::Strike(content) => self.styled(Style::Strike, content),
        }
    }

    fn link(&mut self, url: &str, content: &[Inline]) {
        let mut label = plain(content);
        if label.trim().is_empty() {
            label = url.strip_prefix("mailto:").unwrap_or(url).to_owned();
        }
        self.open("[", &format!("]({})", link_target(url)));
        self.text(&label);
        self.close();
    }
}

/// The longest run of backticks code keeps: the fence around it is one longer, and a fence as
/// long as the code's own run would let a message's limit be too small for the fence alone.
const MAX_BACKTICK_RUN: usize = 15;

/// `code` with a zero-width space after every [`MAX_BACKTICK_RUN`]th backtick of a run, so
/// the fence or delimiter around it stays short. Code looks the same.
fn short_backtick_runs(code: &str) -> std::borrow::Cow<'_, str> {
    if longest_backtick_run(code) <= MAX_BACKTICK_RUN {
        return std::borrow::Cow::Borrowed(code);
    }
    let mut out = String::with_capacity(code.len() + code.len() / MAX_BACKTICK_RUN * 3);
    let mut run = 0;
    for c in code.chars() {
        if c == '`' {
            if run == MAX_BACKTICK_RUN {
                out.push('\u{200B}');
                run = 0;
            }
            run += 1;
        } else {
            run = 0;
        }
        out.push(c);
    }
    std::borrow::Cow::Owned(out)
}

/// The longest run of backticks in `text`.
fn longest_backtick_run(text: &str) -> usize {
    text.split(|c| c != '`').map(str::len).max().unwrap_or(0)
}

/// A language name goes after the fence only if it is a plain word.
fn is_language_safe(language: &str) -> bool {
    language
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '_' | '.' | '#'))
}

/// A URL as it may stand between `(` and `)`: the characters that would end the link or be
/// read as markup percent-encoded, which keeps the address the same.
fn link_target(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    for c in url.chars() {
        match c {
            '(' => out.push_str("%28"),
            ')' => out.push_str("%29"),
            ' ' => out.push_str("%20"),
            '<' => out.push_str("%3C"),
            '>' => out.push_str("%3E"),
            '[' => out.push_str("%5B"),
            ']' => out.push_str("%5D"),
            c => out.push(c),
        }
    }
    out
}
