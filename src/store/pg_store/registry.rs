//! The subagent registry, the store's lease and its upkeep (sweep, stats) on PostgreSQL.

use deadpool_postgres::Transaction;

use super::{
    Failure, PgStore, all_json, bound, exec, get, int, json, missing, read, row, rows, to_json,
    transaction, uint,
};
use crate::agent::subagents::{SubagentChange, SubagentRecord, SubagentStatus, Transition};
use crate::store::rules;
use crate::store::{
    Claimed, Lease, LeaseStore, MaintenanceStore, StoreError, StoreStats, SubagentStore,
};

/// The name of the store-wide lease in `antler_leases`.
pub(super) const STORE_LEASE: &str = "store";

/// Writes a subagent record's row.
pub(super) async fn put_subagent(
    tx: &Transaction<'_>,
    record: &SubagentRecord,
) -> Result<(), Failure> {
    exec(
        tx,
        "INSERT INTO antler_subagents \
         (id, parent_thread_id, status, terminal, created_at_ms, finished_at_ms, record) \
         VALUES ($1, $2, $3, $4, $5, $6, $7::text::jsonb) \
         ON CONFLICT (id) DO UPDATE SET parent_thread_id = EXCLUDED.parent_thread_id, \
         status = EXCLUDED.status, terminal = EXCLUDED.terminal, \
         created_at_ms = EXCLUDED.created_at_ms, finished_at_ms = EXCLUDED.finished_at_ms, \
         record = EXCLUDED.record",
        &[
            &record.id,
            &record.parent_thread_id,
            &record.status.as_str(),
            &record.status.is_terminal(),
            &int(record.created_at_ms)?,
            &record.finished_at_ms.map(int).transpose()?,
            &to_json("subagent", record)?,
        ],
    )
    .await?;
    Ok(())
}

/// Moves one locked record along its state machine.
async fn transition(
    tx: &Transaction<'_>,
    mut record: SubagentRecord,
    change: &SubagentChange,
) -> Result<Transition, Failure> {
    if !change.apply(&mut record) {
        return Ok(Transition::Refused(record));
    }
    put_subagent(tx, &record).await?;
    Ok(Transition::Applied(record))
}

#[async_trait::async_trait]
impl SubagentStore for PgStore {
    async fn create_subagent(&self, record: &SubagentRecord) -> Result<(), StoreError> {
        let turn = int(record.parent_turn)?;
        let owner = self.owner.as_deref();
        transaction!(self, |tx| {
            put_subagent(&tx, record).await?;
            if let Some(owner) = owner {
                exec(
                    &tx,
                    "UPDATE antler_subagents SET owner = $2 WHERE id = $1",
                    &[&record.id, &owner],
                )
                .await?;
            }
            exec(
                &tx,
                "INSERT INTO antler_subagent_calls (thread_id, turn, call_id, subagent_id) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (thread_id, turn, call_id) \
                 DO UPDATE SET subagent_id = EXCLUDED.subagent_id",
                &[
                    &record.parent_thread_id,
                    &turn,
                    &record.parent_call_id,
                    &record.id,
                ],
            )
            .await?;
            Ok(())
        })
    }

    async fn subagent(&self, id: &str) -> Result<Option<SubagentRecord>, StoreError> {
        read!(self, |db| {
            row(
                &db,
                "SELECT record::text FROM antler_subagents WHERE id = $1",
                &[&id],
            )
            .await?
            .map(|row| json("subagent", &row, 0))
            .transpose()
        })
    }

    async fn subagent_for_call(
        &self,
        thread_id: &str,
        turn: u64,
        call_id: &str,
    ) -> Result<Option<SubagentRecord>, StoreError> {
        let turn = int(turn)?;
        read!(self, |db| {
            row(
                &db,
                "SELECT s.record::text FROM antler_subagent_calls c \
                 JOIN antler_subagents s ON s.id = c.subagent_id \
                 WHERE c.thread_id = $1 AND c.turn = $2 AND c.call_id = $3",
                &[&thread_id, &turn, &call_id],
            )
            .await?
            .map(|row| json("subagent", &row, 0))
            .transpose()
        })
    }

