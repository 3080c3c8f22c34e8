//! The stdio transport of an MCP server: rmcp's line transport over the child's pipes, with
//! stdout read through [`LimitedLines`], and a close that gives the child [`SHUTDOWN_WAIT`] to
//! exit before it is killed.
//!
//! rmcp drops a line (one JSON-RPC message) longer than its limit and keeps reading, so a call
//! whose result is too large would only end at its timeout. [`LimitedLines`] passes the server's
//! output through unchanged, notes the top-level `id` of each message as it goes by (without
//! keeping the message), and after a response rmcp drops it adds an error response with the
//! same id that names the limit ([`too_large_limit`] recognises it).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use rmcp::RoleClient;
use rmcp::model::ErrorData;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::AsyncRwTransport;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// How long a stdio server gets to exit once its stdin is closed, before it is killed.
pub(super) const SHUTDOWN_WAIT: Duration = Duration::from_secs(3);
/// The key in an error's `data` that marks a message dropped for its size; its value is the
/// limit in bytes.
const TOO_LARGE_KEY: &str = "antler_too_large";
/// JSON-RPC's "internal error" code, for the error response that stands in for a dropped one.
const INTERNAL_ERROR: i32 = -32603;
/// How much is read from the server's stdout at once.
const READ_CHUNK: usize = 8 * 1024;
/// An id longer than this (as JSON text) is not taken: JSON-RPC ids are short.
const MAX_ID_BYTES: usize = 128;

/// The limit named by an error response [`LimitedLines`] made for a message it saw dropped.
pub(super) fn too_large_limit(error: &ErrorData) -> Option<u64> {
    error.data.as_ref()?.get(TOO_LARGE_KEY)?.as_u64()
}

/// A stdio MCP server: its process and rmcp's line transport over its pipes.
pub(super) struct ChildTransport {
    child: Child,
    server: String,
    inner: AsyncRwTransport<RoleClient, LimitedLines<ChildStdout>, ChildStdin>,
}

impl ChildTransport {
    /// The transport of `child`, whose stdin and stdout must be piped; messages longer than
    /// `limit` bytes are dropped, a dropped response answered with a "too large" error.
    pub(super) fn new(mut child: Child, server: &str, limit: usize) -> io::Result<Self> {
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| io::Error::other("the server's stdout is not piped"))?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| io::Error::other("the server's stdin is not piped"))?;
        let inner = AsyncRwTransport::new_client(LimitedLines::new(stdout, server, limit), stdin)
            .with_max_line_length(limit);
        Ok(Self {
            child,
            server: server.to_owned(),
            inner,
        })
    }
}

impl Transport<RoleClient> for ChildTransport {
    type Error = io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.inner.receive()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        // A closed stdin is how MCP asks a stdio server to stop.
        let closed = self.inner.close().await;
        match tokio::time::timeout(SHUTDOWN_WAIT, self.child.wait()).await {
            Ok(Ok(status)) => {
                tracing::debug!(server = %self.server, %status, "MCP server exited");
            }
            Ok(Err(e)) => {
                tracing::debug!(server = %self.server, error = %e, "waiting for the MCP server failed");
            }
            Err(_) => self.child.kill().await?,
        }
        closed
    }
}

/// A stdio server's stdout as rmcp's line transport reads it: passed on unchanged, except that
/// after a line of more than `limit` bytes (the newline included, as rmcp counts; rmcp drops
/// such a line) that was a response, an error response with its id follows.
pub(super) struct LimitedLines<R> {
    inner: R,
    server: String,
    limit: usize,
    /// Bytes of the current line so far, its newline not included.
    line_len: usize,
    scan: IdScan,
    /// Bytes read from `inner` (and any error line) not yet passed on.
    out: Vec<u8>,
    /// How much of `out` was passed on.
    at: usize,
}

impl<R> LimitedLines<R> {
    pub(super) fn new(inner: R, server: &str, limit: usize) -> Self {
        Self {
            inner,
            server: server.to_owned(),
            limit,
            line_len: 0,
            scan: IdScan::default(),
            out: Vec::new(),
            at: 0,
        }
    }

