//! `antler pairing list | approve CODE [--admin] | deny CODE`: through the running serve's
//! pairing API when one answers on `server.listen` (the store admits one process at a time,
//! and the serve applies the decision at once), else on the store directly.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;

use crate::config::{ApiRole, Config, ConfigError, Secret};
use crate::ingress::access::Access;
use crate::ingress::pairing::{Pairing, PairingError, PendingView};
use crate::store::StoreError;

/// How long the CLI waits for a running serve.
const API_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest answer read from the API.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// What `antler pairing` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PairingAction {
    /// Show the pending requests.
    List,
    /// Approve a code (as an admin with `admin`).
    Approve {
        /// The code the user was given.
        code: String,
        /// Approve them as an operator.
        admin: bool,
    },
    /// Deny a code.
    Deny {
        /// The code the user was given.
        code: String,
    },
}

/// Why `antler pairing` failed.
#[derive(Debug, thiserror::Error)]
pub enum PairingCliError {
    /// The configuration does not load.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No pending request has the code.
    #[error("no pending pairing request has this code (it may have expired after an hour)")]
    UnknownCode,
    /// The running serve refused or failed the request.
    #[error("the running antler at {url} answered {status}: {message}")]
    Api {
        url: String,
        status: u16,
        message: String,
    },
    /// The running serve could not be asked.
    #[error("cannot reach the running antler at {url}: {detail}")]
    Unreachable { url: String, detail: String },
    /// No serve answered and the store could not be used directly.
    #[error("{0}")]
    Store(String),
    /// The output could not be written.
    #[error("cannot write the answer: {0}")]
    Output(#[from] std::io::Error),
}

impl From<PairingError> for PairingCliError {
    fn from(e: PairingError) -> Self {
        match e {
            PairingError::UnknownCode => Self::UnknownCode,
            PairingError::Store(e) => Self::Store(e.to_string()),
        }
    }
}

impl From<StoreError> for PairingCliError {
    fn from(e: StoreError) -> Self {
        Self::Store(e.to_string())
    }
}

/// Runs `action` for the antler `config_path` configures, writing what happened to `out`.
pub async fn run(
    config_path: &Path,
    action: &PairingAction,
    out: &mut (dyn Write + Send),
) -> Result<(), PairingCliError> {
    let config = Config::load(config_path)?;
    let base = base_url(config.server.listen);
    if config.channels.api.enabled {
        match through_api(&config, &base, action).await {
            Ok(answer) => return report(&answer, true, out),
            Err(Reach::NoServe) => {}
            Err(Reach::Failed(e)) => return Err(e),
        }
    }
    let answer = on_store(&config, &base, action).await?;
    report(&answer, false, out)
}

/// The base URL of the serve listening on `listen` (a wildcard address is reached on
/// loopback).
fn base_url(listen: SocketAddr) -> String {
    let ip = match listen.ip() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, listen.port()))
}

/// An admin token of the API: `channels.api.token`, else the first admin entry of
/// `[[channels.api.tokens]]`.
fn admin_token(config: &Config) -> Option<&Secret> {
    let api = &config.channels.api;
    api.token.as_ref().or_else(|| {
        api.tokens
            .iter()
            .find(|entry| entry.role == ApiRole::Admin)
            .map(|entry| &entry.token)
    })
}

/// What the serve or the store answered.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Answer {
    Pending(Vec<PendingView>),
    Approved(Person),
    Denied(Person),
}

/// Whom a decision was about.
#[derive(Debug, Deserialize)]
struct Person {
    channel: String,
    user_id: String,
    #[serde(default)]
    admin: bool,
}

/// Why the API gave no answer.
enum Reach {
    /// Nothing listens: no serve runs.
    NoServe,
    Failed(PairingCliError),
}

async fn through_api(config: &Config, base: &str, action: &PairingAction) -> Result<Answer, Reach> {
    let failed = |detail: String| {
        Reach::Failed(PairingCliError::Unreachable {
            url: base.to_owned(),
            detail,
        })
    };
    let client = reqwest::Client::builder()
        .timeout(API_TIMEOUT)
        .build()
        .map_err(|e| failed(e.to_string()))?;
    let request = match action {
        PairingAction::List => client.get(format!("{base}/api/v1/pairing")),
        PairingAction::Approve { code, admin } => client
            .post(format!("{base}/api/v1/pairing/approve"))
            .json(&json!({"code": code, "admin": admin})),
        PairingAction::Deny { code } => client
            .post(format!("{base}/api/v1/pairing/deny"))
            .json(&json!({"code": code})),
    };
    let request = match admin_token(config) {
        Some(token) => request.bearer_auth(token.expose()),
        None => request,
    };
    let response = match request.send().await {
        Ok(response) => response,
        Err(e) if e.is_connect() => return Err(Reach::NoServe),
        // Without the URL: the error's text is enough, and it never holds the token.
        Err(e) => return Err(failed(e.without_url().to_string())),
    };
    let status = response.status();
    let body = read_limited(response).await.map_err(failed)?;
    if status == reqwest::StatusCode::NOT_FOUND
        && !matches!(action, PairingAction::List)
        && body.get("error").is_some_and(|e| e["code"] == "not_found")
    {
        return Err(Reach::Failed(PairingCliError::UnknownCode));
    }
    if !status.is_success() {
        let message = body["error"]["message"]
            .as_str()
            .unwrap_or("no message")
            .chars()
            .take(500)
            .collect();
        return Err(Reach::Failed(PairingCliError::Api {
            url: base.to_owned(),
            status: status.as_u16(),
            message,
        }));
    }
    serde_json::from_value(body).map_err(|e| failed(format!("an answer antler cannot read: {e}")))
}

