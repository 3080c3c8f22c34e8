//! Files opened beneath a folder handle, with links refused.
//!
//! A thread's folders are written by the sandboxed shell, which is hostile: between antler
//! checking a path and opening it, the shell can swap a file for a symbolic link to the host's
//! config, or plant a hard link to a file it cannot read itself. So antler never opens a path
//! inside a thread's folders by name after checking it. It holds a handle on a folder it owns
//! ([`Dir::open_trusted`]), opens everything relative to that handle with every symbolic link
//! refused and `..` impossible (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, or a
//! walk of `O_NOFOLLOW` opens where `openat2` is missing), checks what it opened (type, link
//! count, size, on the descriptor, not the path) and does the work on that same descriptor.
//! New files are made with `O_CREAT | O_EXCL` (which refuses an existing name or link) and
//! put in place with a rename inside the same folder handle, so a planted link is replaced,
//! never followed.
//!
//! Everything here is blocking; callers run it on tokio's blocking pool.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Write as _};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// Why something beneath a folder could not be opened as asked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refused {
    /// Nothing of that name.
    #[error("does not exist")]
    NotFound,
    /// The name, or a folder on the way to it, is a symbolic link.
    #[error("is a symbolic link")]
    Link,
    /// A regular file with more than one name: its bytes may be a file elsewhere.
    #[error("is a hard link")]
    HardLink,
    /// A folder where a file was wanted.
    #[error("is a folder")]
    Folder,
    /// A file where a folder was wanted (or on the way to it).
    #[error("is not a folder")]
    NotFolder,
    /// A device, a pipe or a socket.
    #[error("is not a regular file")]
    Special,
    /// Larger than the caller allows.
    #[error("is {size} bytes, more than the {limit} allowed")]
    TooLarge { size: u64, limit: u64 },
    /// The relative path has `..`, is absolute, or is empty where a name is needed.
    #[error("leads outside its folder")]
    Outside,
    /// Anything else the system said.
    #[error("{0}")]
    Io(io::Error),
}

impl From<io::Error> for Refused {
    fn from(error: io::Error) -> Self {
        Self::from_errno(Errno::from_io_error(&error), error)
    }
}

impl From<Errno> for Refused {
    fn from(errno: Errno) -> Self {
        Self::from_errno(Some(errno), errno.into())
    }
}

impl Refused {
    fn from_errno(errno: Option<Errno>, error: io::Error) -> Self {
        match errno {
            Some(Errno::NOENT) => Self::NotFound,
            // ELOOP: a link met with RESOLVE_NO_SYMLINKS or O_NOFOLLOW. EXDEV: RESOLVE_BENEATH
            // saw the walk leave the folder (only a link could make it).
            Some(Errno::LOOP | Errno::XDEV) => Self::Link,
            Some(Errno::ISDIR) => Self::Folder,
            Some(Errno::NOTDIR) => Self::NotFolder,
            _ => Self::Io(error),
        }
    }

    /// The error as an `io::Error`, for callers that only pass it on.
    pub(crate) fn into_io(self) -> io::Error {
        match self {
            Self::Io(error) => error,
            Self::NotFound => io::Error::new(io::ErrorKind::NotFound, "does not exist"),
            other => io::Error::new(io::ErrorKind::PermissionDenied, other.to_string()),
        }
    }
}

/// A regular file opened beneath a folder and checked on its descriptor.
#[derive(Debug)]
pub(crate) struct OpenedFile {
    /// The open file, positioned at its start.
    pub(crate) file: File,
    /// Its size when it was checked.
    pub(crate) size: u64,
}

/// One entry of a folder, as [`Dir::entries`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Its name.
    pub(crate) name: OsString,
    /// What it is (never followed: a link is a link).
    pub(crate) kind: EntryKind,
    /// Its size in bytes.
    pub(crate) size: u64,
    /// When it was last changed (nanoseconds since the epoch).
    pub(crate) modified_ns: i128,
}

/// What an [`Entry`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryKind {
    File,
    Folder,
    Link,
    Other,
}

