//! Splitting rendered markup into messages no longer than a platform's limit.

/// One piece of rendered markup, as a renderer emits it and [`chunk`] consumes it.
///
/// The stream must be balanced: every [`Token::Open`] is ended by one [`Token::Close`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    /// Starts a span. `open` is written here and `close` at its end; around a chunk boundary
    /// both are written again, so the span is closed in one chunk and reopened in the next.
    Open {
        /// The markup that starts the span (`<b>`, `*`, ```` ```rust\n ````).
        open: String,
        /// The markup that ends it (`</b>`, `*`, ```` \n``` ````).
        close: String,
        /// Whether the text inside is written as it is (code in Markdown), so that without
        /// this span's markup its characters would format. Such a span keeps its markup even
        /// where that leaves no room; others lose it (see [`chunk`]).
        verbatim: bool,
    },
    /// Ends the innermost open span.
    Close,
    /// Output text that may be split between any two characters: it is already escaped for
    /// the platform, and holds no escape sequence (those are [`Token::Atom`]s).
    Text(String),
    /// Output that must stay whole: an entity (`&amp;`) or an escape sequence (`\*`).
    Atom(String),
    /// What starts a line before its content: a quote's `> `, the spaces under a list item's
    /// marker. A chunk that starts with it writes it before the spans it reopens, so the line
    /// stays a quote (`> _text_`, not `_> text_`).
    Prefix(String),
}

/// A platform's message size limit and the unit it counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Unicode scalar values (Discord, Slack's character limits).
    Chars(usize),
    /// UTF-16 code units (Telegram).
    Utf16(usize),
    /// UTF-8 bytes (Feishu's body sizes).
    Bytes(usize),
}

impl Limit {
    /// The size of `text` in this limit's unit.
    pub fn measure(self, text: &str) -> usize {
        match self {
            Limit::Chars(_) => text.chars().count(),
            Limit::Utf16(_) => text.encode_utf16().count(),
            Limit::Bytes(_) => text.len(),
        }
    }

    fn max(self) -> usize {
        match self {
            Limit::Chars(n) | Limit::Utf16(n) | Limit::Bytes(n) => n,
        }
    }
}

/// Why markup could not be chunked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    /// The limit cannot hold even one character with the markup that must surround it.
    #[error("limit {limit:?} is too small for one character inside its markup")]
    LimitTooSmall {
        /// The limit asked for.
        limit: Limit,
    },
}

/// Writes the whole token stream as one string, for output that needs no chunking.
pub fn concat(tokens: &[Token]) -> String {
    let mut out = String::new();
    // Closes are written from a stack of the open spans, as the chunker does.
    let mut stack: Vec<&str> = Vec::new();
    for token in tokens {
        match token {
            Token::Open { open, close, .. } => {
                out.push_str(open);
                stack.push(close);
            }
            Token::Close => out.push_str(stack.pop().unwrap_or_default()),
            Token::Text(text) | Token::Atom(text) | Token::Prefix(text) => out.push_str(text),
        }
    }
    out
}

/// Splits rendered markup into chunks of at most `limit`, each valid markup on its own.
///
/// A chunk never ends inside a tag, an entity or a character; spans still open at a boundary
/// are closed there and reopened at the start of the next chunk (a code block keeps its
/// language). Boundaries are chosen at the last paragraph break that fits, else the last line
/// break, else the last space, else the last character (never between an emoji and its
/// modifier). The whitespace at a chosen boundary is dropped. Empty input gives no chunks.
///
/// A span whose markup, with that of the spans around it, would leave no room for the widest
/// piece of text is written without its markup, unless it is verbatim: a link whose address
/// alone fills a message becomes its text rather than an answer that cannot be sent. Where no
/// boundary fits, the chunk ends where the limit does, even inside a run of whitespace or a
/// cluster of combining marks. So [`ChunkError`] means a limit too small for one escape
/// sequence or for a code block's own markup, never a long link, deep nesting or odd text.
pub fn chunk(tokens: &[Token], limit: Limit) -> Result<Vec<String>, ChunkError> {
    let (spans, units) = flatten(tokens, limit);
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut reopened: Vec<usize> = Vec::new();
    while start < units.len() {
        let (cut, resume) = match fit(&spans, &units, start, &reopened, limit) {
            Fit::All => (units.len(), units.len()),
            Fit::Split(cut, resume) => (cut, resume),
            Fit::Nothing => return Err(ChunkError::LimitTooSmall { limit }),
        };
        let (text, open_at_cut) = write(&spans, &units, start, cut, &reopened);
        // Whitespace-only stretches (a trailing "\n\n") never become a chunk of their own.
        if text_content(&units[start..cut]) {
            chunks.push(text);
        }
        reopened = open_at_cut;
        // Skip the dropped whitespace; it holds no spans, so the stack is unchanged.
        start = resume;
    }
    Ok(chunks)
}

