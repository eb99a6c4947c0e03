//! A real nats-server for the NATS bridge tests: started on a free loopback port with
//! JetStream (`-js`) and a store in a temporary directory, killed (and restarted on the same
//! port and store) on demand, killed when dropped. A missing nats-server fails the test with
//! the command that installs it: these tests never skip.
//!
//! Also a TCP gate: a loopback forwarder the test can close (cutting every connection through
//! it, refusing new ones) and open again, to decide when a client may reach the server.

#![allow(dead_code)] // each test uses a different subset

use std::io::{BufRead, BufReader};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const INSTALL: &str = "apt-get install -y nats-server";

/// The nats-server binary: on PATH, or Debian's /usr/sbin/nats-server.
pub fn binary() -> PathBuf {
    let candidates = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join("nats-server"));
    for c in candidates {
        if c.is_file() {
            return c;
        }
    }
    panic!(
        "nats-server is not installed: the NATS bridge tests run against a real server; install it with `{INSTALL}` (Debian's 2.9 works)"
    );
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct NatsServer {
    child: Option<Child>,
    /// The address it listens on (127.0.0.1 unless `start_on`).
    pub host: String,
    pub port: u16,
    store: tempfile::TempDir,
    extra: Vec<String>,
}

impl NatsServer {
    /// JetStream on, a fresh store.
    pub fn start() -> NatsServer {
        NatsServer::start_with(&[])
    }

    /// With extra arguments (`--user`, `--pass`, …).
    pub fn start_with(extra: &[&str]) -> NatsServer {
        NatsServer::start_on("127.0.0.1", extra)
    }

    /// Listening on `host` (an address of this machine) only.
    pub fn start_on(host: &str, extra: &[&str]) -> NatsServer {
        let mut s = NatsServer {
            child: None,
            host: host.to_string(),
            port: free_port(),
            store: tempfile::tempdir().unwrap(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        // PRX_HOOKS_NATS_SERVER_LOG=1: the server's debug and protocol trace on stderr.
        let log = std::env::var_os("PRX_HOOKS_NATS_SERVER_LOG").is_some();
        let child = Command::new(binary())
            .args(["-a", &self.host, "-p", &self.port.to_string(), "-js", "-sd"])
            .arg(self.store.path())
            .args(&self.extra)
            .args(if log { &["-DV"][..] } else { &[][..] })
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(if log { Stdio::inherit() } else { Stdio::null() })
            .spawn()
            .unwrap_or_else(|e| panic!("starting nats-server ({INSTALL}): {e}"));
        self.child = Some(child);
        // Ready when it greets a connection with INFO.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(s) = TcpStream::connect((self.host.as_str(), self.port)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let mut line = String::new();
                if BufReader::new(s).read_line(&mut line).is_ok() && line.starts_with("INFO") {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "nats-server did not start on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("nats://{}:{}", self.host, self.port)
    }

    /// SIGKILL, and reaped.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGSTOP: the server holds every connection open and answers nothing until
    /// [`resume`](NatsServer::resume).
    pub fn pause(&self) {
        self.signal(nix::sys::signal::Signal::SIGSTOP);
    }

    /// SIGCONT after [`pause`](NatsServer::pause).
    pub fn resume(&self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn signal(&self, s: nix::sys::signal::Signal) {
        let c = self.child.as_ref().expect("the server runs");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), s).unwrap();
    }

    /// Again on the same port, with the same store.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback TCP forwarder to `target` that can be closed and opened.
pub struct Gate {
    pub port: u16,
    open: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
}

impl Gate {
    pub fn new(target: u16) -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicBool::new(true));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (o, c, s) = (open.clone(), conns.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Acquire) {
                let client = match listener.accept() {
                    Ok((client, _)) => client,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(2));
                        continue;
                    }
                };
                if !o.load(Ordering::Acquire) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let _ = client.set_nonblocking(false);
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let mut list = c.lock().unwrap();
                list.push(client.try_clone().unwrap());
                list.push(server.try_clone().unwrap());
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(Shutdown::Both);
                        let _ = from.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Gate {
            port,
            open,
            conns,
            stop,
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Cuts every connection through the gate and refuses new ones.
    pub fn close(&self) {
        self.open.store(false, Ordering::Release);
        for s in self.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    pub fn open(&self) {
        self.open.store(true, Ordering::Release);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.close();
    }
}

/// A plain NATS client (async-nats on a runtime of its own), as another language's client
/// would be: it knows only the wire format.
pub struct Client {
    pub rt: tokio::runtime::Runtime,
    pub client: async_nats::Client,
}

impl Client {
    pub fn connect(url: &str) -> Client {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mut opts = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .reconnect_delay_callback(|_| Duration::from_millis(20))
            .subscription_capacity(1 << 20);
        // async-nats does not read `user:pass@` from the address itself.
        let (scheme, rest) = url.split_once("://").unwrap_or(("nats", url));
        let addr = match rest.rsplit_once('@') {
            Some((info, host)) => {
                let (u, p) = info.split_once(':').unwrap();
                opts = opts.user_and_password(u.into(), p.into());
                format!("{scheme}://{host}")
            }
            None => url.to_string(),
        };
        let client = rt.block_on(opts.connect(addr)).unwrap();
        Client { rt, client }
    }

    pub fn jetstream(&self) -> async_nats::jetstream::Context {
        let _inside = self.rt.enter();
        async_nats::jetstream::new(self.client.clone())
    }

    /// Publishes with headers (name, value) and waits until the server has it (a flush and
    /// then a round trip through the server).
    pub fn publish(&self, subject: &str, headers: &[(&str, &str)], body: &str) {
        let mut h = async_nats::HeaderMap::new();
        for (k, v) in headers {
            h.insert(*k, *v);
        }
        self.rt
            .block_on(self.client.publish_with_headers(
                subject.to_string(),
                h,
                body.to_string().into(),
            ))
            .unwrap();
    }

    /// Waits until the server has processed everything this client sent before (a message to
    /// a subscription of our own comes back).
    pub fn sync(&self) {
        self.rt.block_on(async {
            use futures_util::StreamExt;
            let inbox = self.client.new_inbox();
            let mut sub = self.client.subscribe(inbox.clone()).await.unwrap();
            loop {
                self.client.publish(inbox.clone(), "".into()).await.unwrap();
                if let Ok(Some(_)) =
                    tokio::time::timeout(Duration::from_millis(500), sub.next()).await
                {
                    return;
                }
            }
        });
    }
}
