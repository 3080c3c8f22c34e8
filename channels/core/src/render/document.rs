//! The document model and the one place Markdown is parsed.

use pulldown_cmark::{CodeBlockKind, Event, LinkType, Options, Parser, Tag};

/// The longest language name a code block keeps: longer ones are no language's name, and
/// would only make every chunk's reopened fence long.
const MAX_LANGUAGE: usize = 32;

/// A parsed answer: what every platform renderer starts from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Document {
    /// The top-level blocks, in order.
    pub blocks: Vec<Block>,
}

/// A block of a [`Document`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    /// Running text.
    Paragraph(Vec<Inline>),
    /// A heading; `level` is 1 to 6.
    Heading {
        /// 1 for `#`, up to 6.
        level: u8,
        /// The heading's text.
        content: Vec<Inline>,
    },
    /// A fenced or indented code block, without its trailing newline.
    Code {
        /// The info string's first word (`rust` in ```` ```rust ````), if any and at most
        /// 32 characters.
        language: Option<String>,
        /// The code, verbatim.
        text: String,
    },
    /// A block quote.
    Quote(Vec<Block>),
    /// A list; each item is a sequence of blocks.
    List {
        /// The first number of an ordered list, `None` for a bulleted one.
        start: Option<u64>,
        /// The items.
        items: Vec<Vec<Block>>,
    },
    /// A thematic break (`---`).
    Rule,
    /// A table: rows of cells, the header row first.
    Table(Vec<Vec<Vec<Inline>>>),
}

/// Inline content of a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inline {
    /// Plain text, unescaped.
    Text(String),
    /// Strong emphasis.
    Bold(Vec<Inline>),
    /// Emphasis.
    Italic(Vec<Inline>),
    /// Strikethrough.
    Strike(Vec<Inline>),
    /// Inline code, verbatim.
    Code(String),
    /// A link whose scheme is http, https, mailto or tg.
    Link {
        /// The destination, unescaped.
        url: String,
        /// The link text.
        content: Vec<Inline>,
    },
    /// A line break inside a block.
    LineBreak,
}

impl Document {
    /// Parses CommonMark with strikethrough and tables.
    ///
    /// Raw HTML becomes literal text, and links with any scheme other than http, https,
    /// mailto or tg become their text, so model output can never smuggle markup or
    /// `javascript:` URLs into a platform message.
    pub fn parse(markdown: &str) -> Document {
        let options = Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TABLES;
        let mut builder = Builder {
            stack: vec![Frame::Blocks(BlockKind::Root, Vec::new(), Vec::new())],
        };
        for event in Parser::new_ext(markdown, options) {
            builder.event(event);
        }
        while builder.stack.len() > 1 {
            builder.end();
        }
        match builder.stack.pop() {
            Some(Frame::Blocks(_, mut blocks, pending)) => {
                flush(&mut blocks, pending);
                Document { blocks }
            }
            _ => Document::default(),
        }
    }
}

