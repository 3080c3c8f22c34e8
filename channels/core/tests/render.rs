//! Golden tests for the render toolkit: Markdown → Telegram HTML / Slack mrkdwn / Feishu card
//! Markdown / plain text,
//! and chunking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use antler_channel::render::{
    Block, ChunkError, DiscordMarkdown, Document, FeishuMarkdown, Inline, Limit, PlainText,
    Renderer, SlackMrkdwn, TelegramHtml, Token, chunk, concat,
};

#[test]
fn parts_are_the_chunks_of_the_rendered_document_and_blank_text_has_none() {
    let markdown = "**one** two\n\nthree & four";
    assert_eq!(
        antler_channel::render::parts(markdown, &TelegramHtml, Limit::Utf16(14)).unwrap(),
        chunk(
            &TelegramHtml.render(&Document::parse(markdown)),
            Limit::Utf16(14)
        )
        .unwrap()
    );
    assert!(
        antler_channel::render::parts(" \n\n ", &TelegramHtml, Limit::Utf16(10))
            .unwrap()
            .is_empty()
    );
}

fn html(markdown: &str) -> String {
    concat(&TelegramHtml.render(&Document::parse(markdown)))
}

fn plain(markdown: &str) -> String {
    concat(&PlainText.render(&Document::parse(markdown)))
}

fn html_chunks(markdown: &str, limit: Limit) -> Vec<String> {
    antler_channel::render::parts(markdown, &TelegramHtml, limit).unwrap()
}

/// The tags Telegram accepts that our renderer may emit.
const TAGS: &[&str] = &["b", "i", "s", "code", "pre", "a", "blockquote"];

/// Panics unless `text` is markup Telegram would accept on its own: known tags, properly
/// nested and all closed, and no `&`, `<` or `>` outside an entity or a tag.
fn assert_balanced(text: &str) {
    let mut stack: Vec<&str> = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(['<', '&', '>']) {
        let tail = &rest[at..];
        match tail.as_bytes()[0] {
            b'&' => {
                let entity = ["&amp;", "&lt;", "&gt;", "&quot;"]
                    .iter()
                    .find(|e| tail.starts_with(**e))
                    .unwrap_or_else(|| panic!("bare or split entity in {text:?}"));
                rest = &tail[entity.len()..];
            }
            b'>' => panic!("bare > in {text:?}"),
            _ => {
                let end = tail
                    .find('>')
                    .unwrap_or_else(|| panic!("unterminated tag in {text:?}"));
                let tag = &tail[1..end];
                if let Some(name) = tag.strip_prefix('/') {
                    assert_eq!(stack.pop(), Some(name), "misnested </{name}> in {text:?}");
                } else {
                    let name = tag.split(' ').next().unwrap();
                    assert!(TAGS.contains(&name), "unknown tag <{tag}> in {text:?}");
                    stack.push(name);
                }
                rest = &tail[end + 1..];
            }
        }
    }
    assert!(stack.is_empty(), "unclosed {stack:?} in {text:?}");
}

/// The visible text of markup: tags removed, entities decoded, whitespace dropped (chunk
/// boundaries drop the whitespace they split at).
fn visible(text: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in text.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            c if !in_tag && !c.is_whitespace() => out.push(c),
            _ => {}
        }
    }
    out.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&amp;", "&")
}

#[test]
fn the_balance_checker_rejects_broken_markup() {
    for broken in [
        "<b>x",
        "<b><i>x</b></i>",
        "a &am",
        "x <",
        "<u>x</u>",
        "a > b",
    ] {
        assert!(
            std::panic::catch_unwind(|| assert_balanced(broken)).is_err(),
            "{broken:?} passed"
        );
    }
    assert_balanced("<b>a &amp; <i>b</i></b>");
}

// ---- the document model ----

#[test]
fn the_model_merges_text_keeps_line_breaks_and_drops_unsafe_links() {
    let doc = Document::parse("- a &amp; b\n  c\n- [d](ftp://x)\n\n```rust ignore\nx\n```");
    let text = |t: &str| Inline::Text(t.to_owned());
    assert_eq!(
        doc.blocks,
        [
            Block::List {
                start: None,
                items: vec![
                    vec![Block::Paragraph(vec![
                        text("a & b"),
                        Inline::LineBreak,
                        text("c")
                    ])],
                    vec![Block::Paragraph(vec![text("d")])],
                ],
            },
            Block::Code {
                language: Some("rust".to_owned()),
                text: "x".to_owned(),
            },
        ]
    );
}

// ---- Telegram HTML goldens ----

