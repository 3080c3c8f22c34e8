//! The declaration against what it describes: the structs, validation, the example file and the
//! README's key table.

use std::collections::{BTreeMap, BTreeSet};

use super::{Absent, SETTINGS, Setting, is_declared};
use crate::config::Config;

const EXAMPLE: &str = include_str!("../../../config/antler.example.toml");
const LOCAL: &str = include_str!("../../../config/antler.toml");
const README: &str = include_str!("../../../README.md");
const VALIDATE: &str = include_str!("../validate.rs");

fn declared_setting(key: &str) -> &'static Setting {
    SETTINGS
        .iter()
        .find(|setting| setting.key == key)
        .unwrap_or_else(|| panic!("{key} is not declared"))
}

/// A TOML value written as text (a declared default).
fn toml_value(text: &str) -> toml::Value {
    let mut table: toml::Table = toml::from_str(&format!("v = {text}"))
        .unwrap_or_else(|err| panic!("not a TOML value: {text}: {err}"));
    table.remove("v").unwrap()
}

/// Whether a key sits in an entry of a table array or a table of named tables.
fn in_entry(key: &str) -> bool {
    key.contains("[]") || key.contains("<name>")
}

/// The top-level tables the declaration has (`server`, `store`, ..., `schedules`).
fn sections() -> BTreeSet<&'static str> {
    SETTINGS
        .iter()
        .map(|setting| setting.key.split(['.', '[']).next().unwrap())
        .collect()
}

/// A document holding `value` at the plain dotted `key`.
fn document(key: &str, value: toml::Value) -> toml::Table {
    let mut root = toml::Table::new();
    let mut table = &mut root;
    let parts: Vec<&str> = key.split('.').collect();
    let (last, parents) = parts.split_last().unwrap();
    for part in parents {
        table = table
            .entry(*part)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .unwrap();
    }
    table.insert((*last).to_owned(), value);
    root
}

fn config_of(table: toml::Table) -> Result<Config, String> {
    toml::Value::Table(table)
        .try_into::<Config>()
        .map_err(|err| err.to_string())
}

#[test]
fn keys_are_unique_and_well_formed() {
    let shape = regex::Regex::new(r"^[a-z_]+(\.[a-z_]+|\[\]|\.<name>)*\.[a-z_]+$").unwrap();
    let mut seen = BTreeSet::new();
    for setting in SETTINGS {
        assert!(
            seen.insert(setting.key),
            "{} is declared twice",
            setting.key
        );
        // A top-level table array (`[[commands]]`) is a section of its own.
        let top_level_tables = setting.default == Absent::Tables && !setting.key.contains('.');
        assert!(
            shape.is_match(setting.key) || top_level_tables,
            "{} is not a dotted key",
            setting.key
        );
        assert!(!setting.doc.is_empty(), "{} has no doc", setting.key);
        assert!(is_declared(setting.key));
        if let Absent::Value(text) = setting.default {
            toml_value(text);
        }
        // An entry's key follows its table array or table of tables; only entries have
        // required keys.
        if let Some((collection, _)) = setting
            .key
            .split_once("[]")
            .or_else(|| setting.key.split_once(".<name>"))
        {
            assert_eq!(
                declared_setting(collection).default,
                Absent::Tables,
                "{}: `{collection}` is not declared as tables",
                setting.key
            );
        } else {
            assert_ne!(setting.default, Absent::Required, "{}", setting.key);
        }
        if setting.default == Absent::Tables {
            assert!(
                SETTINGS
                    .iter()
                    .any(|entry| entry.key.starts_with(setting.key) && in_entry(entry.key)),
                "{} declares no key of its entries",
                setting.key
            );
        }
    }
    assert!(!is_declared("server.no_such_key"));
}

