//! `web_fetch`: GETs an http(s) URL the model names and returns its text.
//!
//! The URL is hostile input, so every hop (the first request and each of at most
//! [`MAX_REDIRECTS`] redirects) is checked the same way: the scheme is http or https, the host
//! is resolved here, and every address it resolves to must be public ([`is_public`]: no
//! loopback, private, link-local (cloud metadata), CGNAT, multicast, broadcast, unspecified or
//! reserved address, nor an IPv6 form embedding one). The connection then goes to exactly the
//! addresses that were checked (reqwest's `resolve_to_addrs` override), so a DNS answer that
//! changes between the check and the connect (DNS rebinding) cannot reach a private address.
//! `allow_private` or a host listed in `allowed_hosts` skips the address check (for an
//! intranet wiki, or the tests' server on 127.0.0.1).
//!
//! The body is streamed and cut at `max_bytes`; the whole fetch has `timeout_secs`, within the
//! tool deadline the registry enforces. HTML becomes readable text (`html.rs`: html5ever's
//! tokenizer; scripts, styles and tags dropped, character references decoded, whitespace
//! collapsed); JSON, XML and plain text come back as they are; any other content type is
//! refused, naming it. Rendering runs on a blocking thread (`spawn_blocking`), never on an
//! async worker, and HTML gets [`CONVERSION_BUDGET`] of that thread: a page that takes longer
//! comes back converted up to there, with a note. The output starts with the final URL and
//! the status. Framework tags in the text (`<system-reminder>`, `<memory>`, ...) are
//! neutralised as DeerFlow's ToolResultSanitization does for `web_fetch` results. Beyond what
//! the DeerFlow reference describes, antler fetches pages itself (no reader service), so the
//! address checks, redirect checks and size and time bounds here are its own.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{Tool, ToolContext, ToolError, parse_arguments};
use crate::agent::model::ToolSpec;
use html::{Budget, Converted, Cut, html_to_text};

mod html;

/// The tool's name.
pub(crate) const TOOL_NAME: &str = "web_fetch";
/// Redirects followed at most; each one is checked like the first URL.
pub(crate) const MAX_REDIRECTS: usize = 5;
/// The longest URL accepted, in bytes.
const MAX_URL_BYTES: usize = 4096;
/// The time one page's HTML may take to become text. A release build converts 1 MiB of
/// ordinary or hostile markup in well under 100 ms, except one tag with many thousand distinct
/// attributes, which this budget cuts (`examples/html_to_text_cost.rs` measures it).
const CONVERSION_BUDGET: Duration = Duration::from_millis(250);

/// `[agent.tools.web_fetch]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct WebFetchConfig {
    /// Whether the tool is offered.
    pub(crate) enabled: bool,
    /// The most body bytes read; the rest is cut.
    pub(crate) max_bytes: usize,
    /// The time limit of one fetch, redirects included.
    pub(crate) timeout_secs: u64,
    /// Whether private, loopback and link-local addresses may be fetched.
    pub(crate) allow_private: bool,
    /// Hosts fetched whatever their addresses are (exact names, case-insensitive).
    pub(crate) allowed_hosts: Vec<String>,
    /// The `User-Agent` sent.
    pub(crate) user_agent: String,
}

impl Default for WebFetchConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_bytes: 1024 * 1024,
            timeout_secs: 20,
            allow_private: false,
            allowed_hosts: Vec::new(),
            user_agent: concat!("antler/", env!("CARGO_PKG_VERSION"), " (web_fetch)").to_owned(),
        }
    }
}

/// Why a fetch was refused or failed; the text is shown to the model.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    /// Not an absolute http(s) URL with a host.
    #[error("the URL is not valid: {0}")]
    BadUrl(String),
    /// The host resolves to an address that must not be fetched.
    #[error(
        "refused: {host} resolves to {address}, a private, loopback, link-local or otherwise \
         non-public address"
    )]
    Private { host: String, address: IpAddr },
    /// The host name did not resolve.
    #[error("cannot resolve {0}")]
    Resolve(String),
    /// More than [`MAX_REDIRECTS`] redirects.
    #[error("more than {MAX_REDIRECTS} redirects")]
    TooManyRedirects,
    /// A redirect without a usable `Location`.
    #[error("a redirect ({0}) without a valid Location")]
    BadRedirect(u16),
    /// A content type that is not text.
    #[error("refused: the content type `{0}` is not text, HTML or JSON")]
    ContentType(String),
    /// The fetch took longer than allowed.
    #[error("no answer within {0} seconds")]
    Timeout(u64),
    /// The HTTP exchange failed.
    #[error("the request failed: {0}")]
    Http(String),
    /// The blocking task rendering the body did not finish.
    #[error("the page could not be turned into text")]
    Render,
}

