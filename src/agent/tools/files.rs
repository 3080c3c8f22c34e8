//! File tools: `ls`, `read_file`, `write_file` and `str_replace`, on the thread's folders as
//! the model sees them (`/mnt/user-data/{workspace,uploads,outputs}`).
//!
//! Every path the model writes goes through [`ThreadFolders::resolve`]: `..`, host paths and
//! symlinks leading out are refused, and uploads are read-only. Every message back names
//! virtual paths only. Sizes are bounded ([`MAX_LS_ENTRIES`], [`MAX_READ_BYTES`],
//! [`MAX_WRITE_BYTES`]) so one call can neither flood the model's context nor fill the disk,
//! and the blocking file I/O runs on tokio's blocking pool.
//!
//! Unlike DeerFlow's `read_file`, a read that is cut says exactly where it stopped and which
//! `start_line` reads on; `str_replace` says how many matches it found when it is not one.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;

use super::paths::{Area, PathAccess, VIRTUAL_ROOT};
use super::{Tool, ToolContext, ToolError, parse_arguments};
use crate::agent::input::ThreadFolders;
use crate::agent::model::ToolSpec;

/// The names of the file tools.
pub(crate) const FILE_TOOL_NAMES: [&str; 4] = ["ls", "read_file", "write_file", "str_replace"];

/// `ls` lists at most this many entries of a folder.
pub(crate) const MAX_LS_ENTRIES: usize = 200;
/// `read_file` returns at most this many bytes of text.
pub(crate) const MAX_READ_BYTES: usize = 256 * 1024;
/// `read_file` scans at most this many bytes of a file to find a line range.
const MAX_SCAN_BYTES: u64 = 64 * 1024 * 1024;
/// `write_file` writes, and `str_replace` edits, files of at most this many bytes.
pub(crate) const MAX_WRITE_BYTES: usize = 1024 * 1024;

/// The four file tools.
pub(crate) fn file_tools() -> [Arc<dyn Tool>; 4] {
    [
        Arc::new(Ls),
        Arc::new(ReadFile),
        Arc::new(WriteFile),
        Arc::new(StrReplace),
    ]
}

/// `ls`: a folder's entries with their sizes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ls;

/// `read_file`: a UTF-8 text file, or a range of its lines.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadFile;

/// `write_file`: creates or overwrites a file in the workspace or outputs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriteFile;

/// `str_replace`: replaces exactly one occurrence of a text in a file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StrReplace;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LsArguments {
    #[serde(default)]
    path: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArguments {
    path: String,
    #[serde(default)]
    start_line: Option<usize>,
    #[serde(default)]
    end_line: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArguments {
    path: String,
    content: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplaceArguments {
    path: String,
    #[serde(alias = "old_str")]
    old: String,
    #[serde(alias = "new_str")]
    new: String,
}

fn path_property(what: &str) -> serde_json::Value {
    json!({
        "type": "string",
        "description": format!(
            "{what}, e.g. /mnt/user-data/workspace/notes.md (a relative path is taken under \
             /mnt/user-data/workspace)"
        )
    })
}

/// The virtual path of a host path inside the thread's folders.
fn shown(folders: &ThreadFolders, host: &Path) -> String {
    folders.to_virtual(&host.display().to_string())
}

/// Runs blocking file work on the blocking pool.
async fn blocking<T, F>(work: F) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ToolError> + Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ToolError::Failed(format!("the file operation did not finish: {e}")))?
}

/// The model-facing text of an I/O error on `virtual_path`.
fn io_error(virtual_path: &str, error: &std::io::Error) -> ToolError {
    let text = match error.kind() {
        std::io::ErrorKind::NotFound => format!("{virtual_path} does not exist"),
        std::io::ErrorKind::PermissionDenied => format!("{virtual_path} is not accessible"),
        _ => format!("{virtual_path}: {}", error.kind()),
    };
    ToolError::Failed(text)
}