    /// Takes bytes just read: they go to `out`, each oversized response followed by its error.
    fn take(&mut self, mut bytes: &[u8]) {
        while let Some(end) = bytes.iter().position(|&b| b == b'\n') {
            let (line, rest) = bytes.split_at(end + 1);
            self.scan.feed(&line[..end]);
            self.out.extend_from_slice(line);
            let oversized = self.line_len.saturating_add(line.len()) > self.limit;
            let scan = std::mem::take(&mut self.scan);
            let length = self.line_len.saturating_add(end);
            self.line_len = 0;
            bytes = rest;
            if oversized {
                match scan.error_response(self.limit) {
                    Some(error) => {
                        tracing::warn!(server = %self.server, bytes = length, limit = self.limit, "an MCP result over the message limit was dropped");
                        self.out.extend_from_slice(&error);
                    }
                    None => {
                        tracing::warn!(server = %self.server, bytes = length, limit = self.limit, "an MCP message over the message limit was dropped");
                    }
                }
            }
        }
        self.scan.feed(bytes);
        self.line_len = self.line_len.saturating_add(bytes.len());
        self.out.extend_from_slice(bytes);
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for LimitedLines<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.at >= this.out.len() {
            this.out.clear();
            this.at = 0;
            let mut chunk = [0u8; READ_CHUNK];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            // Nothing read is the end of the stream, passed on as such.
            this.take(read.filled());
        }
        let n = buf.remaining().min(this.out.len() - this.at);
        buf.put_slice(&this.out[this.at..this.at + n]);
        this.at += n;
        Poll::Ready(Ok(()))
    }
}

/// What a top-level key of a message is, as far as [`IdScan`] cares.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Key {
    #[default]
    Other,
    Id,
    Method,
}

/// Follows one JSON-RPC message byte by byte, keeping only its top-level `id` (as JSON text)
/// and whether it has a top-level `method` (a request or notification, not a response).
#[derive(Debug, Default)]
struct IdScan {
    /// Nesting: 1 inside the top-level object.
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// Whether the next string at depth 1 is a key.
    expect_key: bool,
    /// The first bytes of the key being read at depth 1.
    key: Option<Vec<u8>>,
    /// The last key read at depth 1, until its `:`.
    last_key: Key,
    /// The id's value while it is read.
    value: Option<Vec<u8>>,
    id: Option<Vec<u8>>,
    has_method: bool,
    /// Nothing more to learn: the message ended, or is no object, or its id is no scalar.
    over: bool,
}

