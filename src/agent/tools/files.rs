//! File tools: `ls`, `read_file`, `write_file` and `str_replace`, on the thread's folders as
//! the model sees them (`/mnt/user-data/{workspace,uploads,outputs}`).
//!
//! Every path the model writes goes through [`ThreadFolders::resolve`] (`..` and host paths
//! refused, uploads read-only) and is then opened beneath a handle on its folder with every
//! link refused ([`crate::beneath`]): what is checked (a regular file, one name, its size) is
//! the open file itself, and the work is done on it, so a link or a hard link the shell plants,
//! even between two calls' steps, cannot lead a read or a write out of the folders. Writes
//! go to a new file renamed into place. Every message back names virtual paths only. Sizes are bounded ([`MAX_LS_ENTRIES`], [`MAX_READ_BYTES`],
//! [`MAX_WRITE_BYTES`]) so one call can neither flood the model's context nor fill the disk,
//! and the blocking file I/O runs on tokio's blocking pool.
//!
//! Unlike DeerFlow's `read_file`, a read that is cut says exactly where it stopped and which
//! `start_line` reads on; `str_replace` says how many matches it found when it is not one.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;

use super::paths::{Area, PathAccess, Resolved, VIRTUAL_ROOT};
use super::{Tool, ToolContext, ToolError, parse_arguments};
use crate::agent::input::ThreadFolders;
use crate::agent::model::ToolSpec;
use crate::agent::skills::mounts::{SkillPath, SkillPathError};
use crate::agent::skills::{SKILLS_ROOT, SkillMounts};
use crate::beneath::{Dir, EntryKind, OpenedFile, Refused};

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

/// The model-facing text of a refused open of `virtual_path`.
fn refused(virtual_path: &str, refusal: Refused) -> ToolError {
    ToolError::Failed(match refusal {
        Refused::NotFound => format!("{virtual_path} does not exist"),
        Refused::Link => format!(
            "{virtual_path} is a symbolic link or goes through one; links in the thread's \
             folders are not followed: use the real path"
        ),
        Refused::HardLink => format!(
            "{virtual_path} is a hard link (its bytes have another name, perhaps outside the \
             thread's folders); it is not read or changed: copy the file and use the copy"
        ),
        Refused::Folder => format!("{virtual_path} is a folder"),
        Refused::NotFolder => format!("a part of {virtual_path} is a file, not a folder"),
        Refused::Special => format!("{virtual_path} is not a regular file"),
        Refused::TooLarge { size, limit } => {
            format!("{virtual_path} is {size} bytes, more than the {limit} allowed")
        }
        Refused::Outside => format!("{virtual_path} is outside the thread's folders"),
        Refused::Io(error) => return io_error(virtual_path, &error),
    })
}

fn resolve(
    folders: &ThreadFolders,
    path: &str,
    access: PathAccess,
) -> Result<(Resolved, String), ToolError> {
    let resolved = folders
        .resolve(path.trim(), access)
        .map_err(|e| ToolError::Failed(folders.to_virtual(&e.to_string())))?;
    let virtual_path = shown(folders, &resolved.host);
    Ok((resolved, virtual_path))
}

/// Skills are the operator's: nothing writes beneath [`SKILLS_ROOT`].
fn refuse_skill_write(path: &str) -> Result<(), ToolError> {
    if SkillMounts::is_skill_path(path) {
        return Err(ToolError::Failed(format!(
            "{} is read-only: skills are the operator's; write to /mnt/user-data/workspace or \
             /mnt/user-data/outputs",
            path.trim()
        )));
    }
    Ok(())
}

/// The model-facing text of a refused skill path.
fn skill_error(error: SkillPathError) -> ToolError {
    ToolError::Failed(error.to_string())
}

