//! The launcher: `antler __sandbox <spec>`, the process every shell command runs under.
//!
//! It runs before anything else of the binary (no async runtime, no threads, no logging), so
//! the restrictions it puts on itself, which Linux applies per thread, cover the whole process
//! and everything it starts. In order: it makes itself non-dumpable (the command, often the
//! same user, may not read its memory), leaves antler's session, becomes a subreaper (so
//! every orphan of the command becomes its child), sets the limits, applies Landlock and the
//! seccomp filter, then starts `bash -c` and waits for whichever comes first: the command
//! ending, or its stdin (the control pipe from antler) closing because the call was cancelled,
//! timed out or antler died. Either way it kills every process left in its tree, reaps them,
//! and exits as the command did (its exit code, or the same signal).
//!
//! A failure to set the sandbox up exits with [`SETUP_FAILED`] after one line on stderr that
//! starts with [`SETUP_FAILED_PREFIX`]: nothing runs unconfined.

use std::io::Write as _;
use std::os::unix::process::ExitStatusExt as _;
use std::process::{Child, ExitCode, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Resource, Rlimit, Signal, WaitOptions};

use super::{Backend, LAUNCHER_ARG, SETUP_FAILED, SETUP_FAILED_PREFIX, Spec};

/// How long the launcher keeps killing what the command left before it gives up.
const KILL_DEADLINE: Duration = Duration::from_secs(10);

/// When this process is the launcher (`antler __sandbox <spec>`), runs it and returns its
/// exit code; `None` otherwise. Call it first thing in `main`, before any thread exists.
pub fn main_if_launcher() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next()? != LAUNCHER_ARG {
        return None;
    }
    let spec = args
        .next()
        .and_then(|arg| arg.into_string().ok())
        .ok_or_else(|| "no spec given".to_owned())
        .and_then(|text| serde_json::from_str::<Spec>(&text).map_err(|e| e.to_string()));
    Some(match spec.and_then(|spec| run(&spec)) {
        Ok(code) => code,
        Err(why) => {
            let _ = writeln!(std::io::stderr(), "{SETUP_FAILED_PREFIX}{why}");
            ExitCode::from(u8::try_from(SETUP_FAILED).unwrap_or(1))
        }
    })
}

/// What the probe reports from inside the sandbox (one JSON line on stdout).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub(crate) struct Inside {
    pub(crate) uid: u32,
    /// `CapEff` of `/proc/self/status`.
    pub(crate) cap_eff: String,
    /// `NoNewPrivs`.
    pub(crate) no_new_privs: bool,
    /// `Seccomp` mode (2: filtered).
    pub(crate) seccomp: u32,
    /// How much of Landlock is enforced (`fully`, `partially`, `not`).
    pub(crate) landlock: String,
    /// Whether an IP socket could be made.
    pub(crate) ip_socket: bool,
    /// Whether the file that must stay hidden (one of the store's) could be read.
    pub(crate) hidden_readable: bool,
}

fn run(spec: &Spec) -> Result<ExitCode, String> {
    use rustix::process::DumpableBehavior;
    rustix::process::set_dumpable_behavior(DumpableBehavior::NotDumpable)
        .map_err(|e| format!("cannot make the launcher non-dumpable: {e}"))?;
    // Under bubblewrap (`--new-session`) the launcher already leads a session.
    match rustix::process::setsid() {
        Ok(_) | Err(rustix::io::Errno::PERM) => {}
        Err(e) => return Err(format!("cannot start a session: {e}")),
    }
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(|e| format!("cannot become a subreaper: {e}"))?;
    if let Some((uid, gid)) = spec.run_as {
        become_user(uid, gid)?;
    }
    // By name, as the command's user: a workspace that user cannot reach (a folder above the
    // store that others may not search) is refused here, with the reason, not at the first
    // absolute path a command uses.
    std::env::set_current_dir(&spec.workdir).map_err(|e| {
        format!(
            "the sandbox's user (uid {}) cannot reach the workspace {}: {e}; every folder above \
             the store must be searchable by others (chmod o+x)",
            rustix::process::getuid().as_raw(),
            spec.workdir.display()
        )
    })?;
    // Before the restrictions, which apply to the calling thread and what it starts: the relay
    // thread must still reach the proxy's socket.
    if let (Some(port), Some(socket)) = (spec.egress_port, &spec.relay_to) {
        relay(port, socket.clone())?;
    }
    set_limits(spec)?;
    let landlock = match spec.backend {
        Backend::None => "not".to_owned(),
        Backend::Landlock | Backend::Bwrap => {
            let status = super::rules::apply(spec);
            let network_confined = |status: &landlock::RestrictionStatus| {
                matches!(status.landlock, landlock::LandlockStatus::Available { effective_abi, .. }
                    if effective_abi >= landlock::ABI::V4)
            };
            match (spec.backend, status) {
                (Backend::Landlock, Ok(status)) if spec.network && !network_confined(&status) => {
                    return Err(
                        "network = true under Landlock needs Landlock ABI 4 (Linux 6.7) to keep \
                         connections to the proxy; use bubblewrap, or network = false"
                            .to_owned(),
                    );
                }
                (_, Ok(status)) if status.ruleset != landlock::RulesetStatus::NotEnforced => {
                    if status.ruleset == landlock::RulesetStatus::FullyEnforced {
                        "fully".to_owned()
                    } else {
                        "partially".to_owned()
                    }
                }
                // Under bubblewrap, Landlock is a second wall: its namespaces are the first.
                (Backend::Bwrap, _) => "not".to_owned(),
                (_, Ok(_)) => return Err("Landlock is not supported by this kernel".to_owned()),
                (_, Err(e)) => return Err(format!("cannot apply the Landlock rules: {e}")),
            }
        }
    };
    super::seccomp::apply(spec.network, spec.backend == Backend::Bwrap)
        .map_err(|e| format!("cannot apply the seccomp filter: {e}"))?;
    if let Some(hidden) = &spec.probe_hidden {
        report(hidden, landlock);
    }
    let child = std::process::Command::new("bash")
        .arg("-c")
        .arg(&spec.command)
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start bash: {e}"))?;
    Ok(supervise(child))
}

