//! The admin page: server-rendered HTML for operators, at `/admin` on the listener that
//! serves `/readyz` (the main one, or `server.ops_listen` when set).
//!
//! Every request passes [`admin_guard`] first:
//! - **Host.** Only the names the API answers to (DNS rebinding), as for the API.
//! - **Who.** Signing in takes an admin API token and starts a session ([`session`]); every
//!   other page needs one (a browser without is sent to the sign-in form). With no admin
//!   token configured at all, the page is served only on a loopback listener, and signing in
//!   needs no token, as the API needs none there.
//! - **Forms.** Every state-changing request is a `POST` of a form from this site (a browser's
//!   cross-site request is refused), at most [`FORM_LIMIT`] bytes, carrying the session's CSRF
//!   token (the sign-in form: the double-submit token of its cookie).
//! - **What the browser may do.** Every answer carries a strict Content-Security-Policy (only
//!   this page's own stylesheet, script and connections; no inline script or style, no
//!   framing), `no-store`, `nosniff`, and referrers to this site only.

mod deliveries;
mod memory;
mod operations;
mod page;
pub(crate) mod session;
mod threads;

use std::collections::HashMap;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use maud::html;

use super::AppState;
use crate::delivery::Delivery;
use page::{page, problem, respond};
use session::{Session, Sessions};

/// The largest form accepted (a memory fact's edit is the longest).
const FORM_LIMIT: usize = 64 * 1024;

/// The Content-Security-Policy of every admin answer.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// What the admin page keeps beside the app's state.
#[derive(Debug)]
pub(crate) struct AdminContext {
    pub(crate) sessions: Sessions,
    /// No admin token is configured and the listener serving the page is on loopback: the
    /// sign-in needs no token.
    pub(crate) open: bool,
    /// No admin token is configured and the listener is reachable from elsewhere: the page
    /// is not served.
    pub(crate) closed: bool,
    /// `Config::summary`: the configuration with secrets masked.
    pub(crate) config_summary: String,
    /// Delivery, for retrying and dropping outbox items.
    pub(crate) delivery: Delivery,
    /// `telemetry.trace_url`: where a trace id links to.
    pub(crate) trace_url: Option<String>,
}

/// A request's form fields (the guard read and checked them), for the handler.
#[derive(Debug, Clone, Default)]
pub(crate) struct FormFields(HashMap<String, String>);

impl FormFields {
    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

/// The admin routes, each behind [`admin_guard`].
pub(crate) fn router(state: AppState) -> Router<AppState> {
    Router::new()
        .route("/admin", get(overview))
        .route("/admin/login", get(login_form).post(login))
        .route("/admin/logout", post(logout))
        .route("/admin/static/admin.css", get(style))
        .route("/admin/static/admin.js", get(script))
        .route("/admin/conversations", get(threads::conversations))
        .route("/admin/threads/{id}", get(threads::thread))
        .route("/admin/threads/{id}/live", get(threads::live))
        .route("/admin/threads/{id}/files/{*name}", get(threads::file))
        .route("/admin/deliveries", get(deliveries::list))
        .route("/admin/deliveries/live", get(deliveries::live))
        .route("/admin/outbox/{seq}/retry", post(deliveries::retry))
        .route(
            "/admin/outbox/{seq}/drop",
            get(deliveries::confirm_drop).post(deliveries::drop_item),
        )
        .route("/admin/memory", get(memory::users))
        .route("/admin/memory/{key}", get(memory::user))
        .route(
            "/admin/memory/{key}/forget",
            get(memory::confirm_forget_user).post(memory::forget_user),
        )
        .route("/admin/memory/{key}/facts/{id}", post(memory::edit_fact))
        .route(
            "/admin/memory/{key}/facts/{id}/forget",
            post(memory::forget_fact),
        )
        .route("/admin/tasks/{id}/cancel", post(operations::cancel_task))
        .route("/admin/approvals", get(operations::approvals))
        .route("/admin/approvals/{id}", post(operations::decide))
        .route("/admin/skills", get(operations::skills))
        .route("/admin/status", get(operations::status))
        .route_layer(axum::middleware::from_fn_with_state(state, admin_guard))
}

/// The signed-in operator of a request (the guard put it there).
#[derive(Debug, Clone)]
pub(crate) struct Operator(pub(crate) Session);

/// A form body's fields: `application/x-www-form-urlencoded`, within [`FORM_LIMIT`] and the
/// body timeout.
async fn read_form(
    state: &AppState,
    headers: &axum::http::HeaderMap,
    body: Body,
) -> Result<FormFields, Response> {
    let is_form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim() == "application/x-www-form-urlencoded");
    if !is_form {
        return Err(problem(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            None,
            "a form of this page is expected",
        ));
    }
    let read = axum::body::to_bytes(body, FORM_LIMIT);
    let bytes = match tokio::time::timeout(state.body_timeout, read).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => {
            return Err(problem(
                StatusCode::PAYLOAD_TOO_LARGE,
                None,
                "the form is too large",
            ));
        }
        Err(_) => {
            return Err(problem(
                StatusCode::REQUEST_TIMEOUT,
                None,
                "the form did not arrive in time",
            ));
        }
    };
    serde_urlencoded::from_bytes::<Vec<(String, String)>>(&bytes)
        .map(|pairs| FormFields(pairs.into_iter().collect()))
        .map_err(|_| problem(StatusCode::BAD_REQUEST, None, "the form cannot be read"))
}

