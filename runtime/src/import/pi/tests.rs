use super::*;
use crate::transcript::path_settings;

#[test]
fn times_parse_like_javascript_dates() {
    assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00.000Z"), Some(0));
    assert_eq!(
        parse_rfc3339_ms("2026-11-30T07:35:12Z"),
        Some(1_796_024_112_000)
    );
    assert_eq!(
        parse_rfc3339_ms("2026-11-30T09:35:12.5+02:00"),
        Some(1_796_024_112_500)
    );
    assert_eq!(parse_rfc3339_ms("2026-11-30"), None);
    assert_eq!(parse_rfc3339_ms("2026-13-30T07:35:12Z"), None);
    assert_eq!(parse_time(&Value::from(42)), Some(42));
}

#[test]
fn v1_is_a_linear_chain_with_compaction_index_resolved() {
    let file = concat!(
        r#"{"type":"session","id":"s1","timestamp":"2025-01-01T00:00:00.000Z","cwd":"/w"}"#,
        "\n",
        r#"{"type":"message","timestamp":"2025-01-01T00:00:01.000Z","message":{"role":"user","content":"a"}}"#,
        "\n",
        r#"{"type":"message","timestamp":"2025-01-01T00:00:02.000Z","message":{"role":"assistant","content":[{"type":"text","text":"b"}],"provider":"p","model":"m","stopReason":"stop"}}"#,
        "\n",
        r#"{"type":"compaction","timestamp":"2025-01-01T00:00:03.000Z","summary":"s","firstKeptEntryIndex":2,"tokensBefore":5}"#,
        "\n"
    );
    let s = read_pi(file.as_bytes(), "t").unwrap();
    assert_eq!(s.file_version, 1);
    let evs: Vec<&SessionEvent> = s.import.commits.iter().flat_map(|c| &c.events).collect();
    let entries: Vec<&Entry> = evs
        .iter()
        .filter_map(|e| match e {
            SessionEvent::EntryAppended { entry } => Some(entry),
            _ => None,
        })
        .collect();
    assert_eq!(entries.len(), 3);
    assert_eq!(entries[0].parent_id, None);
    assert_eq!(entries[1].parent_id.as_ref(), Some(&entries[0].id));
    assert_eq!(entries[2].parent_id.as_ref(), Some(&entries[1].id));
    match &entries[2].kind {
        EntryKind::Compaction {
            first_kept_entry_id,
            ..
        } => assert_eq!(first_kept_entry_id, &entries[1].id),
        k => panic!("{k:?}"),
    }
    assert_eq!(entries[0].timestamp_ms, 1_735_689_601_000);
}

#[test]
fn long_sessions_are_split_into_bounded_commits_that_fold() {
    let mut file = String::from(
        r#"{"type":"session","version":3,"id":"long","timestamp":"2025-01-01T00:00:00Z","cwd":""}"#,
    );
    file.push('\n');
    let n = PI_COMMIT_EVENTS_MAX * 2 + 10;
    for i in 0..n {
        let parent = if i == 0 {
            "null".to_string()
        } else {
            format!("\"e{}\"", i - 1)
        };
        file.push_str(&format!(
            r#"{{"type":"custom","id":"e{i}","parentId":{parent},"timestamp":"2025-01-01T00:00:01Z","customType":"c","data":{i}}}"#
        ));
        file.push('\n');
    }
    let s = read_pi(file.as_bytes(), "t").unwrap();
    let commits = &s.import.commits;
    assert_eq!(commits.len(), 3);
    for (i, c) in commits.iter().enumerate() {
        assert_eq!(c.version, i as u64 + 1);
        assert!(c.events.len() <= PI_COMMIT_EVENTS_MAX);
        assert_eq!(c.events.len(), c.lines.len());
    }
    let folded = s.import.validate().unwrap();
    assert_eq!(folded.state().transcript.len(), n);
    let last = format!("e{}", n - 1);
    assert_eq!(
        folded.state().transcript.leaf().map(|l| l.as_str()),
        Some(last.as_str())
    );
}

const HEAD: &str =
    r#"{"type":"session","version":3,"id":"sig","timestamp":"2025-01-01T00:00:00Z","cwd":"/w"}"#;

fn entries_of(s: &PiSession) -> Vec<&Entry> {
    s.import
        .commits
        .iter()
        .flat_map(|c| &c.events)
        .filter_map(|e| match e {
            SessionEvent::EntryAppended { entry } => Some(entry),
            _ => None,
        })
        .collect()
}

