//! The [`Store`](super::Store) on PostgreSQL, for several replicas sharing one database: one
//! table per collection (`migrations/`), each trait method one transaction that reads, applies
//! the [`rules`](super::rules) and writes what they return. Records written with every message
//! (inbox and outbox items, thread messages) are the store's own binary records (`records`);
//! the rest are the JSON sled keeps, as `jsonb`.
//!
//! | table | key | holds |
//! |---|---|---|
//! | `antler_schema_migrations` | version | the migrations applied |
//! | `antler_counters` | shard (0..16) | inbox and pending outbox counts, summed for [`StoreStats`](super::StoreStats) |
//! | `antler_conversations` | conversation key | [`ConversationRecord`](super::ConversationRecord) |
//! | `antler_threads`, `antler_messages` | thread id, (thread id, index) | metadata, one message each |
//! | `antler_inbox` | seq (`antler_inbox_seq`) | an [`InboxItem`](super::InboxItem) record |
//! | `antler_dedupe` | (conversation, event id) | expiry, thread, seq |
//! | `antler_outbox` | [`super::outbox_seq`] | an [`OutboxItem`](super::OutboxItem) record |
//! | `antler_memory`, `antler_memory_queue` | user key, (user key, thread id) | documents, updates |
//! | `antler_subagents`, `antler_subagent_calls` | task id, (thread, turn, call id) | tasks |
//! | `antler_leases` | lease name | the store's lease (`store`) |
//! | `antler_skills`, `antler_pairing_requests`, `antler_paired_users` | name, (channel, user) | |
//! | `antler_schedules`, `antler_schedule_marks`, `antler_approvals` | name, name, id | |
//!
//! Transactions run at READ COMMITTED and lock what they change (`FOR UPDATE`, and an insert
//! that loses a race runs the transaction again); a serialization failure or a deadlock runs
//! the transaction again too (a few times, then [`StoreError::Conflict`]). Reads of one
//! statement run without a transaction. A lost connection is [`StoreError::Unavailable`],
//! except where nothing was done yet (a transaction that could not start, a read): that runs
//! again on a live connection.

mod copy;
mod inbox;
mod inspect;
mod memory;
mod migrate;
mod registry;
mod replicas;
mod settings;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use rustls::ClientConfig;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::StoreError;

pub(crate) use migrate::mask_url;

/// How long connecting may take when the URL does not say (`connect_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a caller waits for a pooled connection when every one is busy.
const POOL_WAIT: Duration = Duration::from_secs(30);
/// How often a transaction runs when other transactions keep getting in its way.
const ATTEMPTS: u32 = 8;

/// Where the PostgreSQL store is.
#[derive(Clone)]
pub(crate) struct PgOptions {
    /// `postgres://user:password@host/db`: a secret (the password), never in logs or errors.
    pub(crate) url: String,
    /// Connections kept open at most.
    pub(crate) pool_size: usize,
    /// A schema of its own (tests); created when missing. `None`: the URL's `search_path`.
    pub(crate) schema: Option<String>,
    /// The replica this store works for (`antler serve`: `<replica>/<id>`), which holds
    /// conversations ([`crate::store::ReplicaStore`]); `None` for commands that run no turns.
    pub(crate) owner: Option<String>,
}

impl std::fmt::Debug for PgOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOptions")
            .field("url", &mask_url(&self.url))
            .field("pool_size", &self.pool_size)
            .field("schema", &self.schema)
            .field("owner", &self.owner)
            .finish()
    }
}

/// The PostgreSQL-backed store. Clones share the pool.
#[derive(Clone)]
pub(crate) struct PgStore {
    pool: Pool,
    /// How to open a connection of its own (the one that listens for notices).
    connector: Arc<Connector>,
    /// The replica this store works for, if any (see [`PgOptions::owner`]).
    owner: Option<Arc<str>>,
    /// The URL with its password masked, for messages.
    path: Arc<str>,
    /// The size of antler's tables and when it was measured: measuring costs milliseconds
    /// (a file size per table and index), so it is done at most every [`DISK_SIZE_AGE`].
    disk_bytes: Arc<Mutex<Option<(tokio::time::Instant, u64)>>>,
}

