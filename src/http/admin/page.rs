//! The admin page's frame and small pieces every view uses: the layout with its navigation,
//! a form that carries the session's CSRF token, times and sizes as people read them.
//!
//! Everything goes through maud, which escapes every value spliced into the HTML; nothing
//! here writes markup from strings.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

use super::session::Session;

/// The stylesheet and script, served from the binary (the CSP allows only these).
pub(super) const STYLE: &str = include_str!("admin.css");
pub(super) const SCRIPT: &str = include_str!("admin.js");

/// The sections in the navigation: path and label.
const SECTIONS: [(&str, &str); 7] = [
    ("/admin", "Overview"),
    ("/admin/conversations", "Conversations"),
    ("/admin/deliveries", "Inbox & outbox"),
    ("/admin/memory", "Memory"),
    ("/admin/approvals", "Approvals & schedules"),
    ("/admin/skills", "Skills"),
    ("/admin/status", "Health & config"),
];

/// A whole page: `title`, the navigation (with `session`, a sign-out button), `body`.
pub(super) fn page(title: &str, session: Option<&Session>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · antler admin" }
                link rel="stylesheet" href="/admin/static/admin.css";
                script src="/admin/static/admin.js" defer {}
            }
            body {
                header {
                    a.brand href="/admin" { "antler" }
                    @if let Some(session) = session {
                        nav {
                            @for (path, label) in SECTIONS {
                                a href=(path) { (label) }
                            }
                        }
                        form.signout method="post" action="/admin/logout" {
                            (csrf_field(session))
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// The hidden field every form of a session carries.
pub(super) fn csrf_field(session: &Session) -> Markup {
    html! { input type="hidden" name="csrf" value=(session.csrf); }
}

/// A form with one button that posts to `action`.
pub(super) fn button(session: &Session, action: &str, label: &str, class: &str) -> Markup {
    html! {
        form.inline method="post" action=(action) {
            (csrf_field(session))
            button.(class) type="submit" { (label) }
        }
    }
}

/// A trace id, linked to the trace when `telemetry.trace_url` is set.
pub(super) fn trace(id: &str, trace_url: Option<&str>) -> Markup {
    html! {
        @match crate::telemetry::trace_link(trace_url, id) {
            Some(link) => a.trace href=(link) rel="noreferrer" { code { (id) } },
            None => code.trace { (id) },
        }
    }
}

/// A page's HTML as a response (200).
pub(super) fn respond(markup: Markup) -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        markup.into_string(),
    )
        .into_response()
}

/// A page saying what went wrong, with `status`.
pub(super) fn problem(status: StatusCode, session: Option<&Session>, message: &str) -> Response {
    let title = status.canonical_reason().unwrap_or("Error");
    let body = html! {
        p.error { (message) }
        p { a href="/admin" { "Back to the overview" } }
    };
    let mut response = respond(page(title, session, body));
    *response.status_mut() = status;
    response
}

/// The page saying the store does not answer (503).
pub(super) fn store_problem(session: &Session, e: &crate::store::StoreError) -> Response {
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        Some(session),
        &format!("the store does not answer: {e}"),
    )
}

/// A time in ms since the epoch, as UTC to the second (`2026-12-05 14:03:22`).
pub(super) fn time(ms: u64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    let Ok(at) = time::OffsetDateTime::from_unix_timestamp_nanos(nanos) else {
        return "?".to_owned();
    };
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    )
}

/// How long ago `ms` was, roughly (`12 s ago`, `3 min ago`, `2 h ago`, `4 d ago`).
pub(super) fn ago(ms: u64) -> String {
    let secs = crate::now_ms().saturating_sub(ms) / 1000;
    match secs {
        0..60 => format!("{secs} s ago"),
        60..3600 => format!("{} min ago", secs / 60),
        3600..86_400 => format!("{} h ago", secs / 3600),
        _ => format!("{} d ago", secs / 86_400),
    }
}

/// At most `max` characters of `text`, with `…` when cut.
pub(super) fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// A path segment percent-encoded, so any id can sit in a link.
pub(super) fn segment(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped_in_pages() {
        let hostile = "<script>alert('x')</script>\"&";
        let html = page(hostile, None, html! { p { (hostile) } }).into_string();
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(html.contains("&lt;script&gt;alert('x')&lt;/script&gt;&quot;&amp;"));
    }

    #[test]
    fn trace_ids_link_out_when_a_template_is_set() {
        let id = "4bf92f3577b34da6a3ce929d0e0e4736";
        let plain = trace(id, None).into_string();
        assert_eq!(plain, format!("<code class=\"trace\">{id}</code>"));
        let linked = trace(id, Some("https://tempo.example/trace/{trace_id}")).into_string();
        assert!(linked.contains(&format!("href=\"https://tempo.example/trace/{id}\"")));
    }

    #[test]
    fn times_sizes_and_segments_read_well() {
        assert_eq!(time(0), "1970-01-01 00:00:00");
        assert_eq!(time(1_764_943_402_000), "2025-12-05 14:03:22");
        assert_eq!(clip("abcdef", 3), "abc…");
        assert_eq!(clip("abc", 3), "abc");
        assert_eq!(clip("ééé", 2), "éé…");
        assert_eq!(segment("telegram:42/x y"), "telegram%3A42%2Fx%20y");
    }
}