/// A flattened token: one character, one atom, one character of a line prefix, or a span
/// edge.
#[derive(Debug, Clone, Copy)]
enum Unit<'a> {
    Open(usize),
    Close,
    Piece(&'a str),
    Prefix(&'a str),
}

impl<'a> Unit<'a> {
    /// The output this unit writes, if it is not a span edge.
    fn output(self) -> Option<&'a str> {
        match self {
            Unit::Piece(p) | Unit::Prefix(p) => Some(p),
            Unit::Open(_) | Unit::Close => None,
        }
    }
}

/// Each character of `text` as a unit made by `unit`.
fn chars<'a>(text: &'a str, unit: fn(&'a str) -> Unit<'a>) -> impl Iterator<Item = Unit<'a>> {
    text.char_indices()
        .map(move |(i, c)| unit(&text[i..i + c.len_utf8()]))
}

struct Span<'a> {
    open: &'a str,
    close: &'a str,
}

/// The tokens as units, without the markup of spans too big for `limit` (see [`chunk`]).
fn flatten(tokens: &[Token], limit: Limit) -> (Vec<Span<'_>>, Vec<Unit<'_>>) {
    let mut spans = Vec::new();
    let mut units = Vec::new();
    // The markup cost of each open span, `None` for one written without its markup, and the
    // kept spans' total.
    let mut open_costs: Vec<Option<usize>> = Vec::new();
    let mut markup = 0usize;
    let room = limit.max().saturating_sub(widest_piece(tokens, limit));
    for token in tokens {
        match token {
            Token::Open {
                open,
                close,
                verbatim,
            } => {
                let cost = limit.measure(open) + limit.measure(close);
                if *verbatim || markup + cost <= room {
                    markup += cost;
                    open_costs.push(Some(cost));
                    units.push(Unit::Open(spans.len()));
                    spans.push(Span { open, close });
                } else {
                    open_costs.push(None);
                }
            }
            Token::Close => {
                if let Some(Some(cost)) = open_costs.pop() {
                    markup -= cost;
                    units.push(Unit::Close);
                }
            }
            Token::Atom(atom) => units.push(Unit::Piece(atom)),
            Token::Text(text) => units.extend(chars(text, Unit::Piece)),
            Token::Prefix(text) => units.extend(chars(text, Unit::Prefix)),
        }
    }
    (spans, units)
}

/// The size of the largest piece of output the chunker cannot split: an atom or a character.
fn widest_piece(tokens: &[Token], limit: Limit) -> usize {
    let measure = |text: &str| {
        text.chars()
            .map(|c| limit.measure(c.encode_utf8(&mut [0; 4])))
            .max()
    };
    tokens
        .iter()
        .filter_map(|token| match token {
            Token::Atom(atom) => Some(limit.measure(atom)),
            Token::Text(text) | Token::Prefix(text) => measure(text),
            Token::Open { .. } | Token::Close => None,
        })
        .max()
        .unwrap_or(0)
}

