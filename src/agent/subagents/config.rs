//! `[subagents]`: whether the lead agent may delegate, how many tasks run at once, and the
//! subagent types it may delegate to.
//!
//! Two types are built in, as in DeerFlow: `general-purpose` (every tool the lead has but
//! `task`, `ask_clarification` and `present_files`; 150 turns) and `bash` (the shell and file
//! tools; 60 turns; offered only to users who may run the shell). `[subagents.types.<name>]`
//! changes a built-in type (only the fields given) or defines a custom one.
//!
//! Budgets: each task runs for its type's `timeout_seconds` (the `task` call waits that long
//! and [`TASK_CALL_MARGIN`] more, and the turn grows to fit the call: see `Runtime`) and may
//! use its type's `token_budget` tokens (1,000,000 by default, as DeerFlow's subagents).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

/// Tools a subagent never gets, whatever its type says: `task` (no recursion),
/// `ask_clarification` (nobody is there to answer a subagent) and `present_files` (only the
/// lead's run delivers files to the chat).
pub(crate) const NEVER_DELEGATED: &[&str] = &["task", "ask_clarification", "present_files"];

/// The tools of the built-in `bash` type.
const BASH_TOOLS: &[&str] = &["bash", "ls", "read_file", "write_file", "str_replace"];

const GENERAL_PURPOSE_PROMPT: &str = "You are a subagent: the lead agent delegated one task to \
you. Work on it on your own with the tools you have; nobody can answer questions, so make \
reasonable assumptions and say which. You do not see the lead's conversation: everything you \
know is in the task. Stop as soon as the task is done. Your final answer is all the lead \
agent sees of your work, so make it complete and self-contained: the result, how you got it, \
the paths of files you wrote, and what is uncertain or left undone.";

const BASH_PROMPT: &str = "You are a command-line subagent: the lead agent delegated one task \
to you that needs the shell. Run the commands the task needs, check their output, and fix \
what fails where you can. Nobody can answer questions. Your final answer is all the lead agent \
sees: say what you ran, what came out (the relevant lines, not whole logs), and what \
failed.";

/// `[subagents]`
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct SubagentsConfig {
    /// Whether the `task` tool is offered at all.
    pub(crate) enabled: bool,
    /// Tasks running at once, across all conversations; more wait for a slot.
    pub(crate) max_concurrent: usize,
    /// How long a task may run unless its type says otherwise, in seconds.
    pub(crate) timeout_seconds: u64,
    /// Tokens a task may use unless its type says otherwise (its model calls and helper
    /// calls); 0 for no budget. As DeerFlow's subagent default.
    pub(crate) token_budget: u64,
    /// `[subagents.types.<name>]`: changes to the built-in types, and custom types.
    pub(crate) types: BTreeMap<String, SubagentTypeConfig>,
}

impl Default for SubagentsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_concurrent: 3,
            timeout_seconds: 900,
            token_budget: DEFAULT_TOKEN_BUDGET,
            types: BTreeMap::new(),
        }
    }
}

/// `[subagents.types.<name>]`: every field is optional; for a built-in type only the fields
/// given change it, a custom type needs `description`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct SubagentTypeConfig {
    /// What the lead agent is told the type is for.
    pub(crate) description: Option<String>,
    /// The subagent's system prompt.
    pub(crate) system_prompt: Option<String>,
    /// The tools it gets (names; a trailing `*` names a prefix); all of the lead's if unset.
    pub(crate) tools: Option<Vec<String>>,
    /// Tools it never gets, besides `task`, `ask_clarification` and `present_files`.
    pub(crate) disallowed_tools: Option<Vec<String>>,
    /// The model it uses; the lead's if unset.
    pub(crate) model: Option<String>,
    /// Model calls it may make.
    pub(crate) max_turns: Option<u32>,
    /// How long it may run, in seconds.
    pub(crate) timeout_seconds: Option<u64>,
    /// Tokens one task may use; 0 for no budget.
    pub(crate) token_budget: Option<u64>,
}

