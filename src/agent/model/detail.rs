//! Provider error text made fit for a log line and a chat reply: the message and code pulled
//! out of the error JSON, key-like words masked, one line, shortened on a word boundary.

use serde_json::Value;

/// The longest provider message kept, in characters (plus the `…`).
pub(super) const DETAIL_MAX_CHARS: usize = 200;

/// What a provider said about an error, before masking.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct ProviderError {
    /// The human-readable message (may be empty).
    pub(super) message: String,
    /// The HTTP status the error's `code` names (`"429"` or `429`), if it names one.
    pub(super) status: Option<u16>,
    /// The machine-readable code when it is not a status (`context_length_exceeded`,
    /// `insufficient_quota` ...), else the error's `type`; lowercase.
    pub(super) code: Option<String>,
}

impl ProviderError {
    /// Reads an error body: JSON in the shapes providers use (`{"error": {"message", "code",
    /// "type"}}`, `{"error": "text"}`, `{"detail": ...}`, `{"message": ...}`, a one-element
    /// array of those), an HTML page (its title), or plain text.
    pub(super) fn from_body(body: &str) -> Self {
        let trimmed = body.trim();
        if let Ok(value) = serde_json::from_str::<Value>(trimmed) {
            return Self::from_value(&value);
        }
        if trimmed.starts_with('<') {
            return Self {
                message: html_title(trimmed).unwrap_or_default(),
                ..Self::default()
            };
        }
        Self {
            message: trimmed.to_owned(),
            ..Self::default()
        }
    }

    /// Reads a parsed error: the whole body, or the `error` member of a stream chunk.
    pub(super) fn from_value(value: &Value) -> Self {
        let value = match value {
            Value::Array(items) => items.first().unwrap_or(&Value::Null),
            other => other,
        };
        let error = value.get("error").unwrap_or(value);
        let message = match error {
            Value::String(text) => text.clone(),
            _ => ["message", "detail", "error_description"]
                .iter()
                .find_map(|key| error.get(key).or_else(|| value.get(key)))
                .map(|m| match m {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                })
                .unwrap_or_default(),
        };
        let mut status = None;
        let mut code = None;
        match error.get("code") {
            Some(Value::Number(n)) => status = n.as_u64().and_then(as_status),
            Some(Value::String(text)) => match text.trim().parse::<u64>() {
                Ok(n) => status = as_status(n),
                Err(_) => code = meaningful(text),
            },
            _ => {}
        }
        if code.is_none() {
            code = error
                .get("type")
                .and_then(Value::as_str)
                .and_then(meaningful);
        }
        Self {
            message,
            status,
            code,
        }
    }
}

/// A code that says something: not empty, not Python's `None` (LiteLLM sends `"None"`).
fn meaningful(text: &str) -> Option<String> {
    let text = text.trim();
    (!text.is_empty() && !text.eq_ignore_ascii_case("none") && !text.eq_ignore_ascii_case("null"))
        .then(|| text.to_ascii_lowercase())
}

fn as_status(n: u64) -> Option<u16> {
    u16::try_from(n).ok().filter(|n| (100..=599).contains(n))
}

/// The text of an HTML page's `<title>`.
fn html_title(html: &str) -> Option<String> {
    let lower = html.to_ascii_lowercase();
    let start = lower.find("<title>")? + "<title>".len();
    let end = start + lower.get(start..)?.find("</title>")?;
    let title = html.get(start..end)?.trim();
    (!title.is_empty()).then(|| title.to_owned())
}

/// One line, key-like words masked, at most [`DETAIL_MAX_CHARS`] characters cut at a word
/// boundary and ended with `…`. The caller masks its own API key first.
pub(super) fn tidy(text: &str) -> String {
    let mut line = String::with_capacity(text.len().min(4 * DETAIL_MAX_CHARS));
    let mut mask_next = false;
    for word in text.split_whitespace() {
        if !line.is_empty() {
            line.push(' ');
        }
        if mask_next {
            line.push_str("***");
        } else {
            line.push_str(&mask_word(word));
        }
        mask_next = word.eq_ignore_ascii_case("bearer");
        // Enough to cut from; the rest would be thrown away.
        if line.len() > 8 * DETAIL_MAX_CHARS {
            break;
        }
    }
    shorten(&line, DETAIL_MAX_CHARS)
}

