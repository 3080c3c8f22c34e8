//! The PostgreSQL store's tests: the conformance suite and what only this backend has
//! (migrations, connection errors). Each test works in a schema of its own, dropped at its
//! end. They need a server: `ANTLER_TEST_DATABASE_URL` (or `DATABASE_URL`); without one each
//! test says so and passes.

use std::sync::Arc;
use std::time::Duration;

use super::migrate::SCHEMA_VERSION;
use super::*;
use crate::store::conformance::{Backend, conformance};
use crate::store::{FinishTurn, InboxStore, MaintenanceStore, ReplicaStore, SkillStore, Store};

/// The test database's URL, if the environment names one.
fn database_url() -> Option<String> {
    ["ANTLER_TEST_DATABASE_URL", "DATABASE_URL"]
        .into_iter()
        .filter_map(|name| std::env::var(name).ok())
        .find(|url| !url.trim().is_empty())
}

/// Whether the PostgreSQL tests cannot run here; says so when they cannot.
fn skipped() -> bool {
    if database_url().is_some() {
        return false;
    }
    eprintln!("skipped: set ANTLER_TEST_DATABASE_URL to run the PostgreSQL tests");
    true
}

/// Options for a fresh schema of the test database.
fn fresh_options() -> PgOptions {
    PgOptions {
        url: database_url().unwrap(),
        pool_size: 4,
        schema: Some(format!("t_{}", uuid::Uuid::new_v4().simple())),
        owner: None,
    }
}

/// `url` with `password` for its user, when it names a user without one.
fn with_password(url: &str, password: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((user, host)) if !user.contains(':') => {
                format!("{scheme}://{user}:{password}@{host}")
            }
            _ => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// Drops the schema of `options` (best effort: a test that fails leaves it behind otherwise).
async fn drop_schema(options: &PgOptions) {
    let (Ok((client, connection)), Some(schema)) = (
        tokio_postgres::connect(&options.url, NoTls).await,
        &options.schema,
    ) else {
        return;
    };
    let connection = tokio::spawn(connection);
    let _ = client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .await;
    drop(client);
    let _ = connection.await;
}

/// Stores in a schema of their own, reopened in place; the schema goes with the backend.
struct PgBackend(Option<PgOptions>);

impl PgBackend {
    fn new() -> Self {
        Self(database_url().map(|_| fresh_options()))
    }
}

impl Backend for PgBackend {
    fn open(&self) -> Arc<dyn Store> {
        let options = self.0.as_ref().unwrap();
        let store = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(PgStore::open(options))
        });
        Arc::new(store.unwrap())
    }
}

impl Drop for PgBackend {
    fn drop(&mut self) {
        let Some(options) = &self.0 else {
            return;
        };
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            tokio::task::block_in_place(|| handle.block_on(drop_schema(options)));
        }
    }
}

conformance!(PgBackend::new(), skip_if skipped());

