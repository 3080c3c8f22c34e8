// Which metrics the source writes: read by the catalogue's unit test (src/metrics_catalog)
// and by the end-to-end test of `/metrics` (tests/e2e/metrics.rs), so both judge the same
// list. No inner doc comment: the unit test includes this file with `#[path]`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The `.rs` files under `dir`, recursively.
fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// Every metric name written with `metrics::<kind>!("name"`, with its kind, in `src/` and
/// `channels/*/src`; a macro whose name is not a literal, or one used without the `metrics::`
/// path, is an error (the scan could not see it).
pub fn metrics_in_the_source() -> (BTreeMap<String, &'static str>, Vec<String>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    for entry in std::fs::read_dir(root.join("channels")).unwrap() {
        let src = entry.unwrap().path().join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
    }
    let catalogue = root.join("src/metrics_catalog.rs");
    let mut names = BTreeMap::new();
    let mut errors = Vec::new();
    for file in files.iter().filter(|f| **f != catalogue) {
        let text = std::fs::read_to_string(file).unwrap();
        for kind in ["counter", "gauge", "histogram"] {
            let call = format!("{kind}!(");
            for (at, _) in text.match_indices(&call) {
                let before = &text[..at];
                if before.ends_with("describe_") {
                    continue;
                }
                if !before.ends_with("metrics::") {
                    errors.push(format!("{}: `{call}` without `metrics::`", file.display()));
                    continue;
                }
                let rest = text[at + call.len()..].trim_start();
                let name = rest
                    .strip_prefix('"')
                    .and_then(|r| r.split_once('"'))
                    .map(|(name, _)| name.to_owned());
                match name {
                    Some(name) => match names.insert(name.clone(), kind) {
                        Some(other) if other != kind => {
                            errors.push(format!("{name} is both a {other} and a {kind}"));
                        }
                        _ => {}
                    },
                    None => errors.push(format!(
                        "{}: a `metrics::{call}` whose name is not a string literal",
                        file.display()
                    )),
                }
            }
        }
    }
    (names, errors)
}
