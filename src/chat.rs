//! `antler chat`: a terminal client of the API channel. Each line is posted with
//! `"stream": true` and the answer is printed as it streams in. A refused message or an
//! unreachable server is reported and the chat goes on; it ends on `/quit`, `/exit`, the end
//! of input or Ctrl-C at the prompt. `/stop` typed (or Ctrl-C pressed) while an answer streams
//! stops it at once: the printing ends and `/stop` goes to antler, which stops the turn; a
//! second Ctrl-C quits. Other lines typed meanwhile are sent once the answer is over.
//! Everything the server sends is sanitized before it reaches the terminal.
//!
//! `antler healthcheck`: one `GET /healthz`, for container health checks.

use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::mpsc;

use crate::logging::{escape_line, sanitize_for_terminal};

/// How long `antler chat` waits for a connection to antler.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long `antler healthcheck` waits for the whole answer.
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest server error text shown, in characters.
const SERVER_MESSAGE_MAX_CHARS: usize = 300;

/// The most of one SSE event `antler chat` holds while waiting for its end. A final answer
/// is far smaller; a stream past it is broken or hostile, so reading stops instead of
/// growing without bound.
const SSE_EVENT_MAX_BYTES: usize = 16 * 1024 * 1024;

/// Why the chat client stopped early.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The HTTP client could not be built.
    #[error("cannot set up the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    /// Reading the terminal failed.
    #[error("reading input: {0}")]
    Input(#[from] std::io::Error),
}

/// Why `antler healthcheck` failed.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    /// The HTTP client could not be built.
    #[error("cannot set up the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    /// No answer: nothing listening, a broken connection or the timeout.
    #[error("no answer from {url}: {reason}")]
    Unreachable {
        /// The health URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// An answer other than 200.
    #[error("{url} answered {status}")]
    Unhealthy {
        /// The health URL.
        url: String,
        /// The HTTP status.
        status: u16,
    },
}

/// Runs the interactive loop until `/quit`, `/exit` or the end of input.
pub async fn run(
    url: &str,
    token: Option<&str>,
    conversation: &str,
    user: Option<&str>,
) -> Result<(), ChatError> {
    let client = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .build()
        .map_err(ChatError::Client)?;
    let base = url.trim_end_matches('/');
    let mut session = Session {
        client,
        url: base,
        endpoint: format!("{base}/api/v1/messages"),
        token,
        conversation,
        user,
        thread: None,
    };
    let who = match user {
        Some(user) => escape_line(user),
        None if token.is_some() => "the token's user".to_owned(),
        None => "operator".to_owned(),
    };
    show(&format!(
        "antler chat: talking to {} in conversation {:?} as {who}.\n\
         Type a message and press Enter; /stop or Ctrl-C stops an answer; /quit, /exit, \
         Ctrl-D or Ctrl-C at the prompt leaves.\n",
        escape_line(base),
        escape_line(conversation),
    ));
    let mut input = Input {
        lines: stdin_lines(),
        waiting: VecDeque::new(),
        ended: false,
        interrupts: signal(SignalKind::interrupt())?,
    };
    loop {
        show("> ");
        let line = match input.waiting.pop_front() {
            Some(line) => Some(line),
            None if input.ended => None,
            None => tokio::select! {
                line = input.lines.recv() => line.transpose()?,
                _ = input.interrupts.recv() => {
                    show("\n");
                    return Ok(());
                }
            },
        };
        let Some(line) = line else {
            // End of input (Ctrl-D) arrives mid-prompt: end that line so the shell prompt
            // starts on its own.
            show("\n");
            return Ok(());
        };
        match line.trim() {
            "" => {}
            "/quit" | "/exit" => return Ok(()),
            text => session.send(text, &mut input).await?,
        }
    }
}

/// The terminal while a chat runs: typed lines and Ctrl-C.
struct Input {
    /// Lines from stdin, read on their own thread.
    lines: mpsc::Receiver<std::io::Result<String>>,
    /// Lines typed while an answer streamed, sent after it.
    waiting: VecDeque<String>,
    /// Whether stdin has ended.
    ended: bool,
    /// Ctrl-C (SIGINT), which no longer ends the process once this listens.
    interrupts: Signal,
}

/// What was typed during an answer.
enum Typed {
    /// `/stop` or Ctrl-C: stop the answer.
    Stop,
    /// Anything else: kept for later.
    Other,
}