/// The checks every admin request passes (see the module doc), then the security headers on
/// its answer.
async fn admin_guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let mut response = guarded(state, request, next).await;
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        // Not `no-referrer`: with it, browsers send `Origin: null` on the page's own form
        // posts, which would read as cross-site.
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

async fn guarded(state: AppState, mut request: Request, next: Next) -> Response {
    let refused = |reason: &'static str| {
        metrics::counter!("antler_admin_refused_total", "reason" => reason).increment(1);
    };
    let headers = request.headers();
    if !state.hosts.allows_host_header(headers) {
        refused("host");
        return problem(
            StatusCode::FORBIDDEN,
            None,
            "unknown Host; add it to server.allowed_hosts",
        );
    }
    if state.admin.closed {
        refused("no_admin_token");
        return problem(
            StatusCode::FORBIDDEN,
            None,
            "no admin token is configured (channels.api.token or a token with role \"admin\"): \
             the admin page is served on a loopback address only",
        );
    }
    let path = request.uri().path();
    let signing_in = path == "/admin/login";
    let asset = path.starts_with("/admin/static/");
    let session = state.admin.sessions.of(headers);
    if request.method() == Method::POST {
        if state.hosts.is_cross_origin(headers) {
            refused("cross_origin");
            return problem(
                StatusCode::FORBIDDEN,
                None,
                "cross-site forms are not accepted",
            );
        }
        let login_token = session::cookie(headers, session::LOGIN_COOKIE).map(str::to_owned);
        let (parts, body) = request.into_parts();
        let form = match read_form(&state, &parts.headers, body).await {
            Ok(form) => form,
            Err(response) => {
                refused("form");
                return response;
            }
        };
        let sent = form.get("csrf").unwrap_or_default();
        let expected = if signing_in {
            login_token
        } else {
            match &session {
                Some(session) => Some(session.csrf.clone()),
                None => {
                    refused("signed_out");
                    return problem(
                        StatusCode::UNAUTHORIZED,
                        None,
                        "you are signed out; sign in again",
                    );
                }
            }
        };
        if !expected.is_some_and(|expected| session::same_token(&expected, sent)) {
            refused("csrf");
            return problem(
                StatusCode::FORBIDDEN,
                session.as_ref(),
                "the form's CSRF token is missing or wrong; reload the page and try again",
            );
        }
        request = Request::from_parts(parts, Body::empty());
        request.extensions_mut().insert(form);
    } else if !signing_in && !asset && session.is_none() {
        return Redirect::to("/admin/login").into_response();
    }
    if let Some(session) = session {
        request.extensions_mut().insert(Operator(session));
    }
    next.run(request).await
}