fn resolve(
    folders: &ThreadFolders,
    path: &str,
    access: PathAccess,
) -> Result<(PathBuf, String), ToolError> {
    let resolved = folders
        .resolve(path.trim(), access)
        .map_err(|e| ToolError::Failed(folders.to_virtual(&e.to_string())))?;
    let virtual_path = shown(folders, &resolved.host);
    Ok((resolved.host, virtual_path))
}

#[async_trait::async_trait]
impl Tool for Ls {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "ls".to_owned(),
            description: format!(
                "Lists a folder's entries with their sizes (at most {MAX_LS_ENTRIES}). \
                 {VIRTUAL_ROOT} itself lists the three folders: workspace (scratch space), \
                 uploads (the user's files, read-only) and outputs (files for the user)."
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": path_property("The folder to list; default /mnt/user-data/workspace")
                },
                "additionalProperties": false
            }),
        }
    }

    async fn call(
        &self,
        arguments: serde_json::Value,
        cx: &ToolContext,
    ) -> Result<String, ToolError> {
        let LsArguments { path } = parse_arguments(arguments)?;
        let path = path.unwrap_or_else(|| Area::Workspace.virtual_path());
        let folders = cx.folders.clone();
        if path.trim().trim_end_matches('/') == VIRTUAL_ROOT {
            return blocking(move || Ok(list_root(&folders))).await;
        }
        let (host, virtual_path) = resolve(&folders, &path, PathAccess::Read)?;
        blocking(move || list_folder(&host, &virtual_path)).await
    }
}

fn list_root(folders: &ThreadFolders) -> String {
    let mut out = format!("{VIRTUAL_ROOT}:\n");
    for area in Area::ALL {
        let what = match area {
            Area::Workspace => "scratch space",
            Area::Uploads => "the user's files, read-only",
            Area::Outputs => "files for the user",
        };
        let entries = std::fs::read_dir(folders.area(area)).map_or(0, Iterator::count);
        out.push_str(&format!(
            "{}/  ({what}; {entries} entries)\n",
            area.virtual_path()
        ));
    }
    out
}

fn list_folder(host: &Path, virtual_path: &str) -> Result<String, ToolError> {
    let meta = std::fs::metadata(host).map_err(|e| io_error(virtual_path, &e))?;
    if !meta.is_dir() {
        return Ok(format!("{virtual_path}  ({})", size_text(meta.len())));
    }
    let reader = std::fs::read_dir(host).map_err(|e| io_error(virtual_path, &e))?;
    let mut entries: Vec<(String, String)> = Vec::new();
    for entry in reader.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let detail = match entry.file_type() {
            Ok(kind) if kind.is_symlink() => "link".to_owned(),
            Ok(kind) if kind.is_dir() => "folder".to_owned(),
            _ => entry
                .metadata()
                .map_or_else(|_| "unreadable".to_owned(), |m| size_text(m.len())),
        };
        let name = if detail == "folder" {
            format!("{name}/")
        } else {
            name
        };
        entries.push((name, detail));
    }
    entries.sort();
    let total = entries.len();
    let base = virtual_path.trim_end_matches('/');
    if total == 0 {
        return Ok(format!("{base}/ is empty"));
    }
    let mut out = format!("{base}/ ({total} entries):\n");
    for (name, detail) in entries.iter().take(MAX_LS_ENTRIES) {
        if detail == "folder" {
            out.push_str(&format!("{name}\n"));
        } else {
            out.push_str(&format!("{name}  ({detail})\n"));
        }
    }
    if total > MAX_LS_ENTRIES {
        out.push_str(&format!(
            "… and {} more (only the first {MAX_LS_ENTRIES} are listed)\n",
            total - MAX_LS_ENTRIES
        ));
    }
    Ok(out)
}

fn size_text(bytes: u64) -> String {
    if bytes == 1 {
        "1 byte".to_owned()
    } else {
        format!("{bytes} bytes")
    }
}

