//! Checks every API request passes before its body is read: a known `Host`, no browser
//! cross-origin request, a valid token (which names the principal), and a JSON body type.
//!
//! - **Host.** A token-less loopback setup must not be reachable through DNS rebinding, where a
//!   web page's own name resolves to 127.0.0.1: only loopback names, the listen address, the
//!   host of `server.public_url` and `server.allowed_hosts` are accepted.
//! - **Browsers.** A page on another origin can send a "simple" cross-site POST without any
//!   preflight. Requests that a browser marks as cross-origin (`Origin` of another host,
//!   `Sec-Fetch-Site: cross-site`/`same-site`) are refused, and bodies (POST, PUT) must be
//!   `application/json`, which no simple request can send.
//! - **Tokens.** Each token stands for a principal: the admin token reaches every conversation,
//!   a user's token only that user's. The headers are checked before the body is read, so an
//!   unauthenticated client cannot make antler buffer anything.

use std::collections::HashSet;
use std::sync::Arc;

use antler_channel::{ConversationKey, verify};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::Response;

use super::AppState;
use super::error::ApiError;
use crate::config::{ApiChannelConfig, ApiRole, Secret, ServerConfig};

/// Who an API request acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Principal {
    /// The user a user token is bound to; `None` for admins (who name the user per request).
    pub(crate) user: Option<String>,
}

impl Principal {
    const ADMIN: Self = Self { user: None };

    /// Lets admins through; a user's token gets 403 with `hint` (what users have instead).
    pub(crate) fn require_admin(&self, hint: &str) -> Result<(), ApiError> {
        match self.user {
            None => Ok(()),
            Some(_) => Err(ApiError::Forbidden(hint.to_owned())),
        }
    }

    /// The conversation key for `conversation` as this principal names it: a user's
    /// conversations live under `<user>/`, so users never meet; an admin names any key.
    pub(crate) fn conversation_key(&self, conversation: &str) -> ConversationKey {
        match &self.user {
            None => ConversationKey::new("api", [conversation]),
            Some(user) => ConversationKey::new("api", [format!("{user}/{conversation}")]),
        }
    }

    /// Whether this principal may read a thread of `conversation` (a full conversation key).
    pub(crate) fn may_read(&self, conversation: &str) -> bool {
        match &self.user {
            None => true,
            Some(user) => conversation
                .strip_prefix("api:")
                .and_then(|rest| rest.strip_prefix(user.as_str()))
                .is_some_and(|rest| rest.starts_with('/')),
        }
    }
}

/// The API's tokens and whom they stand for.
#[derive(Debug, Clone)]
pub(crate) struct ApiAuth {
    tokens: Vec<(Secret, Principal)>,
}

impl ApiAuth {
    pub(crate) fn from_config(api: &ApiChannelConfig) -> Self {
        let mut tokens = Vec::new();
        if let Some(token) = &api.token {
            tokens.push((token.clone(), Principal::ADMIN));
        }
        for entry in &api.tokens {
            let principal = match entry.role {
                ApiRole::Admin => Principal::ADMIN,
                ApiRole::User => Principal {
                    user: Some(entry.user.clone()),
                },
            };
            tokens.push((entry.token.clone(), principal));
        }
        Self { tokens }
    }

