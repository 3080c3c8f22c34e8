//! What operators and chats set on PostgreSQL: skill switches, DM pairing, chat-made
//! schedules and tool approvals.

use std::collections::BTreeMap;

use deadpool_postgres::Transaction;

use super::{
    Failure, PgStore, all_json, bound, exec, get, int, json, missing, read, row, rows, to_json,
    transaction, uint,
};
use crate::agent::approvals::{ApprovalRecord, ApprovalState, Opened};
use crate::store::rules;
use crate::store::{
    AddedSchedule, ApprovalDecision, ApprovalStore, Decided, PairedUser, PairingRequest,
    PairingStore, ScheduleRecord, ScheduleStore, SkillStore, StoreError,
};

/// Advisory lock classes (the first key of `pg_advisory_xact_lock(int, int)`): the
/// conversation whose approvals are counted and added, and the schedules' count and insert.
const APPROVALS_LOCK: i32 = 0x616e_7401;
const SCHEDULES_LOCK: i32 = 0x616e_7402;

#[async_trait::async_trait]
impl SkillStore for PgStore {
    async fn skill_switches(&self) -> Result<BTreeMap<String, bool>, StoreError> {
        read!(self, |db| {
            rows(
                &db,
                "SELECT name, enabled FROM antler_skills ORDER BY name",
                &[],
            )
            .await?
            .iter()
            .map(|row| Ok((get(row, 0)?, get(row, 1)?)))
            .collect::<Result<BTreeMap<String, bool>, Failure>>()
        })
    }

    async fn set_skill_switch(&self, name: &str, on: bool) -> Result<(), StoreError> {
        transaction!(self, |tx| {
            exec(
                &tx,
                "INSERT INTO antler_skills (name, enabled) VALUES ($1, $2) \
                 ON CONFLICT (name) DO UPDATE SET enabled = EXCLUDED.enabled",
                &[&name, &on],
            )
            .await
            .map(drop)
        })
    }
}

#[async_trait::async_trait]
impl PairingStore for PgStore {
    async fn pairing_requests(&self) -> Result<Vec<PairingRequest>, StoreError> {
        read!(self, |db| {
            let found = rows(
                &db,
                "SELECT record::text FROM antler_pairing_requests ORDER BY channel, user_id",
                &[],
            )
            .await?;
            all_json("pairing request", &found)
        })
    }

    async fn put_pairing_request(
        &self,
        request: &PairingRequest,
        dropped: &[(String, String)],
    ) -> Result<(), StoreError> {
        let value = to_json("pairing request", request)?;
        transaction!(self, |tx| {
            for (channel, user_id) in dropped {
                exec(
                    &tx,
                    "DELETE FROM antler_pairing_requests WHERE channel = $1 AND user_id = $2",
                    &[channel, user_id],
                )
                .await?;
            }
            exec(
                &tx,
                "INSERT INTO antler_pairing_requests (channel, user_id, record) \
                 VALUES ($1, $2, $3::text::jsonb) \
                 ON CONFLICT (channel, user_id) DO UPDATE SET record = EXCLUDED.record",
                &[&request.channel, &request.user_id, &value],
            )
            .await
            .map(drop)
        })
    }

    async fn settle_pairing(
        &self,
        channel: &str,
        user_id: &str,
        paired: Option<&PairedUser>,
    ) -> Result<bool, StoreError> {
        let paired = paired
            .map(|user| to_json("paired user", user).map(|value| (user, value)))
            .transpose()?;
        transaction!(self, |tx| {
            let found = exec(
                &tx,
                "DELETE FROM antler_pairing_requests WHERE channel = $1 AND user_id = $2",
                &[&channel, &user_id],
            )
            .await?
                > 0;
            if let Some((user, value)) = &paired {
                exec(
                    &tx,
                    "INSERT INTO antler_paired_users (channel, user_id, record) \
                     VALUES ($1, $2, $3::text::jsonb) \
                     ON CONFLICT (channel, user_id) DO UPDATE SET record = EXCLUDED.record",
                    &[&user.channel, &user.user_id, value],
                )
                .await?;
            }
            Ok(found)
        })
    }

