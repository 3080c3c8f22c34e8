//! The skills of one run as the model sees them: read-only at `/mnt/skills/<name>/`.
//!
//! The file tools resolve a path under [`SKILLS_ROOT`] here ([`SkillMounts::resolve`]: the
//! skill must be on for the run, no `..`) and open it beneath a handle on the skill's folder
//! with links refused ([`SkillMounts::open`]); nothing writes there. The shell sees the same
//! folders the way it sees the thread's: virtual paths in a command become the host folders
//! ([`SkillMounts::host_pairs`]) and back in its output, and the sandbox binds (bubblewrap)
//! or allows (Landlock) each folder read-only.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use super::Skill;
use crate::agent::memory::injection::escape;
use crate::beneath::{Dir, Refused};

/// Where the model sees the skills.
pub(crate) const SKILLS_ROOT: &str = "/mnt/skills";

/// The skills on for one run (cheap to clone: shared).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SkillMounts {
    skills: Arc<Vec<Skill>>,
}

/// A path resolved inside a skill's folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SkillPath {
    /// The skill's name.
    pub(crate) skill: String,
    /// The path inside its folder (empty for the folder itself).
    pub(crate) relative: PathBuf,
    /// `/mnt/skills/<name>/<relative>`, as the model is shown it.
    pub(crate) virtual_path: String,
}

/// Why a path under [`SKILLS_ROOT`] was refused; the message is for the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SkillPathError {
    /// No such skill is on.
    #[error("{0} is not a skill: list {SKILLS_ROOT} to see the skills")]
    Unknown(String),
    /// `..` or something else that leaves the skill's folder.
    #[error("{0} leads outside the skill's folder")]
    Outside(String),
}

impl SkillMounts {
    /// The mounts of `skills`.
    pub(crate) fn new(skills: Vec<Skill>) -> Self {
        Self {
            skills: Arc::new(skills),
        }
    }

    /// The skills, by name.
    pub(crate) fn skills(&self) -> &[Skill] {
        &self.skills
    }

    /// Whether no skill is on.
    pub(crate) fn is_empty(&self) -> bool {
        self.skills.is_empty()
    }

    /// The skill named `name`, when it is on.
    pub(crate) fn get(&self, name: &str) -> Option<&Skill> {
        self.skills.iter().find(|skill| skill.name == name)
    }

    /// Whether `path` (trimmed) is [`SKILLS_ROOT`] or beneath it.
    pub(crate) fn is_skill_path(path: &str) -> bool {
        path.trim()
            .strip_prefix(SKILLS_ROOT)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }

    /// Where `path` (under [`SKILLS_ROOT`], not the root itself) is. `None` for the root.
    pub(crate) fn resolve(&self, path: &str) -> Result<Option<SkillPath>, SkillPathError> {
        let path = path.trim();
        let rest = path
            .strip_prefix(SKILLS_ROOT)
            .filter(|rest| rest.is_empty() || rest.starts_with('/'))
            .ok_or_else(|| SkillPathError::Outside(path.to_owned()))?;
        let mut parts = Vec::new();
        for component in Path::new(rest).components() {
            match component {
                Component::Normal(part) => parts.push(part),
                Component::CurDir | Component::RootDir => {}
                Component::ParentDir | Component::Prefix(_) => {
                    return Err(SkillPathError::Outside(path.to_owned()));
                }
            }
        }
        let Some((first, rest)) = parts.split_first() else {
            return Ok(None);
        };
        let name = first.to_string_lossy();
        if self.get(&name).is_none() {
            return Err(SkillPathError::Unknown(format!("{SKILLS_ROOT}/{name}")));
        }
        let relative: PathBuf = rest.iter().collect();
        let mut virtual_path = format!("{SKILLS_ROOT}/{name}");
        for part in rest {
            virtual_path.push('/');
            virtual_path.push_str(&part.to_string_lossy());
        }
        Ok(Some(SkillPath {
            skill: name.into_owned(),
            relative,
            virtual_path,
        }))
    }

    /// A handle on the folder of the skill `path` is in. Its folder was checked for links
    /// when it was loaded; everything beneath is opened with links refused.
    pub(crate) fn open(&self, path: &SkillPath) -> Result<Dir, Refused> {
        let skill = self.get(&path.skill).ok_or(Refused::NotFound)?;
        Dir::open_trusted(&skill.folder)
    }

    /// `(virtual, host)` folder pairs, for a shell command.
    pub(crate) fn host_pairs(&self) -> Vec<(String, String)> {
        self.skills
            .iter()
            .map(|skill| {
                (
                    format!("{SKILLS_ROOT}/{}", skill.name),
                    skill.folder.display().to_string(),
                )
            })
            .collect()
    }

    /// `(host, virtual)` folder pairs, for what a shell command printed.
    pub(crate) fn virtual_pairs(&self) -> Vec<(String, String)> {
        self.host_pairs()
            .into_iter()
            .map(|(virtual_path, host)| (host, virtual_path))
            .collect()
    }

    /// The skills' host folders (the sandbox mounts them read-only).
    pub(crate) fn folders(&self) -> Vec<PathBuf> {
        self.skills
            .iter()
            .map(|skill| skill.folder.clone())
            .collect()
    }

    /// `ls /mnt/skills`: the skills on, with their descriptions.
    pub(crate) fn listing(&self) -> String {
        if self.skills.is_empty() {
            return format!("{SKILLS_ROOT}/ is empty: no skill is on");
        }
        let mut out = format!(
            "{SKILLS_ROOT}/ ({} skills, read-only):\n",
            self.skills.len()
        );
        for skill in self.skills.iter() {
            // The operator's text, escaped as in the system prompt's list.
            out.push_str(&format!(
                "{}/  ({})\n",
                skill.name,
                escape(&skill.description)
            ));
        }
        out
    }
}