impl Input {
    /// Waits for the next line or Ctrl-C while an answer streams; `None` when neither can
    /// come any more.
    async fn during_answer(&mut self) -> Result<Option<Typed>, ChatError> {
        if self.ended {
            let _ = self.interrupts.recv().await;
            return Ok(Some(Typed::Stop));
        }
        tokio::select! {
            line = self.lines.recv() => match line.transpose()? {
                Some(line) if matches!(line.trim(), "/stop" | "/cancel") => Ok(Some(Typed::Stop)),
                Some(line) => {
                    self.waiting.push_back(line);
                    Ok(Some(Typed::Other))
                }
                None => {
                    self.ended = true;
                    Ok(Some(Typed::Other))
                }
            },
            _ = self.interrupts.recv() => Ok(Some(Typed::Stop)),
        }
    }
}

/// Stdin's lines, read on a plain thread: a read in tokio's blocking pool cannot be cancelled
/// and would hold the process open after the chat ends until Enter is pressed.
fn stdin_lines() -> mpsc::Receiver<std::io::Result<String>> {
    let (sender, receiver) = mpsc::channel(16);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().split(b'\n') {
            let line = line.map(|bytes| String::from_utf8_lossy(&bytes).into_owned());
            if sender.blocking_send(line).is_err() {
                return;
            }
        }
    });
    receiver
}

/// Asks antler at `url` for `GET /healthz`; `Ok` only on HTTP 200 within [`HEALTH_TIMEOUT`].
pub async fn healthcheck(url: &str) -> Result<(), HealthError> {
    let target = format!("{}/healthz", url.trim_end_matches('/'));
    let client = reqwest::Client::builder()
        .timeout(HEALTH_TIMEOUT)
        // The check targets this host or container; a proxy from the environment would only
        // get in the way.
        .no_proxy()
        .build()
        .map_err(HealthError::Client)?;
    let response = client
        .get(&target)
        .send()
        .await
        .map_err(|e| HealthError::Unreachable {
            url: target.clone(),
            reason: failure_reason(&e, HEALTH_TIMEOUT),
        })?;
    match response.status() {
        reqwest::StatusCode::OK => Ok(()),
        status => Err(HealthError::Unhealthy {
            url: target,
            status: status.as_u16(),
        }),
    }
}

/// One chat: where it goes and what was shown already.
struct Session<'a> {
    client: reqwest::Client,
    url: &'a str,
    endpoint: String,
    token: Option<&'a str>,
    conversation: &'a str,
    /// Who to speak as; without it the server uses the token's user (or `operator`).
    user: Option<&'a str>,
    /// The thread id last shown.
    thread: Option<String>,
}

/// Whether an answer stream is over.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Done,
}

impl Session<'_> {
    /// Posts `text` and prints the answer; every failure is reported, none ends the chat.
    async fn send(&mut self, text: &str, input: &mut Input) -> Result<(), ChatError> {
        let Some(response) = self.post(text, true).await else {
            return Ok(());
        };
        self.print_answer(response, input).await
    }

    /// Posts `text` (streamed or not); a failure is reported and gives `None`.
    async fn post(&self, text: &str, stream: bool) -> Option<reqwest::Response> {
        let mut body = json!({
            "conversation": self.conversation,
            "text": text,
            "stream": stream,
        });
        if let Some(user) = self.user {
            body["user"] = json!(user);
        }
        let mut request = self.client.post(&self.endpoint).json(&body);
        if let Some(token) = self.token {
            request = request.bearer_auth(token);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => {
                warn(&format!(
                    "cannot reach antler at {}: {}",
                    escape_line(self.url),
                    failure_reason(&e, CONNECT_TIMEOUT)
                ));
                return None;
            }
        };
        let status = response.status().as_u16();
        if !response.status().is_success() {
            let body = response.text().await.unwrap_or_default();
            warn(&refusal(status, &body));
            return None;
        }
        Some(response)
    }

    /// Prints a `text/event-stream` answer until its `final` event, or until `/stop` or
    /// Ctrl-C stops it.
    async fn print_answer(
        &mut self,
        response: reqwest::Response,
        input: &mut Input,
    ) -> Result<(), ChatError> {
        let mut streamed = false;
        // Bytes, not text: a character may be split across two chunks.
        let mut blocks = SseBlocks::default();
        let mut body = response.bytes_stream();
        loop {
            let chunk = tokio::select! {
                chunk = body.next() => chunk,
                typed = input.during_answer() => {
                    if let Some(Typed::Stop) = typed? {
                        drop(body);
                        end_line(streamed);
                        show("[stopped]\n");
                        // antler stops the turn; its own note on it is not waited for.
                        let _ = self.post("/stop", false).await;
                        return Ok(());
                    }
                    continue;
                }
            };
            let Some(chunk) = chunk else { break };
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(e) => {
                    end_line(streamed);
                    warn(&format!(
                        "the answer from {} broke off: {}",
                        escape_line(self.url),
                        failure_reason(&e, CONNECT_TIMEOUT)
                    ));
                    return Ok(());
                }
            };
            blocks.push(&chunk);
            while let Some(block) = blocks.next_block() {
                let (event, data) = parse_block(&String::from_utf8_lossy(&block));
                let (text, flow) = self.on_event(&event, &data, &mut streamed);
                show(&text);
                if flow == Flow::Done {
                    return Ok(());
                }
            }
            if blocks.pending_len() > SSE_EVENT_MAX_BYTES {
                end_line(streamed);
                warn(&format!(
                    "the answer from {} sent an event over {} MiB; stopped reading it",
                    escape_line(self.url),
                    SSE_EVENT_MAX_BYTES >> 20
                ));
                return Ok(());
            }
        }
        end_line(streamed);
        warn("the answer stream ended before the final answer (is antler shutting down?)");
        Ok(())
    }

    /// What to print for one SSE event, and whether the answer is complete; unknown events
    /// print nothing.
    fn on_event(&mut self, event: &str, data: &str, streamed: &mut bool) -> (String, Flow) {
        let data = serde_json::from_str::<Value>(data).unwrap_or(Value::Null);
        let text = data.get("text").and_then(Value::as_str).unwrap_or_default();
        match event {
            "accepted" => {
                // Shown once per thread, quietly, so the user can look the thread up later.
                match data.get("thread_id").and_then(Value::as_str) {
                    Some(thread) if self.thread.as_deref() != Some(thread) => {
                        self.thread = Some(thread.to_owned());
                        (
                            format!("[thread {}]\n", escape_line(thread)),
                            Flow::Continue,
                        )
                    }
                    _ => (String::new(), Flow::Continue),
                }
            }
            "delta" => {
                *streamed = true;
                (sanitize_for_terminal(text), Flow::Continue)
            }
            // Streamed text already shows the answer; print the final only when nothing
            // streamed (commands, errors, non-streaming models).
            "final" if *streamed => ("\n".to_owned(), Flow::Done),
            "final" => (format!("{}\n", sanitize_for_terminal(text)), Flow::Done),
            _ => (String::new(), Flow::Continue),
        }
    }
}

