//! [`ApprovalStore`] on sled, in three trees (JSON values, like the other small records):
//!
//! | tree | key | value |
//! |---|---|---|
//! | `approvals` | approval id | [`ApprovalRecord`] |
//! | `approval_calls` | (thread id, call key: message index and call id) | approval id |
//! | `approvals_open` | approval id | nothing: pending, or decided and its resume not queued |
//!
//! The open index keeps the expiry timer and `/approvals` from reading every record ever made.

use sled::Transactional;

use super::{SledStore, abort, decode, encode, from_tx, keys, tx_decode, tx_encode};
use crate::agent::approvals::{ApprovalRecord, ApprovalState, Opened};
use crate::store::rules;
use crate::store::{ApprovalDecision, ApprovalStore, Decided, StoreError};

pub(super) fn call_key(thread_id: &str, call_key: &str) -> Vec<u8> {
    keys::tuple(&[thread_id.as_bytes(), call_key.as_bytes()])
}

impl SledStore {
    pub(super) fn approval_trees(
        &self,
    ) -> Result<(sled::Tree, sled::Tree, sled::Tree), StoreError> {
        Ok((
            self.db.open_tree("approvals")?,
            self.db.open_tree("approval_calls")?,
            self.db.open_tree("approvals_open")?,
        ))
    }

    fn open_records(
        records: &sled::Tree,
        open: &sled::Tree,
    ) -> Result<Vec<ApprovalRecord>, StoreError> {
        let mut found = Vec::new();
        for id in open.iter().keys() {
            if let Some(bytes) = records.get(id?)? {
                found.push(decode::<ApprovalRecord>("approval", &bytes)?);
            }
        }
        found.sort_by_key(|record| record.created_at_ms);
        Ok(found)
    }

    /// Removes the approvals decided before `cutoff` whose resume is queued, with their call
    /// index entries (first, so a crash between the two leaves a record the next sweep finds).
    /// Ids are random, so every record is read (off the async workers): a retention's worth of
    /// approvals, a day's by default.
    pub(super) fn sweep_approvals(&self, cutoff: u64) -> Result<usize, StoreError> {
        let (records, calls, _) = self.approval_trees()?;
        let mut removed = 0;
        for entry in records.iter() {
            let (id, bytes) = entry?;
            let record: ApprovalRecord = decode("approval", &bytes)?;
            if rules::approval_expired(&record, cutoff) {
                calls.remove(call_key(&record.thread_id, &record.call_key()))?;
                records.remove(id)?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

#[async_trait::async_trait]
impl ApprovalStore for SledStore {
    async fn open_approval(
        &self,
        record: &ApprovalRecord,
        max_pending: usize,
    ) -> Result<Opened, StoreError> {
        let (records, calls, open) = self.approval_trees()?;
        let pending = Self::open_records(&records, &open)?
            .iter()
            .filter(|r| r.conversation == record.conversation && r.state == ApprovalState::Pending)
            .count();
        let value = encode("approval", record)?;
        let call = call_key(&record.thread_id, &record.call_key());
        let opened = (&records, &calls, &open)
            .transaction(|(records, calls, open)| {
                if let Some(id) = calls.get(call.as_slice())? {
                    let Some(bytes) = records.get(&id)? else {
                        return abort(StoreError::Missing {
                            what: "approval",
                            key: String::from_utf8_lossy(&id).into_owned(),
                        });
                    };
                    return Ok(Opened::Existing(tx_decode("approval", &bytes)?));
                }
                if pending >= max_pending {
                    return Ok(Opened::Full);
                }
                if records.get(record.id.as_bytes())?.is_some() {
                    return abort(StoreError::Conflict(format!(
                        "approval id {} is taken",
                        record.id
                    )));
                }
                records.insert(record.id.as_bytes(), value.as_slice())?;
                calls.insert(call.as_slice(), record.id.as_bytes())?;
                open.insert(record.id.as_bytes(), &[])?;
                Ok(Opened::New(record.clone()))
            })
            .map_err(from_tx)?;
        if matches!(opened, Opened::New(_)) {
            self.commit.flush().await?;
        }
        Ok(opened)
    }

    async fn approval(&self, id: &str) -> Result<Option<ApprovalRecord>, StoreError> {
        let (records, _, _) = self.approval_trees()?;
        Self::get(&records, "approval", id.as_bytes())
    }

    async fn approval_for_call(
        &self,
        thread_id: &str,
        call: &str,
    ) -> Result<Option<ApprovalRecord>, StoreError> {
        let (records, calls, _) = self.approval_trees()?;
        let Some(id) = calls.get(call_key(thread_id, call))? else {
            return Ok(None);
        };
        Self::get(&records, "approval", &id)
    }

    async fn open_approvals(&self) -> Result<Vec<ApprovalRecord>, StoreError> {
        let (records, _, open) = self.approval_trees()?;
        Self::open_records(&records, &open)
    }

    async fn decide_approval(
        &self,
        id: &str,
        decision: &ApprovalDecision,
    ) -> Result<Decided, StoreError> {
        let (records, _, _) = self.approval_trees()?;
        let decided = records
            .transaction(|records| {
                let Some(bytes) = records.get(id.as_bytes())? else {
                    return abort(StoreError::Missing {
                        what: "approval",
                        key: id.to_owned(),
                    });
                };
                let mut record: ApprovalRecord = tx_decode("approval", &bytes)?;
                if !rules::decide_approval(&mut record, decision) {
                    return Ok(Decided::Before(record));
                }
                records.insert(id.as_bytes(), tx_encode("approval", &record)?)?;
                Ok(Decided::Now(record))
            })
            .map_err(from_tx)?;
        if matches!(decided, Decided::Now(_)) {
            self.commit.flush().await?;
        }
        Ok(decided)
    }

    async fn approval_queued(&self, id: &str) -> Result<(), StoreError> {
        let (records, _, open) = self.approval_trees()?;
        (&records, &open)
            .transaction(|(records, open)| {
                let Some(bytes) = records.get(id.as_bytes())? else {
                    return abort(StoreError::Missing {
                        what: "approval",
                        key: id.to_owned(),
                    });
                };
                let mut record: ApprovalRecord = tx_decode("approval", &bytes)?;
                record.queued = true;
                records.insert(id.as_bytes(), tx_encode("approval", &record)?)?;
                open.remove(id.as_bytes())?;
                Ok(())
            })
            .map_err(from_tx)?;
        self.commit.flush().await
    }
}
