//! The API token, and the address file beside it: where they come from (ARCHITECTURE.md §
//! HTTP API), how they are written, how the token is compared.
//!
//! Precedence: `--token-file F` (the file's first line), else the `PRX_HOOKS_TOKEN` environment
//! variable, else `<workspace>/.prx-hooks/token`: reused when it exists (so clients keep working
//! across restarts), generated (32 random bytes, hex) with mode 0600 when it does not — or when
//! it is empty (what a crash in the middle of an older, non-atomic write left behind).
//!
//! * A token file must be a regular file owned by this user (or root) and readable by nobody
//!   else (no group or other bits): a token anyone on the machine can read, or replace,
//!   protects nothing. It is checked on the open file, not on the path (no window between the
//!   check and the read), and the workspace's token file is never followed through a symbolic
//!   link (a `--token-file` may be one: mounted secrets are).
//! * Generated files are written whole or not at all (a temporary file, fsync, rename, fsync
//!   of the directory), under an exclusive lock on `.prx-hooks/` (mode 0700 when created), so
//!   two servers starting at once in one workspace agree on one token.
//! * `.prx-hooks/address` (same rules, mode 0600) says where a running `prx-hooks run
//!   --listen` serves: `http://127.0.0.1:7878` or `unix:/path/to/socket`; removed at exit if
//!   it still names that server.

use std::fmt;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The environment variable read when no token file is given.
pub const TOKEN_ENV: &str = "PRX_HOOKS_TOKEN";

/// Where the generated token lives, relative to the workspace.
pub const TOKEN_FILE: &str = ".prx-hooks/token";

/// Where a running server's address is written, relative to the workspace.
pub const ADDRESS_FILE: &str = ".prx-hooks/address";

/// Beside the address: the process id of the server that wrote it. A client that finds that
/// process gone treats the address as stale (a server killed with SIGKILL could not remove it)
/// and never sends the token there: another program may listen on that port now.
pub const SERVER_PID_FILE: &str = ".prx-hooks/server.pid";

/// Token and address files are at most this large.
const MAX_FILE_BYTES: u64 = 4096;

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
    /// The `token_file` given to [`resolve`].
    File(PathBuf),
    /// The environment variable `$PRX_HOOKS_TOKEN`.
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
    /// The token found is not one, or none could be generated.
    Invalid {
        /// Where it came from: a file, the environment variable, or `getrandom`.
        source_name: String,
        /// What is wrong with it.
        reason: String,
    },
    #[error("{}: {reason}", path.display())]
    /// A token file could not be read or written.
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error, for the operator.
        reason: String,
    },
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

    /// The token's text, as sent in `Authorization: Bearer <token>`.
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
        let text = read_private(path, Follow::Yes)?.unwrap_or_default();
        let token = Token::new(first_line(&text), &path.display().to_string())?;
        return Ok((token, TokenSource::File(path.to_path_buf())));
    }
    if let Some(value) = env {
        return Ok((Token::new(value.trim(), TOKEN_ENV)?, TokenSource::Env));
    }
    let path = workspace.join(TOKEN_FILE);
    let _lock = lock_dir(&path)?;
    if let Some(text) = read_private(&path, Follow::No)?
        && !first_line(&text).is_empty()
    {
        let token = Token::new(first_line(&text), &path.display().to_string())?;
        return Ok((token, TokenSource::Workspace(path)));
    }
    let token = Token::generate()?;
    write_private(&path, &format!("{}\n", token.as_str()))?;
    Ok((token, TokenSource::Generated(path)))
}

/// Finds the token a client should send, by the same precedence as [`resolve`], without ever
/// generating one: `None` when the workspace has no token file (no server has started there
/// yet). The same checks apply (owner, mode, no symbolic link for the workspace's file).
pub fn find(
    token_file: Option<&Path>,
    env: Option<&str>,
    workspace: &Path,
) -> Result<Option<(Token, TokenSource)>, TokenError> {
    if token_file.is_some() || env.is_some() {
        return resolve(token_file, env, workspace).map(Some);
    }
    let path = workspace.join(TOKEN_FILE);
    match read_private(&path, Follow::No)? {
        Some(text) if !first_line(&text).is_empty() => {
            let token = Token::new(first_line(&text), &path.display().to_string())?;
            Ok(Some((token, TokenSource::Workspace(path))))
        }
        _ => Ok(None),
    }
}

