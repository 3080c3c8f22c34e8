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

    /// Output that needs no escaping (markers, newlines, indentation, code), merged into the
    /// text run it follows.
    fn raw(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        let tokens = self.tokens();
        if let Some(Token::Text(last)) = tokens.last_mut() {
            last.push_str(text);
        } else {
            tokens.push(Token::Text(text.to_owned()));
        }
    }

    /// A line break, then the current indentation.
    fn newline(&mut self) {
        self.raw("\n");
        let indent = std::mem::take(self.indent());
        self.raw(&indent);
        *self.indent() = indent;
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
