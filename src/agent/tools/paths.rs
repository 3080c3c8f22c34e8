//! Virtual paths: the model sees a thread's folders as `/mnt/user-data/{workspace,uploads,outputs}`
//! and never a host path. Every file tool resolves what the model wrote through
//! [`ThreadFolders::resolve`], and every text going back to the model (shell output, listings)
//! through [`ThreadFolders::to_virtual`], so host paths neither leak out nor work as a way in.
//!
//! Confinement: `..` components and absolute paths outside `/mnt/user-data` are refused here,
//! by the text alone; `uploads` is read-only (it holds what the user sent). Links are refused
//! when the file is opened: every tool opens the [`Resolved::relative`] path beneath a handle on
//! its folder ([`ThreadFolders::open_area`], [`crate::beneath`]), never the host path by name,
//! so a link the shell plants after a check cannot redirect the open.

use std::path::{Component, Path, PathBuf};

use crate::agent::input::ThreadFolders;
use crate::agent::skills::SkillMounts;
use crate::beneath::{Dir, Refused};

/// Where the model sees the thread's folders.
pub(crate) const VIRTUAL_ROOT: &str = "/mnt/user-data";

/// The three folders, by the name the model sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Area {
    Workspace,
    Uploads,
    Outputs,
}

impl Area {
    pub(crate) const ALL: [Area; 3] = [Area::Workspace, Area::Uploads, Area::Outputs];

    /// Its name under [`VIRTUAL_ROOT`].
    pub(crate) fn name(self) -> &'static str {
        match self {
            Area::Workspace => "workspace",
            Area::Uploads => "uploads",
            Area::Outputs => "outputs",
        }
    }

    fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|area| area.name() == name)
    }

    /// Its virtual path, `/mnt/user-data/<name>`.
    pub(crate) fn virtual_path(self) -> String {
        format!("{VIRTUAL_ROOT}/{}", self.name())
    }
}

/// What a tool wants to do with a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PathAccess {
    Read,
    Write,
}

/// Why a path was refused; the message is for the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PathError {
    #[error(
        "{0} is outside the thread's folders; use paths under /mnt/user-data/workspace, \
         /mnt/user-data/uploads or /mnt/user-data/outputs"
    )]
    Outside(String),
    #[error(
        "{0} is read-only: uploads hold what the user sent; write to /mnt/user-data/workspace or /mnt/user-data/outputs"
    )]
    ReadOnly(String),
}

/// A path resolved inside the thread's folders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resolved {
    /// The folder it is in.
    pub(crate) area: Area,
    /// Its path inside that folder (empty for the folder itself): what is opened, beneath a
    /// handle on the folder.
    pub(crate) relative: PathBuf,
    /// Where it is on the host, for display only (never opened by this name).
    pub(crate) host: PathBuf,
}

impl Resolved {
    /// Its path inside its folder as a name, `/`-separated (`charts/cpu.png`; empty for the
    /// folder itself).
    pub(crate) fn name(&self) -> String {
        self.relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/")
    }
}

impl ThreadFolders {
    /// The host folder of `area`.
    pub(crate) fn area(&self, area: Area) -> PathBuf {
        match area {
            Area::Workspace => self.workspace(),
            Area::Uploads => self.uploads(),
            Area::Outputs => self.outputs(),
        }
    }

    /// A handle on the folder of `area`, opened beneath the thread's own folder with links
    /// refused: what every host-side file operation in the folders starts from.
    pub(crate) fn open_area(&self, area: Area) -> Result<Dir, Refused> {
        Dir::open_trusted(&self.root_path())?.open_dir(Path::new(area.name()))
    }

