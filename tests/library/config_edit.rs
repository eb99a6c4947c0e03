//! Editing hooks.json through `config::HooksEditor` (ARCHITECTURE.md § Shell hooks and § HTTP API): real files in
//! temporary workspaces, every result checked against the real loader.

// One module so that the `config::` filter of the CI command selects these tests too.
mod config {
    use prx_hooks::config::{self, EditError, HooksEditor};
    use serde_json::{Value, json};
    use std::path::Path;
    use std::sync::Arc;
    use tempfile::TempDir;

    fn workspace() -> TempDir {
        tempfile::tempdir().expect("temp dir")
    }

    fn write(ws: &Path, text: &str) {
        std::fs::write(ws.join("hooks.json"), text).unwrap();
    }

    fn read(ws: &Path) -> String {
        std::fs::read_to_string(ws.join("hooks.json")).unwrap()
    }

    /// The file on disk must load, and the table must be the one the editor returned.
    fn loads(ws: &Path) -> config::HookTable {
        config::load(ws).unwrap_or_else(|e| panic!("the file no longer loads:\n{e}\n{}", read(ws)))
    }

    fn ids_on_disk(ws: &Path) -> Vec<String> {
        loads(ws).actions.iter().map(|a| a.id.clone()).collect()
    }

    fn invalid(r: Result<impl std::fmt::Debug, EditError>) -> (String, String) {
        match r {
            Err(EditError::Invalid { error, path }) => (error, path),
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    /// HOME is the host's, never the file's (like PATH): the API refuses it in a new hook and
    /// in an edit, naming the field, and the file is left as it was.
    #[test]
    fn an_edit_setting_home_is_refused_and_the_file_is_unchanged() {
        let ws = workspace();
        write(ws.path(), TWO);
        let ed = HooksEditor::new(ws.path());
        let before = read(ws.path());
        for name in ["HOME", "home"] {
            let (error, path) = invalid(ed.create(
                json!({"event": "tool_call", "command": "/bin/true", "env": {name: "/tmp/x"}}),
            ));
            assert_eq!(path, format!("env.{name}"));
            assert!(
                error.contains(&format!(
                    "may not set \"{name}\": hooks get the host's HOME"
                )),
                "{error}"
            );
            assert_eq!(read(ws.path()), before);
        }
        let id = ids_on_disk(ws.path())[0].clone();
        let (error, path) = invalid(ed.update(&id, json!({"env": {"HOME": "/tmp/x"}}), None));
        assert_eq!(path, "env.HOME", "{error}");
        assert!(error.contains("hooks get the host's HOME"), "{error}");
        assert_eq!(read(ws.path()), before);
        assert!(loads(ws.path()).actions.iter().all(|a| a.env.is_empty()));
    }

    const TWO: &str = r#"{
  "timeout_ms": 4000,
  "hooks": {
    "tool_call": [
      { "command": "/bin/true", "args": ["a"] },
      { "command": "/bin/echo", "args": ["b"], "timeout_ms": 100 }
    ],
    "agent_start": [ { "command": "/bin/true" } ]
  }
}"#;

    #[test]
    fn an_absent_file_is_an_empty_list_and_create_makes_it() {
        let ws = workspace();
        let ed = HooksEditor::new(ws.path());
        let l = ed.list().unwrap();
        assert!(l.hooks.is_empty());
        assert!(l.etag.starts_with('"') && l.etag.ends_with('"') && l.etag.len() == 34);
        let w = ed
            .create(json!({"event": "tool_call", "command": "/bin/true", "args": ["x"]}))
            .unwrap();
        assert!(w.hook.id.starts_with("tool_call-"), "{}", w.hook.id);
        assert_eq!(w.hook.json["event"], "tool_call");
        assert_eq!(w.hook.json["args"], json!(["x"]));
        assert_eq!(w.table.actions.len(), 1);
        assert_eq!(
            w.table.source.as_deref(),
            Some(ws.path().join("hooks.json").as_path())
        );
        assert_ne!(w.list_etag, l.etag);
        let t = loads(ws.path());
        assert_eq!(t.actions[0].id, w.hook.id);
        assert!(
            t.actions[0].id_explicit,
            "the assigned id is written into the file"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(ws.path().join("hooks.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o777,
            0o600,
            "a new file is private: it may hold env secrets"
        );
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(ws.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["hooks.json"]);
    }

    #[test]
    fn list_and_get_show_flat_hooks_in_file_order_without_inherited_values() {
        let ws = workspace();
        write(ws.path(), TWO);
        let before = config::load(ws.path()).unwrap();
        let ed = HooksEditor::new(ws.path());
        let l = ed.list().unwrap();
        let ids: Vec<_> = l.hooks.iter().map(|h| h.id.clone()).collect();
        let loader_ids: Vec<_> = before.actions.iter().map(|a| a.id.clone()).collect();
        assert_eq!(ids, loader_ids);
        assert_eq!(
            l.hooks[0].json,
            json!({"command": "/bin/true", "args": ["a"], "event": "tool_call", "id": ids[0]})
        );
        assert!(
            l.hooks[0].json.get("timeout_ms").is_none(),
            "inherited values are left out"
        );
        assert_eq!(l.hooks[1].json["timeout_ms"], 100);
        assert_eq!(l.hooks[2].json["event"], "agent_start");
        let g = ed.get(&ids[1]).unwrap();
        assert_eq!(g, l.hooks[1]);
        assert_ne!(l.hooks[0].etag, l.hooks[1].etag);
        // Reading writes nothing.
        assert_eq!(read(ws.path()), TWO);
        assert!(matches!(ed.get("nope"), Err(e @ EditError::NotFound { .. }) if e.status() == 404));
    }

    #[test]
    fn the_first_write_keeps_the_loaders_ids_and_later_deletes_do_not_shift_them() {
        let ws = workspace();
        // Two identical hooks: the loader gives the second a `-2` suffix.
        write(
            ws.path(),
            r#"{"hooks": {"tool_call": [{"command": "/bin/true"}, {"command": "/bin/true"},
            {"command": "/bin/echo"}]}}"#,
        );
        let before = ids_on_disk(ws.path());
        assert!(before[1].ends_with("-2"), "{before:?}");
        let ed = HooksEditor::new(ws.path());
        let w = ed
            .create(json!({"event": "agent_end", "command": "/bin/true"}))
            .unwrap();
        let after = ids_on_disk(ws.path());
        assert_eq!(&after[..3], &before[..]);
        assert_eq!(after[3], w.hook.id);
        assert!(loads(ws.path()).actions.iter().all(|a| a.id_explicit));
        // Deleting the first hook: the duplicate keeps its `-2` id.
        ed.delete(&before[0], None).unwrap();
        assert_eq!(
            ids_on_disk(ws.path()),
            [before[1].clone(), before[2].clone(), w.hook.id.clone()]
        );
        // And the others do not move when one is added in front of them by hand (with an id).
        ed.delete(&before[2], None).unwrap();
        assert_eq!(ids_on_disk(ws.path()), [before[1].clone(), w.hook.id]);
    }

