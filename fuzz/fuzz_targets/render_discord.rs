//! Discord Markdown: every chunk at most the limit (2000 characters on the channel, a small
//! limit for splitting), spans balanced in each chunk, code fences paired, and no text lost.
#![no_main]

use antler_channel::Channel;
use antler_channel::render::{DiscordMarkdown, Limit};
use antler_fuzz::{DISCORD, check_chunking, render_input};
use libfuzzer_sys::fuzz_target;

/// Every code block opened in a chunk is closed in it: fence lines come in pairs.
fn check_fences(chunk: &str) {
    let fences = chunk
        .lines()
        .filter(|line| line.trim_start().starts_with("```"))
        .count();
    assert!(fences % 2 == 0, "an unpaired code fence in {chunk:?}");
}

fuzz_target!(|data: &[u8]| {
    let Some((limit, markdown)) = render_input(data) else {
        return;
    };
    check_chunking(&DiscordMarkdown, markdown, Limit::Chars(limit))
        .iter()
        .for_each(|chunk| check_fences(chunk));
    check_chunking(&DiscordMarkdown, markdown, Limit::Chars(2000));
    for chunk in DISCORD.render(markdown).expect("renders at 2000") {
        assert!(chunk.chars().count() <= 2000);
        check_fences(&chunk);
    }
});
