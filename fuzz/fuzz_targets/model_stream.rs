//! The OpenAI-compatible model client reading a streamed answer and a non-streamed one: no
//! panic; a streamed answer's text passed to the delta sink is exactly its content, and does
//! not depend on how the stream is cut into network chunks.
#![no_main]

use antler::fuzzing::{model_completion, model_stream};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cuts, stream)) = data.split_first() else {
        return;
    };
    let whole = model_stream(&[stream]);
    if let Ok(answer) = &whole {
        assert_eq!(
            answer.deltas, answer.content,
            "deltas differ from the content"
        );
    }
    let size = usize::from(cuts % 16) + 1;
    let pieces: Vec<&[u8]> = stream.chunks(size).collect();
    assert_eq!(
        model_stream(&pieces),
        whole,
        "the answer depends on chunking"
    );
    let _ = model_completion(stream);
});
