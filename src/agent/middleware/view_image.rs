//! view_image (chain position 13): shows images to a vision-capable model.
//!
//! Only in the chain when `[model] vision = true`; a model without vision gets no images and
//! still reads the `<uploaded_files>` list the uploads middleware writes.
//!
//! - **Uploads.** In `before_model`, the image files that came with the current message (at
//!   most `max_images` (4), each at most `max_image_bytes` (5 MiB), read from the thread's
//!   `uploads/` folder) are added to that message in the request as OpenAI image content
//!   parts: `{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}` after
//!   the user's text. A file counts as an image by what its first bytes say (PNG, JPEG, GIF or
//!   WebP), whatever its declared media type or extension: a mislabelled file would make the
//!   provider refuse the whole request. The bytes are never stored in the thread: the stored
//!   message keeps its text (and the uploads list), and every model call of the turn reads
//!   the files again, so a thread stays small and later turns do not pay for old images.
//! - **The `view_image` tool** (as DeerFlow's): the model names an image under
//!   `/mnt/user-data/...` (one it made or found in the workspace); the call is checked (inside
//!   the thread's folders, an image, not too big), the path is kept in the thread's
//!   extensions, and the next model request gets the images in a user message after the tool
//!   results. `after_model` forgets them, so each is shown once.
//!
//! Placement: after summarization and memory, so the images are added to the request that is
//! actually sent and are never summarized; before deferred_tools, subagent_limit and
//! loop_detection, which do not touch user messages. It fails open: a file that cannot be
//! read is left out (and logged), the text still goes.
//!
//! Finding the current message in the request: it is the request's user message equal to the
//! thread's turn message, else the last one that contains the user's words (a sanitizing hook
//! may have wrapped them); when neither is found the images go in a user message of their own
//! at the end of the request. Deviation from DeerFlow: DeerFlow sends uploaded images only
//! through the tool; here the current message's images go with it directly, and the tool
//! stores paths, not base64, in the thread (DeerFlow allows 20 MB per image; the default here
//! is 5 MiB, what most providers accept).

use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::io::Read as _;

use super::{Middleware, MiddlewareError, RunContext, ToolDecision, ToolOutput};
use crate::agent::input::ThreadFolders;
use crate::agent::message::{ChatMessage, ContentPart, ToolCall};
use crate::agent::model::{ModelRequest, ModelResponse, ToolSpec};
use crate::agent::thread::Extension;
use crate::agent::tools::paths::{Area, PathAccess};
use crate::agent::tools::{InterceptedTool, Tool, intercepted_arguments};
use crate::beneath::Refused;

/// The tool's name.
pub(crate) const TOOL_NAME: &str = "view_image";

/// `[agent.middleware.view_image]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct ViewImageConfig {
    /// Whether the middleware (and its tool) is in the chain; it is only when the model has
    /// vision (`[model] vision = true`).
    pub(crate) enabled: bool,
    /// Images per request at most (of a message, or viewed with the tool).
    pub(crate) max_images: usize,
    /// The largest image sent, in bytes.
    pub(crate) max_image_bytes: u64,
}

impl Default for ViewImageConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_images: 4,
            max_image_bytes: 5 * 1024 * 1024,
        }
    }
}

/// An image file that could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ImageError {
    /// It is larger than the limit.
    #[error("it is larger than {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// Its bytes are not a PNG, JPEG, GIF or WebP image.
    #[error("it is not a PNG, JPEG, GIF or WebP image")]
    NotAnImage,
    /// It could not be opened as a regular file of the thread's folders.
    #[error("it {0}")]
    Refused(#[from] Refused),
    /// It could not be read.
    #[error("it could not be read: {0}")]
    Io(#[from] std::io::Error),
}

/// The images the model asked to see with the tool, until the next request shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ViewedImages {
    /// Paths as the model wrote them (`/mnt/user-data/...`).
    pub(crate) paths: Vec<String>,
}

impl Extension for ViewedImages {
    const KEY: &'static str = "viewed_images";
}

#[derive(Deserialize)]
struct Arguments {
    image_path: String,
}

/// Sends images to a vision model.
#[derive(Debug, Clone)]
pub(crate) struct ViewImageMiddleware {
    max_images: usize,
    max_image_bytes: u64,
}