async fn read_limited(mut response: reqwest::Response) -> Result<serde_json::Value, String> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| e.without_url().to_string())?
    {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(format!("an answer over {MAX_ANSWER_BYTES} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).map_err(|e| format!("an answer that is not JSON: {e}"))
}

/// Decides on the store itself, when no serve runs.
async fn on_store(
    config: &Config,
    base: &str,
    action: &PairingAction,
) -> Result<Answer, PairingCliError> {
    let store = crate::app::store_backend::open(&config.store)
        .await
        .map_err(|e| match e {
            StoreError::InUse { .. } => PairingCliError::Store(format!(
                "{e}, but no antler answers at {base} (is channels.api enabled, and \
                 server.listen the serve's address?)"
            )),
            e => PairingCliError::Store(e.to_string()),
        })?;
    let pairing = Pairing::new(store, Arc::new(Access::default()));
    Ok(match action {
        PairingAction::List => Answer::Pending(pairing.list().await?),
        PairingAction::Approve { code, admin } => {
            let user = pairing.approve(code, *admin).await?;
            Answer::Approved(Person {
                channel: user.channel,
                user_id: user.user_id,
                admin: user.admin,
            })
        }
        PairingAction::Deny { code } => {
            let request = pairing.deny(code).await?;
            Answer::Denied(Person {
                channel: request.channel,
                user_id: request.user_id,
                admin: false,
            })
        }
    })
}

/// Writes what happened; `live`: a running serve decided (and applies it already).
fn report(
    answer: &Answer,
    live: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), PairingCliError> {
    let clean = |text: &str| crate::logging::sanitize_for_terminal(text);
    match answer {
        Answer::Pending(pending) if pending.is_empty() => {
            writeln!(out, "no pending pairing requests")?;
        }
        Answer::Pending(pending) => {
            writeln!(
                out,
                "CODE      CHANNEL   USER ID              EXPIRES IN  NAME"
            )?;
            for request in pending {
                writeln!(
                    out,
                    "{:<9} {:<9} {:<20} {:>7} min  {}",
                    request.code,
                    clean(&request.channel),
                    clean(&request.user_id),
                    request.expires_in_secs.div_ceil(60),
                    clean(request.name.as_deref().unwrap_or("")),
                )?;
            }
        }
        Answer::Approved(user) => {
            writeln!(
                out,
                "approved {} user {}{}; {}",
                clean(&user.channel),
                clean(&user.user_id),
                if user.admin { " as an admin" } else { "" },
                if live {
                    "they may talk now"
                } else {
                    "they may talk once antler serves"
                }
            )?;
        }
        Answer::Denied(user) => {
            writeln!(
                out,
                "denied the pairing request of {} user {}",
                clean(&user.channel),
                clean(&user.user_id)
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SledStore;

    #[test]
    fn a_wildcard_listen_address_is_reached_on_loopback() {
        assert_eq!(
            base_url("0.0.0.0:8080".parse().unwrap()),
            "http://127.0.0.1:8080"
        );
        assert_eq!(base_url("[::]:9".parse().unwrap()), "http://[::1]:9");
        assert_eq!(
            base_url("10.0.0.2:80".parse().unwrap()),
            "http://10.0.0.2:80"
        );
    }

    #[tokio::test]
    async fn without_a_serve_the_cli_decides_on_the_store() {
        let dir = std::env::temp_dir().join(format!("antler-pairing-cli-{}", uuid::Uuid::new_v4()));
        let config_path = dir.join("antler.toml");
        std::fs::create_dir_all(&dir).unwrap();
        // A port nothing listens on: bound, then let go.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        std::fs::write(
            &config_path,
            format!(
                "[server]\nlisten = \"127.0.0.1:{port}\"\n[store]\npath = \"{}\"\n\
                 [model]\nbase_url = \"http://127.0.0.1:9\"\nmodel = \"m\"\n",
                dir.join("data").display()
            ),
        )
        .unwrap();
        let code = {
            let store = Arc::new(SledStore::open(&dir.join("data"), 1 << 20).unwrap());
            let pairing = Pairing::new(store, Arc::new(Access::default()));
            let user = antler_channel::UserRef {
                id: "42".to_owned(),
                name: None,
                admin: false,
                aliases: Vec::new(),
            };
            pairing.code_for("telegram", &user).await.unwrap()
        };
        let mut out = Vec::new();
        run(&config_path, &PairingAction::List, &mut out)
            .await
            .unwrap();
        let listed = String::from_utf8(out).unwrap();
        assert!(listed.contains(&code) && listed.contains("42"), "{listed}");
        let mut out = Vec::new();
        let approve = PairingAction::Approve {
            code: code.clone(),
            admin: true,
        };
        run(&config_path, &approve, &mut out).await.unwrap();
        let said = String::from_utf8(out).unwrap();
        assert!(
            said.contains("approved telegram user 42 as an admin"),
            "{said}"
        );
        let again = run(&config_path, &approve, &mut Vec::new()).await;
        assert!(
            matches!(again, Err(PairingCliError::UnknownCode)),
            "{again:?}"
        );
        let store = SledStore::open(&dir.join("data"), 1 << 20).unwrap();
        let users = crate::store::PairingStore::paired_users(&store)
            .await
            .unwrap();
        assert_eq!(users.len(), 1);
        assert!(users[0].admin);
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