#[test]
fn nested_formatting_bold_inside_italic_inside_a_link() {
    assert_eq!(
        html("[*very **bold** move*](https://example.com/?a=1&b=\"2\")"),
        "<a href=\"https://example.com/?a=1&amp;b=&quot;2&quot;\"><i>very <b>bold</b> move</i></a>"
    );
    assert_eq!(
        html("~~gone~~ and `x < y`"),
        "<s>gone</s> and <code>x &lt; y</code>"
    );
}

#[test]
fn code_blocks_keep_language_and_escape_their_text() {
    assert_eq!(
        html("```rust\nif a < b && c > d {\n    go();\n}\n```"),
        "<pre><code class=\"language-rust\">if a &lt; b &amp;&amp; c &gt; d {\n    go();\n}</code></pre>"
    );
    assert_eq!(html("```\n<&>\n```"), "<pre>&lt;&amp;&gt;</pre>");
    // A language that could break out of the class attribute is dropped, not escaped.
    assert_eq!(html("```a\"b\nx\n```"), "<pre>x</pre>");
}

#[test]
fn user_text_is_escaped() {
    assert_eq!(
        html("<script>alert(1)</script> a & b > c"),
        "&lt;script&gt;alert(1)&lt;/script&gt; a &amp; b &gt; c"
    );
}

#[test]
fn raw_html_is_shown_literally() {
    assert_eq!(
        html("x <b>not bold</b> y\n\n<div>\nblock\n</div>"),
        "x &lt;b&gt;not bold&lt;/b&gt; y\n\n&lt;div&gt;\nblock\n&lt;/div&gt;"
    );
}

#[test]
fn nested_lists_are_indented_lines() {
    assert_eq!(
        html("- one\n- two\n  1. a\n  2. **b**\n     - deep\n- three"),
        "• one\n• two\n  1. a\n  2. <b>b</b>\n     • deep\n• three"
    );
    assert_eq!(html("3. c\n4. d"), "3. c\n4. d");
}

#[test]
fn headings_rules_quotes_and_tables() {
    assert_eq!(
        html("# Title\n\nText\n\n## Sub *it*\n\n---\n\n> quoted\n> on"),
        "<b>Title</b>\n\nText\n\n<b>Sub <i>it</i></b>\n\n———\n\n<blockquote>quoted\non</blockquote>"
    );
    assert_eq!(
        html("| a | bb |\n|---|---|\n| c<d | e |"),
        "<pre>a   | bb\n----+---\nc&lt;d | e</pre>"
    );
}

#[test]
fn only_safe_link_schemes_stay_links() {
    assert_eq!(
        html("[x](javascript:alert(1)) [y](/relative) [z](tg://user?id=1) <me@example.com>"),
        "x y <a href=\"tg://user?id=1\">z</a> <a href=\"mailto:me@example.com\">me@example.com</a>"
    );
}

#[test]
fn empty_input_renders_and_chunks_to_nothing() {
    assert!(TelegramHtml.render(&Document::parse("")).is_empty());
    assert_eq!(html_chunks("", Limit::Utf16(4096)), Vec::<String>::new());
    assert_eq!(
        html_chunks("\n\n  \n", Limit::Utf16(4096)),
        Vec::<String>::new()
    );
}

// ---- plain text goldens ----

#[test]
fn plain_text_drops_markup_and_keeps_urls() {
    assert_eq!(
        plain("# T\n\n[*a **b***](https://x.io) <https://y.io> <b>&amp;</b>\n\n> q\n\n- l\n  - m"),
        "T\n\na b (https://x.io) https://y.io <b>&</b>\n\n> q\n\n• l\n  • m"
    );
    assert_eq!(plain("```rust\nx < y\n```"), "x < y");
}

// ---- chunking ----

/// About 10,000 characters of answer: prose with formatting and links, and three code blocks,
/// one of them longer than a Telegram message.
fn long_answer() -> String {
    let mut md = String::new();
    for i in 0..12 {
        md.push_str(&format!(
            "Paragraph {i} talks about **bold ideas** and *gentle <emphasis>* with a \
             [link](https://example.com/{i}?a=1&b=2) & some `inline < code`. 👍🏽 中文也在这里。\n\n"
        ));
    }
    md.push_str("```rust\n");
    for i in 0..150 {
        md.push_str(&format!(
            "let v{i} = if a < b && c > d {{ {i} }} else {{ 0 }};\n"
        ));
    }
    md.push_str("```\n\n");
    for i in 0..10 {
        md.push_str(&format!("- item {i} with ~~old~~ text\n"));
    }
    md.push_str("\n```python\nprint('<&>')\n```\n\n");
    for i in 0..15 {
        md.push_str(&format!(
            "Closing words {i}: *italic **and bold** text* and more.\n\n"
        ));
    }
    md.push_str("```\nplain code\n```\n");
    md
}

