//! Opaque payloads held as `Json` are stored exactly as they were when
//! they were `serde_json::Value`s: events written with the old layout
//! (built here from stand-ins that hold `Value`s) encode to the same
//! bytes and decode to the same events, in MessagePack and in JSON, and
//! a tagged value whose tag is not its first field still decodes.

use serde::Serialize;
use serde_json::{json, Value};
use spool_runtime::session::{decode_appended_entry, decode_event, encode_event, EVENT_SCHEMA};
use spool_runtime::transcript::{
    ContentBlock, Entry, EntryId, EntryKind, Message, StopReason, Usage,
};
use spool_runtime::SessionEvent;

// The layout as it was written with `Value` payloads.

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OldEvent {
    EntryAppended { entry: OldEntry },
    MetadataWritten { key: String, value: Value },
}

#[derive(Serialize)]
struct OldEntry {
    id: &'static str,
    parent_id: Option<&'static str>,
    timestamp_ms: i64,
    kind: OldKind,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OldKind {
    Message {
        message: OldMessage,
    },
    Custom {
        custom_type: &'static str,
        data: Value,
    },
    CustomMessage {
        custom_type: &'static str,
        content: Vec<OldBlock>,
        display: bool,
        details: Option<Value>,
    },
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "snake_case")]
enum OldMessage {
    Assistant {
        content: Vec<OldBlock>,
        stop_reason: StopReason,
        usage: Usage,
        model: Option<&'static str>,
        error_message: Option<&'static str>,
    },
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OldBlock {
    Text {
        text: &'static str,
    },
    ToolCall {
        id: &'static str,
        name: &'static str,
        arguments: Value,
    },
}

fn old_bytes<T: Serialize>(v: &T) -> Vec<u8> {
    let mut b = vec![EVENT_SCHEMA];
    b.extend(rmp_serde::to_vec_named(v).unwrap());
    b
}

fn payloads() -> Vec<Value> {
    let deep = (0..60).fold(json!([]), |acc, i| json!({ "d": acc, "i": i }));
    vec![
        Value::Null,
        json!({}),
        json!({"path": "src/main.rs", "lines": [1, 2, 3], "opts": {"z": true, "a": null}}),
        json!([0.1, -0.0, 1e300, 5e-324, f64::MAX, 0.30000000000000004, 1.5]),
        json!([u64::MAX, i64::MIN, i64::MAX, -1, 0]),
        json!({"é": "漢字 🦀", "q": "\"\\\n\t\u{0}\u{1f}\u{7f}\u{2028}", "": ""}),
        deep,
    ]
}

/// Checks `new` against the old layout `old`, both ways, in MessagePack
/// and in JSON.
fn same(new: &SessionEvent, old: &OldEvent) {
    let bytes = old_bytes(old);
    assert_eq!(encode_event(new).unwrap(), bytes);
    assert_eq!(&decode_event(&bytes).unwrap(), new);
    if let SessionEvent::EntryAppended { entry } = new {
        assert_eq!(&decode_appended_entry(&bytes).unwrap(), entry);
    }
    let text = serde_json::to_string(old).unwrap();
    assert_eq!(serde_json::to_string(new).unwrap(), text);
    assert_eq!(&serde_json::from_str::<SessionEvent>(&text).unwrap(), new);
}

fn entry(kind: EntryKind) -> SessionEvent {
    SessionEvent::EntryAppended {
        entry: Entry {
            id: EntryId::parse("e1").unwrap(),
            parent_id: Some(EntryId::parse("e0").unwrap()),
            timestamp_ms: 7,
            kind,
        },
    }
}

fn old_entry(kind: OldKind) -> OldEvent {
    OldEvent::EntryAppended {
        entry: OldEntry {
            id: "e1",
            parent_id: Some("e0"),
            timestamp_ms: 7,
            kind,
        },
    }
}

#[test]
fn payload_events_are_stored_as_they_were_with_values() {
    for v in payloads() {
        let usage = Usage {
            input_tokens: 3,
            ..Usage::default()
        };
        same(
            &entry(EntryKind::Message {
                message: Message::Assistant {
                    content: vec![
                        ContentBlock::text("calling"),
                        ContentBlock::tool_call("c1", "tool", v.clone()),
                    ],
                    stop_reason: StopReason::ToolUse,
                    usage,
                    model: None,
                    error_message: None,
                },
            }),
            &old_entry(OldKind::Message {
                message: OldMessage::Assistant {
                    content: vec![
                        OldBlock::Text { text: "calling" },
                        OldBlock::ToolCall {
                            id: "c1",
                            name: "tool",
                            arguments: v.clone(),
                        },
                    ],
                    stop_reason: StopReason::ToolUse,
                    usage,
                    model: None,
                    error_message: None,
                },
            }),
        );
        same(
            &entry(EntryKind::Custom {
                custom_type: "plugin".into(),
                data: v.clone().into(),
            }),
            &old_entry(OldKind::Custom {
                custom_type: "plugin",
                data: v.clone(),
            }),
        );
        let details = (!v.is_null()).then(|| v.clone());
        same(
            &entry(EntryKind::CustomMessage {
                custom_type: "note".into(),
                content: vec![ContentBlock::text("n")],
                display: true,
                details: details.clone().map(Into::into),
            }),
            &old_entry(OldKind::CustomMessage {
                custom_type: "note",
                content: vec![OldBlock::Text { text: "n" }],
                display: true,
                details,
            }),
        );
        same(
            &SessionEvent::MetadataWritten {
                key: "k".into(),
                value: v.clone().into(),
            },
            &OldEvent::MetadataWritten {
                key: "k".into(),
                value: v,
            },
        );
    }
}

/// Fields of a tagged value in another order than its writer's (tag
/// last), in MessagePack and in JSON: decoded as before.
#[test]
fn a_tag_after_the_fields_still_decodes() {
    #[derive(Serialize)]
    struct TagLast<T> {
        entry: T,
        #[serde(rename = "type")]
        tag: &'static str,
    }
    #[derive(Serialize)]
    struct KindTagLast {
        custom_type: &'static str,
        data: Value,
        #[serde(rename = "type")]
        tag: &'static str,
    }
    #[derive(Serialize)]
    struct EntryOf<K> {
        id: &'static str,
        parent_id: Option<&'static str>,
        timestamp_ms: i64,
        kind: K,
    }
    let data = json!({"b": [1, 2.5, "x"], "a": {"n": -1}});
    let v = TagLast {
        entry: EntryOf {
            id: "e1",
            parent_id: Some("e0"),
            timestamp_ms: 7,
            kind: KindTagLast {
                custom_type: "plugin",
                data: data.clone(),
                tag: "custom",
            },
        },
        tag: "entry_appended",
    };
    let want = entry(EntryKind::Custom {
        custom_type: "plugin".into(),
        data: data.into(),
    });
    assert_eq!(decode_event(&old_bytes(&v)).unwrap(), want);
    let text = serde_json::to_string(&v).unwrap();
    assert_eq!(serde_json::from_str::<SessionEvent>(&text).unwrap(), want);
    // A missing tag, or an unknown one, is an error, not a panic.
    assert!(serde_json::from_str::<SessionEvent>(r#"{"entry":{}}"#).is_err());
    assert!(serde_json::from_str::<SessionEvent>(r#"{"type":"nope"}"#).is_err());
    assert!(serde_json::from_str::<SessionEvent>(r#"{"key":"k","type":"nope"}"#).is_err());
    assert!(serde_json::from_str::<SessionEvent>(r#"[]"#).is_err());
    // Unit variants and the compact (sequence) form.
    assert_eq!(
        serde_json::from_str::<SessionEvent>(r#"{"type":"touched","extra":[1]}"#).unwrap(),
        SessionEvent::Touched
    );
    assert_eq!(
        serde_json::from_str::<SessionEvent>(r#"["metadata_written","k",{"z":1,"a":2}]"#).unwrap(),
        SessionEvent::MetadataWritten {
            key: "k".into(),
            value: json!({"a": 2, "z": 1}).into(),
        }
    );
}
