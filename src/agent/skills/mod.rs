//! Skills: folders of instructions (and files beside them) the model reads when it needs
//! them, in the open skills format DeerFlow and Anthropic use.
//!
//! A skill is a folder holding `SKILL.md`: YAML front matter (`name`, `description`, optional
//! `allowed-tools` and `license`; other keys are kept out of the way) between two `---` lines,
//! then the instructions. [`load`] reads the folders of `skills.paths` once at start; a skill
//! that breaks a rule (below) is left out and reported with its file and the reason, never
//! fatal. Every read goes beneath a handle on the skills folder with links refused
//! ([`crate::beneath`]), and a skill folder holding a link anywhere is refused whole: what the
//! model and the shell may read is exactly the files the operator put there.
//!
//! Rules, so an operator's typo cannot flood the prompt: `SKILL.md` at most
//! [`MAX_SKILL_MD_BYTES`]; `name` in the format's charset (lowercase letters, digits, single
//! hyphens, at most [`MAX_NAME_CHARS`]) and equal to its folder's name; `description` at most
//! [`MAX_DESCRIPTION_CHARS`]; at most [`MAX_SKILLS`] skills; at most [`MAX_FILES`] entries in
//! one skill folder.
//!
//! Which skills are on is the deployment's, kept in the store ([`SkillSwitches`]): a skill
//! found is on until an admin turns it off (`/skills disable NAME`, the skills API).

pub(crate) mod mounts;

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::beneath::{Dir, EntryKind, Refused};

pub(crate) use mounts::{SKILLS_ROOT, SkillMounts};

/// The largest `SKILL.md` read.
pub(crate) const MAX_SKILL_MD_BYTES: u64 = 64 * 1024;
/// The longest skill name.
pub(crate) const MAX_NAME_CHARS: usize = 64;
/// The longest description.
pub(crate) const MAX_DESCRIPTION_CHARS: usize = 1024;
/// The most skills loaded (and so listed to the model).
pub(crate) const MAX_SKILLS: usize = 100;
/// The most entries (files and folders, at any depth) one skill folder may hold.
pub(crate) const MAX_FILES: usize = 1000;
/// The most tools one `allowed-tools` may name.
const MAX_ALLOWED_TOOLS: usize = 64;
/// How deep a skill folder is walked for links.
const MAX_DEPTH: usize = 8;

/// `[skills]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct SkillsConfig {
    /// Whether skills are listed to the model and mounted at all.
    pub(crate) enabled: bool,
    /// Folders holding skill folders; relative ones are taken from the config file's folder.
    /// Empty: `skills/public` and `skills/custom` there.
    pub(crate) paths: Vec<PathBuf>,
    /// The config file's folder, which relative paths start from (set when the file is
    /// loaded; the working directory otherwise).
    #[serde(skip)]
    pub(crate) base: PathBuf,
}

impl Default for SkillsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            paths: Vec::new(),
            base: PathBuf::new(),
        }
    }
}

impl SkillsConfig {
    /// The folders skills are loaded from, each with whether the config named it (a folder
    /// the config names must exist; the default ones may be missing).
    pub(crate) fn folders(&self) -> Vec<(PathBuf, bool)> {
        if self.paths.is_empty() {
            return ["skills/public", "skills/custom"]
                .into_iter()
                .map(|p| (self.base.join(p), false))
                .collect();
        }
        self.paths
            .iter()
            .map(|p| (self.base.join(p), true))
            .collect()
    }
}

/// One loaded skill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Skill {
    /// Its name, also its folder's name and its place under [`SKILLS_ROOT`].
    pub(crate) name: String,
    /// What it is for, as the model is told (one line).
    pub(crate) description: String,
    /// `allowed-tools`: once its `SKILL.md` was read, the only tools of the run.
    pub(crate) allowed_tools: Option<Vec<String>>,
    /// `license`, shown to operators.
    pub(crate) license: Option<String>,
    /// Its folder on the host.
    pub(crate) folder: PathBuf,
}

/// A skill that was left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InvalidSkill {
    /// The file or folder at fault.
    pub(crate) file: PathBuf,
    /// Why, for the operator.
    pub(crate) reason: String,
}

impl std::fmt::Display for InvalidSkill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file.display(), self.reason)
    }
}

/// What [`load`] found: the skills by name, and what it left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Catalogue {
    /// By name, so every listing is in one stable order.
    pub(crate) skills: BTreeMap<String, Skill>,
    /// Skills left out, with the reason.
    pub(crate) invalid: Vec<InvalidSkill>,
}

impl Catalogue {
    /// The skill named `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&Skill> {
        self.skills.get(name)
    }

    /// The skills `switches` leaves on (a skill without a switch is on), mounted for a run.
    pub(crate) fn mounts(&self, switches: &BTreeMap<String, bool>) -> SkillMounts {
        SkillMounts::new(
            self.skills
                .values()
                .filter(|skill| switches.get(&skill.name).copied().unwrap_or(true))
                .cloned()
                .collect(),
        )
    }
}