#[test]
fn a_long_answer_chunks_into_valid_telegram_messages() {
    let md = long_answer();
    assert!(md.chars().count() >= 10_000, "{}", md.chars().count());
    let whole = html(&md);
    let chunks = html_chunks(&md, Limit::Utf16(4096));
    assert!(chunks.len() >= 3, "{}", chunks.len());
    for c in &chunks {
        assert!(
            c.encode_utf16().count() <= 4096,
            "{}",
            c.encode_utf16().count()
        );
        assert!(!c.is_empty());
        assert_balanced(c);
    }
    assert_balanced(&whole);
    // Nothing visible is lost or duplicated.
    assert_eq!(visible(&chunks.concat()), visible(&whole));
    // The long rust block crosses a boundary: closed at the end of one chunk and reopened,
    // with its language, at the start of the next.
    let open = "<pre><code class=\"language-rust\">";
    let reopened = chunks
        .windows(2)
        .any(|w| w[0].ends_with("</code></pre>") && w[1].starts_with(open));
    assert!(reopened, "{chunks:#?}");
    assert!(chunks.iter().filter(|c| c.contains(open)).count() >= 2);
    // Prose before the code block is split at a paragraph break, not mid-sentence.
    assert!(chunks[0].ends_with("这里。"), "{:?}", chunks[0]);
}

#[test]
fn emoji_is_never_split_from_its_modifier_or_halved() {
    // 👍🏽 is two scalar values, each a surrogate pair: four UTF-16 units.
    assert_eq!(
        html_chunks("aaaaaa👍🏽", Limit::Utf16(10)),
        ["aaaaaa👍🏽"],
        "exactly at the limit"
    );
    assert_eq!(
        html_chunks("aaaaaaaa👍🏽", Limit::Utf16(10)),
        ["aaaaaaaa", "👍🏽"]
    );
    assert_eq!(
        html_chunks("aaaaaaaaa👍🏽", Limit::Utf16(10)),
        ["aaaaaaaaa", "👍🏽"]
    );
    let many = "👍".repeat(3000);
    let chunks = html_chunks(&many, Limit::Utf16(4096));
    assert_eq!(chunks.len(), 2);
    assert_eq!(chunks[0].encode_utf16().count(), 4096);
    assert_eq!(chunks.concat(), many);
}

#[test]
fn cjk_at_the_limit_in_every_unit() {
    assert_eq!(html_chunks("你好世界", Limit::Bytes(12)), ["你好世界"]);
    assert_eq!(html_chunks("你好世界", Limit::Bytes(11)), ["你好世", "界"]);
    assert_eq!(html_chunks("你好世界", Limit::Chars(4)), ["你好世界"]);
    assert_eq!(html_chunks("你好世界", Limit::Chars(3)), ["你好世", "界"]);
    assert_eq!(html_chunks("你好世界", Limit::Utf16(2)), ["你好", "世界"]);
}

#[test]
fn a_word_longer_than_the_limit_is_split_anywhere() {
    assert_eq!(
        html_chunks("abcdefghij", Limit::Chars(4)),
        ["abcd", "efgh", "ij"]
    );
    // The markup counts too: 7 of the 10 characters go to <b></b>.
    assert_eq!(
        html_chunks("**abcdefgh**", Limit::Chars(10)),
        ["<b>abc</b>", "<b>def</b>", "<b>gh</b>"]
    );
}

#[test]
fn entities_are_never_split() {
    assert_eq!(
        html_chunks("&&&&&", Limit::Chars(12)),
        ["&amp;&amp;", "&amp;&amp;", "&amp;"]
    );
}

#[test]
fn boundaries_prefer_paragraphs_then_lines_then_spaces() {
    let chunks = |text: &str, n| chunk(&[Token::Text(text.to_owned())], Limit::Chars(n)).unwrap();
    assert_eq!(
        chunks("aaaa\n\nbbbb cccc\ndddd", 15),
        ["aaaa", "bbbb cccc\ndddd"]
    );
    assert_eq!(
        chunks("bbbb cccc\ndddd eeee", 16),
        ["bbbb cccc", "dddd eeee"]
    );
    assert_eq!(chunks("bbbb cccc dddd", 12), ["bbbb cccc", "dddd"]);
}

#[test]
fn a_link_split_across_chunks_repeats_its_href() {
    assert_eq!(
        html_chunks("[one two](https://a.io)", Limit::Chars(33)),
        [
            "<a href=\"https://a.io\">one</a>",
            "<a href=\"https://a.io\">two</a>"
        ]
    );
}