/// How long a measured disk size is reported before it is measured again.
const DISK_SIZE_AGE: Duration = Duration::from_secs(30);

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects (does not wait or retry: an unreachable database is
    /// [`StoreError::Unavailable`] at once) and applies pending migrations under an advisory
    /// lock, so replicas starting together are safe.
    pub(crate) async fn open(options: &PgOptions) -> Result<Self, StoreError> {
        let connector = Arc::new(Connector::new(options)?);
        let store = Self {
            pool: connector.pool(options.pool_size)?,
            connector,
            owner: options.owner.as_deref().map(Arc::from),
            path: Arc::from(mask_url(&options.url)),
            disk_bytes: Arc::default(),
        };
        let mut client = store.client().await?;
        migrate::apply(&mut client, &store.path, options.schema.as_deref()).await?;
        Ok(store)
    }

    /// Applies pending migrations only; returns the schema version before and after.
    pub(crate) async fn migrate(options: &PgOptions) -> Result<(u32, u32), StoreError> {
        let pool = Connector::new(options)?.pool(options.pool_size)?;
        let mut client = pool.get().await.map_err(pool_error)?;
        migrate::apply(
            &mut client,
            &mask_url(&options.url),
            options.schema.as_deref(),
        )
        .await
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        self.pool.get().await.map_err(pool_error)
    }

    /// The disk size measured less than [`DISK_SIZE_AGE`] ago, if any.
    fn recent_disk_bytes(&self) -> Option<u64> {
        let measured = *self.disk_bytes.lock().ok()?;
        measured
            .filter(|(at, _)| at.elapsed() < DISK_SIZE_AGE)
            .map(|(_, bytes)| bytes)
    }

    fn measured_disk_bytes(&self, bytes: u64) {
        if let Ok(mut measured) = self.disk_bytes.lock() {
            *measured = Some((tokio::time::Instant::now(), bytes));
        }
    }

    /// Drops the pooled connections that were lost, so the next call gets a live one.
    fn forget_closed(&self) {
        self.pool.retain(|client, _| !client.is_closed());
    }
}

/// Where and how to connect: the parsed URL (with the schema of [`PgOptions::schema`]) and
/// the TLS it asks for (see [`TlsMode`]).
struct Connector {
    config: tokio_postgres::Config,
    /// `None`: plain TCP (`sslmode=disable`).
    tls: Option<ClientConfig>,
}

impl Connector {
    fn new(options: &PgOptions) -> Result<Self, StoreError> {
        let (url, mode) = tls_mode(&options.url)?;
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            StoreError::Invalid(format!(
                "the database URL {} is not valid: {e}",
                mask_url(&options.url)
            ))
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("antler");
        }
        if let Some(schema) = &options.schema {
            migrate::check_schema_name(schema)?;
            let path = format!("-c search_path={schema}");
            let startup = match config.get_options() {
                Some(given) => format!("{given} {path}"),
                None => path,
            };
            config.options(&startup);
        }
        Ok(Self {
            config,
            tls: tls_config(mode)?,
        })
    }

    /// A pool of at most `size` connections, made on first use.
    fn pool(&self, size: usize) -> Result<Pool, StoreError> {
        match &self.tls {
            Some(tls) => pool_with(
                self.config.clone(),
                MakeRustlsConnect::new(tls.clone()),
                size,
            ),
            None => pool_with(self.config.clone(), NoTls, size),
        }
    }
}

/// What a URL's `sslmode` asks of the connection, as libpq reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TlsMode {
    /// Plain TCP only.
    Disable,
    /// TLS when the server offers it, plain otherwise; the certificate is not checked (the
    /// default, as in libpq).
    Prefer,
    /// TLS or no connection; the certificate is not checked (libpq's `require` encrypts
    /// against eavesdroppers, not against a server pretending to be the database).
    Require,
    /// TLS with a certificate chained to a trusted root; any host name.
    VerifyCa,
    /// TLS with a certificate chained to a trusted root and naming the host connected to.
    VerifyFull,
}