impl IdScan {
    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.over {
                return;
            }
            self.push(b);
        }
    }

    /// One byte inside a string (escapes followed); whether it closed the string.
    fn string_byte(&mut self, b: u8) -> bool {
        if self.escaped {
            self.escaped = false;
        } else if b == b'\\' {
            self.escaped = true;
        } else if b == b'"' {
            self.in_string = false;
            return true;
        }
        false
    }

    fn push(&mut self, b: u8) {
        if let Some(value) = &mut self.value {
            if self.in_string || !matches!(b, b',' | b'}') {
                if matches!(b, b'{' | b'[') && !self.in_string {
                    self.over = true;
                    return;
                }
                value.push(b);
                if value.len() > MAX_ID_BYTES {
                    self.over = true;
                    return;
                }
                if self.in_string {
                    self.string_byte(b);
                } else if b == b'"' {
                    self.in_string = true;
                }
                return;
            }
            // The `,` or `}` after the id ends it, and counts below as well.
            self.id = self.value.take();
        }
        if self.in_string {
            if self.string_byte(b) {
                if let Some(key) = self.key.take() {
                    self.last_key = match key.as_slice() {
                        b"id" => Key::Id,
                        b"method" => Key::Method,
                        _ => Key::Other,
                    };
                }
            }
            if let Some(key) = &mut self.key {
                // Only `id` and `method` matter: the first bytes tell them apart.
                if key.len() <= b"method".len() {
                    key.push(b);
                }
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.key = Some(Vec::new());
                    self.expect_key = false;
                }
            }
            b'{' => {
                self.depth += 1;
                if self.depth == 1 {
                    self.expect_key = true;
                }
            }
            b'[' if self.depth == 0 => self.over = true,
            b'[' => self.depth += 1,
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 0 {
                    self.over = true;
                }
            }
            b',' if self.depth == 1 => self.expect_key = true,
            b':' if self.depth == 1 => {
                match self.last_key {
                    Key::Id => self.value = Some(Vec::new()),
                    Key::Method => self.has_method = true,
                    Key::Other => {}
                }
                self.last_key = Key::Other;
            }
            b if self.depth == 0 && !b.is_ascii_whitespace() => self.over = true,
            _ => {}
        }
    }

    /// The error response (a line) for this message, dropped for being over `limit` bytes:
    /// `None` unless it was a response with a number or string id.
    fn error_response(&self, limit: usize) -> Option<Vec<u8>> {
        if self.has_method {
            return None;
        }
        let id: serde_json::Value = serde_json::from_slice(self.id.as_deref()?).ok()?;
        if !(id.is_number() || id.is_string()) {
            return None;
        }
        let error = serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {
                "code": INTERNAL_ERROR,
                "message": format!("the message is larger than the limit of {limit} bytes"),
                "data": { TOO_LARGE_KEY: limit },
            },
        });
        let mut line = serde_json::to_vec(&error).ok()?;
        line.push(b'\n');
        Some(line)
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::ServerJsonRpcMessage;
    use tokio::io::AsyncWriteExt;

    use super::*;

    fn scan(text: &str) -> IdScan {
        let mut scan = IdScan::default();
        scan.feed(text.as_bytes());
        scan
    }

    #[test]
    fn the_top_level_id_of_a_response_is_found_wherever_it_is() {
        for (text, id) in [
            (r#"{"jsonrpc":"2.0","id":7,"result":{"id":99}}"#, "7"),
            // Node's SDK writes the result first.
            (
                r#"{"result":{"content":[{"id":"x","text":"a\"}, \"id\":5"}]},"jsonrpc":"2.0","id":12}"#,
                "12",
            ),
            (r#" { "id" : "req-1" , "result" : [] } "#, r#""req-1""#),
            (r#"{"result":{},"id":"a,}b"}"#, r#""a,}b""#),
        ] {
            let found = scan(text);
            assert_eq!(
                found
                    .id
                    .as_deref()
                    .map(|id| String::from_utf8_lossy(id).trim().to_owned()),
                Some(id.to_owned()),
                "{text}"
            );
            assert!(!found.has_method, "{text}");
        }
        assert!(scan(r#"{"method":"ping","id":3}"#).has_method);
        assert!(scan(r#"{"params":{"method":"x"},"id":3}"#).id.is_some());
        assert!(!scan(r#"{"params":{"method":"x"},"id":3}"#).has_method);
        assert_eq!(scan(r#"{"result":{"id":1}}"#).id, None);
        assert_eq!(scan(r#"[{"id":1}]"#).id, None);
    }

    #[test]
    fn only_responses_with_a_scalar_id_get_an_error() {
        let error = scan(r#"{"jsonrpc":"2.0","id":4,"result":{}}"#)
            .error_response(100)
            .unwrap();
        let error: serde_json::Value = serde_json::from_slice(&error).unwrap();
        assert_eq!(error["id"], 4);
        assert_eq!(error["error"]["data"][TOO_LARGE_KEY], 100);
        assert!(
            scan(r#"{"jsonrpc":"2.0","id":4,"method":"sampling/createMessage"}"#)
                .error_response(100)
                .is_none()
        );
        assert!(
            scan(r#"{"id":{"a":1},"result":{}}"#)
                .error_response(100)
                .is_none()
        );
        assert!(
            scan(r#"{"id":null,"result":{}}"#)
                .error_response(100)
                .is_none()
        );
        let long = format!(r#"{{"id":"{}","result":{{}}}}"#, "x".repeat(MAX_ID_BYTES));
        assert!(scan(&long).error_response(100).is_none());
    }

    fn response(id: u32, text_len: usize) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"{}"}}]}}}}"#,
            "x".repeat(text_len)
        )
    }

    #[tokio::test]
    async fn a_response_over_the_limit_becomes_a_too_large_error_and_the_rest_flows() {
        let limit = 200;
        // The first line fits exactly (its newline included), the second is one byte over.
        let fits = {
            let base = response(1, 0).len() + 1;
            response(1, limit - base)
        };
        assert_eq!(fits.len() + 1, limit);
        let over = response(2, limit - response(2, 0).len());
        assert_eq!(over.len() + 1, limit + 1);
        let after = response(3, 5);
        let (mut server, client) = tokio::io::duplex(64);
        let (_unused_read, write) = tokio::io::duplex(64);
        let mut transport: AsyncRwTransport<RoleClient, _, _> =
            AsyncRwTransport::new_client(LimitedLines::new(client, "t", limit), write)
                .with_max_line_length(limit);
        let feed = tokio::spawn(async move {
            let text = format!("{fits}\n{over}\n{after}\n");
            // Small writes: lines cross the reader's chunks.
            for piece in text.as_bytes().chunks(37) {
                server.write_all(piece).await.unwrap();
            }
        });
        let mut received = Vec::new();
        for _ in 0..3 {
            received.push(transport.receive().await.unwrap());
        }
        feed.await.unwrap();
        assert!(transport.receive().await.is_none(), "then the stream ends");
        let [first, second, third] = received.as_slice() else {
            panic!("{received:?}");
        };
        assert!(
            matches!(first, ServerJsonRpcMessage::Response(r) if r.id == rmcp::model::NumberOrString::Number(1)),
            "{first:?}"
        );
        match second {
            ServerJsonRpcMessage::Error(e) => {
                assert_eq!(e.id, Some(rmcp::model::NumberOrString::Number(2)));
                assert_eq!(too_large_limit(&e.error), Some(limit as u64));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(third, ServerJsonRpcMessage::Response(r) if r.id == rmcp::model::NumberOrString::Number(3)),
            "{third:?}"
        );
    }
}
