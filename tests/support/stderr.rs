//! A child's stderr read line by line on a thread of its own, for tests that wait for log lines.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::{BufRead, BufReader};
use std::process::Child;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long [`Lines::next_with`] waits for its line.
const WAIT: Duration = Duration::from_secs(30);

/// The stderr lines of a child process: those read so far in `seen`, the rest as they come.
pub struct Lines {
    rx: mpsc::Receiver<String>,
    /// Every line read so far, in order.
    pub seen: Vec<String>,
}

impl Lines {
    /// Takes `child`'s piped stderr and reads it on a thread (a full pipe would block it).
    pub fn of(child: &mut Child) -> Lines {
        let stderr = child.stderr.take().expect("stderr piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Lines {
            rx,
            seen: Vec::new(),
        }
    }

    /// The next line containing `needle` (30 s at most, then a panic showing what was seen);
    /// the lines before it stay in `seen`.
    pub fn next_with(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.contains(needle) {
                        return l;
                    }
                }
                Err(_) => panic!(
                    "no stderr line with {needle:?}; saw:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// A line containing `needle`: the first already seen, else the next one to come.
    pub fn find(&mut self, needle: &str) -> String {
        match self.seen.iter().find(|l| l.contains(needle)) {
            Some(l) => l.clone(),
            None => self.next_with(needle),
        }
    }

    /// Every line: those seen, then the rest until the child closes its stderr.
    pub fn all(&mut self) -> Vec<String> {
        self.seen.extend(self.rx.iter());
        std::mem::take(&mut self.seen)
    }
}