/// A word with a key-like core (`sk-...`, `xoxb-...`, `ghp_...`) masked; punctuation around it
/// is kept.
fn mask_word(word: &str) -> String {
    let core = word.trim_matches(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_'));
    let key_like = core.len() >= 12
        && [
            "sk-", "sk_", "xoxb-", "xoxp-", "ghp_", "gsk_", "hf_", "AIza",
        ]
        .iter()
        .any(|prefix| core.starts_with(prefix));
    if key_like {
        word.replacen(core, "***", 1)
    } else {
        word.to_owned()
    }
}

/// Cuts `text` to at most `max` characters at a word boundary, ending it with `…`.
pub(super) fn shorten(text: &str, max: usize) -> String {
    let Some((cut, _)) = text.char_indices().nth(max) else {
        return text.to_owned();
    };
    let head = &text[..cut];
    let at_boundary = text[cut..].starts_with(char::is_whitespace);
    let head = match head.rfind(char::is_whitespace) {
        Some(space) if !at_boundary && space > 0 => &head[..space],
        // One word longer than the limit: it is cut, there is no better place.
        _ => head,
    };
    let head = head.trim_end_matches(|c: char| c.is_whitespace() || ",;:.-".contains(c));
    format!("{head}…")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn error_shapes_of_the_common_providers() {
        // OpenAI.
        let openai = ProviderError::from_body(
            r#"{"error": {"message": "This model's maximum context length is 8192 tokens.", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}"#,
        );
        assert_eq!(
            openai.message,
            "This model's maximum context length is 8192 tokens."
        );
        assert_eq!(openai.code.as_deref(), Some("context_length_exceeded"));
        assert_eq!(openai.status, None);
        // LiteLLM proxy: the status as a string code, `"None"` for absent fields.
        let litellm = ProviderError::from_value(&json!({"error": {
            "message": "No api key passed in.", "type": "auth_error", "param": "None", "code": "401"
        }}));
        assert_eq!(litellm.status, Some(401));
        assert_eq!(litellm.code.as_deref(), Some("auth_error"));
        let numeric = ProviderError::from_value(&json!({"message": "slow down", "code": 429}));
        assert_eq!(numeric.status, Some(429));
        assert_eq!(numeric.message, "slow down");
        let none = ProviderError::from_value(&json!({"error": {"message": "x", "type": "None"}}));
        assert_eq!(none.code, None);
        // Ollama, FastAPI (vLLM), an array (Gemini's compatibility layer).
        assert_eq!(
            ProviderError::from_body(r#"{"error":"model 'x' not found"}"#).message,
            "model 'x' not found"
        );
        assert_eq!(
            ProviderError::from_body(r#"{"detail":"Not Found"}"#).message,
            "Not Found"
        );
        assert_eq!(
            ProviderError::from_body(r#"[{"error": {"code": 400, "message": "bad"}}]"#),
            ProviderError {
                message: "bad".into(),
                status: Some(400),
                code: None
            }
        );
        // A proxy's HTML page, plain text.
        assert_eq!(
            ProviderError::from_body("<html><head><title>502 Bad Gateway</title></head></html>")
                .message,
            "502 Bad Gateway"
        );
        assert_eq!(
            ProviderError::from_body(" upstream down \n").message,
            "upstream down"
        );
    }

    #[test]
    fn tidy_makes_one_masked_line() {
        assert_eq!(
            tidy("Incorrect API key provided:\n  sk-proj-abcdefghijklmnop.\tSee docs."),
            "Incorrect API key provided: ***. See docs."
        );
        assert_eq!(
            tidy("header was Bearer abc.def.ghi (invalid)"),
            "header was Bearer *** (invalid)"
        );
        assert_eq!(tidy("sk-short is fine"), "sk-short is fine");
        assert_eq!(tidy(""), "");
    }

    #[test]
    fn shorten_cuts_at_a_word_boundary() {
        let text = "alpha beta gamma delta";
        assert_eq!(shorten(text, 100), text);
        assert_eq!(shorten(text, 13), "alpha beta…");
        // The cut falls exactly before a space: the word before it is whole.
        assert_eq!(shorten(text, 10), "alpha beta…");
        // No period left dangling before the ellipsis.
        assert_eq!(shorten("First sentence. Second one", 17), "First sentence…");
        // One endless word is cut hard, on a character boundary.
        assert_eq!(shorten(&"é".repeat(10), 4), "éééé…");
        let long = format!("The model does not exist {}", "word ".repeat(100));
        let short = tidy(&long);
        assert!(short.chars().count() <= DETAIL_MAX_CHARS + 1, "{short}");
        assert!(short.ends_with("word…"), "{short}");
    }
}
