//! Finding the config file, and the `.env` file beside it.
//!
//! A command's config is the one `--config` (or `$ANTLER_CONFIG`) names; without either, the
//! first of [`SEARCH_PATHS`] that exists. A `.env` file beside the config supplies the variables
//! its `${VAR}` references need that the environment does not set: `antler init` writes the
//! tokens there, so that the config itself holds none.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Where a command looks, in order, when neither `--config` nor `$ANTLER_CONFIG` names a file:
/// the working directory's `config/antler.toml` (what `antler init` writes), then the system's.
pub const SEARCH_PATHS: &[&str] = &[super::DEFAULT_PATH, "/etc/antler/antler.toml"];

/// The variable that names the config file (as `--config` does).
pub const CONFIG_VAR: &str = "ANTLER_CONFIG";

/// The file of variables read beside the config file.
pub const ENV_FILE: &str = ".env";

/// The largest `.env` file read: it holds a few tokens.
const ENV_FILE_LIMIT: u64 = 64 * 1024;

/// No config file was named and none of the [`SEARCH_PATHS`] exists.
#[derive(Debug, thiserror::Error)]
pub struct ConfigNotFound;

impl std::fmt::Display for ConfigNotFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "no configuration file found; looked at:")?;
        writeln!(f, "  --config and ${CONFIG_VAR}: not given")?;
        for path in SEARCH_PATHS {
            let shown = if path.starts_with('/') {
                (*path).to_owned()
            } else {
                format!("./{path}")
            };
            writeln!(f, "  {shown}: not found")?;
        }
        write!(
            f,
            "create one with `antler init` (or name one with --config PATH)"
        )
    }
}

/// The config file a command uses: `explicit` (from `--config` or `$ANTLER_CONFIG`) when given,
/// else the first of [`SEARCH_PATHS`] that exists.
pub fn locate(explicit: Option<&Path>) -> Result<PathBuf, ConfigNotFound> {
    if let Some(path) = explicit {
        return Ok(path.to_path_buf());
    }
    SEARCH_PATHS
        .iter()
        .map(PathBuf::from)
        .find(|path| path.is_file())
        .ok_or(ConfigNotFound)
}

/// Why the `.env` file beside a config could not be used. Never quotes a line: values are
/// secrets.
#[derive(Debug, thiserror::Error)]
pub enum EnvFileError {
    /// It exists but could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The reason.
        #[source]
        source: std::io::Error,
    },
    /// It is larger than a file of tokens should be.
    #[error("{}: larger than {ENV_FILE_LIMIT} bytes", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// A line is not `NAME=value`, a comment or blank.
    #[error("{}, line {line}: {problem}", path.display())]
    Line {
        /// The file.
        path: PathBuf,
        /// The 1-based line.
        line: usize,
        /// What is wrong, without the line's text.
        problem: &'static str,
    },
}

/// The variables of the `.env` file beside `config_path`; empty when there is none.
pub(crate) fn read_env_file(config_path: &Path) -> Result<HashMap<String, String>, EnvFileError> {
    let path = config_path
        .parent()
        .unwrap_or_else(|| Path::new(""))
        .join(ENV_FILE);
    let io = |source| EnvFileError::Io {
        path: path.clone(),
        source,
    };
    let file = match std::fs::File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HashMap::new()),
        Err(e) => return Err(io(e)),
    };
    let mut text = String::new();
    use std::io::Read as _;
    file.take(ENV_FILE_LIMIT + 1)
        .read_to_string(&mut text)
        .map_err(io)?;
    if text.len() as u64 > ENV_FILE_LIMIT {
        return Err(EnvFileError::TooLarge { path });
    }
    parse_env_file(&text).map_err(|(line, problem)| EnvFileError::Line {
        path: path.clone(),
        line,
        problem,
    })
}

/// Parses `.env` text: `NAME=value` lines (an `export ` prefix is allowed), blank lines and `#`
/// comments. A value may be wrapped in single quotes (taken as is) or double quotes (`\"`,
/// `\\` and `\n` escapes); an unquoted value ends at ` #` and is trimmed. Errors carry the line
/// number and the problem.
pub(crate) fn parse_env_file(text: &str) -> Result<HashMap<String, String>, (usize, &'static str)> {
    let mut vars = HashMap::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line).trim_start();
        let Some((name, value)) = line.split_once('=') else {
            return Err((number, "expected NAME=value"));
        };
        let name = name.trim_end();
        if !super::env::is_var_name(name) {
            return Err((number, "invalid variable name"));
        }
        let value = value.trim_start();
        let value = if let Some(rest) = value.strip_prefix('\'') {
            let Some(end) = rest.find('\'') else {
                return Err((number, "unterminated single quote"));
            };
            rest[..end].to_owned()
        } else if let Some(rest) = value.strip_prefix('"') {
            let mut out = String::new();
            let mut chars = rest.chars();
            let mut closed = false;
            while let Some(c) = chars.next() {
                match c {
                    '"' => {
                        closed = true;
                        break;
                    }
                    '\\' => match chars.next() {
                        Some('n') => out.push('\n'),
                        Some(other) => out.push(other),
                        None => break,
                    },
                    other => out.push(other),
                }
            }
            if !closed {
                return Err((number, "unterminated double quote"));
            }
            out
        } else {
            let end = value.find(" #").unwrap_or(value.len());
            value[..end].trim_end().to_owned()
        };
        vars.insert(name.to_owned(), value);
    }
    Ok(vars)
}
