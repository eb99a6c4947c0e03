//! The API token: where it comes from (ARCHITECTURE.md § HTTP API) and how it is compared.
//!
//! Precedence: `--token-file F` (the file's first line), else the `PRX_HOOKS_TOKEN` environment
//! variable, else `<workspace>/.prx-hooks/token`: reused when it exists (so clients keep working
//! across restarts), generated (32 random bytes, hex) with mode 0600 when it does not. A token
//! file readable by group or others is refused: a token anyone on the machine can read protects
//! nothing.

use std::fmt;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The environment variable read when no token file is given.
pub const TOKEN_ENV: &str = "PRX_HOOKS_TOKEN";

/// Where the generated token lives, relative to the workspace.
pub const TOKEN_FILE: &str = ".prx-hooks/token";

/// Shorter tokens are refused: they can be guessed.
pub const MIN_TOKEN_LEN: usize = 16;

/// A bearer token: printable ASCII without spaces, at least [`MIN_TOKEN_LEN`] characters.
/// `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token(<{} chars>)", self.0.len())
    }
}

/// Where [`resolve`] found the token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenSource {
    File(PathBuf),
    Env,
    /// The workspace's token file, which already existed.
    Workspace(PathBuf),
    /// Written just now into the workspace's token file.
    Generated(PathBuf),
}

impl fmt::Display for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenSource::File(p) => write!(f, "API token read from {}", p.display()),
            TokenSource::Env => write!(f, "API token read from ${TOKEN_ENV}"),
            TokenSource::Workspace(p) => write!(f, "API token read from {}", p.display()),
            TokenSource::Generated(p) => write!(
                f,
                "API token generated into {} (mode 0600); send it as \"Authorization: Bearer <token>\"",
                p.display()
            ),
        }
    }
}

/// Why no token could be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("{source_name}: {reason}")]
    Invalid { source_name: String, reason: String },
    #[error("{}: {reason}", path.display())]
    Io { path: PathBuf, reason: String },
}

impl Token {
    /// Checks a token given by the host application. `source_name` names it in the error.
    pub fn new(token: impl Into<String>, source_name: &str) -> Result<Token, TokenError> {
        let token = token.into();
        let invalid = |reason: String| TokenError::Invalid {
            source_name: source_name.to_string(),
            reason,
        };
        if let Some(c) = token.chars().find(|c| !c.is_ascii_graphic()) {
            return Err(invalid(format!(
                "the token may hold printable ASCII characters only, without spaces; found {:?}",
                c
            )));
        }
        if token.len() < MIN_TOKEN_LEN {
            return Err(invalid(format!(
                "the token is {} characters long; use at least {MIN_TOKEN_LEN} (for example \
                 `openssl rand -hex 32`)",
                token.len()
            )));
        }
        Ok(Token(token))
    }