/// `GET /admin/static/admin.css`
async fn style() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        page::STYLE,
    )
        .into_response()
}

/// `GET /admin/static/admin.js`
async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        page::SCRIPT,
    )
        .into_response()
}

/// `GET /admin/login`: the sign-in form, with a fresh double-submit token.
async fn login_form(State(state): State<AppState>) -> Response {
    sign_in_page(&state, None)
}

fn sign_in_page(state: &AppState, error: Option<&str>) -> Response {
    let token = session::random_token();
    let no_admin_token = !state.admin.open && !state.auth.has_admin_token();
    let body = html! {
        @if let Some(error) = error {
            p.error { (error) }
        }
        form.card method="post" action="/admin/login" {
            input type="hidden" name="csrf" value=(token);
            @if state.admin.open {
                p { "No admin token is configured: this page is served on loopback only, and whoever reaches it is the operator." }
            } @else if no_admin_token {
                p.error { "No admin token is configured: only user tokens exist, and they cannot sign in here." }
            } @else {
                label for="token" { "Admin API token" }
                input #token type="password" name="token" autocomplete="current-password" required;
            }
            p { button.primary #sign-in type="submit" { "Sign in" } }
        }
    };
    let mut response = respond(page("Sign in", None, body));
    if let Ok(cookie) = HeaderValue::from_str(&state.admin.sessions.login_cookie(&token)) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    if error.is_some() {
        *response.status_mut() = StatusCode::UNAUTHORIZED;
    }
    response
}

/// `POST /admin/login`: an admin token starts a session.
async fn login(State(state): State<AppState>, form: axum::Extension<FormFields>) -> Response {
    let token = form.get("token").unwrap_or_default();
    let allowed = state.admin.open || state.auth.is_admin_token(token);
    if !allowed {
        metrics::counter!("antler_admin_refused_total", "reason" => "token").increment(1);
        tracing::warn!("admin page: a sign-in with a wrong token");
        return sign_in_page(&state, Some("That is not an admin token."));
    }
    let (id, _) = state.admin.sessions.start();
    tracing::info!("admin page: an operator signed in");
    let mut response = Redirect::to("/admin").into_response();
    for cookie in [
        state.admin.sessions.set_cookie(&id),
        state.admin.sessions.login_cookie(""),
    ] {
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            response.headers_mut().append(header::SET_COOKIE, value);
        }
    }
    response
}

/// `POST /admin/logout`: ends the session.
async fn logout(State(state): State<AppState>, request: Request) -> Response {
    state.admin.sessions.end(request.headers());
    let mut response = Redirect::to("/admin/login").into_response();
    if let Ok(value) = HeaderValue::from_str(&state.admin.sessions.clear_cookie()) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Operator {
    type Rejection = Response;

    /// The session the guard found; a page that needs one answers 401 without.
    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Self>()
            .cloned()
            .ok_or_else(|| problem(StatusCode::UNAUTHORIZED, None, "sign in first"))
    }
}

/// `GET /admin`: what is happening now.
async fn overview(State(state): State<AppState>, Operator(session): Operator) -> Response {
    let stats = state.store.stats().await;
    let channels = state.ingress.health().snapshot();
    let body = html! {
        div.grid {
            @match &stats {
                Ok(stats) => {
                    div.card { div.muted { "Inbox" } strong #inbox-count { (stats.inbox) } }
                    div.card { div.muted { "Outbox pending" } strong #outbox-count { (stats.outbox_pending) } }
                    div.card { div.muted { "Oldest waiting" } strong { (stats.oldest_inbox_at_ms.map_or("—".to_owned(), page::ago)) } }
                },
                Err(e) => div.card.error { "The store does not answer: " (e) },
            }
            div.card { div.muted { "Turns running" } strong { (state.ingress.running()) } }
            div.card { div.muted { "Up for" } strong { (state.started.elapsed().as_secs() / 60) " min" } }
        }
        h2 { "Platforms" }
        (operations::channel_table(&channels))
        p { a href="/admin/status" { "Health and configuration in detail" } }
    };
    respond(page("Overview", Some(&session), body))
}
