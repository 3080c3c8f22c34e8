//! The `bash` tool while the sandbox's probe decides whether it exists.
//!
//! The probe (one run through the real sandbox, [`crate::sandbox::detect`]) takes tens of
//! milliseconds, most of antler's start. So antler answers before it is done: the probe runs
//! in the background and [`ShellProbe`] carries its verdict. Until then the shell is offered
//! to nobody; a run whose author may use the shell (the guardrail allows them `bash`) waits
//! for the verdict before its first model call ([`Tool::settle`]), so it is offered the shell
//! exactly when the probe proved a sandbox; a run whose author may not never waits. A call
//! made anyway (a model may call a tool it was never offered) waits for the verdict too, and
//! without a sandbox it fails: no command ever runs unproven.

use std::sync::Arc;

use tokio::sync::watch;

use super::bash::{BashConfig, BashTool, bash_spec};
use super::{Tool, ToolContext, ToolError};
use crate::agent::input::{Author, Role};
use crate::agent::model::ToolSpec;

/// Who would be offered the shell (as the guardrail decides), sandbox permitting.
pub(crate) type ShellRoles = Arc<dyn Fn(Role) -> bool + Send + Sync>;

/// What the probe decided.
#[derive(Clone)]
struct Verdict {
    /// The tool and its spec, when a sandbox works.
    bash: Option<(Arc<BashTool>, Arc<ToolSpec>)>,
    /// The shell's part of `/readyz`.
    status: serde_json::Value,
    /// Whatever must live as long as the shell can run (its proxy).
    _keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

/// The sandbox probe's verdict, shared: pending while the probe runs. Cloning shares it.
#[derive(Clone)]
pub(crate) struct ShellProbe {
    verdict: watch::Receiver<Option<Verdict>>,
}

/// Hands the probe's verdict to every [`ShellProbe`]; dropped without a verdict (the probe
/// was stopped), the shell is not offered.
pub(crate) struct ShellProbeDone {
    verdict: watch::Sender<Option<Verdict>>,
}

impl ShellProbe {
    /// A probe still running, and the handle that settles it.
    pub(crate) fn pending() -> (Self, ShellProbeDone) {
        let (sender, receiver) = watch::channel(None);
        (
            Self { verdict: receiver },
            ShellProbeDone { verdict: sender },
        )
    }

    /// Whether the probe has decided.
    #[cfg(test)]
    pub(crate) fn is_settled(&self) -> bool {
        let stopped = self.verdict.has_changed().is_err();
        stopped || self.verdict.borrow().is_some()
    }

    /// Whether the shell is offered: the probe proved a sandbox.
    pub(crate) fn offered(&self) -> bool {
        self.verdict
            .borrow()
            .as_ref()
            .is_some_and(|verdict| verdict.bash.is_some())
    }

    /// Waits until the probe has decided.
    pub(crate) async fn settled(&self) {
        let mut verdict = self.verdict.clone();
        // An error: the probe was stopped without a verdict, which counts as "not offered".
        let _ = verdict.wait_for(Option::is_some).await;
    }

    /// The shell's part of `/readyz`: the probe's verdict, or that it is still running.
    pub(crate) fn status(&self, cfg: &BashConfig) -> serde_json::Value {
        let stopped = self.verdict.has_changed().is_err();
        match self.verdict.borrow().as_ref() {
            Some(verdict) => verdict.status.clone(),
            None if stopped => serde_json::json!({
                "enabled": cfg.enabled,
                "offered": false,
                "probing": false,
                "sandbox": null,
                "network": cfg.network,
                "detail": "the sandbox's probe was stopped before it decided",
            }),
            None => serde_json::json!({
                "enabled": cfg.enabled,
                "offered": false,
                "probing": true,
                "sandbox": null,
                "network": cfg.network,
                "detail": "the sandbox is being probed",
            }),
        }
    }

    fn tool(&self) -> Option<(Arc<BashTool>, Arc<ToolSpec>)> {
        self.verdict.borrow().as_ref().and_then(|v| v.bash.clone())
    }
}

impl ShellProbeDone {
    /// Settles the probe: `bash` is the tool when a sandbox works, `status` the shell's part
    /// of `/readyz`; `keep` lives as long as the shell can run.
    pub(crate) fn settle(
        self,
        bash: Option<BashTool>,
        status: serde_json::Value,
        keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
    ) {
        let bash = bash.map(|tool| {
            let spec = Arc::new(tool.spec());
            (Arc::new(tool), spec)
        });
        // No receiver left: nothing runs turns any more, so nobody needs the verdict.
        let _ = self.verdict.send(Some(Verdict {
            bash,
            status,
            _keep: keep,
        }));
    }
}

/// `bash` as the registry holds it while the probe may still be running: offered once the
/// probe proved a sandbox, never before.
pub(crate) struct ProbedBash {
    probe: ShellProbe,
    /// Who would be offered it: only their runs wait for the probe.
    roles: ShellRoles,
    /// The spec it has before the probe decides (never offered then).
    provisional: ToolSpec,
}

impl ProbedBash {
    /// The tool for `cfg`, decided by `probe`, offered to `roles`.
    pub(crate) fn new(cfg: &BashConfig, probe: ShellProbe, roles: ShellRoles) -> Self {
        Self {
            probe,
            roles,
            provisional: bash_spec(cfg.network, BashTool::output_limit(cfg)),
        }
    }
}

#[async_trait::async_trait]
impl Tool for ProbedBash {
    fn spec(&self) -> ToolSpec {
        self.probe
            .tool()
            .map_or_else(|| self.provisional.clone(), |(_, spec)| (*spec).clone())
    }