#[async_trait::async_trait]
impl Tool for ReadFile {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "read_file".to_owned(),
            description: format!(
                "Reads a UTF-8 text file, whole or a range of lines (1-based, inclusive). At \
                 most {} KiB come back; a longer read is cut and says which start_line reads \
                 on. Binary files are refused.",
                MAX_READ_BYTES / 1024
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": path_property("The file to read"),
                    "start_line": {
                        "type": "integer", "minimum": 1,
                        "description": "The first line to read (default 1)"
                    },
                    "end_line": {
                        "type": "integer", "minimum": 1,
                        "description": "The last line to read (default: the end of the file)"
                    }
                },
                "required": ["path"],
                "additionalProperties": false
            }),
        }
    }

    async fn call(
        &self,
        arguments: serde_json::Value,
        cx: &ToolContext,
    ) -> Result<String, ToolError> {
        let args: ReadArguments = parse_arguments(arguments)?;
        let start = args.start_line.unwrap_or(1).max(1);
        let end = args.end_line.unwrap_or(usize::MAX);
        if end < start {
            return Err(ToolError::InvalidArguments(format!(
                "end_line ({end}) is before start_line ({start})"
            )));
        }
        let (host, virtual_path) = resolve(&cx.folders, &args.path, PathAccess::Read)?;
        blocking(move || read_lines(&host, &virtual_path, start, end, MAX_READ_BYTES)).await
    }
}

fn not_text(virtual_path: &str) -> ToolError {
    ToolError::Failed(format!(
        "{virtual_path} is not a UTF-8 text file (binary?); read_file only reads text"
    ))
}

/// Lines `start..=end` of a text file, at most `max_bytes` of them, with a note when cut.
fn read_lines(
    host: &Path,
    virtual_path: &str,
    start: usize,
    end: usize,
    max_bytes: usize,
) -> Result<String, ToolError> {
    let file = std::fs::File::open(host).map_err(|e| io_error(virtual_path, &e))?;
    let meta = file.metadata().map_err(|e| io_error(virtual_path, &e))?;
    if meta.is_dir() {
        return Err(ToolError::Failed(format!(
            "{virtual_path} is a folder; list it with ls"
        )));
    }
    let mut reader = BufReader::new(file.take(MAX_SCAN_BYTES));
    let mut out = String::new();
    let mut line = Vec::new();
    let mut number = 0usize;
    loop {
        line.clear();
        let read = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| io_error(virtual_path, &e))?;
        if read == 0 {
            break;
        }
        number += 1;
        if line.contains(&0) {
            return Err(not_text(virtual_path));
        }
        if number < start {
            continue;
        }
        let text = std::str::from_utf8(&line).map_err(|_| not_text(virtual_path))?;
        if out.len() + text.len() > max_bytes {
            if out.is_empty() {
                // A single line longer than the cap: its start, cut on a character boundary.
                let cut = floor_char_boundary(text, max_bytes);
                out.push_str(&text[..cut]);
                out.push_str(&format!(
                    "\n\n[Cut: line {number} of {virtual_path} is longer than {} KiB; only \
                     its start is shown.]",
                    max_bytes / 1024
                ));
            } else {
                out.push_str(&format!(
                    "\n[Cut at {} KiB: lines {start}–{} of {virtual_path} shown; read on with \
                     start_line={number}.]",
                    max_bytes / 1024,
                    number - 1
                ));
            }
            return Ok(out);
        }
        out.push_str(text);
        if number >= end {
            return Ok(out);
        }
    }
    if meta.len() > MAX_SCAN_BYTES && number < end {
        out.push_str(&format!(
            "\n[Cut: only the first {} MiB of {virtual_path} can be read.]",
            MAX_SCAN_BYTES / (1024 * 1024)
        ));
        return Ok(out);
    }
    if number == 0 {
        return Ok(format!("({virtual_path} is empty)"));
    }
    if number < start {
        return Ok(format!(
            "({virtual_path} has only {number} lines; nothing from line {start} on)"
        ));
    }
    Ok(out)
}

