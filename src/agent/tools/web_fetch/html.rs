//! HTML to readable text, in linear time and within a time budget.
//!
//! The page goes through html5ever's tokenizer (the WHATWG tokenizer: character references,
//! comments, raw-text elements and malformed markup as browsers read them) and a small sink
//! that keeps the text: `script`, `style`, `noscript`, `template`, `svg`, `head`, `iframe`,
//! `noembed`, `noframes`, comments and doctypes are dropped, block elements start new lines,
//! table cells are separated by a space, runs of white space become one space and blank lines
//! are dropped.
//!
//! Why the tokenizer without a tree builder: tree construction scans the stack of open
//! elements for many tags, so deep nesting is quadratic (1 MiB of `<div>`, or of `<ul><li>`,
//! takes over a minute in html5ever's tree builder, which `scraper` and `html2text` use),
//! and reading text needs no tree. The tokenizer's one known super-linear case is a single
//! tag with many distinct attribute names (its duplicate check scans the earlier ones): the
//! page is fed in [`CHUNK_BYTES`] pieces and the conversion stops once [`Budget::time`] is
//! spent, keeping the text converted so far, so such a page costs the budget and no more.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use html5ever::tendril::StrTendril;
use html5ever::tokenizer::states::RawKind;
use html5ever::tokenizer::{
    BufferQueue, Tag, TagKind, Token, TokenSink, TokenSinkResult, Tokenizer, TokenizerOpts,
};
use html5ever::{LocalName, TokenizerResult};

/// The piece of the page handed to the tokenizer at once: the budget is checked between two.
const CHUNK_BYTES: usize = 4096;

/// What one conversion may spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Budget {
    /// Wall time on the converting thread (an upper bound of its CPU time).
    pub(crate) time: Duration,
    /// The most bytes of text kept, before white space is collapsed.
    pub(crate) max_text_bytes: usize,
}

/// Why a conversion stopped before the end of the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// [`Budget::time`] was spent.
    Time,
    /// [`Budget::max_text_bytes`] of text were kept.
    Size,
}

/// The text of a page, and whether it stops early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Converted {
    /// The readable text.
    pub(crate) text: String,
    /// Why the text stops before the end of the page, if it does.
    pub(crate) cut: Option<Cut>,
}

/// Readable text from `html`, within `budget`. Blocks its thread for up to about
/// [`Budget::time`]: call it off the async workers.
pub(crate) fn html_to_text(html: &str, budget: Budget) -> Converted {
    let started = Instant::now();
    let tokenizer = Tokenizer::new(
        TextSink::new(budget.max_text_bytes),
        TokenizerOpts::default(),
    );
    let queue = BufferQueue::default();
    let mut cut = None;
    let mut start = 0;
    while start < html.len() {
        if tokenizer.sink.is_full() {
            cut = Some(Cut::Size);
            break;
        }
        if started.elapsed() >= budget.time {
            cut = Some(Cut::Time);
            break;
        }
        let mut end = (start + CHUNK_BYTES).min(html.len());
        while !html.is_char_boundary(end) {
            end -= 1;
        }
        queue.push_back(StrTendril::from_slice(&html[start..end]));
        // The sink never asks to run a script, so one call takes the whole piece.
        while let TokenizerResult::Script(()) = tokenizer.feed(&queue) {}
        start = end;
    }
    if cut.is_none() {
        tokenizer.end();
        if tokenizer.sink.is_full() {
            cut = Some(Cut::Size);
        }
    }
    Converted {
        text: collapse_whitespace(&tokenizer.sink.state.borrow().text),
        cut,
    }
}

/// How an element affects the text around it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Its content is dropped.
    Skipped,
    /// It starts and ends a line.
    Block,
    /// A space before and after it.
    Cell,
    /// Nothing.
    Inline,
}

fn layout(name: &str) -> Layout {
    match name {
        "script" | "style" | "noscript" | "template" | "svg" | "head" | "iframe" | "noembed"
        | "noframes" => Layout::Skipped,
        "p" | "br" | "div" | "li" | "ul" | "ol" | "dl" | "dt" | "dd" | "tr" | "table"
        | "caption" | "h1" | "h2" | "h3" | "h4" | "h5" | "h6" | "section" | "article"
        | "header" | "footer" | "nav" | "main" | "aside" | "pre" | "blockquote" | "hr"
        | "title" | "figure" | "figcaption" | "form" | "fieldset" | "legend" | "details"
        | "summary" | "address" | "textarea" => Layout::Block,
        "td" | "th" => Layout::Cell,
        _ => Layout::Inline,
    }
}

