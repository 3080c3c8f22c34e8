//! Operator commands (`[[commands]]`): vetted host programs an operator declares, run as
//! `/name args…` in chat on every platform and offered to the model as the tool `cmd_<name>`.
//!
//! What is typed is hostile, so a command is never a shell string: `run` is an argv whose
//! items may be `{arg}` placeholders, each argument is one argv item, and every value must
//! match its argument's `pattern` as a whole (the pattern is anchored at both ends whatever
//! it says) before anything runs. A bad value gets the usage line and nothing runs. An
//! optional argument left out drops the argv items that name it.
//!
//! Who may run one is its `roles` (`admin` by default); the same roles bind the tool, through
//! the guardrail ([`guardrail_config`]) and again in the tool itself.
//!
//! Running it ([`exec`]) reuses the shell tool's process watching
//! ([`crate::agent::tools::bash::run_watched`]): the program leads its own process group,
//! which is killed on timeout, `/stop` and when the program ends; the output is bounded and
//! streamed; every run is audited.

pub(crate) mod exec;
pub(crate) mod tool;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use regex::Regex;
use serde::Deserialize;

use crate::agent::input::Role;
use crate::agent::middleware::guardrail::GuardrailConfig;
use crate::secret::Secret;

/// The prefix of a command's tool name: `cmd_deploy`.
pub(crate) const TOOL_PREFIX: &str = "cmd_";

/// The names an operator command may not take: the built-in chat commands and their aliases
/// (`ingress::commands` tests that every one is here) and Discord's `/ask`. A list rather than
/// `COMMANDS` itself, which config validation cannot reach (it sits below the ingress).
pub(crate) const BUILTIN_NAMES: &[&str] = &[
    "help",
    "start",
    "new",
    "reset",
    "status",
    "stop",
    "cancel",
    "plan",
    "memory",
    "tasks",
    "skills",
    "schedule",
    "schedules",
    "approvals",
    "approve",
    "deny",
    "ask",
];

/// The longest argument value accepted, in bytes.
pub(crate) const MAX_VALUE_BYTES: usize = 1024;

/// One `[[commands]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CommandConfig {
    /// What follows the `/`; the tool is `cmd_<name>`.
    pub(crate) name: String,
    /// Its line in `/help`, the menus and the tool's description.
    pub(crate) description: String,
    /// The program (an absolute path) and its arguments; `{arg}` is replaced by an argument.
    pub(crate) run: Vec<String>,
    /// The arguments, in the order they are typed.
    #[serde(default)]
    pub(crate) args: Vec<ArgConfig>,
    /// Who may run it.
    #[serde(default = "admins")]
    pub(crate) roles: Vec<CommandRole>,
    /// How long it may run, in seconds.
    #[serde(default = "default_timeout")]
    pub(crate) timeout_secs: u64,
    /// Whether the model is offered it as `cmd_<name>`.
    #[serde(default = "yes")]
    pub(crate) tool: bool,
    /// Where it runs; the thread's workspace when not set.
    #[serde(default)]
    pub(crate) cwd: Option<PathBuf>,
    /// Its whole environment.
    #[serde(default)]
    pub(crate) env: BTreeMap<String, Secret>,
}

/// One argument of a command.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ArgConfig {
    /// Its name in `run` (`{name}`), in the usage line and in the tool's parameters.
    pub(crate) name: String,
    /// What a value must match, as a whole.
    pub(crate) pattern: String,
    /// Whether it may be left out (only after the required ones).
    #[serde(default)]
    pub(crate) optional: bool,
}

/// Who may run a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum CommandRole {
    /// Operators.
    Admin,
    /// Everyone who may talk to the bot.
    User,
}

fn admins() -> Vec<CommandRole> {
    vec![CommandRole::Admin]
}

fn default_timeout() -> u64 {
    300
}

fn yes() -> bool {
    true
}

/// A command ready to run: its config with the patterns compiled.
#[derive(Debug)]
pub(crate) struct OperatorCommand {
    pub(crate) config: CommandConfig,
    /// Each argument's pattern, anchored.
    patterns: Vec<Regex>,
}

/// Why typed or called arguments do not fit a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ArgsError {
    #[error("a quote is not closed")]
    UnclosedQuote,
    #[error("too many arguments")]
    TooMany,
    #[error("`{0}` is missing")]
    Missing(String),
    #[error("`{name}` must match {pattern}")]
    NoMatch { name: String, pattern: String },
    #[error("`{0}` is not one of its arguments")]
    Unknown(String),
    #[error("`{0}` must be a string")]
    NotText(String),
}