    async fn paired_users(&self) -> Result<Vec<PairedUser>, StoreError> {
        read!(self, |db| {
            let found = rows(
                &db,
                "SELECT record::text FROM antler_paired_users ORDER BY channel, user_id",
                &[],
            )
            .await?;
            all_json("paired user", &found)
        })
    }
}

#[async_trait::async_trait]
impl ScheduleStore for PgStore {
    async fn schedules(&self) -> Result<Vec<ScheduleRecord>, StoreError> {
        read!(self, |db| {
            let found = rows(
                &db,
                "SELECT record::text FROM antler_schedules ORDER BY name",
                &[],
            )
            .await?;
            all_json("schedule", &found)
        })
    }

    async fn add_schedule(
        &self,
        record: &ScheduleRecord,
        limit: usize,
    ) -> Result<AddedSchedule, StoreError> {
        let value = to_json("schedule", record)?;
        let limit = bound(limit as u64);
        transaction!(self, |tx| {
            // The count and the insert are one step for every replica.
            exec(
                &tx,
                "SELECT pg_advisory_xact_lock($1, 0)",
                &[&SCHEDULES_LOCK],
            )
            .await?;
            let found = row(
                &tx,
                "SELECT (SELECT count(*) FROM antler_schedules), \
                 EXISTS (SELECT 1 FROM antler_schedules WHERE name = $1)",
                &[&record.name],
            )
            .await?
            .ok_or_else(|| missing("schedule count", "*"))?;
            let (stored, exists): (i64, bool) = (get(&found, 0)?, get(&found, 1)?);
            if exists {
                return Ok(AddedSchedule::Exists);
            }
            if stored >= limit {
                return Ok(AddedSchedule::Full);
            }
            exec(
                &tx,
                "INSERT INTO antler_schedules (name, record) VALUES ($1, $2::text::jsonb)",
                &[&record.name, &value],
            )
            .await?;
            // A schedule of the same name removed earlier left no mark; this one starts from
            // its own creation.
            exec(
                &tx,
                "DELETE FROM antler_schedule_marks WHERE name = $1",
                &[&record.name],
            )
            .await?;
            Ok(AddedSchedule::Added)
        })
    }

    async fn remove_schedule(&self, name: &str) -> Result<bool, StoreError> {
        transaction!(self, |tx| {
            let found = exec(
                &tx,
                "DELETE FROM antler_schedules WHERE name = $1",
                &[&name],
            )
            .await?
                > 0;
            if found {
                exec(
                    &tx,
                    "DELETE FROM antler_schedule_marks WHERE name = $1",
                    &[&name],
                )
                .await?;
            }
            Ok(found)
        })
    }

    async fn schedule_marks(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        read!(self, |db| {
            rows(
                &db,
                "SELECT name, fire_ms FROM antler_schedule_marks ORDER BY name",
                &[],
            )
            .await?
            .iter()
            .map(|row| Ok((get(row, 0)?, uint("schedule mark", get(row, 1)?)?)))
            .collect::<Result<BTreeMap<String, u64>, Failure>>()
        })
    }

    async fn set_schedule_mark(&self, name: &str, fire_ms: u64) -> Result<(), StoreError> {
        let fire = int(fire_ms)?;
        transaction!(self, |tx| {
            exec(
                &tx,
                "INSERT INTO antler_schedule_marks (name, fire_ms) VALUES ($1, $2) \
                 ON CONFLICT (name) DO UPDATE SET fire_ms = EXCLUDED.fire_ms",
                &[&name, &fire],
            )
            .await
            .map(drop)
        })
    }
}

/// The approval `id`, locked until the transaction ends.
async fn locked_approval(tx: &Transaction<'_>, id: &str) -> Result<ApprovalRecord, Failure> {
    let found = row(
        tx,
        "SELECT record::text FROM antler_approvals WHERE id = $1 FOR UPDATE",
        &[&id],
    )
    .await?
    .ok_or_else(|| missing("approval", id))?;
    json("approval", &found, 0)
}