#[test]
fn a_span_with_no_text_in_a_chunk_is_left_out() {
    // `<b></b>` fits exactly after the a's, so the last boundary that fits is inside the
    // bold, before any of its text: the chunk must not end with an empty `<b></b>`.
    assert_eq!(
        html_chunks("aaaaa**bb**", Limit::Chars(12)),
        ["aaaaa", "<b>bb</b>"]
    );
}

#[test]
fn markup_too_big_for_the_limit_is_dropped_and_only_a_limit_below_one_escape_is_an_error() {
    // `<pre><code class="language-rust">` and its close take 48 characters: at 40 the code is
    // sent without them rather than not at all.
    let tokens = TelegramHtml.render(&Document::parse("```rust\nx\n```"));
    assert_eq!(chunk(&tokens, Limit::Chars(40)).unwrap(), ["x"]);
    assert_eq!(
        chunk(&tokens, Limit::Chars(49)).unwrap(),
        ["<pre><code class=\"language-rust\">x</code></pre>"]
    );
    // Found by the `render_discord` fuzz target: a link whose address, its `>` encoded as
    // `%3E`, was longer than Discord's 2,000 characters made the whole answer unsendable.
    let url = format!("https://x.io/{}", ">".repeat(700));
    let chunks = discord_chunks(&format!("see [the page]({url})"), Limit::Chars(2000));
    assert_eq!(chunks, ["see the page"]);
    // Only a limit that cannot hold one escape sequence (`&amp;`) is refused.
    let tokens = TelegramHtml.render(&Document::parse("a & b"));
    assert_eq!(
        chunk(&tokens, Limit::Chars(4)),
        Err(ChunkError::LimitTooSmall {
            limit: Limit::Chars(4)
        })
    );
    assert_eq!(
        chunk(&tokens, Limit::Chars(5)).unwrap(),
        ["a", "&amp;", "b"]
    );
}

#[test]
fn text_with_no_boundary_is_cut_where_the_limit_is() {
    // A run of whitespace longer than the limit, or one character with a long tail of
    // combining marks, has no place to end a chunk: it is cut where the limit is rather than
    // refused.
    let spaces = format!("```\n{}x\n```", " ".repeat(30));
    let chunks = discord_chunks(&spaces, Limit::Chars(20));
    assert!(chunks.iter().all(|c| c.chars().count() <= 20), "{chunks:?}");
    assert!(chunks.concat().contains('x'), "{chunks:?}");
    let zalgo = format!("a{}", "\u{0301}".repeat(40));
    let chunks = discord_chunks(&zalgo, Limit::Chars(16));
    assert!(chunks.iter().all(|c| c.chars().count() <= 16), "{chunks:?}");
    assert_eq!(chunks.concat(), zalgo);
}

#[test]
fn other_markup_dialects_plug_in_through_tokens() {
    // What a Slack mrkdwn renderer would emit for a code block that crosses a boundary.
    let tokens = [
        Token::Open {
            open: "```\n".to_owned(),
            close: "\n```".to_owned(),
            verbatim: true,
        },
        Token::Text("let a = 1;\nlet b = 2;".to_owned()),
        Token::Atom("&amp;".to_owned()),
        Token::Close,
    ];
    assert_eq!(
        chunk(&tokens, Limit::Bytes(23)).unwrap(),
        ["```\nlet a = 1;\n```", "```\nlet b = 2;&amp;\n```"]
    );
}

// ---- Slack mrkdwn goldens ----

fn mrkdwn(markdown: &str) -> String {
    concat(&SlackMrkdwn.render(&Document::parse(markdown)))
}

fn mrkdwn_chunks(markdown: &str, limit: Limit) -> Vec<String> {
    antler_channel::render::parts(markdown, &SlackMrkdwn, limit).unwrap()
}

#[test]
fn mrkdwn_nests_formatting_without_repeating_a_style() {
    assert_eq!(
        mrkdwn("*very **bold** move* and ~~gone~~ and `x < y`"),
        "_very *bold* move_ and ~gone~ and `x &lt; y`"
    );
    // A heading is already bold: its bold words must not close it early.
    assert_eq!(mrkdwn("# Deploy **now** _please_"), "*Deploy now _please_*");
    assert_eq!(mrkdwn("***both***"), "_*both*_");
}

#[test]
fn mrkdwn_escapes_only_ampersand_and_angle_brackets() {
    assert_eq!(
        mrkdwn("x <b> a & b > c \\*not bold\\* \"q\" 'a'"),
        "x &lt;b&gt; a &amp; b &gt; c *not bold* \"q\" 'a'"
    );
    let tokens = SlackMrkdwn.render(&Document::parse("a&b"));
    assert_eq!(
        tokens,
        [
            Token::Text("a".into()),
            Token::Atom("&amp;".into()),
            Token::Text("b".into())
        ]
    );
}