/// Keeps a link only if its scheme is one every platform renders safely.
fn safe_url(url: &str, link_type: LinkType) -> Option<String> {
    if link_type == LinkType::Email && !url.contains(':') {
        return Some(format!("mailto:{url}"));
    }
    let scheme = url.split_once(':')?.0.to_ascii_lowercase();
    matches!(scheme.as_str(), "http" | "https" | "mailto" | "tg").then(|| url.to_owned())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockKind {
    Root,
    Quote,
    Item,
}

#[derive(Debug)]
enum SpanKind {
    Bold,
    Italic,
    Strike,
    Link(String),
    /// A link or image we do not keep: its content is spliced into the parent.
    Transparent,
}

#[derive(Debug)]
enum Frame {
    /// A container of blocks; inline content that arrives directly (tight list items) is
    /// gathered in the second vector and becomes a paragraph.
    Blocks(BlockKind, Vec<Block>, Vec<Inline>),
    List(Option<u64>, Vec<Vec<Block>>),
    Paragraph(Vec<Inline>),
    Heading(u8, Vec<Inline>),
    Code(Option<String>, String),
    /// Raw HTML shown as the text it is.
    Html(String),
    Table(Vec<Vec<Vec<Inline>>>),
    Row(Vec<Vec<Inline>>),
    Cell(Vec<Inline>),
    Span(SpanKind, Vec<Inline>),
}

struct Builder {
    stack: Vec<Frame>,
}

fn flush(blocks: &mut Vec<Block>, pending: Vec<Inline>) {
    if !pending.is_empty() {
        blocks.push(Block::Paragraph(pending));
    }
}

impl Builder {
    fn event(&mut self, event: Event<'_>) {
        match event {
            Event::Start(tag) => self.start(tag),
            Event::End(_) => self.end(),
            Event::Text(text) => self.text(&text),
            Event::Code(code) => self.inline(Inline::Code(code.into_string())),
            Event::Html(html) | Event::InlineHtml(html) => self.text(&html),
            Event::InlineMath(text) | Event::DisplayMath(text) => self.text(&text),
            Event::FootnoteReference(label) => self.text(&format!("[^{label}]")),
            Event::SoftBreak | Event::HardBreak => self.inline(Inline::LineBreak),
            Event::Rule => self.block(Block::Rule),
            Event::TaskListMarker(done) => self.text(if done { "[x] " } else { "[ ] " }),
        }
    }

    fn start(&mut self, tag: Tag<'_>) {
        let frame = match tag {
            Tag::Paragraph => Frame::Paragraph(Vec::new()),
            Tag::Heading { level, .. } => Frame::Heading(level as u8, Vec::new()),
            Tag::BlockQuote(_) => Frame::Blocks(BlockKind::Quote, Vec::new(), Vec::new()),
            Tag::CodeBlock(kind) => {
                let language = match kind {
                    CodeBlockKind::Fenced(info) => info
                        .split_whitespace()
                        .next()
                        .filter(|word| !word.is_empty() && word.chars().count() <= MAX_LANGUAGE)
                        .map(str::to_owned),
                    CodeBlockKind::Indented => None,
                };
                Frame::Code(language, String::new())
            }
            Tag::HtmlBlock => Frame::Html(String::new()),
            Tag::List(start) => Frame::List(start, Vec::new()),
            Tag::Item => Frame::Blocks(BlockKind::Item, Vec::new(), Vec::new()),
            Tag::Table(_) => Frame::Table(Vec::new()),
            Tag::TableHead | Tag::TableRow => Frame::Row(Vec::new()),
            Tag::TableCell => Frame::Cell(Vec::new()),
            Tag::Strong => Frame::Span(SpanKind::Bold, Vec::new()),
            Tag::Emphasis => Frame::Span(SpanKind::Italic, Vec::new()),
            Tag::Strikethrough => Frame::Span(SpanKind::Strike, Vec::new()),
            Tag::Link {
                link_type,
                dest_url,
                ..
            }
            | Tag::Image {
                link_type,
                dest_url,
                ..
            } => match safe_url(&dest_url, link_type) {
                // A link in a link (an image in a link's text) keeps only its text: no
                // platform nests links, and Telegram refuses the message.
                Some(_) if self.in_link() => Frame::Span(SpanKind::Transparent, Vec::new()),
                Some(url) => Frame::Span(SpanKind::Link(url), Vec::new()),
                None => Frame::Span(SpanKind::Transparent, Vec::new()),
            },
            // Options we do not enable (footnotes, definition lists, metadata, sub/superscript):
            // keep their content as plain inline text rather than lose it.
            _ => Frame::Span(SpanKind::Transparent, Vec::new()),
        };
        self.stack.push(frame);
    }

    /// Whether a link is open around the current position.
    fn in_link(&self) -> bool {
        self.stack
            .iter()
            .any(|frame| matches!(frame, Frame::Span(SpanKind::Link(_), _)))
    }

    /// Closes the innermost frame and hands its result to the parent.
    fn end(&mut self) {
        if self.stack.len() <= 1 {
            return;
        }
        let Some(frame) = self.stack.pop() else {
            return;
        };
        match frame {
            Frame::Blocks(kind, mut blocks, pending) => {
                flush(&mut blocks, pending);
                match kind {
                    BlockKind::Quote => self.block(Block::Quote(blocks)),
                    BlockKind::Item => {
                        if let Some(Frame::List(_, items)) = self.stack.last_mut() {
                            items.push(blocks);
                        }
                    }
                    BlockKind::Root => {}
                }
            }
            Frame::List(start, items) => self.block(Block::List { start, items }),
            Frame::Paragraph(content) => self.block(Block::Paragraph(content)),
            Frame::Heading(level, content) => self.block(Block::Heading { level, content }),
            Frame::Code(language, mut text) => {
                if text.ends_with('\n') {
                    text.pop();
                }
                self.block(Block::Code { language, text });
            }
            Frame::Html(mut html) => {
                while html.ends_with('\n') {
                    html.pop();
                }
                let mut content = Vec::new();
                for (i, line) in html.split('\n').enumerate() {
                    if i > 0 {
                        content.push(Inline::LineBreak);
                    }
                    content.push(Inline::Text(line.to_owned()));
                }
                self.block(Block::Paragraph(content));
            }
            Frame::Table(rows) => self.block(Block::Table(rows)),
            Frame::Row(cells) => {
                if let Some(Frame::Table(rows)) = self.stack.last_mut() {
                    rows.push(cells);
                }
            }
            Frame::Cell(content) => {
                if let Some(Frame::Row(cells)) = self.stack.last_mut() {
                    cells.push(content);
                }
            }
            Frame::Span(kind, content) => match kind {
                SpanKind::Bold => self.inline(Inline::Bold(content)),
                SpanKind::Italic => self.inline(Inline::Italic(content)),
                SpanKind::Strike => self.inline(Inline::Strike(content)),
                SpanKind::Link(url) => self.inline(Inline::Link { url, content }),
                SpanKind::Transparent => content.into_iter().for_each(|i| self.inline(i)),
            },
        }
    }

    fn block(&mut self, block: Block) {
        // A block can only land in a block container with the options we enable.
        if let Some(Frame::Blocks(_, blocks, pending)) = self.stack.last_mut() {
            flush(blocks, std::mem::take(pending));
            blocks.push(block);
        }
    }

    fn text(&mut self, text: &str) {
        match self.stack.last_mut() {
            Some(Frame::Code(_, code)) | Some(Frame::Html(code)) => code.push_str(text),
            _ => self.inline(Inline::Text(text.to_owned())),
        }
    }

    fn inline(&mut self, inline: Inline) {
        let target = match self.stack.last_mut() {
            Some(
                Frame::Paragraph(content)
                | Frame::Heading(_, content)
                | Frame::Cell(content)
                | Frame::Span(_, content)
                | Frame::Blocks(_, _, content),
            ) => content,
            Some(Frame::Code(_, code) | Frame::Html(code)) => {
                if let Inline::Text(text) = inline {
                    code.push_str(&text);
                }
                return;
            }
            _ => return,
        };
        // Adjacent text pieces (pulldown-cmark splits at entities and brackets) are merged so
        // renderers and golden tests see one run.
        if let (Some(Inline::Text(last)), Inline::Text(text)) = (target.last_mut(), &inline) {
            last.push_str(text);
        } else {
            target.push(inline);
        }
    }
}