impl ViewImageMiddleware {
    /// The middleware, or `None` when it is disabled or the model has no vision.
    pub(crate) fn from_config(cfg: &ViewImageConfig, vision: bool) -> Option<Self> {
        (cfg.enabled && vision).then(|| Self {
            max_images: cfg.max_images.max(1),
            max_image_bytes: cfg.max_image_bytes.max(1),
        })
    }

    /// The image `relative` of `area` as a `data:` URL: opened beneath the area's folder with
    /// links refused, checked and read on that open file.
    async fn data_url(
        &self,
        folders: &ThreadFolders,
        area: Area,
        relative: &Path,
    ) -> Result<String, ImageError> {
        let folders = folders.clone();
        let relative = relative.to_path_buf();
        let max_bytes = self.max_image_bytes;
        let bytes = tokio::task::spawn_blocking(move || -> Result<Vec<u8>, ImageError> {
            let opened = folders
                .open_area(area)?
                .open_file(&relative, max_bytes)
                .map_err(|e| match e {
                    Refused::TooLarge { .. } => ImageError::TooLarge { limit: max_bytes },
                    other => ImageError::Refused(other),
                })?;
            let mut bytes = Vec::new();
            // One byte more than allowed tells a file that grew since it was checked.
            opened.file.take(max_bytes + 1).read_to_end(&mut bytes)?;
            Ok(bytes)
        })
        .await
        .map_err(|e| ImageError::Io(std::io::Error::other(e.to_string())))??;
        if bytes.len() as u64 > self.max_image_bytes {
            return Err(ImageError::TooLarge {
                limit: self.max_image_bytes,
            });
        }
        data_url(&bytes)
    }

    /// Image parts for the current message's image attachments.
    async fn upload_parts(&self, cx: &RunContext<'_>) -> Vec<ContentPart> {
        let Some(folders) = cx.folders.as_ref() else {
            return Vec::new();
        };
        let uploads = folders.uploads();
        let mut parts = Vec::new();
        for file in &cx.input.attachments {
            if parts.len() >= self.max_images {
                tracing::debug!(thread = %cx.thread.id, "more images than max_images; the rest are listed only");
                break;
            }
            // Only files in the thread's uploads folder, where the turn runner put them.
            if file.path != uploads.join(&file.name) {
                continue;
            }
            if !looks_like_image(file.media_type.as_deref(), &file.name) {
                continue;
            }
            if file.size > self.max_image_bytes {
                tracing::debug!(thread = %cx.thread.id, size = file.size, "image too large to show; listed only");
                continue;
            }
            match self
                .data_url(folders, Area::Uploads, Path::new(&file.name))
                .await
            {
                Ok(url) => parts.push(ContentPart::Image { url }),
                Err(e) => {
                    tracing::debug!(thread = %cx.thread.id, error = %e, "upload not shown as an image");
                }
            }
        }
        parts
    }

    /// Image parts for the paths the model asked to view, with the paths they show.
    async fn viewed_parts(&self, cx: &RunContext<'_>) -> (Vec<String>, Vec<ContentPart>) {
        let (Some(viewed), Some(folders)) = (
            cx.thread.extensions.get::<ViewedImages>(),
            cx.folders.as_ref(),
        ) else {
            return (Vec::new(), Vec::new());
        };
        let mut shown = Vec::new();
        let mut parts = Vec::new();
        for path in viewed.paths.iter().take(self.max_images) {
            let Ok(resolved) = folders.resolve(path, PathAccess::Read) else {
                continue;
            };
            match self
                .data_url(folders, resolved.area, &resolved.relative)
                .await
            {
                Ok(url) => {
                    shown.push(path.clone());
                    parts.push(ContentPart::Image { url });
                }
                Err(e) => {
                    tracing::debug!(thread = %cx.thread.id, error = %e, "viewed image not shown");
                }
            }
        }
        (shown, parts)
    }

    /// Checks a `view_image` call; the refusal, or the path to keep.
    async fn check_call(&self, cx: &RunContext<'_>, call: &ToolCall) -> Result<String, ToolOutput> {
        let arguments: Arguments = intercepted_arguments(call)?;
        let Some(folders) = cx.folders.as_ref() else {
            return Err(ToolOutput::error(
                "Error: this thread has no folders to read images from.",
            ));
        };
        let resolved = folders
            .resolve(&arguments.image_path, PathAccess::Read)
            .map_err(|e| ToolOutput::error(format!("Error: {e}")))?;
        self.data_url(folders, resolved.area, &resolved.relative)
            .await
            .map_err(|e| {
                ToolOutput::error(format!(
                    "Error: {} cannot be viewed: {e}.",
                    arguments.image_path
                ))
            })?;
        Ok(arguments.image_path)
    }
}