/// The largest index `<= at` that is a character boundary of `text`.
fn floor_char_boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

#[async_trait::async_trait]
impl Tool for WriteFile {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "write_file".to_owned(),
            description: format!(
                "Creates or overwrites a text file in /mnt/user-data/workspace or \
                 /mnt/user-data/outputs (put files meant for the user in outputs), creating \
                 its folders. At most {} KiB. Uploads are read-only.",
                MAX_WRITE_BYTES / 1024
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": path_property("The file to write"),
                    "content": {"type": "string", "description": "The whole new content"}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }),
        }
    }

    async fn call(
        &self,
        arguments: serde_json::Value,
        cx: &ToolContext,
    ) -> Result<String, ToolError> {
        let WriteArguments { path, content } = parse_arguments(arguments)?;
        if content.len() > MAX_WRITE_BYTES {
            return Err(ToolError::Failed(format!(
                "the content is {} bytes; write_file writes at most {} KiB",
                content.len(),
                MAX_WRITE_BYTES / 1024
            )));
        }
        let (host, virtual_path) = resolve(&cx.folders, &path, PathAccess::Write)?;
        blocking(move || {
            if host.is_dir() {
                return Err(ToolError::Failed(format!("{virtual_path} is a folder")));
            }
            if let Some(parent) = host.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io_error(&virtual_path, &e))?;
            }
            std::fs::write(&host, content.as_bytes()).map_err(|e| io_error(&virtual_path, &e))?;
            Ok(format!(
                "Wrote {} to {virtual_path}",
                size_text(content.len() as u64)
            ))
        })
        .await
    }
}

