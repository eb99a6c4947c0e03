//! `run` as a person at a terminal sees it: its stderr a real pseudo-terminal, the end of a run
//! said in one line (the whole JSON report only with `--stats-json`, or when stderr is not a
//! terminal, as scripts read it).

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};

/// A pseudo-terminal: (the side the test reads, the side the child writes).
fn pty() -> (std::fs::File, OwnedFd) {
    let (mut main, mut sub) = (-1, -1);
    // SAFETY: openpty writes two new descriptors into the two ints it is given and reads
    // nothing else (null name, termios and window size are allowed).
    let rc = unsafe {
        libc::openpty(
            &mut main,
            &mut sub,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened by openpty and are owned by nothing else.
    unsafe { (std::fs::File::from_raw_fd(main), OwnedFd::from_raw_fd(sub)) }
}

/// `run --events FILE` with stderr on a terminal: what the terminal showed.
fn on_a_terminal(extra: &[&str]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.ndjson");
    let lines: String = (0..20)
        .map(|i| {
            format!(
                "{{\"event\":\"tool_call_start\",\"agent\":\"a\",\"session\":\"s\",\"payload\":{{\"tool\":\"t{i}\",\"arguments\":{{}}}}}}\n"
            )
        })
        .collect();
    std::fs::write(&events, lines).unwrap();
    std::fs::write(
        dir.path().join("hooks.json"),
        r#"{"hooks": {"tool_call_start": [{"id": "t", "command": "/bin/true"}]}}"#,
    )
    .unwrap();
    let (mut main, sub) = pty();
    let mut child = Command::new(env!("CARGO_BIN_EXE_prx-hooks"))
        .args(["run", "--events"])
        .arg(&events)
        .arg("--workspace")
        .arg(dir.path())
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(sub))
        .spawn()
        .unwrap();
    let status = child.wait().unwrap();
    // The child is gone and the test holds no copy of its side: reading ends with EIO.
    let mut shown = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match main.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => shown.extend_from_slice(&buf[..n]),
        }
    }
    (
        status.code().unwrap(),
        String::from_utf8_lossy(&shown).replace('\r', ""),
    )
}

#[test]
fn a_run_on_a_terminal_ends_with_one_line_and_the_json_only_when_asked() {
    let (code, shown) = on_a_terminal(&[]);
    assert_eq!(code, 0, "{shown}");
    let last = shown.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("prx-hooks: stopped: 20 event(s), 20 processed, 0 lost"),
        "{shown}"
    );
    assert!(
        last.contains("--stats-json"),
        "no way to the report: {last}"
    );
    assert!(
        !shown.contains("\"stats\""),
        "the JSON report on a terminal: {shown}"
    );

    let (code, shown) = on_a_terminal(&["--stats-json"]);
    assert_eq!(code, 0, "{shown}");
    let last = shown.lines().last().unwrap_or_default();
    let report: serde_json::Value = serde_json::from_str(last).expect(last);
    assert_eq!(report["stats"]["processed"], 20);
}

/// Ctrl-C typed at the terminal `run --listen` serves from (the terminal's own SIGINT to its
/// foreground process group, not a signal the test sends): the run ends with the one line, not
/// the JSON report.
#[test]
fn ctrl_c_at_the_terminal_ends_a_serving_run_with_one_line() {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hooks.json"), r#"{"hooks": {}}"#).unwrap();
    let (mut main, sub) = pty();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prx-hooks"));
    cmd.args(["run", "--listen", "127.0.0.1:0", "--workspace"])
        .arg(dir.path())
        .env("RUST_LOG", "warn")
        .env_remove("PRX_HOOKS_TOKEN")
        .stdin(Stdio::from(sub.try_clone().unwrap()))
        .stdout(Stdio::from(sub.try_clone().unwrap()))
        .stderr(Stdio::from(sub));
    // SAFETY: setsid(2) and ioctl(2) are async-signal-safe; nothing else runs between fork
    // and exec. The child leads a session of its own whose controlling terminal is the pty,
    // as a shell's foreground job is.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop(cmd);
    let mut reader = main.try_clone().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let shown = std::thread::spawn(move || {
        let mut shown = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match reader.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    shown.extend_from_slice(&buf[..n]);
                    let _ = tx.send(String::from_utf8_lossy(&shown).into_owned());
                }
            }
        }
        String::from_utf8_lossy(&shown).replace('\r', "")
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            // The whole line, not the part of it one read returned: a Ctrl-C in the middle of
            // it would leave it cut where the run's last line should be.
            Ok(s)
                if s.split_once("console on")
                    .is_some_and(|(_, rest)| rest.contains('\n')) =>
            {
                break;
            }
            Ok(_) => {}
            Err(_) => {
                let _ = child.kill();
                panic!("run never said where its console is");
            }
        }
    }
    main.write_all(b"\x03").unwrap();
    let status = child.wait().unwrap();
    drop(main);
    let shown = shown.join().unwrap();
    assert_eq!(status.code(), Some(0), "{shown}");
    // The terminal echoes the Ctrl-C it turned into SIGINT as `^C`.
    let last = shown.lines().last().unwrap_or_default();
    let last = last.strip_prefix("^C").unwrap_or(last);
    assert!(last.starts_with("prx-hooks: stopped: "), "{shown}");
    assert!(
        !shown.contains("\"stats\""),
        "the JSON report on a terminal: {shown}"
    );
}
