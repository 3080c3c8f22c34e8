//! skills (after `summarization`, before `todo`): tells the model which skills it has and
//! holds a run to a skill's `allowed-tools` once it read that skill.
//!
//! - `before_run` reads which skills are on (the deployment's switches, one store read a run)
//!   and mounts them for the run's tool calls (`RunContext::skills`, read-only at
//!   `/mnt/skills/<name>/`). A store that cannot be read means a run without skills: it
//!   fails open.
//! - `before_model` appends the `<skills>` block to the system prompt of the request (never
//!   to the stored thread): each skill's name and description, escaped (progressive
//!   disclosure: the model reads a `SKILL.md` and its files only when it needs them). The
//!   list is the deployment's, not the user's, so the system prompt stays byte-identical
//!   across users and prompt caches keep hitting.
//! - `allowed-tools`. The signal is a successful `read_file` of `/mnt/skills/<name>/SKILL.md`
//!   (`after_tool`): a shell `cat` of it is not one, since what a command printed cannot be
//!   told apart from its other output. From then on, for the rest of the run, only the tools
//!   the skill lists are offered and any other call is refused (answered, not run); reading
//!   skill files (`read_file` and `ls` of paths under `/mnt/skills`) stays allowed, so the
//!   model can read the files the instructions point to. A second skill read with its own list
//!   narrows the first (the lists intersect); a skill without `allowed-tools` changes
//!   nothing. The state lives in the run's `RunState`, never in this instance: subagents
//!   share it and their parent's thread id, and they run without skills.
//!
//! Placement: after `guardrail`, whose refusal by role comes first (the first refusal of a
//! call stands); after `summarization`, so the block is never compacted (it is never stored);
//! before `deferred_tools`, which hides tools from what is left.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::{Middleware, MiddlewareError, RunContext, ToolDecision, ToolOutput};
use crate::agent::memory::injection::escape;
use crate::agent::message::{ChatMessage, ToolCall};
use crate::agent::model::ModelRequest;
use crate::agent::skills::{Catalogue, SKILLS_ROOT, SkillMounts, SkillSwitches, SkillsConfig};
use crate::live::Live;

/// The tools that read skill files, allowed on skill paths whatever a skill's list says.
const SKILL_READERS: [&str; 2] = ["read_file", "ls"];

/// What a run is held to after reading skills with `allowed-tools`.
#[derive(Debug, Clone, Default)]
struct Restriction {
    /// The tool names or `prefix*` patterns every skill read so far allows (`None`: no
    /// skill with a list was read).
    allowed: Option<Vec<String>>,
    /// The skills that set it, in the order they were read.
    by: Vec<String>,
}

impl Restriction {
    fn allows(&self, tool: &str) -> bool {
        self.allowed
            .as_ref()
            .is_none_or(|allowed| allowed.iter().any(|entry| names(entry, tool)))
    }
}

/// Whether a list entry names `tool`: the same name, or a prefix followed by `*`.
fn names(entry: &str, tool: &str) -> bool {
    match entry.strip_suffix('*') {
        Some(prefix) => tool.starts_with(prefix),
        None => entry == tool,
    }
}

/// The `path` argument of a call, if it has one.
fn path_argument(call: &ToolCall) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(&call.arguments).ok()?;
    value.get("path")?.as_str().map(str::to_owned)
}

/// Lists the skills to the model and applies their `allowed-tools`.
pub(crate) struct SkillsMiddleware {
    catalogue: Arc<Live<Catalogue>>,
    switches: Arc<dyn SkillSwitches>,
}

impl std::fmt::Debug for SkillsMiddleware {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SkillsMiddleware")
            .field("skills", &self.catalogue.current().skills.len())
            .finish_non_exhaustive()
    }
}

impl SkillsMiddleware {
    /// The middleware over `catalogue`, or `None` when `[skills]` is off.
    pub(crate) fn from_config(
        config: &SkillsConfig,
        catalogue: Arc<Live<Catalogue>>,
        switches: Arc<dyn SkillSwitches>,
    ) -> Option<Self> {
        config.enabled.then_some(Self {
            catalogue,
            switches,
        })
    }
}

