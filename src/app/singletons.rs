//! Work only one antler may do at a time, whatever the number of replicas: Telegram polling
//! (`getUpdates` answers one poller), the Discord Gateway (one session per bot), the
//! scheduler and the approvals' timer (each firing and expiry once).
//!
//! With one process (sled) they start with it. Replicas sharing a store take turns: the one
//! holding the store's lease (`LeaseStore`) runs them, the others stand by and claim the
//! lease as it would run out, so a replica that dies hands them over within
//! `store.lease_secs`. Webhooks, turns and deliveries run on every replica meanwhile.

use std::sync::Arc;
use std::time::Duration;

use antler_discord::DiscordChannel;
use antler_telegram::TelegramChannel;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{AppError, RENEWALS_PER_LEASE, discord_gateway, keep_lease, millis};
use crate::config::Config;
use crate::ingress::Ingress;
use crate::ingress::approvals::Approvals;
use crate::schedule::Schedules;
use crate::store::{Store, StoreError};

/// What the singletons need to start.
pub(super) struct Singletons {
    pub(super) config: Config,
    pub(super) telegram_polling: Option<Arc<TelegramChannel>>,
    pub(super) discord: Option<Arc<DiscordChannel>>,
    pub(super) schedules: Arc<Schedules>,
    pub(super) approvals: Arc<Approvals>,
    pub(super) ingress: Ingress,
}

impl Singletons {
    /// Starts every singleton configured, each until `stop`.
    pub(super) async fn start(
        &self,
        stop: &CancellationToken,
    ) -> Result<Vec<JoinHandle<()>>, AppError> {
        let mut tasks = vec![tokio::spawn(crate::schedule::run(
            Arc::clone(&self.schedules),
            Arc::new(self.ingress.clone()),
            stop.clone(),
        ))];
        if !self.config.approvals.tools.is_empty() {
            tasks.push(tokio::spawn(Arc::clone(&self.approvals).run(stop.clone())));
        }
        if let Some(channel) = &self.telegram_polling {
            tasks.push(tokio::spawn(crate::intake::poll_telegram(
                Arc::clone(channel),
                self.ingress.clone(),
                stop.clone(),
            )));
        }
        if let Some(gateway) =
            discord_gateway(&self.config, self.discord.clone(), &self.ingress, stop).await?
        {
            tasks.push(gateway);
        }
        Ok(tasks)
    }

    /// With replicas: runs the singletons while this replica (`owner`) holds the store's
    /// lease of length `lease`, standing by while another does, until `stop`. The lease
    /// itself is given up by the shutdown, after this returns.
    pub(super) async fn run_while_leased(
        self,
        store: Arc<dyn Store>,
        owner: String,
        lease: Duration,
        stop: CancellationToken,
    ) {
        let mut told = false;
        loop {
            let now = crate::now_ms();
            let wait = match store.claim(&owner, now, now + millis(lease)).await {
                Ok(_) => None,
                Err(StoreError::Leased {
                    owner: holder,
                    remaining_ms,
                }) => {
                    if !told {
                        tracing::info!(
                            holder,
                            "another replica polls Telegram, reads the Discord Gateway and runs the timers; this one stands by for them"
                        );
                        told = true;
                    }
                    Some(Duration::from_millis(remaining_ms).min(lease / RENEWALS_PER_LEASE))
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot claim the store's lease; trying again");
                    Some(lease / RENEWALS_PER_LEASE)
                }
            };
            if let Some(wait) = wait {
                tokio::select! {
                    () = tokio::time::sleep(wait + Duration::from_millis(50)) => continue,
                    () = stop.cancelled() => return,
                }
            }
            told = false;
            tracing::info!(
                "this replica polls Telegram, reads the Discord Gateway and runs the timers"
            );
            let running = stop.child_token();
            let tasks = match self.start(&running).await {
                Ok(tasks) => tasks,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the singletons; letting another replica try");
                    if let Err(e) = store.release(&owner).await {
                        tracing::warn!(error = %e, "cannot give up the store's lease");
                    }
                    tokio::select! {
                        () = tokio::time::sleep(lease) => continue,
                        () = stop.cancelled() => return,
                    }
                }
            };
            let lost = CancellationToken::new();
            keep_lease(
                Arc::clone(&store),
                owner.clone(),
                lease,
                running.clone(),
                lost.clone(),
            )
            .await;
            running.cancel();
            for task in tasks {
                let _ = task.await;
            }
            if stop.is_cancelled() {
                return;
            }
            tracing::warn!("the store's lease went to another replica; this one stands by");
        }
    }
}