    #[test]
    fn create_with_an_id_checks_it() {
        let ws = workspace();
        write(ws.path(), TWO);
        let ed = HooksEditor::new(ws.path());
        let w = ed
            .create(json!({"id": "audit", "event": "Tool-Call", "command": "/bin/true"}))
            .unwrap();
        assert_eq!(w.hook.id, "audit");
        assert_eq!(w.hook.json["event"], "tool_call");
        assert_eq!(
            loads(ws.path()).actions[2].id,
            "audit",
            "appended to tool_call"
        );
        let (e, p) =
            invalid(ed.create(json!({"id": "audit", "event": "error", "command": "/bin/true"})));
        assert_eq!(p, "id");
        assert!(e.contains("duplicate id \"audit\""), "{e}");
        let (e, p) =
            invalid(ed.create(json!({"id": "a b", "event": "error", "command": "/bin/true"})));
        assert_eq!(p, "id");
        assert!(
            e.ends_with("is not a valid id: 1 to 64 characters of A-Z a-z 0-9 . _ -"),
            "{e}"
        );
        let err = ed.create(json!({"command": "/bin/true"})).unwrap_err();
        assert_eq!(
            (err.status(), err.kind(), err.path()),
            (422, "invalid", "event")
        );
        let err = ed
            .create(json!({"event": 3, "command": "/bin/true"}))
            .unwrap_err();
        assert_eq!(err.path(), "event");
        let mut deep = json!("x");
        for _ in 0..100 {
            deep = json!([deep]);
        }
        let err = ed
            .create(json!({"event": "error", "command": "/bin/true", "args": deep.clone()}))
            .unwrap_err();
        assert_eq!(err.status(), 400, "{err}");
        let err = ed.update("x", json!({"args": deep}), None).unwrap_err();
        assert_eq!(err.status(), 400, "{err}");
        for bad in [json!([1]), json!("x"), json!(null)] {
            let err = ed.create(bad).unwrap_err();
            assert_eq!((err.status(), err.kind()), (400, "bad_request"), "{err}");
        }
        loads(ws.path());
    }