/// Where the server of `workspace` listens, as `prx-hooks run --listen` wrote it
/// (`http://127.0.0.1:7878` or `unix:/path`); `None` when no server has written it (or the
/// last one removed it at exit). The file is checked like a token file.
///
/// Also `None` when the process that wrote it has exited (its id in [`SERVER_PID_FILE`]): the
/// address is stale and its port may be another program's. A file without that id (written
/// by an older server) is taken as it is.
pub fn read_address(workspace: &Path) -> Result<Option<String>, TokenError> {
    let path = workspace.join(ADDRESS_FILE);
    let address = read_private(&path, Follow::No)?
        .map(|text| first_line(&text).to_string())
        .filter(|a| !a.is_empty());
    if address.is_some() && server_gone(workspace)? {
        return Ok(None);
    }
    Ok(address)
}

/// Whether [`SERVER_PID_FILE`] names a process that no longer exists.
fn server_gone(workspace: &Path) -> Result<bool, TokenError> {
    let path = workspace.join(SERVER_PID_FILE);
    let Some(text) = read_private(&path, Follow::No)? else {
        return Ok(false);
    };
    let Ok(pid) = first_line(&text).parse::<i32>() else {
        return Ok(false);
    };
    if pid <= 0 {
        return Ok(false);
    }
    // Signal 0 checks existence only; EPERM means it exists (another user's).
    Ok(matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Err(nix::errno::Errno::ESRCH)
    ))
}

/// Writes `<workspace>/.prx-hooks/address` (whole, mode 0600): where this server listens, as
/// clients address it. Returns the file's path.
pub fn write_address(workspace: &Path, address: &str) -> Result<PathBuf, TokenError> {
    let path = workspace.join(ADDRESS_FILE);
    let _lock = lock_dir(&path)?;
    // The address first: between the two writes a client sees the new address beside the old
    // (dead) id and waits, rather than the old address beside a live id.
    write_private(&path, &format!("{address}\n"))?;
    write_private(
        &workspace.join(SERVER_PID_FILE),
        &format!("{}\n", std::process::id()),
    )?;
    Ok(path)
}

/// Removes the address file if it still names `address` (another server may have replaced
/// it since).
pub fn remove_address(workspace: &Path, address: &str) {
    let path = workspace.join(ADDRESS_FILE);
    let Ok(_lock) = lock_dir(&path) else { return };
    if let Ok(Some(text)) = read_private(&path, Follow::No)
        && first_line(&text) == address
    {
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(workspace.join(SERVER_PID_FILE));
    }
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("").trim()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Follow {
    Yes,
    No,
}

/// The contents of a private file (`None`: it does not exist). Refused unless it is a regular
/// file of at most 4 KiB, owned by this user or root, with no group or other permission bits.
/// The checks are made on the opened file.
fn read_private(path: &Path, follow: Follow) -> Result<Option<String>, TokenError> {
    let io = |reason: String| TokenError::Io {
        path: path.to_path_buf(),
        reason,
    };
    let mut flags = nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY;
    if follow == Follow::No {
        flags |= nix::libc::O_NOFOLLOW;
    }
    let mut file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
            return Err(io(
                "is a symbolic link; remove it (a token file is never followed through a link)"
                    .into(),
            ));
        }
        Err(e) => return Err(io(format!("cannot open the file: {e}"))),
    };
    let meta = file
        .metadata()
        .map_err(|e| io(format!("cannot read the file: {e}")))?;
    if !meta.is_file() {
        return Err(io("is not a regular file".into()));
    }
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let me = unsafe { nix::libc::geteuid() };
    if meta.uid() != me && meta.uid() != 0 {
        return Err(io(format!(
            "is owned by uid {}, not by this user (uid {me}); a file someone else owns can be \
             replaced by them: create it yourself with mode 0600",
            meta.uid()
        )));
    }
    let mode = meta.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(io(format!(
            "is readable by others (mode {:04o}); run `chmod 600 {}`",
            mode & 0o7777,
            path.display()
        )));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(io("is larger than 4 KiB".into()));
    }
    let mut text = String::new();
    (&mut file)
        .take(MAX_FILE_BYTES)
        .read_to_string(&mut text)
        .map_err(|e| io(format!("cannot read the file: {e}")))?;
    Ok(Some(text))
}

