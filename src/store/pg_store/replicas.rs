//! Replicas on one PostgreSQL database: marks, held conversations, adoption and notices
//! (`crate::store::replicas` says what each promises).
//!
//! Times are the database's (`clock_timestamp()`), so replicas' clocks need not agree. A
//! conversation is held by the replica named in `antler_conversation_owners` while that
//! replica's row in `antler_replicas` has not expired; taking it from a replica whose mark ran
//! out is one `INSERT ... ON CONFLICT DO UPDATE ... WHERE`, so two replicas never both win.
//! Notices travel on the channel [`CHANNEL`] as `<owner>\t<conversation>`.

use deadpool_postgres::Transaction;
use futures_util::future::poll_fn;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::{
    Failure, PgStore, db_error, exec, get, int, outbox_items, read, row, rows, transaction, uint,
};
use crate::store::records::Record;
use crate::store::{Adopted, Held, InboxItem, OutboxItem, ReplicaStore, StoreError};

/// The `LISTEN` channel of notices.
const CHANNEL: &str = "antler_work";

/// How many notices may wait for the replica to read them; more are dropped (the replica's
/// periodic look for work finds what they named).
const NOTICES_WAITING: usize = 4096;

/// Now in milliseconds since the epoch, by the database's clock (SQL).
macro_rules! db_now_ms {
    () => {
        "(extract(epoch from clock_timestamp()) * 1000)::bigint"
    };
}

/// Whether replica `$2`'s mark is alive (SQL condition).
macro_rules! alive {
    ($owner:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM antler_replicas r WHERE r.owner = ",
            $owner,
            " AND r.expires_at_ms > ",
            db_now_ms!(),
            ")"
        )
    };
}

/// Marks that ran out this long ago are cleared, with the conversations they held.
const CLEAR_AFTER_MS: i64 = 60_000;

/// Whether `owner` holds `conversation` with a live mark, in `tx`; the holding row is
/// locked (shared) until `tx` ends, so no other replica takes the conversation meanwhile.
pub(super) async fn holds(
    tx: &Transaction<'_>,
    owner: &str,
    conversation: &str,
) -> Result<bool, Failure> {
    Ok(row(
        tx,
        concat!(
            "SELECT 1 FROM antler_conversation_owners o WHERE o.conversation = $1 ",
            "AND o.owner = $2 AND ",
            alive!("$2"),
            " FOR SHARE OF o"
        ),
        &[&conversation, &owner],
    )
    .await?
    .is_some())
}

/// Fails `tx` unless `owner` (when set) holds `conversation`.
pub(super) async fn ensure_held(
    tx: &Transaction<'_>,
    owner: Option<&str>,
    conversation: &str,
) -> Result<(), Failure> {
    match owner {
        Some(owner) if !holds(tx, owner, conversation).await? => {
            Err(Failure::Store(StoreError::NotHeld {
                conversation: conversation.to_owned(),
            }))
        }
        _ => Ok(()),
    }
}

/// Takes `conversations` (sorted, distinct) for `owner` where no live replica holds them;
/// returns those `owner` holds now, each with whether it was taken just now (from nobody, or
/// from a replica whose mark ran out), and sends the holders of the others a notice.
async fn hold_in(
    tx: &Transaction<'_>,
    owner: &str,
    conversations: &[&str],
) -> Result<Vec<(String, bool)>, Failure> {
    let held = rows(
        tx,
        concat!(
            "WITH before AS (SELECT conversation, owner FROM antler_conversation_owners ",
            "WHERE conversation = ANY($1)) ",
            "INSERT INTO antler_conversation_owners (conversation, owner) ",
            "SELECT c, $2 FROM unnest($1::text[]) AS c WHERE ",
            alive!("$2"),
            " ON CONFLICT (conversation) DO UPDATE SET owner = EXCLUDED.owner ",
            "WHERE antler_conversation_owners.owner = EXCLUDED.owner OR NOT EXISTS ",
            "(SELECT 1 FROM antler_replicas r WHERE r.owner = antler_conversation_owners.owner ",
            "AND r.expires_at_ms > ",
            db_now_ms!(),
            ") RETURNING conversation, NOT EXISTS (SELECT 1 FROM before b ",
            "WHERE b.conversation = antler_conversation_owners.conversation AND b.owner = $2)"
        ),
        &[&conversations, &owner],
    )
    .await?
    .iter()
    .map(|row| Ok((get::<String>(row, 0)?, get::<bool>(row, 1)?)))
    .collect::<Result<Vec<_>, Failure>>()?;
    if held.len() < conversations.len() {
        let others: Vec<&str> = conversations
            .iter()
            .copied()
            .filter(|c| !held.iter().any(|(h, _)| h == c))
            .collect();
        rows(
            tx,
            "SELECT pg_notify('antler_work', owner || chr(9) || conversation) \
             FROM antler_conversation_owners WHERE conversation = ANY($1) AND owner <> $2",
            &[&others, &owner],
        )
        .await?;
    }
    Ok(held)
}