/// A handle on a folder; everything opened through it stays beneath it.
#[derive(Debug)]
pub(crate) struct Dir {
    fd: OwnedFd,
}

impl AsFd for Dir {
    /// The folder's descriptor (a process started in it uses `/proc/self/fd/<fd>`).
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The plain names of `relative`, or [`Refused::Outside`] when it has `..`, a root or a
/// prefix. `.` parts are dropped; no names means the folder itself.
fn names(relative: &Path) -> Result<Vec<&OsStr>, Refused> {
    relative
        .components()
        .filter(|c| !matches!(c, Component::CurDir))
        .map(|c| match c {
            Component::Normal(name) => Ok(name),
            _ => Err(Refused::Outside),
        })
        .collect()
}

/// A single plain name (no `/`, not `.` or `..`, not empty).
fn single_name(name: &OsStr) -> Result<&OsStr, Refused> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(Refused::Outside);
    }
    Ok(name)
}

/// `openat2(dir, relative, flags, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
/// RESOLVE_NO_MAGICLINKS)`, or the same by a walk where the kernel (before 5.6) or a seccomp
/// profile refuses `openat2`.
fn open_beneath(
    dir: &OwnedFd,
    relative: &[&OsStr],
    flags: OFlags,
    mode: Mode,
) -> Result<OwnedFd, Refused> {
    let flags = flags | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NOCTTY;
    #[cfg(target_os = "linux")]
    {
        use rustix::fs::ResolveFlags;
        let path: PathBuf = if relative.is_empty() {
            PathBuf::from(".")
        } else {
            relative.iter().collect()
        };
        let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        match rustix::fs::openat2(dir, &path, flags, mode, how) {
            Err(Errno::NOSYS | Errno::PERM) => {}
            other => return other.map_err(Refused::from),
        }
    }
    walk(dir, relative, flags, mode)
}

/// Opens `relative` one name at a time, each folder on the way with `O_NOFOLLOW |
/// O_DIRECTORY`, so no link is ever followed.
fn walk(dir: &OwnedFd, relative: &[&OsStr], flags: OFlags, mode: Mode) -> Result<OwnedFd, Refused> {
    let Some((last, folders)) = relative.split_last() else {
        return Ok(rustix::fs::openat(dir, ".", flags, mode)?);
    };
    let mut current: Option<OwnedFd> = None;
    for name in folders {
        let at = current.as_ref().unwrap_or(dir);
        let next = rustix::fs::openat(
            at,
            *name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        current = Some(next);
    }
    let at = current.as_ref().unwrap_or(dir);
    Ok(rustix::fs::openat(at, *last, flags, mode)?)
}

/// The kind of file `stat` describes.
fn kind(stat: &rustix::fs::Stat) -> EntryKind {
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Folder,
        FileType::Symlink => EntryKind::Link,
        _ => EntryKind::Other,
    }
}

/// A name for a temporary file beside `name` that nothing else uses.
fn temporary_name(name: &OsStr) -> OsString {
    let mut temporary = OsString::from(".");
    // Bounded so the temporary name stays within NAME_MAX (255) whatever `name` is.
    let shown: Vec<u8> = name.as_bytes().iter().copied().take(200).collect();
    temporary.push(OsStr::from_bytes(&shown));
    temporary.push(format!(".{:016x}.tmp", fastrand::u64(..)));
    temporary
}

