//! What a run is given: the user's message, who wrote it, the files that came with it and
//! what the channel can show, and the thread's folders on disk.
//!
//! The runtime never sees a platform: the turn runner turns an inbound event into a
//! [`RunInput`], with attachments already fetched into the thread's `uploads` folder.

use std::path::{Path, PathBuf};

/// A user's role, which decides what tools it may use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Role {
    /// An operator: named in its channel's `admins` list or holding an admin token.
    Admin,
    /// Everyone else.
    #[default]
    User,
}

/// Who wrote the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Author {
    /// The channel it came through (`api`, `telegram`, ...).
    pub(crate) channel: String,
    /// The platform's user id.
    pub(crate) user_id: String,
    /// A display name, when the platform gives one.
    pub(crate) name: Option<String>,
    /// What the user may do.
    pub(crate) role: Role,
}

impl Author {
    /// `<channel>:<user id>`: the key of the user's memory and usage.
    pub(crate) fn key(&self) -> String {
        format!("{}:{}", self.channel, self.user_id)
    }
}

/// A file that came with the message, already stored in the thread's `uploads` folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attachment {
    /// The file name as stored (made safe: no separators, no leading dots).
    pub(crate) name: String,
    /// Its media type, when known (`image/png`).
    pub(crate) media_type: Option<String>,
    /// Its size in bytes.
    pub(crate) size: u64,
    /// Where it is on disk.
    pub(crate) path: PathBuf,
}

/// What the channel the message came through can do, and how the user is talking.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ChannelFlags {
    /// The message was written in a group chat (others may read the answer).
    pub(crate) group: bool,
    /// The channel can deliver files back.
    pub(crate) files: bool,
    /// The channel can show images.
    pub(crate) images: bool,
    /// Someone is waiting for the answer as it is written (a chat window, a streaming client).
    pub(crate) interactive: bool,
}

/// One run's input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunInput {
    /// What the user wrote.
    pub(crate) text: String,
    /// Who wrote it.
    pub(crate) author: Author,
    /// Files that came with it, fetched.
    pub(crate) attachments: Vec<Attachment>,
    /// What the channel can do.
    pub(crate) flags: ChannelFlags,
    /// The turn's trace id: in its log lines and in those of its subagents.
    pub(crate) trace_id: String,
}

impl RunInput {
    /// A plain text message from `user_id` on `channel`, with no attachments.
    #[cfg(test)]
    pub(crate) fn text(channel: &str, user_id: &str, text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            author: Author {
                channel: channel.to_owned(),
                user_id: user_id.to_owned(),
                name: None,
                role: Role::User,
            },
            attachments: Vec::new(),
            flags: ChannelFlags::default(),
            trace_id: "trace-test".to_owned(),
        }
    }
}

/// A thread's folders: `<store>/threads/<id>/{uploads,workspace,outputs}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ThreadFolders {
    root: PathBuf,
}

/// A thread id that cannot name a folder.
#[derive(Debug, thiserror::Error)]
#[error("thread id {0:?} cannot name a folder")]
pub(crate) struct UnsafeThreadId(String);

impl ThreadFolders {
    /// The folders of `thread_id` under `data_root` (the store's directory). Thread ids are
    /// antler's own, but one that could leave `data_root` is refused all the same.
    pub(crate) fn new(data_root: &Path, thread_id: &str) -> Result<Self, UnsafeThreadId> {
        let safe = !thread_id.is_empty()
            && thread_id.len() <= 128
            && thread_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !safe {
            return Err(UnsafeThreadId(thread_id.to_owned()));
        }
        Ok(Self {
            root: data_root.join("threads").join(thread_id),
        })
    }

    /// The thread's own folder.
    #[cfg(test)]
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// Files the user sent.
    pub(crate) fn uploads(&self) -> PathBuf {
        self.root.join("uploads")
    }

    /// The agent's scratch space.
    pub(crate) fn workspace(&self) -> PathBuf {
        self.root.join("workspace")
    }

    /// Files the agent made for the user.
    pub(crate) fn outputs(&self) -> PathBuf {
        self.root.join("outputs")
    }

    /// Scratch space for the shell's commands (`TMPDIR`) where the sandbox has no private
    /// `/tmp`.
    pub(crate) fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// The store's folder the thread's folder is in.
    pub(crate) fn data_root(&self) -> PathBuf {
        self.root
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }

    /// Creates the folders (owner-only), if they are not there yet. When the shell's commands
    /// run as another user ([`crate::sandbox::folder_owner`]), the folders it uses are made
    /// that user's, so it can write where it may.
    pub(crate) async fn create(&self) -> std::io::Result<()> {
        for dir in [self.uploads(), self.workspace(), self.outputs(), self.tmp()] {
            let mut builder = tokio::fs::DirBuilder::new();
            builder.recursive(true);
            #[cfg(unix)]
            builder.mode(0o700);
            builder.create(&dir).await?;
        }
        if let Some((uid, gid)) = crate::sandbox::folder_owner() {
            let root = self.root.clone();
            // Through handles, links refused, like every other change inside the folders.
            let _ = tokio::task::spawn_blocking(move || {
                let thread = crate::beneath::Dir::open_trusted(&root)?;
                for name in ["uploads", "workspace", "outputs", "tmp"] {
                    thread.open_dir(Path::new(name))?.chown(
                        Some(rustix::fs::Uid::from_raw(uid)),
                        Some(rustix::fs::Gid::from_raw(gid)),
                    )?;
                }
                Ok::<_, crate::beneath::Refused>(())
            })
            .await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_folders_refuse_ids_that_could_leave_the_store() {
        let root = Path::new("/data");
        for bad in ["", "..", "a/b", "a\\b", ".hidden", "x y", &"a".repeat(129)] {
            assert!(ThreadFolders::new(root, bad).is_err(), "{bad:?}");
        }
        let folders = ThreadFolders::new(root, "0190abc-def_1").unwrap();
        assert_eq!(
            folders.uploads(),
            Path::new("/data/threads/0190abc-def_1/uploads")
        );
        assert_eq!(
            folders.outputs(),
            Path::new("/data/threads/0190abc-def_1/outputs")
        );
    }

    #[tokio::test]
    async fn create_makes_the_three_folders_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let folders = ThreadFolders::new(dir.path(), "t1").unwrap();
        folders.create().await.unwrap();
        folders.create().await.unwrap();
        for sub in [folders.uploads(), folders.workspace(), folders.outputs()] {
            let meta = std::fs::metadata(&sub).unwrap();
            assert!(meta.is_dir());
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                assert_eq!(meta.permissions().mode() & 0o777, 0o700, "{sub:?}");
            }
        }
    }
}
