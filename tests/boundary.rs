//! The agent runtime knows nothing of HTTP, ingress, delivery or platforms (DESIGN.md section
//! 3), and channel crates never depend on the gateway. Cargo enforces the second; this test
//! enforces the first by reading the sources.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

const FORBIDDEN: &[&str] = &[
    "crate::http",
    "crate::ingress",
    "crate::delivery",
    "crate::app",
    "crate::events",
    "antler_telegram",
    "antler_slack",
    "antler_discord",
    "antler_feishu",
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
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            for needle in FORBIDDEN {
                if line.contains(needle) {
                    violations.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "boundary violations:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_channel_core_crate_does_not_depend_on_the_gateway() {
    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("channels/core/Cargo.toml"),
    )
    .unwrap();
    let dependencies = manifest.split("[dependencies]").nth(1).unwrap();
    assert!(!dependencies.contains("antler ") && !dependencies.contains("antler="));
    assert!(!dependencies.contains("path = \"../..\""));
}