    /// A new random token: 32 bytes from the operating system, as 64 hex digits.
    pub fn generate() -> Result<Token, TokenError> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| TokenError::Invalid {
            source_name: "getrandom".into(),
            reason: format!("no randomness for a token: {e}"),
        })?;
        Ok(Token(bytes.iter().map(|b| format!("{b:02x}")).collect()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Compares in time independent of where the first difference is.
    pub fn matches(&self, candidate: &[u8]) -> bool {
        let mine = self.0.as_bytes();
        let mut diff = (mine.len() != candidate.len()) as u8;
        for (i, b) in mine.iter().enumerate() {
            diff |= b ^ candidate.get(i).copied().unwrap_or(0);
        }
        diff == 0
    }
}

/// Finds the token: `token_file`, else `$PRX_HOOKS_TOKEN` (`env`), else the workspace's token
/// file (read, or generated). `env` is passed in so callers and tests decide what the
/// environment is.
pub fn resolve(
    token_file: Option<&Path>,
    env: Option<&str>,
    workspace: &Path,
) -> Result<(Token, TokenSource), TokenError> {
    if let Some(path) = token_file {
        let token = read_token_file(path)?;
        return Ok((token, TokenSource::File(path.to_path_buf())));
    }
    if let Some(value) = env {
        return Ok((Token::new(value.trim(), TOKEN_ENV)?, TokenSource::Env));
    }
    let path = workspace.join(TOKEN_FILE);
    if path.exists() {
        let token = read_token_file(&path)?;
        return Ok((token, TokenSource::Workspace(path)));
    }
    let token = Token::generate()?;
    write_private(&path, token.as_str())?;
    Ok((token, TokenSource::Generated(path)))
}

/// The file's first line, trimmed; the file must not be readable by group or others.
fn read_token_file(path: &Path) -> Result<Token, TokenError> {
    let io = |reason: String| TokenError::Io {
        path: path.to_path_buf(),
        reason,
    };
    let meta =
        std::fs::metadata(path).map_err(|e| io(format!("cannot read the token file: {e}")))?;
    if !meta.is_file() {
        return Err(io("the token file is not a regular file".into()));
    }
    let mode = meta.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(io(format!(
            "the token file is readable by others (mode {:04o}); run `chmod 600 {}`",
            mode & 0o7777,
            path.display()
        )));
    }
    if meta.len() > 4096 {
        return Err(io("the token file is larger than 4 KiB".into()));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| io(format!("cannot read the token file: {e}")))?;
    let line = text.lines().next().unwrap_or("").trim();
    Token::new(line, &path.display().to_string())
}

/// Creates `path` (and its directory) with mode 0600, holding `token` and a newline.
fn write_private(path: &Path, token: &str) -> Result<(), TokenError> {
    let io = |reason: String| TokenError::Io {
        path: path.to_path_buf(),
        reason,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| io(format!("cannot create the directory: {e}")))?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| io(format!("cannot create the token file: {e}")))?;
    writeln!(file, "{token}")
        .and_then(|_| file.sync_all())
        .map_err(|e| io(format!("cannot write the token file: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_file_then_env_then_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tok");
        write_private(&file, "from-the-file-0123456789").unwrap();
        let (t, s) = resolve(Some(&file), Some("from-the-env-0123456789"), dir.path()).unwrap();
        assert_eq!(
            (t.as_str(), s),
            ("from-the-file-0123456789", TokenSource::File(file))
        );
        let (t, s) = resolve(None, Some(" from-the-env-0123456789\n"), dir.path()).unwrap();
        assert_eq!(
            (t.as_str(), s),
            ("from-the-env-0123456789", TokenSource::Env)
        );
        let (t, s) = resolve(None, None, dir.path()).unwrap();
        let path = dir.path().join(TOKEN_FILE);
        assert_eq!(s, TokenSource::Generated(path.clone()));
        assert_eq!(t.as_str().len(), 64);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let (again, s) = resolve(None, None, dir.path()).unwrap();
        assert_eq!((again, s), (t, TokenSource::Workspace(path)));
    }

    #[test]
    fn refuses_short_spaced_and_exposed_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let e = resolve(None, Some("short"), dir.path()).unwrap_err();
        assert!(e.to_string().contains("at least 16"), "{e}");
        let e = Token::new("has a space in it, long enough", "x").unwrap_err();
        assert!(e.to_string().contains("printable ASCII"), "{e}");
        let file = dir.path().join("open");
        std::fs::write(&file, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = resolve(Some(&file), None, dir.path()).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
    }

    #[test]
    fn matches_only_the_exact_token() {
        let t = Token::new("0123456789abcdef", "x").unwrap();
        assert!(t.matches(b"0123456789abcdef"));
        assert!(!t.matches(b"0123456789abcdeF"));
        assert!(!t.matches(b"0123456789abcde"));
        assert!(!t.matches(b"0123456789abcdef0"));
        assert!(!t.matches(b""));
        assert_ne!(Token::generate().unwrap(), Token::generate().unwrap());
    }
}