/// An exclusive lock on the directory of `path` (created with mode 0700), held while the
/// guard lives: generating and replacing the files is one step for every process.
fn lock_dir(path: &Path) -> Result<std::fs::File, TokenError> {
    let io = |reason: String| TokenError::Io {
        path: path.to_path_buf(),
        reason,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io(format!("cannot create the directory: {e}")))?;
    let handle =
        std::fs::File::open(dir).map_err(|e| io(format!("cannot open the directory: {e}")))?;
    handle
        .lock()
        .map_err(|e| io(format!("cannot lock the directory: {e}")))?;
    Ok(handle)
}

/// Replaces `path` with `text` whole: a temporary file (mode 0600) in the same directory,
/// written, fsynced, renamed over `path`, then the directory fsynced. A crash leaves the old
/// file or the new one, never a partial one.
fn write_private(path: &Path, text: &str) -> Result<(), TokenError> {
    let io = |reason: String| TokenError::Io {
        path: path.to_path_buf(),
        reason,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut nonce = [0u8; 8];
    getrandom::fill(&mut nonce).map_err(|e| io(format!("no randomness: {e}")))?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(
        ".{name}.{}.{:016x}.tmp",
        std::process::id(),
        u64::from_ne_bytes(nonce)
    ));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| io(format!("cannot create a temporary file: {e}")))?;
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|e| io(format!("cannot write the file: {e}")))?;
        std::fs::rename(&tmp, path).map_err(|e| io(format!("cannot put the file in place: {e}")))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return result;
    }
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io(format!("cannot sync the directory: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_file_then_env_then_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tok");
        write_private(&file, "from-the-file-0123456789\n").unwrap();
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
    fn an_address_whose_server_has_exited_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        write_address(dir.path(), "http://127.0.0.1:7878").unwrap();
        assert_eq!(
            read_address(dir.path()).unwrap().as_deref(),
            Some("http://127.0.0.1:7878"),
            "this process wrote it and lives"
        );
        // A process that has exited (reaped: its id is free).
        let mut child = std::process::Command::new("/bin/true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        write_private(&dir.path().join(SERVER_PID_FILE), &format!("{dead}\n")).unwrap();
        assert_eq!(read_address(dir.path()).unwrap(), None);
        // No id (an older server's file): taken as it is.
        std::fs::remove_file(dir.path().join(SERVER_PID_FILE)).unwrap();
        assert!(read_address(dir.path()).unwrap().is_some());
        remove_address(dir.path(), "http://127.0.0.1:7878");
        assert!(!dir.path().join(ADDRESS_FILE).exists());
    }

    #[test]
    fn a_client_finds_the_token_and_address_without_creating_them() {
        let dir = tempfile::tempdir().unwrap();
        assert!(find(None, None, dir.path()).unwrap().is_none());
        assert!(read_address(dir.path()).unwrap().is_none());
        assert!(!dir.path().join(TOKEN_FILE).exists(), "nothing generated");
        let (t, _) = resolve(None, None, dir.path()).unwrap();
        write_address(dir.path(), "unix:/run/x.sock").unwrap();
        let (found, source) = find(None, None, dir.path()).unwrap().unwrap();
        assert_eq!(found, t);
        assert_eq!(source, TokenSource::Workspace(dir.path().join(TOKEN_FILE)));
        assert_eq!(
            read_address(dir.path()).unwrap().as_deref(),
            Some("unix:/run/x.sock")
        );
        let (env, _) = find(None, Some("from-the-env-0123456789"), dir.path())
            .unwrap()
            .unwrap();
        assert_eq!(env.as_str(), "from-the-env-0123456789");
        std::fs::set_permissions(
            dir.path().join(ADDRESS_FILE),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        assert!(
            read_address(dir.path())
                .unwrap_err()
                .to_string()
                .contains("chmod 600")
        );
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