/// Which skills an admin turned on or off, per deployment (kept in the store).
#[async_trait::async_trait]
pub(crate) trait SkillSwitches: Send + Sync {
    /// Every switch set so far, by skill name (`true`: on).
    async fn switches(&self) -> Result<BTreeMap<String, bool>, String>;
}

/// The skills of `config`'s folders, each read beneath a handle on its folder (blocking; run
/// it at start or on the blocking pool).
pub(crate) fn load(config: &SkillsConfig) -> Catalogue {
    let mut catalogue = Catalogue::default();
    if !config.enabled {
        return catalogue;
    }
    for (root, named) in config.folders() {
        load_folder(&root, named, &mut catalogue);
    }
    catalogue
}

fn load_folder(root: &Path, named: bool, catalogue: &mut Catalogue) {
    let invalid = |file: &Path, reason: String| InvalidSkill {
        file: file.to_path_buf(),
        reason,
    };
    let dir = match Dir::open_trusted(root) {
        Ok(dir) => dir,
        Err(Refused::NotFound) if !named => return,
        Err(e) => {
            catalogue
                .invalid
                .push(invalid(root, format!("cannot open the skills folder: {e}")));
            return;
        }
    };
    let mut entries = match dir.entries() {
        Ok(entries) => entries,
        Err(e) => {
            catalogue
                .invalid
                .push(invalid(root, format!("cannot list the skills folder: {e}")));
            return;
        }
    };
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    for entry in entries {
        let folder = root.join(&entry.name);
        match entry.kind {
            EntryKind::Folder => {}
            EntryKind::Link => {
                catalogue.invalid.push(invalid(
                    &folder,
                    "is a symbolic link; links in the skills folders are refused".to_owned(),
                ));
                continue;
            }
            // A README or a licence file beside the skills is not a skill.
            EntryKind::File | EntryKind::Other => continue,
        }
        if catalogue.skills.len() >= MAX_SKILLS {
            catalogue.invalid.push(invalid(
                &folder,
                format!("left out: at most {MAX_SKILLS} skills are loaded"),
            ));
            continue;
        }
        let skill_md = folder.join("SKILL.md");
        let read = dir
            .open_dir(Path::new(&entry.name))
            .map_err(|e| format!("cannot open the skill's folder: {e}"))
            .and_then(|skill_dir| read_skill(&skill_dir, &entry.name.to_string_lossy()));
        match read {
            Ok(mut skill) => {
                if let Some(seen) = catalogue.skills.get(&skill.name) {
                    catalogue.invalid.push(invalid(
                        &skill_md,
                        format!(
                            "a skill named `{}` was already loaded from {}",
                            skill.name,
                            seen.folder.display()
                        ),
                    ));
                    continue;
                }
                skill.folder = folder;
                catalogue.skills.insert(skill.name.clone(), skill);
            }
            Err(reason) => catalogue.invalid.push(invalid(&skill_md, reason)),
        }
    }
}

/// The skill in `dir` (its folder named `folder_name`), or why it is refused.
fn read_skill(dir: &Dir, folder_name: &str) -> Result<Skill, String> {
    if let Some(link) = first_link(dir, Path::new(""), 0, &mut 0)? {
        return Err(format!(
            "{} is a symbolic link; links in a skill folder are refused",
            link.display()
        ));
    }
    let opened = dir
        .open_file(Path::new("SKILL.md"), MAX_SKILL_MD_BYTES)
        .map_err(|e| format!("SKILL.md {e}"))?;
    let mut bytes = Vec::new();
    // One byte more than allowed tells a file that grew since it was checked.
    opened
        .file
        .take(MAX_SKILL_MD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read SKILL.md: {e}"))?;
    if bytes.len() as u64 > MAX_SKILL_MD_BYTES {
        return Err(format!(
            "SKILL.md is larger than {} KiB",
            MAX_SKILL_MD_BYTES / 1024
        ));
    }
    let text = String::from_utf8(bytes).map_err(|_| "SKILL.md is not UTF-8 text".to_owned())?;
    parse(&text, folder_name)
}

/// The first symbolic link beneath `dir` (walked to [`MAX_DEPTH`], at most [`MAX_FILES`]
/// entries), as a path inside the skill folder.
fn first_link(
    dir: &Dir,
    here: &Path,
    depth: usize,
    seen: &mut usize,
) -> Result<Option<PathBuf>, String> {
    let entries = dir
        .entries()
        .map_err(|e| format!("cannot list {}: {e}", shown_path(here)))?;
    for entry in entries {
        *seen += 1;
        if *seen > MAX_FILES {
            return Err(format!(
                "the skill folder holds more than {MAX_FILES} entries"
            ));
        }
        let path = here.join(&entry.name);
        match entry.kind {
            EntryKind::Link => return Ok(Some(path)),
            EntryKind::Folder if depth < MAX_DEPTH => {
                let inner = dir
                    .open_dir(Path::new(&entry.name))
                    .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
                if let Some(link) = first_link(&inner, &path, depth + 1, seen)? {
                    return Ok(Some(link));
                }
            }
            EntryKind::Folder => {
                return Err(format!(
                    "{} is nested more than {MAX_DEPTH} folders deep",
                    path.display()
                ));
            }
            EntryKind::File | EntryKind::Other => {}
        }
    }
    Ok(None)
}

fn shown_path(path: &Path) -> String {
    if path.as_os_str().is_empty() {
        "the skill folder".to_owned()
    } else {
        path.display().to_string()
    }
}

/// `allowed-tools`: a YAML list or a string of names separated by spaces (or commas).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum AllowedTools {
    List(Vec<String>),
    Text(String),
}

