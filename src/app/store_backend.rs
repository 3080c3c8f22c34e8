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
    open_as(settings, None).await
}

/// [`open`] for the replica `owner` (`antler serve`): on PostgreSQL the store then holds
/// conversations for it and refuses turns of conversations it does not hold
/// ([`crate::store::ReplicaStore`]). `None`: a command that runs no turns.
pub(crate) async fn open_as(
    settings: &StoreConfig,
    owner: Option<&str>,
) -> Result<Arc<dyn Store>, StoreError> {
    match settings.backend {
        StoreBackend::Sled => {
            let path = settings.path.clone();
            let cache = settings.cache_capacity_bytes;
            let store = tokio::task::spawn_blocking(move || SledStore::open(&path, cache))
                .await
                .map_err(|e| StoreError::backend(format!("opening the store stopped: {e}")))??;
            Ok(Arc::new(store))
        }
        StoreBackend::Postgres => {
            let options = PgOptions {
                owner: owner.map(str::to_owned),
                ..pg_options(settings)?
            };
            Ok(Arc::new(PgStore::open(&options).await?))
        }
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
        owner: None,
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

/// The file in `[store] path` holding the id of the folder replicas share.
pub(crate) const FOLDER_ID_FILE: &str = ".antler-store-id";

/// What [`check_shared_folder`] found wrong: this replica does not see the folder the others
/// share.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FolderError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "{path} holds folder id {here}, but the database names {named}: this replica does not \
         see the folder the other replicas share; point store.path at the shared volume"
    )]
    Other {
        path: String,
        here: String,
        named: String,
    },
    #[error(
        "{path} has no {FOLDER_ID_FILE}, but the database names folder {named}: this replica \
         does not see the folder the other replicas share; point store.path at the shared \
         volume (or copy {FOLDER_ID_FILE} there if the folder moved)"
    )]
    Unmarked { path: String, named: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// Checks that `path` (`[store] path`) is the folder every replica of `store` shares: the
/// first replica writes a fresh id there and the store keeps it; the others must find the
/// same id. Nothing to check where nothing is shared.
pub(crate) async fn check_shared_folder(
    store: &dyn Store,
    path: &std::path::Path,
) -> Result<(), FolderError> {
    let file = path.join(FOLDER_ID_FILE);
    let here = read_folder_id(&file);
    let candidate = here
        .clone()
        .unwrap_or_else(|| uuid::Uuid::now_v7().simple().to_string());
    let Some(named) = store.folder_id(&candidate).await? else {
        return Ok(());
    };
    let shown = path.display().to_string();
    match here {
        Some(here) if here == named => Ok(()),
        Some(here) => Err(FolderError::Other {
            path: shown,
            here,
            named,
        }),
        None if named == candidate => {
            write_folder_id(path, &file, &named).map_err(|source| FolderError::Write {
                path: file.display().to_string(),
                source,
            })
        }
        None => {
            // Replicas starting together on a new folder: the one whose id the store kept
            // may be writing it right now.
            for _ in 0..FOLDER_ID_WAITS {
                tokio::time::sleep(FOLDER_ID_WAIT).await;
                if read_folder_id(&file).as_deref() == Some(named.as_str()) {
                    return Ok(());
                }
            }
            Err(FolderError::Unmarked { path: shown, named })
        }
    }
}

/// How long a replica waits for another to write the folder's id, in steps.
const FOLDER_ID_WAIT: std::time::Duration = std::time::Duration::from_millis(100);
const FOLDER_ID_WAITS: usize = 50;

/// The folder id in `file`, if it holds one.
fn read_folder_id(file: &std::path::Path) -> Option<String> {
    std::fs::read_to_string(file)
        .ok()
        .map(|id| id.trim().to_owned())
        .filter(|id| !id.is_empty())
}

/// Writes `id` to `file` in `folder` whole or not at all (a temporary file renamed).
fn write_folder_id(
    folder: &std::path::Path,
    file: &std::path::Path,
    id: &str,
) -> std::io::Result<()> {
    std::fs::create_dir_all(folder)?;
    let temporary = folder.join(format!("{FOLDER_ID_FILE}.tmp"));
    std::fs::write(&temporary, format!("{id}\n"))?;
    std::fs::rename(&temporary, file)
}