/// A subagent type, resolved from the built-ins and the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SubagentType {
    pub(crate) name: String,
    pub(crate) description: String,
    pub(crate) system_prompt: String,
    /// `None`: every tool of the lead's but the disallowed ones.
    pub(crate) tools: Option<Vec<String>>,
    /// Always holds [`NEVER_DELEGATED`].
    pub(crate) disallowed_tools: Vec<String>,
    /// `None`: the lead's model.
    pub(crate) model: Option<String>,
    pub(crate) max_turns: u32,
    pub(crate) timeout: Duration,
    /// Tokens one task may use; `None`: no budget.
    pub(crate) token_budget: Option<u64>,
    /// Runs shell commands: offered only to users who may.
    pub(crate) needs_shell: bool,
}

impl SubagentType {
    /// Whether a subagent of this type gets the tool `name`.
    pub(crate) fn allows(&self, name: &str) -> bool {
        let named = |list: &[String]| list.iter().any(|entry| names(entry, name));
        if NEVER_DELEGATED.contains(&name) || named(&self.disallowed_tools) {
            return false;
        }
        self.tools.as_deref().is_none_or(named)
    }
}

/// Whether a tool list entry names `tool`: the same name, or a prefix followed by `*`.
fn names(entry: &str, tool: &str) -> bool {
    match entry.strip_suffix('*') {
        Some(prefix) => tool.starts_with(prefix),
        None => entry == tool,
    }
}

/// How much longer than its type's timeout a `task` call may last: the wait for a slot, and
/// the subagent's end recorded. The executor stops a task [`PARENT_MARGIN`] before its call's
/// deadline, so a task that waited up to 45 s for a slot still gets its whole timeout.
///
/// [`PARENT_MARGIN`]: super::executor::PARENT_MARGIN
pub(crate) const TASK_CALL_MARGIN: Duration = Duration::from_secs(60);

/// Tokens a task may use by default, as DeerFlow's subagents (with summarization).
pub(crate) const DEFAULT_TOKEN_BUDGET: u64 = 1_000_000;

/// A configured budget: 0 is none.
fn budget(tokens: u64) -> Option<u64> {
    (tokens > 0).then_some(tokens)
}

/// The names of the built-in types.
pub(crate) const BUILTIN_TYPES: &[&str] = &["general-purpose", "bash"];

impl SubagentsConfig {
    /// The longest a `task` call may take: the slowest type's timeout and
    /// [`TASK_CALL_MARGIN`]; `None` when subagents are off.
    pub(crate) fn longest_call(&self) -> Option<Duration> {
        let slowest = self.types().iter().map(|t| t.timeout).max()?;
        self.enabled.then_some(slowest + TASK_CALL_MARGIN)
    }