#[test]
fn mrkdwn_links_escape_their_text_and_name_bare_urls_once() {
    assert_eq!(
        mrkdwn("[a **b** & c](https://x.io/?a=1&b=2|3) <https://y.io> [z](javascript:x)"),
        "<https://x.io/?a=1&amp;b=2%7C3|a b &amp; c> <https://y.io> z"
    );
    assert_eq!(mrkdwn("<me@example.com>"), "<mailto:me@example.com>");
}

#[test]
fn mrkdwn_blocks_headings_lists_quotes_and_tables() {
    assert_eq!(
        mrkdwn("## Title\n\n- one\n- two\n  1. a\n  2. **b**\n\n> quoted\n> on\n>\n> more\n\n---"),
        "*Title*\n\n• one\n• two\n  1. a\n  2. *b*\n\n> quoted\n> on\n> more\n\n———"
    );
    assert_eq!(
        mrkdwn("```rust\nif a < b && c {\n}\n```"),
        "```\nif a &lt; b &amp;&amp; c {\n}\n```"
    );
    // Code keeps its own indentation, not the list's.
    assert_eq!(
        mrkdwn("- run:\n\n  ```\n  a\n   b\n  ```"),
        "• run:\n  ```\na\n b\n```"
    );
    assert_eq!(
        mrkdwn("| a | bb |\n|---|---|\n| c<d | e |"),
        "```\na   | bb\n----+---\nc&lt;d | e\n```"
    );
}

#[test]
fn mrkdwn_code_block_across_a_chunk_boundary_is_closed_and_reopened() {
    let markdown = "Intro.\n\n```sh\necho one & two\necho three\necho four\n```";
    let chunks = mrkdwn_chunks(markdown, Limit::Chars(30));
    assert_eq!(
        chunks,
        [
            "Intro.",
            "```\necho one &amp; two\n```",
            "```\necho three\necho four\n```"
        ]
    );
    for chunk in &chunks {
        assert_eq!(chunk.matches("```").count() % 2, 0, "{chunk:?}");
        assert!(chunk.chars().count() <= 30);
    }
    // A long answer at Slack's limit: every chunk fits and keeps its code fences paired.
    let long = long_answer();
    let chunks = mrkdwn_chunks(&long, Limit::Chars(4000));
    assert!(chunks.len() >= 3, "{} chunks", chunks.len());
    for chunk in &chunks {
        assert!(chunk.chars().count() <= 4000);
        assert_eq!(chunk.matches("```").count() % 2, 0, "{chunk:?}");
        assert!(!chunk.contains("&am\n") && !chunk.ends_with("&am"));
    }
}

// ---- Feishu card Markdown goldens ----

fn lark(markdown: &str) -> String {
    concat(&FeishuMarkdown.render(&Document::parse(markdown)))
}

fn lark_chunks(markdown: &str, limit: Limit) -> Vec<String> {
    antler_channel::render::parts(markdown, &FeishuMarkdown, limit).unwrap()
}

#[test]
fn lark_nests_formatting_without_repeating_a_style() {
    assert_eq!(
        lark("*very **bold** move* and ~~gone~~ and `x < y`"),
        "*very **bold** move* and ~~gone~~ and `x < y`"
    );
    assert_eq!(lark("# Deploy **now** _please_"), "**Deploy now *please***");
    assert_eq!(lark("***both***"), "***both***");
    assert_eq!(
        lark("[*a **b***](https://x.io) ~~**c**~~"),
        "[a b](https://x.io) ~~**c**~~"
    );
}

#[test]
fn lark_escapes_what_would_format_as_entities() {
    assert_eq!(
        lark("x <at id=all></at> a & b > c \\*not bold\\* \\_u\\_ \\~s\\~ \\`c\\` \\[l\\]"),
        "x &lt;at id=all&gt;&lt;/at&gt; a &amp; b &gt; c &#42;not bold&#42; &#95;u&#95; \
         &#126;s&#126; &#96;c&#96; &#91;l&#93;"
    );
    assert_eq!(lark("snake_case_name"), "snake&#95;case&#95;name");
    assert_eq!(
        FeishuMarkdown.render(&Document::parse("a*b")),
        [
            Token::Text("a".into()),
            Token::Atom("&#42;".into()),
            Token::Text("b".into())
        ]
    );
    // An entity is never split by a chunk boundary.
    assert_eq!(lark_chunks("ab & cd", Limit::Bytes(8)), ["ab &amp;", "cd"]);
    // Code is shown as it is: nothing inside it is escaped, and its fence outgrows its backticks.
    assert_eq!(lark("`a_b<c>`"), "`a_b<c>`");
    assert_eq!(lark("`` a`b ``"), "`` a`b ``");
    assert_eq!(lark("````\n```\nx\n````"), "````\n```\nx\n````");
}

