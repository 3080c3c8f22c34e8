//! Which backend works here, proven by a probe run inside it.
//!
//! A probe is a real command through the real launcher, in folders laid out as a thread's
//! (`<probe root>/sandbox-probe-<pid>/`): the launcher, once confined, reports what it sees
//! ([`ProbeReport`]) and then runs `bash -c true`. A backend is accepted only when the command
//! ran and the report shows it confined: no capabilities, not root, no-new-privileges and a
//! seccomp filter, no IP socket without the network, the store hidden, and (for `landlock`)
//! Landlock enforced.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::AsyncReadExt as _;

use super::launcher::Inside;
use super::{Backend, Folders, Sandbox, SandboxLimits, SandboxMode, launcher_path};

/// How long a probe may take (bubblewrap's first start can be slow on a loaded machine).
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// What a probe saw from inside a backend.
pub(crate) type ProbeReport = Inside;

/// The outcome of [`detect`]: the sandbox to use, if any, and what was tried.
#[derive(Debug, Clone)]
pub(crate) struct Detection {
    /// The sandbox commands run in; `None`: the shell cannot be offered.
    pub(crate) sandbox: Option<Sandbox>,
    /// What the chosen backend's probe saw.
    pub(crate) report: Option<ProbeReport>,
    /// Each backend tried and why it did not work, in the order tried.
    pub(crate) refused: Vec<(Backend, String)>,
}

impl Detection {
    /// One line for logs, `doctor` and `check-config`: the backend in effect and what it
    /// gives, or why there is none and how to fix it.
    pub(crate) fn describe(&self) -> String {
        let tried = self
            .refused
            .iter()
            .map(|(backend, why)| format!("{}: {why}", backend.name()))
            .collect::<Vec<_>>()
            .join("; ");
        match (&self.sandbox, &self.report) {
            (Some(sandbox), report) => {
                let mut text = sandbox.backend().name().to_owned();
                if let Some(report) = report {
                    text.push_str(&format!(
                        " (uid {} inside, capabilities {}, landlock {}, network {}, store hidden)",
                        report.uid,
                        if report.cap_eff.trim_start_matches('0').is_empty() {
                            "none"
                        } else {
                            "some"
                        },
                        report.landlock,
                        if sandbox.network() { "on" } else { "off" },
                    ));
                } else {
                    text.push_str(
                        " (no isolation of the file system: commands see what antler's user sees)",
                    );
                }
                if !tried.is_empty() {
                    text.push_str(&format!("; not used: {tried}"));
                }
                text
            }
            (None, _) => format!(
                "none works, so the shell (`bash` and the `bash` subagent type) is not offered \
                 ({tried}). Fix: install bubblewrap and allow unprivileged user namespaces, or \
                 run on a kernel with Landlock (5.13+, enabled in the `lsm=` boot list); or set \
                 agent.tools.bash.sandbox = \"none\" to run commands unconfined"
            ),
        }
    }
}

/// The first executable file called `name` in the `PATH` list `path`.
pub(crate) fn find_on_path(name: &str, path: Option<&str>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;

    path?
        .split(':')
        .filter(|dir| dir.starts_with('/'))
        .map(|dir| Path::new(dir).join(name))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
}

/// Decides the backend for `mode`, probing each candidate in a folder under `probe_root`
/// (the store's folder, so a probe also proves the sandbox's user can reach it).
pub(crate) async fn detect(
    mode: SandboxMode,
    network: bool,
    limits: SandboxLimits,
    probe_root: &Path,
    egress: Option<&super::Egress>,
) -> Detection {
    let mut detection = Detection {
        sandbox: None,
        report: None,
        refused: Vec::new(),
    };
    let Some(launcher) = launcher_path() else {
        detection.refused.push((
            Backend::None,
            "antler's own binary (the launcher) cannot be found".to_owned(),
        ));
        return detection;
    };
    let candidates: &[Backend] = match mode {
        SandboxMode::Auto => &[Backend::Bwrap, Backend::Landlock],
        SandboxMode::Bwrap => &[Backend::Bwrap],
        SandboxMode::Landlock => &[Backend::Landlock],
        SandboxMode::None => &[Backend::None],
    };
    let path = std::env::var("PATH").ok();
    for &backend in candidates {
        let bwrap = find_on_path("bwrap", path.as_deref());
        if backend == Backend::Bwrap && bwrap.is_none() {
            detection
                .refused
                .push((backend, "bubblewrap (bwrap) is not installed".to_owned()));
            continue;
        }
        let sandbox = Sandbox::new(backend, network, limits, launcher.clone(), bwrap)
            .with_egress(egress.cloned());
        match probe(&sandbox, probe_root).await {
            Ok(report) => {
                detection.report = (backend != Backend::None).then_some(report);
                detection.sandbox = Some(sandbox);
                return detection;
            }
            Err(why) => detection.refused.push((backend, why)),
        }
    }
    detection
}