    async fn thread_subagents(
        &self,
        thread_id: &str,
        limit: usize,
    ) -> Result<Vec<SubagentRecord>, StoreError> {
        let limit = bound(limit as u64);
        let mut records: Vec<SubagentRecord> = read!(self, |db| {
            // The newest turns' calls, as the sled index reads them.
            let found = rows(
                &db,
                "SELECT s.record::text FROM antler_subagent_calls c \
                 JOIN antler_subagents s ON s.id = c.subagent_id \
                 WHERE c.thread_id = $1 ORDER BY c.turn DESC, c.call_id DESC LIMIT $2",
                &[&thread_id, &limit],
            )
            .await?;
            all_json("subagent", &found)
        })?;
        records.sort_by(|a, b| b.id.cmp(&a.id));
        Ok(records)
    }

    async fn transition_subagent(
        &self,
        id: &str,
        change: &SubagentChange,
    ) -> Result<Transition, StoreError> {
        transaction!(self, |tx| {
            let found = row(
                &tx,
                "SELECT record::text FROM antler_subagents WHERE id = $1 FOR UPDATE",
                &[&id],
            )
            .await?
            .ok_or_else(|| missing("subagent", id))?;
            transition(&tx, json("subagent", &found, 0)?, change).await
        })
    }

    async fn fail_unfinished_subagents(
        &self,
        reason: &str,
        now_ms: u64,
    ) -> Result<usize, StoreError> {
        let change = SubagentChange::failed(SubagentStatus::Failed, reason, now_ms);
        let owner = self.owner.as_deref().unwrap_or_default();
        transaction!(self, |tx| {
            // Tasks whose replica is gone (its mark ran out or was cleared), never this
            // replica's own or a live one's; locked, so two replicas finding the same task
            // fail it once (the second finds it terminal and skips it).
            let found = rows(
                &tx,
                concat!(
                    "SELECT record::text FROM antler_subagents s WHERE NOT terminal ",
                    "AND (s.owner IS NULL OR (s.owner <> $1 AND NOT EXISTS ",
                    "(SELECT 1 FROM antler_replicas r WHERE r.owner = s.owner ",
                    "AND r.expires_at_ms > (extract(epoch from clock_timestamp()) * 1000)::bigint))) ",
                    "ORDER BY id FOR UPDATE"
                ),
                &[&owner],
            )
            .await?;
            let mut failed = 0;
            for record in all_json::<SubagentRecord>("subagent", &found)? {
                if matches!(
                    transition(&tx, record, &change).await?,
                    Transition::Applied(_)
                ) {
                    failed += 1;
                }
            }
            Ok(failed)
        })
    }
}

#[async_trait::async_trait]
impl MaintenanceStore for PgStore {
    async fn sweep(&self, now_ms: u64, retain_ms: u64) -> Result<usize, StoreError> {
        let now = bound(now_ms);
        let cutoff = bound(now_ms.saturating_sub(retain_ms));
        let subagent_cutoff = bound(rules::subagent_cutoff(now_ms, retain_ms));
        transaction!(self, |tx| {
            // Keys a redelivery at `now` would no longer be a duplicate of (`duplicate_at`).
            let dedupe = exec(
                &tx,
                "DELETE FROM antler_dedupe WHERE expires_at_ms <= $1",
                &[&now],
            )
            .await?;
            // `rules::outbox_expired`.
            let outbox = exec(
                &tx,
                "DELETE FROM antler_outbox WHERE status <> 'pending' AND finished_at_ms <= $1",
                &[&cutoff],
            )
            .await?;
            // `rules::subagent_expired`, with their call index entries.
            let subagents = row(
                &tx,
                "WITH gone AS (DELETE FROM antler_subagents WHERE terminal \
                 AND (finished_at_ms IS NULL OR finished_at_ms <= $1) RETURNING id), \
                 calls AS (DELETE FROM antler_subagent_calls \
                 WHERE subagent_id IN (SELECT id FROM gone)) \
                 SELECT count(*) FROM gone",
                &[&subagent_cutoff],
            )
            .await?
            .map(|row| get::<i64>(&row, 0))
            .transpose()?
            .unwrap_or(0);
            // `rules::approval_expired`.
            let approvals = exec(
                &tx,
                "DELETE FROM antler_approvals WHERE queued AND decided_at_ms <= $1",
                &[&cutoff],
            )
            .await?;
            Ok((dedupe + outbox + approvals) as usize + subagents as usize)
        })
    }