/// The `web_fetch` tool.
#[derive(Debug, Clone)]
pub(crate) struct WebFetch {
    max_bytes: usize,
    timeout: Duration,
    allow_private: bool,
    allowed_hosts: Vec<String>,
    user_agent: String,
    /// [`CONVERSION_BUDGET`]; tests set their own.
    conversion_budget: Duration,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Arguments {
    url: String,
}

impl WebFetch {
    /// The tool, or `None` when it is disabled.
    pub(crate) fn from_config(cfg: &WebFetchConfig) -> Option<Self> {
        cfg.enabled.then(|| Self {
            max_bytes: cfg.max_bytes.max(1),
            timeout: Duration::from_secs(cfg.timeout_secs.max(1)),
            allow_private: cfg.allow_private,
            allowed_hosts: cfg
                .allowed_hosts
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .collect(),
            user_agent: cfg.user_agent.clone(),
            conversion_budget: CONVERSION_BUDGET,
        })
    }

    /// Fetches `url`, following checked redirects, within the configured time.
    pub(crate) async fn fetch(&self, url: &str) -> Result<String, FetchError> {
        let secs = self.timeout.as_secs();
        tokio::time::timeout(self.timeout, self.fetch_unbounded(url))
            .await
            .map_err(|_| FetchError::Timeout(secs))?
    }

    async fn fetch_unbounded(&self, url: &str) -> Result<String, FetchError> {
        if url.len() > MAX_URL_BYTES {
            return Err(FetchError::BadUrl(format!(
                "longer than {MAX_URL_BYTES} bytes"
            )));
        }
        let mut current =
            reqwest::Url::parse(url.trim()).map_err(|e| FetchError::BadUrl(e.to_string()))?;
        let mut redirects = 0;
        loop {
            let response = self.request(&current).await?;
            let status = response.status();
            if status.is_redirection() {
                let location = response
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| current.join(v).ok())
                    .ok_or(FetchError::BadRedirect(status.as_u16()))?;
                redirects += 1;
                if redirects > MAX_REDIRECTS {
                    return Err(FetchError::TooManyRedirects);
                }
                current = location;
                continue;
            }
            return self.read(current, response).await;
        }
    }