impl OperatorCommand {
    /// The command, or the problem with one of its patterns.
    pub(crate) fn new(config: CommandConfig) -> Result<Self, (usize, regex::Error)> {
        let patterns = config
            .args
            .iter()
            .enumerate()
            .map(|(index, arg)| anchored(&arg.pattern).map_err(|e| (index, e)))
            .collect::<Result<_, _>>()?;
        Ok(Self { config, patterns })
    }

    /// `cmd_<name>`.
    pub(crate) fn tool_name(&self) -> String {
        format!("{TOOL_PREFIX}{}", self.config.name)
    }

    /// Whether someone of `role` may run it (operators always may).
    pub(crate) fn allows(&self, role: Role) -> bool {
        role == Role::Admin || self.config.roles.contains(&CommandRole::User)
    }

    /// `/deploy <service> [version]`.
    pub(crate) fn usage(&self) -> String {
        let mut text = format!("/{}", self.config.name);
        for arg in &self.config.args {
            if arg.optional {
                text.push_str(&format!(" [{}]", arg.name));
            } else {
                text.push_str(&format!(" <{}>", arg.name));
            }
        }
        text
    }

    /// The words typed after the command's name, checked: one value (or `None`, left out) per
    /// argument.
    pub(crate) fn parse_typed(&self, rest: &str) -> Result<Vec<Option<String>>, ArgsError> {
        let words = split_words(rest)?;
        if words.len() > self.config.args.len() {
            return Err(ArgsError::TooMany);
        }
        let mut values: Vec<Option<String>> = words.into_iter().map(Some).collect();
        values.resize(self.config.args.len(), None);
        self.check(values)
    }

    /// A tool call's arguments (an object of strings), checked like typed ones.
    pub(crate) fn parse_called(
        &self,
        arguments: &serde_json::Value,
    ) -> Result<Vec<Option<String>>, ArgsError> {
        let empty = serde_json::Map::new();
        let object = match arguments {
            serde_json::Value::Object(object) => object,
            serde_json::Value::Null => &empty,
            _ => return Err(ArgsError::NotText("arguments".to_owned())),
        };
        if let Some(name) = object
            .keys()
            .find(|name| !self.config.args.iter().any(|arg| &arg.name == *name))
        {
            return Err(ArgsError::Unknown(name.chars().take(64).collect()));
        }
        let values = self
            .config
            .args
            .iter()
            .map(|arg| match object.get(&arg.name) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::String(text)) => Ok(Some(text.clone())),
                Some(_) => Err(ArgsError::NotText(arg.name.clone())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.check(values)
    }

    /// Every value present matches its pattern, every required one is present.
    fn check(&self, values: Vec<Option<String>>) -> Result<Vec<Option<String>>, ArgsError> {
        for ((arg, pattern), value) in self.config.args.iter().zip(&self.patterns).zip(&values) {
            match value {
                None if !arg.optional => return Err(ArgsError::Missing(arg.name.clone())),
                Some(value)
                    if value.len() > MAX_VALUE_BYTES
                        || value.contains('\0')
                        || !pattern.is_match(value) =>
                {
                    return Err(ArgsError::NoMatch {
                        name: arg.name.clone(),
                        pattern: arg.pattern.clone(),
                    });
                }
                None | Some(_) => {}
            }
        }
        Ok(values)
    }

    /// The argv for checked `values`: each `{arg}` replaced by its value; an item naming an
    /// argument left out is dropped.
    pub(crate) fn argv(&self, values: &[Option<String>]) -> Vec<String> {
        let mut argv = Vec::with_capacity(self.config.run.len());
        'items: for item in &self.config.run {
            let mut out = String::new();
            let mut rest = item.as_str();
            while let Some((before, name, after)) = placeholder(rest) {
                out.push_str(before);
                let value = self
                    .config
                    .args
                    .iter()
                    .position(|arg| arg.name == name)
                    .and_then(|index| values.get(index).cloned().flatten());
                let Some(value) = value else {
                    continue 'items;
                };
                out.push_str(&value);
                rest = after;
            }
            out.push_str(rest);
            argv.push(out);
        }
        argv
    }
}

/// `pattern`, matched as a whole.
pub(crate) fn anchored(pattern: &str) -> Result<Regex, regex::Error> {
    regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
        .size_limit(1 << 20)
        .build()
}

/// The first `{name}` in `text` (a name of lowercase letters, digits and `_`): what comes
/// before it, the name, what comes after.
pub(crate) fn placeholder(text: &str) -> Option<(&str, &str, &str)> {
    let mut from = 0;
    while let Some(open) = text.get(from..)?.find('{').map(|i| i + from) {
        let after = text.get(open + 1..)?;
        if let Some(close) = after.find('}') {
            let name = after.get(..close)?;
            if !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            {
                return Some((text.get(..open)?, name, after.get(close + 1..)?));
            }
        }
        from = open + 1;
    }
    None
}