/// The URL's `sslmode` and the URL to hand to tokio-postgres, which knows `disable`,
/// `prefer` and `require` only: the two verifying modes are passed on as `require`, and the
/// verification is done by the connector [`tls_config`] builds. Both the URL form
/// (`postgres://...?sslmode=verify-full`) and the key-value form (`host=... sslmode=...`)
/// are read.
fn tls_mode(url: &str) -> Result<(String, TlsMode), StoreError> {
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let separator = if is_url { '&' } else { ' ' };
    let (head, params) = if is_url {
        match url.split_once('?') {
            Some((head, query)) => (format!("{head}?"), query),
            None => return Ok((url.to_owned(), TlsMode::Prefer)),
        }
    } else {
        (String::new(), url)
    };
    let mut mode = TlsMode::Prefer;
    let mut kept = Vec::new();
    for param in params.split(separator) {
        let Some(value) = param.trim().strip_prefix("sslmode=") else {
            kept.push(param.to_owned());
            continue;
        };
        let (given, passed) = match value {
            "disable" => (TlsMode::Disable, value),
            "prefer" => (TlsMode::Prefer, value),
            "require" => (TlsMode::Require, value),
            "verify-ca" => (TlsMode::VerifyCa, "require"),
            "verify-full" => (TlsMode::VerifyFull, "require"),
            other => {
                return Err(StoreError::Invalid(format!(
                    "the database URL's sslmode `{other}` is not one of disable, prefer, \
                     require, verify-ca, verify-full"
                )));
            }
        };
        mode = given;
        kept.push(param.replacen(value, passed, 1));
    }
    Ok((format!("{head}{}", kept.join(&separator.to_string())), mode))
}

/// The rustls client configuration for `mode` (`None`: no TLS). It carries its own `ring`
/// provider, so it needs no process-wide one. The verifying modes use the system's root
/// certificates (`ca-certificates` in the image).
fn tls_config(mode: TlsMode) -> Result<Option<ClientConfig>, StoreError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::backend(format!("cannot set up TLS: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        TlsMode::Disable => return Ok(None),
        TlsMode::Prefer | TlsMode::Require => Arc::new(tls::Unverified(provider)),
        TlsMode::VerifyCa | TlsMode::VerifyFull => {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = rustls::RootCertStore::empty();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(StoreError::Invalid(
                    "the database URL's sslmode verifies the server's certificate, but no \
                     root certificates were found on this system (install ca-certificates)"
                        .to_owned(),
                ));
            }
            let chain = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| StoreError::backend(format!("cannot set up TLS: {e}")))?;
            if mode == TlsMode::VerifyFull {
                chain
            } else {
                Arc::new(tls::AnyName(chain))
            }
        }
    };
    Ok(Some(
        builder
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth(),
    ))
}

/// The certificate checks of the modes that rustls's own verifier does not cover.
mod tls {
    use std::sync::Arc;

    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{CertificateError, DigitallySignedStruct, Error, SignatureScheme};

    /// `prefer` and `require`: any certificate is taken, as libpq does; the handshake's
    /// signatures are still checked, so the session's keys belong to that certificate.
    #[derive(Debug)]
    pub(super) struct Unverified(pub(super) Arc<CryptoProvider>);

    impl ServerCertVerifier for Unverified {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp_response: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    /// `verify-ca`: the chain must lead to a trusted root; the name in the certificate is not
    /// compared with the host. rustls checks the chain before the name, so a name mismatch
    /// means the chain passed.
    #[derive(Debug)]
    pub(super) struct AnyName(pub(super) Arc<WebPkiServerVerifier>);

    impl ServerCertVerifier for AnyName {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            server_name: &ServerName<'_>,
            ocsp_response: &[u8],
            now: UnixTime,
        ) -> Result<ServerCertVerified, Error> {
            match self.0.verify_server_cert(
                end_entity,
                intermediates,
                server_name,
                ocsp_response,
                now,
            ) {
                Err(Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                )) => Ok(ServerCertVerified::assertion()),
                other => other,
            }
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            self.0.verify_tls12_signature(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            self.0.verify_tls13_signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.supported_verify_schemes()
        }
    }
}

/// A pool connecting with `tls`: [`NoTls`] for `sslmode=disable`, a rustls connector
/// otherwise.
fn pool_with<T>(config: tokio_postgres::Config, tls: T, size: usize) -> Result<Pool, StoreError>
where
    T: MakeTlsConnect<Socket> + Clone + Sync + Send + 'static,
    T::Stream: Sync + Send,
    T::TlsConnect: Sync + Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let connect_timeout = config.get_connect_timeout().copied();
    let manager = Manager::from_config(
        config,
        tls,
        ManagerConfig {
            // A broken connection fails its query and the pool drops it; checking each one
            // before use would cost a round trip per transaction.
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size.max(1))
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(POOL_WAIT))
        .create_timeout(connect_timeout.or(Some(CONNECT_TIMEOUT)))
        .build()
        .map_err(|e| StoreError::backend(format!("cannot build the connection pool: {e}")))
}