    async fn stats(&self) -> Result<StoreStats, StoreError> {
        let cached = self.recent_disk_bytes();
        let measure = cached.is_none();
        let stats = read!(self, |db| {
            let found = row(
                &db,
                "SELECT coalesce(c.inbox, 0)::bigint, coalesce(c.outbox_pending, 0)::bigint, \
                 (SELECT accepted_at_ms FROM antler_inbox ORDER BY seq LIMIT 1), \
                 CASE WHEN $1 THEN \
                 (SELECT coalesce(sum(pg_total_relation_size(t.oid)), 0)::bigint \
                  FROM pg_class t WHERE t.relkind IN ('r', 'S') \
                  AND t.relnamespace = \
                  (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) \
                  AND t.relname LIKE 'antler\\_%') \
                 ELSE 0::bigint END \
                 FROM (SELECT sum(inbox) AS inbox, sum(outbox_pending) AS outbox_pending \
                 FROM antler_counters) c",
                &[&measure],
            )
            .await?
            .ok_or_else(|| missing("counters", "*"))?;
            Ok(StoreStats {
                inbox: uint("inbox count", get(&found, 0)?)? as usize,
                outbox_pending: uint("outbox count", get(&found, 1)?)? as usize,
                oldest_inbox_at_ms: get::<Option<i64>>(&found, 2)?
                    .map(|at| uint("inbox item", at))
                    .transpose()?,
                disk_bytes: uint("disk size", get(&found, 3)?)?,
            })
        })?;
        Ok(match cached {
            Some(disk_bytes) => StoreStats {
                disk_bytes,
                ..stats
            },
            None => {
                self.measured_disk_bytes(stats.disk_bytes);
                stats
            }
        })
    }
}

/// The store's lease, locked until the transaction ends.
async fn locked_lease(tx: &Transaction<'_>) -> Result<Option<Lease>, Failure> {
    let Some(found) = row(
        tx,
        "SELECT owner, until_ms, released FROM antler_leases WHERE name = $1 FOR UPDATE",
        &[&STORE_LEASE],
    )
    .await?
    else {
        return Ok(None);
    };
    Ok(Some(Lease {
        owner: get(&found, 0)?,
        until_ms: uint("lease", get(&found, 1)?)?,
        released: get(&found, 2)?,
    }))
}

/// Stores the lease: an update when there was one (locked), else an insert that loses to a
/// concurrent claim (the claim runs again and finds it).
async fn put_lease(tx: &Transaction<'_>, lease: &Lease, existed: bool) -> Result<(), Failure> {
    let until = int(lease.until_ms)?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
        [&STORE_LEASE, &lease.owner, &until, &lease.released];
    if existed {
        exec(
            tx,
            "UPDATE antler_leases SET owner = $2, until_ms = $3, released = $4 WHERE name = $1",
            &params,
        )
        .await?;
        return Ok(());
    }
    let inserted = exec(
        tx,
        "INSERT INTO antler_leases (name, owner, until_ms, released) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (name) DO NOTHING",
        &params,
    )
    .await?;
    if inserted == 0 {
        return Err(Failure::Again("the lease was claimed meanwhile".to_owned()));
    }
    Ok(())
}

#[async_trait::async_trait]
impl LeaseStore for PgStore {
    async fn claim(&self, owner: &str, now_ms: u64, until_ms: u64) -> Result<Claimed, StoreError> {
        transaction!(self, |tx| {
            let current = locked_lease(&tx).await?;
            // Other processes may share the database: a live lease of another owner is
            // respected until it ends.
            let (lease, claimed) =
                rules::claim_lease(current.as_ref(), owner, now_ms, until_ms, false)?;
            put_lease(&tx, &lease, current.is_some()).await?;
            Ok(claimed)
        })
    }

    async fn renew(&self, owner: &str, until_ms: u64) -> Result<(), StoreError> {
        transaction!(self, |tx| {
            let current = locked_lease(&tx).await?;
            let lease = rules::renew_lease(current.as_ref(), owner, until_ms)?;
            put_lease(&tx, &lease, current.is_some()).await
        })
    }

    async fn release(&self, owner: &str) -> Result<(), StoreError> {
        transaction!(self, |tx| {
            let current = locked_lease(&tx).await?;
            if let Some(lease) = rules::release_lease(current.as_ref(), owner) {
                put_lease(&tx, &lease, current.is_some()).await?;
            }
            Ok(())
        })
    }
}
