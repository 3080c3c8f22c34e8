//! An operator command typed in chat (`/deploy api v1.4.2`): checked (who, the arguments),
//! run with its output streaming into the live draft and to the thread's subscribers, and
//! answered with the output and how it ended. `/stop` stops it like an agent turn.

use tokio_util::sync::CancellationToken;

use super::{Registration, TurnResult, TurnRunner};
use crate::agent::input::Role;
use crate::delivery::Draft;
use crate::events::ThreadEvent;
use crate::opcommands::OperatorCommand;
use crate::opcommands::exec::{Origin, Run, Utf8Pieces};
use crate::store::InboxItem;

impl TurnRunner {
    /// Runs `command` for `item` (whose text starts with `/<name>`).
    pub(super) async fn operator_command(
        &self,
        item: &InboxItem,
        command: &OperatorCommand,
    ) -> TurnResult {
        let answer = |text: String| TurnResult {
            prompts: Vec::new(),
            title: None,
            thread: None,
            text,
            outcome: "command",
            memory_update: None,
            draft: item.draft.clone(),
            files: Vec::new(),
        };
        let name = &command.config.name;
        let event = &item.event;
        let role = if event.user.admin {
            Role::Admin
        } else {
            Role::User
        };
        if !command.allows(role) {
            tracing::info!(command = %name, user = %event.user.id, "an operator command was refused to a non-admin");
            return answer(format!("⛔ /{name} is for admins only. Nothing was run."));
        }
        let rest = event
            .text
            .trim_start()
            .split_once(char::is_whitespace)
            .map_or("", |(_, rest)| rest);
        let values = match command.parse_typed(rest) {
            Ok(values) => values,
            Err(e) => {
                return answer(format!(
                    "⚠️ {e}. Nothing was run.\nUsage: {}",
                    command.usage()
                ));
            }
        };
        if item.attempts > 1 {
            // Running it again could do its work twice (a deploy); the operator decides.
            return answer(format!(
                "⚠️ antler stopped while /{name} was running, so it is not run again on its \
                 own. Check what it did, then run it again if needed."
            ));
        }
        let Some(runner) = self.inner.commands.runner() else {
            return answer(format!("⚠️ /{name} cannot run here."));
        };
        let inner = &self.inner;
        let cancel = CancellationToken::new();
        let _registered = Registration::new(inner, item, &cancel);
        let _typing = self.show_typing(event);
        let draft = inner
            .delivery
            .channel(&event.channel)
            .and_then(|channel| Draft::start(inner.store.clone(), channel, item));
        let in_reply_to = event
            .reply_to
            .clone()
            .unwrap_or_else(|| event.event_id.clone());
        let folders = inner.runtime.folders(&item.thread_id).ok();
        let mut pieces = Utf8Pieces::default();
        let mut started = false;
        let mut on_output = |bytes: &[u8]| {
            let mut text = pieces.push(bytes);
            if text.is_empty() {
                return;
            }
            if !started {
                started = true;
                text.insert_str(0, "```\n");
            }
            if let Some(draft) = &draft {
                draft.delta(&text);
            }
            inner.hub.publish(
                &item.thread_id,
                ThreadEvent::Delta {
                    in_reply_to: in_reply_to.clone(),
                    text,
                },
            );
        };
        let outcome = runner
            .run(Run {
                command,
                argv: command.argv(&values),
                origin: Origin {
                    via: "chat",
                    channel: &event.channel,
                    user_id: &event.user.id,
                    role,
                    thread_id: &item.thread_id,
                },
                folders: folders.as_ref(),
                cancel: Some(cancel),
                deadline: None,
                output: Some(&mut on_output),
            })
            .await;
        let draft = match draft {
            Some(draft) => draft.finish().await,
            None => item.draft.clone(),
        };
        TurnResult {
            prompts: Vec::new(),
            title: None,
            draft,
            ..answer(outcome.text)
        }
    }
}