    /// Validation errors come from the loader, with its message, and a path relative to the body.
    #[test]
    fn validation_errors_use_the_loaders_messages_and_body_paths() {
        let ws = workspace();
        write(ws.path(), TWO);
        let label = config::file_label(ws.path());
        let ed = HooksEditor::new(ws.path());
        let before = read(ws.path());

        // Errors in the hook being written: `PATH: reason`, the path relative to the body, no
        // place in a document that was never written, no server path.
        let (e, p) = invalid(ed.create(json!({"event": "tool_call", "command": "ls; rm"})));
        assert_eq!(p, "command");
        assert!(e.starts_with("command: may not contain ';'"), "{e}");
        assert!(!e.contains(&label), "{e}");

        let (e, p) = invalid(
            ed.create(json!({"event": "tool_call", "command": "/bin/true", "comand": "x"})),
        );
        assert_eq!(p, "comand");
        assert!(
            e.ends_with("unknown field \"comand\"; did you mean \"command\"?"),
            "{e}"
        );

        let (e, p) = invalid(
            ed.create(json!({"event": "agent_start", "command": "/bin/true", "matcher": "x*"})),
        );
        assert_eq!(p, "matcher");
        assert!(
            e.contains("a matcher only applies to tool_call_start and tool_call hooks"),
            "{e}"
        );

        let (e, p) = invalid(
            ed.create(json!({"event": "tool_call", "command": "/bin/true", "args": ["a", "b", 3]})),
        );
        assert_eq!(p, "args[2]");
        assert_eq!(e, "args[2]: expected a string, found number");
        // Placed in the body the client sent, when it is there.
        let body = "{\"event\": \"tool_call\",\n \"args\": [\"a\", \"b\", 3]}";
        let e = EditError::Invalid { error: e, path: p }.in_body(body);
        assert_eq!(
            e.to_string(),
            "body:2:21: args[2]: expected a string, found number"
        );

        let (e, p) = invalid(ed.create(json!({"event": "tool_cal", "command": "/bin/true"})));
        assert_eq!(p, "event");
        assert!(
            e.contains("unknown event \"tool_cal\"; did you mean \"tool_call\"?"),
            "{e}"
        );

        let (e, p) = invalid(
            ed.create(json!({"event": "error", "command": "/bin/true", "env": {"A=B": "x"}})),
        );
        assert_eq!(p, r#"env["A=B"]"#);
        assert!(e.contains("is not a valid variable name"), "{e}");

        // The message is exactly what the loader says about the same file.
        let ids = ids_on_disk(ws.path());
        let (e, p) = invalid(ed.update(&ids[1], json!({"timeout_ms": 0}), None));
        assert_eq!(p, "timeout_ms");
        let mut doc: Value = serde_json::from_str(TWO).unwrap();
        doc["hooks"]["tool_call"][1]["timeout_ms"] = json!(0);
        let loader = config::parse(doc.to_string().as_bytes(), &label, ws.path()).unwrap_err();
        let reason = &loader.iter().next().unwrap().reason;
        assert_eq!(e, format!("timeout_ms: {reason}"));

        // Nothing was written by any of them.
        assert_eq!(read(ws.path()), before);
    }

    #[test]
    fn update_applies_a_merge_patch_and_moving_keeps_the_id() {
        let ws = workspace();
        write(ws.path(), TWO);
        let ed = HooksEditor::new(ws.path());
        let ids = ids_on_disk(ws.path());
        let w = ed
            .update(
                &ids[1],
                json!({"timeout_ms": null, "args": ["c", "d"], "env": {"A": "1"}, "id": ids[1]}),
                None,
            )
            .unwrap();
        assert_eq!(
            w.hook.json,
            json!({"command": "/bin/echo", "args": ["c", "d"], "env": {"A": "1"},
               "event": "tool_call", "id": ids[1]})
        );
        let t = loads(ws.path());
        let a = t.get(&ids[1]).unwrap();
        assert_eq!(
            a.timeout.as_millis(),
            4000,
            "the field is gone: the top-level value applies"
        );
        // A nested patch: null removes one env entry.
        let w = ed
            .update(&ids[1], json!({"env": {"A": null, "B": "2"}}), None)
            .unwrap();
        assert_eq!(w.hook.json["env"], json!({"B": "2"}));

        // Moving to another event: to the end of its array, same id.
        let w = ed
            .update(&ids[0], json!({"event": "agent-start"}), None)
            .unwrap();
        assert_eq!(w.hook.id, ids[0]);
        assert_eq!(w.hook.json["event"], "agent_start");
        let t = loads(ws.path());
        let moved = t.get(&ids[0]).unwrap();
        assert_eq!((moved.event.name(), moved.index), ("agent_start", 1));
        assert_eq!(
            ids_on_disk(ws.path()),
            [ids[1].clone(), ids[2].clone(), ids[0].clone()]
        );
        // To an event the file does not have yet.
        let w = ed.update(&ids[0], json!({"event": "error"}), None).unwrap();
        assert_eq!(w.hook.json["event"], "error");
        assert!(read(ws.path()).contains("\"error\": ["));
        assert_eq!(loads(ws.path()).get(&ids[0]).unwrap().event.name(), "error");

        // The id cannot change, the event cannot be removed, a patch must be an object.
        let (_, p) = invalid(ed.update(&ids[0], json!({"id": "other"}), None));
        assert_eq!(p, "id");
        let (_, p) = invalid(ed.update(&ids[0], json!({"event": null}), None));
        assert_eq!(p, "event");
        assert_eq!(
            ed.update(&ids[0], json!([]), None).unwrap_err().status(),
            400
        );
        let (e, p) = invalid(ed.update(&ids[0], json!({"command": null}), None));
        assert_eq!(p, "$");
        assert!(e.contains("command"), "{e}");
        assert_eq!(
            ed.update("nope", json!({}), None).unwrap_err().status(),
            404
        );
        loads(ws.path());
    }

    #[test]
    fn toggle_and_delete() {
        let ws = workspace();
        write(ws.path(), TWO);
        let ed = HooksEditor::new(ws.path());
        let ids = ids_on_disk(ws.path());
        let w = ed.toggle(&ids[2], None).unwrap();
        assert_eq!(w.hook.json["enabled"], false);
        assert!(!w.table.get(&ids[2]).unwrap().enabled);
        assert!(!loads(ws.path()).get(&ids[2]).unwrap().enabled);
        let w = ed.toggle(&ids[2], None).unwrap();
        assert_eq!(w.hook.json["enabled"], true);
        assert!(loads(ws.path()).get(&ids[2]).unwrap().enabled);

        let r = ed.delete(&ids[0], None).unwrap();
        assert_eq!(r.table.actions.len(), 2);
        assert!(r.table.get(&ids[0]).is_none());
        assert_eq!(ids_on_disk(ws.path()), [ids[1].clone(), ids[2].clone()]);
        assert_eq!(ed.list().unwrap().etag, r.list_etag);
        let e = ed.delete(&ids[0], None).unwrap_err();
        assert_eq!((e.status(), e.kind()), (404, "not_found"));
        assert_eq!(ed.toggle("missing", None).unwrap_err().status(), 404);
    }

    #[test]
    fn a_stale_if_match_is_412_and_a_current_one_passes() {
        let ws = workspace();
        write(ws.path(), TWO);
        let ed = HooksEditor::new(ws.path());
        let l = ed.list().unwrap();
        let (a, b) = (&l.hooks[0], &l.hooks[1]);
        let w = ed.toggle(&a.id, Some(&a.etag)).unwrap();
        assert_ne!(w.hook.etag, a.etag);
        // The old ETag of that hook is stale now.
        let e = ed
            .update(&a.id, json!({"args": []}), Some(&a.etag))
            .unwrap_err();
        assert_eq!((e.status(), e.kind()), (412, "precondition_failed"));
        // Another hook's ETag is still current; so is `*`; the list ETag is stale.
        ed.update(&b.id, json!({"args": ["z"]}), Some(&b.etag))
            .unwrap();
        let e = ed.delete(&a.id, Some(&l.etag)).unwrap_err();
        assert_eq!(e.status(), 412);
        ed.toggle(&a.id, Some("*")).unwrap();
        let now = ed.get(&a.id).unwrap();
        ed.delete(&a.id, Some(&format!("W/{}, {}", now.etag, now.etag)))
            .unwrap();
        loads(ws.path());
    }

    #[test]
    fn a_hand_edit_between_two_calls_is_a_conflict_and_is_kept() {
        let ws = workspace();
        write(ws.path(), TWO);
        let ed = HooksEditor::new(ws.path());
        let ids = ids_on_disk(ws.path());
        ed.toggle(&ids[0], None).unwrap();
        // Someone edits the file by hand.
        let hand = read(ws.path()).replace("\"/bin/echo\"", "\"/bin/cat\"");
        write(ws.path(), &hand);
        let e = ed
            .create(json!({"event": "error", "command": "/bin/true"}))
            .unwrap_err();
        assert_eq!((e.status(), e.kind()), (409, "conflict"), "{e}");
        assert_eq!(read(ws.path()), hand, "the hand edit is kept");
        // Reading does not vouch for a caller's view: a blind retry is refused again.
        ed.list().unwrap();
        let e = ed
            .create(json!({"event": "error", "command": "/bin/true"}))
            .unwrap_err();
        assert_eq!(e.status(), 409);
        // A current If-Match does: the write goes through, keeps the hand edit, and blind
        // writes build on it again.
        let list = ed.list().unwrap();
        ed.create_if(
            json!({"event": "error", "command": "/bin/true"}),
            Some(&list.etag),
        )
        .unwrap();
        assert!(read(ws.path()).contains("/bin/cat"));
        ed.create(json!({"event": "error", "command": "/bin/echo"}))
            .unwrap();

        // A current If-Match proves the caller saw the new file.
        let hand = read(ws.path()).replace("\"/bin/cat\"", "\"/bin/echo\"");
        write(ws.path(), &hand);
        let e = ed.toggle(&ids[2], None).unwrap_err();
        assert_eq!(e.status(), 409);
        write(ws.path(), &hand.replace("/bin/echo", "/bin/cat"));
        let fresh = HooksEditor::new(ws.path()).get(&ids[2]).unwrap();
        ed.toggle(&ids[2], Some(&fresh.etag)).unwrap();
        assert!(read(ws.path()).contains("/bin/cat"));

        // A hand edit that deletes the file is a conflict too; the editor does not recreate it.
        std::fs::remove_file(ws.path().join("hooks.json")).unwrap();
        let e = ed
            .create(json!({"event": "error", "command": "/bin/true"}))
            .unwrap_err();
        assert_eq!(e.status(), 409);
        assert!(!ws.path().join("hooks.json").exists());
    }

    #[test]
    fn a_hand_broken_file_is_reported_not_overwritten() {
        let ws = workspace();
        write(ws.path(), r#"{"hooks": {"tool_call": [{"command": 1}]}}"#);
        let ed = HooksEditor::new(ws.path());
        let e = ed.list().unwrap_err();
        assert_eq!(
            (e.status(), e.kind(), e.path()),
            (409, "file_invalid", "hooks.tool_call[0].command")
        );
        let e = ed
            .create(json!({"event": "error", "command": "/bin/true"}))
            .unwrap_err();
        assert_eq!(e.kind(), "file_invalid");
        assert_eq!(
            read(ws.path()),
            r#"{"hooks": {"tool_call": [{"command": 1}]}}"#
        );
    }

    #[test]
    fn fifty_concurrent_creates_are_all_persisted() {
        let ws = workspace();
        let ed = Arc::new(HooksEditor::new(ws.path()));
        let threads: Vec<_> = (0..50)
        .map(|i| {
            let ed = ed.clone();
            std::thread::spawn(move || {
                ed.create(json!({"event": "tool_call", "command": "/bin/echo", "args": [format!("n{i}")]}))
                    .unwrap()
                    .hook
                    .id
            })
        })
        .collect();
        let mut ids: Vec<String> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let t = loads(ws.path());
        assert_eq!(t.actions.len(), 50);
        let mut on_disk: Vec<String> = t.actions.iter().map(|a| a.id.clone()).collect();
        ids.sort();
        on_disk.sort();
        assert_eq!(ids, on_disk);
        for i in 0..50 {
            let arg = format!("n{i}");
            assert!(
                t.actions.iter().any(|a| a.args == [arg.clone()]),
                "{arg} lost"
            );
        }
    }

    /// Odd bodies are answered with an error (or accepted), never a panic, and the file always
    /// still loads.
    #[test]
    fn odd_bodies_never_break_the_file() {
        let ws = workspace();
        write(ws.path(), TWO);
        let ed = HooksEditor::new(ws.path());
        let id = ids_on_disk(ws.path())[0].clone();
        let odd = [
            json!({}),
            json!({"event": ""}),
            json!({"event": "tool_call"}),
            json!({"event": "tool_call", "command": ""}),
            json!({"event": "tool_call", "command": "/bin/true", "timeout_ms": 1e300}),
            json!({"event": "tool_call", "command": "/bin/true", "timeout_ms": -1}),
            json!({"event": "tool_call", "command": "/bin/true", "timeout_ms": 18446744073709551615u64}),
            json!({"event": "tool_call", "command": "/bin/true", "max_concurrent": 0.5}),
            json!({"event": "tool_call", "command": "/bin/true", "args": {"a": 1}}),
            json!({"event": "tool_call", "command": "/bin/true", "env": [1]}),
            json!({"event": "tool_call", "command": "/bin/true", "enabled": "yes"}),
            json!({"event": "tool_call", "command": "/bin/true", "matcher": "/(/"}),
            json!({"event": "tool_call", "command": "/bin/true", "cwd": "../.."}),
            json!({"event": "tool_call", "command": "a\u{0}b"}),
            json!({"event": "tool_call", "command": "/bin/true", "id": ""}),
            json!({"event": "tool_call", "command": "/bin/true", "id": 7}),
            json!({"event": "tool_call", "command": "/bin/true", "\u{2028}é\n": 1}),
            json!({"event": "\u{0}", "command": "/bin/true"}),
            json!({"event": "tool_call", "command": "/bin/true", "env": {"HOME": "/"}}),
            json!({"event": "tool_call", "command": "/bin/true", "args": vec!["x"; 200]}),
            json!({"event": "tool_call", "command": "/bin/true", "args": ["x".repeat(300_000)]}),
        ];
        for body in odd {
            let before = read(ws.path());
            match ed.create(body.clone()) {
                Ok(_) => {}
                Err(e) => {
                    assert!(matches!(e.status(), 400 | 422), "{body}: {e}");
                    assert!(!e.to_string().contains('\n'), "{e}");
                    assert_eq!(read(ws.path()), before, "{body}");
                }
            }
            loads(ws.path());
            let mut patch = body.clone();
            if let Some(m) = patch.as_object_mut() {
                m.remove("event");
            }
            let _ = ed.update(&id, patch, None);
            loads(ws.path());
        }
        // The first hook is still there, with its id.
        ed.get(&id).unwrap();
    }

    #[test]
    fn the_file_mode_is_kept() {
        use std::os::unix::fs::PermissionsExt;
        let ws = workspace();
        write(ws.path(), TWO);
        let f = ws.path().join("hooks.json");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let ed = HooksEditor::new(ws.path());
        ed.create(json!({"event": "error", "command": "/bin/true"}))
            .unwrap();
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    /// The PRX-shaped file: listing works, a toggle changes that one field and keeps every other
    /// (top-level `enabled` and `timeout_ms`, the `LLM-Response` key as written).
    #[test]
    fn the_compat_file_round_trips() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/prx/hooks.json");
        let text = std::fs::read_to_string(&src).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (the PRX samples in tests/fixtures/prx)",
                src.display()
            )
        });
        let ws = workspace();
        write(ws.path(), &text);
        let before = loads(ws.path());
        let ed = HooksEditor::new(ws.path());
        let l = ed.list().unwrap();
        assert_eq!(l.hooks.len(), 5);
        let events: Vec<_> = l
            .hooks
            .iter()
            .map(|h| h.json["event"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            events,
            [
                "agent_start",
                "llm_response",
                "tool_call",
                "tool_call",
                "error"
            ]
        );
        assert!(
            l.hooks[2].json.get("timeout_ms").is_none(),
            "the top-level 5000 is not added"
        );
        let py = &l.hooks[1];
        assert_eq!(py.json["stdin_json"], true);

        ed.toggle(&py.id, None).unwrap();
        let after = loads(ws.path());
        let old: Value = serde_json::from_str(&text).unwrap();
        let new: Value = serde_json::from_str(&read(ws.path())).unwrap();
        assert_eq!(new["enabled"], old["enabled"]);
        assert_eq!(new["timeout_ms"], old["timeout_ms"]);
        assert!(
            new["hooks"].get("LLM-Response").is_some(),
            "the key is kept as written"
        );
        // Every hook is as it was, plus its id (and the toggled `enabled`).
        let mut expected = old.clone();
        for (n, (key, i)) in [
            ("agent_start", 0),
            ("LLM-Response", 0),
            ("tool_call", 0),
            ("tool_call", 1),
            ("error", 0),
        ]
        .into_iter()
        .enumerate()
        {
            expected["hooks"][key][i]["id"] = json!(before.actions[n].id);
        }
        expected["hooks"]["LLM-Response"][0]["enabled"] = json!(false);
        assert_eq!(new, expected);
        // Same ids, same order of event keys as in the original file.
        let ids =
            |t: &config::HookTable| t.actions.iter().map(|a| a.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&after), ids(&before));
        let disk = read(ws.path());
        let pos = |k: &str| disk.find(k).unwrap();
        assert!(
            pos("\"agent_start\"") < pos("\"LLM-Response\"")
                && pos("\"LLM-Response\"") < pos("\"tool_call\"")
        );
        assert!(
            pos("\"enabled\"") < pos("\"timeout_ms\"") && pos("\"timeout_ms\"") < pos("\"hooks\"")
        );
        // A hook created for llm_response joins the existing `LLM-Response` array.
        ed.create(json!({"event": "llm_response", "command": "/bin/true"}))
            .unwrap();
        let new: Value = serde_json::from_str(&read(ws.path())).unwrap();
        assert_eq!(new["hooks"]["LLM-Response"].as_array().unwrap().len(), 2);
        assert!(new["hooks"].get("llm_response").is_none());
    }

    /// The editor's table can go live through the watcher: `reload_now` after the write makes it
    /// live, and the watcher's own event for the rename then finds the same bytes.
    #[test]
    fn a_write_made_live_with_reload_now_is_not_applied_twice() {
        let ws = workspace();
        write(ws.path(), TWO);
        let applied = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = applied.clone();
        let watcher = config::ConfigWatcher::start(
            ws.path().to_path_buf(),
            std::time::Duration::from_millis(20),
            Box::new(move |_| {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }),
        )
        .unwrap();
        let ed = HooksEditor::new(ws.path());
        let w = ed
            .create(json!({"event": "error", "command": "/bin/true", "id": "live"}))
            .unwrap();
        let r = watcher.reload_now();
        assert_eq!(r, config::Reload::Applied);
        assert!(watcher.table().get("live").is_some());
        assert_eq!(watcher.table().actions.len(), w.table.actions.len());
        // The watcher's own event arrives later (or already did, before reload_now): it finds
        // the bytes reload_now recorded (Unchanged), or, had it come first, reload_now applied
        // them once more. Never a third time.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let n = loop {
            let n = applied.load(std::sync::atomic::Ordering::SeqCst);
            if n >= 3 || watcher.stats().unchanged >= 1 || std::time::Instant::now() > deadline {
                break n;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(n, applied.load(std::sync::atomic::Ordering::SeqCst));
        match n {
            2 => assert!(watcher.stats().unchanged >= 1, "{:?}", watcher.stats()),
            3 => {}
            _ => panic!("initial load + one or two applies expected, got {n}"),
        }
        assert!(watcher.table().get("live").is_some());
    }
}