/// The pending replies of `conversations`, in outbox order.
async fn pending_replies(
    tx: &Transaction<'_>,
    conversations: &[String],
) -> Result<Vec<OutboxItem>, Failure> {
    if conversations.is_empty() {
        return Ok(Vec::new());
    }
    outbox_items(
        &rows(
            tx,
            "SELECT record FROM antler_outbox WHERE status = 'pending' \
             AND conversation = ANY($1) ORDER BY seq",
            &[&conversations],
        )
        .await?,
    )
}

impl PgStore {
    /// The replica this store works for; an error for a store opened without one.
    fn replica(&self) -> Result<&str, StoreError> {
        self.owner
            .as_deref()
            .ok_or_else(|| StoreError::Invalid("this store was opened for no replica".to_owned()))
    }
}

#[async_trait::async_trait]
impl ReplicaStore for PgStore {
    fn shared(&self) -> bool {
        self.owner.is_some()
    }

    async fn mark_alive(&self, lease_ms: u64, joining: bool) -> Result<(), StoreError> {
        let owner = self.replica()?;
        let lease = int(lease_ms)?;
        transaction!(self, |tx| {
            let changed = if joining {
                exec(
                    &tx,
                    concat!(
                        "INSERT INTO antler_replicas (owner, expires_at_ms) VALUES ($1, ",
                        db_now_ms!(),
                        " + $2) ON CONFLICT (owner) DO NOTHING"
                    ),
                    &[&owner, &lease],
                )
                .await?
            } else {
                exec(
                    &tx,
                    concat!(
                        "UPDATE antler_replicas SET expires_at_ms = ",
                        db_now_ms!(),
                        " + $2 WHERE owner = $1 AND expires_at_ms > ",
                        db_now_ms!()
                    ),
                    &[&owner, &lease],
                )
                .await?
            };
            if changed == 0 {
                return Err(Failure::Store(StoreError::LeaseLost {
                    holder: "the replicas that adopted its conversations".to_owned(),
                }));
            }
            Ok(())
        })
    }

    async fn leave(&self) -> Result<(), StoreError> {
        let owner = self.replica()?;
        transaction!(self, |tx| {
            exec(
                &tx,
                "DELETE FROM antler_conversation_owners WHERE owner = $1",
                &[&owner],
            )
            .await?;
            exec(
                &tx,
                "DELETE FROM antler_replicas WHERE owner = $1",
                &[&owner],
            )
            .await?;
            Ok(())
        })
    }

    async fn hold(&self, conversations: &[&str]) -> Result<Held, StoreError> {
        let owner = self.replica()?;
        // Sorted: two replicas holding overlapping sets lock rows in one order.
        let mut sorted: Vec<&str> = conversations.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.is_empty() {
            return Ok(Held::default());
        }
        transaction!(self, |tx| {
            let held = hold_in(&tx, owner, &sorted).await?;
            let taken: Vec<String> = held
                .iter()
                .filter(|(_, taken)| *taken)
                .map(|(conversation, _)| conversation.clone())
                .collect();
            Ok(Held {
                replies: pending_replies(&tx, &taken).await?,
                conversations: held
                    .into_iter()
                    .map(|(conversation, _)| conversation)
                    .collect(),
            })
        })
    }

    async fn adopt(&self, limit: usize) -> Result<Adopted, StoreError> {
        let owner = self.replica()?;
        let limit = int(limit as u64)?;
        transaction!(self, |tx| {
            // Marks long gone, with what they held: the tables keep the live replicas.
            exec(
                &tx,
                concat!(
                    "WITH gone AS (DELETE FROM antler_replicas WHERE expires_at_ms < ",
                    db_now_ms!(),
                    " - $1 RETURNING owner) ",
                    "DELETE FROM antler_conversation_owners WHERE owner IN (SELECT owner FROM gone)"
                ),
                &[&CLEAR_AFTER_MS],
            )
            .await?;
            // Work in conversations no live replica holds; rows another replica is adopting
            // at this moment are skipped, not waited for.
            let mut found: Vec<String> = Vec::new();
            for sql in [
                concat!(
                    "SELECT w.conversation FROM antler_inbox w WHERE ",
                    "NOT EXISTS (SELECT 1 FROM antler_conversation_owners o ",
                    "JOIN antler_replicas r ON r.owner = o.owner ",
                    "WHERE o.conversation = w.conversation AND r.expires_at_ms > ",
                    db_now_ms!(),
                    ") ORDER BY w.seq LIMIT $1 FOR UPDATE OF w SKIP LOCKED"
                ),
                concat!(
                    "SELECT w.conversation FROM antler_outbox w WHERE w.status = 'pending' AND ",
                    "NOT EXISTS (SELECT 1 FROM antler_conversation_owners o ",
                    "JOIN antler_replicas r ON r.owner = o.owner ",
                    "WHERE o.conversation = w.conversation AND r.expires_at_ms > ",
                    db_now_ms!(),
                    ") ORDER BY w.seq LIMIT $1 FOR UPDATE OF w SKIP LOCKED"
                ),
            ] {
                for row in rows(&tx, sql, &[&limit]).await? {
                    found.push(get(&row, 0)?);
                }
            }
            found.sort_unstable();
            found.dedup();
            found.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
            if found.is_empty() {
                return Ok(Adopted::default());
            }
            let wanted: Vec<&str> = found.iter().map(String::as_str).collect();
            let held: Vec<String> = hold_in(&tx, owner, &wanted)
                .await?
                .into_iter()
                .map(|(conversation, _)| conversation)
                .collect();
            let inbox = rows(
                &tx,
                "SELECT record FROM antler_inbox WHERE conversation = ANY($1) ORDER BY seq",
                &[&held],
            )
            .await?
            .iter()
            .map(|row| Ok(InboxItem::from_record(get(row, 0)?)?))
            .collect::<Result<Vec<_>, Failure>>()?;
            let outbox = pending_replies(&tx, &held).await?;
            Ok(Adopted { inbox, outbox })
        })
    }

