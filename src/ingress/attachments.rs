//! Attachments: the files that came with a message, fetched into the thread's `uploads` folder.
//!
//! The inbox holds only references (DESIGN §2): the turn fetches the bytes, never the ack. Each
//! file is decoded (inline, from the API) or downloaded through its channel, retried while the
//! failure may pass, checked against the size cap again (a platform may under-report a size),
//! and written owner-only under a safe name: to a temporary name first, renamed into place, so
//! a crash never leaves half a file under the real name. The same turn run again after a crash
//! finds the files it already wrote and reuses them; a different file of the same name becomes
//! `name (2).ext`.
//!
//! Everything about a file is hostile until checked: its name (path separators, control and
//! bidi characters, leading dots, length), its declared size, its actual size, and how long
//! the platform takes to hand it over.

use std::ffi::OsStr;
use std::io::{self, Read as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use antler_channel::{AttachmentRef, AttachmentSource, Channel, ChannelError};
use base64::Engine as _;
use tokio::time::Instant;

use crate::agent::input::{Attachment, ThreadFolders};
use crate::agent::tools::paths::Area;
use crate::beneath::{Dir, EntryKind, Refused};
use crate::retry::RetryPolicy;
use crate::units::human_size;

/// The most files one message may bring.
pub(crate) const MAX_ATTACHMENTS: usize = 10;

/// The longest stored name, in bytes. File systems allow 255; this leaves room for ` (n)` and
/// the temporary name, and keeps names readable in a prompt.
const MAX_NAME_BYTES: usize = 120;

/// The longest extension kept whole when a long name is shortened (`.tar`, `.jpeg`, `.docx`).
const MAX_EXTENSION_BYTES: usize = 16;

/// How many ` (n)` variants of a name are tried before giving up.
const MAX_NAME_VARIANTS: u32 = 1000;

/// The name of a file whose own name leaves nothing usable.
const FALLBACK_NAME: &str = "file";

/// Downloads: attempts and backoff, the time one attempt may take, and the time all downloads
/// of one message may take together (waits included).
const FETCH_RETRY: RetryPolicy = RetryPolicy {
    max_attempts: 4,
    backoff_base: Duration::from_millis(500),
    backoff_max: Duration::from_secs(8),
};
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(120);
const FETCH_BUDGET: Duration = Duration::from_secs(300);

/// Why the files of a message could not be made ready. Names are the files' safe names, so
/// every message may be shown; [`AttachmentError::user_message`] is what the chat gets.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AttachmentError {
    /// The file is over the cap, by its declared size, its actual size or the platform's word
    /// (`size` is `None` then).
    #[error("`{name}` is larger than the limit of {limit} bytes{}", size.map(|s| format!(" ({s} bytes)")).unwrap_or_default())]
    TooLarge {
        name: String,
        size: Option<u64>,
        limit: u64,
    },
    /// The message came through a channel that cannot download files.
    #[error("the channel cannot fetch files (`{name}`)")]
    Unsupported { name: String },
    /// The platform failed to hand the file over (after retrying what could be retried).
    #[error("could not download `{name}`: {source}")]
    Fetch {
        name: String,
        #[source]
        source: ChannelError,
    },
    /// Inline data that is not standard base64 (the API checks this before accepting, so this
    /// means a stored event was damaged).
    #[error("`{name}` is not valid base64")]
    Invalid { name: String },
    /// The thread's folders could not be made.
    #[error("could not create the thread's folders: {0}")]
    Folders(#[source] io::Error),
    /// The file could not be written.
    #[error("could not store `{name}`: {source}")]
    Store {
        name: String,
        #[source]
        source: io::Error,
    },
}

impl AttachmentError {
    /// What to tell the user: which file, what went wrong and what to do. Never the platform's
    /// own error text, which may be anything.
    pub(crate) fn user_message(&self) -> String {
        match self {
            Self::TooLarge {
                name,
                size: Some(size),
                limit,
            } => format!(
                "⚠️ `{name}` is {}; antler accepts files up to {}. Send a smaller file.",
                human_size(*size),
                human_size(*limit),
            ),
            Self::TooLarge {
                name,
                size: None,
                limit,
            } => format!(
                "⚠️ `{name}` is larger than the {} antler accepts. Send a smaller file.",
                human_size(*limit),
            ),
            Self::Unsupported { name } => format!(
                "⚠️ `{name}` was not read: this channel cannot fetch files. Paste its content as text instead."
            ),
            Self::Fetch {
                name,
                source: ChannelError::RateLimited { .. },
            } => format!(
                "⚠️ could not download `{name}` (the platform asked antler to slow down); send it again in a minute."
            ),
            Self::Fetch { name, .. } => {
                format!("⚠️ could not download `{name}` (the platform failed); send it again.")
            }
            Self::Invalid { name } => {
                format!(
                    "⚠️ `{name}` arrived damaged (its data is not valid base64); send it again."
                )
            }
            Self::Folders(_) => "⚠️ antler could not store the files sent with this message; \
                 the details are in antler's log. Try again later."
                .to_owned(),
            Self::Store { name, .. } => format!(
                "⚠️ antler could not store `{name}`; the details are in antler's log. Try again later."
            ),
        }
    }
}

/// Why inline data was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum InlineError {
    #[error("not valid standard base64")]
    NotBase64,
    /// `size` is the decoded size (estimated from the length when too large to decode).
    #[error("{size} bytes, over the limit of {limit}")]
    TooLarge { size: u64, limit: u64 },
}

