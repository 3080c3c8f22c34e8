//! The Landlock rules a sandboxed command runs under.
//!
//! Every file-system right Landlock knows is handled (so denied unless a rule grants it):
//! the spec's read-only paths may be read and run, its read-write paths may also be written,
//! and nothing else may be touched, whatever the Unix permissions say. TCP `bind` and
//! `connect` are handled too (ABI 4): no port may be bound, and only the shell's proxy may be
//! connected to, with `network = true`. So are signals to processes
//! outside the sandbox and connections to abstract Unix sockets made outside it (ABI 6).
//! Best effort: a right the running kernel does not know is dropped (the status says how
//! much was enforced), and the caller decides whether that is enough.

use std::path::Path;

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath,
    PathFd, RestrictionStatus, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetError, Scope,
};

use super::Spec;

/// The newest ABI asked for; older kernels get what they support of it.
const ABI_WANTED: ABI = ABI::V7;

/// Why the rules could not be put in place.
#[derive(Debug, thiserror::Error)]
pub(super) enum RulesError {
    #[error("{0}")]
    Landlock(#[from] RulesetError),
    #[error("cannot open {path}: {error}")]
    Path { path: String, error: String },
}

/// The rights on `path`: files cannot carry the rights of folders.
fn rights_on(path: &Path, rights: BitFlags<AccessFs>) -> BitFlags<AccessFs> {
    if path.is_dir() {
        rights
    } else {
        rights & AccessFs::from_file(ABI_WANTED)
    }
}

/// Restricts the calling thread (and what it starts from now on) to `spec`'s paths.
pub(super) fn apply(spec: &Spec) -> Result<RestrictionStatus, RulesError> {
    let all = AccessFs::from_all(ABI_WANTED);
    let read = AccessFs::from_read(ABI_WANTED);
    let mut created = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)?
        .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)?
        .create()?;
    let list = BitFlags::from(AccessFs::ReadDir);
    for (paths, rights) in [
        (&spec.list_only, list),
        (&spec.read_only, read),
        (&spec.read_write, all),
    ] {
        for path in paths.iter().filter(|p| p.exists()) {
            let fd = PathFd::new(path).map_err(|e| RulesError::Path {
                path: path.display().to_string(),
                error: e.to_string(),
            })?;
            created = created.add_rule(PathBeneath::new(fd, rights_on(path, rights)))?;
        }
    }
    if let (true, Some(port)) = (spec.network, spec.egress_port) {
        created = created.add_rule(NetPort::new(port, AccessNet::ConnectTcp))?;
    }
    Ok(created.restrict_self()?)
}