/// Words as a shell would split them, without its expansions: whitespace separates, `"…"`
/// and `'…'` group (inside double quotes `\"` and `\\` escape).
fn split_words(text: &str) -> Result<Vec<String>, ArgsError> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if let Some(done) = word.take() {
                    words.push(done);
                }
            }
            '\'' => {
                let current = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => current.push(c),
                        None => return Err(ArgsError::UnclosedQuote),
                    }
                }
            }
            '"' => {
                let current = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\')) => current.push(c),
                            Some(c) => {
                                current.push('\\');
                                current.push(c);
                            }
                            None => return Err(ArgsError::UnclosedQuote),
                        },
                        Some(c) => current.push(c),
                        None => return Err(ArgsError::UnclosedQuote),
                    }
                }
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    if let Some(done) = word {
        words.push(done);
    }
    Ok(words)
}

/// The configured commands and what runs them. Cloning shares them.
#[derive(Debug, Clone, Default)]
pub(crate) struct OperatorCommands {
    commands: Arc<[Arc<OperatorCommand>]>,
    /// `None` only when there are no commands.
    runner: Option<Arc<exec::Runner>>,
}

impl OperatorCommands {
    /// The commands of a validated config (an entry whose pattern does not compile, which
    /// validation refuses, is left out), audited under `data_root`, keeping at most
    /// `max_output_bytes` of a run's output.
    pub(crate) fn from_config(
        configs: &[CommandConfig],
        data_root: &Path,
        max_output_bytes: usize,
    ) -> Self {
        let commands: Arc<[Arc<OperatorCommand>]> = configs
            .iter()
            .filter_map(|config| OperatorCommand::new(config.clone()).ok())
            .map(Arc::new)
            .collect();
        for command in commands.iter() {
            let config = &command.config;
            if let Some(program) = config.run.first()
                && !Path::new(program).is_file()
            {
                tracing::warn!(
                    command = %config.name,
                    program = %program,
                    "an operator command's program is not there; running it fails until it is"
                );
            }
        }
        let runner = (!commands.is_empty())
            .then(|| Arc::new(exec::Runner::new(data_root, max_output_bytes)));
        Self { commands, runner }
    }

    /// What runs them (`None`: there are none).
    pub(crate) fn runner(&self) -> Option<&Arc<exec::Runner>> {
        self.runner.as_ref()
    }

    /// The tools of the commands offered to the model (`tool = true`).
    pub(crate) fn tools(&self) -> Vec<Arc<dyn crate::agent::tools::Tool>> {
        let Some(runner) = &self.runner else {
            return Vec::new();
        };
        self.iter()
            .filter(|command| command.config.tool)
            .map(|command| {
                Arc::new(tool::CommandTool::new(
                    Arc::clone(command),
                    Arc::clone(runner),
                )) as Arc<dyn crate::agent::tools::Tool>
            })
            .collect()
    }

    /// The command `/name` runs, if one has that name.
    pub(crate) fn find(&self, name: &str) -> Option<&Arc<OperatorCommand>> {
        self.commands
            .iter()
            .find(|command| command.config.name == name)
    }

    /// Every command, in the configured order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<OperatorCommand>> {
        self.commands.iter()
    }

    /// `help` (the built-in commands' list) with these commands' lines before its last line.
    pub(crate) fn help(&self, help: &str) -> String {
        if self.commands.is_empty() {
            return help.to_owned();
        }
        let (list, last) = help.rsplit_once('\n').unwrap_or((help, ""));
        let mut text = format!("{list}\n");
        for command in self.iter() {
            text.push_str(&format!(
                "{} — {}{}\n",
                command.usage(),
                command.config.description,
                if command.allows(Role::User) {
                    ""
                } else {
                    " (admins)"
                }
            ));
        }
        text.push_str(last);
        text
    }
}

/// `[agent.middleware.guardrail]` with the tools of commands only operators may run added to
/// `admin_only`, so the model of someone else is neither offered nor allowed them.
pub(crate) fn guardrail_config(
    base: &GuardrailConfig,
    configs: &[CommandConfig],
) -> GuardrailConfig {
    let mut config = base.clone();
    for command in configs {
        if !command.roles.contains(&CommandRole::User) {
            config
                .admin_only
                .push(format!("{TOOL_PREFIX}{}", command.name));
        }
    }
    config
}
