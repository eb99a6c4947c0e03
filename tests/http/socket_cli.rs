//! `run --ingest unix:PATH` against a real `prx-hooks run` over a real unix socket: the
//! answers and the summary, a client that never reads.

use crate::send_cli::{Server, logging_workspace, payloads, tool_call};
use crate::support::wait_for;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;

/// Every line the server writes on `conn` until it closes, as JSON.
fn read_answers(conn: UnixStream) -> Vec<Value> {
    BufReader::new(conn)
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect()
}

#[test]
fn the_ingest_socket_is_private_answers_each_refused_line_and_ends_with_a_summary() {
    let (ws, log) = logging_workspace("tool_call");
    let sock = ws.path().join("ingest.sock");
    let arg = format!("unix:{}", sock.display());
    let server = Server::start_with(ws.path(), &["--ingest", &arg]);
    wait_for("the socket", || sock.exists());
    assert_eq!(
        std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let mut conn = UnixStream::connect(&sock).unwrap();
    let body = format!(
        "{}\nnot json\n{}\n",
        tool_call("u", "one"),
        tool_call("u", "two")
    );
    conn.write_all(body.as_bytes()).unwrap();
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    let answers = read_answers(conn);
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert_eq!(
        (&answers[0]["line"], &answers[0]["column"]),
        (&json!(2), &json!(2))
    );
    assert!(
        answers[0]["message"]
            .as_str()
            .unwrap()
            .starts_with("not JSON")
    );
    assert_eq!(
        answers[1],
        json!({"queued": 2, "dropped": 0, "skipped": 0, "refused": 0, "errors": 1})
    );
    wait_for("both hook runs", || payloads(&log).len() == 2);
    let outputs: Vec<String> = payloads(&log)
        .iter()
        .map(|p| p["output"].as_str().unwrap().into())
        .collect();
    assert_eq!(outputs, ["one", "two"]);
    let (code, report) = server.stop();
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["ingest_socket"]["queued"], json!(2), "{report}");
    assert!(!sock.exists(), "the socket file is removed at exit");
}

#[test]
fn a_socket_client_that_never_reads_its_answers_costs_another_client_nothing() {
    let (ws, log) = logging_workspace("tool_call");
    let sock = ws.path().join("ingest.sock");
    let arg = format!("unix:{}", sock.display());
    let server = Server::start_with(ws.path(), &["--ingest", &arg]);
    wait_for("the socket", || sock.exists());
    // 50,000 bad lines, none of whose answers is ever read.
    let mut hostile = UnixStream::connect(&sock).unwrap();
    let garbage = "{\"event\":\"nope\"}\n".repeat(50_000);
    let writer = std::thread::spawn(move || {
        let _ = hostile.write_all(garbage.as_bytes());
        hostile
    });
    let mut good = UnixStream::connect(&sock).unwrap();
    let body: String = (0..200)
        .map(|i| format!("{}\n", tool_call("g", &i.to_string())))
        .collect();
    good.write_all(body.as_bytes()).unwrap();
    good.shutdown(std::net::Shutdown::Write).unwrap();
    let mut summary = String::new();
    good.read_to_string(&mut summary).unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(summary.trim()).unwrap()["queued"],
        json!(200)
    );
    wait_for("the good client's 200 events", || {
        payloads(&log).len() == 200
    });
    let hostile = writer.join().unwrap();
    drop(hostile);
    let (code, report) = server.stop();
    assert_eq!(code, 0, "{report}");
    let s = &report["ingest_socket"];
    assert_eq!(
        (&s["connections"], &s["queued"]),
        (&json!(2), &json!(200)),
        "{report}"
    );
    assert!(s["errors_unsent"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(s["errors"], json!(50_000), "{report}");
}