/// Runs the probe under `sandbox`; what it saw, or why the backend is not good enough.
pub(crate) async fn probe(sandbox: &Sandbox, probe_root: &Path) -> Result<ProbeReport, String> {
    let leftovers = ProbeLeftovers {
        dir: probe_root.join(format!("sandbox-probe-{}", std::process::id())),
        hidden: probe_root.join(format!("sandbox-probe-{}.secret", std::process::id())),
    };
    probe_in(sandbox, probe_root, &leftovers.dir, &leftovers.hidden).await
}

/// The probe's folders and the file it must not read, removed when dropped: also when the
/// probe is stopped halfway (antler stopping while the probe of its start runs).
struct ProbeLeftovers {
    dir: PathBuf,
    hidden: PathBuf,
}

impl Drop for ProbeLeftovers {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(&self.hidden);
    }
}

async fn probe_in(
    sandbox: &Sandbox,
    probe_root: &Path,
    dir: &Path,
    hidden: &Path,
) -> Result<ProbeReport, String> {
    tokio::fs::write(hidden, b"the store")
        .await
        .map_err(|e| format!("cannot write in {}: {e}", probe_root.display()))?;
    let folders = Folders {
        workspace: dir.join("workspace"),
        outputs: dir.join("outputs"),
        uploads: dir.join("uploads"),
        tmp: dir.join("tmp"),
        skills: Vec::new(),
    };
    for folder in [
        &folders.workspace,
        &folders.outputs,
        &folders.uploads,
        &folders.tmp,
    ] {
        tokio::fs::create_dir_all(folder)
            .await
            .map_err(|e| format!("cannot make the probe's folders in {}: {e}", dir.display()))?;
    }
    if let Some(owner) = sandbox.run_as() {
        super::hand_over(&folders, probe_root, owner);
    }
    let mut spec = sandbox.spec(&folders, "true", PROBE_TIMEOUT);
    spec.probe_hidden = Some(hidden.to_path_buf());
    let env = vec![
        (
            "PATH".to_owned(),
            std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".to_owned()),
        ),
        ("HOME".to_owned(), folders.workspace.display().to_string()),
    ];
    let mut command = sandbox.command(&spec, &env).map_err(|e| e.to_string())?;
    command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start it: {e}"))?;
    let control = child.stdin.take();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let ran = tokio::time::timeout(PROBE_TIMEOUT, async {
        let mut out = Vec::new();
        let mut err = Vec::new();
        if let Some(stdout) = stdout.as_mut() {
            let _ = stdout.take(64 * 1024).read_to_end(&mut out).await;
        }
        if let Some(stderr) = stderr.as_mut() {
            let _ = stderr.take(64 * 1024).read_to_end(&mut err).await;
        }
        (child.wait().await, out, err)
    })
    .await;
    drop(control);
    let (status, out, err) = ran.map_err(|_| "the probe did not finish in time".to_owned())?;
    let status = status.map_err(|e| format!("lost the probe: {e}"))?;
    let err = String::from_utf8_lossy(&err);
    if !status.success() {
        let why = err.lines().last().unwrap_or("no message").trim();
        let why = why
            .strip_prefix(super::SETUP_FAILED_PREFIX)
            .unwrap_or(why)
            .chars()
            .take(300)
            .collect::<String>();
        return Err(format!("the probe failed ({status}): {why}"));
    }
    let out = String::from_utf8_lossy(&out);
    let report: ProbeReport = out
        .lines()
        .next()
        .and_then(|line| serde_json::from_str(line).ok())
        .ok_or_else(|| "the probe reported nothing".to_owned())?;
    judge(sandbox, &report)?;
    Ok(report)
}