impl Dir {
    /// Opens a folder antler made itself (the store's, a thread's own folder), by path. Its
    /// last name may not be a link; the folders above it are antler's and trusted.
    pub(crate) fn open_trusted(path: &Path) -> Result<Self, Refused> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Self { fd })
    }

    /// The folder `relative` beneath this one.
    pub(crate) fn open_dir(&self, relative: &Path) -> Result<Self, Refused> {
        let opened = open_beneath(
            &self.fd,
            &names(relative)?,
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        );
        match opened {
            Ok(fd) => Ok(Self { fd }),
            // O_DIRECTORY | O_NOFOLLOW on a link says "not a folder"; say what it is.
            Err(Refused::NotFolder) if self.is_link(relative) => Err(Refused::Link),
            Err(e) => Err(e),
        }
    }

    fn is_link(&self, relative: &Path) -> bool {
        self.stat(relative)
            .is_ok_and(|entry| entry.kind == EntryKind::Link)
    }

    /// The folder `relative` beneath this one, made (`0700`, with this folder's owner) where
    /// it or a folder on the way does not exist yet.
    pub(crate) fn create_dir_all(&self, relative: &Path) -> Result<Self, Refused> {
        let mut current = self.open_dir(Path::new("."))?;
        for name in names(relative)? {
            match rustix::fs::mkdirat(&current.fd, name, Mode::from_raw_mode(0o700)) {
                Ok(()) => {
                    let made = current.open_dir(Path::new(name))?;
                    current.adopt(&made.fd);
                    current = made;
                }
                Err(Errno::EXIST) => current = current.open_dir(Path::new(name))?,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(current)
    }

    /// Opens the regular file `relative` for reading and checks it on its descriptor: not a
    /// link (anywhere on the way), not a folder or device, one name only, at most `max_bytes`.
    pub(crate) fn open_file(&self, relative: &Path, max_bytes: u64) -> Result<OpenedFile, Refused> {
        // O_NONBLOCK: opening a FIFO the shell planted must not block; it is refused below.
        let fd = open_beneath(
            &self.fd,
            &names(relative)?,
            OFlags::RDONLY | OFlags::NONBLOCK,
            Mode::empty(),
        )?;
        let stat = rustix::fs::fstat(&fd)?;
        match kind(&stat) {
            EntryKind::File => {}
            EntryKind::Folder => return Err(Refused::Folder),
            EntryKind::Link => return Err(Refused::Link),
            EntryKind::Other => return Err(Refused::Special),
        }
        if stat.st_nlink > 1 {
            return Err(Refused::HardLink);
        }
        let size = u64::try_from(stat.st_size).unwrap_or(0);
        if size > max_bytes {
            return Err(Refused::TooLarge {
                size,
                limit: max_bytes,
            });
        }
        // Back to blocking reads, as std and tokio expect of a regular file.
        rustix::fs::fcntl_setfl(&fd, OFlags::RDONLY)?;
        Ok(OpenedFile {
            file: File::from(fd),
            size,
        })
    }

    /// What `relative` is, without following a link.
    pub(crate) fn stat(&self, relative: &Path) -> Result<Entry, Refused> {
        let all = names(relative)?;
        let Some((last, folders)) = all.split_last() else {
            let stat = rustix::fs::fstat(&self.fd)?;
            return Ok(entry(OsString::from("."), &stat));
        };
        let parent = self.open_dir(&folders.iter().collect::<PathBuf>())?;
        let stat = rustix::fs::statat(&parent.fd, *last, AtFlags::SYMLINK_NOFOLLOW)?;
        Ok(entry((*last).to_owned(), &stat))
    }

    /// The folder's entries (`.` and `..` left out), in no particular order.
    pub(crate) fn entries(&self) -> Result<Vec<Entry>, Refused> {
        let mut out = Vec::new();
        for item in rustix::fs::Dir::read_from(&self.fd)? {
            let item = item?;
            let name = OsStr::from_bytes(item.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => out.push(entry(name.to_owned(), &stat)),
                // Removed since it was listed.
                Err(Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(out)
    }

    /// Creates the new file `name` in this folder (`O_EXCL`: an existing name or a link
    /// there is refused), owner-only and with this folder's owner, open for writing.
    pub(crate) fn create_new(&self, name: &OsStr) -> Result<File, Refused> {
        let name = single_name(name)?;
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        self.adopt(&fd);
        Ok(File::from(fd))
    }

    /// Puts `bytes` in this folder as `name`: written to a new temporary file, synced when
    /// `sync`, then renamed over `name`, so a reader never sees half of it. A link at `name`
    /// is refused (and one planted after that look is replaced by the rename, never
    /// followed). A regular file already there keeps its permissions.
    pub(crate) fn replace(&self, name: &OsStr, bytes: &[u8], sync: bool) -> Result<(), Refused> {
        let name = single_name(name)?;
        let permissions = match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) if kind(&stat) == EntryKind::File => Some(stat.st_mode & 0o777),
            Ok(stat) if kind(&stat) == EntryKind::Folder => return Err(Refused::Folder),
            Ok(stat) if kind(&stat) == EntryKind::Link => return Err(Refused::Link),
            _ => None,
        };
        let temporary = temporary_name(name);
        let written = (|| -> Result<(), Refused> {
            let mut file = self.create_new(&temporary)?;
            if let Some(mode) = permissions {
                rustix::fs::fchmod(&file, Mode::from_raw_mode(mode))?;
            }
            file.write_all(bytes)?;
            if sync {
                file.sync_all()?;
            }
            drop(file);
            rustix::fs::renameat(&self.fd, &temporary, &self.fd, name)?;
            Ok(())
        })();
        if written.is_err() {
            // Best effort: a temporary file left behind only takes room.
            let _ = rustix::fs::unlinkat(&self.fd, &temporary, AtFlags::empty());
        }
        written
    }

    /// Renames `from` to `to`, both names in this folder (replacing what `to` was).
    #[cfg(test)]
    pub(crate) fn rename(&self, from: &OsStr, to: &OsStr) -> Result<(), Refused> {
        rustix::fs::renameat(&self.fd, single_name(from)?, &self.fd, single_name(to)?)?;
        Ok(())
    }

    /// Removes the file (or link) `name` of this folder; a name already gone is fine.
    pub(crate) fn remove_file(&self, name: &OsStr) -> Result<(), Refused> {
        match rustix::fs::unlinkat(&self.fd, single_name(name)?, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Makes this folder `uid`'s and `gid`'s (through its handle, never its name).
    pub(crate) fn chown(
        &self,
        uid: Option<rustix::fs::Uid>,
        gid: Option<rustix::fs::Gid>,
    ) -> Result<(), Refused> {
        rustix::fs::fchown(&self.fd, uid, gid)?;
        Ok(())
    }

    /// Gives `fd` (just made in this folder) this folder's owner. Only root can, and only a
    /// root antler needs it: its sandboxed commands run as an unprivileged user, who must be
    /// able to use what antler writes into the folders that user owns.
    fn adopt(&self, fd: &impl AsFd) {
        if !rustix::process::geteuid().is_root() {
            return;
        }
        let Ok(folder) = rustix::fs::fstat(&self.fd) else {
            return;
        };
        if folder.st_uid == 0 && folder.st_gid == 0 {
            return;
        }
        // Best effort: a file antler cannot hand over stays antler's, which only means the
        // sandbox cannot change it.
        let _ = rustix::fs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(folder.st_uid)),
            Some(rustix::fs::Gid::from_raw(folder.st_gid)),
        );
    }
}

fn entry(name: OsString, stat: &rustix::fs::Stat) -> Entry {
    Entry {
        name,
        kind: kind(stat),
        size: u64::try_from(stat.st_size).unwrap_or(0),
        modified_ns: i128::from(stat.st_mtime) * 1_000_000_000 + i128::from(stat.st_mtime_nsec),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;
    use std::os::unix::fs::symlink;

    use super::*;

    fn setup() -> (tempfile::TempDir, Dir) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("root")).unwrap();
        let root = Dir::open_trusted(&dir.path().join("root")).unwrap();
        (dir, root)
    }

    fn read(opened: OpenedFile) -> String {
        let mut text = String::new();
        let mut file = opened.file;
        file.read_to_string(&mut text).unwrap();
        text
    }

    #[test]
    fn files_beneath_are_opened_and_checked_on_the_descriptor() {
        let (dir, root) = setup();
        std::fs::create_dir_all(dir.path().join("root/a/b")).unwrap();
        std::fs::write(dir.path().join("root/a/b/c.txt"), "hello").unwrap();
        let opened = root.open_file(Path::new("a/./b/c.txt"), 100).unwrap();
        assert_eq!(opened.size, 5);
        assert_eq!(read(opened), "hello");
        assert!(matches!(
            root.open_file(Path::new("a/b/c.txt"), 4),
            Err(Refused::TooLarge { size: 5, limit: 4 })
        ));
        assert!(matches!(
            root.open_file(Path::new("a/b"), 100),
            Err(Refused::Folder)
        ));
        assert!(matches!(
            root.open_file(Path::new("a/missing"), 100),
            Err(Refused::NotFound)
        ));
        assert!(matches!(
            root.open_file(Path::new("a/b/c.txt/d"), 100),
            Err(Refused::NotFolder)
        ));
    }

    #[test]
    fn links_anywhere_on_the_way_and_dot_dot_are_refused() {
        let (dir, root) = setup();
        std::fs::write(dir.path().join("secret.txt"), "secret").unwrap();
        std::fs::create_dir(dir.path().join("root/sub")).unwrap();
        std::fs::write(dir.path().join("root/sub/inside.txt"), "inside").unwrap();
        symlink(dir.path().join("secret.txt"), dir.path().join("root/out")).unwrap();
        symlink("sub/inside.txt", dir.path().join("root/in")).unwrap();
        symlink(dir.path(), dir.path().join("root/up")).unwrap();
        symlink("sub", dir.path().join("root/sublink")).unwrap();
        for path in ["out", "in", "up/secret.txt", "sublink/inside.txt"] {
            assert!(
                matches!(root.open_file(Path::new(path), 100), Err(Refused::Link)),
                "{path}"
            );
        }
        for path in ["../secret.txt", "sub/../../secret.txt", "/etc/passwd"] {
            assert!(
                matches!(root.open_file(Path::new(path), 100), Err(Refused::Outside)),
                "{path}"
            );
        }
        assert!(matches!(
            root.open_dir(Path::new("sublink")),
            Err(Refused::Link)
        ));
        assert!(matches!(
            root.create_dir_all(Path::new("up/new")),
            Err(Refused::Link)
        ));
        assert!(!dir.path().join("new").exists());
    }

    #[test]
    fn the_walk_refuses_links_as_openat2_does() {
        let (dir, root) = setup();
        std::fs::create_dir(dir.path().join("root/sub")).unwrap();
        std::fs::write(dir.path().join("root/sub/f"), "f").unwrap();
        symlink("sub", dir.path().join("root/link")).unwrap();
        let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let ok = walk(
            &root.fd,
            &[OsStr::new("sub"), OsStr::new("f")],
            flags,
            Mode::empty(),
        );
        assert!(ok.is_ok());
        for path in [["link", "f"], ["sub", "missing"]] {
            let names: Vec<&OsStr> = path.iter().map(OsStr::new).collect();
            assert!(
                walk(&root.fd, &names, flags, Mode::empty()).is_err(),
                "{path:?}"
            );
        }
        let last_link = walk(&root.fd, &[OsStr::new("link")], flags, Mode::empty());
        assert!(matches!(last_link, Err(Refused::Link)));
    }

    #[test]
    fn hard_links_and_special_files_are_refused() {
        let (dir, root) = setup();
        std::fs::write(dir.path().join("secret.txt"), "secret").unwrap();
        std::fs::hard_link(dir.path().join("secret.txt"), dir.path().join("root/hard")).unwrap();
        assert!(matches!(
            root.open_file(Path::new("hard"), 100),
            Err(Refused::HardLink)
        ));
        let fifo = dir.path().join("root/fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        assert!(matches!(
            root.open_file(Path::new("fifo"), 100),
            Err(Refused::Special)
        ));
    }

    #[test]
    fn replace_never_writes_through_a_planted_link() {
        let (dir, root) = setup();
        let outside = dir.path().join("outside.txt");
        std::fs::write(&outside, "untouched").unwrap();
        symlink(&outside, dir.path().join("root/report.txt")).unwrap();
        assert!(matches!(
            root.replace(OsStr::new("report.txt"), b"new", false),
            Err(Refused::Link)
        ));
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "untouched");
        // A link planted after the look is replaced by the rename, not followed.
        std::fs::write(dir.path().join("root/a.txt"), "old").unwrap();
        let temporary = temporary_name(OsStr::new("x"));
        let mut file = root.create_new(&temporary).unwrap();
        file.write_all(b"new").unwrap();
        std::fs::remove_file(dir.path().join("root/a.txt")).unwrap();
        symlink(&outside, dir.path().join("root/a.txt")).unwrap();
        root.rename(&temporary, OsStr::new("a.txt")).unwrap();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "untouched");
        let meta = std::fs::symlink_metadata(dir.path().join("root/a.txt")).unwrap();
        assert!(meta.is_file());
        // A hard-linked file is replaced by name; the other name keeps its bytes.
        std::fs::hard_link(&outside, dir.path().join("root/hard.txt")).unwrap();
        root.replace(OsStr::new("hard.txt"), b"changed", true)
            .unwrap();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "untouched");
        // Nothing temporary is left.
        let names: Vec<OsString> = root
            .entries()
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(matches!(
            root.replace(OsStr::new("../x"), b"", false),
            Err(Refused::Outside)
        ));
    }

    #[test]
    fn replace_keeps_the_permissions_of_the_file_it_replaces() {
        use std::os::unix::fs::PermissionsExt as _;
        let (dir, root) = setup();
        let script = dir.path().join("root/run.sh");
        std::fs::write(&script, "old").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o750)).unwrap();
        root.replace(OsStr::new("run.sh"), b"new", false).unwrap();
        let mode = std::fs::metadata(&script).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o750);
        root.replace(OsStr::new("fresh.txt"), b"x", false).unwrap();
        let mode = std::fs::metadata(dir.path().join("root/fresh.txt"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn create_new_refuses_an_existing_name_or_link() {
        let (dir, root) = setup();
        let outside = dir.path().join("outside.txt");
        symlink(&outside, dir.path().join("root/planted")).unwrap();
        assert!(root.create_new(OsStr::new("planted")).is_err());
        assert!(!outside.exists());
        let mut file = root.create_new(OsStr::new("fresh")).unwrap();
        file.write_all(b"x").unwrap();
        assert!(root.create_new(OsStr::new("fresh")).is_err());
        assert!(matches!(
            root.create_new(OsStr::new("a/b")),
            Err(Refused::Outside)
        ));
    }

    #[test]
    fn entries_and_stat_describe_without_following() {
        let (dir, root) = setup();
        std::fs::write(dir.path().join("root/f.txt"), "abc").unwrap();
        std::fs::create_dir(dir.path().join("root/d")).unwrap();
        symlink("/etc/passwd", dir.path().join("root/l")).unwrap();
        let mut entries = root.entries().unwrap();
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        let kinds: Vec<(String, EntryKind, u64)> = entries
            .iter()
            .map(|e| (e.name.to_string_lossy().into_owned(), e.kind, e.size))
            .filter(|(_, kind, _)| *kind != EntryKind::Folder)
            .collect();
        assert_eq!(
            kinds,
            [
                ("f.txt".to_owned(), EntryKind::File, 3),
                ("l".to_owned(), EntryKind::Link, 11)
            ]
        );
        assert_eq!(root.stat(Path::new("l")).unwrap().kind, EntryKind::Link);
        assert_eq!(root.stat(Path::new("d")).unwrap().kind, EntryKind::Folder);
        assert!(matches!(
            root.stat(Path::new("missing")),
            Err(Refused::NotFound)
        ));
        root.remove_file(OsStr::new("l")).unwrap();
        root.remove_file(OsStr::new("l")).unwrap();
        assert!(std::fs::symlink_metadata(dir.path().join("root/l")).is_err());
    }

    #[test]
    fn create_dir_all_makes_and_reuses_folders() {
        let (dir, root) = setup();
        let made = root.create_dir_all(Path::new("x/y/z")).unwrap();
        made.replace(OsStr::new("f"), b"1", false).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("root/x/y/z/f")).unwrap(),
            "1"
        );
        root.create_dir_all(Path::new("x/y")).unwrap();
        std::fs::write(dir.path().join("root/file"), "").unwrap();
        assert!(matches!(
            root.create_dir_all(Path::new("file/sub")),
            Err(Refused::NotFolder)
        ));
    }
}