    /// Whether no token is configured (a loopback-only setup): every caller is an admin.
    pub(crate) fn is_open(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The principal of the request's bearer token; `None` when it matches no token.
    pub(crate) fn principal(&self, headers: &HeaderMap) -> Option<Principal> {
        if self.is_open() {
            return Some(Principal::ADMIN);
        }
        // Every token is compared (in constant time each), so the time taken does not tell
        // which one matched.
        let mut found = None;
        for (token, principal) in &self.tokens {
            if verify::bearer_matches(headers, token.expose()) && found.is_none() {
                found = Some(principal.clone());
            }
        }
        found
    }

    /// Whether `token` is an admin token (the admin page's sign-in). Every token is compared,
    /// in constant time each.
    pub(crate) fn is_admin_token(&self, token: &str) -> bool {
        let mut found = false;
        for (known, principal) in &self.tokens {
            let matches = verify::constant_time_eq(known.expose().as_bytes(), token.as_bytes());
            found |= matches && principal.user.is_none();
        }
        found
    }

    /// Whether any admin token is configured.
    pub(crate) fn has_admin_token(&self) -> bool {
        self.tokens
            .iter()
            .any(|(_, principal)| principal.user.is_none())
    }

    /// Whether the request carries an admin token (never true without tokens: an open API
    /// does not open what has a token of its own, such as the metrics).
    pub(crate) fn is_admin(&self, headers: &HeaderMap) -> bool {
        !self.is_open() && self.principal(headers).is_some_and(|p| p.user.is_none())
    }
}

/// The `Host` values the API answers to.
#[derive(Debug, Clone)]
pub(crate) struct HostPolicy {
    any: bool,
    hosts: HashSet<String>,
}

/// `host[:port]` → the lowercase host (IPv6 in brackets), without a trailing dot.
fn host_of(authority: &str) -> String {
    let authority = authority.trim().to_ascii_lowercase();
    let host = if authority.starts_with('[') {
        authority
            .split_once(']')
            .map_or(authority.clone(), |(h, _)| format!("{h}]"))
    } else {
        authority
            .split_once(':')
            .map_or(authority.clone(), |(h, _)| h.to_owned())
    };
    host.trim_end_matches('.').to_owned()
}

impl HostPolicy {
    pub(crate) fn from_config(server: &ServerConfig) -> Self {
        let mut hosts: HashSet<String> = ["localhost", "127.0.0.1", "[::1]"]
            .into_iter()
            .map(str::to_owned)
            .collect();
        // The ops listener's address too: the admin page may be served there.
        for ip in std::iter::once(server.listen.ip()).chain(server.ops_listen.map(|a| a.ip())) {
            if !ip.is_unspecified() {
                hosts.insert(match ip {
                    std::net::IpAddr::V4(v4) => v4.to_string(),
                    std::net::IpAddr::V6(v6) => format!("[{v6}]"),
                });
            }
        }
        if let Some(host) = server
            .public_url
            .as_deref()
            .and_then(|u| reqwest::Url::parse(u).ok())
            .and_then(|u| u.host_str().map(host_of))
        {
            hosts.insert(host);
        }
        let mut any = false;
        for entry in &server.allowed_hosts {
            if entry.trim() == "*" {
                any = true;
            } else {
                hosts.insert(host_of(entry));
            }
        }
        Self { any, hosts }
    }

    fn allows(&self, host: &str) -> bool {
        self.any || self.hosts.contains(&host_of(host))
    }

    /// Whether the request's `Host` is one of ours (a request without one is not a
    /// browser's).
    pub(crate) fn allows_host_header(&self, headers: &HeaderMap) -> bool {
        match headers.get(header::HOST).map(|v| v.to_str()) {
            None => true,
            Some(Ok(host)) => self.allows(host),
            Some(Err(_)) => false,
        }
    }

