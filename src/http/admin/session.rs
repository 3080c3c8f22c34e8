//! Signed-in operators of the admin page: a session per sign-in, kept in this process.
//!
//! The cookie holds only a random session id (`HttpOnly`, `SameSite=Strict`, `Path=/admin`,
//! `Secure` when `server.public_url` is https); the session holds its CSRF token, which every
//! form carries back and which is compared in constant time. Sessions end when signed out or
//! after [`LIFETIME`], whichever comes first; at most [`MAX_SESSIONS`] live at once (the
//! oldest goes first). Being in memory, a restart signs everyone out, and replicas behind a
//! load balancer each keep their own (sign in on each, or keep operators on one).
//!
//! Signing in is itself protected from cross-site forgery by a double-submit token: the
//! sign-in form's hidden field must match the short-lived cookie set with the form.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use antler_channel::verify;
use axum::http::{HeaderMap, header};

/// The session cookie's name.
pub(super) const COOKIE: &str = "antler_admin";
/// The sign-in form's double-submit cookie.
pub(super) const LOGIN_COOKIE: &str = "antler_admin_login";
/// How long a session lasts after signing in.
pub(super) const LIFETIME: Duration = Duration::from_secs(8 * 60 * 60);
/// How long a sign-in form stays good.
const LOGIN_LIFETIME: Duration = Duration::from_secs(30 * 60);
/// The most sessions kept at once.
const MAX_SESSIONS: usize = 256;

/// A random token of 244 bits (two v4 UUIDs from the OS's generator), as 64 hex digits.
pub(super) fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Whether two tokens are equal, in time that does not depend on where they differ.
pub(super) fn same_token(a: &str, b: &str) -> bool {
    verify::constant_time_eq(a.as_bytes(), b.as_bytes())
}

/// One signed-in operator.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    /// The token every form of this session carries.
    pub(crate) csrf: String,
    expires: Instant,
}

/// The sessions of this process.
pub(crate) struct Sessions {
    live: Mutex<HashMap<String, Session>>,
    /// Cookies get `Secure` (the page is reached over https).
    secure: bool,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = self.live.lock().map_or(0, |live| live.len());
        f.debug_struct("Sessions")
            .field("live", &count)
            .field("secure", &self.secure)
            .finish()
    }
}

impl Sessions {
    pub(crate) fn new(secure: bool) -> Self {
        Self {
            live: Mutex::new(HashMap::new()),
            secure,
        }
    }

    /// Starts a session: its id (for the cookie) and the session.
    pub(super) fn start(&self) -> (String, Session) {
        let id = random_token();
        let session = Session {
            csrf: random_token(),
            expires: Instant::now() + LIFETIME,
        };
        if let Ok(mut live) = self.live.lock() {
            let now = Instant::now();
            live.retain(|_, s| s.expires > now);
            if live.len() >= MAX_SESSIONS {
                let oldest = live
                    .iter()
                    .min_by_key(|(_, s)| s.expires)
                    .map(|(id, _)| id.clone());
                if let Some(oldest) = oldest {
                    live.remove(&oldest);
                }
            }
            live.insert(id.clone(), session.clone());
        }
        (id, session)
    }

    /// The live session the request's cookie names.
    pub(super) fn of(&self, headers: &HeaderMap) -> Option<Session> {
        let id = cookie(headers, COOKIE)?;
        let mut live = self.live.lock().ok()?;
        match live.get(id) {
            Some(session) if session.expires > Instant::now() => Some(session.clone()),
            Some(_) => {
                live.remove(id);
                None
            }
            None => None,
        }
    }

    /// Ends the session the request's cookie names.
    pub(super) fn end(&self, headers: &HeaderMap) {
        if let (Some(id), Ok(mut live)) = (cookie(headers, COOKIE), self.live.lock()) {
            live.remove(id);
        }
    }

    /// The `Set-Cookie` value for session `id`.
    pub(super) fn set_cookie(&self, id: &str) -> String {
        self.cookie_value(COOKIE, id, "/admin", LIFETIME)
    }

    /// The `Set-Cookie` value that removes the session cookie.
    pub(super) fn clear_cookie(&self) -> String {
        self.cookie_value(COOKIE, "", "/admin", Duration::ZERO)
    }

    /// The `Set-Cookie` value of the sign-in form's double-submit token.
    pub(super) fn login_cookie(&self, token: &str) -> String {
        self.cookie_value(LOGIN_COOKIE, token, "/admin/login", LOGIN_LIFETIME)
    }

    fn cookie_value(&self, name: &str, value: &str, path: &str, max_age: Duration) -> String {
        let secure = if self.secure { "; Secure" } else { "" };
        format!(
            "{name}={value}; Path={path}; Max-Age={}; HttpOnly; SameSite=Strict{secure}",
            max_age.as_secs()
        )
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub(super) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
        .filter(|value| !value.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_cookie(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, value.parse().unwrap());
        headers
    }

    #[test]
    fn a_session_is_found_by_its_cookie_until_it_ends() {
        let sessions = Sessions::new(false);
        let (id, session) = sessions.start();
        assert_eq!(id.len(), 64);
        assert_ne!(id, session.csrf, "the CSRF token is not the cookie");
        let headers = with_cookie(&format!("theme=dark; {COOKIE}={id}"));
        assert_eq!(sessions.of(&headers).unwrap().csrf, session.csrf);
        assert!(
            sessions
                .of(&with_cookie(&format!("{COOKIE}=x{id}")))
                .is_none()
        );
        assert!(sessions.of(&HeaderMap::new()).is_none());
        sessions.end(&headers);
        assert!(sessions.of(&headers).is_none(), "signed out");
    }

    #[test]
    fn an_expired_session_is_gone() {
        let sessions = Sessions::new(false);
        let (id, _) = sessions.start();
        if let Ok(mut live) = sessions.live.lock() {
            if let Some(s) = live.get_mut(&id) {
                s.expires = Instant::now() - Duration::from_secs(1);
            }
        }
        assert!(
            sessions
                .of(&with_cookie(&format!("{COOKIE}={id}")))
                .is_none()
        );
    }

    #[test]
    fn the_oldest_session_makes_room() {
        let sessions = Sessions::new(false);
        let (first, _) = sessions.start();
        for _ in 1..MAX_SESSIONS {
            sessions.start();
        }
        assert!(
            sessions
                .of(&with_cookie(&format!("{COOKIE}={first}")))
                .is_some()
        );
        sessions.start();
        assert!(
            sessions
                .of(&with_cookie(&format!("{COOKIE}={first}")))
                .is_none()
        );
    }

    #[test]
    fn cookies_are_http_only_strict_and_secure_over_https() {
        let plain = Sessions::new(false).set_cookie("abc");
        assert_eq!(
            plain,
            "antler_admin=abc; Path=/admin; Max-Age=28800; HttpOnly; SameSite=Strict"
        );
        let secure = Sessions::new(true);
        assert!(secure.set_cookie("abc").ends_with("; Secure"));
        assert!(secure.clear_cookie().contains("Max-Age=0"));
        assert!(secure.login_cookie("t").contains("Path=/admin/login"));
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same_token("abc", "abc"));
        assert!(!same_token("abc", "abd"));
        assert!(!same_token("abc", "abcd"));
        assert!(!same_token("", "a"));
    }
}
