//! `present_files`: the model hands files it made to the user.
//!
//! `present_files(paths: [...])` takes virtual paths under `/mnt/user-data/outputs` only: a
//! file elsewhere (the workspace, the uploads) is refused with the reason, so the model copies
//! what it means to share into outputs first, as in DeerFlow. Each path is confined like the
//! file tools' (`ThreadFolders::resolve`: no `..`, no absolute host paths) and opened beneath
//! the outputs folder with every link refused ([`crate::beneath`]); the open file must be a
//! regular file with one name (a hard link could share its bytes with a file elsewhere), so
//! nothing outside outputs can be sent by naming it from inside. At most [`MAX_FILES`] files
//! per call, each at most `agent.max_attachment_bytes`; one bad path refuses the whole call,
//! so the model can fix it.
//!
//! The tool only checks and answers; the `thread_data` middleware, which has the run, records
//! a successful call's files (their names under outputs) on the run's outputs
//! (`RunOutputs::files`) for delivery with the final answer, checking them again then (see
//! `middleware::thread_data`). Whoever sends a presented file (delivery, the download route)
//! opens it again with [`open_presented`] and sends what it opened, checked then: the shell
//! may have swapped the file for a link since.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::paths::{Area, PathAccess};
use super::{Tool, ToolContext, ToolError, parse_arguments};
use crate::agent::input::ThreadFolders;
use crate::agent::model::ToolSpec;
use crate::beneath::{OpenedFile, Refused};

/// The tool's name.
pub(crate) const TOOL_NAME: &str = "present_files";

/// Files one call (and one run) may present at most.
pub(crate) const MAX_FILES: usize = 10;

/// The longest path the tool looks at, in bytes.
const MAX_PATH_BYTES: usize = 4096;

/// A file presented to the user: plain data, for the caller to deliver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PresentedFile {
    /// Its path under the thread's outputs folder (`report.csv`, `charts/cpu.png`).
    pub(crate) name: String,
    /// Its media type, by its extension.
    pub(crate) media_type: String,
    /// Its size in bytes.
    pub(crate) size: u64,
}

/// The tool's arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Arguments {
    /// DeerFlow calls them `filepaths`; both are understood.
    #[serde(alias = "filepaths")]
    pub(crate) paths: Vec<String>,
}

/// Checks that the tool looks at a file.
pub(crate) struct PresentFiles {
    max_bytes: u64,
}

impl PresentFiles {
    /// The tool, with files of at most `max_bytes` each.
    pub(crate) fn new(max_bytes: u64) -> Self {
        Self { max_bytes }
    }
}

/// The media type of a file, by its extension (`application/octet-stream` when unknown).
pub(crate) fn media_type(name: &str) -> &'static str {
    let extension = Path::new(name)
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    match extension.as_str() {
        "txt" | "log" => "text/plain",
        "md" | "markdown" => "text/markdown",
        "csv" => "text/csv",
        "tsv" => "text/tab-separated-values",
        "html" | "htm" => "text/html",
        "json" => "application/json",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "toml" => "application/toml",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        "gz" | "tgz" => "application/gzip",
        "tar" => "application/x-tar",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "docx" => "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "xlsx" => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "pptx" => "application/vnd.openxmlformats-officedocument.presentationml.presentation",
        _ => "application/octet-stream",
    }
}

/// The files `paths` name, each checked; the error (for the model) names the first bad path
/// and why. Blocking: it reads file metadata.
pub(crate) fn check_paths(
    folders: &ThreadFolders,
    paths: &[String],
    max_bytes: u64,
) -> Result<Vec<PresentedFile>, String> {
    if paths.is_empty() {
        return Err("Error: `paths` is empty; name the files to present.".to_owned());
    }
    if paths.len() > MAX_FILES {
        return Err(format!(
            "Error: {} files named; at most {MAX_FILES} can be presented. Bundle them (zip) or \
             choose the most useful.",
            paths.len()
        ));
    }
    let outputs = Area::Outputs.virtual_path();
    let folder = folders
        .open_area(Area::Outputs)
        .map_err(|e| format!("Error: {outputs} {e}."))?;
    let mut files: Vec<PresentedFile> = Vec::with_capacity(paths.len());
    for path in paths {
        let shown: String = path.chars().take(200).collect();
        if path.len() > MAX_PATH_BYTES {
            return Err(format!("Error: the path {shown}… is too long."));
        }
        let resolved = folders
            .resolve(path, PathAccess::Read)
            .map_err(|e| format!("Error: {e}."))?;
        if resolved.area != Area::Outputs {
            return Err(format!(
                "Error: {shown} is not under {outputs}; only files there can be presented. \
                 Copy or write the file to {outputs} first."
            ));
        }
        let name = resolved.name();
        if name.is_empty() {
            return Err(format!("Error: {shown} is a folder, not a regular file."));
        }
        let opened = folder
            .open_file(&resolved.relative, max_bytes)
            .map_err(|e| refusal(&shown, e))?;
        if files.iter().any(|f| f.name == name) {
            continue;
        }
        files.push(PresentedFile {
            media_type: media_type(&name).to_owned(),
            name,
            size: opened.size,
        });
    }
    Ok(files)
}