    /// Where what the model called `path` is: `/mnt/user-data/<area>/...`, or a relative
    /// path, taken under the workspace. Refused: `..`, any other absolute path, and writes to
    /// uploads. Links are not looked at here (a check by name proves nothing about the next
    /// open); opening [`Resolved::relative`] beneath [`ThreadFolders::open_area`] refuses them.
    pub(crate) fn resolve(&self, path: &str, access: PathAccess) -> Result<Resolved, PathError> {
        let outside = || PathError::Outside(path.to_owned());
        let relative = match path.strip_prefix(VIRTUAL_ROOT) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => rest.to_owned(),
            Some(_) => return Err(outside()),
            None if path.starts_with('/') || path.starts_with('~') => return Err(outside()),
            None => format!("workspace/{path}"),
        };
        let mut parts = Vec::new();
        for component in Path::new(&relative).components() {
            match component {
                Component::Normal(part) => parts.push(part),
                Component::CurDir | Component::RootDir => {}
                Component::ParentDir | Component::Prefix(_) => return Err(outside()),
            }
        }
        let Some((first, rest)) = parts.split_first() else {
            return Err(outside());
        };
        let area = first.to_str().and_then(Area::named).ok_or_else(outside)?;
        if access == PathAccess::Write && area == Area::Uploads {
            return Err(PathError::ReadOnly(path.to_owned()));
        }
        let relative: PathBuf = rest.iter().collect();
        let host = self.area(area).join(&relative);
        Ok(Resolved {
            area,
            relative,
            host,
        })
    }

    /// `text` with the thread's host folders replaced by their virtual paths (longest first),
    /// for anything shown to the model.
    pub(crate) fn to_virtual(&self, text: &str) -> String {
        self.to_virtual_with(text, &SkillMounts::default())
    }

    /// [`ThreadFolders::to_virtual`], the skills' host folders becoming
    /// `/mnt/skills/<name>` too.
    pub(crate) fn to_virtual_with(&self, text: &str, skills: &SkillMounts) -> String {
        let mut pairs: Vec<(String, String)> = Area::ALL
            .into_iter()
            .map(|area| (self.area(area).display().to_string(), area.virtual_path()))
            .collect();
        pairs.push((
            self.root_path().display().to_string(),
            VIRTUAL_ROOT.to_owned(),
        ));
        pairs.extend(skills.virtual_pairs());
        replace_longest_first(text, pairs)
    }

    /// `text` (a shell command) with virtual paths replaced by the host folders (longest
    /// first).
    #[cfg(test)]
    pub(crate) fn to_host(&self, text: &str) -> String {
        self.to_host_with(text, &SkillMounts::default())
    }

    /// [`ThreadFolders::to_host`], `/mnt/skills/<name>` becoming the skills' host folders too.
    pub(crate) fn to_host_with(&self, text: &str, skills: &SkillMounts) -> String {
        let mut pairs: Vec<(String, String)> = Area::ALL
            .into_iter()
            .map(|area| (area.virtual_path(), self.area(area).display().to_string()))
            .collect();
        pairs.push((
            VIRTUAL_ROOT.to_owned(),
            self.root_path().display().to_string(),
        ));
        pairs.extend(skills.host_pairs());
        replace_longest_first(text, pairs)
    }

    fn root_path(&self) -> PathBuf {
        self.workspace()
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }
}

