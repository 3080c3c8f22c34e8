//! The schema's versioned migrations: SQL files applied in order, each recorded in
//! `antler_schema_migrations`, all pending ones in one transaction that holds an advisory
//! lock, so replicas starting together apply them once and none starts on half a schema.

use deadpool_postgres::GenericClient;

use super::db_error;
use crate::store::StoreError;

/// The migrations, by version; a version is never changed once released, a change is a new one.
const MIGRATIONS: &[(u32, &str)] = &[
    (1, include_str!("migrations/0001_init.sql")),
    (2, include_str!("migrations/0002_replicas.sql")),
];

/// The schema version this build writes: the last migration's.
pub(crate) const SCHEMA_VERSION: u32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// The advisory lock held while migrating ("antler" in ASCII): any number works as long as
/// every antler uses the same one.
const MIGRATION_LOCK: i64 = 0x616e_746c_6572;

/// Applies the pending migrations; returns the version found and the version now.
pub(super) async fn apply(
    client: &mut deadpool_postgres::Client,
    path: &str,
    schema: Option<&str>,
) -> Result<(u32, u32), StoreError> {
    let tx = client.transaction().await.map_err(db_error)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(db_error)?;
    if let Some(schema) = schema {
        check_schema_name(schema)?;
        tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
            .await
            .map_err(db_error)?;
    }
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS antler_schema_migrations (
             version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await
    .map_err(db_error)?;
    let found = applied_version(&tx).await?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: path.to_owned(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
        tx.batch_execute(sql).await.map_err(db_error)?;
        let version = i32::try_from(*version)
            .map_err(|_| StoreError::backend(format!("migration {version} is out of range")))?;
        tx.execute(
            "INSERT INTO antler_schema_migrations (version) VALUES ($1)",
            &[&version],
        )
        .await
        .map_err(db_error)?;
    }
    tx.commit().await.map_err(db_error)?;
    if found < SCHEMA_VERSION {
        tracing::info!(
            path,
            from = found,
            to = SCHEMA_VERSION,
            "database schema migrated"
        );
    }
    Ok((found, SCHEMA_VERSION))
}

/// The highest schema version `antler_schema_migrations` records (0: none).
pub(super) async fn applied_version(client: &impl GenericClient) -> Result<u32, StoreError> {
    let found: i32 = client
        .query_one(
            "SELECT coalesce(max(version), 0) FROM antler_schema_migrations",
            &[],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(db_error)?;
    u32::try_from(found).map_err(|_| StoreError::Codec {
        what: "schema version",
        detail: format!("negative: {found}"),
    })
}

/// Refuses a schema name that would need quoting: it goes into a connection option and a
/// statement as it is.
pub(super) fn check_schema_name(schema: &str) -> Result<(), StoreError> {
    let mut chars = schema.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if first_ok && rest_ok && schema.len() <= 63 {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "schema name {schema:?}: use lowercase letters, digits and _ (at most 63)"
        )))
    }
}

/// `url` with its password masked (`postgres://user:***@host/db`), for messages and logs;
/// `postgres` when it is not a URL (a `key=value` string may hold a password anywhere).
pub(crate) fn mask_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "postgres".to_owned();
    };
    if !matches!(scheme, "postgres" | "postgresql") {
        return "postgres".to_owned();
    }
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let masked = match authority.rsplit_once('@') {
        Some((user_info, host)) => match user_info.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => format!("{user_info}@{host}"),
        },
        None => authority.to_owned(),
    };
    // The query may carry `password=...` too.
    let tail = match tail.split_once('?') {
        Some((path, query)) if query.contains("password") => format!("{path}?***"),
        _ => tail.to_owned(),
    };
    format!("{scheme}://{masked}{tail}")
}
