//! The seccomp filter every sandboxed command runs under.
//!
//! An allow-by-default filter that refuses, with `EPERM`, what a shell command has no business
//! doing and what would let it undo the rest of the sandbox: tracing other processes and
//! reading their memory, mounting, new namespaces (`unshare`, `setns`, `clone` with a
//! namespace flag), loading kernel code (modules, BPF, `kexec`), kernel keyrings,
//! `userfaultfd`, `perf_event_open`, file handles (`open_by_handle_at`, a known container
//! escape), `io_uring` (whose operations bypass this filter), swap, reboot, accounting, quotas,
//! the kernel log and raw port I/O. `clone3` answers `ENOSYS`, as container runtimes do, so
//! that the C library falls back to `clone`, whose flags the filter can read.
//!
//! Sockets: only `AF_UNIX` ones under bubblewrap (where no host socket is visible), none under
//! Landlock or `none` (a host's PostgreSQL or Docker socket would be), and with
//! `network = true` also `AF_INET`/`AF_INET6` streams (to the proxy: no datagrams).
//! `socketpair` stays allowed: pipes between processes of the command are harmless.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// Why the filter could not be made.
#[derive(Debug, thiserror::Error)]
pub(super) enum FilterError {
    #[error("seccomp does not know this architecture ({0})")]
    Arch(String),
    #[error("{0}")]
    Build(#[from] seccompiler::BackendError),
    #[error("{0}")]
    Apply(#[from] seccompiler::Error),
}

/// System calls refused outright.
const REFUSED: &[libc::c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_kcmp,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_userfaultfd,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_syslog,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
];

/// `clone` flags that make a new namespace.
const NAMESPACE_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
];

fn arch() -> Result<TargetArch, FilterError> {
    TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|_| FilterError::Arch(std::env::consts::ARCH.to_owned()))
}

fn condition(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, FilterError> {
    Ok(SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Dword,
        op,
        value,
    )?)
}

/// The socket families allowed: `AF_UNIX` when `unix`, IP when `network`.
fn allowed_families(network: bool, unix: bool) -> Vec<libc::c_int> {
    let mut families = Vec::new();
    if unix {
        families.push(libc::AF_UNIX);
    }
    if network {
        families.extend([libc::AF_INET, libc::AF_INET6]);
    }
    families
}

/// The filters (refusals with `EPERM`; `clone3` with `ENOSYS`), compiled.
fn programs(network: bool, unix: bool) -> Result<[BpfProgram; 2], FilterError> {
    let arch = arch()?;
    let mut refused: BTreeMap<i64, Vec<SeccompRule>> =
        REFUSED.iter().map(|&call| (call, Vec::new())).collect();
    let clone_rules = NAMESPACE_FLAGS
        .iter()
        .map(|&flag| {
            let flag = u64::from(flag.unsigned_abs());
            Ok(SeccompRule::new(vec![condition(
                0,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )?])?)
        })
        .collect::<Result<Vec<_>, FilterError>>()?;
    refused.insert(libc::SYS_clone, clone_rules);
    let families = allowed_families(network, unix);
    // No conditions: every socket() is refused. Else one rule, true when the family is none
    // of the allowed ones.
    let socket_rules = if families.is_empty() {
        Vec::new()
    } else {
        let conditions = families
            .iter()
            .map(|&family| condition(0, SeccompCmpOp::Ne, u64::from(family.unsigned_abs())))
            .collect::<Result<Vec<_>, _>>()?;
        vec![SeccompRule::new(conditions)?]
    };
    let mut socket_rules = socket_rules;
    if network {
        // IP, but streams only: no datagram goes around the proxy (Landlock only sees TCP).
        for family in [libc::AF_INET, libc::AF_INET6] {
            socket_rules.push(SeccompRule::new(vec![
                condition(0, SeccompCmpOp::Eq, u64::from(family.unsigned_abs()))?,
                condition(
                    1,
                    SeccompCmpOp::MaskedEq(0xf),
                    u64::from(libc::SOCK_DGRAM.unsigned_abs()),
                )?,
            ])?);
        }
    }
    refused.insert(libc::SYS_socket, socket_rules);
    let eperm = SeccompFilter::new(
        refused,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM.unsigned_abs()),
        arch,
    )?;
    let enosys = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS.unsigned_abs()),
        arch,
    )?;
    Ok([eperm.try_into()?, enosys.try_into()?])
}

/// Installs the filter on the calling thread (and so on everything it starts); sets
/// no-new-privileges first, which seccomp requires of an unprivileged process.
pub(super) fn apply(network: bool, unix: bool) -> Result<(), FilterError> {
    for program in programs(network, unix)? {
        seccompiler::apply_filter(&program)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_compile_for_every_network_choice() {
        for (network, unix) in [(false, false), (false, true), (true, false), (true, true)] {
            let [eperm, enosys] = programs(network, unix).unwrap();
            assert!(eperm.len() > REFUSED.len(), "{network} {unix}");
            assert!(!enosys.is_empty());
        }
    }

    #[test]
    fn only_local_sockets_are_allowed_without_the_network() {
        assert!(allowed_families(false, false).is_empty());
        assert_eq!(allowed_families(false, true), [libc::AF_UNIX]);
        assert_eq!(
            allowed_families(true, false),
            [libc::AF_INET, libc::AF_INET6]
        );
    }
}