/// Why `report` does not show a confined command under `sandbox`, if it does not.
fn judge(sandbox: &Sandbox, report: &ProbeReport) -> Result<(), String> {
    if !report.cap_eff.trim_start_matches('0').is_empty() {
        return Err(format!(
            "the command kept capabilities ({})",
            report.cap_eff
        ));
    }
    if report.uid == 0 {
        return Err("the command ran as root".to_owned());
    }
    if !report.no_new_privs || report.seccomp != 2 {
        return Err("no-new-privileges or the seccomp filter is missing".to_owned());
    }
    if !sandbox.network() && report.ip_socket {
        return Err("the command could open an IP socket".to_owned());
    }
    if sandbox.backend() == Backend::None {
        return Ok(());
    }
    if report.hidden_readable {
        return Err("the command could read the store's folder".to_owned());
    }
    if sandbox.backend() == Backend::Landlock && report.landlock == "not" {
        return Err("Landlock is not enforced".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn confined() -> ProbeReport {
        ProbeReport {
            uid: 65534,
            cap_eff: "0000000000000000".to_owned(),
            no_new_privs: true,
            seccomp: 2,
            landlock: "fully".to_owned(),
            ip_socket: false,
            hidden_readable: false,
        }
    }

    fn sandbox(backend: Backend) -> Sandbox {
        Sandbox::new(
            backend,
            false,
            SandboxLimits::default(),
            PathBuf::from("/antler"),
            None,
        )
    }

    #[test]
    fn a_probe_that_shows_a_gap_refuses_the_backend() {
        let landlock = sandbox(Backend::Landlock);
        assert_eq!(judge(&landlock, &confined()), Ok(()));
        type Gap = fn(&mut ProbeReport);
        let gaps: [(Gap, &str); 6] = [
            (
                |r| r.cap_eff = "000001ffffffffff".to_owned(),
                "capabilities",
            ),
            (|r| r.uid = 0, "root"),
            (|r| r.seccomp = 0, "seccomp"),
            (|r| r.ip_socket = true, "IP socket"),
            (|r| r.hidden_readable = true, "store"),
            (|r| r.landlock = "not".to_owned(), "Landlock"),
        ];
        for (open, why) in gaps {
            let mut report = confined();
            open(&mut report);
            let error = judge(&landlock, &report).unwrap_err();
            assert!(error.contains(why), "{why}: {error}");
        }
        // `none` promises no isolation of the file system, only the rest.
        let mut report = confined();
        report.hidden_readable = true;
        report.landlock = "not".to_owned();
        assert_eq!(judge(&sandbox(Backend::None), &report), Ok(()));
        report.ip_socket = true;
        assert!(judge(&sandbox(Backend::None), &report).is_err());
    }

    #[tokio::test]
    async fn every_backend_this_machine_has_passes_its_probe_or_says_why_not() {
        let dir = tempfile::tempdir().unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        if launcher_path().is_none() {
            eprintln!("skipped: the antler binary (the sandbox launcher) is not built");
            return;
        }
        for mode in [SandboxMode::Bwrap, SandboxMode::Landlock, SandboxMode::None] {
            let found = detect(mode, false, SandboxLimits::default(), dir.path(), None).await;
            match &found.sandbox {
                Some(sandbox) => {
                    if sandbox.backend() != Backend::None {
                        let report = found.report.as_ref().unwrap();
                        assert_eq!(judge(sandbox, report), Ok(()), "{mode:?}");
                    }
                    assert!(found.describe().starts_with(sandbox.backend().name()));
                }
                None => {
                    assert!(!found.refused.is_empty(), "{mode:?}");
                    eprintln!("{mode:?} not available here: {}", found.describe());
                }
            }
            // The probe cleans up after itself.
            assert_eq!(
                std::fs::read_dir(dir.path()).unwrap().count(),
                0,
                "{mode:?}"
            );
        }
    }

    #[test]
    fn bwrap_is_looked_up_on_path() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let fake = bin.join("bwrap");
        std::fs::write(&fake, "#!/bin/sh\n").unwrap();
        let path = format!("relative:/nonexistent:{}", bin.display());
        assert_eq!(find_on_path("bwrap", Some(&path)), None, "not executable");
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(find_on_path("bwrap", Some(&path)), Some(fake));
        assert_eq!(find_on_path("bwrap", None), None);
    }
}