/// Relays `127.0.0.1:port` (in bubblewrap's otherwise empty network namespace) to the proxy's
/// Unix socket `socket`, each connection on threads of its own, for as long as the launcher
/// lives.
fn relay(port: u16, socket: std::path::PathBuf) -> Result<(), String> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", port))
        .map_err(|e| format!("cannot listen for the proxy relay: {e}"))?;
    std::thread::Builder::new()
        .name("egress-relay".to_owned())
        .spawn(move || {
            for client in listener.incoming().flatten() {
                if let Err(client) = relay_one(client, &socket) {
                    refuse_politely(client);
                }
            }
        })
        .map_err(|e| format!("cannot start the proxy relay: {e}"))?;
    Ok(())
}

/// Relays one client to the proxy on two threads; the client back when that cannot start.
fn relay_one(
    client: std::net::TcpStream,
    socket: &std::path::Path,
) -> Result<(), std::net::TcpStream> {
    let Ok(proxy) = std::os::unix::net::UnixStream::connect(socket) else {
        return Err(client);
    };
    let (Ok(mut client_out), Ok(mut proxy_in)) = (client.try_clone(), proxy.try_clone()) else {
        return Err(client);
    };
    let (mut client_in, mut proxy_out) = (client, proxy);
    let upstream = std::thread::Builder::new().spawn(move || {
        let _ = std::io::copy(&mut client_in, &mut proxy_out);
        let _ = proxy_out.shutdown(std::net::Shutdown::Write);
    });
    if upstream.is_err() {
        return Err(client_out);
    }
    let downstream = std::thread::Builder::new().spawn(move || {
        let _ = std::io::copy(&mut proxy_in, &mut client_out);
        let _ = client_out.shutdown(std::net::Shutdown::Write);
    });
    // Without the second thread the first still forwards; the proxy's answer is lost, and the
    // client sees the connection end.
    drop(downstream);
    Ok(())
}

/// Answers a client the relay cannot serve (the proxy gone, no thread to spare) with a 502
/// and reads what it sent, so it sees an answer, not a reset.
fn refuse_politely(mut client: std::net::TcpStream) {
    use std::io::{Read as _, Write as _};
    let _ = client
        .write_all(b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
    let _ = client.shutdown(std::net::Shutdown::Write);
    let _ = client.set_read_timeout(Some(Duration::from_secs(1)));
    let mut sink = [0_u8; 4096];
    while matches!(client.read(&mut sink), Ok(n) if n > 0) {}
}

/// Writes what the sandbox looks like from here, for the probe.
fn report(hidden: &std::path::Path, landlock: String) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(|rest| rest.trim().to_owned())
            .unwrap_or_default()
    };
    let ip_socket = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::STREAM,
        None,
    )
    .is_ok();
    let inside = Inside {
        uid: rustix::process::getuid().as_raw(),
        cap_eff: field("CapEff:"),
        no_new_privs: field("NoNewPrivs:") == "1",
        seccomp: field("Seccomp:").parse().unwrap_or(0),
        landlock,
        ip_socket,
        hidden_readable: std::fs::read(hidden).is_ok(),
    };
    if let Ok(line) = serde_json::to_string(&inside) {
        let _ = writeln!(std::io::stdout(), "{line}");
    }
}

/// The number of tasks (threads) of the real user `uid`, which `RLIMIT_NPROC` counts.
fn tasks_of(uid: u32) -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut tasks = 0;
    for entry in entries.flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let real_uid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|u| u.parse::<u32>().ok());
        if real_uid == Some(uid) {
            tasks += status
                .lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|n| n.trim().parse::<u64>().ok())
                .unwrap_or(1);
        }
    }
    tasks
}

