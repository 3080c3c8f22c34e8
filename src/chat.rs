//! `antler chat`: a terminal client of the API channel. Each line is posted with
//! `"stream": true` and the answer is printed as it streams in.

use std::io::Write;

use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Why the chat client stopped.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The server could not be reached or broke the connection.
    #[error("cannot reach antler at {url}: {source}")]
    Http {
        /// The base URL.
        url: String,
        /// The cause.
        #[source]
        source: reqwest::Error,
    },
    /// The server refused the message.
    #[error("antler answered {status}: {body}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The error body.
        body: String,
    },
    /// Reading the terminal failed.
    #[error("reading input: {0}")]
    Input(#[from] std::io::Error),
}

/// Runs the interactive loop until end of input.
pub async fn run(
    url: &str,
    token: Option<&str>,
    conversation: &str,
    user: &str,
) -> Result<(), ChatError> {
    let client = reqwest::Client::new();
    let endpoint = format!("{}/api/v1/messages", url.trim_end_matches('/'));
    let http = |source| ChatError::Http {
        url: url.to_owned(),
        source,
    };
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    prompt();
    while let Some(line) = lines.next_line().await? {
        let text = line.trim();
        if text.is_empty() {
            prompt();
            continue;
        }
        let mut request = client.post(&endpoint).json(&json!({
            "conversation": conversation,
            "user": user,
            "text": text,
            "stream": true,
        }));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(http)?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(ChatError::Refused {
                status: status.as_u16(),
                body,
            });
        }
        let mut streamed = false;
        let mut buffer = String::new();
        let mut body = response.bytes_stream();
        'stream: while let Some(chunk) = body.next().await {
            buffer.push_str(&String::from_utf8_lossy(&chunk.map_err(http)?));
            while let Some(end) = buffer.find("\n\n") {
                let block: String = buffer.drain(..end + 2).collect();
                let (event, data) = parse_block(&block);
                let text = serde_json::from_str::<Value>(&data)
                    .ok()
                    .and_then(|v| v.get("text").and_then(Value::as_str).map(str::to_owned))
                    .unwrap_or_default();
                match event.as_str() {
                    "delta" => {
                        streamed = true;
                        print!("{text}");
                        let _ = std::io::stdout().flush();
                    }
                    "final" => {
                        // Streamed text already shows the answer; print the final only when
                        // nothing streamed (commands, errors, non-streaming models).
                        if streamed {
                            println!();
                        } else {
                            println!("{text}");
                        }
                        break 'stream;
                    }
                    _ => {}
                }
            }
        }
        prompt();
    }
    Ok(())
}

fn prompt() {
    print!("> ");
    let _ = std::io::stdout().flush();
}

/// Splits one SSE block into its event name and joined data lines.
fn parse_block(block: &str) -> (String, String) {
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

#[cfg(test)]
mod tests {
    use super::parse_block;

    #[test]
    fn sse_blocks_split_into_event_and_data() {
        let (event, data) = parse_block("event: delta\ndata: {\"text\":\"hi\"}\n\n");
        assert_eq!(event, "delta");
        assert_eq!(data, "{\"text\":\"hi\"}");
        let (event, data) = parse_block(": keep-alive\n\n");
        assert_eq!((event.as_str(), data.as_str()), ("message", ""));
    }
}