#[test]
fn declared_defaults_are_what_the_structs_produce() {
    let defaults = Config::default();
    assert_eq!(
        config_of(toml::Table::new()).unwrap(),
        defaults,
        "an empty file is the defaults"
    );
    let example = uncommented(EXAMPLE);
    for setting in SETTINGS {
        let Absent::Value(text) = setting.default else {
            continue;
        };
        let value = toml_value(text);
        if !in_entry(setting.key) {
            // Writing a key at its declared default must change nothing.
            let config = config_of(document(setting.key, value))
                .unwrap_or_else(|err| panic!("{}: {err}", setting.key));
            assert!(
                config == defaults,
                "{}: the declared default {text} is not the structs' default",
                setting.key
            );
            continue;
        }
        // In an entry: the example's first entry, without the key and with the key at its
        // declared default, must be the same.
        let (head, field) = setting.key.rsplit_once('.').unwrap();
        let (collection, named) = match head.strip_suffix("[]") {
            Some(collection) => (collection, false),
            None => (head.strip_suffix(".<name>").unwrap(), true),
        };
        let found = lookup(&example, collection)
            .unwrap_or_else(|| panic!("{}: the example has no {collection}", setting.key));
        let mut entry = if named {
            found.as_table().unwrap().values().next().cloned()
        } else {
            found.as_array().unwrap().first().cloned()
        }
        .unwrap_or_else(|| panic!("{}: the example has no entry", setting.key));
        let entry = entry.as_table_mut().unwrap();
        entry.remove(field);
        let wrap = |entry: toml::Table| {
            let value = if named {
                toml::Value::Table(toml::Table::from_iter([("probe".to_owned(), entry.into())]))
            } else {
                toml::Value::Array(vec![entry.into()])
            };
            config_of(document(collection, value)).unwrap()
        };
        let without = wrap(entry.clone());
        entry.insert(field.to_owned(), value);
        assert!(
            wrap(entry.clone()) == without,
            "{}: the declared default {text} is not the structs' default",
            setting.key
        );
    }
}

/// The value at a plain dotted key.
fn lookup<'a>(table: &'a toml::Table, key: &str) -> Option<&'a toml::Value> {
    let (first, rest) = key.split_once('.').unwrap_or((key, ""));
    let value = table.get(first)?;
    if rest.is_empty() {
        Some(value)
    } else {
        lookup(value.as_table()?, rest)
    }
}

/// serde names every field a struct takes when it meets one it does not: every table the
/// declaration describes must take exactly the keys declared in it.
#[test]
fn the_structs_take_exactly_the_declared_keys() {
    // Each table (by pattern) and the names declared directly in it.
    let mut tables: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for setting in SETTINGS {
        let parts = pattern_parts(setting.key);
        for end in 0..parts.len() {
            let table = parts[..end].concat();
            let name = parts[end].trim_start_matches('.');
            if name == "[]" || name == "<name>" {
                continue;
            }
            tables.entry(table).or_default().insert(name.to_owned());
        }
    }
    assert!(tables.len() > 30, "{tables:?}");
    for (table, declared) in &tables {
        let document = probe(table);
        let err = config_of(document).expect_err(table);
        let expected = err
            .lines()
            .find_map(|line| line.split_once("expected "))
            .map(|(_, names)| names)
            .unwrap_or_else(|| panic!("{table}: {err}"));
        let accepted: BTreeSet<String> = expected
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        assert_eq!(
            &accepted, declared,
            "the table `{table}` takes other keys than declared"
        );
    }
}

/// `mcp.servers[].name` as `mcp`, `.servers`, `[]`, `.name`.
fn pattern_parts(key: &str) -> Vec<String> {
    let mut parts = Vec::new();
    for (index, part) in key.split('.').enumerate() {
        let dot = if index == 0 { "" } else { "." };
        match part.strip_suffix("[]") {
            Some(name) => {
                parts.push(format!("{dot}{name}"));
                parts.push("[]".to_owned());
            }
            None => parts.push(format!("{dot}{part}")),
        }
    }
    parts
}