fn text_content(units: &[Unit<'_>]) -> bool {
    units
        .iter()
        .any(|u| u.output().is_some_and(|p| !p.trim().is_empty()))
}

enum Fit {
    /// Everything from the start fits.
    All,
    /// End this chunk at the first index and resume the next one at the second.
    Split(usize, usize),
    /// Not even one piece fits.
    Nothing,
}

/// Whether a boundary between `before` and `after` would cut a visible character apart:
/// skin-tone modifiers, variation selectors, zero-width joiners and combining marks stay with
/// the character before them.
fn joins(before: &str, after: &str) -> bool {
    let sticks = |c: char| {
        matches!(
            c,
            '\u{1F3FB}'..='\u{1F3FF}' // skin tones
                | '\u{FE00}'..='\u{FE0F}' // variation selectors
                | '\u{200D}' // zero-width joiner
                | '\u{0300}'..='\u{036F}' // combining diacritics
                | '\u{E0020}'..='\u{E007F}' // tag characters (flag sequences)
        )
    };
    after.chars().next().is_some_and(sticks) || before.ends_with('\u{200D}')
}

/// Walks forward from `start` while the chunk, closed, still fits the limit, and picks the
/// best boundary it passed.
fn fit(
    spans: &[Span<'_>],
    units: &[Unit<'_>],
    start: usize,
    reopened: &[usize],
    limit: Limit,
) -> Fit {
    let max = limit.max();
    let mut stack: Vec<usize> = reopened.to_vec();
    let mut used: usize = stack.iter().map(|&s| limit.measure(spans[s].open)).sum();
    let mut closing: usize = stack.iter().map(|&s| limit.measure(spans[s].close)).sum();
    if used + closing > max {
        return Fit::Nothing;
    }
    // The latest boundary of each kind: paragraph break, line break, space, anywhere.
    let mut best: [Option<(usize, usize)>; 4] = [None; 4];
    let mut content = false;
    let mut i = start;
    while i < units.len() {
        if content {
            record(units, i, &mut best);
        }
        let (next_used, next_closing) = match units[i] {
            Unit::Open(s) => (
                used + limit.measure(spans[s].open),
                closing + limit.measure(spans[s].close),
            ),
            Unit::Close => {
                // A close moves its cost from the pending closes into the chunk itself.
                let c = stack.last().map_or(0, |&s| limit.measure(spans[s].close));
                (used + c, closing - c)
            }
            Unit::Piece(p) | Unit::Prefix(p) => (used + limit.measure(p), closing),
        };
        if next_used + next_closing > max {
            return match best.iter().flatten().next() {
                Some(&(cut, resume)) => Fit::Split(cut, resume),
                // No boundary yet (only whitespace, or one cluster of joined characters): end
                // where the limit does.
                None if i > start => Fit::Split(i, i),
                None => Fit::Nothing,
            };
        }
        match units[i] {
            Unit::Open(s) => stack.push(s),
            Unit::Close => {
                stack.pop();
            }
            Unit::Piece(p) | Unit::Prefix(p) => content |= !p.trim().is_empty(),
        }
        used = next_used;
        closing = next_closing;
        i += 1;
    }
    Fit::All
}

/// Notes the boundary before unit `i` in the slot of its kind. A line prefix's spaces are no
/// boundary: the line break before the prefix is a better one.
fn record(units: &[Unit<'_>], i: usize, best: &mut [Option<(usize, usize)>; 4]) {
    let piece = |j: usize| match units.get(j) {
        Some(Unit::Piece(p)) => Some(*p),
        _ => None,
    };
    match (piece(i), piece(i + 1)) {
        (Some("\n"), Some("\n")) => best[0] = Some((i, i + 2)),
        (Some("\n"), _) => best[1] = Some((i, i + 1)),
        (Some(" "), _) => best[2] = Some((i, i + 1)),
        _ => {}
    }
    let before = i.checked_sub(1).and_then(piece).unwrap_or("");
    let after = piece(i).unwrap_or("");
    if !joins(before, after) {
        best[3] = Some((i, i));
    }
}

/// Writes units `start..cut` with the spans in `reopened` opened first (after the line prefix
/// the chunk starts with, if any) and every span still open at `cut` closed; returns the text
/// and the spans open at `cut`.
///
/// A span that gets no text in this chunk is left out entirely rather than written empty.
fn write(
    spans: &[Span<'_>],
    units: &[Unit<'_>],
    start: usize,
    cut: usize,
    reopened: &[usize],
) -> (String, Vec<usize>) {
    let mut out = String::new();
    // Each open span with where its open markup starts in `out` and whether it holds text yet.
    let mut stack: Vec<(usize, usize, bool)> = Vec::new();
    let open = |out: &mut String, stack: &mut Vec<(usize, usize, bool)>, s: usize| {
        stack.push((s, out.len(), false));
        out.push_str(spans[s].open);
    };
    let prefix = units[start..cut]
        .iter()
        .take_while(|u| matches!(u, Unit::Prefix(_)))
        .count();
    for unit in &units[start..start + prefix] {
        out.extend(unit.output());
    }
    for &s in reopened {
        open(&mut out, &mut stack, s);
    }
    for unit in &units[start + prefix..cut] {
        match *unit {
            Unit::Open(s) => open(&mut out, &mut stack, s),
            Unit::Close => close(spans, &mut out, &mut stack),
            Unit::Piece(p) | Unit::Prefix(p) => {
                out.push_str(p);
                stack.iter_mut().for_each(|frame| frame.2 = true);
            }
        }
    }
    let open_at_cut: Vec<usize> = stack.iter().map(|frame| frame.0).collect();
    while !stack.is_empty() {
        close(spans, &mut out, &mut stack);
    }
    (out, open_at_cut)
}

fn close(spans: &[Span<'_>], out: &mut String, stack: &mut Vec<(usize, usize, bool)>) {
    if let Some((s, at, has_text)) = stack.pop() {
        if has_text {
            out.push_str(spans[s].close);
        } else {
            out.truncate(at);
        }
    }
}