#[test]
fn thinking_and_tool_call_signatures_are_kept() {
    let user = r#"{"type":"message","id":"u1","parentId":null,"timestamp":"2025-01-01T00:00:01Z","message":{"role":"user","content":"hi"}}"#;
    let asst = r#"{"type":"message","id":"a1","parentId":"u1","timestamp":"2025-01-01T00:00:02Z","message":{"role":"assistant","provider":"anthropic","model":"claude","stopReason":"toolUse","content":[{"type":"thinking","thinking":"hm","thinkingSignature":"SIG1"},{"type":"thinking","thinking":"","thinkingSignature":"ENC","redacted":true},{"type":"toolCall","id":"c1","name":"read","arguments":{"path":"x"},"thoughtSignature":"TS"}]}}"#;
    let file = format!("{HEAD}\n{user}\n{asst}\n");
    let s = read_pi(file.as_bytes(), "t").unwrap();
    let entries = entries_of(&s);
    let EntryKind::Message {
        message: Message::Assistant { content, .. },
    } = &entries[1].kind
    else {
        panic!("{:?}", entries[1].kind)
    };
    assert_eq!(
        content,
        &vec![
            ContentBlock::Thinking {
                thinking: "hm".into(),
                signature: Some("SIG1".into()),
                redacted: false
            },
            ContentBlock::Thinking {
                thinking: String::new(),
                signature: Some("ENC".into()),
                redacted: true
            },
            ContentBlock::ToolCall {
                id: "c1".into(),
                name: "read".into(),
                arguments: serde_json::json!({"path": "x"}).into(),
                signature: Some("TS".into())
            },
        ]
    );
    // The signatures survive the store's codec.
    for c in &s.import.commits {
        for ev in &c.events {
            let back =
                crate::session::decode_event(&crate::session::encode_event(ev).unwrap()).unwrap();
            assert_eq!(&back, ev);
        }
    }
}

#[test]
fn lines_pi_skips_are_skipped_and_reported() {
    let a = r#"{"type":"custom","id":"a1","parentId":null,"timestamp":"2025-01-01T00:00:00Z","customType":"x"}"#;
    let b = r#"{"type":"custom","id":"b1","parentId":"a1","timestamp":"2025-01-01T00:00:00Z","customType":"x"}"#;
    // Two objects glued together on one line, as pi's own history
    // has them: JSON.parse refuses the line and pi skips it.
    let file = format!("{HEAD}\n{a}\n{a}{b}\n\n{b}\n{{\"type\":\n");
    let s = read_pi(file.as_bytes(), "t").unwrap();
    assert_eq!(s.skipped_lines, vec![3, 6]);
    let ids: Vec<&str> = entries_of(&s).iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, vec!["a1", "b1"]);
    s.import.validate().unwrap();
}

