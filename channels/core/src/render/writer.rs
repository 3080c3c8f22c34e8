//! What every renderer's walker shares: text merged into runs, line breaks that carry the
//! current indentation (list markers' spaces, a quote's `> `), blank lines between blocks.

use super::chunk::Token;
use super::document::Block;

/// A walker writing [`Token`]s: it gives its output and indentation and renders one block;
/// the rest is shared.
pub(super) trait TokenWriter {
    /// The tokens written so far.
    fn tokens(&mut self) -> &mut Vec<Token>;

    /// What starts every continuation line.
    fn indent(&mut self) -> &mut String;

    /// Renders one block.
    fn block(&mut self, block: &Block);

    /// Opens a span; where its markup leaves no room in a message, the chunker writes the
    /// span without it.
    fn open(&mut self, open: &str, close: &str) {
        push_open(self.tokens(), open, close, false);
    }

    /// Opens a code span: its text is written as it is, so it would format without the
    /// markup, which the chunker therefore always keeps.
    fn open_code(&mut self, open: &str, close: &str) {
        push_open(self.tokens(), open, close, true);
    }

    /// Ends the innermost open span.
    fn close(&mut self) {
        self.tokens().push(Token::Close);
    }

    /// Output that needs no escaping (markers, newlines, indentation, code), merged into the
    /// text run it follows.
    fn raw(&mut self, text: &str) {
        append(self.tokens(), text, false);
    }

    /// What starts a line before its content (indentation, a quote's `> `), merged into the
    /// prefix it follows.
    fn prefix(&mut self, text: &str) {
        append(self.tokens(), text, true);
    }

    /// A line break, then the current indentation.
    fn newline(&mut self) {
        self.raw("\n");
        let indent = std::mem::take(self.indent());
        self.prefix(&indent);
        *self.indent() = indent;
    }

    /// Whether the next output starts a line (after its indentation): nothing written yet,
    /// or only a newline and the line's prefix since the last text.
    fn at_line_start(&mut self) -> bool {
        match self.tokens().last() {
            None | Some(Token::Prefix(_)) => true,
            Some(Token::Text(last)) => last.ends_with('\n'),
            Some(_) => false,
        }
    }

    /// A quote as `> ` at the start of each of its lines. A quote that opens a list item
    /// starts on the next line: a `> ` after the item's marker is no quote, just text.
    fn prefixed_quote(&mut self, blocks: &[Block]) {
        if !self.at_line_start() {
            self.newline();
        }
        self.prefix("> ");
        self.indent().push_str("> ");
        self.blocks(blocks, "\n");
        let indent = self.indent();
        indent.truncate(indent.len().saturating_sub(2));
    }

    /// A list: each item after its marker (`1. `, counting from `start`, or `bullet`), its
    /// continuation lines indented under the marker.
    fn list(&mut self, start: Option<u64>, items: &[Vec<Block>], bullet: &str) {
        for (n, item) in items.iter().enumerate() {
            if n > 0 {
                self.newline();
            }
            let marker = match start {
                Some(first) => format!("{}. ", first.saturating_add(n as u64)),
                None => bullet.to_owned(),
            };
            self.raw(&marker);
            let saved = self.indent().len();
            self.indent().push_str(&" ".repeat(marker.chars().count()));
            self.blocks(item, "\n");
            self.indent().truncate(saved);
        }
    }

    /// `blocks`, `separator` (newlines) between them.
    fn blocks(&mut self, blocks: &[Block], separator: &str) {
        for (i, block) in blocks.iter().enumerate() {
            if i > 0 {
                // Blank lines carry no indentation; only the last newline does.
                for _ in 1..separator.len() {
                    self.raw("\n");
                }
                self.newline();
            }
            self.block(block);
        }
    }
}

/// Appends `text` to `tokens` as a [`Token::Prefix`] or else a [`Token::Text`], merged into
/// the last token when that is of the same kind.
fn append(tokens: &mut Vec<Token>, text: &str, prefix: bool) {
    if text.is_empty() {
        return;
    }
    match (tokens.last_mut(), prefix) {
        (Some(Token::Prefix(last)), true) | (Some(Token::Text(last)), false) => {
            last.push_str(text);
        }
        _ if prefix => tokens.push(Token::Prefix(text.to_owned())),
        _ => tokens.push(Token::Text(text.to_owned())),
    }
}

fn push_open(tokens: &mut Vec<Token>, open: &str, close: &str, verbatim: bool) {
    tokens.push(Token::Open {
        open: open.to_owned(),
        close: close.to_owned(),
        verbatim,
    });
}
