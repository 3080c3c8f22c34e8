//! Discord Markdown: every chunk at most the limit (2000 characters on the channel, a small
//! limit for splitting), spans balanced in each chunk, code blocks closed, and no text lost.
#![no_main]

use antler_channel::Channel;
use antler_channel::render::{DiscordMarkdown, Limit};
use antler_fuzz::{DISCORD, check_chunking, render_input};
use libfuzzer_sys::fuzz_target;

/// Every code block opened in a chunk is closed in it: a fence of N backticks is closed by a
/// line of at least N backticks alone (CommonMark).
fn check_fences(chunk: &str) {
    let mut open: Option<usize> = None;
    for line in chunk.lines() {
        let line = line.trim();
        let run = line.len() - line.trim_start_matches('`').len();
        match open {
            // An opening fence's info string holds no backtick (else it is inline code).
            None if run >= 3 && !line[run..].contains('`') => open = Some(run),
            Some(n) if run >= n && run == line.len() => open = None,
            _ => {}
        }
    }
    assert!(open.is_none(), "a code block left open in {chunk:?}");
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
