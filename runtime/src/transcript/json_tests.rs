//! [`Json`] against the `serde_json::Value` it replaces: the same bytes in
//! MessagePack and JSON, the same values decoded, the same refusals.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::Json;

/// MessagePack as the store writes it (named maps).
fn mp<T: serde::Serialize + ?Sized>(v: &T) -> Vec<u8> {
    rmp_serde::to_vec_named(v).unwrap()
}

/// Everything a `Json` must agree with its `Value` on.
fn check(v: &Value) {
    let j = Json::from(v);
    assert_eq!(j.as_str(), serde_json::to_string(v).unwrap());
    assert_eq!(&j.to_value(), v);
    assert_eq!(j, *v);
    // MessagePack: the same bytes, and the bytes decode back.
    let bytes = mp(v);
    assert_eq!(mp(&j), bytes, "{v}");
    let back: Json = rmp_serde::from_slice(&bytes).unwrap();
    assert_eq!(back, j);
    let old: Value = rmp_serde::from_slice(&bytes).unwrap();
    assert_eq!(back, old);
    // JSON: the same text, read back.
    let text = serde_json::to_string(&j).unwrap();
    assert_eq!(text, serde_json::to_string(v).unwrap());
    assert_eq!(Json::from_text(&text).unwrap(), j);
    let pretty = serde_json::to_string_pretty(v).unwrap();
    assert_eq!(Json::from_text(&pretty).unwrap(), j);
}

#[test]
fn payloads_encode_and_decode_as_values_did() {
    let deep = (0..60).fold(json!(1), |acc, i| json!({ format!("k{i}"): [acc, i] }));
    for v in [
        Value::Null,
        json!(true),
        json!(0),
        json!(-1),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(i64::MAX),
        json!(0.1),
        json!(-0.0),
        json!(1.0),
        json!(1e300),
        json!(f64::MIN_POSITIVE),
        json!(5e-324),
        json!(f64::MAX),
        json!(f64::MIN),
        json!(0.30000000000000004),
        json!(""),
        json!("plain"),
        json!("quote \" backslash \\ newline \n tab \t nul \u{0} bell \u{7} del \u{7f}"),
        json!("unicode é 漢字 🦀 \u{2028}"),
        json!([]),
        json!({}),
        json!([1, "two", null, [3.5, {"four": 4}]]),
        json!({"b": 1, "a": {"d": [true, false], "c": null}, "": "empty key", "é": 2}),
        json!({"path": "/tmp/x", "n": 3, "flags": ["-r", "-f"], "nested": {"z": {"y": {"x": []}}}}),
        deep,
    ] {
        check(&v);
    }
}

#[test]
fn text_is_canonical_whatever_its_order_spacing_and_duplicates() {
    let j = Json::from_text(r#" { "b" : [ 1 , 2.50 , 1e2, -0 ] , "a" : "\u0041\n" , "b" : 7 } "#)
        .unwrap();
    // A repeated key keeps its last value, as a `Value` map does.
    assert_eq!(j.as_str(), r#"{"a":"A\n","b":7}"#);
    let j = Json::from_text(r#"{"b":[1,2.50,1e2,-0],"a":{"y":1,"x":2}}"#).unwrap();
    let v: Value = serde_json::from_str(r#"{"b":[1,2.50,1e2,-0],"a":{"y":1,"x":2}}"#).unwrap();
    assert_eq!(j.as_str(), serde_json::to_string(&v).unwrap());
    assert_eq!(j.to_string(), j.as_str());
    assert!(Json::from_text("[1,").is_err());
    assert!(Json::from_text("1 2").is_err());
    assert!(Json::default().is_null());
    assert_eq!(
        Json::from_text("\"s\"").unwrap().as_string().as_deref(),
        Some("s")
    );
}

#[test]
fn json_text_nesting_is_limited_as_serde_json_limits_a_value() {
    let ok = format!("{}{}", "[".repeat(127), "]".repeat(127));
    assert!(serde_json::from_str::<Value>(&ok).is_ok());
    assert!(Json::from_text(&ok).is_ok());
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    assert!(serde_json::from_str::<Value>(&deep).is_err());
    assert!(Json::from_text(&deep).is_err());
}

/// MessagePack allows deeper values than `serde_json` text: one stored
/// that deep still decodes and encodes to the same bytes.
#[test]
fn a_deep_stored_value_decodes_and_encodes_again() {
    let depth = 500;
    let mut bytes = vec![0x91; depth];
    bytes.push(0x01);
    let old: Value = rmp_serde::from_slice(&bytes).unwrap();
    let j: Json = rmp_serde::from_slice(&bytes).unwrap();
    assert_eq!(mp(&j), bytes);
    assert_eq!(mp(&old), bytes);
    assert_eq!(j.to_value(), old);
    let text = serde_json::to_string(&j).unwrap();
    assert_eq!(text, serde_json::to_string(&old).unwrap());
}

/// What `Value` refused from MessagePack is refused (an error, no panic);
/// what it turned into `null` (a NaN) is `null`.
#[test]
fn msgpack_shapes_without_a_json_value_are_refused_as_before() {
    let cases: &[&[u8]] = &[
        &[0xc4, 0x02, 0x01, 0x02],       // binary
        &[0xd4, 0x01, 0x00],             // fixext
        &[0x81, 0x01, 0x02],             // map with an integer key
        &[0x81, 0xc4, 0x01, 0x61, 0x02], // map with a binary key
        &[0xc1],                         // reserved marker
        &[0x92, 0x01],                   // truncated array
        &[0xa3, 0xff, 0xfe, 0xfd],       // invalid UTF-8
        &[0xdd, 0xff, 0xff, 0xff, 0xff], // huge declared count
    ];
    for b in cases {
        assert!(rmp_serde::from_slice::<Value>(b).is_err(), "{b:?}");
        assert!(rmp_serde::from_slice::<Json>(b).is_err(), "{b:?}");
    }
    let nan = [0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0];
    let v: Value = rmp_serde::from_slice(&nan).unwrap();
    let j: Json = rmp_serde::from_slice(&nan).unwrap();
    assert_eq!(v, Value::Null);
    assert_eq!(j, v);
    // An f32 widens to f64, as `Value` widened it.
    let f32_bytes = [0xca, 0x3d, 0xcc, 0xcc, 0xcd];
    let v: Value = rmp_serde::from_slice(&f32_bytes).unwrap();
    let j: Json = rmp_serde::from_slice(&f32_bytes).unwrap();
    assert_eq!(j, v);
    assert_eq!(mp(&j), mp(&v));
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((".{0,4}", inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn any_value_round_trips_with_the_same_bytes(v in value()) {
        check(&v);
    }

    /// Object text in any key order (repeats included) reads as
    /// `serde_json` reads it into a `Value`.
    #[test]
    fn any_object_text_reads_as_a_value_reads(
        kv in prop::collection::vec(("[a-d]{0,2}", value()), 0..8)
    ) {
        let body: Vec<String> = kv
            .iter()
            .map(|(k, v)| format!("{}:{}", serde_json::to_string(k).unwrap(), v))
            .collect();
        let text = format!("{{{}}}", body.join(","));
        let v: Value = serde_json::from_str(&text).unwrap();
        let j = Json::from_text(&text).unwrap();
        prop_assert_eq!(j.as_str(), serde_json::to_string(&v).unwrap());
        prop_assert_eq!(mp(&j), mp(&v));
    }
}