/// A document with an unknown key in the table `pattern` (`""` is the root).
fn probe(pattern: &str) -> toml::Table {
    let unknown = toml::Table::from_iter([("zz_probe".to_owned(), toml::Value::Integer(0))]);
    let mut value = toml::Value::Table(unknown);
    let mut parts = pattern_parts(pattern);
    parts.retain(|part| !part.is_empty());
    while let Some(part) = parts.pop() {
        value = match part.as_str() {
            "[]" => toml::Value::Array(vec![value]),
            ".<name>" => toml::Value::Table(toml::Table::from_iter([("probe".to_owned(), value)])),
            name => toml::Value::Table(toml::Table::from_iter([(
                name.trim_start_matches('.').to_owned(),
                value,
            )])),
        };
    }
    match value {
        toml::Value::Table(table) => table,
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The example file
// ---------------------------------------------------------------------------------------------

/// A config file with its commented-out TOML switched on: comment lines that are a table
/// header (`# [[mcp.servers]]`) or a `key = value` line. Prose comments stay comments.
fn uncommented(file: &str) -> toml::Table {
    let code =
        regex::Regex::new(r"^# ?((\[\[?[A-Za-z0-9_.<>-]+\]\]?)|([A-Za-z0-9_]+ = .*))$").unwrap();
    let text: String = file
        .lines()
        .map(|line| match code.captures(line) {
            Some(found) => format!("{}\n", &found[1]),
            None => format!("{line}\n"),
        })
        .collect();
    toml::from_str(&text).unwrap_or_else(|err| panic!("the file, uncommented: {err}"))
}

/// Every key a document writes, by declared pattern (`mcp.servers[].name`), with the first value
/// written for it. Keys the declaration does not know are listed as written.
fn written_keys(table: &toml::Table) -> BTreeMap<String, toml::Value> {
    let mut out = BTreeMap::new();
    walk(table, "", &mut out);
    out
}

fn walk(table: &toml::Table, prefix: &str, out: &mut BTreeMap<String, toml::Value>) {
    for (name, value) in table {
        let key = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        let declared = SETTINGS.iter().find(|setting| setting.key == key);
        match (declared.map(|setting| setting.default), value) {
            (Some(Absent::Tables), toml::Value::Array(entries)) => {
                out.entry(key.clone()).or_insert_with(|| value.clone());
                for entry in entries {
                    walk(entry.as_table().unwrap(), &format!("{key}[]"), out);
                }
            }
            (Some(Absent::Tables), toml::Value::Table(named)) => {
                out.entry(key.clone()).or_insert_with(|| value.clone());
                for entry in named.values() {
                    walk(entry.as_table().unwrap(), &format!("{key}.<name>"), out);
                }
            }
            (Some(_), _) => {
                out.entry(key).or_insert_with(|| value.clone());
            }
            (None, toml::Value::Table(inner)) => walk(inner, &key, out),
            (None, _) => {
                out.entry(key).or_insert_with(|| value.clone());
            }
        }
    }
}

/// The rule: every declared key is in the example, and nothing else. A key with a default is
/// written live, at its default, except in the entries of table arrays and named tables, which
/// are illustrations and may be commented out with any value. A key without a default (an
/// optional or required one) may be commented out, or written with an example value.
#[test]
fn the_example_shows_every_declared_key_and_no_other() {
    let written = written_keys(&uncommented(EXAMPLE));
    let live = written_keys(&toml::from_str(EXAMPLE).unwrap());
    let mut problems = Vec::new();
    for key in written.keys() {
        if !is_declared(key) {
            problems.push(format!("the example writes `{key}`, which is not declared"));
        }
    }
    for setting in SETTINGS {
        if !written.contains_key(setting.key) {
            problems.push(format!("the example does not show `{}`", setting.key));
        }
        let Absent::Value(text) = setting.default else {
            continue;
        };
        if in_entry(setting.key) {
            continue;
        }
        match live.get(setting.key) {
            None => problems.push(format!(
                "the example comments `{}` out; a key with a default is written at it",
                setting.key
            )),
            Some(shown) if *shown != toml_value(text) => problems.push(format!(
                "the example writes `{}` = {shown}, not its default {text}",
                setting.key
            )),
            Some(_) => {}
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The local default config names declared keys only, commented-out ones included.
#[test]
fn the_local_config_names_declared_keys_only() {
    for key in written_keys(&uncommented(LOCAL)).keys() {
        assert!(
            is_declared(key),
            "config/antler.toml writes `{key}`, which is not declared"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The README's key table
// ---------------------------------------------------------------------------------------------

/// Words the README's key table puts in backticks that are not keys: tool and subagent type
/// names, commands, processes, values and placeholders. (Middleware are also named by their
/// `agent.middleware.*` tables anywhere in the table.)
const NOT_KEYS: &[&str] = &[
    "ask_clarification",
    "bash",
    "current_time",
    "data",
    "dd",
    "doctor",
    "false",
    "host",
    "ls",
    "mcp",
    "memory",
    "mkfs",
    "present_files",
    "read_file",
    "reboot",
    "setsid",
    "shutdown",
    "str_replace",
    "stream_options",
    "sudo",
    "task",
    "tool_search",
    "web_fetch",
    "write_file",
    "write_todos",
];

/// One row of the table: the tables it is about and its text.
struct Row {
    /// `server`, `agent.middleware` (with `wildcard`), `channels.telegram`, ...
    prefixes: Vec<String>,
    /// The section is `[x.*]`: a row about each table in `x`.
    wildcard: bool,
    text: String,
}

/// `a | b \| c | d` as `a`, `b \| c`, `d`.
fn cells(line: &str) -> Vec<String> {
    let mut cells = vec![String::new()];
    let mut escaped = false;
    for c in line.trim().trim_matches('|').chars() {
        match c {
            '|' if !escaped => cells.push(String::new()),
            _ => cells.last_mut().unwrap().push(c),
        }
        escaped = c == '\\';
    }
    cells
}

fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

fn readme_rows() -> Vec<Row> {
    let lines = README
        .lines()
        .skip_while(|line| !line.starts_with("| section | keys (defaults) |"))
        .skip(2);
    let mut rows = Vec::new();
    for line in lines.take_while(|line| line.starts_with('|')) {
        let cells = cells(line);
        assert_eq!(cells.len(), 2, "{line}");
        let section = backticked(&cells[0]).concat().replace("\\|", "|");
        let section = section.trim_matches(['[', ']']);
        let (section, wildcard) = match section.strip_suffix(".*") {
            Some(section) => (section, true),
            None => (section, false),
        };
        let prefixes = match section.rsplit_once('.') {
            Some((base, alternatives)) if alternatives.contains('|') => alternatives
                .split('|')
                .map(|name| format!("{base}.{name}"))
                .collect(),
            _ => vec![section.to_owned()],
        };
        rows.push(Row {
            prefixes,
            wildcard,
            text: cells[1].clone(),
        });
    }
    assert!(rows.len() > 10, "the README's key table was not found");
    rows
}

/// A key as the README writes paths: without `[]`.
fn plain(key: &str) -> String {
    key.replace("[]", "")
}

/// Whether `key` (plain) lies in the table `prefix`.
fn under(key: &str, prefix: &str) -> bool {
    key.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// The key paths the table writes out (`model.context_tokens`, `[[memory.identities]]`),
/// with every table that holds them.
fn readme_paths() -> BTreeSet<String> {
    let sections = sections();
    let mut paths = BTreeSet::new();
    for row in readme_rows() {
        for token in backticked(&row.text) {
            let path = token.trim_matches(['[', ']']);
            let is_path = path.contains('.')
                && path.split('.').all(|part| {
                    part == "<name>"
                        || (!part.is_empty()
                            && part.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
                })
                && sections.contains(path.split('.').next().unwrap_or_default());
            if is_path {
                let mut path = path;
                paths.insert(path.to_owned());
                while let Some((parent, _)) = path.rsplit_once('.') {
                    paths.insert(parent.to_owned());
                    path = parent;
                }
            }
        }
    }
    paths
}

#[test]
fn the_readme_names_every_declared_key() {
    let rows = readme_rows();
    let paths = readme_paths();
    let mut problems = Vec::new();
    for setting in SETTINGS {
        let key = plain(setting.key);
        let (row, prefix) = rows
            .iter()
            .flat_map(|row| row.prefixes.iter().map(move |prefix| (row, prefix)))
            .filter(|(_, prefix)| under(&key, prefix))
            .max_by_key(|(_, prefix)| prefix.len())
            .unwrap_or_else(|| panic!("no row of the README's key table is about `{key}`"));
        let words = backticked(&row.text);
        let last = key.rsplit('.').next().unwrap();
        if !(key == *prefix || words.contains(&last) || paths.contains(&key)) {
            problems.push(format!(
                "the README's row for `{prefix}` does not name `{last}` (`{key}`)"
            ));
        }
        if row.wildcard && key != *prefix {
            let rest = &key[prefix.len() + 1..];
            let table = rest.split('.').next().unwrap();
            if !words.contains(&table) {
                problems.push(format!(
                    "the README's row for `{prefix}.*` does not name `{table}` (`{key}`)"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_readme_names_no_undeclared_key() {
    let mut problems = Vec::new();
    for path in readme_paths() {
        if find(&path).is_none() {
            problems.push(format!(
                "the README's key table names `{path}`, which is not declared"
            ));
        }
    }
    let identifier = regex::Regex::new(r"^[a-z][a-z0-9_]*$").unwrap();
    let middleware: BTreeSet<&str> = SETTINGS
        .iter()
        .filter_map(|setting| setting.key.strip_prefix("agent.middleware."))
        .filter_map(|rest| rest.split('.').next())
        .collect();
    for row in readme_rows() {
        // Every name a key under this row's tables has.
        let names: BTreeSet<String> = SETTINGS
            .iter()
            .map(|setting| plain(setting.key))
            .filter_map(|key| {
                row.prefixes
                    .iter()
                    .find(|prefix| under(&key, prefix))
                    .map(|prefix| key[prefix.len()..].to_owned())
            })
            .flat_map(|rest| {
                rest.split('.')
                    .filter(|part| !part.is_empty())
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect();
        for word in backticked(&row.text) {
            let known =
                names.contains(word) || middleware.contains(word) || NOT_KEYS.contains(&word);
            if identifier.is_match(word) && !known {
                problems.push(format!(
                    "the README's row for `{}` names `{word}`, which no key under it has",
                    row.prefixes.join("|")
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Concrete keys
// ---------------------------------------------------------------------------------------------

/// How a concrete key (as an error names it) relates to the declaration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// It is this setting (`mcp.servers[3].name` is `mcp.servers[].name`).
    Setting(&'static Setting),
    /// It is an element or an entry of this array- or table-valued setting
    /// (`server.allowed_hosts[1]`, `agent.tool_timeouts.bash`).
    Within(&'static Setting),
    /// It is a table that holds settings (`server`, `subagents.types.bash`, `mcp.servers[0]`).
    Table,
}

/// Where a concrete key is in the declaration; `None` when it is nowhere.
fn find(key: &str) -> Option<Found> {
    let concrete = segments(key);
    let mut table = false;
    for setting in SETTINGS {
        let pattern = segments(setting.key);
        let common = pattern.len().min(concrete.len());
        if !pattern[..common]
            .iter()
            .zip(&concrete[..common])
            .all(|(pattern, concrete)| segment_matches(pattern, concrete))
        {
            continue;
        }
        if pattern.len() == concrete.len() {
            return Some(Found::Setting(setting));
        }
        if pattern.len() < concrete.len() {
            if let Absent::Value(value) = setting.default
                && (value.starts_with('[') || value.starts_with('{'))
            {
                return Some(Found::Within(setting));
            }
            if setting.default == Absent::Tables && concrete.len() == pattern.len() + 1 {
                table = true;
            }
        } else {
            table = true;
        }
    }
    table.then_some(Found::Table)
}

/// The steps of a dotted key: `mcp.servers[2].name` is `mcp`, `servers`, `[2]`, `name`.
fn segments(key: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for part in key.split('.') {
        match part.find('[') {
            Some(start) => {
                if start > 0 {
                    out.push(&part[..start]);
                }
                out.extend(part[start..].split_inclusive(']'));
            }
            None => out.push(part),
        }
    }
    out
}

fn segment_matches(pattern: &str, concrete: &str) -> bool {
    match pattern {
        "[]" => {
            concrete.len() > 2
                && concrete.starts_with('[')
                && concrete.ends_with(']')
                && concrete[1..concrete.len() - 1]
                    .bytes()
                    .all(|b| b.is_ascii_digit())
        }
        "<name>" => !concrete.starts_with('['),
        _ => pattern == concrete,
    }
}

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

/// Configurations that break most rules, each rule once at least.
const BROKEN: &[&str] = &[
    r#"
    [[schedules]]
    name = "Bad Name"
    cron = "0 9 * *"
    timezone = "Mars/Olympus"
    conversation = "slack:T1:C1"
    prompt = "/new"
    [[schedules]]
    name = "ok"
    cron = "0 9 * * *"
    every = "15m"
    conversation = "nowhere"
    prompt = ""
    [[schedules]]
    name = "ok"
    every = "10s"
    conversation = "api:ops"
    prompt = "hi"
    "#,
    r#"
    [server]
    listen = "0.0.0.0:8080"
    public_url = "ftp://bot"
    body_limit_bytes = 0
    max_connections = 0
    header_read_timeout_secs = 0
    body_read_timeout_secs = 0
    max_streams = 0
    allowed_hosts = ["http://x", ""]
    metrics_token = "short"
    ops_listen = "0.0.0.0:8080"
    [store]
    path = ""
    dedupe_ttl_secs = 0
    cache_capacity_bytes = 1
    [model]
    base_url = "nope"
    model = " "
    connect_timeout_secs = 0
    first_byte_timeout_secs = 0
    idle_timeout_secs = 0
    request_timeout_secs = 0
    temperature = 3.0
    max_tokens = 0
    context_tokens = 10
    [agent]
    max_iterations = 0
    max_concurrent_turns = 0
    backlog = 0
    turn_timeout_secs = 0
    max_turn_attempts = 0
    max_parallel_tools = 0
    tool_timeout_secs = 0
    tool_timeouts = { bash = 0 }
    max_attachment_bytes = 0
    [agent.middleware.sandbox_audit]
    tools = []
    max_command_chars = 0
    block = [{ name = "bad name!", pattern = "(" }]
    warn = [{ name = "ok", pattern = "(" }]
    [agent.middleware.tool_output_budget]
    quota_mb = 0
    [agent.middleware.title]
    max_words = 0
    max_chars = 0
    [agent.middleware.summarization]
    trigger_tokens = 0
    keep_messages = 0
    trim_tokens_to_summarize = 0
    [agent.middleware.view_image]
    max_images = 0
    max_image_bytes = 0
    [agent.middleware.subagent_limit]
    max_per_response = 0
    max_per_run = 0
    tool_name = " "
    [agent.middleware.deferred_tools]
    max_tools = 0
    [agent.middleware.loop_detection]
    warn_threshold = 3
    hard_limit = 2
    window = 1
    max_threads = 0
    [agent.tools.bash]
    max_output_bytes = 0
    [agent.tools.web_fetch]
    max_bytes = 0
    timeout_secs = 0
    [delivery]
    max_attempts = 0
    backoff_base_ms = 0
    backoff_max_secs = 0
    [channels.api]
    token = "short"
    allowed_users = ["", "bad user!", "a", "a"]
    admins = ["bad user!"]
    [[channels.api.tokens]]
    token = "short"
    user = "bad user!"
    [[channels.api.tokens]]
    token = ""
    user = "a"
    [[channels.api.tokens]]
    token = "short"
    user = "a"
    [channels.telegram]
    enabled = true
    bot_token = "nope"
    webhook_secret = "bad secret!"
    api_url = "nope"
    allowed_users = ["", "\u0007", "1", "1"]
    [channels.slack]
    enabled = true
    bot_token = "nope"
    api_url = "nope"
    team_id = "nope"
    command = "antler"
    allowed_bots = ["nope"]
    [channels.discord]
    enabled = true
    public_key = "nope"
    application_id = "nope"
    allowed_guilds = ["nope"]
    api_url = "nope"
    [channels.feishu]
    enabled = true
    app_id = "nope"
    api_url = "nope"
    [[mcp.servers]]
    name = "bad name!"
    command = "x"
    url = "https://mcp"
    timeout_secs = 0
    connect_timeout_secs = 0
    [[mcp.servers]]
    name = "b"
    [[mcp.servers]]
    name = "c"
    command = " "
    headers = { "X" = "y" }
    env = { "A=B" = "c" }
    [[mcp.servers]]
    name = "c"
    url = "nope"
    args = ["x"]
    headers = { "bad header" = "y", "X-Ok" = "bad\nvalue" }
    [memory]
    debounce_seconds = 99999
    max_facts = 0
    fact_confidence_threshold = 2.0
    max_injection_tokens = 0
    shutdown_flush_secs = 0
    [[memory.identities]]
    name = "bad name!"
    ids = []
    [[memory.identities]]
    name = "ada"
    ids = ["nope", "api:ada", "api:ada"]
    [[memory.identities]]
    name = "ada"
    ids = ["api:ada"]
    [subagents]
    max_concurrent = 0
    timeout_seconds = 0
    [subagents.types.Bad]
    description = " "
    system_prompt = " "
    model = " "
    tools = []
    max_turns = 0
    timeout_seconds = 0
    [subagents.types.custom]
    "#,
    r#"
    [model]
    context_tokens = 2000
    [agent.middleware.summarization]
    trigger_tokens = 4000
    [channels.api]
    admins = ["ada"]
    "#,
];

/// Every key a validation issue names, and every key its text names, is declared.
#[test]
fn validation_names_declared_keys_only() {
    let sections = sections().into_iter().collect::<Vec<_>>().join("|");
    let mentioned =
        regex::Regex::new(&format!(r"\b(({sections})\.[a-z_]+(\.[a-z_]+|\[\d+\])*)")).unwrap();
    let mut named = BTreeSet::new();
    for text in BROKEN {
        let err = Config::from_toml_str(text, &|_| None).unwrap_err();
        assert!(err.issues().len() > 1, "{err}");
        for issue in err.issues() {
            assert!(
                find(&issue.key).is_some(),
                "validation names `{}`, which is not declared ({issue})",
                issue.key
            );
            named.insert(issue.key.clone());
            for found in mentioned.captures_iter(&issue.problem) {
                assert!(
                    find(&found[1]).is_some(),
                    "the issue {issue} names `{}`, which is not declared",
                    &found[1]
                );
            }
        }
    }
    // The configurations above reach most rules.
    assert!(named.len() > 100, "{}: {named:?}", named.len());
}

/// validate.rs writes no key as a plain string: every one goes through `key!`, which the
/// build checks against the declaration.
#[test]
fn validation_writes_keys_only_through_the_declaration() {
    let sections = sections().into_iter().collect::<Vec<_>>().join("|");
    let literal = regex::Regex::new(r#"(?s)(key!\()?"((?:[^"\\]|\\.)*)""#).unwrap();
    let mentioned = regex::Regex::new(&format!(r"\b({sections})\.[a-z_]")).unwrap();
    let mut through_macro = 0;
    for found in literal.captures_iter(VALIDATE) {
        if found.get(1).is_some() {
            through_macro += 1;
            assert!(
                is_declared(&found[2]),
                "key!({:?}) is not declared",
                &found[2]
            );
        } else {
            assert!(
                !mentioned.is_match(&found[2]),
                "validate.rs names a key in {:?} without key!",
                &found[2]
            );
        }
    }
    assert!(through_macro > 100, "{through_macro}");
}

#[test]
fn find_places_concrete_keys() {
    assert_eq!(
        find("server.listen"),
        Some(Found::Setting(declared_setting("server.listen")))
    );
    assert_eq!(
        find("mcp.servers[3].name"),
        Some(Found::Setting(declared_setting("mcp.servers[].name")))
    );
    assert_eq!(
        find("subagents.types.bash.max_turns"),
        Some(Found::Setting(declared_setting(
            "subagents.types.<name>.max_turns"
        )))
    );
    assert_eq!(
        find("server.allowed_hosts[1]"),
        Some(Found::Within(declared_setting("server.allowed_hosts")))
    );
    assert_eq!(
        find("agent.tool_timeouts.bash"),
        Some(Found::Within(declared_setting("agent.tool_timeouts")))
    );
    assert_eq!(
        find("mcp.servers[0].headers.X-Team"),
        Some(Found::Within(declared_setting("mcp.servers[].headers")))
    );
    assert_eq!(find("server"), Some(Found::Table));
    assert_eq!(find("mcp.servers[0]"), Some(Found::Table));
    assert_eq!(find("subagents.types.bash"), Some(Found::Table));
    assert_eq!(find("server.listen.port"), None);
    assert_eq!(find("server.nope"), None);
    assert_eq!(find("mcp.servers[x].name"), None);
    assert_eq!(find("subagents.types.bash.nope"), None);
}