/// The tool as the model sees it; the middleware answers its calls.
fn view_image_tool() -> InterceptedTool {
    InterceptedTool::new(
        ToolSpec {
            name: TOOL_NAME.to_owned(),
            description: "Look at an image file (PNG, JPEG, GIF or WebP) under \
                /mnt/user-data: it is shown to you with your next step."
                .to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "image_path": {
                        "type": "string",
                        "description": "The image's path, e.g. /mnt/user-data/workspace/chart.png"
                    }
                },
                "required": ["image_path"]
            }),
        },
        "view_image is unavailable: the model has no vision.",
    )
}

#[async_trait::async_trait]
impl Middleware for ViewImageMiddleware {
    fn name(&self) -> &'static str {
        "view_image"
    }

    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        vec![Arc::new(view_image_tool())]
    }

    async fn before_model(
        &self,
        cx: &mut RunContext<'_>,
        request: &mut ModelRequest,
    ) -> Result<(), MiddlewareError> {
        let uploads = self.upload_parts(cx).await;
        if !uploads.is_empty() {
            match cx
                .turn_position(request)
                .and_then(|i| request.messages.get_mut(i))
            {
                Some(ChatMessage::User { parts, .. }) => parts.extend(uploads),
                _ => request.messages.push(ChatMessage::User {
                    content: "The images the user sent with their message:".to_owned(),
                    parts: uploads,
                    authored: None,
                }),
            }
        }
        let (paths, viewed) = self.viewed_parts(cx).await;
        if !viewed.is_empty() {
            request.messages.push(ChatMessage::User {
                content: format!("The images you asked to view: {}", paths.join(", ")),
                parts: viewed,
                authored: None,
            });
        }
        Ok(())
    }

    async fn after_model(
        &self,
        cx: &mut RunContext<'_>,
        _response: &mut ModelResponse,
    ) -> Result<(), MiddlewareError> {
        // Shown once: the request that just ended had them.
        if cx.thread.extensions.get::<ViewedImages>().is_some() {
            cx.thread.extensions.remove::<ViewedImages>();
        }
        Ok(())
    }

    async fn before_tool(
        &self,
        cx: &mut RunContext<'_>,
        call: &ToolCall,
        refused: Option<&ToolOutput>,
    ) -> Result<ToolDecision, MiddlewareError> {
        if call.name != TOOL_NAME || refused.is_some() {
            return Ok(ToolDecision::Run);
        }
        let path = match self.check_call(cx, call).await {
            Ok(path) => path,
            Err(refusal) => return Ok(ToolDecision::Skip(refusal)),
        };
        let mut viewed = cx
            .thread
            .extensions
            .get::<ViewedImages>()
            .unwrap_or_default();
        if viewed.paths.len() >= self.max_images {
            return Ok(ToolDecision::Skip(ToolOutput::error(format!(
                "Error: at most {} images can be viewed at once; look at these first.",
                self.max_images
            ))));
        }
        if !viewed.paths.contains(&path) {
            viewed.paths.push(path.clone());
        }
        cx.thread.extensions.set(&viewed);
        Ok(ToolDecision::Skip(ToolOutput::ok(format!(
            "{path} is shown to you with your next step."
        ))))
    }
}

/// Whether a file may be an image by its declared media type or its extension; its bytes
/// decide.
fn looks_like_image(media_type: Option<&str>, name: &str) -> bool {
    let declared = media_type.is_some_and(|t| {
        matches!(
            t.trim().to_ascii_lowercase().as_str(),
            "image/png" | "image/jpeg" | "image/jpg" | "image/gif" | "image/webp"
        )
    });
    let extension = Path::new(name)
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| {
            matches!(
                e.to_ascii_lowercase().as_str(),
                "png" | "jpg" | "jpeg" | "gif" | "webp"
            )
        });
    declared || extension
}

/// The media type the bytes' signature gives, if they are a PNG, JPEG, GIF or WebP image.
fn sniff(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(b"WEBP") {
        Some("image/webp")
    } else {
        None
    }
}