/// The tokenizer state a start tag switches to, as the tree builder would switch it (outside
/// SVG and MathML): the content of these elements is text up to their end tag.
fn content_state(name: &str) -> TokenSinkResult<()> {
    match name {
        "script" => TokenSinkResult::RawData(RawKind::ScriptData),
        "style" | "xmp" | "iframe" | "noembed" | "noframes" | "noscript" => {
            TokenSinkResult::RawData(RawKind::Rawtext)
        }
        "title" | "textarea" => TokenSinkResult::RawData(RawKind::Rcdata),
        "plaintext" => TokenSinkResult::Plaintext,
        _ => TokenSinkResult::Continue,
    }
}

/// Keeps the text of the tokens it is given.
#[derive(Debug)]
struct TextSink {
    state: RefCell<TextState>,
}

#[derive(Debug)]
struct TextState {
    text: String,
    max_bytes: usize,
    full: bool,
    /// The skipped element being read, and how many of its kind are open inside it.
    skipping: Option<(LocalName, usize)>,
}

impl TextSink {
    fn new(max_bytes: usize) -> Self {
        Self {
            state: RefCell::new(TextState {
                text: String::new(),
                max_bytes,
                full: false,
                skipping: None,
            }),
        }
    }

    fn is_full(&self) -> bool {
        self.state.borrow().full
    }
}

impl TextState {
    /// Appends `text`, up to `max_bytes` in all.
    fn push(&mut self, text: &str) {
        if self.full {
            return;
        }
        let room = self.max_bytes.saturating_sub(self.text.len());
        if text.len() <= room {
            self.text.push_str(text);
            return;
        }
        let mut end = room;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.text.push_str(&text[..end]);
        self.full = true;
    }

    fn tag(&mut self, tag: &Tag) -> TokenSinkResult<()> {
        let name: &str = &tag.name;
        let start = tag.kind == TagKind::StartTag;
        if let Some((skipped, open)) = &mut self.skipping {
            let foreign = &**skipped == "svg";
            if tag.name == *skipped {
                if !start {
                    *open = open.saturating_sub(1);
                } else if !(foreign && tag.self_closing) {
                    *open += 1;
                }
            } else if start && &**skipped == "head" && name == "body" {
                *open = 0;
            }
            if *open == 0 {
                self.skipping = None;
                self.push("\n");
            }
            // Inside a skipped HTML element raw-text elements still switch the tokenizer, so
            // a `</head>` written in a script does not end the head.
            return if start && !foreign {
                content_state(name)
            } else {
                TokenSinkResult::Continue
            };
        }
        match layout(name) {
            // `<svg/>` is a complete element; `<script/>` opens one, as in a browser.
            Layout::Skipped if start && !(name == "svg" && tag.self_closing) => {
                self.skipping = Some((tag.name.clone(), 1));
                self.push("\n");
            }
            Layout::Skipped | Layout::Inline => {}
            Layout::Block => self.push("\n"),
            Layout::Cell => self.push(" "),
        }
        if start {
            content_state(name)
        } else {
            TokenSinkResult::Continue
        }
    }
}

impl TokenSink for TextSink {
    type Handle = ();

    fn process_token(&self, token: Token, _line_number: u64) -> TokenSinkResult<()> {
        let mut state = self.state.borrow_mut();
        match token {
            Token::CharacterTokens(text) => {
                if state.skipping.is_none() {
                    state.push(&text);
                }
                TokenSinkResult::Continue
            }
            Token::TagToken(tag) => state.tag(&tag),
            Token::DoctypeToken(_)
            | Token::CommentToken(_)
            | Token::NullCharacterToken
            | Token::EOFToken
            | Token::ParseError(_) => TokenSinkResult::Continue,
        }
    }
}

/// Each line's runs of whitespace become one space; blank lines are dropped (the model reads
/// fewer tokens, and block elements already start new lines).
fn collapse_whitespace(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut words = line.split_whitespace().peekable();
        if words.peek().is_none() {
            continue;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        for (i, word) in words.enumerate() {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(word);
        }
    }
    out
}