/// Replaces every `from` with its `to`, trying longer `from`s first at each position, so a
/// folder's path is never rewritten as its parent's.
fn replace_longest_first(text: &str, mut pairs: Vec<(String, String)>) -> String {
    pairs.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    'scan: while !rest.is_empty() {
        for (from, to) in &pairs {
            if !from.is_empty() && rest.starts_with(from.as_str()) {
                out.push_str(to);
                rest = &rest[from.len()..];
                continue 'scan;
            }
        }
        let mut chars = rest.chars();
        if let Some(c) = chars.next() {
            out.push(c);
        }
        rest = chars.as_str();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn folders() -> (tempfile::TempDir, ThreadFolders) {
        let dir = tempfile::tempdir().unwrap();
        let folders = ThreadFolders::new(dir.path(), "t1").unwrap();
        folders.create().await.unwrap();
        (dir, folders)
    }

    #[tokio::test]
    async fn virtual_and_relative_paths_resolve_into_their_folder() {
        let (_dir, folders) = folders().await;
        let resolved = folders
            .resolve("/mnt/user-data/outputs/report.md", PathAccess::Write)
            .unwrap();
        assert_eq!(resolved.area, Area::Outputs);
        assert_eq!(resolved.relative, Path::new("report.md"));
        assert_eq!(resolved.host, folders.outputs().join("report.md"));
        let relative = folders.resolve("notes/./a.txt", PathAccess::Write).unwrap();
        assert_eq!(relative.host, folders.workspace().join("notes/a.txt"));
        let area = folders
            .resolve("/mnt/user-data/uploads", PathAccess::Read)
            .unwrap();
        assert_eq!(area.host, folders.uploads());
    }

    #[tokio::test]
    async fn escapes_are_refused() {
        let (dir, folders) = folders().await;
        for path in [
            "../../etc/passwd",
            "/mnt/user-data/workspace/../../../etc/passwd",
            "/etc/passwd",
            "~/.ssh/id_rsa",
            "/mnt/user-data",
            "/mnt/user-data/elsewhere/x",
            "/mnt/user-dataX/workspace/a",
            &dir.path()
                .join("threads/t1/workspace/a")
                .display()
                .to_string(),
        ] {
            assert!(
                matches!(
                    folders.resolve(path, PathAccess::Read),
                    Err(PathError::Outside(_))
                ),
                "{path}"
            );
        }
        assert!(matches!(
            folders.resolve("/mnt/user-data/uploads/a.txt", PathAccess::Write),
            Err(PathError::ReadOnly(_))
        ));
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn links_are_refused_when_opened_beneath_the_area() {
        let (dir, folders) = folders().await;
        let secret = dir.path().join("secret.txt");
        std::fs::write(&secret, "s").unwrap();
        std::os::unix::fs::symlink(&secret, folders.workspace().join("link")).unwrap();
        std::os::unix::fs::symlink(dir.path(), folders.workspace().join("up")).unwrap();
        std::fs::write(folders.workspace().join("inside.txt"), "i").unwrap();
        std::os::unix::fs::symlink(
            folders.workspace().join("inside.txt"),
            folders.workspace().join("ok-link"),
        )
        .unwrap();
        let workspace = folders.open_area(Area::Workspace).unwrap();
        for path in ["link", "up/secret.txt", "ok-link"] {
            let resolved = folders.resolve(path, PathAccess::Read).unwrap();
            assert!(
                matches!(
                    workspace.open_file(&resolved.relative, 100),
                    Err(Refused::Link)
                ),
                "{path} is a link or goes through one"
            );
        }
        let inside = folders.resolve("inside.txt", PathAccess::Read).unwrap();
        assert_eq!(workspace.open_file(&inside.relative, 100).unwrap().size, 1);
        // A thread whose area itself was replaced by a link has no area.
        std::fs::remove_dir_all(folders.outputs()).unwrap();
        std::os::unix::fs::symlink(dir.path(), folders.outputs()).unwrap();
        assert!(matches!(
            folders.open_area(Area::Outputs),
            Err(Refused::Link)
        ));
    }

    #[tokio::test]
    async fn paths_are_translated_both_ways_longest_prefix_first() {
        let (_dir, folders) = folders().await;
        let host = folders.workspace().display().to_string();
        let command =
            "cat /mnt/user-data/workspace/a.txt > /mnt/user-data/outputs/b.txt; ls /mnt/user-data";
        let translated = folders.to_host(command);
        assert!(
            translated.contains(&format!("cat {host}/a.txt")),
            "{translated}"
        );
        assert!(!translated.contains("/mnt/user-data"), "{translated}");
        assert_eq!(folders.to_virtual(&translated), command);
        let output = format!("error: {host}/x: not found");
        assert_eq!(
            folders.to_virtual(&output),
            "error: /mnt/user-data/workspace/x: not found"
        );
    }
}