/// `ls` of a folder (or file) inside a skill.
fn list_skill_folder(skills: &SkillMounts, resolved: &SkillPath) -> Result<String, ToolError> {
    let virtual_path = &resolved.virtual_path;
    let skill_dir = skills
        .open(resolved)
        .map_err(|e| refused(virtual_path, e))?;
    list_in(&skill_dir, &resolved.relative, virtual_path)
}

/// The handle on `resolved`'s folder.
fn area(folders: &ThreadFolders, resolved: &Resolved) -> Result<Dir, ToolError> {
    folders
        .open_area(resolved.area)
        .map_err(|e| refused(&resolved.area.virtual_path(), e))
}

/// The folder `resolved` is in (relative to its area) and its own name; `None` for an area.
fn parent_and_name(resolved: &Resolved) -> Option<(&Path, &OsStr)> {
    Some((resolved.relative.parent()?, resolved.relative.file_name()?))
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
        if SkillMounts::is_skill_path(&path) {
            let skills = cx.skills.clone();
            return match skills.resolve(&path).map_err(skill_error)? {
                None => Ok(skills.listing()),
                Some(resolved) => blocking(move || list_skill_folder(&skills, &resolved)).await,
            };
        }
        let folders = cx.folders.clone();
        if path.trim().trim_end_matches('/') == VIRTUAL_ROOT {
            return blocking(move || Ok(list_root(&folders))).await;
        }
        let (resolved, virtual_path) = resolve(&folders, &path, PathAccess::Read)?;
        blocking(move || list_folder(&folders, &resolved, &virtual_path)).await
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
        let entries = folders
            .open_area(area)
            .and_then(|dir| dir.entries())
            .map_or(0, |entries| entries.len());
        out.push_str(&format!(
            "{}/  ({what}; {entries} entries)\n",
            area.virtual_path()
        ));
    }
    out
}

fn list_folder(
    folders: &ThreadFolders,
    resolved: &Resolved,
    virtual_path: &str,
) -> Result<String, ToolError> {
    let area = area(folders, resolved)?;
    list_in(&area, &resolved.relative, virtual_path)
}

/// `ls` of `relative` beneath `base`, shown as `virtual_path`.
fn list_in(base: &Dir, relative: &Path, virtual_path: &str) -> Result<String, ToolError> {
    let entry = base.stat(relative).map_err(|e| refused(virtual_path, e))?;
    match entry.kind {
        EntryKind::Folder => {}
        EntryKind::Link => return Err(refused(virtual_path, Refused::Link)),
        EntryKind::File | EntryKind::Other => {
            return Ok(format!("{virtual_path}  ({})", size_text(entry.size)));
        }
    }
    let listed = base
        .open_dir(relative)
        .and_then(|dir| dir.entries())
        .map_err(|e| refused(virtual_path, e))?;
    let mut entries: Vec<(String, String)> = listed
        .into_iter()
        .map(|entry| {
            let name = entry.name.to_string_lossy().into_owned();
            match entry.kind {
                EntryKind::Link => (name, "link".to_owned()),
                EntryKind::Folder => (format!("{name}/"), "folder".to_owned()),
                EntryKind::File | EntryKind::Other => (name, size_text(entry.size)),
            }
        })
        .collect();
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
        if SkillMounts::is_skill_path(&args.path) {
            let skills = cx.skills.clone();
            let resolved = skills
                .resolve(&args.path)
                .map_err(skill_error)?
                .ok_or_else(|| {
                    ToolError::Failed(format!("{SKILLS_ROOT} is a folder; list it with ls"))
                })?;
            return blocking(move || {
                let virtual_path = resolved.virtual_path.clone();
                let opened = skills
                    .open(&resolved)
                    .and_then(|dir| dir.open_file(&resolved.relative, u64::MAX))
                    .map_err(|e| match e {
                        Refused::Folder => ToolError::Failed(format!(
                            "{virtual_path} is a folder; list it with ls"
                        )),
                        other => refused(&virtual_path, other),
                    })?;
                read_lines(opened, &virtual_path, start, end, MAX_READ_BYTES)
            })
            .await;
        }
        let (resolved, virtual_path) = resolve(&cx.folders, &args.path, PathAccess::Read)?;
        let folders = cx.folders.clone();
        blocking(move || {
            let opened = area(&folders, &resolved)?
                .open_file(&resolved.relative, u64::MAX)
                .map_err(|e| match e {
                    Refused::Folder => {
                        ToolError::Failed(format!("{virtual_path} is a folder; list it with ls"))
                    }
                    other => refused(&virtual_path, other),
                })?;
            read_lines(opened, &virtual_path, start, end, MAX_READ_BYTES)
        })
        .await
    }
}

