//! A loopback TCP relay that can cut every connection through it and refuse new ones until
//! told to pass again: the network dropping under a client, for the tests of reconnecting.

#![allow(dead_code)]

use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub struct Relay {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    target: SocketAddr,
    /// While false, accepted connections are closed at once.
    open: AtomicBool,
    /// Both halves of every relayed connection, to cut them.
    live: Mutex<Vec<TcpStream>>,
    accepted: AtomicU64,
}

impl Relay {
    pub fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            target,
            open: AtomicBool::new(true),
            live: Mutex::new(Vec::new()),
            accepted: AtomicU64::new(0),
        });
        let s = shared.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                s.accepted.fetch_add(1, Ordering::Relaxed);
                if !s.open.load(Ordering::Acquire) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(s.target) else {
                    continue;
                };
                {
                    let mut live = s.live.lock().unwrap();
                    live.push(client.try_clone().unwrap());
                    live.push(server.try_clone().unwrap());
                }
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server, client);
            }
        });
        Relay { addr, shared }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Cuts every connection and refuses new ones.
    pub fn cut(&self) {
        self.shared.open.store(false, Ordering::Release);
        for s in self.shared.live.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Relays new connections again.
    pub fn restore(&self) {
        self.shared.open.store(true, Ordering::Release);
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
    });
}