#[test]
fn lark_links_keep_safe_urls_and_encode_what_would_end_them() {
    assert_eq!(
        lark("[a **b** & c](https://x.io/a_(b)?q=1&r=2) <https://y.io> [z](javascript:x)"),
        "[a b &amp; c](https://x.io/a_%28b%29?q=1&r=2) [https://y.io](https://y.io) z"
    );
    assert_eq!(
        lark("<me@example.com>"),
        "[me@example.com](mailto:me@example.com)"
    );
}

#[test]
fn lark_blocks_headings_lists_quotes_code_and_tables() {
    assert_eq!(
        lark("## Title\n\n- one\n- two\n  1. a\n  2. **b**\n\n> quoted\n> on\n>\n> more\n\n---"),
        "**Title**\n\n- one\n- two\n  1. a\n  2. **b**\n\n> quoted\n> on\n> more\n\n———"
    );
    assert_eq!(
        lark("```rust\nif a < b && c {\n}\n```"),
        "```rust\nif a < b && c {\n}\n```"
    );
    assert_eq!(lark("```a\"b\nx\n```"), "```\nx\n```");
    assert_eq!(
        lark("| a | bb |\n|---|---|\n| c<d | e |"),
        "```\na   | bb\n----+---\nc<d | e\n```"
    );
}

#[test]
fn lark_code_block_across_a_chunk_boundary_is_closed_and_reopened() {
    let markdown = "Intro.\n\n```sh\necho one & two\necho three\necho four\n```";
    let chunks = lark_chunks(markdown, Limit::Bytes(32));
    assert_eq!(
        chunks,
        [
            "Intro.",
            "```sh\necho one & two\n```",
            "```sh\necho three\necho four\n```"
        ]
    );
    // A long answer at Feishu's card budget: every chunk fits and keeps its fences paired.
    let long = long_answer();
    let chunks = lark_chunks(&long, Limit::Bytes(4000));
    assert!(chunks.len() >= 3, "{} chunks", chunks.len());
    for chunk in &chunks {
        assert!(chunk.len() <= 4000);
        assert_eq!(chunk.matches("```").count() % 2, 0, "{chunk:?}");
        assert!(!chunk.ends_with("&#4") && !chunk.ends_with("&am"));
    }
}

// ---- Discord Markdown goldens ----

fn discord(markdown: &str) -> String {
    concat(&DiscordMarkdown.render(&Document::parse(markdown)))
}

fn discord_chunks(markdown: &str, limit: Limit) -> Vec<String> {
    antler_channel::render::parts(markdown, &DiscordMarkdown, limit).unwrap()
}

#[test]
fn discord_keeps_markdown_mostly_as_it_is() {
    assert_eq!(
        discord("*very **bold** move* and ~~gone~~ and `x < y`"),
        "*very **bold** move* and ~~gone~~ and `x < y`"
    );
    assert_eq!(
        discord("# Deploy\n\n## Then **now**\n\n#### Small"),
        "# Deploy\n\n## Then **now**\n\n**Small**"
    );
    assert_eq!(
        discord("- one\n- two\n  1. a\n\n> quoted\n> on\n\n---"),
        "- one\n- two\n  1. a\n\n> quoted\n> on\n\n———"
    );
    assert_eq!(
        discord("[docs **here**](https://x.io/a_(b)) [z](javascript:x)"),
        "[docs here](https://x.io/a_%28b%29) z"
    );
    assert_eq!(
        discord("```rust\nlet a = b * c_d;\n```"),
        "```rust\nlet a = b * c_d;\n```"
    );
    assert_eq!(
        discord("| a | bb |\n|---|---|\n| c | e |"),
        "```\na | bb\n--+---\nc | e\n```"
    );
}

#[test]
fn a_code_block_in_a_quote_starts_at_the_margin() {
    // Found by the `render_discord` fuzz target: `> ```` opens no code block on Discord (or
    // in Slack), so the fence showed as text and the closing one opened a block.
    assert_eq!(
        discord("> ```sh\n> ls -l\n> ```\n>\n> after"),
        "```sh\nls -l\n```\n> after"
    );
    assert_eq!(
        discord("> before\n>\n> ```\n> x\n> ```"),
        "> before\n```\nx\n```"
    );
}

