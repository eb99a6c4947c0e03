//! A Server-Sent Events client for the tests and benches, over a raw socket: the request is
//! written by hand, the response's chunked body decoded here, and each event parsed as the
//! SSE specification says (`field: value` lines, a blank line ends an event, `:` starts a
//! comment). Written against the wire format, not against the server's code, so the tests
//! see exactly what a browser's EventSource or `curl -N` would.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One event of the stream (or a comment line, when `comment` is set).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ev {
    pub id: Option<String>,
    pub event: String,
    pub data: String,
    pub comment: bool,
}

impl Ev {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.data).unwrap_or_else(|e| {
            panic!(
                "event {:?}: data is not JSON ({e}): {}",
                self.event, self.data
            )
        })
    }
}

pub trait Conn: Read + Write + Send {}
impl<T: Read + Write + Send> Conn for T {}

/// An open stream (or the error response that came instead).
pub struct Sse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    reader: BufReader<Box<dyn Conn>>,
    chunked: bool,
    /// Bytes left in the current chunk; `None` at the end of the body.
    chunk_left: Option<usize>,
    line: Vec<u8>,
    /// Bytes of body read so far.
    pub body_bytes: u64,
}

impl Sse {
    /// `GET path` over TCP with the given extra headers (`Host` is added).
    pub fn open(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Sse {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Sse::over(Box::new(s), &addr.to_string(), path, headers)
    }

    /// The same over an established connection (a unix socket, a socket with a small receive
    /// buffer).
    pub fn over(mut conn: Box<dyn Conn>, host: &str, path: &str, headers: &[(&str, &str)]) -> Sse {
        let mut req =
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        conn.write_all(req.as_bytes()).expect("send the request");
        let mut reader = BufReader::new(conn);
        let mut status_line = String::new();
        reader.read_line(&mut status_line).expect("status line");
        let status: u16 = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
        let mut headers = Vec::new();
        loop {
            let mut l = String::new();
            reader.read_line(&mut l).expect("header line");
            let l = l.trim_end();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').expect("a header");
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
        let length = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok());
        Sse {
            status,
            headers,
            reader,
            chunked,
            chunk_left: if chunked {
                Some(0)
            } else {
                length.or(Some(usize::MAX))
            },
            line: Vec::new(),
            body_bytes: 0,
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The whole body of a response that is not a stream (an error).
    pub fn text(mut self) -> String {
        let mut out = Vec::new();
        while let Some(b) = self.byte() {
            out.push(b);
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// The next body byte; `None` at the end of the body (or of the connection).
    fn byte(&mut self) -> Option<u8> {
        loop {
            match self.chunk_left {
                None => return None,
                Some(0) if self.chunked => {
                    let mut size = String::new();
                    if self.reader.read_line(&mut size).ok()? == 0 {
                        self.chunk_left = None;
                        return None;
                    }
                    let size = size.trim();
                    if size.is_empty() {
                        continue; // the CRLF after a chunk's data
                    }
                    let n = usize::from_str_radix(size.split(';').next()?, 16)
                        .unwrap_or_else(|_| panic!("bad chunk size {size:?}"));
                    if n == 0 {
                        self.chunk_left = None;
                        return None;
                    }
                    self.chunk_left = Some(n);
                }
                Some(0) => {
                    self.chunk_left = None;
                    return None;
                }
                Some(n) => {
                    let mut b = [0u8];
                    match self.reader.read(&mut b) {
                        Ok(1) => {
                            self.chunk_left = Some(n - 1);
                            self.body_bytes += 1;
                            return Some(b[0]);
                        }
                        _ => {
                            self.chunk_left = None;
                            return None;
                        }
                    }
                }
            }
        }
    }

    /// The next line of the body, without its end; `None` at the end.
    fn body_line(&mut self) -> Option<String> {
        self.line.clear();
        loop {
            match self.byte() {
                Some(b'\n') => break,
                Some(b) => self.line.push(b),
                None if self.line.is_empty() => return None,
                None => break,
            }
        }
        if self.line.last() == Some(&b'\r') {
            self.line.pop();
        }
        Some(String::from_utf8(self.line.clone()).expect("SSE is UTF-8"))
    }

    /// The next event or comment; `None` when the stream ended.
    pub fn next(&mut self) -> Option<Ev> {
        let mut ev = Ev::default();
        let mut any = false;
        let mut data: Vec<String> = Vec::new();
        loop {
            let line = self.body_line()?;
            if line.is_empty() {
                if any {
                    ev.data = data.join("\n");
                    return Some(ev);
                }
                continue;
            }
            if let Some(c) = line.strip_prefix(':') {
                if !any {
                    return Some(Ev {
                        comment: true,
                        data: c.trim().to_string(),
                        ..Ev::default()
                    });
                }
                continue;
            }
            any = true;
            let (field, value) = line.split_once(':').unwrap_or((&line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "id" => ev.id = Some(value.to_string()),
                "event" => ev.event = value.to_string(),
                "data" => data.push(value.to_string()),
                _ => {}
            }
        }
    }

    /// The next event, skipping comments.
    pub fn event(&mut self) -> Option<Ev> {
        loop {
            match self.next()? {
                e if e.comment => continue,
                e => return Some(e),
            }
        }
    }

    /// Events until one named `name` (returned with those before it).
    pub fn until(&mut self, name: &str) -> (Vec<Ev>, Ev) {
        let mut before = Vec::new();
        loop {
            let e = self.event().unwrap_or_else(|| {
                panic!("the stream ended before a {name:?} event; got {before:?}")
            });
            if e.event == name {
                return (before, e);
            }
            before.push(e);
        }
    }
}

/// A TCP connection whose receive buffer is `bytes` (set before connecting, so the window
/// never grows past it): a client that reads slowly fills up fast.
pub fn small_buffer_conn(addr: SocketAddr, bytes: i32) -> TcpStream {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: socket(2) with constant arguments; the descriptor is owned by the TcpStream made
    // from it below (or closed on the error path).
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    // SAFETY: fd is a valid socket we own; the pointer and length describe a live i32.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &bytes as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "SO_RCVBUF: {}", std::io::Error::last_os_error());
    let SocketAddr::V4(v4) = addr else {
        panic!("IPv4 only")
    };
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*v4.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: fd is a valid socket; sin is a live, correctly sized sockaddr_in.
    let r = unsafe {
        libc::connect(
            fd,
            &sin as *const libc::sockaddr_in as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: fd is ours and not yet owned by anything else.
        unsafe { libc::close(fd) };
        panic!("connect: {e}");
    }
    // SAFETY: fd is a connected socket that nothing else owns.
    let s = unsafe { TcpStream::from_raw_fd(fd) };
    debug_assert!(s.as_raw_fd() >= 0);
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s
}
