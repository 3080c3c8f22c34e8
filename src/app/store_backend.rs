//! The store `[store]` names, for the commands that open one (`serve`, `migrate`, `doctor`,
//! `pairing`): sled under `path`, or PostgreSQL at `url`. Here, above both the config and the
//! store, so that neither names the other.

use std::sync::Arc;

use crate::config::{StoreBackend, StoreConfig};
use crate::store::{PgOptions, PgStore, SledStore, Store, StoreError};

/// Opens the store `[store]` names: sled under `path` (opening migrates an older layout, so it
/// runs on the blocking pool), or PostgreSQL at `url` (its pending migrations applied under an
/// advisory lock). An unreachable database is [`StoreError::Unavailable`] at once.
pub(crate) async fn open(settings: &StoreConfig) -> Result<Arc<dyn Store>, StoreError> {
    match settings.backend {
        StoreBackend::Sled => {
            let path = settings.path.clone();
            let cache = settings.cache_capacity_bytes;
            let store = tokio::task::spawn_blocking(move || SledStore::open(&path, cache))
                .await
                .map_err(|e| StoreError::backend(format!("opening the store stopped: {e}")))??;
            Ok(Arc::new(store))
        }
        StoreBackend::Postgres => Ok(Arc::new(PgStore::open(&pg_options(settings)?).await?)),
    }
}

/// Where the PostgreSQL store of `[store]` is.
pub(crate) fn pg_options(settings: &StoreConfig) -> Result<PgOptions, StoreError> {
    let url = settings
        .url
        .as_ref()
        .ok_or_else(|| StoreError::Invalid("store.url is not set".to_owned()))?;
    Ok(PgOptions {
        url: url.expose().to_owned(),
        pool_size: settings.pool_size,
        schema: None,
    })
}

/// Applies the store's pending migrations alone (`antler migrate`): the schema versions
/// before and after.
pub(crate) async fn migrate(settings: &StoreConfig) -> Result<(u32, u32), StoreError> {
    match settings.backend {
        StoreBackend::Sled => {
            let path = settings.path.clone();
            let cache = settings.cache_capacity_bytes;
            tokio::task::spawn_blocking(move || SledStore::migrate(&path, cache))
                .await
                .map_err(|e| StoreError::backend(format!("migrating the store stopped: {e}")))?
        }
        StoreBackend::Postgres => PgStore::migrate(&pg_options(settings)?).await,
    }
}
