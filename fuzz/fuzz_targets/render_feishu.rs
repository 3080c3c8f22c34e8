//! Feishu: card Markdown (25,000 bytes on the channel) and plain text (30,000 bytes), and
//! both at a small limit for splitting: every chunk within the limit, spans balanced in each
//! chunk, no text lost (plain text: the chunks are the whole text, modulo whitespace).
#![no_main]

use antler_channel::Channel;
use antler_channel::render::{FeishuMarkdown, Limit, PlainText};
use antler_fuzz::{
    FEISHU_ENCRYPTED, FEISHU_PLAIN, assert_no_text_lost, check_chunking, render_input, rendered,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((limit, markdown)) = render_input(data) else {
        return;
    };
    check_chunking(&FeishuMarkdown, markdown, Limit::Bytes(limit));
    let plain = check_chunking(&PlainText, markdown, Limit::Bytes(limit));
    if !plain.is_empty() {
        assert_no_text_lost(&plain, &rendered(&PlainText, markdown), str::to_owned);
    }
    for chunk in FEISHU_ENCRYPTED.render(markdown).expect("renders as cards") {
        assert!(chunk.len() <= 25_000);
    }
    let texts = FEISHU_PLAIN.render(markdown).expect("renders as text");
    for chunk in &texts {
        assert!(chunk.len() <= 30_000);
    }
    if !texts.is_empty() {
        assert_no_text_lost(&texts, &rendered(&PlainText, markdown), str::to_owned);
    }
});