#[test]
fn discord_escapes_what_would_format_with_a_backslash_atom() {
    assert_eq!(
        discord("snake_case \\*x\\* a\\|b <@123> \\~s\\~ \\`c\\` \\[l\\] back\\\\slash"),
        "snake\\_case \\*x\\* a\\|b \\<@123\\> \\~s\\~ \\`c\\` \\[l\\] back\\\\slash"
    );
    // Line-start markers are escaped only at the start of a line.
    assert_eq!(discord("\\# not a heading"), "\\# not a heading");
    assert_eq!(discord("a # b - c + d"), "a # b - c + d");
    assert_eq!(discord("x  \n\\- y"), "x\n\\- y");
    assert_eq!(
        DiscordMarkdown.render(&Document::parse("a*b")),
        [
            Token::Text("a".into()),
            Token::Atom("\\*".into()),
            Token::Text("b".into())
        ]
    );
    // An escape is never split from its character.
    assert_eq!(discord_chunks("abc *d", Limit::Chars(5)), ["abc", "\\*d"]);
}

#[test]
fn discord_chunks_fit_2000_characters_and_close_their_code_blocks() {
    let markdown = "Intro.\n\n```sh\necho one\necho two\necho three\n```";
    assert_eq!(
        discord_chunks(markdown, Limit::Chars(30)),
        [
            "Intro.",
            "```sh\necho one\necho two\n```",
            "```sh\necho three\n```"
        ]
    );
    let long = long_answer();
    let chunks = discord_chunks(&long, Limit::Chars(2000));
    assert!(chunks.len() >= 3, "{} chunks", chunks.len());
    for chunk in &chunks {
        assert!(chunk.chars().count() <= 2000);
        assert_eq!(chunk.matches("```").count() % 2, 0, "{chunk:?}");
        assert!(!chunk.ends_with('\\'), "an escape split: {chunk:?}");
    }
}

/// Bot API, Formatting options: bold, italic and strikethrough "can contain and can be part of
/// any other entities, except pre and code"; "blockquote [...] entities can't be nested"; "All
/// other entities can't contain each other".
#[test]
fn telegram_html_never_nests_what_the_bot_api_refuses() {
    assert_eq!(
        html("**run `make` now** [`docs`](https://e.com) ~~`old`~~ `free`"),
        "<b>run make now</b> <a href=\"https://e.com\">docs</a> <s>old</s> <code>free</code>"
    );
    assert_eq!(html("# The `x` flag"), "<b>The x flag</b>");
    assert_eq!(
        html("> outer\n>\n> > inner <b>\n\n> again"),
        "<blockquote>outer\ninner &lt;b&gt;</blockquote>\n\n<blockquote>again</blockquote>"
    );
}

#[test]
fn an_image_in_a_link_keeps_its_text_but_is_no_link_of_its_own() {
    // Found by the `render_telegram` fuzz target: `[a ![i](x)](y)` made an `<a>` inside an
    // `<a>`, which Telegram refuses ("Can't parse entities").
    let markdown = "[see ![i](http://x.test/i.png) here](https://y.test/run)";
    assert_eq!(
        html(markdown),
        "<a href=\"https://y.test/run\">see i here</a>"
    );
    assert!(!links_nest(&html(markdown)));
    assert_eq!(mrkdwn(markdown), "<https://y.test/run|see i here>");
    assert_eq!(discord(markdown), "[see i here](https://y.test/run)");
}

/// `<a>` inside `<a>`: what Telegram refuses here.
fn links_nest(html: &str) -> bool {
    let mut depth = 0i32;
    for (at, _) in html.match_indices('<') {
        if html[at..].starts_with("<a ") {
            depth += 1;
            if depth > 1 {
                return true;
            }
        } else if html[at..].starts_with("</a>") {
            depth -= 1;
        }
    }
    false
}

#[test]
fn a_code_block_opening_a_list_item_starts_at_the_margin() {
    // Found by the `render_discord` fuzz target: `- ```` opens no code block on Discord, so
    // the fence showed as text and the closing one opened a block left open.
    assert_eq!(
        discord("- ```\n  x\n  ```\n- next"),
        "- \n```\nx\n```\n- next"
    );
    assert_eq!(
        discord("1. first\n2.     indented code"),
        "1. first\n2. \n```\nindented code\n```"
    );
}

#[test]
fn a_quote_opening_a_list_item_starts_on_its_own_line() {
    // Found by the `render_slack` fuzz target: `• > ` is no quote in Slack, and the `>` was
    // written bare, where Slack wants `&gt;`.
    assert_eq!(
        mrkdwn("- > quoted\n  > more\n- next"),
        "• \n  > quoted\n  > more\n• next"
    );
    assert_eq!(discord("- > quoted"), "- \n  > quoted");
}