/// Runs `test` with options for a fresh schema, then drops the schema (also when the test
/// fails).
async fn in_fresh_schema<F, Fut>(test: F)
where
    F: FnOnce(PgOptions) -> Fut,
    Fut: Future<Output = ()>,
{
    use futures_util::FutureExt;
    let options = fresh_options();
    let outcome = std::panic::AssertUnwindSafe(test(options.clone()))
        .catch_unwind()
        .await;
    drop_schema(&options).await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

#[tokio::test]
async fn migrations_apply_once_and_a_newer_schema_is_refused() {
    if skipped() {
        return;
    }
    in_fresh_schema(|options| async move {
        assert_eq!(PgStore::migrate(&options).await.unwrap(), (0, SCHEMA_VERSION));
        assert_eq!(
            PgStore::migrate(&options).await.unwrap(),
            (SCHEMA_VERSION, SCHEMA_VERSION)
        );
        let store = PgStore::open(&options).await.unwrap();
        assert_eq!(store.stats().await.unwrap().inbox, 0);
        let client = store.client().await.unwrap();
        client
            .batch_execute("INSERT INTO antler_schema_migrations (version) VALUES (999)")
            .await
            .unwrap();
        drop(client);
        // A password in the URL (trust authentication ignores it) is never shown.
        let secret = PgOptions {
            url: with_password(&options.url, "s3cret-pw"),
            ..options.clone()
        };
        let refused = PgStore::open(&secret).await.unwrap_err();
        assert!(
            matches!(
                &refused,
                StoreError::NewerSchema { found: 999, supported, .. } if *supported == SCHEMA_VERSION
            ),
            "{refused:?}"
        );
        assert!(!refused.is_retryable());
        let shown = format!("{refused} {refused:?}");
        assert!(shown.contains(&mask_url(&secret.url)), "{shown}");
        assert!(!shown.contains("s3cret-pw"), "{shown}");
        assert!(matches!(
            PgStore::migrate(&options).await,
            Err(StoreError::NewerSchema { .. })
        ));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_migrating_together_both_succeed() {
    if skipped() {
        return;
    }
    in_fresh_schema(|options| async move {
        let (a, b) = tokio::join!(PgStore::migrate(&options), PgStore::migrate(&options));
        let mut versions = [a.unwrap(), b.unwrap()];
        versions.sort();
        assert_eq!(
            versions,
            [(0, SCHEMA_VERSION), (SCHEMA_VERSION, SCHEMA_VERSION)]
        );
        let (a, b) = tokio::join!(PgStore::open(&options), PgStore::open(&options));
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!(a.skill_switches().await.unwrap().is_empty());
        b.set_skill_switch("x", true).await.unwrap();
        assert_eq!(a.skill_switches().await.unwrap().get("x"), Some(&true));
    })
    .await;
}

#[tokio::test]
async fn an_unreachable_database_is_unavailable_at_once_and_the_password_stays_secret() {
    // No server needed: nothing listens on port 1.
    let options = PgOptions {
        url: "postgres://antler:s3cret-pw@127.0.0.1:1/antler".to_owned(),
        pool_size: 2,
        schema: None,
        owner: None,
    };
    assert!(!format!("{options:?}").contains("s3cret-pw"));
    let started = std::time::Instant::now();
    let refused = PgStore::open(&options).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(matches!(refused, StoreError::Unavailable(_)), "{refused:?}");
    assert!(refused.is_retryable());
    for shown in [refused.to_string(), format!("{refused:?}")] {
        assert!(!shown.contains("s3cret-pw"), "{shown}");
    }
    let refused = PgStore::migrate(&options).await.unwrap_err();
    assert!(matches!(refused, StoreError::Unavailable(_)), "{refused:?}");

    // A host that never answers: the connect timeout ends the wait.
    let options = PgOptions {
        url: "postgres://antler:s3cret-pw@10.255.255.1:5432/antler?connect_timeout=1".to_owned(),
        ..options
    };
    let started = std::time::Instant::now();
    let refused = PgStore::open(&options).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "{refused}");
    assert!(matches!(refused, StoreError::Unavailable(_)), "{refused:?}");
    assert!(!format!("{refused} {refused:?}").contains("s3cret-pw"));
}

#[test]
fn urls_are_shown_with_their_password_masked() {
    assert_eq!(
        mask_url("postgres://u:secret@db.example:5432/antler?sslmode=disable"),
        "postgres://u:***@db.example:5432/antler?sslmode=disable"
    );
    assert_eq!(
        mask_url("postgresql://u@db/antler"),
        "postgresql://u@db/antler"
    );
    assert_eq!(
        mask_url("postgres://db/antler?user=u&password=secret"),
        "postgres://db/antler?***"
    );
    assert_eq!(mask_url("host=db password=secret"), "postgres");
    assert_eq!(
        mask_url("postgres://u:p@ss:w@rd@db/x"),
        "postgres://u:***@db/x"
    );
}

#[test]
fn schema_names_that_would_need_quoting_are_refused() {
    assert!(migrate::check_schema_name("t_0a9").is_ok());
    for bad in ["", "9t", "T", "a-b", "a\"b", "a;b"] {
        assert!(migrate::check_schema_name(bad).is_err(), "{bad}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_first_accepts_into_one_new_conversation_share_its_thread() {
    if skipped() {
        return;
    }
    in_fresh_schema(|options| async move {
        let store = Arc::new(PgStore::open(&options).await.unwrap());
        let tasks: Vec<_> = (0..16)
            .map(|n| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    store
                        .accept(crate::store::conformance::accept(
                            &format!("m{n}"),
                            crate::store::ThreadChoice::Current,
                            1,
                        ))
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut threads = std::collections::BTreeSet::new();
        for task in tasks {
            match task.await.unwrap() {
                crate::store::Accepted::New(item) => threads.insert(item.thread_id),
                other => panic!("{other:?}"),
            };
        }
        assert_eq!(threads.len(), 1, "{threads:?}");
        assert_eq!(store.stats().await.unwrap().inbox, 16);
        assert!(store.stats().await.unwrap().disk_bytes > 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_the_server_ended_are_replaced() {
    if skipped() {
        return;
    }
    in_fresh_schema(|options| async move {
        // Its own application name, to end only this store's connections.
        let name = options.schema.clone().unwrap();
        let separator = if options.url.contains('?') { '&' } else { '?' };
        let options = PgOptions {
            url: format!("{}{separator}application_name={name}", options.url),
            ..options
        };
        let store = PgStore::open(&options).await.unwrap();
        store.set_skill_switch("a", true).await.unwrap();
        let (admin, connection) = tokio_postgres::connect(&database_url().unwrap(), NoTls)
            .await
            .unwrap();
        let connection = tokio::spawn(connection);
        // What an administrator's shutdown (57P01) or a restart does to idle connections.
        let ended = admin
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name = $1",
                &[&name],
            )
            .await
            .unwrap();
        assert!(!ended.is_empty());
        drop(admin);
        let _ = connection.await;
        store.set_skill_switch("b", false).await.unwrap();
        assert_eq!(store.skill_switches().await.unwrap().len(), 2);
    })
    .await;
}

/// A batch into conversations that exist, to their current threads, is sent at once; its
/// outcomes are those of one event after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_into_known_conversations_is_sent_at_once_with_the_same_outcomes() {
    use crate::store::Accepted;
    use crate::store::conformance::accept_in;
    if skipped() {
        return;
    }
    in_fresh_schema(|options| async move {
        let store = PgStore::open(&options).await.unwrap();
        let first = store
            .accept_batch(vec![accept_in("a", "m1", 5, 1_000), accept_in("b", "m0", 5, 10)])
            .await
            .unwrap();
        let [Accepted::New(a1), Accepted::New(b0)] = first.as_slice() else {
            panic!("{first:?}");
        };
        let outcomes = store
            .accept_batch(vec![
                accept_in("a", "m2", 100, 1_000),
                // A redelivery of an event accepted before.
                accept_in("a", "m1", 100, 1_000),
                // Its key expired at 15: new again.
                accept_in("b", "m0", 100, 1_000),
                accept_in("b", "m3", 100, 1_000),
            ])
            .await
            .unwrap();
        let [
            Accepted::New(a2),
            Accepted::Duplicate { thread_id, seq },
            Accepted::New(b0_again),
            Accepted::New(b3),
        ] = outcomes.as_slice()
        else {
            panic!("{outcomes:?}");
        };
        assert_eq!((thread_id, *seq), (&a1.thread_id, Some(a1.seq)));
        assert_eq!(a2.thread_id, a1.thread_id);
        assert_eq!((&b0_again.thread_id, &b3.thread_id), (&b0.thread_id, &b0.thread_id));
        assert!(b0.seq < a2.seq && a2.seq < b0_again.seq && b0_again.seq < b3.seq);
        let inbox: Vec<u64> = store.inbox().await.unwrap().iter().map(|i| i.seq).collect();
        assert_eq!(inbox, [a1.seq, b0.seq, a2.seq, b0_again.seq, b3.seq]);
        assert_eq!(store.stats().await.unwrap().inbox, 5);
        // The same key twice in one batch: the second is the first's duplicate.
        let twice = store
            .accept_batch(vec![accept_in("a", "m9", 200, 1_000), accept_in("a", "m9", 200, 1_000)])
            .await
            .unwrap();
        assert!(
            matches!(twice.as_slice(), [Accepted::New(n), Accepted::Duplicate { seq: Some(s), .. }] if n.seq == *s),
            "{twice:?}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deployment_copies_from_sled_into_postgres_and_back_unchanged() {
    use crate::store::copy::tests::{everything, fill};
    use crate::store::copy::{CopyError, CopyKind, copy_stores};
    use crate::store::{Accepted, LeaseStore, SledStore, ThreadChoice};
    if skipped() {
        return;
    }
    in_fresh_schema(|options| async move {
        let now = crate::now_ms();
        let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let source = SledStore::open(dirs.0.path(), 1024 * 1024).unwrap();
        fill(&source, now).await;
        let original = everything(&source, now).await;
        let pg = PgStore::open(&options).await.unwrap();
        let counts = copy_stores(&source, &pg, false, "pg", now).await.unwrap();
        assert!(counts.iter().all(|(_, count)| *count > 0), "{counts:?}");
        assert_eq!(everything(&pg, now).await, original);
        let refused = copy_stores(&source, &pg, false, "pg", now).await;
        assert!(
            matches!(refused, Err(CopyError::TargetNotEmpty(_))),
            "{refused:?}"
        );

        let back = SledStore::open(dirs.1.path(), 1024 * 1024).unwrap();
        let counts = copy_stores(&pg, &back, false, "sled", now).await.unwrap();
        assert!(counts.contains(&(CopyKind::Messages, 3)), "{counts:?}");
        assert_eq!(everything(&back, now).await, original);

        // PostgreSQL resumes the copied deployment: its counts, inbox numbers past the
        // copied ones, and the copied dedupe keys.
        let stats = pg.stats().await.unwrap();
        assert_eq!((stats.inbox, stats.outbox_pending), (2, 2));
        let highest = pg
            .inbox()
            .await
            .unwrap()
            .iter()
            .map(|item| item.seq)
            .max()
            .unwrap();
        let next = crate::store::conformance::accept_new(
            &pg,
            crate::store::conformance::accept("m9", ThreadChoice::Current, now),
        )
        .await;
        assert!(next.seq > highest, "{} after {highest}", next.seq);
        assert!(matches!(
            pg.accept(crate::store::conformance::accept(
                "m2",
                ThreadChoice::Current,
                now
            ))
            .await
            .unwrap(),
            Accepted::Duplicate { .. }
        ));

        // A database another antler works on is not copied from.
        pg.claim("replica-a", now, now + 60_000).await.unwrap();
        match pg.refuse_live_lease(now).await {
            Err(StoreError::Leased { owner, .. }) => assert_eq!(owner, "replica-a"),
            other => panic!("expected the lease to refuse, got {other:?}"),
        }
        pg.release("replica-a").await.unwrap();
        pg.refuse_live_lease(now).await.unwrap();
    })
    .await;
}

#[test]
fn sslmode_is_read_from_both_url_forms_and_the_verifying_modes_reach_the_driver_as_require() {
    let cases = [
        (
            "postgres://u:pw@db/antler",
            "postgres://u:pw@db/antler",
            TlsMode::Prefer,
        ),
        (
            "postgres://u@db/antler?sslmode=disable",
            "postgres://u@db/antler?sslmode=disable",
            TlsMode::Disable,
        ),
        (
            "postgresql://u@db/antler?application_name=x&sslmode=require",
            "postgresql://u@db/antler?application_name=x&sslmode=require",
            TlsMode::Require,
        ),
        (
            "postgres://u@db/antler?sslmode=verify-ca&connect_timeout=2",
            "postgres://u@db/antler?sslmode=require&connect_timeout=2",
            TlsMode::VerifyCa,
        ),
        (
            "postgres://u@db/antler?sslmode=verify-full",
            "postgres://u@db/antler?sslmode=require",
            TlsMode::VerifyFull,
        ),
        (
            "host=db user=u sslmode=verify-full dbname=antler",
            "host=db user=u sslmode=require dbname=antler",
            TlsMode::VerifyFull,
        ),
        ("host=db user=u", "host=db user=u", TlsMode::Prefer),
    ];
    for (given, passed, mode) in cases {
        assert_eq!(
            tls_mode(given).unwrap(),
            (passed.to_owned(), mode),
            "{given}"
        );
        passed.parse::<tokio_postgres::Config>().unwrap();
    }
    let refused = tls_mode("postgres://u:s3cret-pw@db/antler?sslmode=allow").unwrap_err();
    assert!(matches!(refused, StoreError::Invalid(_)), "{refused:?}");
    assert!(refused.to_string().contains("`allow`"), "{refused}");
    assert!(!refused.to_string().contains("s3cret-pw"), "{refused}");
}

#[test]
fn every_mode_but_disable_builds_a_tls_connector() {
    assert!(tls_config(TlsMode::Disable).unwrap().is_none());
    for mode in [TlsMode::Prefer, TlsMode::Require] {
        assert!(tls_config(mode).unwrap().is_some(), "{mode:?}");
    }
    // The verifying modes need the system's roots; where it has some they build too.
    if !rustls_native_certs::load_native_certs().certs.is_empty() {
        for mode in [TlsMode::VerifyCa, TlsMode::VerifyFull] {
            assert!(tls_config(mode).unwrap().is_some(), "{mode:?}");
        }
    }
}

/// The test database's URL with `sslmode` set to `mode`.
fn with_sslmode(url: &str, mode: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}sslmode={mode}")
}

/// Whether the store's connection to the server is encrypted.
async fn encrypted(store: &PgStore) -> bool {
    let row = store
        .client()
        .await
        .unwrap()
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    row.get(0)
}

#[tokio::test]
async fn sslmode_disable_connects_plainly_and_require_encrypts_without_checking_the_certificate() {
    if skipped() {
        return;
    }
    // The local server may offer TLS (Debian's has a self-signed "snakeoil" certificate) or not.
    let mut options = fresh_options();
    options.url = with_sslmode(&options.url, "prefer");
    let store = PgStore::open(&options).await.unwrap();
    let offered = encrypted(&store).await;
    drop(store);
    drop_schema(&options).await;

    let mut options = fresh_options();
    options.url = with_sslmode(&options.url, "disable");
    let store = PgStore::open(&options).await.unwrap();
    assert!(!encrypted(&store).await);
    drop(store);
    drop_schema(&options).await;

    let mut options = fresh_options();
    options.url = with_sslmode(&with_password(&options.url, "s3cret-pw"), "require");
    if offered {
        let store = PgStore::open(&options).await.unwrap();
        assert!(encrypted(&store).await);
        drop(store);
    } else {
        let refused = PgStore::open(&options).await.unwrap_err();
        assert!(matches!(refused, StoreError::Unavailable(_)), "{refused:?}");
        assert!(refused.to_string().contains("TLS"), "{refused}");
        assert!(!format!("{refused} {refused:?}").contains("s3cret-pw"));
    }
    drop_schema(&options).await;
}

#[tokio::test]
async fn sslmode_verify_full_checks_more_than_verify_ca() {
    if skipped() {
        return;
    }
    // What passes depends on the server's certificate and the system's roots (Debian's
    // "snakeoil" certificate names `localhost` and, its folder read whole, is a root here):
    // whatever verify-full takes, verify-ca takes too, and a refusal says why.
    let mut outcomes = Vec::new();
    for mode in ["verify-ca", "verify-full"] {
        let mut options = fresh_options();
        options.url = with_sslmode(&with_password(&options.url, "s3cret-pw"), mode);
        match PgStore::open(&options).await {
            Ok(store) => {
                assert!(encrypted(&store).await, "{mode}");
                outcomes.push(true);
            }
            Err(refused) => {
                assert!(
                    matches!(refused, StoreError::Unavailable(_) | StoreError::Invalid(_)),
                    "{mode}: {refused:?}"
                );
                let shown = format!("{refused} {refused:?}");
                assert!(
                    shown.contains("TLS") || shown.contains("certificate"),
                    "{shown}"
                );
                assert!(!shown.contains("s3cret-pw"), "{shown}");
                eprintln!("{mode}: {refused}");
                outcomes.push(false);
            }
        }
        drop_schema(&options).await;
    }
    assert!(
        outcomes[0] || !outcomes[1],
        "verify-full passed where verify-ca did not"
    );
}

#[tokio::test]
async fn sslmode_require_against_a_server_without_tls_is_unavailable_and_says_why() {
    // No database needed: a server that answers "no TLS" (`N`) to the TLS request.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut request = [0u8; 8];
            if socket.read_exact(&mut request).await.is_ok() {
                let _ = socket.write_all(b"N").await;
            }
        }
    });
    for mode in ["require", "verify-full"] {
        let options = PgOptions {
            url: format!("postgres://antler:s3cret-pw@127.0.0.1:{port}/antler?sslmode={mode}"),
            pool_size: 1,
            schema: None,
            owner: None,
        };
        let refused = PgStore::open(&options).await.unwrap_err();
        if rustls_native_certs::load_native_certs().certs.is_empty() && mode == "verify-full" {
            assert!(matches!(refused, StoreError::Invalid(_)), "{refused:?}");
            continue;
        }
        assert!(
            matches!(refused, StoreError::Unavailable(_)),
            "{mode}: {refused:?}"
        );
        let shown = refused.to_string();
        assert!(shown.contains("server does not support TLS"), "{shown}");
        assert!(shown.contains("sslmode"), "{shown}");
        assert!(
            !format!("{shown} {refused:?}").contains("s3cret-pw"),
            "{shown}"
        );
        let refused = PgStore::migrate(&options).await.unwrap_err();
        assert!(
            matches!(refused, StoreError::Unavailable(_)),
            "{mode}: {refused:?}"
        );
    }
    server.abort();
}

/// Two replicas' stores on one schema: `a/1` and `b/1`, both marked alive for a minute.
async fn two_replicas(options: &PgOptions) -> (PgStore, PgStore) {
    let replica = |owner: &str| PgOptions {
        owner: Some(owner.to_owned()),
        ..options.clone()
    };
    let a = PgStore::open(&replica("a/1")).await.unwrap();
    let b = PgStore::open(&replica("b/1")).await.unwrap();
    a.mark_alive(60_000, true).await.unwrap();
    b.mark_alive(60_000, true).await.unwrap();
    (a, b)
}

/// Ends `owner`'s mark now, as if its replica had died a lease ago.
async fn expire(store: &PgStore, owner: &str) {
    store
        .client()
        .await
        .unwrap()
        .execute(
            "UPDATE antler_replicas SET expires_at_ms = 0 WHERE owner = $1",
            &[&owner],
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn one_replica_holds_a_conversation_and_another_adopts_it_once_the_holder_is_gone() {
    use crate::store::conformance::{accept_in, accept_new};
    if skipped() {
        return;
    }
    in_fresh_schema(|options| async move {
        let (a, b) = two_replicas(&options).await;
        assert!(a.shared() && b.shared());
        let item = accept_new(&b, accept_in("c1", "m1", 1, 60_000)).await;
        let conversation = item.event.conversation.as_str().to_owned();
        let mut notices = a.notices().await.unwrap().unwrap();

        // The first to hold it keeps it; the other's attempt sends the holder a notice.
        assert_eq!(
            a.hold(&[&conversation]).await.unwrap().conversations,
            [conversation.as_str()]
        );
        assert!(
            b.hold(&[&conversation])
                .await
                .unwrap()
                .conversations
                .is_empty()
        );
        let notice = tokio::time::timeout(Duration::from_secs(30), notices.recv())
            .await
            .expect("the holder is told")
            .unwrap();
        assert_eq!(notice, conversation);
        assert!(b.waiting_after(&conversation, 0).await.unwrap().is_empty());
        let waiting = a.waiting_after(&conversation, 0).await.unwrap();
        assert_eq!(
            waiting.iter().map(|i| i.seq).collect::<Vec<_>>(),
            [item.seq]
        );
        assert!(
            a.waiting_after(&conversation, item.seq)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            a.held_waiting().await.unwrap(),
            [(conversation.clone(), item.seq)]
        );
        assert!(b.held_waiting().await.unwrap().is_empty());

        // Only the holder starts its turns; nothing is adopted while it lives.
        assert!(matches!(
            b.start_turn(item.seq).await,
            Err(StoreError::NotHeld { .. })
        ));
        assert_eq!(a.start_turn(item.seq).await.unwrap().attempts, 1);
        assert!(b.adopt(64).await.unwrap().inbox.is_empty());

        // The holder dies: its turn is adopted with the attempt it made, it may not finish
        // it any more, and its mark is not brought back.
        expire(&a, "a/1").await;
        let adopted = b.adopt(64).await.unwrap();
        assert_eq!(
            adopted.inbox.iter().map(|i| i.seq).collect::<Vec<_>>(),
            [item.seq]
        );
        assert!(b.adopt(64).await.unwrap().inbox.is_empty(), "adopted once");
        let finish = FinishTurn {
            inbox_seq: item.seq,
            trace: crate::telemetry::TraceContext::fresh(),
            thread: None,
            replies: Vec::new(),
            memory_update: None,
            draft: None,
            absorbed: Vec::new(),
            now_ms: 2,
        };
        assert!(matches!(
            a.finish_turns(&[&finish]).await,
            Err(StoreError::NotHeld { .. })
        ));
        assert!(matches!(
            a.mark_alive(60_000, false).await,
            Err(StoreError::LeaseLost { .. })
        ));
        assert_eq!(b.start_turn(item.seq).await.unwrap().attempts, 2);
        b.finish_turns(&[&finish]).await.unwrap();
        assert_eq!(b.stats().await.unwrap().inbox, 0);

        // A clean stop lets go at once.
        b.leave().await.unwrap();
        let again = accept_new(&b, accept_in("c1", "m2", 3, 60_000)).await;
        let c = PgStore::open(&PgOptions {
            owner: Some("c/1".to_owned()),
            ..options.clone()
        })
        .await
        .unwrap();
        c.mark_alive(60_000, true).await.unwrap();
        let adopted = c.adopt(64).await.unwrap();
        assert_eq!(
            adopted.inbox.iter().map(|i| i.seq).collect::<Vec<_>>(),
            [again.seq]
        );
    })
    .await;
}

#[tokio::test]
async fn a_gone_replicas_subagent_tasks_fail_once_and_a_live_ones_never() {
    use crate::agent::subagents::SubagentStatus;
    use crate::store::SubagentStore;
    use crate::store::conformance::subagent;
    if skipped() {
        return;
    }
    in_fresh_schema(|options| async move {
        let (a, b) = two_replicas(&options).await;
        a.create_subagent(&subagent("task_a", SubagentStatus::Running))
            .await
            .unwrap();
        assert_eq!(b.fail_unfinished_subagents("gone", 5).await.unwrap(), 0);
        assert_eq!(a.fail_unfinished_subagents("gone", 5).await.unwrap(), 0);
        expire(&a, "a/1").await;
        let (first, second) = tokio::join!(
            b.fail_unfinished_subagents("gone", 5),
            b.fail_unfinished_subagents("gone", 5)
        );
        assert_eq!(first.unwrap() + second.unwrap(), 1, "failed exactly once");
        let record = b.subagent("task_a").await.unwrap().unwrap();
        assert_eq!(record.status, SubagentStatus::Failed);
        assert_eq!(record.error.as_deref(), Some("gone"));
    })
    .await;
}

#[tokio::test]
async fn replicas_take_different_memory_updates() {
    use crate::store::MemoryQueueStore;
    use crate::store::conformance::memory_update;
    if skipped() {
        return;
    }
    in_fresh_schema(|options| async move {
        let (a, b) = two_replicas(&options).await;
        assert!(a.shared());
        for thread in ["t1", "t2"] {
            a.queue_memory_update(memory_update("u", thread, 1))
                .await
                .unwrap();
        }
        let now = crate::now_ms();
        let first = a.due_memory_updates(now, 1).await.unwrap();
        let second = b.due_memory_updates(now, 10).await.unwrap();
        assert_eq!((first.len(), second.len()), (1, 1));
        assert_ne!(first[0].thread_id, second[0].thread_id);
        assert!(a.due_memory_updates(now, 10).await.unwrap().is_empty());
        // A flush at shutdown reads everything.
        assert_eq!(a.due_memory_updates(u64::MAX, 10).await.unwrap().len(), 2);
    })
    .await;
}

#[tokio::test]
async fn a_store_with_a_replica_alive_is_not_copied_from() {
    if skipped() {
        return;
    }
    in_fresh_schema(|options| async move {
        let idle = PgStore::open(&options).await.unwrap();
        idle.refuse_live_lease(crate::now_ms()).await.unwrap();
        let (a, b) = two_replicas(&options).await;
        let refused = idle.refuse_live_lease(crate::now_ms()).await.unwrap_err();
        assert!(
            matches!(&refused, StoreError::Leased { owner, .. } if owner == "a/1"),
            "{refused:?}"
        );
        a.leave().await.unwrap();
        b.leave().await.unwrap();
        idle.refuse_live_lease(crate::now_ms()).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_conversation_taken_from_a_gone_replica_comes_with_the_replies_it_left() {
    use crate::store::conformance::{accept_in, accept_new, reply};
    if skipped() {
        return;
    }
    in_fresh_schema(|options| async move {
        let (a, b) = two_replicas(&options).await;
        let item = accept_new(&a, accept_in("c1", "m1", 1, 60_000)).await;
        let conversation = item.event.conversation.as_str().to_owned();
        let held = a.hold(&[&conversation]).await.unwrap();
        assert!(held.replies.is_empty(), "a new conversation has none");
        a.start_turn(item.seq).await.unwrap();
        let mut answer = reply(&item.thread_id, "left behind");
        answer.conversation = item.event.conversation.clone();
        let finish = FinishTurn {
            inbox_seq: item.seq,
            trace: crate::telemetry::TraceContext::fresh(),
            thread: None,
            replies: vec![answer],
            memory_update: None,
            draft: None,
            absorbed: Vec::new(),
            now_ms: 2,
        };
        a.finish_turns(&[&finish]).await.unwrap();
        // The holder dies before delivering; a new message lands on the other replica,
        // which takes the conversation and, with it, the reply to send first.
        expire(&a, "a/1").await;
        let held = b.hold(&[&conversation]).await.unwrap();
        assert_eq!(held.conversations, [conversation.as_str()]);
        assert_eq!(
            held.replies
                .iter()
                .map(|r| r.message.text.as_str())
                .collect::<Vec<_>>(),
            ["left behind"]
        );
        // Held already: nothing handed over twice.
        assert!(b.hold(&[&conversation]).await.unwrap().replies.is_empty());
    })
    .await;
}