#[async_trait::async_trait]
impl Tool for StrReplace {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "str_replace".to_owned(),
            description: "Replaces exactly one occurrence of `old` with `new` in a text file \
                          in /mnt/user-data/workspace or /mnt/user-data/outputs. `old` must \
                          match the file exactly (whitespace included) and only once; add \
                          surrounding lines to make it unique."
                .to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": path_property("The file to edit"),
                    "old": {"type": "string", "description": "The exact text to replace"},
                    "new": {"type": "string", "description": "The text to put in its place"}
                },
                "required": ["path", "old", "new"],
                "additionalProperties": false
            }),
        }
    }

    async fn call(
        &self,
        arguments: serde_json::Value,
        cx: &ToolContext,
    ) -> Result<String, ToolError> {
        let ReplaceArguments { path, old, new } = parse_arguments(arguments)?;
        if old.is_empty() {
            return Err(ToolError::InvalidArguments("`old` is empty".to_owned()));
        }
        let (host, virtual_path) = resolve(&cx.folders, &path, PathAccess::Write)?;
        blocking(move || {
            let meta = std::fs::metadata(&host).map_err(|e| io_error(&virtual_path, &e))?;
            if meta.is_dir() {
                return Err(ToolError::Failed(format!("{virtual_path} is a folder")));
            }
            if meta.len() > MAX_WRITE_BYTES as u64 {
                return Err(ToolError::Failed(format!(
                    "{virtual_path} is larger than {} KiB; str_replace edits smaller files",
                    MAX_WRITE_BYTES / 1024
                )));
            }
            let bytes = std::fs::read(&host).map_err(|e| io_error(&virtual_path, &e))?;
            let text = String::from_utf8(bytes).map_err(|_| not_text(&virtual_path))?;
            match text.matches(old.as_str()).count() {
                0 => {
                    return Err(ToolError::Failed(format!(
                        "`old` was not found in {virtual_path} (0 matches); read the file and \
                         copy the text exactly, whitespace included"
                    )));
                }
                1 => {}
                n => {
                    return Err(ToolError::Failed(format!(
                        "`old` occurs {n} times in {virtual_path}; it must match exactly once: \
                         add surrounding lines to make it unique"
                    )));
                }
            }
            let edited = text.replacen(old.as_str(), &new, 1);
            if edited.len() > MAX_WRITE_BYTES {
                return Err(ToolError::Failed(format!(
                    "the edited file would be larger than {} KiB",
                    MAX_WRITE_BYTES / 1024
                )));
            }
            std::fs::write(&host, edited.as_bytes()).map_err(|e| io_error(&virtual_path, &e))?;
            Ok(format!("Replaced 1 occurrence in {virtual_path}"))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::message::ToolCall;
    use crate::agent::middleware::ToolOutput;
    use crate::agent::tools::ToolRegistry;

    struct Setup {
        dir: tempfile::TempDir,
        cx: ToolContext,
        registry: ToolRegistry,
    }

    async fn setup() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let folders = ThreadFolders::new(dir.path(), "t1").unwrap();
        folders.create().await.unwrap();
        let cx = ToolContext {
            folders,
            ..crate::agent::tools::tests::context()
        };
        Setup {
            dir,
            cx,
            registry: ToolRegistry::builtin(),
        }
    }

    impl Setup {
        async fn call(&self, name: &str, arguments: serde_json::Value) -> ToolOutput {
            let call = ToolCall {
                id: "call_1".to_owned(),
                name: name.to_owned(),
                arguments: arguments.to_string(),
            };
            let out = self.registry.call(&call, &self.cx).await;
            let host = self.dir.path().display().to_string();
            assert!(
                !out.content.contains(&host),
                "a host path leaked: {}",
                out.content
            );
            out
        }

        fn workspace(&self) -> PathBuf {
            self.cx.folders.workspace()
        }
    }

    #[tokio::test]
    async fn path_escapes_are_refused_with_the_models_message() {
        let s = setup().await;
        std::fs::write(s.dir.path().join("secret.txt"), "secret").unwrap();
        let host_path = s.dir.path().join("secret.txt").display().to_string();
        #[cfg(unix)]
        std::os::unix::fs::symlink(s.dir.path().join("secret.txt"), s.workspace().join("link"))
            .unwrap();
        for path in [
            "../../etc/passwd",
            "/etc/passwd",
            "/mnt/user-data/workspace/../../secret.txt",
            "link",
        ] {
            for (tool, args) in [
                ("read_file", json!({"path": path})),
                ("write_file", json!({"path": path, "content": "x"})),
                (
                    "str_replace",
                    json!({"path": path, "old": "secret", "new": "x"}),
                ),
                ("ls", json!({"path": path})),
            ] {
                let out = s.call(tool, args).await;
                assert!(out.is_error, "{tool} {path}: {}", out.content);
                assert!(
                    out.content.contains("outside the thread's folders"),
                    "{tool} {path}: {}",
                    out.content
                );
            }
        }
        // A host path is refused too (echoed only as the model wrote it).
        let call = ToolCall {
            id: "call_1".to_owned(),
            name: "read_file".to_owned(),
            arguments: json!({"path": host_path}).to_string(),
        };
        let out = s.registry.call(&call, &s.cx).await;
        assert!(
            out.is_error && out.content.contains("outside"),
            "{}",
            out.content
        );
        assert_eq!(
            std::fs::read_to_string(s.dir.path().join("secret.txt")).unwrap(),
            "secret"
        );
    }

    #[tokio::test]
    async fn uploads_are_read_only() {
        let s = setup().await;
        std::fs::write(s.cx.folders.uploads().join("a.txt"), "from the user").unwrap();
        let out = s
            .call(
                "write_file",
                json!({"path": "/mnt/user-data/uploads/a.txt", "content": "x"}),
            )
            .await;
        assert!(
            out.is_error && out.content.contains("read-only"),
            "{}",
            out.content
        );
        let out = s
            .call(
                "str_replace",
                json!({"path": "/mnt/user-data/uploads/a.txt", "old": "user", "new": "x"}),
            )
            .await;
        assert!(
            out.is_error && out.content.contains("read-only"),
            "{}",
            out.content
        );
        let out = s
            .call("read_file", json!({"path": "/mnt/user-data/uploads/a.txt"}))
            .await;
        assert_eq!(out, ToolOutput::ok("from the user"));
    }

    #[tokio::test]
    async fn write_read_and_replace_round_trip_with_virtual_paths() {
        let s = setup().await;
        let out = s
            .call(
                "write_file",
                json!({"path": "/mnt/user-data/outputs/report/summary.md", "content": "one\ntwo\nthree\n"}),
            )
            .await;
        assert_eq!(
            out,
            ToolOutput::ok("Wrote 14 bytes to /mnt/user-data/outputs/report/summary.md")
        );
        let out = s
            .call(
                "read_file",
                json!({"path": "/mnt/user-data/outputs/report/summary.md"}),
            )
            .await;
        assert_eq!(out, ToolOutput::ok("one\ntwo\nthree\n"));
        let out = s
            .call(
                "read_file",
                json!({"path": "/mnt/user-data/outputs/report/summary.md", "start_line": 2, "end_line": 2}),
            )
            .await;
        assert_eq!(out, ToolOutput::ok("two\n"));

        let out = s
            .call(
                "str_replace",
                json!({"path": "/mnt/user-data/outputs/report/summary.md", "old": "two", "new": "2"}),
            )
            .await;
        assert_eq!(
            out,
            ToolOutput::ok("Replaced 1 occurrence in /mnt/user-data/outputs/report/summary.md")
        );
        assert_eq!(
            std::fs::read_to_string(s.cx.folders.outputs().join("report/summary.md")).unwrap(),
            "one\n2\nthree\n"
        );

        // A relative path lands in the workspace.
        let out = s
            .call("write_file", json!({"path": "notes.txt", "content": "a a"}))
            .await;
        assert_eq!(
            out,
            ToolOutput::ok("Wrote 3 bytes to /mnt/user-data/workspace/notes.txt")
        );
    }

    #[tokio::test]
    async fn str_replace_needs_exactly_one_match() {
        let s = setup().await;
        std::fs::write(s.workspace().join("a.txt"), "x = 1\nx = 1\n").unwrap();
        let out = s
            .call(
                "str_replace",
                json!({"path": "a.txt", "old": "x = 1", "new": "x = 2"}),
            )
            .await;
        assert!(out.is_error, "{}", out.content);
        assert!(
            out.content
                .contains("occurs 2 times in /mnt/user-data/workspace/a.txt"),
            "{}",
            out.content
        );
        let out = s
            .call(
                "str_replace",
                json!({"path": "a.txt", "old": "y", "new": "z"}),
            )
            .await;
        assert!(
            out.is_error && out.content.contains("0 matches"),
            "{}",
            out.content
        );
        assert_eq!(
            std::fs::read_to_string(s.workspace().join("a.txt")).unwrap(),
            "x = 1\nx = 1\n"
        );
        let out = s
            .call(
                "str_replace",
                json!({"path": "a.txt", "old_str": "x = 1\nx", "new_str": "y"}),
            )
            .await;
        assert!(!out.is_error, "{}", out.content);
        assert_eq!(
            std::fs::read_to_string(s.workspace().join("a.txt")).unwrap(),
            "y = 1\n"
        );
    }

    #[tokio::test]
    async fn ls_lists_entries_and_the_root_lists_the_three_folders() {
        let s = setup().await;
        std::fs::create_dir(s.workspace().join("src")).unwrap();
        std::fs::write(s.workspace().join("a.txt"), "hello").unwrap();
        let out = s.call("ls", json!({})).await;
        assert_eq!(
            out,
            ToolOutput::ok("/mnt/user-data/workspace/ (2 entries):\na.txt  (5 bytes)\nsrc/\n")
        );
        let out = s.call("ls", json!({"path": "/mnt/user-data/"})).await;
        assert!(!out.is_error);
        for line in [
            "/mnt/user-data/workspace/  (scratch space; 2 entries)",
            "/mnt/user-data/uploads/  (the user's files, read-only; 0 entries)",
            "/mnt/user-data/outputs/  (files for the user; 0 entries)",
        ] {
            assert!(out.content.contains(line), "{}", out.content);
        }
        let out = s
            .call("ls", json!({"path": "/mnt/user-data/outputs"}))
            .await;
        assert_eq!(out, ToolOutput::ok("/mnt/user-data/outputs/ is empty"));
        let out = s.call("ls", json!({"path": "missing"})).await;
        assert!(
            out.is_error
                && out
                    .content
                    .contains("/mnt/user-data/workspace/missing does not exist"),
            "{}",
            out.content
        );
    }

    #[tokio::test]
    async fn ls_is_bounded() {
        let s = setup().await;
        for i in 0..MAX_LS_ENTRIES + 5 {
            std::fs::write(s.workspace().join(format!("f{i:04}")), "").unwrap();
        }
        let out = s.call("ls", json!({})).await;
        assert_eq!(out.content.lines().count(), MAX_LS_ENTRIES + 2);
        assert!(out.content.contains("… and 5 more"), "{}", out.content);
    }

    #[tokio::test]
    async fn binary_files_are_refused_and_long_reads_are_cut_with_a_note() {
        let s = setup().await;
        std::fs::write(
            s.workspace().join("img.png"),
            [0x89, b'P', b'N', b'G', 0, 1],
        )
        .unwrap();
        let out = s.call("read_file", json!({"path": "img.png"})).await;
        assert!(
            out.is_error && out.content.contains("not a UTF-8 text file"),
            "{}",
            out.content
        );
        std::fs::write(s.workspace().join("latin1.txt"), [b'c', b'a', b'f', 0xe9]).unwrap();
        let out = s.call("read_file", json!({"path": "latin1.txt"})).await;
        assert!(
            out.is_error && out.content.contains("UTF-8"),
            "{}",
            out.content
        );

        let host = s.workspace().join("big.txt");
        let line = format!("{}\n", "x".repeat(99));
        std::fs::write(&host, line.repeat(5000)).unwrap();
        let out = read_lines(
            &host,
            "/mnt/user-data/workspace/big.txt",
            1,
            usize::MAX,
            1000,
        )
        .unwrap();
        assert!(
            out.ends_with(
                "[Cut at 0 KiB: lines 1–10 of /mnt/user-data/workspace/big.txt shown; read on \
                 with start_line=11.]"
            ),
            "{out}"
        );
        let out = s.call("read_file", json!({"path": "big.txt"})).await;
        assert!(!out.is_error);
        assert!(out.content.len() <= MAX_READ_BYTES + 200);
        assert!(
            out.content.contains("read on with start_line=2622"),
            "{}",
            &out.content[out.content.len() - 200..]
        );
        let out = s
            .call("read_file", json!({"path": "big.txt", "start_line": 6000}))
            .await;
        assert!(
            out.content.contains("has only 5000 lines"),
            "{}",
            out.content
        );
        let out = s
            .call(
                "read_file",
                json!({"path": "big.txt", "start_line": 3, "end_line": 1}),
            )
            .await;
        assert!(out.is_error, "{}", out.content);
    }

    #[tokio::test]
    async fn writes_over_the_cap_are_refused() {
        let s = setup().await;
        let out = s
            .call(
                "write_file",
                json!({"path": "a.txt", "content": "x".repeat(MAX_WRITE_BYTES + 1)}),
            )
            .await;
        assert!(
            out.is_error && out.content.contains("at most"),
            "{}",
            out.content
        );
        assert!(!s.workspace().join("a.txt").exists());
    }
}