    fn spec_for(&self, _author: &Author) -> Option<Arc<ToolSpec>> {
        self.probe.tool().map(|(_, spec)| spec)
    }

    fn offered(&self) -> bool {
        self.probe.offered()
    }

    async fn settle(&self, author: &Author) {
        if (self.roles)(author.role) {
            self.probe.settled().await;
        }
    }

    async fn call(
        &self,
        arguments: serde_json::Value,
        cx: &ToolContext,
    ) -> Result<String, ToolError> {
        self.probe.settled().await;
        match self.probe.tool() {
            Some((tool, _)) => tool.call(arguments, cx).await,
            None => Err(ToolError::Failed(
                "the shell is not available: no sandbox works here".to_owned(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::tools::ToolRegistry;
    use crate::agent::tools::tests::context;
    use crate::sandbox::{Backend, Sandbox, SandboxLimits};

    fn author(role: Role) -> Author {
        Author {
            channel: "api".to_owned(),
            user_id: "u".to_owned(),
            name: None,
            role,
        }
    }

    fn unconfined() -> BashTool {
        let sandbox = Sandbox::new(
            Backend::None,
            false,
            SandboxLimits::default(),
            std::path::PathBuf::from("/antler"),
            None,
        );
        BashTool::new(&BashConfig::default(), sandbox)
    }

    /// A registry holding the probed shell, offered to admins only.
    fn registry(probe: &ShellProbe) -> ToolRegistry {
        let mut registry = ToolRegistry::builtin();
        let admins: ShellRoles = Arc::new(|role| role == Role::Admin);
        registry.register(Arc::new(ProbedBash::new(
            &BashConfig::default(),
            probe.clone(),
            admins,
        )));
        registry
    }

    fn offers_bash(registry: &ToolRegistry, role: Role) -> bool {
        registry
            .specs_for(&author(role))
            .iter()
            .any(|spec| spec.name == "bash")
    }

    #[tokio::test(start_paused = true)]
    async fn the_shell_is_offered_only_after_a_probe_that_found_a_sandbox() {
        let (probe, done) = ShellProbe::pending();
        let registry = registry(&probe);
        assert!(registry.contains("bash"));
        assert!(!offers_bash(&registry, Role::Admin), "not before the probe");
        assert_eq!(probe.status(&BashConfig::default())["probing"], true);

        // A user who may not run the shell does not wait for the probe.
        registry.settle(&author(Role::User)).await;

        // An admin's run waits for it, then is offered the shell.
        let admin_run = {
            let registry = registry.clone();
            tokio::spawn(async move {
                registry.settle(&author(Role::Admin)).await;
                offers_bash(&registry, Role::Admin)
            })
        };
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        assert!(
            !admin_run.is_finished(),
            "the admin's run waits for the verdict"
        );
        done.settle(
            Some(unconfined()),
            serde_json::json!({"offered": true}),
            None,
        );
        assert!(admin_run.await.unwrap());
        assert!(probe.offered() && probe.is_settled());
        assert_eq!(probe.status(&BashConfig::default())["offered"], true);
    }

    #[tokio::test]
    async fn a_probe_that_found_no_sandbox_never_offers_the_shell_and_refuses_calls() {
        let (probe, done) = ShellProbe::pending();
        let registry = registry(&probe);
        done.settle(None, serde_json::json!({"offered": false}), None);
        registry.settle(&author(Role::Admin)).await;
        assert!(!offers_bash(&registry, Role::Admin));
        let call = crate::agent::message::ToolCall {
            id: "c1".to_owned(),
            name: "bash".to_owned(),
            arguments: r#"{"command":"true"}"#.to_owned(),
        };
        let output = registry.call(&call, &context()).await;
        assert!(output.is_error, "{output:?}");
        assert!(output.content.contains("no sandbox"), "{output:?}");
    }

    #[tokio::test]
    async fn a_probe_stopped_before_its_verdict_offers_nothing_and_waits_for_nothing() {
        let (probe, done) = ShellProbe::pending();
        let registry = registry(&probe);
        drop(done);
        registry.settle(&author(Role::Admin)).await;
        assert!(!offers_bash(&registry, Role::Admin));
        assert!(probe.is_settled());
        assert_eq!(probe.status(&BashConfig::default())["probing"], false);
    }
}