/// The store error of a driver error: the connection or the server going away is
/// unavailable (retryable); the rest is a backend failure.
fn db_error(e: tokio_postgres::Error) -> StoreError {
    let unavailable = match e.code() {
        Some(code) => {
            let class = code.code().get(..2);
            // 08: connection exceptions; 57P0x: shutdowns; 53: insufficient resources.
            class == Some("08")
                || class == Some("53")
                || [
                    SqlState::ADMIN_SHUTDOWN,
                    SqlState::CRASH_SHUTDOWN,
                    SqlState::CANNOT_CONNECT_NOW,
                ]
                .contains(code)
        }
        None => {
            // Connect timeouts are I/O errors (`TimedOut`) too.
            e.is_closed() || std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>())
        }
    };
    // A server without TLS when the URL's sslmode requires it, or a certificate the mode
    // refuses: tokio-postgres tells these apart only in its message. Unavailable, so `serve`
    // waits (the server may be given TLS or a certificate) while /readyz shows the message.
    if e.code().is_none() && e.to_string().starts_with("error performing TLS handshake") {
        // The reason (no TLS, which certificate check failed) is the source, not the message.
        let reason = std::error::Error::source(&e).map_or_else(String::new, |s| format!(": {s}"));
        return StoreError::unavailable(format!(
            "{e}{reason} (TLS as the database URL's sslmode asks)"
        ));
    }
    if unavailable {
        StoreError::unavailable(e)
    } else {
        StoreError::backend(e)
    }
}

fn pool_error(e: deadpool_postgres::PoolError) -> StoreError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => db_error(e),
        deadpool_postgres::PoolError::Timeout(_)
        | deadpool_postgres::PoolError::Closed
        | deadpool_postgres::PoolError::PostCreateHook(_) => {
            StoreError::unavailable(format!("no database connection: {e}"))
        }
        deadpool_postgres::PoolError::NoRuntimeSpecified => StoreError::backend(e.to_string()),
    }
}

/// What stopped a transaction.
enum Failure {
    /// Another transaction got in the way (a serialization failure, a deadlock, an insert
    /// that lost a race): running it again will see what that one did.
    Again(String),
    /// The transaction could not start on its connection (lost, e.g. the server restarted):
    /// nothing was done, so it may run again on another connection.
    Unstarted(StoreError),
    Store(StoreError),
}