/// The `<skills>` block for the system prompt.
pub(crate) fn render(mounts: &SkillMounts) -> String {
    let mut block = format!(
        "<skills>\nSkills are instructions for particular tasks, with files beside them, \
         read-only under {SKILLS_ROOT}. When a task matches a skill's description, first read \
         its instructions with read_file ({SKILLS_ROOT}/<name>/SKILL.md) and follow them; read \
         the other files they name only when you need them.\n"
    );
    for skill in mounts.skills() {
        block.push_str(&format!(
            "<skill name=\"{}\">{}</skill>\n",
            escape(&skill.name),
            escape(&skill.description)
        ));
    }
    block.push_str("</skills>");
    block
}

#[async_trait::async_trait]
impl Middleware for SkillsMiddleware {
    fn name(&self) -> &'static str {
        "skills"
    }

    async fn before_run(&self, cx: &mut RunContext<'_>) -> Result<(), MiddlewareError> {
        let switches = self
            .switches
            .switches()
            .await
            .map_err(|e| MiddlewareError(format!("cannot read which skills are on: {e}")))?;
        cx.skills = self.catalogue.current().mounts(&switches);
        Ok(())
    }

    async fn before_model(
        &self,
        cx: &mut RunContext<'_>,
        request: &mut ModelRequest,
    ) -> Result<(), MiddlewareError> {
        if cx.skills.is_empty() {
            return Ok(());
        }
        let block = render(&cx.skills);
        match request.messages.first_mut() {
            Some(ChatMessage::System { content }) => {
                content.push_str("\n\n");
                content.push_str(&block);
            }
            _ => request.messages.insert(0, ChatMessage::system(block)),
        }
        if let Some(restriction) = cx.state.get::<Restriction>() {
            request.tools.retain(|tool| {
                restriction.allows(&tool.name) || SKILL_READERS.contains(&tool.name.as_str())
            });
        }
        Ok(())
    }

    async fn before_tool(
        &self,
        cx: &mut RunContext<'_>,
        call: &ToolCall,
        refused: Option<&ToolOutput>,
    ) -> Result<ToolDecision, MiddlewareError> {
        let Some(restriction) = cx.state.get::<Restriction>() else {
            return Ok(ToolDecision::Run);
        };
        if refused.is_some() || restriction.allows(&call.name) {
            return Ok(ToolDecision::Run);
        }
        let reads_skill = SKILL_READERS.contains(&call.name.as_str())
            && path_argument(call).is_some_and(|path| SkillMounts::is_skill_path(&path));
        if reads_skill {
            return Ok(ToolDecision::Run);
        }
        let allowed = restriction.allowed.clone().unwrap_or_default();
        tracing::info!(
            thread = %cx.thread.id,
            tool = %call.name,
            skills = ?restriction.by,
            "a skill's allowed-tools refused a tool call"
        );
        Ok(ToolDecision::Skip(ToolOutput::error(format!(
            "Refused: the skill {} allows only these tools for the rest of this run: {}. \
             `{}` was not run.",
            restriction
                .by
                .iter()
                .map(|name| format!("`{name}`"))
                .collect::<Vec<_>>()
                .join(" and "),
            if allowed.is_empty() {
                "none".to_owned()
            } else {
                allowed.join(", ")
            },
            call.name
        ))))
    }

    async fn after_tool(
        &self,
        cx: &mut RunContext<'_>,
        call: &ToolCall,
        output: &mut ToolOutput,
    ) -> Result<(), MiddlewareError> {
        if output.is_error || call.name != "read_file" {
            return Ok(());
        }
        let Some(path) = path_argument(call) else {
            return Ok(());
        };
        let Ok(Some(read)) = cx.skills.resolve(&path) else {
            return Ok(());
        };
        if read.relative.as_os_str() != "SKILL.md" {
            return Ok(());
        }
        let Some(listed) = cx
            .skills
            .get(&read.skill)
            .and_then(|skill| skill.allowed_tools.clone())
        else {
            return Ok(());
        };
        let restriction = cx.state.get_or_default::<Restriction>();
        if restriction.by.contains(&read.skill) {
            return Ok(());
        }
        restriction.allowed = Some(match restriction.allowed.take() {
            None => listed,
            Some(earlier) => {
                let now: BTreeSet<&String> = listed.iter().collect();
                earlier.into_iter().filter(|t| now.contains(t)).collect()
            }
        });
        restriction.by.push(read.skill);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use super::*;
    use crate::agent::middleware::test_context;
    use crate::agent::model::ToolSpec;
    use crate::agent::skills::Skill;
    use crate::agent::thread::ThreadState;

    struct Switches(BTreeMap<String, bool>);

    #[async_trait::async_trait]
    impl SkillSwitches for Switches {
        async fn switches(&self) -> Result<BTreeMap<String, bool>, String> {
            Ok(self.0.clone())
        }
    }

    fn skill(name: &str, description: &str, allowed: Option<&[&str]>) -> Skill {
        Skill {
            name: name.to_owned(),
            description: description.to_owned(),
            allowed_tools: allowed.map(|a| a.iter().map(|t| (*t).to_owned()).collect()),
            license: None,
            folder: PathBuf::from(format!("/skills/{name}")),
        }
    }

    fn middleware(off: &[&str]) -> SkillsMiddleware {
        let mut catalogue = Catalogue::default();
        for s in [
            skill(
                "alpha",
                "Does <b>alpha</b> & more",
                Some(&["bash", "mcp__logs__*"]),
            ),
            skill("beta", "Beta things", Some(&["bash", "web_fetch"])),
            skill("gamma", "No list", None),
        ] {
            catalogue.skills.insert(s.name.clone(), s);
        }
        let switches = off.iter().map(|n| ((*n).to_owned(), false)).collect();
        SkillsMiddleware::from_config(
            &SkillsConfig::default(),
            Arc::new(Live::new(Arc::new(catalogue))),
            Arc::new(Switches(switches)),
        )
        .unwrap()
    }

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: "c1".to_owned(),
            name: name.to_owned(),
            arguments: arguments.to_owned(),
        }
    }

    fn spec(name: &str) -> Arc<ToolSpec> {
        Arc::new(ToolSpec {
            name: name.to_owned(),
            description: String::new(),
            parameters: serde_json::json!({}),
        })
    }

    fn request() -> ModelRequest {
        ModelRequest {
            messages: vec![ChatMessage::system("You are antler.")],
            tools: [
                "bash",
                "read_file",
                "ls",
                "write_file",
                "mcp__logs__tail",
                "web_fetch",
            ]
            .map(spec)
            .to_vec(),
        }
    }

    fn tool_names(request: &ModelRequest) -> Vec<&str> {
        request.tools.iter().map(|t| t.name.as_str()).collect()
    }

    #[tokio::test]
    async fn the_enabled_skills_are_listed_escaped_in_the_system_prompt() {
        let m = middleware(&["beta"]);
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        let mut cx = test_context(&mut thread);
        m.before_run(&mut cx).await.unwrap();
        let mut req = request();
        m.before_model(&mut cx, &mut req).await.unwrap();
        let ChatMessage::System { content } = &req.messages[0] else {
            panic!("no system prompt")
        };
        assert!(
            content.starts_with("You are antler.\n\n<skills>"),
            "{content}"
        );
        assert!(
            content
                .contains("<skill name=\"alpha\">Does &lt;b&gt;alpha&lt;/b&gt; &amp; more</skill>"),
            "{content}"
        );
        assert!(content.contains("<skill name=\"gamma\">"), "{content}");
        assert!(
            !content.contains("beta"),
            "a disabled skill is not listed: {content}"
        );
        // Nothing is restricted before a skill is read.
        assert_eq!(tool_names(&req).len(), 6);
        assert_eq!(
            cx.skills
                .skills()
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>(),
            ["alpha", "gamma"]
        );
    }

    #[tokio::test]
    async fn reading_a_skill_restricts_the_rest_of_the_run_to_its_tools() {
        let m = middleware(&[]);
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        let mut cx = test_context(&mut thread);
        m.before_run(&mut cx).await.unwrap();
        // A failed read, another file, a skill without a list: no restriction.
        for (arguments, error) in [
            (r#"{"path":"/mnt/skills/alpha/SKILL.md"}"#, true),
            (r#"{"path":"/mnt/skills/alpha/notes.md"}"#, false),
            (r#"{"path":"/mnt/skills/gamma/SKILL.md"}"#, false),
        ] {
            let mut output = if error {
                ToolOutput::error("no")
            } else {
                ToolOutput::ok("text")
            };
            m.after_tool(&mut cx, &call("read_file", arguments), &mut output)
                .await
                .unwrap();
        }
        assert_eq!(
            m.before_tool(&mut cx, &call("write_file", "{}"), None)
                .await
                .unwrap(),
            ToolDecision::Run
        );
        m.after_tool(
            &mut cx,
            &call("read_file", r#"{"path":" /mnt/skills/alpha/./SKILL.md"}"#),
            &mut ToolOutput::ok("instructions"),
        )
        .await
        .unwrap();
        let mut req = request();
        m.before_model(&mut cx, &mut req).await.unwrap();
        assert_eq!(
            tool_names(&req),
            ["bash", "read_file", "ls", "mcp__logs__tail"]
        );
        let decide = |name: &'static str, arguments: &'static str| call(name, arguments);
        for (c, runs) in [
            (decide("bash", r#"{"command":"ls"}"#), true),
            (decide("mcp__logs__tail", "{}"), true),
            (
                decide("read_file", r#"{"path":"/mnt/skills/gamma/SKILL.md"}"#),
                true,
            ),
            (decide("ls", r#"{"path":"/mnt/skills"}"#), true),
            (
                decide("read_file", r#"{"path":"/mnt/user-data/workspace/a"}"#),
                false,
            ),
            (decide("write_file", r#"{"path":"a","content":"b"}"#), false),
            (decide("web_fetch", "{}"), false),
        ] {
            let decision = m.before_tool(&mut cx, &c, None).await.unwrap();
            assert_eq!(
                decision == ToolDecision::Run,
                runs,
                "{}: {decision:?}",
                c.name
            );
            if let ToolDecision::Skip(output) = decision {
                assert!(output.is_error);
                assert!(output.content.contains("`alpha`"), "{}", output.content);
                assert!(
                    output.content.contains("bash, mcp__logs__*"),
                    "{}",
                    output.content
                );
            }
        }
        // A call an earlier hook refused is left as it is.
        let earlier = ToolOutput::error("guardrail said no");
        assert_eq!(
            m.before_tool(&mut cx, &decide("web_fetch", "{}"), Some(&earlier))
                .await
                .unwrap(),
            ToolDecision::Run
        );
        // A second skill narrows the list to what both allow.
        m.after_tool(
            &mut cx,
            &call("read_file", r#"{"path":"/mnt/skills/beta/SKILL.md"}"#),
            &mut ToolOutput::ok("instructions"),
        )
        .await
        .unwrap();
        let mut req = request();
        m.before_model(&mut cx, &mut req).await.unwrap();
        assert_eq!(tool_names(&req), ["bash", "read_file", "ls"]);
    }

    #[tokio::test]
    async fn a_disabled_skill_read_restricts_nothing_and_another_run_starts_free() {
        let m = middleware(&["alpha"]);
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        {
            let mut cx = test_context(&mut thread);
            m.before_run(&mut cx).await.unwrap();
            m.after_tool(
                &mut cx,
                &call("read_file", r#"{"path":"/mnt/skills/alpha/SKILL.md"}"#),
                &mut ToolOutput::ok("instructions"),
            )
            .await
            .unwrap();
            assert!(cx.state.get::<Restriction>().is_none());
        }
        let m = middleware(&[]);
        let mut cx = test_context(&mut thread);
        m.before_run(&mut cx).await.unwrap();
        m.after_tool(
            &mut cx,
            &call("read_file", r#"{"path":"/mnt/skills/alpha/SKILL.md"}"#),
            &mut ToolOutput::ok("instructions"),
        )
        .await
        .unwrap();
        assert!(cx.state.get::<Restriction>().is_some());
        let mut next = test_context(&mut thread);
        m.before_run(&mut next).await.unwrap();
        assert!(
            next.state.get::<Restriction>().is_none(),
            "the state is the run's"
        );
    }
}