    /// The types the lead may delegate to: the built-ins (as configured) and the custom ones,
    /// sorted by name. Call on a validated configuration.
    pub(crate) fn types(&self) -> Vec<SubagentType> {
        let default_timeout = Duration::from_secs(self.timeout_seconds);
        let default_budget = budget(self.token_budget);
        let never: Vec<String> = NEVER_DELEGATED.iter().map(|&s| s.to_owned()).collect();
        let builtin = |name: &str| -> Option<SubagentType> {
            let (description, prompt, tools, max_turns) = match name {
                "general-purpose" => (
                    "A capable agent for complex tasks of several steps that need both \
                     exploring and acting (research, reading and writing files, web pages).",
                    GENERAL_PURPOSE_PROMPT,
                    None,
                    150,
                ),
                "bash" => (
                    "Runs shell commands for one task (builds, tests, git, file work) and \
                     reports what came out.",
                    BASH_PROMPT,
                    Some(BASH_TOOLS.iter().map(|&s| s.to_owned()).collect()),
                    60,
                ),
                _ => return None,
            };
            Some(SubagentType {
                name: name.to_owned(),
                description: description.to_owned(),
                system_prompt: prompt.to_owned(),
                tools,
                disallowed_tools: never.clone(),
                model: None,
                max_turns,
                timeout: default_timeout,
                token_budget: default_budget,
                needs_shell: name == "bash",
            })
        };
        let mut types: BTreeMap<String, SubagentType> = BUILTIN_TYPES
            .iter()
            .filter_map(|name| builtin(name))
            .map(|t| (t.name.clone(), t))
            .collect();
        for (name, cfg) in &self.types {
            let base = types.remove(name).unwrap_or_else(|| SubagentType {
                name: name.clone(),
                description: String::new(),
                system_prompt: GENERAL_PURPOSE_PROMPT.to_owned(),
                tools: None,
                disallowed_tools: never.clone(),
                model: None,
                max_turns: 50,
                timeout: default_timeout,
                token_budget: default_budget,
                needs_shell: false,
            });
            let mut disallowed = never.clone();
            disallowed.extend(cfg.disallowed_tools.iter().flatten().cloned());
            let resolved = SubagentType {
                description: cfg.description.clone().unwrap_or(base.description),
                system_prompt: cfg.system_prompt.clone().unwrap_or(base.system_prompt),
                tools: cfg.tools.clone().or(base.tools),
                disallowed_tools: if cfg.disallowed_tools.is_some() {
                    disallowed
                } else {
                    base.disallowed_tools
                },
                model: cfg.model.clone().or(base.model),
                max_turns: cfg.max_turns.unwrap_or(base.max_turns),
                timeout: cfg
                    .timeout_seconds
                    .map_or(base.timeout, Duration::from_secs),
                token_budget: cfg.token_budget.map_or(base.token_budget, budget),
                ..base
            };
            types.insert(name.clone(), resolved);
        }
        types.into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_types_follow_deerflow_and_never_get_task_or_clarification() {
        let types = SubagentsConfig::default().types();
        let names: Vec<&str> = types.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["bash", "general-purpose"]);
        let general = &types[1];
        assert_eq!(general.max_turns, 150);
        assert_eq!(general.timeout, Duration::from_secs(900));
        assert_eq!(general.token_budget, Some(1_000_000));
        assert!(general.allows("bash") && general.allows("mcp__git__log"));
        for never in NEVER_DELEGATED {
            assert!(!general.allows(never), "{never}");
        }
        let bash = &types[0];
        assert_eq!(bash.max_turns, 60);
        assert!(bash.needs_shell && !general.needs_shell);
        assert!(bash.allows("bash") && bash.allows("str_replace"));
        assert!(!bash.allows("web_fetch") && !bash.allows("task"));
    }

    #[test]
    fn configuration_changes_a_built_in_type_and_adds_custom_ones() {
        let config: SubagentsConfig = toml::from_str(
            r#"
            timeout_seconds = 300
            token_budget = 50000
            [types.general-purpose]
            max_turns = 20
            token_budget = 0
            [types.researcher]
            description = "Finds things on the web"
            tools = ["web_fetch", "mcp__search__*", "task"]
            model = "small-model"
            timeout_seconds = 60
            [types.careful]
            description = "No shell"
            disallowed_tools = ["bash"]
            "#,
        )
        .unwrap();
        let types = config.types();
        let find = |name: &str| types.iter().find(|t| t.name == name).unwrap();
        let general = find("general-purpose");
        assert_eq!(general.max_turns, 20);
        assert_eq!(general.timeout, Duration::from_secs(300));
        assert_eq!(general.token_budget, None, "0 is no budget");
        assert!(general.description.starts_with("A capable agent"));
        let researcher = find("researcher");
        assert_eq!(researcher.model.as_deref(), Some("small-model"));
        assert_eq!(researcher.timeout, Duration::from_secs(60));
        assert_eq!(researcher.max_turns, 50);
        assert_eq!(researcher.token_budget, Some(50_000));
        assert!(researcher.allows("web_fetch") && researcher.allows("mcp__search__query"));
        assert!(!researcher.allows("bash"));
        assert!(!researcher.allows("task"), "listing task does not give it");
        let careful = find("careful");
        assert!(!careful.allows("bash") && careful.allows("read_file"));
        assert!(!careful.allows("ask_clarification"));
    }
}