    /// One GET of `url`, to the addresses checked for its host, redirects not followed.
    async fn request(&self, url: &reqwest::Url) -> Result<reqwest::Response, FetchError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(FetchError::BadUrl(format!(
                "the scheme `{}` is not http or https",
                url.scheme()
            )));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(FetchError::BadUrl("credentials in the URL".to_owned()));
        }
        let host = url
            .host_str()
            .ok_or_else(|| FetchError::BadUrl("no host".to_owned()))?
            .to_owned();
        let port = url
            .port_or_known_default()
            .ok_or_else(|| FetchError::BadUrl("no port".to_owned()))?;
        let addresses = self.addresses(&host, port).await?;
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(&self.user_agent)
            .connect_timeout(self.timeout)
            .no_proxy();
        if literal_ip(&host).is_none() {
            builder = builder.resolve_to_addrs(&host, &addresses);
        }
        let client = builder
            .build()
            .map_err(|e| FetchError::Http(e.to_string()))?;
        client
            .get(url.clone())
            .header(
                reqwest::header::ACCEPT,
                "text/html, text/plain, application/json;q=0.9, */*;q=0.5",
            )
            .send()
            .await
            .map_err(|e| FetchError::Http(describe(&e)))
    }

    /// The addresses of `host`, resolved once, each checked unless the host is trusted.
    async fn addresses(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, FetchError> {
        let addresses: Vec<SocketAddr> = match literal_ip(host) {
            Some(ip) => vec![SocketAddr::new(ip, port)],
            None => tokio::net::lookup_host((host, port))
                .await
                .map_err(|_| FetchError::Resolve(host.to_owned()))?
                .collect(),
        };
        if addresses.is_empty() {
            return Err(FetchError::Resolve(host.to_owned()));
        }
        let trusted = self.allow_private
            || self
                .allowed_hosts
                .iter()
                .any(|allowed| allowed.eq_ignore_ascii_case(host.trim_matches(['[', ']'])));
        if !trusted {
            // Every address must be public: the connector may try any of them.
            if let Some(bad) = addresses.iter().find(|a| !is_public(a.ip())) {
                return Err(FetchError::Private {
                    host: host.to_owned(),
                    address: bad.ip(),
                });
            }
        }
        Ok(addresses)
    }

    /// Reads the body up to the cap and renders it as text.
    async fn read(
        &self,
        url: reqwest::Url,
        mut response: reqwest::Response,
    ) -> Result<String, FetchError> {
        let status = response.status();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let kind = Kind::of(&content_type)?;
        let mut body = Vec::new();
        let mut truncated = false;
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| FetchError::Http(describe(&e)))?
        {
            let room = self.max_bytes.saturating_sub(body.len());
            if chunk.len() > room {
                body.extend_from_slice(chunk.get(..room).unwrap_or_default());
                truncated = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        if content_type.is_empty() && body.iter().take(1024).any(|&b| b == 0) {
            // No type given and NUL bytes: a binary file, not text.
            return Err(FetchError::ContentType(
                "(none; the body is binary)".to_owned(),
            ));
        }
        let budget = Budget {
            time: self.conversion_budget,
            max_text_bytes: self.max_bytes,
        };
        // Rendering is CPU work proportional to the body (and HTML up to the budget): it must
        // not hold an async worker, which serves `/healthz`, webhooks and every other turn.
        let Converted { text, cut } =
            tokio::task::spawn_blocking(move || render(kind, &body, budget))
                .await
                .map_err(|_| FetchError::Render)?;
        let mut out = format!(
            "URL: {url}\nStatus: {}\nContent-Type: {}\n\n{text}",
            status.as_u16(),
            if content_type.is_empty() {
                "(none)"
            } else {
                &content_type
            }
        );
        if truncated {
            out.push_str(&format!(
                "\n\n[cut: the body is longer than {} bytes]",
                self.max_bytes
            ));
        }
        match cut {
            Some(Cut::Time) => out.push_str(&format!(
                "\n\n[cut: turning the page into text took longer than {} ms; the rest of the \
                 page is left out]",
                self.conversion_budget.as_millis()
            )),
            Some(Cut::Size) => out.push_str(&format!(
                "\n\n[cut: the text is longer than {} bytes]",
                self.max_bytes
            )),
            None => {}
        }
        Ok(out)
    }
}

/// The text of a body: HTML converted within `budget`, anything else as it is; framework tags
/// neutralised either way.
fn render(kind: Kind, body: &[u8], budget: Budget) -> Converted {
    let raw = String::from_utf8_lossy(body);
    let Converted { text, cut } = match kind {
        Kind::Html => html_to_text(&raw, budget),
        Kind::Text => Converted {
            text: raw.into_owned(),
            cut: None,
        },
    };
    Converted {
        text: neutralize_tags(&text),
        cut,
    }
}

/// A reqwest error without its URL (which may carry a query the page owner sees, not us).
fn describe(error: &reqwest::Error) -> String {
    let kind = if error.is_connect() {
        "cannot connect"
    } else if error.is_timeout() {
        "timed out"
    } else if error.is_body() || error.is_decode() {
        "the body could not be read"
    } else {
        "the exchange failed"
    };
    let mut detail = match error.url() {
        Some(url) => error.to_string().replace(url.as_str(), "<url>"),
        None => error.to_string(),
    };
    truncate_chars(&mut detail, 300);
    format!("{kind} ({detail})")
}

/// Cuts `text` to at most `max` bytes, on a character boundary.
fn truncate_chars(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

/// The address of a host that is an IP literal (`127.0.0.1`, `[::1]`).
fn literal_ip(host: &str) -> Option<IpAddr> {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// How a body is rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Html,
    Text,
}

impl Kind {
    /// The rendering for a `Content-Type`, or the refusal naming it. A missing type is read
    /// as plain text.
    fn of(content_type: &str) -> Result<Self, FetchError> {
        let essence = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match essence.as_str() {
            "text/html" | "application/xhtml+xml" => Ok(Self::Html),
            ""
            | "application/json"
            | "application/xml"
            | "application/javascript"
            | "application/x-ndjson"
            | "application/yaml"
            | "application/x-yaml" => Ok(Self::Text),
            e if e.starts_with("text/") || e.ends_with("+json") || e.ends_with("+xml") => {
                Ok(Self::Text)
            }
            _ => {
                let mut shown = essence;
                truncate_chars(&mut shown, 100);
                Err(FetchError::ContentType(shown))
            }
        }
    }
}

/// Tags that frame trusted context for the model (after DeerFlow's InputSanitization and
/// ToolResultSanitization lists); in fetched or tool-provided text they are neutralised.
const FRAMEWORK_TAGS: [&str; 17] = [
    "system-reminder",
    "system_reminder",
    "memory",
    "current_date",
    "think",
    "analysis",
    "role",
    "soul",
    "uploaded_files",
    "current_uploads",
    "skill_system",
    "system",
    "instruction",
    "important",
    "override",
    "ignore",
    "prompt",
];

/// `text` with the `<` of every framework tag (`<system-reminder>`, `</memory >`, any case)
/// written as `&lt;`, so untrusted text cannot pose as antler's own context blocks.
pub(crate) fn neutralize_tags(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('<') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let name = after.trim_start().trim_start_matches('/').trim_start();
        let is_framework = FRAMEWORK_TAGS.iter().any(|tag| {
            name.get(..tag.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(tag))
                && !name[tag.len()..]
                    .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        });
        out.push_str(if is_framework { "&lt;" } else { "<" });
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Whether `ip` is a public unicast address that may be fetched.
pub(crate) fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(a == 0 // "this network", 0.0.0.0 included
        || a == 10 // RFC 1918
        || a == 127 // loopback
        || (a == 100 && (64..128).contains(&b)) // CGNAT 100.64/10
        || (a == 169 && b == 254) // link-local, cloud metadata
        || (a == 172 && (16..32).contains(&b)) // RFC 1918
        || (a == 192 && b == 168) // RFC 1918
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2) // documentation
        || (a == 198 && (18..20).contains(&b)) // benchmarking
        || (a == 198 && b == 51 && c == 100) // documentation
        || (a == 203 && b == 0 && c == 113) // documentation
        || a >= 224) // multicast, reserved and the broadcast address
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = embedded_v4(ip) {
        return is_public_v4(v4);
    }
    let segments = ip.segments();
    let first = segments[0];
    !(ip.is_unspecified()
        || ip.is_loopback()
        || (first & 0xfe00) == 0xfc00 // unique local fc00::/7
        || (first & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (first & 0xffc0) == 0xfec0 // site-local (deprecated) fec0::/10
        || (first & 0xff00) == 0xff00 // multicast
        || (first == 0x2001 && segments[1] == 0x0db8) // documentation
        || (first == 0x0100 && segments[1..4] == [0, 0, 0])) // discard-only 100::/64
}

/// The IPv4 address inside an IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`),
/// NAT64 (`64:ff9b::/96`) or 6to4 (`2002::/16`) address.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let tail = |hi: u16, lo: u16| {
        let [a, b] = hi.to_be_bytes();
        let [c, d] = lo.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    match s {
        [0, 0, 0, 0, 0, 0xffff, hi, lo] => Some(tail(hi, lo)),
        // `::` and `::1` are not IPv4-compatible forms; they are handled as IPv6.
        [0, 0, 0, 0, 0, 0, hi, lo] if hi != 0 => Some(tail(hi, lo)),
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => Some(tail(hi, lo)),
        [0x2002, hi, lo, ..] => Some(tail(hi, lo)),
        _ => None,
    }
}

#[async_trait::async_trait]
impl Tool for WebFetch {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: TOOL_NAME.to_owned(),
            description: format!(
                "Fetch a public web page or API over http(s) with GET and return its text \
                 (HTML is turned into plain text; JSON and text come back as they are). The \
                 answer starts with the final URL and the HTTP status. At most {} bytes are \
                 read; private and internal addresses are refused.",
                self.max_bytes
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "url": {"type": "string", "description": "An absolute http:// or https:// URL."}
                },
                "required": ["url"],
                "additionalProperties": false
            }),
        }
    }

    async fn call(
        &self,
        arguments: serde_json::Value,
        _cx: &ToolContext,
    ) -> Result<String, ToolError> {
        let Arguments { url } = parse_arguments(arguments)?;
        self.fetch(&url)
            .await
            .map_err(|e| ToolError::Failed(e.to_string()))
    }
}

#[cfg(test)]
mod tests;