    async fn waiting_after(
        &self,
        conversation: &str,
        after: u64,
    ) -> Result<Vec<InboxItem>, StoreError> {
        let owner = self.replica()?;
        let after = int(after)?;
        read!(self, |db| {
            rows(
                &db,
                concat!(
                    "SELECT i.record FROM antler_inbox i WHERE i.conversation = $1 AND i.seq > $2 ",
                    "AND EXISTS (SELECT 1 FROM antler_conversation_owners o ",
                    "WHERE o.conversation = i.conversation AND o.owner = $3) ORDER BY i.seq"
                ),
                &[&conversation, &after, &owner],
            )
            .await?
            .iter()
            .map(|row| Ok(InboxItem::from_record(get(row, 0)?)?))
            .collect::<Result<Vec<_>, Failure>>()
        })
    }

    async fn held_waiting(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let owner = self.replica()?;
        read!(self, |db| {
            rows(
                &db,
                "SELECT i.conversation, max(i.seq) FROM antler_inbox i \
                 JOIN antler_conversation_owners o ON o.conversation = i.conversation \
                 WHERE o.owner = $1 GROUP BY i.conversation",
                &[&owner],
            )
            .await?
            .iter()
            .map(|row| Ok((get::<String>(row, 0)?, uint("inbox", get(row, 1)?)?)))
            .collect::<Result<Vec<_>, Failure>>()
        })
    }

    async fn folder_id(&self, candidate: &str) -> Result<Option<String>, StoreError> {
        transaction!(self, |tx| {
            exec(
                &tx,
                "INSERT INTO antler_folder (id) VALUES ($1) ON CONFLICT (one) DO NOTHING",
                &[&candidate],
            )
            .await?;
            let found = row(&tx, "SELECT id FROM antler_folder", &[])
                .await?
                .map(|row| get::<String>(&row, 0))
                .transpose()?;
            Ok(found)
        })
    }

    async fn notices(&self) -> Result<Option<mpsc::Receiver<String>>, StoreError> {
        let owner = self.replica()?.to_owned();
        let connector = &self.connector;
        let (sender, receiver) = mpsc::channel(NOTICES_WAITING);
        match &connector.tls {
            Some(tls) => {
                let (client, connection) = connector
                    .config
                    .connect(MakeRustlsConnect::new(tls.clone()))
                    .await
                    .map_err(db_error)?;
                listen(client, connection, owner, sender).await?;
            }
            None => {
                let (client, connection) =
                    connector.config.connect(NoTls).await.map_err(db_error)?;
                listen(client, connection, owner, sender).await?;
            }
        }
        Ok(Some(receiver))
    }
}

/// Drives `connection` in a task of its own, forwarding the notices addressed to `owner`, and
/// subscribes `client` to [`CHANNEL`]. The task ends (closing `sender`) when the connection
/// ends or nobody reads the notices any more.
async fn listen<S, T>(
    client: tokio_postgres::Client,
    mut connection: tokio_postgres::Connection<S, T>,
    owner: String,
    sender: mpsc::Sender<String>,
) -> Result<(), StoreError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (subscribed, subscription) = tokio::sync::oneshot::channel::<tokio_postgres::Client>();
    tokio::spawn(async move {
        // Held for as long as the connection is driven: dropping it would close it.
        let mut client = None;
        let mut subscription = Some(subscription);
        let prefix = format!("{owner}\t");
        loop {
            let message = tokio::select! {
                message = poll_fn(|cx| connection.poll_message(cx)) => message,
                kept = async {
                    match subscription.as_mut() {
                        Some(waiting) => waiting.await,
                        None => std::future::pending().await,
                    }
                } => {
                    subscription = None;
                    match kept {
                        Ok(kept) => client = Some(kept),
                        Err(_) => return,
                    }
                    continue;
                }
                () = sender.closed() => return,
            };
            match message {
                Some(Ok(AsyncMessage::Notification(notice))) => {
                    if let Some(conversation) = notice.payload().strip_prefix(&prefix) {
                        // Full: the periodic look for work finds it.
                        let _ = sender.try_send(conversation.to_owned());
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::warn!(error = %db_error(e), "the connection for notices ended");
                    drop(client);
                    return;
                }
                None => return,
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {CHANNEL}"))
        .await
        .map_err(db_error)?;
    let _ = subscribed.send(client);
    Ok(())
}