#[test]
fn a_quote_line_continued_in_the_next_chunk_keeps_its_marker_first() {
    // Found by the `render_slack` fuzz target: a span reopened in front of the quote's `> `
    // (`_> four_`) made the `>` a bare character and the line no quote.
    let markdown = "> _one two three\n> four five six_";
    assert_eq!(mrkdwn(markdown), "> _one two three\n> four five six_");
    assert_eq!(
        mrkdwn_chunks(markdown, Limit::Chars(20)),
        ["> _one two three_", "> _four five six_"]
    );
    // A list item's continuation indentation stays first as well.
    assert_eq!(
        discord_chunks("- **one two three\n  four five six**", Limit::Chars(22)),
        ["- **one two three**", "  **four five six**"]
    );
}

#[test]
fn a_code_block_resumed_on_an_indented_line_keeps_its_fence_at_the_margin() {
    // The indentation inside code is code, not a line prefix: the reopened fence comes first
    // (an earlier fix for the case above moved the spaces before it, which opened no block).
    let markdown = "```rust\nfn main() {\n    let a = 1;\n    let b = 2;\n}\n```";
    assert_eq!(
        discord_chunks(markdown, Limit::Chars(40)),
        [
            "```rust\nfn main() {\n    let a = 1;\n```",
            "```rust\n    let b = 2;\n}\n```"
        ]
    );
}

#[test]
fn a_link_whose_text_spans_lines_is_written_on_one_line() {
    // Found by the `render_slack` fuzz target: in a quote, the label's line break wrote the
    // quote's `> ` inside `<url|…>`, and that `>` ended the link early.
    // Raw HTML is literal text, so a tag may carry a line break into the label.
    let markdown = "> see [the <b\n> id=1> runbook](https://x.io/a) now";
    assert_eq!(
        mrkdwn(markdown),
        "> see <https://x.io/a|the &lt;b id=1&gt; runbook> now"
    );
    assert_eq!(
        discord(markdown),
        "> see [the \\<b id=1\\> runbook](https://x.io/a) now"
    );
}

#[test]
fn a_bare_slack_link_longer_than_a_message_is_split_into_links() {
    let url = format!("https://x.io/?q={}", "a&".repeat(30));
    let escaped = url.replace('&', "&amp;");
    assert_eq!(mrkdwn(&format!("<{url}>")), format!("<{escaped}>"));
    let chunks = mrkdwn_chunks(&format!("<{url}>"), Limit::Chars(50));
    assert!(chunks.len() > 1, "{chunks:?}");
    for chunk in &chunks {
        assert!(chunk.starts_with('<') && chunk.ends_with('>'), "{chunk:?}");
        assert_eq!(
            chunk.matches('&').count(),
            chunk.matches("&amp;").count(),
            "{chunk:?}"
        );
    }
    let joined: String = chunks.iter().map(|c| &c[1..c.len() - 1]).collect();
    assert_eq!(joined, escaped);
    // A space in an address would be a place to end a chunk inside the link: it is encoded.
    assert_eq!(mrkdwn("[x](<https://x.io/a b>)"), "<https://x.io/a%20b|x>");
}

#[test]
fn code_keeps_its_fence_and_long_backtick_runs_are_broken() {
    // Found by the `render_discord` fuzz target: at a limit too small for a code block's
    // fence, dropping the fence showed the code's own "```" as markup. Code keeps its markup
    // (the limit is refused instead), and a backtick run in code is broken after 15 with a
    // zero-width space, so no fence is longer than 16 backticks.
    let markdown = "````\n``` inside\n````";
    assert_eq!(
        discord_chunks(markdown, Limit::Chars(30)),
        ["````\n``` inside\n````"]
    );
    assert_eq!(
        chunk(
            &DiscordMarkdown.render(&Document::parse(markdown)),
            Limit::Chars(8)
        ),
        Err(ChunkError::LimitTooSmall {
            limit: Limit::Chars(8)
        })
    );
    let run = "`".repeat(40);
    let broken = format!("{0}\u{200B}{0}\u{200B}{1}", "`".repeat(15), "`".repeat(10));
    let fence = "`".repeat(16);
    let outer = "`".repeat(41);
    assert_eq!(
        discord(&format!("{outer}\n{run}\n{outer}")),
        format!("{fence}\n{broken}\n{fence}")
    );
    assert_eq!(
        discord(&format!("` {run} `")),
        format!("{fence} {broken} {fence}")
    );
}