/// What to tell the user about a non-2xx answer.
fn refusal(status: u16, body: &str) -> String {
    let message = server_message(body);
    if status == 401 {
        let message = message.unwrap_or_else(|| "missing or wrong API token".to_owned());
        return format!("antler answered 401: {message}; pass --token or set ANTLER_API_TOKEN");
    }
    match message {
        Some(message) => format!("antler answered {status}: {message}"),
        None => format!("antler answered {status}"),
    }
}

/// The server's error message (`{"error": {"message"}}`), else the body's text; shortened and
/// on one line.
fn server_message(body: &str) -> Option<String> {
    let parsed = serde_json::from_str::<Value>(body).ok();
    let message = parsed
        .as_ref()
        .and_then(|v| v.pointer("/error/message"))
        .and_then(Value::as_str)
        .unwrap_or(body)
        .trim();
    if message.is_empty() {
        return None;
    }
    let short: String = message.chars().take(SERVER_MESSAGE_MAX_CHARS).collect();
    let ellipsis = if short.len() < message.len() {
        "..."
    } else {
        ""
    };
    Some(format!("{}{ellipsis}", escape_line(&short)))
}

/// The root cause of a failed request, on one line (reqwest's own message repeats the URL).
fn failure_reason(error: &reqwest::Error, timeout: Duration) -> String {
    if error.is_timeout() {
        return format!("no answer within {} s", timeout.as_secs());
    }
    let mut cause: &(dyn std::error::Error + 'static) = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    escape_line(&cause.to_string())
}

/// A byte stream cut into SSE blocks (each ending in a blank line). Each byte is searched
/// once, however many network chunks a block arrives in.
#[derive(Debug, Default)]
pub(crate) struct SseBlocks {
    buffer: Vec<u8>,
    /// How much of `buffer` holds no block end.
    searched: usize,
}

impl SseBlocks {
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// How many bytes wait for their block's end.
    pub(crate) fn pending_len(&self) -> usize {
        self.buffer.len()
    }

    /// The next complete block, its blank line included.
    pub(crate) fn next_block(&mut self) -> Option<Vec<u8>> {
        // A block end's first `\n` may be the last byte searched.
        let from = self.searched.saturating_sub(1);
        let Some(at) = self.buffer[from..]
            .windows(2)
            .position(|pair| pair == b"\n\n")
        else {
            self.searched = self.buffer.len();
            return None;
        };
        self.searched = 0;
        Some(self.buffer.drain(..from + at + 2).collect())
    }
}

/// Splits one SSE block into its event name and joined data lines.
pub(crate) fn parse_block(block: &str) -> (String, String) {
    let mut event = String::from("message");
    let mut data = Vec::new();
    for line in block.lines() {
        if let Some(value) = line.strip_prefix("event:") {
            event = value.trim().to_owned();
        } else if let Some(value) = line.strip_prefix("data:") {
            data.push(value.strip_prefix(' ').unwrap_or(value));
        }
    }
    (event, data.join("\n"))
}

// `print!` panics when stdout is closed (`antler chat | head`); output that cannot be written
// is dropped instead.
fn show(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}

fn end_line(streamed: bool) {
    if streamed {
        show("\n");
    }
}

/// A problem, on stderr, after whatever stdout holds.
fn warn(text: &str) {
    let _ = std::io::stdout().lock().flush();
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> Session<'static> {
        Session {
            client: reqwest::Client::new(),
            url: "http://127.0.0.1:1",
            endpoint: String::new(),
            token: None,
            conversation: "c",
            user: Some("u"),
            thread: None,
        }
    }

    #[test]
    fn sse_blocks_split_into_event_and_data() {
        let (event, data) = parse_block("event: delta\ndata: {\"text\":\"hi\"}\n\n");
        assert_eq!(event, "delta");
        assert_eq!(data, "{\"text\":\"hi\"}");
        let (event, data) = parse_block(": keep-alive\n\n");
        assert_eq!((event.as_str(), data.as_str()), ("message", ""));
        let mut blocks = SseBlocks::default();
        blocks.push(b"data: x\n");
        assert_eq!(blocks.next_block(), None);
        assert_eq!(blocks.pending_len(), 8);
        blocks.push(b"\nrest\n");
        assert_eq!(blocks.next_block().as_deref(), Some(&b"data: x\n\n"[..]));
        assert_eq!(blocks.next_block(), None);
        blocks.push(b"\n");
        assert_eq!(blocks.next_block().as_deref(), Some(&b"rest\n\n"[..]));
    }

    #[test]
    fn refusals_carry_the_server_message_and_401_the_fix() {
        let body = r#"{"error":{"code":"unauthorized","message":"missing or wrong bearer token"}}"#;
        let text = refusal(401, body);
        assert!(
            text.starts_with("antler answered 401: missing or wrong bearer token"),
            "{text}"
        );
        assert!(
            text.contains("pass --token or set ANTLER_API_TOKEN"),
            "{text}"
        );
        let body = r#"{"error":{"code":"queue_full","message":"too many\nmessages \u001b[2J"}}"#;
        assert_eq!(
            refusal(503, body),
            "antler answered 503: too many\\nmessages \\x1b[2J"
        );
        assert_eq!(refusal(502, "  "), "antler answered 502");
        assert_eq!(
            refusal(500, "plain text"),
            "antler answered 500: plain text"
        );
        let long = "x".repeat(1000);
        assert_eq!(
            refusal(500, &long).len(),
            "antler answered 500: ".len() + SERVER_MESSAGE_MAX_CHARS + 3
        );
    }

    #[test]
    fn server_text_reaches_the_terminal_without_escape_sequences() {
        let mut session = session();
        let mut streamed = false;
        let mut shown = String::new();
        let mut event = |name: &str, data: Value| {
            let (text, flow) = session.on_event(name, &data.to_string(), &mut streamed);
            shown.push_str(&text);
            flow
        };
        let accepted = json!({"thread_id": "t1", "message_id": "m", "duplicate": false});
        assert_eq!(event("accepted", accepted.clone()), Flow::Continue);
        assert_eq!(event("accepted", accepted), Flow::Continue);
        // An escape sequence split across deltas, an OSC title change, BEL and a C1 CSI.
        for piece in ["evil \x1b", "]0;pwned\x07 \x1b[2J", "\u{9b}31m\tdone\nok"] {
            let data = json!({ "in_reply_to": "m", "text": piece });
            assert_eq!(event("delta", data), Flow::Continue);
        }
        assert_eq!(event("something-new", json!({"x": 1})), Flow::Continue);
        assert_eq!(
            event("final", json!({"text": "evil \x1b]0;pwned"})),
            Flow::Done
        );
        assert_eq!(
            shown,
            "[thread t1]\nevil \\x1b]0;pwned\\x07 \\x1b[2J\\u{9b}31m\tdone\nok\n"
        );
        assert!(!shown.contains(['\x1b', '\x07', '\u{9b}']), "{shown:?}");
    }

    #[test]
    fn a_final_without_deltas_is_printed_sanitized() {
        let mut session = session();
        let mut streamed = false;
        let data = json!({"text": "done \x1b[31mred"}).to_string();
        let (text, flow) = session.on_event("final", &data, &mut streamed);
        assert_eq!(flow, Flow::Done);
        assert_eq!(text, "done \\x1b[31mred\n");
    }
}
