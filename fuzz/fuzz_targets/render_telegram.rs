//! Telegram HTML: every chunk at most the limit (4096 UTF-16 units on the channel, a small
//! limit for splitting), valid Telegram HTML on its own (known tags, balanced, allowed nesting,
//! known entities), and the chunks' visible text the whole rendering's, modulo whitespace.
#![no_main]

use antler_channel::Channel;
use antler_channel::render::{Limit, TelegramHtml};
use antler_fuzz::{
    TELEGRAM, assert_no_text_lost, check_chunking, check_telegram_html, render_input, rendered,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((limit, markdown)) = render_input(data) else {
        return;
    };
    let whole = rendered(&TelegramHtml, markdown);
    for (chunks, max) in [
        (
            check_chunking(&TelegramHtml, markdown, Limit::Utf16(limit)),
            limit,
        ),
        (TELEGRAM.render(markdown).expect("renders at 4096"), 4096),
    ] {
        for chunk in &chunks {
            assert!(chunk.encode_utf16().count() <= max);
            check_telegram_html(chunk);
        }
        if !chunks.is_empty() {
            assert_no_text_lost(&chunks, &whole, check_telegram_html);
        }
    }
});