/// Gives up root for `uid`/`gid` (no supplementary groups) for good, and checks it is gone.
/// The launcher is single-threaded here, so the per-thread calls cover the whole process.
fn become_user(uid: u32, gid: u32) -> Result<(), String> {
    use rustix::process::{Gid, Uid};
    use rustix::thread::{set_thread_groups, set_thread_res_gid, set_thread_res_uid};
    let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
    set_thread_groups(&[]).map_err(|e| format!("cannot drop the supplementary groups: {e}"))?;
    set_thread_res_gid(gid, gid, gid).map_err(|e| format!("cannot become group {gid:?}: {e}"))?;
    set_thread_res_uid(uid, uid, uid).map_err(|e| format!("cannot become user {uid:?}: {e}"))?;
    if rustix::process::getuid() != uid
        || rustix::process::geteuid() != uid
        || rustix::process::getegid() != gid
    {
        return Err(format!("still not user {uid:?} after giving up root"));
    }
    Ok(())
}

fn set_limits(spec: &Spec) -> Result<(), String> {
    let limits = &spec.limits;
    let mib = 1024 * 1024;
    // RLIMIT_NPROC counts every task of the user. In bubblewrap's user namespace that is the
    // command alone; elsewhere the user's other processes (antler itself, when it is the same
    // user) count too, so they are added.
    let processes = match spec.backend {
        Backend::Bwrap => limits.processes,
        Backend::Landlock | Backend::None => {
            limits.processes + tasks_of(rustix::process::getuid().as_raw())
        }
    };
    let cpu = spec.cpu_secs;
    for (resource, soft, hard, what) in [
        (Resource::Nproc, processes, processes, "processes"),
        (
            Resource::Data,
            limits.memory_mb.saturating_mul(mib),
            limits.memory_mb.saturating_mul(mib),
            "memory_mb",
        ),
        // SIGXCPU at the soft limit, SIGKILL a little later.
        (Resource::Cpu, cpu, cpu.saturating_add(2), "cpu_secs"),
        (
            Resource::Fsize,
            limits.file_mb.saturating_mul(mib),
            limits.file_mb.saturating_mul(mib),
            "file_mb",
        ),
        (
            Resource::Nofile,
            limits.open_files,
            limits.open_files,
            "open_files",
        ),
        (Resource::Core, 0, 0, "core dumps"),
    ] {
        let limit = Rlimit {
            current: Some(soft),
            maximum: Some(hard),
        };
        rustix::process::setrlimit(resource, limit)
            .map_err(|e| format!("cannot set the limit of {what}: {e}"))?;
    }
    Ok(())
}

/// Waits for the command or the end of the control pipe, then kills the tree; the exit code.
fn supervise(mut child: Child) -> ExitCode {
    let child_pid = Pid::from_child(&child);
    let pidfd = rustix::process::pidfd_open(child_pid, rustix::process::PidfdFlags::empty()).ok();
    let stdin = std::io::stdin();
    let status = loop {
        use rustix::event::{PollFd, PollFlags};
        let control = PollFd::new(&stdin, PollFlags::IN | PollFlags::HUP);
        let mut fds = vec![control];
        if let Some(pidfd) = &pidfd {
            fds.push(PollFd::new(pidfd, PollFlags::IN));
        }
        // Without a pidfd (an old kernel, a strict seccomp profile), look every 50 ms.
        let timeout = pidfd.is_none().then_some(rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 50_000_000,
        });
        let _ = rustix::event::poll(&mut fds, timeout.as_ref());
        let control_closed = fds
            .first()
            .is_some_and(|fd| !fd.revents().is_empty() && control_ended());
        if control_closed {
            kill_tree();
            // Stopped: it ends as the command did, killed.
            let _ = rustix::process::kill_process(rustix::process::getpid(), Signal::KILL);
            return ExitCode::from(137);
        }
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
    };
    kill_tree();
    exit_as(status)
}

/// Whether the control pipe reached its end (antler closed it, or died).
fn control_ended() -> bool {
    let mut byte = [0_u8; 64];
    !matches!(rustix::io::read(std::io::stdin(), &mut byte), Ok(n) if n > 0)
}

/// The children of this process (from `/proc/*/stat`: the field after the command's name).
fn children() -> Vec<Pid> {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let after_name = &stat[stat.rfind(')')? + 1..];
            let parent: i32 = after_name.split_whitespace().nth(1)?.parse().ok()?;
            (parent == me).then(|| Pid::from_raw(pid)).flatten()
        })
        .collect()
}

/// Kills every process in this launcher's tree: its children, then the orphans that become
/// its children as their parents die (it is their subreaper), until none is left.
fn kill_tree() {
    let until = Instant::now() + KILL_DEADLINE;
    loop {
        while let Ok(Some(_)) = rustix::process::waitpid(None, WaitOptions::NOHANG) {}
        let children = children();
        if children.is_empty() || Instant::now() > until {
            break;
        }
        for pid in children {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Ends this process as the command ended: with its exit code, or killed by its signal.
fn exit_as(status: std::process::ExitStatus) -> ExitCode {
    if let Some(code) = status.code() {
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    if let Some(signal) = status.signal() {
        if let Some(signal) = Signal::from_named_raw(signal) {
            let _ = rustix::process::kill_process(rustix::process::getpid(), signal);
        }
        // A signal this process ignores (SIGPIPE): the shell's convention instead.
        return ExitCode::from(u8::try_from(128 + signal).unwrap_or(1));
    }
    ExitCode::FAILURE
}
