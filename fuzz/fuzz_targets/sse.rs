//! The server-sent event parsers: the model client's and `antler chat`'s. However a stream is
//! cut into network chunks, the events read are the same as from the whole stream.
#![no_main]

use antler::fuzzing::{chat_sse_events, model_sse_events};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cuts, stream)) = data.split_first() else {
        return;
    };
    // Cut points from the first byte: pieces of 1 to 32 bytes, cycling.
    let mut pieces: Vec<&[u8]> = Vec::new();
    let mut rest = stream;
    let mut step = 0u32;
    while !rest.is_empty() {
        let size = usize::from((cuts.rotate_left(step) & 31) + 1).min(rest.len());
        pieces.push(&rest[..size]);
        rest = &rest[size..];
        step += 1;
    }
    let whole = model_sse_events(&[stream]);
    let cut = model_sse_events(&pieces);
    assert_eq!(whole, cut, "the model stream's events depend on chunking");
    assert_eq!(
        chat_sse_events(&[stream]),
        chat_sse_events(&pieces),
        "the chat stream's events depend on chunking"
    );
});