/// The front matter's keys antler uses; others (`metadata`, `compatibility`, ...) are
/// accepted and ignored.
#[derive(Debug, Deserialize)]
struct FrontMatter {
    name: Option<String>,
    description: Option<String>,
    #[serde(rename = "allowed-tools")]
    allowed_tools: Option<AllowedTools>,
    license: Option<String>,
}

/// The skill `SKILL.md`'s `text` describes, in a folder named `folder_name`.
pub(crate) fn parse(text: &str, folder_name: &str) -> Result<Skill, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    if lines.next().map(str::trim_end) != Some("---") {
        return Err("SKILL.md must start with YAML front matter between `---` lines".to_owned());
    }
    let mut yaml = String::new();
    let mut closed = false;
    for line in lines {
        if line.trim_end() == "---" {
            closed = true;
            break;
        }
        yaml.push_str(line);
    }
    if !closed {
        return Err("SKILL.md's front matter has no closing `---` line".to_owned());
    }
    let front: FrontMatter = serde_norway::from_str(&yaml)
        .map_err(|e| format!("SKILL.md's front matter is not valid YAML: {e}"))?;
    let name = front
        .name
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .ok_or("the front matter has no `name`")?;
    check_name(&name)?;
    if name != folder_name {
        return Err(format!(
            "the name `{name}` is not its folder's name (`{}`)",
            folder_name.escape_default()
        ));
    }
    let description = front
        .description
        .map(|d| one_line(&d))
        .filter(|d| !d.is_empty())
        .ok_or("the front matter has no `description`")?;
    if description.chars().count() > MAX_DESCRIPTION_CHARS {
        return Err(format!(
            "the description is longer than {MAX_DESCRIPTION_CHARS} characters"
        ));
    }
    let allowed_tools = front
        .allowed_tools
        .map(|tools| {
            let names: Vec<String> = match tools {
                AllowedTools::List(list) => list.iter().map(|t| t.trim().to_owned()).collect(),
                AllowedTools::Text(text) => text
                    .split(|c: char| c.is_whitespace() || c == ',')
                    .map(str::to_owned)
                    .collect(),
            };
            names
                .into_iter()
                .filter(|n| !n.is_empty())
                .collect::<Vec<_>>()
        })
        .map(|names| {
            if names.len() > MAX_ALLOWED_TOOLS {
                return Err(format!(
                    "`allowed-tools` names more than {MAX_ALLOWED_TOOLS} tools"
                ));
            }
            match names.iter().find(|n| !is_tool_pattern(n)) {
                Some(bad) => Err(format!(
                    "`allowed-tools` holds `{}`, which is not a tool name",
                    bad.escape_default()
                )),
                None => Ok(names),
            }
        })
        .transpose()?;
    let license = front
        .license
        .map(|l| one_line(&l))
        .filter(|l| !l.is_empty())
        .map(|l| l.chars().take(200).collect());
    Ok(Skill {
        name,
        description,
        allowed_tools,
        license,
        folder: PathBuf::new(),
    })
}

/// Whether `name` is a skill name: lowercase ASCII letters and digits in words joined by
/// single hyphens, at most [`MAX_NAME_CHARS`].
pub(crate) fn is_name(name: &str) -> bool {
    check_name(name).is_ok()
}

fn check_name(name: &str) -> Result<(), String> {
    let well_formed = !name.is_empty()
        && name.len() <= MAX_NAME_CHARS
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--");
    if well_formed {
        Ok(())
    } else {
        Err(format!(
            "the name `{}` is not a skill name (lowercase letters, digits and single hyphens, \
             at most {MAX_NAME_CHARS} characters)",
            name.chars().take(80).collect::<String>().escape_default()
        ))
    }
}

/// A tool name, or a prefix of names ending in `*` (the guardrail's form).
fn is_tool_pattern(name: &str) -> bool {
    let name = name.strip_suffix('*').unwrap_or(name);
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `text` on one line: control characters and runs of white space become one space.
fn one_line(text: &str) -> String {
    text.split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests;