#[test]
fn a_message_over_the_record_limit_writes_nothing() {
    use crate::store::exchange::{import_from, ExchangeError, ImportOptions};
    use crate::store::{LogStore, LogStoreOptions};
    let small = r#"{"type":"message","id":"u1","parentId":null,"timestamp":"2025-01-01T00:00:01Z","message":{"role":"user","content":"hi"}}"#;
    let big = format!(
        r#"{{"type":"message","id":"u2","parentId":"u1","timestamp":"2025-01-01T00:00:02Z","message":{{"role":"user","content":"{}"}}}}"#,
        "x".repeat(100_000)
    );
    let file = format!("{HEAD}\n{small}\n{big}\n");
    let s = read_pi(file.as_bytes(), "t").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = LogStore::open(
        dir.path(),
        LogStoreOptions {
            durability: spool_engine::Durability::Buffered,
            record_bytes_max: Some(64 << 10),
            ..Default::default()
        },
    )
    .unwrap();
    let sessions = vec![s.import];
    let err = import_from(
        &store,
        &mut sessions.as_slice(),
        &ImportOptions::default(),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(
        matches!(err, ExchangeError::Unstorable { line: 3, .. }),
        "{err}"
    );
    assert_eq!(store.engine().unwrap().last_seq(), 0, "nothing written");
}

#[test]
fn dangling_and_duplicate_ids_name_the_line() {
    let head =
        r#"{"type":"session","version":3,"id":"s","timestamp":"2025-01-01T00:00:00Z","cwd":""}"#;
    let a = r#"{"type":"custom","id":"a1","parentId":null,"timestamp":"2025-01-01T00:00:00Z","customType":"x"}"#;
    let dangling = r#"{"type":"custom","id":"b1","parentId":"zz","timestamp":"2025-01-01T00:00:00Z","customType":"x"}"#;
    let e = read_pi(format!("{head}\n{a}\n\n{dangling}\n").as_bytes(), "t").unwrap_err();
    assert_eq!(e.line, 4, "{e}");
    let e = read_pi(format!("{head}\n{a}\n{a}\n").as_bytes(), "t").unwrap_err();
    assert_eq!(e.line, 3, "{e}");
    // A cut last line is not JSON: skipped, as pi skips it.
    let s = read_pi(format!("{head}\n{a}\n{{\"type\":").as_bytes(), "t").unwrap();
    assert_eq!(s.skipped_lines, vec![3]);
    let v4 = head.replace("\"version\":3", "\"version\":4");
    assert_eq!(read_pi(v4.as_bytes(), "t").unwrap_err().line, 1);
}

// ----- PiFile: the same commits as read_pi, a commit at a time -----

/// `text` as a file of its own (gone with the directory).
fn on_disk(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("session.jsonl");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// One reading of `f`, its commits collected.
fn stream(f: &mut PiFile) -> Result<Vec<ImportCommit>, ExchangeError> {
    let want = f.session_id().clone();
    let mut out = Vec::new();
    f.for_each_commit(&mut |id, c| {
        assert_eq!(id, &want);
        out.push(c.clone());
        Ok(())
    })?;
    Ok(out)
}

/// `commits` without the ids a reading makes up: every commit id nil,
/// and with `entry_ids` every entry id (and every reference to one)
/// replaced by `n<index of the entry>`.
fn normalised(commits: &[ImportCommit], entry_ids: bool) -> Vec<ImportCommit> {
    let mut names: HashMap<EntryId, EntryId> = HashMap::new();
    let mut out = commits.to_vec();
    for c in &mut out {
        c.commit_id = Uuid::nil();
        if !entry_ids {
            continue;
        }
        for ev in &mut c.events {
            let SessionEvent::EntryAppended { entry } = ev else {
                continue;
            };
            let n = EntryId::parse(&format!("n{}", names.len())).unwrap();
            names.insert(entry.id.clone(), n);
            let rename = |id: &mut EntryId| {
                if let Some(n) = names.get(id) {
                    *id = n.clone();
                }
            };
            rename(&mut entry.id);
            if let Some(p) = entry.parent_id.as_mut() {
                rename(p);
            }
            match &mut entry.kind {
                EntryKind::Compaction {
                    first_kept_entry_id,
                    ..
                } => rename(first_kept_entry_id),
                EntryKind::Label { target_id, .. } => rename(target_id),
                EntryKind::BranchSummary {
                    from_id: Some(f), ..
                } => rename(f),
                _ => {}
            }
        }
    }
    out
}

const V1: &str = concat!(
    r#"{"type":"session","id":"s1","timestamp":"2025-01-01T00:00:00.000Z","cwd":"/w"}"#,
    "\n",
    r#"{"type":"message","timestamp":"2025-01-01T00:00:01.000Z","message":{"role":"user","content":"a"}}"#,
    "\n",
    r#"{"type":"message","timestamp":"2025-01-01T00:00:02.000Z","message":{"role":"assistant","content":[{"type":"text","text":"b"}],"provider":"p","model":"m","stopReason":"stop"}}"#,
    "\n",
    r#"{"type":"thinking_level_change","timestamp":"2025-01-01T00:00:02.500Z","thinkingLevel":"high"}"#,
    "\n",
    "not json\n",
    r#"{"type":"compaction","timestamp":"2025-01-01T00:00:03.000Z","summary":"s","firstKeptEntryIndex":2,"tokensBefore":5}"#,
    "\n",
    r#"{"type":"compaction","summary":"t","firstKeptEntryIndex":99}"#,
    "\n",
    r#"{"type":"message","message":{"role":"user","content":"c","timestamp":1735689700000}}"#,
    "\n",
);

const V2: &str = concat!(
    r#"{"type":"session","version":2,"id":"s2","timestamp":"2025-01-01T00:00:00Z","cwd":"","parentSession":"p0"}"#,
    "\n",
    r#"{"type":"message","id":"a1","parentId":null,"timestamp":"2025-01-01T00:00:01Z","message":{"role":"user","content":"hi"}}"#,
    "\n",
    r#"{"type":"model_change","id":"b1","parentId":"a1","timestamp":"2025-01-01T00:00:02Z","provider":"side","modelId":"branch"}"#,
    "\n",
    r#"{"type":"thinking_level_change","id":"b2","parentId":"b1","timestamp":"2025-01-01T00:00:03Z","thinkingLevel":"low"}"#,
    "\n",
    "\n",
    r#"{"type":"model_change","id":"c0","parentId":"a1","timestamp":"2025-01-01T00:00:04Z","provider":"anthropic","modelId":"claude"}"#,
    "\n",
    r#"{"type":"message","id":"c1","parentId":"c0","timestamp":"2025-01-01T00:00:05Z","message":{"role":"hookMessage","customType":"h","content":"x","display":true}}"#,
    "\n",
    r#"{"type":"session_info","id":"c2","parentId":"c1","timestamp":"2025-01-01T00:00:06Z","name":" named "}"#,
    "\n",
    r#"{"type":"label","id":"c3","parentId":"c2","timestamp":"2025-01-01T00:00:07Z","targetId":"a1","label":"start"}"#,
    "\n",
    r#"{"type":"branch_summary","id":"c4","parentId":"c3","timestamp":"2025-01-01T00:00:08Z","fromId":"b2","summary":"gone"}"#,
    "\n",
);

/// A v3 file with skipped and blank lines and a bash execution.
fn v3() -> String {
    let a = r#"{"type":"custom","id":"a1","parentId":null,"timestamp":"2025-01-01T00:00:00Z","customType":"x","data":{"k":[1,2]}}"#;
    let b = r#"{"type":"custom","id":"b1","parentId":"a1","timestamp":"2025-01-01T00:00:00Z","customType":"x"}"#;
    let bash = r#"{"type":"message","id":"c1","parentId":"b1","timestamp":"2025-01-01T00:00:01Z","message":{"role":"bashExecution","command":"ls","output":"f","exitCode":1}}"#;
    let asst = r#"{"type":"message","id":"d1","parentId":"c1","timestamp":"2025-01-01T00:00:02Z","message":{"role":"assistant","provider":"openai","model":"gpt","stopReason":"toolUse","content":[{"type":"toolCall","id":"t1","name":"read","arguments":{"path":"x"}}],"usage":{"input":3,"output":4}}}"#;
    format!("{HEAD}\n{a}\n{a}{b}\n\n{b}\n{{\"type\":\n{bash}\n{asst}\n")
}

/// A linear v3 chain of `n` custom entries (v1 without ids).
fn long(n: usize, v1: bool) -> String {
    let mut file = if v1 {
        String::from(r#"{"type":"session","id":"long","timestamp":"2025-01-01T00:00:00Z"}"#)
    } else {
        String::from(
            r#"{"type":"session","version":3,"id":"long","timestamp":"2025-01-01T00:00:00Z","cwd":""}"#,
        )
    };
    file.push('\n');
    for i in 0..n {
        if v1 {
            file.push_str(&format!(
                r#"{{"type":"custom","timestamp":"2025-01-01T00:00:01Z","customType":"c","data":{i}}}"#
            ));
        } else {
            let parent = match i {
                0 => "null".to_string(),
                _ => format!("\"e{}\"", i - 1),
            };
            file.push_str(&format!(
                r#"{{"type":"custom","id":"e{i}","parentId":{parent},"timestamp":"2025-01-01T00:00:01Z","customType":"c","data":{i}}}"#
            ));
        }
        file.push('\n');
    }
    file
}

/// Entries of about 1 MiB each: commits cut by bytes, not events.
fn big_entries() -> String {
    let mut file = format!("{HEAD}\n");
    let text = "y".repeat(1 << 20);
    for i in 0..9 {
        let parent = match i {
            0 => "null".to_string(),
            _ => format!("\"u{}\"", i - 1),
        };
        file.push_str(&format!(
            r#"{{"type":"message","id":"u{i}","parentId":{parent},"timestamp":"2025-01-01T00:00:01Z","message":{{"role":"user","content":"{text}"}}}}"#
        ));
        file.push('\n');
    }
    file
}

fn samples() -> Vec<(&'static str, String)> {
    vec![
        ("v1", V1.to_string()),
        ("v2", V2.to_string()),
        ("v3", v3()),
        ("long v3", long(PI_COMMIT_EVENTS_MAX * 2 + 10, false)),
        ("long v1", long(PI_COMMIT_EVENTS_MAX + 5, true)),
        ("big entries", big_entries()),
    ]
}

#[test]
fn a_pi_file_streams_the_commits_read_pi_makes() {
    for (name, text) in samples() {
        let whole = read_pi(text.as_bytes(), "t.jsonl").unwrap();
        let (_dir, path) = on_disk(&text);
        let mut f = PiFile::open(&path, "t.jsonl").unwrap();
        assert_eq!(f.file_version(), whole.file_version, "{name}");
        assert_eq!(f.skipped_lines(), whole.skipped_lines.as_slice(), "{name}");
        assert_eq!(f.session_id(), &whole.import.id, "{name}");
        let streamed = stream(&mut f).unwrap();
        let v1 = whole.file_version == 1;
        assert_eq!(
            normalised(&streamed, v1),
            normalised(&whole.import.commits, v1),
            "{name}"
        );
        // And the commits fold, as a session.
        let session = ImportSession {
            id: f.session_id().clone(),
            commits: streamed,
        };
        session.validate().unwrap();
    }
}

#[test]
fn the_samples_cover_what_they_are_for() {
    let s = read_pi(V1.as_bytes(), "t").unwrap();
    assert_eq!(s.skipped_lines, vec![5]);
    let entries = entries_of(&s);
    // firstKeptEntryIndex 2 is the assistant message; 99 is no entry,
    // so the compaction keeps itself.
    let kept = |e: &Entry| match &e.kind {
        EntryKind::Compaction {
            first_kept_entry_id,
            ..
        } => first_kept_entry_id.clone(),
        k => panic!("{k:?}"),
    };
    assert_eq!(kept(entries[3]), entries[1].id);
    assert_eq!(kept(entries[4]), entries[4].id);
    let s = read_pi(big_entries().as_bytes(), "t").unwrap();
    assert!(s.import.commits.len() >= 3, "{}", s.import.commits.len());
    let s = read_pi(long(PI_COMMIT_EVENTS_MAX * 2 + 10, false).as_bytes(), "t").unwrap();
    assert_eq!(s.import.commits.len(), 3);
    let s = read_pi(long(PI_COMMIT_EVENTS_MAX + 5, true).as_bytes(), "t").unwrap();
    assert_eq!(s.import.commits.len(), 2);
}

#[test]
fn the_settings_at_the_leaf_are_those_of_its_path() {
    let s = read_pi(V2.as_bytes(), "t").unwrap();
    let entries = entries_of(&s);
    // The leaf's path, root first, and path_settings over all of it.
    let by_id: HashMap<&EntryId, &Entry> = entries.iter().map(|e| (&e.id, *e)).collect();
    let mut path = vec![*entries.last().unwrap()];
    while let Some(p) = path.last().unwrap().parent_id.as_ref() {
        path.push(by_id[p]);
    }
    path.reverse();
    let (model, thinking) = path_settings(&path);
    assert_eq!(model, Some(("anthropic".into(), "claude".into())));
    assert_eq!(
        thinking, None,
        "the low thinking level is on another branch"
    );
    let SessionEvent::Created {
        definition,
        state,
        label,
        ..
    } = &s.import.commits[0].events[0]
    else {
        panic!()
    };
    assert_eq!(definition.model.model, "claude");
    assert_eq!(label, "named");
    assert!(!state.metadata.contains_key("pi.thinking_level"));
    assert!(state.metadata.contains_key("pi.parent_session"));
    // v1: a chain, so the file's last thinking level and model.
    let s = read_pi(V1.as_bytes(), "t").unwrap();
    let SessionEvent::Created {
        definition, state, ..
    } = &s.import.commits[0].events[0]
    else {
        panic!()
    };
    assert_eq!(definition.model.model, "m");
    assert_eq!(
        state.metadata.get("pi.thinking_level").map(|v| v.as_str()),
        Some(r#""high""#)
    );
}

#[test]
fn every_reading_of_a_pi_file_makes_the_same_ids() {
    for text in [
        long(PI_COMMIT_EVENTS_MAX * 2 + 10, true),
        long(PI_COMMIT_EVENTS_MAX + 1, false),
    ] {
        let (_dir, path) = on_disk(&text);
        let mut f = PiFile::open(&path, "t").unwrap();
        let first = stream(&mut f).unwrap();
        let second = stream(&mut f).unwrap();
        assert_eq!(first, second);
        let ids: std::collections::HashSet<Uuid> = first.iter().map(|c| c.commit_id).collect();
        assert_eq!(ids.len(), first.len(), "distinct commit ids");
        for c in &first {
            assert_eq!(c.commit_id.get_version_num(), 4);
            assert_eq!(c.commit_id.get_variant(), uuid::Variant::RFC4122);
        }
        // Another PiFile over the same file makes up other ids.
        let other = stream(&mut PiFile::open(&path, "t").unwrap()).unwrap();
        assert_ne!(other[0].commit_id, first[0].commit_id);
    }
}

#[test]
fn a_file_changed_after_open_fails_the_reading_without_a_panic() {
    let text = long(PI_COMMIT_EVENTS_MAX * 2 + 10, false);
    let lines: Vec<&str> = text.lines().collect();
    let with_line = |i: usize, new: &str| {
        let mut l = lines.clone();
        l[i] = new;
        l.join("\n") + "\n"
    };
    // Line 1500 is in the second commit (the first holds the header and
    // 1023 entries).
    let other_data = lines[1499].replace("\"data\":1498", "\"data\":-1");
    let cases: Vec<(&str, String, Option<u64>)> = vec![
        (
            "garbage",
            with_line(1499, r#"{"type":"bogus"}"#),
            Some(1500),
        ),
        ("other data", with_line(1499, &other_data), Some(1025)),
        // What only the first reading checks entry by entry (a later one
        // keeps no ids): the commit's hash tells.
        (
            "an id used twice",
            with_line(
                1499,
                &lines[1499].replace("\"id\":\"e1498\"", "\"id\":\"e7\""),
            ),
            Some(1025),
        ),
        (
            "a dangling parent",
            with_line(
                1499,
                &lines[1499].replace("\"parentId\":\"e1497\"", "\"parentId\":\"x\""),
            ),
            Some(1025),
        ),
        ("cut", text[..text.len() / 2].to_string(), None),
        (
            "cut at a commit",
            lines[..1024].join("\n") + "\n",
            Some(1024),
        ),
        (
            "longer",
            format!("{text}{}\n", lines[1].replace("e0", "x0")),
            None,
        ),
        (
            "other header",
            text.replacen("\"cwd\":\"\"", "\"cwd\":\"/x\"", 1),
            Some(1),
        ),
        ("empty", String::new(), Some(0)),
    ];
    for (name, changed_text, line) in cases {
        let (_dir, path) = on_disk(&text);
        let mut f = PiFile::open(&path, "t").unwrap();
        let before = stream(&mut f).unwrap();
        std::fs::write(&path, &changed_text).unwrap();
        let mut seen = Vec::new();
        let e = f
            .for_each_commit(&mut |_, c| {
                seen.push(c.clone());
                Ok(())
            })
            .expect_err(name);
        match (&e, line) {
            (ExchangeError::Malformed { line: got, .. }, Some(want)) => {
                assert_eq!(*got, want, "{name}: {e}")
            }
            (ExchangeError::Malformed { .. }, None) => {}
            _ => panic!("{name}: {e:?}"),
        }
        assert!(e.to_string().contains("changed"), "{name}: {e}");
        // Whatever was passed on before the error is what the file held.
        assert_eq!(seen[..], before[..seen.len()], "{name}");
    }
    // A file gone is an I/O error.
    let (dir, path) = on_disk(&text);
    let mut f = PiFile::open(&path, "t").unwrap();
    drop(dir);
    let e = f.for_each_commit(&mut |_, _| Ok(())).unwrap_err();
    assert!(matches!(e, ExchangeError::Io { .. }), "{e:?}");
    assert!(PiFile::open(&path, "t").is_err());
}

/// A first reading whose id checks go to the temporary file (every id, a
/// run per record) refuses what the checks held in memory refuse, on the
/// same line with the same words, and accepts the same: over a long chain
/// with an id used twice, a parent defined later or nowhere, and a later
/// line that is bad in another way.
#[test]
fn a_long_first_reading_checks_its_ids_as_a_short_one() {
    let text = long(300, false);
    let lines: Vec<&str> = text.lines().collect();
    let with = |edits: &[(usize, &str)]| {
        let mut l: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
        for (i, new) in edits {
            l[*i] = new.to_string();
        }
        l.join("\n") + "\n"
    };
    let twice = lines[20].replace("\"data\":19", "\"data\":-1");
    let later = lines[41].replace("\"parentId\":\"e39\"", "\"parentId\":\"e200\"");
    let nowhere = lines[60].replace("\"parentId\":\"e58\"", "\"parentId\":\"zz\"");
    let own = r#"{"type":"custom","id":"e10","parentId":"e10","customType":"c"}"#;
    let bad_type = r#"{"type":"bogus","id":"x","parentId":"e1"}"#;
    assert!(later.contains("e200") && nowhere.contains("zz"));
    let cases = [
        with(&[]),
        with(&[(150, &twice)]),
        with(&[(41, &later)]),
        with(&[(60, &nowhere), (150, &twice)]),
        with(&[(150, &twice), (200, bad_type)]),
        with(&[(200, bad_type), (250, &twice)]),
        with(&[(150, own)]),
    ];
    let read = |text: &str, holding: Option<(usize, usize)>| {
        HOLDING.set(holding);
        let whole = read_pi(text.as_bytes(), "t").map(|s| s.import.commits);
        let (_dir, path) = on_disk(text);
        let opened = PiFile::open(&path, "t").map(|_| ());
        HOLDING.set(None);
        (
            whole.map_err(|e| (e.line, e.reason)),
            opened.map_err(|e| (e.line, e.reason)),
        )
    };
    let mut refused = 0;
    for (i, text) in cases.iter().enumerate() {
        let (held, held_open) = read(text, None);
        let (ledger, ledger_open) = read(text, Some((0, 1)));
        assert_eq!(
            normalised_result(&held),
            normalised_result(&ledger),
            "case {i}"
        );
        assert_eq!(held_open, ledger_open, "case {i}");
        assert_eq!(
            held_open,
            held.as_ref().map(|_| ()).map_err(Clone::clone),
            "case {i}"
        );
        refused += usize::from(held.is_err());
    }
    assert_eq!(refused, 6, "every case but the first is refused");
}

fn normalised_result(
    r: &Result<Vec<ImportCommit>, (u64, String)>,
) -> Result<Vec<ImportCommit>, (u64, String)> {
    r.as_ref()
        .map(|c| normalised(c, false))
        .map_err(Clone::clone)
}

/// A version 1 file's made-up ids are distinct without a record of the
/// earlier ones: the seed's permutation gives 2^16 numbers distinct ids,
/// and a number beyond 32 bits none.
#[test]
fn version_1_ids_are_distinct_by_construction() {
    let seed = Seed([3, 4]);
    let ids: std::collections::HashSet<EntryId> =
        (0..1u64 << 16).map(|n| seed.entry_id(n).unwrap()).collect();
    assert_eq!(ids.len(), 1 << 16);
    assert!(seed.entry_id(u64::from(u32::MAX)).is_ok());
    assert!(seed.entry_id(1 << 32).is_err());
    let other: Vec<EntryId> = (0..4).map(|n| Seed([5, 6]).entry_id(n).unwrap()).collect();
    let ours: Vec<EntryId> = (0..4).map(|n| seed.entry_id(n).unwrap()).collect();
    assert_ne!(other, ours, "another seed, other ids");
}

#[test]
fn open_refuses_what_read_pi_refuses_on_the_same_line() {
    let head =
        r#"{"type":"session","version":3,"id":"s","timestamp":"2025-01-01T00:00:00Z","cwd":""}"#;
    let a = r#"{"type":"custom","id":"a1","parentId":null,"timestamp":"2025-01-01T00:00:00Z","customType":"x"}"#;
    let with = |line: &str| format!("{head}\n{a}\n\n{line}\n");
    let bad = [
        String::new(),
        "\n\n".to_string(),
        format!("{a}\n"),
        "[1]\n".to_string(),
        head.replace("\"version\":3", "\"version\":4"),
        head.replace("\"id\":\"s\"", "\"id\":\"\""),
        head.replace("\"id\":\"s\"", "\"id\":7"),
        with(r#"{"type":"custom","id":"b1","parentId":"zz","customType":"x"}"#),
        with(a),
        with(head),
        with("[2]"),
        with(r#"{"id":"b1","parentId":"a1"}"#),
        with(r#"{"type":"custom","parentId":"a1","customType":"x"}"#),
        with(r#"{"type":"custom","id":"b 1","parentId":"a1","customType":"x"}"#),
        with(r#"{"type":"custom","id":"b1","parentId":"b1","customType":"x"}"#),
        with(r#"{"type":"custom","id":"b1","parentId":5,"customType":"x"}"#),
        with(r#"{"type":"nope","id":"b1","parentId":"a1"}"#),
        with(r#"{"type":"message","id":"b1","parentId":"a1","message":{"role":"robot"}}"#),
        with(
            r#"{"type":"message","id":"b1","parentId":"a1","message":{"role":"user","content":5}}"#,
        ),
        with(
            r#"{"type":"message","id":"b1","parentId":"a1","message":{"role":"assistant","stopReason":"tired"}}"#,
        ),
        with(r#"{"type":"label","id":"b1","parentId":"a1","targetId":"a b"}"#),
        with(r#"{"type":"model_change","id":"b1","parentId":"a1","provider":"p"}"#),
    ];
    for (i, text) in bad.iter().enumerate() {
        let want = read_pi(text.as_bytes(), "t").unwrap_err();
        let (_dir, path) = on_disk(text);
        let Err(got) = PiFile::open(&path, "t") else {
            panic!("case {i}: {text:?} was accepted");
        };
        assert_eq!(
            (got.line, &got.reason),
            (want.line, &want.reason),
            "case {i}"
        );
    }
    // Not UTF-8.
    let mut bytes = format!("{head}\n{a}\n").into_bytes();
    bytes.extend_from_slice(b"{\"x\":\"\xff\"}\n");
    let want = read_pi(bytes.as_slice(), "t").unwrap_err();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.jsonl");
    std::fs::write(&path, &bytes).unwrap();
    let got = PiFile::open(&path, "t").err().unwrap();
    assert_eq!((got.line, got.reason), (want.line, want.reason));
    assert_eq!(want.line, 3);
}

/// The leaf's settings of a branched file whose path runs through long
/// lines (over the 64 KiB a backward read starts with) and many blocks are
/// those `read_pi` finds over its entries.
#[test]
fn a_branched_file_s_leaf_settings_come_from_its_path_over_long_lines() {
    let mut file = format!("{HEAD}\n");
    file.push_str(r#"{"type":"thinking_level_change","id":"a1","parentId":null,"timestamp":"2025-01-01T00:00:00Z","thinkingLevel":"high"}"#);
    file.push('\n');
    file.push_str(r#"{"type":"model_change","id":"b1","parentId":"a1","timestamp":"2025-01-01T00:00:00Z","provider":"side","modelId":"branch"}"#);
    file.push('\n');
    file.push_str(r#"{"type":"model_change","id":"c0","parentId":"a1","timestamp":"2025-01-01T00:00:00Z","provider":"anthropic","modelId":"claude"}"#);
    file.push('\n');
    for i in 1..=120 {
        let len = if i % 10 == 0 { 150_000 } else { 3_000 };
        file.push_str(&format!(
            r#"{{"type":"custom","id":"c{i}","parentId":"c{}","timestamp":"2025-01-01T00:00:01Z","customType":"c","data":"{}"}}"#,
            i - 1,
            "x".repeat(len)
        ));
        file.push('\n');
        if i == 60 {
            file.push_str(r#"{"type":"thinking_level_change","id":"d1","parentId":"b1","timestamp":"2025-01-01T00:00:00Z","thinkingLevel":"low"}"#);
            file.push('\n');
        }
    }
    // The leaf: the last line, back on the long branch.
    file.push_str(r#"{"type":"custom","id":"leaf","parentId":"c120","timestamp":"2025-01-01T00:00:01Z","customType":"c"}"#);
    let whole = read_pi(file.as_bytes(), "t").unwrap();
    let (_dir, path) = on_disk(&file);
    let streamed = stream(&mut PiFile::open(&path, "t").unwrap()).unwrap();
    assert_eq!(
        normalised(&streamed, false),
        normalised(&whole.import.commits, false)
    );
    let SessionEvent::Created {
        definition, state, ..
    } = &streamed[0].events[0]
    else {
        panic!()
    };
    assert_eq!(definition.model.model, "claude");
    assert_eq!(
        state.metadata.get("pi.thinking_level").map(|v| v.as_str()),
        Some(r#""high""#),
        "the low level is on the other branch"
    );
}