/// Decodes standard (RFC 4648, padded) base64 of at most `max_bytes` decoded bytes. Data far
/// over the cap is refused by its length, before anything is decoded.
pub(crate) fn decode_inline(data: &str, max_bytes: u64) -> Result<Vec<u8>, InlineError> {
    let estimate = u64::try_from(data.len() / 4)
        .unwrap_or(u64::MAX)
        .saturating_mul(3);
    // Padding makes the estimate at most 2 bytes over the real size.
    if estimate.saturating_sub(2) > max_bytes {
        return Err(InlineError::TooLarge {
            size: estimate,
            limit: max_bytes,
        });
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|_| InlineError::NotBase64)?;
    let size = len_u64(&bytes);
    if size > max_bytes {
        return Err(InlineError::TooLarge {
            size,
            limit: max_bytes,
        });
    }
    Ok(bytes)
}

/// `raw` made safe to name a file in `uploads/`, or `None` when nothing usable is left of it.
///
/// Only the last path segment is kept (either separator); control, bidi and zero-width
/// characters are dropped; characters that break file systems or Markdown (`<>:"|?*` and the
/// backtick) become `_`; leading dots and surrounding spaces go (no hidden files, no `..`);
/// a name over [`MAX_NAME_BYTES`] is shortened, keeping its extension.
pub(crate) fn safe_file_name(raw: &str) -> Option<String> {
    let base = raw
        .split(['/', '\\'])
        .rev()
        .find(|segment| !segment.trim().is_empty())?;
    let cleaned: String = base
        .chars()
        .filter(|c| !is_invisible(*c))
        .map(|c| if "<>:\"|?*`".contains(c) { '_' } else { c })
        .collect();
    let trimmed = cleaned
        .trim_start_matches(|c: char| c == '.' || c.is_whitespace())
        .trim_end_matches(|c: char| c == '.' || c.is_whitespace());
    if trimmed.is_empty() {
        return None;
    }
    Some(shorten(trimmed))
}

/// Characters that must not reach a file name: control characters, and those that change how
/// a name reads without showing (bidi overrides that fake an extension, zero-width marks).
fn is_invisible(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{200B}'..='\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{2069}'
                | '\u{FEFF}'
        )
}

/// `name` split into stem and extension (without the dot), when it has a short one.
fn split_extension(name: &str) -> (&str, Option<&str>) {
    match name.rsplit_once('.') {
        Some((stem, extension))
            if !stem.is_empty()
                && !extension.is_empty()
                && extension.len() <= MAX_EXTENSION_BYTES
                && extension.chars().all(char::is_alphanumeric) =>
        {
            (stem, Some(extension))
        }
        _ => (name, None),
    }
}

/// The longest prefix of `text` of at most `max` bytes, cut at a character boundary.
fn prefix(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default()
}

/// `name` within [`MAX_NAME_BYTES`], its extension kept.
fn shorten(name: &str) -> String {
    if name.len() <= MAX_NAME_BYTES {
        return name.to_owned();
    }
    match split_extension(name) {
        (stem, Some(extension)) => {
            let stem = prefix(stem, MAX_NAME_BYTES - extension.len() - 1).trim_end();
            format!("{stem}.{extension}")
        }
        (_, None) => prefix(name, MAX_NAME_BYTES).trim_end().to_owned(),
    }
}

