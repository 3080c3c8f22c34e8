//! What `antler doctor` reads from the database, changing nothing: that it answers with these
//! credentials, its schema version beside this build's, and who holds the store's lease.

use super::migrate::{SCHEMA_VERSION, applied_version};
use super::{Connector, PgOptions, PgStore, db_error, pool_error};
use crate::store::{Lease, StoreError};

/// The database as `antler doctor` found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inspected {
    /// The schema version applied (0: none yet).
    pub(crate) schema: u32,
    /// The version this build applies.
    pub(crate) supported: u32,
    /// The store's lease, once anyone claimed it.
    pub(crate) lease: Option<Lease>,
    /// The replicas whose marks are alive, with the milliseconds left on each.
    pub(crate) replicas: Vec<(String, u64)>,
    /// The id of the folder the replicas share, once one was named.
    pub(crate) folder: Option<String>,
}

impl PgStore {
    /// Connects and reads the schema version and the lease without migrating anything.
    pub(crate) async fn inspect(options: &PgOptions) -> Result<Inspected, StoreError> {
        let client = Connector::new(options)?
            .pool(1)?
            .get()
            .await
            .map_err(pool_error)?;
        let applied: bool = client
            .query_one(
                "SELECT to_regclass('antler_schema_migrations') IS NOT NULL",
                &[],
            )
            .await
            .and_then(|row| row.try_get(0))
            .map_err(db_error)?;
        if !applied {
            return Ok(Inspected {
                schema: 0,
                supported: SCHEMA_VERSION,
                lease: None,
                replicas: Vec::new(),
                folder: None,
            });
        }
        let schema = applied_version(&client).await?;
        let lease = client
            .query_opt(
                "SELECT owner, until_ms, released FROM antler_leases WHERE name = 'store'",
                &[],
            )
            .await
            .map_err(db_error)?
            .map(|row| -> Result<Lease, tokio_postgres::Error> {
                let until_ms: i64 = row.try_get(1)?;
                Ok(Lease {
                    owner: row.try_get(0)?,
                    until_ms: u64::try_from(until_ms).unwrap_or(0),
                    released: row.try_get(2)?,
                })
            })
            .transpose()
            .map_err(db_error)?;
        let (replicas, folder) = if schema >= 2 {
            let replicas = client
                .query(
                    "SELECT owner, expires_at_ms - (extract(epoch from clock_timestamp()) * 1000)::bigint \
                     FROM antler_replicas ORDER BY owner",
                    &[],
                )
                .await
                .map_err(db_error)?
                .iter()
                .map(|row| -> Result<(String, i64), tokio_postgres::Error> {
                    Ok((row.try_get(0)?, row.try_get(1)?))
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(db_error)?
                .into_iter()
                .filter_map(|(owner, left)| Some((owner, u64::try_from(left).ok()?)))
                .filter(|(_, left)| *left > 0)
                .collect();
            let folder = client
                .query_opt("SELECT id FROM antler_folder", &[])
                .await
                .map_err(db_error)?
                .map(|row| row.try_get(0))
                .transpose()
                .map_err(db_error)?;
            (replicas, folder)
        } else {
            (Vec::new(), None)
        };
        Ok(Inspected {
            schema,
            supported: SCHEMA_VERSION,
            lease,
            replicas,
            folder,
        })
    }
}