    /// Whether a browser marked the request as coming from another site.
    pub(crate) fn is_cross_origin(&self, headers: &HeaderMap) -> bool {
        let fetch_site = headers
            .get("sec-fetch-site")
            .and_then(|v| v.to_str().ok())
            .map(str::to_ascii_lowercase);
        if matches!(fetch_site.as_deref(), Some("cross-site" | "same-site")) {
            return true;
        }
        match headers.get(header::ORIGIN).map(|v| v.to_str()) {
            None => false,
            Some(Ok(origin)) => !reqwest::Url::parse(origin)
                .ok()
                .and_then(|u| u.host_str().map(str::to_owned))
                .is_some_and(|host| self.allows(&host)),
            Some(Err(_)) => true,
        }
    }
}

/// Whether a request declares a JSON body.
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

/// The `from_fn` layer in front of every API route. Puts the [`Principal`] into the request's
/// extensions for the handler.
pub(crate) async fn api_guard(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let reject = |reason: &'static str| {
        metrics::counter!("antler_webhooks_rejected_total", "channel" => "api", "reason" => reason)
            .increment(1);
    };
    let headers = request.headers();
    if !state.hosts.allows_host_header(headers) {
        reject("host");
        return Err(ApiError::Forbidden(
            "unknown Host; add it to server.allowed_hosts".to_owned(),
        ));
    }
    if state.hosts.is_cross_origin(headers) {
        reject("cross_origin");
        return Err(ApiError::Forbidden(
            "cross-origin browser requests are not accepted".to_owned(),
        ));
    }
    let Some(principal) = state.auth.principal(headers) else {
        reject("unauthorized");
        return Err(ApiError::Unauthorized);
    };
    if matches!(*request.method(), Method::POST | Method::PUT) && !is_json(headers) {
        reject("media_type");
        return Err(ApiError::UnsupportedMediaType);
    }
    request.extensions_mut().insert(Arc::new(principal));
    Ok(next.run(request).await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ApiToken;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn hosts_are_loopback_listen_public_url_and_configured_ones() {
        let mut server = ServerConfig {
            public_url: Some("https://Bot.Example.com/base".to_owned()),
            allowed_hosts: vec!["ops.internal:8443".to_owned()],
            ..ServerConfig::default()
        };
        let policy = HostPolicy::from_config(&server);
        for host in [
            "localhost:8080",
            "127.0.0.1",
            "[::1]:9",
            "bot.example.com",
            "ops.internal",
        ] {
            assert!(policy.allows(host), "{host}");
        }
        for host in [
            "evil.example",
            "127.0.0.1.evil.example",
            "localhost.evil",
            "[::2]",
        ] {
            assert!(!policy.allows(host), "{host}");
        }
        server.allowed_hosts = vec!["*".to_owned()];
        assert!(HostPolicy::from_config(&server).allows("anything.example"));
    }

    #[test]
    fn browser_cross_origin_requests_are_recognised() {
        let policy = HostPolicy::from_config(&ServerConfig::default());
        assert!(policy.is_cross_origin(&headers(&[("origin", "https://evil.example")])));
        assert!(policy.is_cross_origin(&headers(&[("origin", "null")])));
        assert!(policy.is_cross_origin(&headers(&[("sec-fetch-site", "cross-site")])));
        assert!(!policy.is_cross_origin(&headers(&[("origin", "http://localhost:3000")])));
        assert!(!policy.is_cross_origin(&headers(&[("sec-fetch-site", "same-origin")])));
        assert!(
            !policy.is_cross_origin(&HeaderMap::new()),
            "curl sends neither"
        );
    }

    #[test]
    fn tokens_name_their_principal_and_users_stay_in_their_namespace() {
        let api = ApiChannelConfig {
            token: Some(Secret::new("admin-token-0123456789")),
            tokens: vec![ApiToken {
                token: Secret::new("ana-token-0123456789"),
                user: "ana".to_owned(),
                role: ApiRole::User,
            }],
            ..ApiChannelConfig::default()
        };
        let auth = ApiAuth::from_config(&api);
        let bearer = |t: &str| headers(&[("authorization", &format!("Bearer {t}"))]);
        assert_eq!(
            auth.principal(&bearer("admin-token-0123456789")),
            Some(Principal::ADMIN)
        );
        let ana = auth.principal(&bearer("ana-token-0123456789")).unwrap();
        assert_eq!(ana.user.as_deref(), Some("ana"));
        assert_eq!(auth.principal(&bearer("nope")), None);
        assert_eq!(auth.principal(&HeaderMap::new()), None);
        assert!(auth.is_admin(&bearer("admin-token-0123456789")));
        assert!(!auth.is_admin(&bearer("ana-token-0123456789")));
        assert!(auth.is_admin_token("admin-token-0123456789"));
        assert!(
            !auth.is_admin_token("ana-token-0123456789"),
            "a user's token"
        );
        assert!(!auth.is_admin_token("admin-token-012345678"));
        assert!(auth.has_admin_token());

        assert_eq!(ana.conversation_key("ops").as_str(), "api:ana/ops");
        assert!(ana.may_read("api:ana/ops"));
        assert!(!ana.may_read("api:anabel/ops"));
        assert!(!ana.may_read("api:ops"));
        assert!(!ana.may_read("telegram:1"));
        assert!(Principal::ADMIN.may_read("api:ana/ops"));
        let open = ApiAuth::from_config(&ApiChannelConfig::default());
        assert!(open.is_open());
        assert_eq!(open.principal(&HeaderMap::new()), Some(Principal::ADMIN));
        assert!(
            !open.is_admin(&HeaderMap::new()),
            "no token, no admin token"
        );
    }

    #[test]
    fn only_json_bodies_pass() {
        assert!(is_json(&headers(&[(
            "content-type",
            "application/json; charset=utf-8"
        )])));
        assert!(!is_json(&headers(&[("content-type", "text/plain")])));
        assert!(!is_json(&HeaderMap::new()));
    }
}
