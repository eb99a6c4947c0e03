//! Finding and reaching a running server: what `tail` and `send` share.
//!
//! Where the server is (`--url`, `unix:PATH`, or the workspace's `.prx-hooks/address`) and one
//! connection to it, over TCP or a unix socket, for hyper's HTTP/1 client on a current-thread
//! runtime.

use std::path::PathBuf;
use std::time::Duration;

/// Where the server is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// `host:port` to connect to, and the path prefix the API is mounted under.
    Tcp {
        authority: String,
        prefix: String,
    },
    Unix(PathBuf),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Tcp { authority, prefix } => write!(f, "http://{authority}{prefix}"),
            Target::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// `http://HOST:PORT[/PREFIX]`, `HOST:PORT`, or `unix:PATH`.
pub(crate) fn parse_url(url: &str) -> Result<Target, String> {
    let url = url.trim();
    if let Some(path) = url.strip_prefix("unix:") {
        if path.is_empty() {
            return Err(format!("{url:?}: expected unix:PATH"));
        }
        return Ok(Target::Unix(path.into()));
    }
    if url.starts_with("https://") {
        return Err(format!(
            "{url:?}: TLS is not supported; use http:// (the API serves loopback) or unix:PATH"
        ));
    }
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (authority, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err(format!(
            "{url:?}: expected http://HOST:PORT[/PREFIX] or unix:PATH"
        ));
    }
    let authority = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        && !authority.ends_with(']')
    {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    Ok(Target::Tcp {
        authority,
        prefix: prefix.to_string(),
    })
}

/// The connection's I/O, TCP or unix.
pub(crate) trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// Connects to `target`, giving up after `timeout` (TCP; a unix socket answers at once).
pub(crate) async fn connect(target: &Target, timeout: Duration) -> std::io::Result<Box<dyn Io>> {
    let io: Box<dyn Io> = match target {
        Target::Tcp { authority, .. } => {
            let s =
                tokio::time::timeout(timeout, tokio::net::TcpStream::connect(authority.as_str()))
                    .await
                    .map_err(|_| {
                        std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")
                    })??;
            s.set_nodelay(true)?;
            Box::new(s)
        }
        Target::Unix(path) => Box::new(tokio::net::UnixStream::connect(path).await?),
    };
    Ok(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_addresses_parse() {
        assert_eq!(
            parse_url("http://127.0.0.1:7878").unwrap(),
            Target::Tcp {
                authority: "127.0.0.1:7878".into(),
                prefix: String::new()
            }
        );
        assert_eq!(
            parse_url("localhost:9/prx/").unwrap(),
            Target::Tcp {
                authority: "localhost:9".into(),
                prefix: "/prx".into()
            }
        );
        assert_eq!(
            parse_url("unix:/run/p.sock").unwrap(),
            Target::Unix("/run/p.sock".into())
        );
        assert!(parse_url("https://x:1").unwrap_err().contains("TLS"));
        assert!(parse_url("unix:").is_err());
    }
}