/// `bytes` as a `data:` URL with the media type its signature gives.
fn data_url(bytes: &[u8]) -> Result<String, ImageError> {
    let media_type = sniff(bytes).ok_or(ImageError::NotAnImage)?;
    Ok(format!(
        "data:{media_type};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    ))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::agent::input::{Attachment, RunInput};
    use crate::agent::model::scripted::ScriptedModel;
    use crate::agent::thread::ThreadState;

    /// The smallest valid PNG signature and a little more.
    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

    fn middleware() -> ViewImageMiddleware {
        ViewImageMiddleware::from_config(&ViewImageConfig::default(), true).unwrap()
    }

    struct Setup {
        _dir: tempfile::TempDir,
        folders: ThreadFolders,
    }

    async fn setup(files: &[(&str, &[u8])]) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let folders = ThreadFolders::new(dir.path(), "t").unwrap();
        folders.create().await.unwrap();
        for (name, bytes) in files {
            std::fs::write(folders.uploads().join(name), bytes).unwrap();
        }
        Setup { _dir: dir, folders }
    }

    fn attachment(folders: &ThreadFolders, name: &str, media_type: Option<&str>) -> Attachment {
        let path: PathBuf = folders.uploads().join(name);
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        Attachment {
            name: name.into(),
            media_type: media_type.map(str::to_owned),
            size,
            path,
        }
    }

    async fn request_with(
        mw: &ViewImageMiddleware,
        setup: &Setup,
        attachments: Vec<Attachment>,
    ) -> ModelRequest {
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        thread.messages.push(ChatMessage::user("earlier"));
        thread.messages.push(ChatMessage::assistant("ok"));
        thread
            .messages
            .push(ChatMessage::user("what is in this picture?"));
        let input = RunInput {
            attachments,
            ..RunInput::text("api", "u", "what is in this picture?")
        };
        let model = Arc::new(ScriptedModel::new(Vec::new()));
        let mut request = ModelRequest {
            messages: std::iter::once(ChatMessage::system("sys"))
                .chain(thread.messages.iter().cloned())
                .collect(),
            tools: Vec::new(),
        };
        let mut cx = RunContext::new(&mut thread, &input, model.clone());
        cx.folders = Some(setup.folders.clone());
        mw.before_model(&mut cx, &mut request).await.unwrap();
        request
    }

    #[tokio::test]
    async fn image_uploads_become_data_url_parts_of_the_current_message() {
        let gif = b"GIF89a\x01\x00\x01\x00";
        let setup = setup(&[
            ("photo.png", PNG),
            ("anim.bin", gif),
            ("notes.txt", b"plain text"),
            ("fake.png", b"not really a png"),
        ])
        .await;
        let f = &setup.folders;
        let request = request_with(
            &middleware(),
            &setup,
            vec![
                attachment(f, "photo.png", Some("image/png")),
                attachment(f, "anim.bin", Some("image/gif")),
                attachment(f, "notes.txt", Some("text/plain")),
                attachment(f, "fake.png", None),
            ],
        )
        .await;
        assert_eq!(request.messages.len(), 4, "no message added");
        let ChatMessage::User { content, parts, .. } = &request.messages[3] else {
            panic!("{request:?}");
        };
        assert_eq!(content, "what is in this picture?");
        let expected_png = format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(PNG)
        );
        assert_eq!(
            parts,
            &vec![
                ContentPart::Image { url: expected_png },
                ContentPart::Image {
                    url: format!(
                        "data:image/gif;base64,{}",
                        base64::engine::general_purpose::STANDARD.encode(gif)
                    )
                },
            ],
            "text and mislabelled files are left out"
        );
        // The earlier user message is untouched.
        assert_eq!(request.messages[1], ChatMessage::user("earlier"));
    }

    #[tokio::test]
    async fn images_over_the_limits_are_left_out() {
        let big = [PNG, &[0u8; 100]].concat();
        let setup = setup(&[("a.png", PNG), ("b.png", PNG), ("big.png", &big)]).await;
        let f = &setup.folders;
        let mw = ViewImageMiddleware::from_config(
            &ViewImageConfig {
                enabled: true,
                max_images: 1,
                max_image_bytes: 50,
            },
            true,
        )
        .unwrap();
        let request = request_with(
            &mw,
            &setup,
            vec![
                attachment(f, "big.png", Some("image/png")),
                attachment(f, "a.png", Some("image/png")),
                attachment(f, "b.png", Some("image/png")),
            ],
        )
        .await;
        let ChatMessage::User { parts, .. } = &request.messages[3] else {
            panic!("{request:?}");
        };
        assert_eq!(parts.len(), 1, "one image at most, the big one skipped");
    }

    #[test]
    fn no_vision_no_middleware() {
        assert!(ViewImageMiddleware::from_config(&ViewImageConfig::default(), false).is_none());
        let off = ViewImageConfig {
            enabled: false,
            ..ViewImageConfig::default()
        };
        assert!(ViewImageMiddleware::from_config(&off, true).is_none());
    }

    #[test]
    fn images_are_recognised_by_their_bytes() {
        assert_eq!(sniff(PNG), Some("image/png"));
        assert_eq!(sniff(&[0xFF, 0xD8, 0xFF, 0xE0]), Some("image/jpeg"));
        assert_eq!(sniff(b"GIF87a...."), Some("image/gif"));
        assert_eq!(sniff(b"RIFF\0\0\0\0WEBPVP8 "), Some("image/webp"));
        assert_eq!(sniff(b"RIFF\0\0\0\0WAVEfmt "), None);
        assert_eq!(sniff(b"\x89PNG"), None, "a cut signature is not enough");
        assert!(looks_like_image(Some("IMAGE/JPEG"), "x"));
        assert!(looks_like_image(None, "photo.WebP"));
        assert!(!looks_like_image(Some("application/pdf"), "doc.pdf"));
    }

    #[tokio::test]
    async fn the_view_image_tool_shows_an_image_once_with_the_next_request() {
        let setup = setup(&[]).await;
        std::fs::write(setup.folders.workspace().join("chart.png"), PNG).unwrap();
        std::fs::write(setup.folders.workspace().join("notes.txt"), b"text").unwrap();
        let mw = middleware();
        let mut thread = ThreadState::new("t".into(), "c".into(), 0, 0);
        thread.messages.push(ChatMessage::user("look at the chart"));
        let input = RunInput::text("api", "u", "look at the chart");
        let model = Arc::new(ScriptedModel::new(Vec::new()));
        let mut cx = RunContext::new(&mut thread, &input, model.clone());
        cx.folders = Some(setup.folders.clone());
        let call = |path: &str| ToolCall {
            id: "c1".into(),
            name: TOOL_NAME.into(),
            arguments: json!({ "image_path": path }).to_string(),
        };

        for (bad, why) in [
            ("/etc/passwd", "outside"),
            ("/mnt/user-data/workspace/notes.txt", "not a PNG"),
            ("/mnt/user-data/workspace/missing.png", "does not exist"),
        ] {
            let decision = mw.before_tool(&mut cx, &call(bad), None).await.unwrap();
            let ToolDecision::Skip(output) = decision else {
                panic!("{bad} ran");
            };
            assert!(
                output.is_error && output.content.contains(why),
                "{output:?}"
            );
        }
        let decision = mw
            .before_tool(&mut cx, &call("/mnt/user-data/workspace/chart.png"), None)
            .await
            .unwrap();
        assert_eq!(
            decision,
            ToolDecision::Skip(ToolOutput::ok(
                "/mnt/user-data/workspace/chart.png is shown to you with your next step."
            ))
        );

        let mut request = ModelRequest {
            messages: vec![ChatMessage::user("look at the chart")],
            tools: Vec::new(),
        };
        mw.before_model(&mut cx, &mut request).await.unwrap();
        let Some(ChatMessage::User { content, parts, .. }) = request.messages.last() else {
            panic!("{request:?}");
        };
        assert!(content.contains("chart.png"), "{content}");
        assert!(
            matches!(&parts[..], [ContentPart::Image { url }] if url.starts_with("data:image/png;base64,"))
        );
        // After the model answered, the image is not sent again.
        let mut response = ScriptedModel::text("a chart").unwrap();
        mw.after_model(&mut cx, &mut response).await.unwrap();
        let mut again = ModelRequest {
            messages: vec![ChatMessage::user("look at the chart")],
            tools: Vec::new(),
        };
        mw.before_model(&mut cx, &mut again).await.unwrap();
        assert_eq!(again.messages.len(), 1);
    }
}