fn not_text(virtual_path: &str) -> ToolError {
    ToolError::Failed(format!(
        "{virtual_path} is not a UTF-8 text file (binary?); read_file only reads text"
    ))
}

/// Lines `start..=end` of the opened text file, at most `max_bytes` of them, with a note when
/// cut.
fn read_lines(
    opened: OpenedFile,
    virtual_path: &str,
    start: usize,
    end: usize,
    max_bytes: usize,
) -> Result<String, ToolError> {
    let size = opened.size;
    let mut reader = BufReader::new(opened.file.take(MAX_SCAN_BYTES));
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
    if size > MAX_SCAN_BYTES && number < end {
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
        refuse_skill_write(&path)?;
        let (resolved, virtual_path) = resolve(&cx.folders, &path, PathAccess::Write)?;
        let folders = cx.folders.clone();
        blocking(move || {
            let (parent, name) = parent_and_name(&resolved)
                .ok_or_else(|| ToolError::Failed(format!("{virtual_path} is a folder")))?;
            area(&folders, &resolved)?
                .create_dir_all(parent)
                .and_then(|dir| dir.replace(name, content.as_bytes(), false))
                .map_err(|e| refused(&virtual_path, e))?;
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
        refuse_skill_write(&path)?;
        let (resolved, virtual_path) = resolve(&cx.folders, &path, PathAccess::Write)?;
        let folders = cx.folders.clone();
        blocking(move || {
            let (parent, name) = parent_and_name(&resolved)
                .ok_or_else(|| ToolError::Failed(format!("{virtual_path} is a folder")))?;
            let folder = area(&folders, &resolved)?
                .open_dir(parent)
                .map_err(|e| refused(&virtual_path, e))?;
            let opened = folder
                .open_file(Path::new(name), MAX_WRITE_BYTES as u64)
                .map_err(|e| match e {
                    Refused::TooLarge { .. } => ToolError::Failed(format!(
                        "{virtual_path} is larger than {} KiB; str_replace edits smaller files",
                        MAX_WRITE_BYTES / 1024
                    )),
                    other => refused(&virtual_path, other),
                })?;
            let mut bytes = Vec::new();
            // One byte more than allowed tells a file that grew since it was checked.
            opened
                .file
                .take(MAX_WRITE_BYTES as u64 + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| io_error(&virtual_path, &e))?;
            if bytes.len() > MAX_WRITE_BYTES {
                return Err(ToolError::Failed(format!(
                    "{virtual_path} is larger than {} KiB; str_replace edits smaller files",
                    MAX_WRITE_BYTES / 1024
                )));
            }
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
            folder
                .replace(name, edited.as_bytes(), false)
                .map_err(|e| refused(&virtual_path, e))?;
            Ok(format!("Replaced 1 occurrence in {virtual_path}"))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::message::ToolCall;
    use crate::agent::tools::ToolOutput;
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

        fn workspace(&self) -> std::path::PathBuf {
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
        for (path, why) in [
            ("../../etc/passwd", "outside the thread's folders"),
            ("/etc/passwd", "outside the thread's folders"),
            (
                "/mnt/user-data/workspace/../../secret.txt",
                "outside the thread's folders",
            ),
            ("link", "symbolic link"),
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
                assert!(out.content.contains(why), "{tool} {path}: {}", out.content);
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

    #[cfg(unix)]
    #[tokio::test]
    async fn hard_links_and_linked_folders_are_neither_read_nor_changed() {
        let s = setup().await;
        let secret = s.dir.path().join("antler.toml");
        std::fs::write(&secret, "token = \"SECRET\"").unwrap();
        std::fs::hard_link(&secret, s.workspace().join("hard.toml")).unwrap();
        std::os::unix::fs::symlink(s.dir.path(), s.workspace().join("up")).unwrap();
        for (tool, args) in [
            ("read_file", json!({"path": "hard.toml"})),
            (
                "str_replace",
                json!({"path": "hard.toml", "old": "SECRET", "new": "x"}),
            ),
            ("read_file", json!({"path": "up/antler.toml"})),
            ("write_file", json!({"path": "up/new.txt", "content": "x"})),
            ("ls", json!({"path": "up"})),
        ] {
            let out = s.call(tool, args.clone()).await;
            assert!(out.is_error, "{tool} {args}: {}", out.content);
            assert!(!out.content.contains("SECRET"), "{}", out.content);
            assert!(
                out.content.contains("hard link") || out.content.contains("symbolic link"),
                "{tool} {args}: {}",
                out.content
            );
        }
        assert_eq!(
            std::fs::read_to_string(&secret).unwrap(),
            "token = \"SECRET\""
        );
        assert!(!s.dir.path().join("new.txt").exists());
        // write_file replaces the name it is given; the hard-linked file elsewhere is untouched.
        let out = s
            .call(
                "write_file",
                json!({"path": "hard.toml", "content": "mine"}),
            )
            .await;
        assert!(!out.is_error, "{}", out.content);
        assert_eq!(
            std::fs::read_to_string(&secret).unwrap(),
            "token = \"SECRET\""
        );
        assert_eq!(
            std::fs::read_to_string(s.workspace().join("hard.toml")).unwrap(),
            "mine"
        );
    }

    /// Swaps `name` in `folder` between a regular file and a symbolic link to `target` until
    /// `stop` is set, as a hostile shell racing antler's checks would.
    #[cfg(unix)]
    fn swap_in_a_loop(
        folder: std::path::PathBuf,
        name: &'static str,
        target: std::path::PathBuf,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> std::thread::JoinHandle<usize> {
        std::thread::spawn(move || {
            let path = folder.join(name);
            let (file, link) = (folder.join(".file"), folder.join(".link"));
            let mut swaps = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = std::fs::write(&file, "harmless");
                let _ = std::fs::rename(&file, &path);
                let _ = std::os::unix::fs::symlink(&target, &link);
                let _ = std::fs::rename(&link, &path);
                swaps += 1;
            }
            swaps
        })
    }

    #[cfg(unix)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_file_swapped_for_a_link_in_a_loop_never_leaks_or_is_written_through() {
        let s = setup().await;
        let secret = s.dir.path().join("antler.toml");
        std::fs::write(&secret, "token = \"SECRET\"").unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = swap_in_a_loop(s.workspace(), "r.txt", secret.clone(), Arc::clone(&stop));
        let (mut reads, mut harmless, mut writes) = (0, 0, 0);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while std::time::Instant::now() < until {
            let out = s.call("read_file", json!({"path": "r.txt"})).await;
            assert!(!out.content.contains("SECRET"), "leaked: {}", out.content);
            reads += 1;
            harmless += usize::from(out.content == "harmless");
            let out = s
                .call("write_file", json!({"path": "r.txt", "content": "mine"}))
                .await;
            writes += usize::from(!out.is_error);
            let out = s
                .call(
                    "str_replace",
                    json!({"path": "r.txt", "old": "harmless", "new": "x"}),
                )
                .await;
            assert!(!out.content.contains("SECRET"), "leaked: {}", out.content);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let swaps = swapper.join().unwrap();
        assert_eq!(
            std::fs::read_to_string(&secret).unwrap(),
            "token = \"SECRET\"",
            "written through a link"
        );
        // The race really ran: the file was read and written between swaps.
        assert!(swaps > 10 && reads > 10, "swaps {swaps}, reads {reads}");
        assert!(harmless + writes > 0, "no read or write ever succeeded");
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
        let opened =
            s.cx.folders
                .open_area(Area::Workspace)
                .unwrap()
                .open_file(Path::new("big.txt"), u64::MAX)
                .unwrap();
        let out = read_lines(
            opened,
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

    #[cfg(unix)]
    #[tokio::test]
    async fn skills_are_listed_and_read_at_mnt_skills_and_never_written() {
        let mut s = setup().await;
        let folder = s.dir.path().join("skills/ops");
        std::fs::create_dir_all(folder.join("ref")).unwrap();
        std::fs::write(folder.join("SKILL.md"), "---\nname: ops\n---\nDo ops.\n").unwrap();
        std::fs::write(folder.join("ref/notes.md"), "one\ntwo\n").unwrap();
        std::fs::write(s.dir.path().join("secret.txt"), "secret").unwrap();
        // Planted after loading: refused when opened, like every link.
        std::os::unix::fs::symlink(s.dir.path().join("secret.txt"), folder.join("leak")).unwrap();
        s.cx.skills = SkillMounts::new(vec![crate::agent::skills::Skill {
            name: "ops".to_owned(),
            description: "Operations".to_owned(),
            allowed_tools: None,
            license: None,
            folder: folder.clone(),
        }]);
        let root = s.call("ls", json!({"path": "/mnt/skills"})).await;
        assert!(
            root.content.contains("ops/  (Operations)"),
            "{}",
            root.content
        );
        let listed = s.call("ls", json!({"path": "/mnt/skills/ops"})).await;
        assert!(
            listed.content.contains("SKILL.md") && listed.content.contains("ref/"),
            "{}",
            listed.content
        );
        let read = s
            .call("read_file", json!({"path": "/mnt/skills/ops/SKILL.md"}))
            .await;
        assert!(
            !read.is_error && read.content.contains("Do ops."),
            "{}",
            read.content
        );
        let line = s
            .call(
                "read_file",
                json!({"path": "/mnt/skills/ops/ref/notes.md", "start_line": 2}),
            )
            .await;
        assert_eq!(line.content, "two\n");
        for (path, why) in [
            ("/mnt/skills/ops/leak", "symbolic link"),
            (
                "/mnt/skills/ops/../../secret.txt",
                "outside the skill's folder",
            ),
            ("/mnt/skills/other/SKILL.md", "not a skill"),
            ("/mnt/skills", "is a folder"),
        ] {
            let out = s.call("read_file", json!({"path": path})).await;
            assert!(
                out.is_error && out.content.contains(why),
                "{path}: {}",
                out.content
            );
        }
        let write = s
            .call(
                "write_file",
                json!({"path": "/mnt/skills/ops/SKILL.md", "content": "x"}),
            )
            .await;
        assert!(
            write.is_error && write.content.contains("read-only"),
            "{}",
            write.content
        );
        let edit = s
            .call(
                "str_replace",
                json!({"path": "/mnt/skills/ops/SKILL.md", "old": "ops", "new": "x"}),
            )
            .await;
        assert!(
            edit.is_error && edit.content.contains("read-only"),
            "{}",
            edit.content
        );
        assert_eq!(
            std::fs::read_to_string(folder.join("SKILL.md")).unwrap(),
            "---\nname: ops\n---\nDo ops.\n"
        );
        // Without the skill on, nothing is there.
        s.cx.skills = SkillMounts::default();
        let off = s
            .call("read_file", json!({"path": "/mnt/skills/ops/SKILL.md"}))
            .await;
        assert!(
            off.is_error && off.content.contains("not a skill"),
            "{}",
            off.content
        );
    }
}
