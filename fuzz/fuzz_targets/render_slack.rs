//! Slack mrkdwn: every chunk at most the limit (4000 characters on the channel, a small limit
//! for splitting), spans balanced in each chunk, `&` only in `&amp;` `&lt;` `&gt;`, every `<`
//! closed by its `>` in the same chunk, and no text lost.
#![no_main]

use antler_channel::Channel;
use antler_channel::render::{Limit, SlackMrkdwn};
use antler_fuzz::{SLACK, check_chunking, render_input};
use libfuzzer_sys::fuzz_target;

/// Whether `before` ends in a line's start followed by quote markers only.
fn quote_prefix(before: &str) -> bool {
    let line = &before[before.rfind('\n').map_or(0, |at| at + 1)..];
    line.chars().all(|c| c == '>' || c == ' ')
}

fn check_mrkdwn(chunk: &str) {
    let mut inside = false;
    for (at, c) in chunk.char_indices() {
        match c {
            '&' => assert!(
                ["&amp;", "&lt;", "&gt;"]
                    .iter()
                    .any(|e| chunk[at..].starts_with(e)),
                "a bare '&' in {chunk:?}"
            ),
            '<' => {
                assert!(!inside, "a '<' inside a link in {chunk:?}");
                inside = true;
            }
            // A quote's `> ` (nested: `> > `) at the start of a line is markup.
            '>' if !inside && quote_prefix(&chunk[..at]) => {}
            '>' => {
                assert!(inside, "a stray '>' in {chunk:?}");
                inside = false;
            }
            _ => {}
        }
    }
    assert!(!inside, "a link left open in {chunk:?}");
}

fuzz_target!(|data: &[u8]| {
    let Some((limit, markdown)) = render_input(data) else {
        return;
    };
    check_chunking(&SlackMrkdwn, markdown, Limit::Chars(limit))
        .iter()
        .for_each(|chunk| check_mrkdwn(chunk));
    check_chunking(&SlackMrkdwn, markdown, Limit::Chars(4000));
    for chunk in SLACK.render(markdown).expect("renders at 4000") {
        assert!(chunk.chars().count() <= 4000);
        check_mrkdwn(&chunk);
    }
});
