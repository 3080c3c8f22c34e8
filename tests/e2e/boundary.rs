//! The agent runtime knows nothing of HTTP, ingress, delivery or platforms
//! (docs/architecture.md, "Boundaries"). Channel crates never depend on the gateway: cargo
//! enforces that by itself, since the gateway depends on them and a cycle does not build.
//!
//! The agent is a module of the same crate, so the compiler does not stop it from reaching
//! into its neighbours. This test reads every path the agent's sources name (comments and
//! string literals removed): `crate::x`, grouped imports `crate::{x, y::z}`, and `super`
//! chains that climb out of the agent; each must stay inside the allowed top-level modules.

use std::path::{Path, PathBuf};

/// Top-level modules (and crate-root items) the agent may use. `beneath` (files opened beneath
/// a folder handle) and `sandbox` (the shell's isolation) are leaves: `beneath` uses nothing
/// else of the crate, `sandbox` only `beneath`.
const ALLOWED: &[&str] = &["agent", "beneath", "config", "memory", "now_ms", "sandbox"];
/// Crates the agent's production code must never name (its tests may serve a mock over axum).
/// The channel toolkit is among them: what a run hands out (`RunOutputs`, presented files) is
/// plain data, turned into outbound messages by the ingress.
const FORBIDDEN_CRATES: &[&str] = &[
    "antler_channel",
    "antler_telegram",
    "antler_slack",
    "antler_discord",
    "antler_feishu",
    "axum",
    "hyper",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without comments, string and char literals (replaced by spaces).
fn code_only(source: &str) -> String {
    let bytes: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let next = bytes.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < bytes.len() && bytes[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < bytes.len() {
                if bytes[i] == '/' && bytes.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if bytes[i] == '*' && bytes.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r' && (next == Some('"') || next == Some('#')) {
            // Raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while bytes.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if bytes.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match bytes.get(j) {
                    None => break,
                    Some('"') if (1..=hashes).all(|k| bytes.get(j + k) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    Some(_) => j += 1,
                }
            }
            i = j;
            out.push(' ');
        } else if c == '"' {
            i += 1;
            while i < bytes.len() && bytes[i] != '"' {
                if bytes[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push(' ');
        } else if c == '\'' && bytes.get(i + 2) == Some(&'\'') {
            i += 3;
            out.push(' ');
        } else if c == '\'' && next == Some('\\') {
            i += 2;
            while i < bytes.len() && bytes[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push(' ');
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn tokens(code: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut word = String::new();
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            if !word.is_empty() {
                tokens.push(std::mem::take(&mut word));
            }
            if c == ':' && chars.get(i + 1) == Some(&':') {
                tokens.push("::".to_owned());
                i += 1;
            } else if !c.is_whitespace() {
                tokens.push(c.to_string());
            }
        }
        i += 1;
    }
    if !word.is_empty() {
        tokens.push(word);
    }
    tokens
}

/// The top-level names reached from position `at` (just after `crate::`): one name, or the
/// first names of every branch of a `{...}` group.
fn first_segments(tokens: &[String], at: usize, out: &mut Vec<String>) {
    match tokens.get(at).map(String::as_str) {
        Some("{") => {
            let mut depth = 0;
            let mut expect_name = true;
            for token in &tokens[at..] {
                match token.as_str() {
                    "{" => {
                        depth += 1;
                        expect_name = depth == 1;
                    }
                    "}" => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    "," if depth == 1 => expect_name = true,
                    name if expect_name && depth == 1 => {
                        out.push(name.to_owned());
                        expect_name = false;
                    }
                    _ => {}
                }
            }
        }
        Some(name) => out.push(name.to_owned()),
        None => {}
    }
}

/// Every top-level module a file of the agent reaches, and the forbidden crates its
/// production code names. `depth` is how many `super`s climb from the file's module to the
/// crate root.
fn reached(source: &str, depth: usize) -> Vec<String> {
    let tokens = tokens(&code_only(source));
    let test_module = ["#", "[", "cfg", "(", "test", ")", "]", "mod", "tests"];
    let production_tokens = tokens
        .windows(test_module.len())
        .position(|w| w.iter().zip(test_module).all(|(a, b)| a == b))
        .unwrap_or(tokens.len());
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] == "crate" && tokens.get(i + 1).map(String::as_str) == Some("::") {
            first_segments(&tokens, i + 2, &mut out);
        }
        if tokens[i] == "super" && (i < 2 || tokens[i - 1] != "::" || tokens[i - 2] != "super") {
            // The start of a `super::super::...` chain: count it.
            let mut supers = 0;
            let mut j = i;
            while tokens.get(j).map(String::as_str) == Some("super") {
                supers += 1;
                if tokens.get(j + 1).map(String::as_str) != Some("::") {
                    break;
                }
                j += 2;
            }
            if supers >= depth {
                first_segments(&tokens, j, &mut out);
            }
        }
        if i < production_tokens && FORBIDDEN_CRATES.contains(&tokens[i].as_str()) {
            out.push(tokens[i].clone());
        }
        i += 1;
    }
    out
}

#[test]
fn the_checker_sees_grouped_imports_super_chains_and_ignores_comments() {
    let source = r#"
        use crate::{agent::message, http, ingress::Ingress};
        use super::super::delivery::Delivery;
        // use crate::events::EventHub;
        const S: &str = "crate::app";
        fn f() { crate::now_ms(); axum::serve(); }
        #[cfg(test)]
        mod tests { fn mock() { axum::serve(); } }
    "#;
    let found = reached(source, 2);
    assert_eq!(
        found,
        ["agent", "http", "ingress", "delivery", "now_ms", "axum"],
        "axum only once: in production code"
    );
    assert!(
        reached("use super::thread;", 2).is_empty(),
        "stays in the agent"
    );
}

#[test]
fn the_agent_runtime_imports_no_gateway_or_platform_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/agent");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(
        files.len() > 5,
        "found only {} files under {}",
        files.len(),
        root.display()
    );
    let mut violations = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&root).unwrap();
        // src/agent/mod.rs is `agent` (1 super to the root); src/agent/x.rs and
        // src/agent/x/mod.rs are `agent::x` (2); one more per further directory.
        let components = relative.components().count();
        let is_mod = relative.file_name().is_some_and(|n| n == "mod.rs");
        let depth = components + usize::from(!is_mod);
        let mut source = std::fs::read_to_string(file).unwrap();
        if relative.file_name().is_some_and(|n| n == "tests.rs") {
            // A test module in its own file: only module paths count.
            source.insert_str(0, "#[cfg(test)] mod tests {}\n");
        }
        for name in reached(&source, depth) {
            if !ALLOWED.contains(&name.as_str()) {
                violations.push(format!("{}: reaches `{name}`", file.display()));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "boundary violations:\n{}",
        violations.join("\n")
    );
}