/// Why the file `shown` cannot be presented, for the model.
fn refusal(shown: &str, refused: Refused) -> String {
    match refused {
        Refused::NotFound => format!("Error: {shown} does not exist."),
        Refused::Link => {
            format!("Error: {shown} is a symbolic link (or inside one); present the file itself.")
        }
        Refused::HardLink => {
            format!("Error: {shown} is a hard link; write a copy of the file instead.")
        }
        Refused::Folder | Refused::Special => {
            format!("Error: {shown} is not a regular file.")
        }
        Refused::NotFolder => format!("Error: a part of {shown} is a file, not a folder."),
        Refused::TooLarge { size, limit } => {
            format!("Error: {shown} is {size} bytes; files may be at most {limit} bytes.")
        }
        Refused::Outside => format!("Error: {shown} is outside the thread's folders."),
        Refused::Io(_) => format!("Error: {shown} cannot be read."),
    }
}

/// Opens the presented file `name` (its path under the thread's outputs, as
/// [`PresentedFile::name`]) to send it: beneath the outputs folder, links refused, checked on
/// the open file (regular, one name, at most `max_bytes`). Blocking.
pub(crate) fn open_presented(
    folders: &ThreadFolders,
    name: &str,
    max_bytes: u64,
) -> Result<OpenedFile, Refused> {
    if name.is_empty() {
        return Err(Refused::Outside);
    }
    folders
        .open_area(Area::Outputs)?
        .open_file(Path::new(name), max_bytes)
}

/// What the model is told about presented files.
pub(crate) fn describe(files: &[PresentedFile]) -> String {
    let outputs = Area::Outputs.virtual_path();
    let list: Vec<String> = files
        .iter()
        .map(|f| format!("- {outputs}/{} ({} bytes)", f.name, f.size))
        .collect();
    format!(
        "These files will be delivered to the user with your answer:\n{}",
        list.join("\n")
    )
}