/// The `n`th name for `name`: itself, then `name (2).ext`, `name (3).ext`, ...
fn numbered(name: &str, n: u32) -> String {
    if n <= 1 {
        return name.to_owned();
    }
    match split_extension(name) {
        (stem, Some(extension)) => format!("{stem} ({n}).{extension}"),
        (stem, None) => format!("{stem} ({n})"),
    }
}

fn len_u64(bytes: &[u8]) -> u64 {
    u64::try_from(bytes.len()).unwrap_or(u64::MAX)
}

/// A media type as given, when it looks like one (`type/subtype`, printable ASCII, short);
/// anything else is dropped rather than passed on.
pub(crate) fn clean_media_type(media_type: Option<&str>) -> Option<String> {
    let value = media_type?.trim();
    let plausible = value.len() <= 127
        && value.contains('/')
        && value.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
    plausible.then(|| value.to_owned())
}

/// Fetches the files of one message into `folders.uploads()`, in order.
///
/// Creates the thread's folders first. Inline files are decoded; the others are downloaded
/// through `channel` (`None`, or a channel without the capability, fails with
/// [`AttachmentError::Unsupported`]), with retries while the failure may pass: rate limits
/// after the platform's `retry_after`, transient failures with backoff, all downloads within
/// one time budget. Nothing over `max_bytes` is kept, whatever size the platform declared.
/// Stops at the first file that fails; the files stored before it stay and are reused when
/// the turn runs again.
pub(crate) async fn fetch_attachments(
    channel: Option<&dyn Channel>,
    refs: &[AttachmentRef],
    folders: &ThreadFolders,
    max_bytes: u64,
) -> Result<Vec<Attachment>, AttachmentError> {
    folders.create().await.map_err(AttachmentError::Folders)?;
    let deadline = Instant::now() + FETCH_BUDGET;
    let mut stored = Vec::with_capacity(refs.len());
    for attachment in refs {
        let name = safe_file_name(&attachment.name).unwrap_or_else(|| FALLBACK_NAME.to_owned());
        let bytes = load(channel, attachment, &name, max_bytes, deadline).await?;
        let size = len_u64(&bytes);
        let (name, path) =
            store_file(folders, &name, bytes)
                .await
                .map_err(|source| AttachmentError::Store {
                    name: name.clone(),
                    source,
                })?;
        tracing::debug!(file = %name, size, "attachment stored");
        stored.push(Attachment {
            name,
            media_type: clean_media_type(attachment.media_type.as_deref()),
            size,
            path,
        });
    }
    Ok(stored)
}

/// The bytes of one file, within the cap.
async fn load(
    channel: Option<&dyn Channel>,
    attachment: &AttachmentRef,
    name: &str,
    max_bytes: u64,
    deadline: Instant,
) -> Result<Vec<u8>, AttachmentError> {
    let too_large = |size| AttachmentError::TooLarge {
        name: name.to_owned(),
        size,
        limit: max_bytes,
    };
    if let Some(size) = attachment.size
        && size > max_bytes
    {
        return Err(too_large(Some(size)));
    }
    let bytes = match &attachment.source {
        AttachmentSource::Inline { data_base64 } => {
            decode_inline(data_base64, max_bytes).map_err(|e| match e {
                InlineError::NotBase64 => AttachmentError::Invalid {
                    name: name.to_owned(),
                },
                InlineError::TooLarge { size, .. } => too_large(Some(size)),
            })?
        }
        AttachmentSource::Platform { .. } | AttachmentSource::Url { .. } => {
            let Some(channel) = channel else {
                return Err(AttachmentError::Unsupported {
                    name: name.to_owned(),
                });
            };
            download(channel, attachment, name, max_bytes, deadline).await?
        }
    };
    // Again on the bytes themselves: a platform may declare less than it sends.
    let size = len_u64(&bytes);
    if size > max_bytes {
        return Err(too_large(Some(size)));
    }
    Ok(bytes)
}