/// Writes back a changed approval.
async fn put_approval(tx: &Transaction<'_>, record: &ApprovalRecord) -> Result<(), Failure> {
    exec(
        tx,
        "UPDATE antler_approvals SET state = $2, queued = $3, decided_at_ms = $4, \
         record = $5::text::jsonb WHERE id = $1",
        &[
            &record.id,
            &record.state.as_str(),
            &record.queued,
            &record.decided_at_ms.map(int).transpose()?,
            &to_json("approval", record)?,
        ],
    )
    .await?;
    Ok(())
}

#[async_trait::async_trait]
impl ApprovalStore for PgStore {
    async fn open_approval(
        &self,
        record: &ApprovalRecord,
        max_pending: usize,
    ) -> Result<Opened, StoreError> {
        let value = to_json("approval", record)?;
        let call = record.call_key();
        let max_pending = bound(max_pending as u64);
        transaction!(self, |tx| {
            // One conversation's approvals are counted and added by one writer at a time.
            exec(
                &tx,
                "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                &[&APPROVALS_LOCK, &record.conversation],
            )
            .await?;
            if let Some(found) = row(
                &tx,
                "SELECT record::text FROM antler_approvals WHERE thread_id = $1 AND call_key = $2",
                &[&record.thread_id, &call],
            )
            .await?
            {
                return Ok(Opened::Existing(json("approval", &found, 0)?));
            }
            let pending: i64 = row(
                &tx,
                "SELECT count(*) FROM antler_approvals WHERE conversation = $1 AND state = $2",
                &[&record.conversation, &ApprovalState::Pending.as_str()],
            )
            .await?
            .map(|row| get(&row, 0))
            .transpose()?
            .unwrap_or(0);
            if pending >= max_pending {
                return Ok(Opened::Full);
            }
            let inserted = exec(
                &tx,
                "INSERT INTO antler_approvals (id, conversation, thread_id, call_key, state, \
                 queued, created_at_ms, decided_at_ms, record) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::text::jsonb) ON CONFLICT DO NOTHING",
                &[
                    &record.id,
                    &record.conversation,
                    &record.thread_id,
                    &call,
                    &record.state.as_str(),
                    &record.queued,
                    &int(record.created_at_ms)?,
                    &record.decided_at_ms.map(int).transpose()?,
                    &value,
                ],
            )
            .await?;
            if inserted == 0 {
                return Err(Failure::Store(StoreError::Conflict(format!(
                    "approval id {} is taken",
                    record.id
                ))));
            }
            Ok(Opened::New(record.clone()))
        })
    }

    async fn approval(&self, id: &str) -> Result<Option<ApprovalRecord>, StoreError> {
        read!(self, |db| {
            row(
                &db,
                "SELECT record::text FROM antler_approvals WHERE id = $1",
                &[&id],
            )
            .await?
            .map(|row| json("approval", &row, 0))
            .transpose()
        })
    }

    async fn approval_for_call(
        &self,
        thread_id: &str,
        call_key: &str,
    ) -> Result<Option<ApprovalRecord>, StoreError> {
        read!(self, |db| {
            row(
                &db,
                "SELECT record::text FROM antler_approvals WHERE thread_id = $1 AND call_key = $2",
                &[&thread_id, &call_key],
            )
            .await?
            .map(|row| json("approval", &row, 0))
            .transpose()
        })
    }

    async fn open_approvals(&self) -> Result<Vec<ApprovalRecord>, StoreError> {
        read!(self, |db| {
            let found = rows(
                &db,
                "SELECT record::text FROM antler_approvals WHERE NOT queued \
                 ORDER BY created_at_ms, id",
                &[],
            )
            .await?;
            all_json("approval", &found)
        })
    }

    async fn decide_approval(
        &self,
        id: &str,
        decision: &ApprovalDecision,
    ) -> Result<Decided, StoreError> {
        transaction!(self, |tx| {
            let mut record = locked_approval(&tx, id).await?;
            if !rules::decide_approval(&mut record, decision) {
                return Ok(Decided::Before(record));
            }
            put_approval(&tx, &record).await?;
            Ok(Decided::Now(record))
        })
    }

    async fn approval_queued(&self, id: &str) -> Result<(), StoreError> {
        transaction!(self, |tx| {
            let mut record = locked_approval(&tx, id).await?;
            record.queued = true;
            put_approval(&tx, &record).await
        })
    }
}