#[async_trait::async_trait]
impl Tool for PresentFiles {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: TOOL_NAME.to_owned(),
            description: format!(
                "Deliver files you made to the user, as attachments of your answer. Only \
                 files under /mnt/user-data/outputs can be presented (at most {MAX_FILES}); \
                 write or copy them there first. Call it once the files are final."
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "paths": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "Paths of the files, e.g. /mnt/user-data/outputs/report.csv"
                    }
                },
                "required": ["paths"]
            }),
        }
    }

    async fn call(
        &self,
        arguments: serde_json::Value,
        cx: &ToolContext,
    ) -> Result<String, ToolError> {
        let arguments: Arguments = parse_arguments(arguments)?;
        let folders = cx.folders.clone();
        let max_bytes = self.max_bytes;
        let checked =
            tokio::task::spawn_blocking(move || check_paths(&folders, &arguments.paths, max_bytes))
                .await
                .map_err(|_| {
                    ToolError::Failed("the check of the files did not finish".to_owned())
                })?;
        match checked {
            Ok(files) => Ok(describe(&files)),
            Err(reason) => Err(ToolError::Failed(reason)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, ThreadFolders) {
        let dir = tempfile::tempdir().unwrap();
        let folders = ThreadFolders::new(dir.path(), "t1").unwrap();
        for area in Area::ALL {
            std::fs::create_dir_all(folders.area(area)).unwrap();
        }
        (dir, folders)
    }

    fn paths(list: &[&str]) -> Vec<String> {
        list.iter().map(|p| (*p).to_owned()).collect()
    }

    #[test]
    fn files_under_outputs_are_presented_with_their_type_and_size() {
        let (_dir, folders) = setup();
        std::fs::write(folders.outputs().join("report.csv"), "a,b\n1,2\n").unwrap();
        std::fs::create_dir_all(folders.outputs().join("charts")).unwrap();
        std::fs::write(folders.outputs().join("charts/cpu.png"), [0u8; 3]).unwrap();
        let files = check_paths(
            &folders,
            &paths(&[
                "/mnt/user-data/outputs/report.csv",
                "/mnt/user-data/outputs/charts/cpu.png",
                "/mnt/user-data/outputs/./report.csv",
            ]),
            100,
        )
        .unwrap();
        assert_eq!(files.len(), 2, "a file named twice is presented once");
        assert_eq!(files[0].name, "report.csv");
        assert_eq!(files[0].media_type, "text/csv");
        assert_eq!(files[0].size, 8);
        assert_eq!(files[1].name, "charts/cpu.png");
        assert_eq!(files[1].media_type, "image/png");
        assert!(describe(&files).contains("/mnt/user-data/outputs/charts/cpu.png (3 bytes)"));
    }

    #[test]
    fn paths_outside_outputs_are_refused_with_the_reason() {
        let (_dir, folders) = setup();
        std::fs::create_dir(folders.outputs().join("charts")).unwrap();
        std::fs::write(folders.workspace().join("notes.txt"), "x").unwrap();
        std::fs::write(folders.uploads().join("in.txt"), "x").unwrap();
        for (path, reason) in [
            (
                "/mnt/user-data/workspace/notes.txt",
                "not under /mnt/user-data/outputs",
            ),
            ("notes.txt", "not under /mnt/user-data/outputs"),
            (
                "/mnt/user-data/uploads/in.txt",
                "not under /mnt/user-data/outputs",
            ),
            (
                "/mnt/user-data/outputs/../workspace/notes.txt",
                "outside the thread's folders",
            ),
            ("../../etc/passwd", "outside the thread's folders"),
            ("/etc/passwd", "outside the thread's folders"),
            ("/mnt/user-data/outputs/missing.txt", "does not exist"),
            ("/mnt/user-data/outputs", "not a regular file"),
            ("/mnt/user-data/outputs/charts", "not a regular file"),
        ] {
            let error = check_paths(&folders, &paths(&[path]), 100).unwrap_err();
            assert!(error.contains(reason), "{path}: {error}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn links_are_refused() {
        let (dir, folders) = setup();
        let secret = dir.path().join("secret.txt");
        std::fs::write(&secret, "secret").unwrap();
        std::os::unix::fs::symlink(&secret, folders.outputs().join("out.txt")).unwrap();
        let error =
            check_paths(&folders, &paths(&["/mnt/user-data/outputs/out.txt"]), 100).unwrap_err();
        assert!(error.contains("symbolic link"), "{error}");
        std::os::unix::fs::symlink(dir.path(), folders.outputs().join("up")).unwrap();
        let error = check_paths(
            &folders,
            &paths(&["/mnt/user-data/outputs/up/secret.txt"]),
            100,
        )
        .unwrap_err();
        assert!(error.contains("symbolic link"), "{error}");
        // A link that stays inside outputs is still not the file itself.
        std::fs::write(folders.outputs().join("real.txt"), "x").unwrap();
        std::os::unix::fs::symlink(
            folders.outputs().join("real.txt"),
            folders.outputs().join("alias.txt"),
        )
        .unwrap();
        let error =
            check_paths(&folders, &paths(&["/mnt/user-data/outputs/alias.txt"]), 100).unwrap_err();
        assert!(error.contains("symbolic link"), "{error}");
        std::fs::hard_link(&secret, folders.outputs().join("hard.txt")).unwrap();
        let error =
            check_paths(&folders, &paths(&["/mnt/user-data/outputs/hard.txt"]), 100).unwrap_err();
        assert!(error.contains("hard link"), "{error}");
    }

    #[test]
    fn too_many_or_too_large_files_are_refused() {
        let (_dir, folders) = setup();
        std::fs::write(folders.outputs().join("big.bin"), [0u8; 11]).unwrap();
        let error =
            check_paths(&folders, &paths(&["/mnt/user-data/outputs/big.bin"]), 10).unwrap_err();
        assert!(error.contains("at most 10 bytes"), "{error}");
        let eleven: Vec<String> = (0..11)
            .map(|i| format!("/mnt/user-data/outputs/f{i}.txt"))
            .collect();
        let error = check_paths(&folders, &eleven, 10).unwrap_err();
        assert!(error.contains("at most 10 can be presented"), "{error}");
        let error = check_paths(&folders, &[], 10).unwrap_err();
        assert!(error.contains("empty"), "{error}");
    }

    #[tokio::test]
    async fn the_tool_answers_with_the_files_or_the_refusal() {
        let (_dir, folders) = setup();
        std::fs::write(folders.outputs().join("a.txt"), "hello").unwrap();
        let cx = ToolContext {
            folders,
            ..crate::agent::tools::tests::context()
        };
        let tool = PresentFiles::new(100);
        let out = tool
            .call(json!({"paths": ["/mnt/user-data/outputs/a.txt"]}), &cx)
            .await
            .unwrap();
        assert!(
            out.contains("/mnt/user-data/outputs/a.txt (5 bytes)"),
            "{out}"
        );
        let refused = tool
            .call(
                json!({"filepaths": ["/mnt/user-data/workspace/a.txt"]}),
                &cx,
            )
            .await
            .unwrap_err();
        assert!(
            refused.to_string().contains("only files there"),
            "{refused}"
        );
    }
}