/// Downloads one file through `channel`, retrying what may pass, until `deadline`.
async fn download(
    channel: &dyn Channel,
    attachment: &AttachmentRef,
    name: &str,
    max_bytes: u64,
    deadline: Instant,
) -> Result<Vec<u8>, AttachmentError> {
    let channel_name = channel.name();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let left = deadline.saturating_duration_since(Instant::now());
        let limit = left.min(ATTEMPT_TIMEOUT);
        let result = match tokio::time::timeout(
            limit,
            channel.fetch_attachment(attachment, max_bytes),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(ChannelError::Transient(format!(
                "no file within {} seconds",
                limit.as_secs()
            ))),
        };
        let error = match result {
            Ok(bytes) => return Ok(bytes),
            Err(ChannelError::TooLarge { .. }) => {
                return Err(AttachmentError::TooLarge {
                    name: name.to_owned(),
                    size: None,
                    limit: max_bytes,
                });
            }
            Err(ChannelError::Unsupported) => {
                return Err(AttachmentError::Unsupported {
                    name: name.to_owned(),
                });
            }
            Err(error) => error,
        };
        let wait = match &error {
            ChannelError::RateLimited { retry_after } => {
                (*retry_after).max(FETCH_RETRY.backoff(attempt))
            }
            _ => FETCH_RETRY.backoff(attempt),
        };
        let in_time = Instant::now() + wait < deadline;
        if !error.is_retryable() || attempt >= FETCH_RETRY.max_attempts || !in_time {
            // The URL is never logged: some platforms put the bot's token in it.
            tracing::warn!(channel = channel_name, file = %name, attempt, %error, "cannot download an attachment");
            return Err(AttachmentError::Fetch {
                name: name.to_owned(),
                source: error,
            });
        }
        tracing::info!(channel = channel_name, file = %name, attempt, ?wait, %error, "downloading an attachment failed; retrying");
        tokio::time::sleep(wait).await;
    }
}

/// Stores `bytes` in the thread's uploads as `name`, or as the first free `name (n)`; a file
/// already there with exactly these bytes is reused. Returns the name and path used.
///
/// Everything happens beneath a handle on the uploads folder with links refused
/// ([`crate::beneath`]): a name taken by a link or a folder is skipped, never followed, and a
/// new file is written to a temporary name, synced, then renamed into place, so a crash never
/// leaves half a file under the real name.
async fn store_file(
    folders: &ThreadFolders,
    name: &str,
    bytes: Vec<u8>,
) -> io::Result<(String, PathBuf)> {
    let folders = folders.clone();
    let name = name.to_owned();
    tokio::task::spawn_blocking(move || {
        let uploads = folders.open_area(Area::Uploads).map_err(Refused::into_io)?;
        for n in 1..=MAX_NAME_VARIANTS {
            let candidate = numbered(&name, n);
            match uploads.stat(Path::new(&candidate)) {
                // Only a regular file can be ours; a link or a folder the agent made is skipped.
                Ok(entry) if entry.kind == EntryKind::File && entry.size == len_u64(&bytes) => {
                    if same_content(&uploads, &candidate, &bytes) {
                        let path = folders.uploads().join(&candidate);
                        return Ok((candidate, path));
                    }
                }
                Ok(_) => {}
                Err(Refused::NotFound) => {
                    uploads
                        .replace(OsStr::new(&candidate), &bytes, true)
                        .map_err(Refused::into_io)?;
                    let path = folders.uploads().join(&candidate);
                    return Ok((candidate, path));
                }
                Err(e) => return Err(e.into_io()),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{MAX_NAME_VARIANTS} files of this name exist already"),
        ))
    })
    .await
    .map_err(|e| io::Error::other(e.to_string()))?
}

/// Whether the file `name` of `uploads` holds exactly `bytes` (read in chunks, not whole).
fn same_content(uploads: &Dir, name: &str, bytes: &[u8]) -> bool {
    let Ok(opened) = uploads.open_file(Path::new(name), len_u64(bytes)) else {
        return false;
    };
    let mut file = opened.file;
    let mut buffer = vec![0u8; 64 * 1024];
    let mut rest = bytes;
    loop {
        let read = match file.read(&mut buffer) {
            Ok(read) => read,
            Err(_) => return false,
        };
        let Some(chunk) = buffer.get(..read) else {
            return false;
        };
        if read == 0 {
            return rest.is_empty();
        }
        match rest.strip_prefix(chunk) {
            Some(after) => rest = after,
            None => return false,
        }
    }
}

#[cfg(test)]
mod tests;