impl Failure {
    /// The failure of a transaction's start.
    fn unstarted(e: tokio_postgres::Error) -> Self {
        match db_error(e) {
            e @ StoreError::Unavailable(_) => Self::Unstarted(e),
            e => Self::Store(e),
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        match e.code() {
            Some(code)
                if *code == SqlState::T_R_SERIALIZATION_FAILURE
                    || *code == SqlState::T_R_DEADLOCK_DETECTED =>
            {
                Self::Again(e.to_string())
            }
            _ => Self::Store(db_error(e)),
        }
    }
}

/// Pins the error type of a transaction's body.
fn body<T, F>(future: F) -> F
where
    F: Future<Output = Result<T, Failure>>,
{
    future
}

/// Waits a little before a transaction runs again, longer with each attempt and never the
/// same for two transactions, so two that deadlocked do not meet again.
async fn back_off(attempt: u32) {
    let ms = fastrand::u64(1..=5 * u64::from(attempt));
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// Runs `$body` (a block evaluating to `Result<T, Failure>`, with the transaction as `$tx`)
/// in a transaction and commits it, running it again when another transaction got in its
/// way. A macro, not a function taking a closure, because the body borrows the transaction
/// across awaits.
macro_rules! transaction {
    ($store:expr, |$tx:ident| $body:block) => {
        $crate::store::pg_store::transaction!(
            $store,
            tokio_postgres::IsolationLevel::ReadCommitted,
            |$tx| $body
        )
    };
    ($store:expr, $isolation:expr, |$tx:ident| $body:block) => {{
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut client = $store.client().await?;
            let outcome: Result<_, $crate::store::pg_store::Failure> = async {
                let started = client
                    .build_transaction()
                    .isolation_level($isolation)
                    .start()
                    .await;
                let $tx = match started {
                    Ok(tx) => tx,
                    Err(e) => return Err($crate::store::pg_store::Failure::unstarted(e)),
                };
                let value = $crate::store::pg_store::body(async { $body }).await?;
                $tx.commit().await?;
                Ok(value)
            }
            .await;
            match outcome {
                Ok(value) => break Ok(value),
                Err($crate::store::pg_store::Failure::Again(why))
                    if attempt < $crate::store::pg_store::ATTEMPTS =>
                {
                    tracing::debug!(attempt, %why, "store transaction runs again");
                    $crate::store::pg_store::back_off(attempt).await;
                }
                Err($crate::store::pg_store::Failure::Again(why)) => {
                    break Err(StoreError::Conflict(format!(
                        "other writers kept getting in the way ({why})"
                    )));
                }
                Err($crate::store::pg_store::Failure::Unstarted(e))
                    if attempt < $crate::store::pg_store::ATTEMPTS =>
                {
                    tracing::debug!(attempt, error = %e, "store transaction starts again");
                    $store.forget_closed();
                }
                Err(
                    $crate::store::pg_store::Failure::Unstarted(e)
                    | $crate::store::pg_store::Failure::Store(e),
                ) => break Err(e),
            }
        }
    }};
}
use transaction;

/// The outbox items of `rows` (column 0: the record).
fn outbox_items(rows: &[tokio_postgres::Row]) -> Result<Vec<crate::store::OutboxItem>, Failure> {
    use crate::store::records::Record;
    rows.iter()
        .map(|row| Ok(crate::store::OutboxItem::from_record(get(row, 0)?)?))
        .collect()
}

/// The rows of `sql` (prepared once per connection).
async fn rows(
    tx: &impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, Failure> {
    let statement = tx.prepare_cached(sql).await?;
    Ok(tx.query(&statement, params).await?)
}

/// The row of `sql`, if any.
async fn row(
    tx: &impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Option<Row>, Failure> {
    let statement = tx.prepare_cached(sql).await?;
    Ok(tx.query_opt(&statement, params).await?)
}

/// Runs `sql`; the number of rows it changed.
async fn exec(
    tx: &impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64, Failure> {
    let statement = tx.prepare_cached(sql).await?;
    Ok(tx.execute(&statement, params).await?)
}

/// Column `index` of `row`.
fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    index: usize,
) -> Result<T, Failure> {
    Ok(row.try_get(index)?)
}

/// A value as a database integer.
fn int(value: u64) -> Result<i64, StoreError> {
    i64::try_from(value)
        .map_err(|_| StoreError::Invalid(format!("{value} is too large for the database")))
}

/// A bound of a query (a time to compare with, a limit) as a database integer: one past the
/// largest means no bound.
fn bound(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A database integer as an unsigned value.
fn uint(what: &'static str, value: i64) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Codec {
        what,
        detail: format!("negative: {value}"),
    })
}

fn to_json<T: Serialize>(what: &'static str, value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Codec {
        what,
        detail: e.to_string(),
    })
}

fn from_json<T: DeserializeOwned>(what: &'static str, text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Codec {
        what,
        detail: e.to_string(),
    })
}

/// The JSON record in column `index` of `row` (selected as `record::text`).
fn json<T: DeserializeOwned>(what: &'static str, row: &Row, index: usize) -> Result<T, Failure> {
    let text: &str = get(row, index)?;
    Ok(from_json(what, text)?)
}

/// The JSON records in column 0 of `rows`.
fn all_json<T: DeserializeOwned>(what: &'static str, rows: &[Row]) -> Result<Vec<T>, Failure> {
    rows.iter().map(|row| json(what, row, 0)).collect()
}

fn missing(what: &'static str, key: impl ToString) -> Failure {
    Failure::Store(StoreError::Missing {
        what,
        key: key.to_string(),
    })
}

/// Runs `$body` (a block evaluating to `Result<T, Failure>`) with a pooled connection as
/// `$db`, outside a transaction: for reads of one statement, which see one snapshot anyway.
/// A read that failed because its connection was lost runs again on another connection.
macro_rules! read {
    ($store:expr, |$db:ident| $body:block) => {{
        let mut attempt = 0;
        loop {
            attempt += 1;
            let $db = $store.client().await?;
            match $crate::store::pg_store::body(async { $body }).await {
                Ok(value) => break Ok(value),
                Err(
                    $crate::store::pg_store::Failure::Store(e @ StoreError::Unavailable(_))
                    | $crate::store::pg_store::Failure::Unstarted(e),
                ) if attempt < $crate::store::pg_store::ATTEMPTS => {
                    tracing::debug!(attempt, error = %e, "store read runs again");
                    drop($db);
                    $store.forget_closed();
                }
                Err(
                    $crate::store::pg_store::Failure::Store(e)
                    | $crate::store::pg_store::Failure::Unstarted(e),
                ) => break Err(e),
                Err($crate::store::pg_store::Failure::Again(why)) => {
                    break Err(StoreError::Conflict(why));
                }
            }
        }
    }};
}
use read;
