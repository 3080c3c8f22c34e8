//! Group commit: many writers, one `fsync`.
//!
//! A writer that needs durability writes to sled, then asks the flusher thread and awaits the
//! answer. The flusher takes every request waiting at that moment, calls `flush()` once, and
//! answers them all. Every request in a batch was sent after its writer's write, and the flush
//! starts after the batch was taken, so the one flush covers every write of the batch. This is
//! what makes durable acknowledgement cost a fraction of an fsync per request under load
//! (DESIGN.md section 9): one flush per event serially, one per batch concurrently.

use std::sync::mpsc;

use tokio::sync::oneshot;

use super::StoreError;

/// A flush request: the database to flush and where to send the outcome. The request carries
/// the database so the flusher holds it only while flushing: once the store is dropped, the
/// files are closed as soon as the last flush has answered.
type Request = (sled::Db, oneshot::Sender<Result<(), String>>);

/// A handle to the flusher thread. The thread ends when the last handle is dropped.
#[derive(Debug, Clone)]
pub(super) struct GroupCommit {
    db: sled::Db,
    requests: mpsc::Sender<Request>,
}

impl GroupCommit {
    /// Starts the flusher thread for `db`.
    pub(super) fn start(db: sled::Db) -> Result<Self, StoreError> {
        let (requests, incoming) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("antler-flusher".to_owned())
            .spawn(move || flusher(&incoming))
            .map_err(|e| StoreError::Backend(format!("cannot start the flusher thread: {e}")))?;
        Ok(Self { db, requests })
    }

    /// Returns once everything written before this call is on disk.
    pub(super) async fn flush(&self) -> Result<(), StoreError> {
        let (done, wait) = oneshot::channel();
        self.requests
            .send((self.db.clone(), done))
            .map_err(|_| StoreError::Backend("the flusher thread has stopped".to_owned()))?;
        match wait.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(StoreError::Backend(format!("flush failed: {e}"))),
            Err(_) => Err(StoreError::Backend(
                "the flusher thread has stopped".to_owned(),
            )),
        }
    }
}

fn flusher(incoming: &mpsc::Receiver<Request>) {
    // Ends when every GroupCommit handle is gone.
    while let Ok((db, first)) = incoming.recv() {
        let mut waiters = vec![first];
        waiters.extend(incoming.try_iter().map(|(_, waiter)| waiter));
        let result = db.flush().map(|_| ()).map_err(|e| e.to_string());
        // Let go of the database before answering, so a dropped store really closes.
        drop(db);
        metrics::counter!("antler_store_flushes_total").increment(1);
        metrics::histogram!("antler_store_flush_batch_size").record(waiters.len() as f64);
        for waiter in waiters {
            // A writer that gave up waiting (cancelled request) is fine to ignore.
            let _ = waiter.send(result.clone());
        }
    }
}
