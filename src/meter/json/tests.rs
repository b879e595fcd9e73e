use super::*;

fn scan(doc: &str, path: &str, piece: usize) -> (Option<u64>, bool) {
    let path = Arc::new(JsonPath::new(path.split('.').map(str::to_string).collect()));
    let mut field = JsonField::new(path);
    for chunk in doc.as_bytes().chunks(piece) {
        field.feed(chunk);
    }
    field.finish();
    (field.value(), field.broken())
}

#[test]
fn finds_the_field_at_its_path_whatever_the_pieces() {
    let doc = r#"{"id":"x","choices":[{"usage":{"total_tokens":9}}],
        "usage": {"prompt_tokens": 12, "total_tokens": 345, "x": [1, {"total_tokens": 7}]},
        "total_tokens": 1}"#;
    for piece in [1, 2, 3, 7, 1000] {
        assert_eq!(scan(doc, "usage.total_tokens", piece), (Some(345), false));
    }
    assert_eq!(scan(doc, "total_tokens", 5).0, Some(1));
    assert_eq!(scan(doc, "usage.prompt_tokens", 5).0, Some(12));
    assert_eq!(scan(doc, "usage.missing", 5).0, None);
}

#[test]
fn containers_off_the_path_are_passed_over_by_their_strings_and_brackets() {
    let doc = r#"{"a": [{"n": 1, "s": "]}\"{["}, [[]], "\\"], "b": {"n": 2, "x": "}"},
        "c": {"n": 5, "d": [{"n": 6}]}, "n": 3}"#;
    for piece in [1, 2, 3, 1000] {
        assert_eq!(scan(doc, "n", piece), (Some(3), false));
        assert_eq!(scan(doc, "b.n", piece), (Some(2), false));
        assert_eq!(scan(doc, "c.n", piece), (Some(5), false));
    }
    assert_eq!(scan(doc, "a.n", 4).0, None, "array elements have no key");
    assert_eq!(
        scan(r#"{"a": [1, {"b": 2]}, "n": 3}"#, "n", 3),
        (None, true)
    );
    assert_eq!(scan(r#"{"a": {"b": "x}, "n": 3}"#, "n", 3).0, None);
}

#[test]
fn a_number_at_the_end_of_the_document_counts() {
    assert_eq!(scan(r#"{"n": 42}"#, "n", 1).0, Some(42));
    assert_eq!(scan(r#"{"n": 4.9}"#, "n", 1).0, Some(4));
    assert_eq!(scan(r#"{"n": -4}"#, "n", 1).0, None);
    assert_eq!(scan(r#"{"n": 1e3}"#, "n", 1).0, None);
    assert_eq!(
        scan(r#"{"n": "42"}"#, "n", 1).0,
        None,
        "a string is not a cost"
    );
    assert_eq!(
        scan(r#"{"n\u0041": 42}"#, "nA", 1).0,
        None,
        "escaped keys never match"
    );
    assert_eq!(scan(r#"{"n": 99999999999999999999}"#, "n", 1).0, None);
    for piece in [1, 2, 100] {
        assert_eq!(scan(r#"{"n": 0}"#, "n", piece).0, Some(0));
        assert_eq!(scan(r#"{"n": 0.75}"#, "n", piece).0, Some(0));
        assert_eq!(scan(r#"{"n": 10.25}"#, "n", piece).0, Some(10));
        for not_json in ["042", "00", "12.", "1.2.3", "0x1"] {
            let doc = format!(r#"{{"n": {not_json}}}"#);
            assert_eq!(scan(&doc, "n", piece).0, None, "{doc}");
        }
    }
}

/// Any JSON value serde_json can write, small enough to read in a failure: nested
/// arrays and objects whose keys (`n`, `o`, `s`) repeat the paths looked for, and
/// strings full of the brackets and escapes the scanner passes over.
fn json_value() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
    use proptest::prelude::*;
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (0.0f64..1e6).prop_map(Value::from),
        "[a-z{}\\[\\]:,\"\\\\ é]{0,8}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map("[nos]", inner, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// What the scanner must find at `path` of `doc`, as serde_json reads it: an
/// integer is itself (a negative one is unknown: a sign makes it so), a missing
/// field or one that is not a number is nothing. `None` for a float, which
/// serde_json may write with an exponent (unknown to the scanner) or a fraction
/// (cut): it is not compared.
fn serde_reads(doc: &serde_json::Value, path: &[&str]) -> Option<Option<u64>> {
    let field = path.iter().try_fold(doc, |value, key| value.get(key));
    match field {
        Some(serde_json::Value::Number(n)) if n.is_f64() => None,
        Some(serde_json::Value::Number(n)) => Some(n.as_u64()),
        _ => Some(None),
    }
}

proptest::proptest! {
    /// Any bytes, in any pieces: never a panic.
    #[test]
    fn any_bytes_are_scanned_without_panicking(
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
        piece in 1usize..17,
    ) {
        let mut field = JsonField::new(Arc::new(JsonPath::new(vec!["n".to_string()])));
        for chunk in bytes.chunks(piece) {
            field.feed(chunk);
        }
        field.finish();
        let _ = field.value();
    }

    #[test]
    fn objects_serde_writes_are_read_alike(n in 0u64..1_000_000, pad in "[a-z ]{0,20}", piece in 1usize..9) {
        let doc = serde_json::json!({"pad": pad, "list": [1, {"n": 3}], "n": n, "o": {"n": 4}});
        let text = serde_json::to_string_pretty(&doc).unwrap();
        proptest::prop_assert_eq!(scan(&text, "n", piece), (Some(n), false));
        proptest::prop_assert_eq!(scan(&text, "o.n", piece), (Some(4), false));
    }

    /// Any object serde_json writes (compact or pretty), in any pieces, is JSON to
    /// the scanner, and the field at `n` and at `o.n` is what serde_json reads there.
    #[test]
    fn the_field_is_what_serde_json_reads(
        map in proptest::collection::btree_map("[nos]", json_value(), 0..5),
        pretty in proptest::prelude::any::<bool>(),
        piece in 1usize..17,
    ) {
        let doc = serde_json::Value::Object(map.into_iter().collect());
        let text = if pretty {
            serde_json::to_string_pretty(&doc).unwrap()
        } else {
            serde_json::to_string(&doc).unwrap()
        };
        for path in ["n", "o.n"] {
            let (value, broken) = scan(&text, path, piece);
            proptest::prop_assert!(!broken, "{text} is JSON");
            let keys: Vec<&str> = path.split('.').collect();
            if let Some(expected) = serde_reads(&doc, &keys) {
                proptest::prop_assert_eq!(value, expected, "{} in {}", path, text);
            }
        }
    }
}

#[test]
fn memory_stays_bounded_whatever_the_document() {
    let path = Arc::new(JsonPath::new(vec!["usage".into(), "total_tokens".into()]));
    let mut field = JsonField::new(path);
    let fresh = field.memory();
    let deep = format!("{}{}", "[".repeat(MAX_DEPTH - 1), "]".repeat(MAX_DEPTH - 1));
    let nested = format!(
        r#"{{"a": {deep}, "pad": "{}", "usage": {{"total_tokens": 9}}}}"#,
        "x".repeat(1 << 20)
    );
    for _ in 0..8 {
        field.reset();
        field.feed(nested.as_bytes());
        field.finish();
        assert_eq!(field.value(), Some(9));
    }
    let bound = size_of::<JsonField>() + MAX_DEPTH;
    println!(
        "scanner memory: {fresh} bytes fresh, {} after 8 MiB at depth 64 (bound {bound})",
        field.memory()
    );
    assert!(field.memory() <= bound, "{} > {bound}", field.memory());
}

#[test]
fn not_json_or_cut_short_finds_nothing() {
    assert_eq!(scan(r#"{"n": 42"#, "n", 3).0, None, "cut short");
    assert_eq!(scan("hello world", "n", 3), (None, true));
    assert_eq!(scan(r#"{"n": 42}}"#, "n", 3), (None, true));
    assert_eq!(scan(r#"{"n": 42} {"n": 1}"#, "n", 3), (None, true));
    assert_eq!(
        scan(r#"[{"n": 42}]"#, "n", 3).0,
        None,
        "array elements have no key"
    );
    let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
    assert!(scan(&deep, "n", 64).1);
    assert_eq!(scan(r#"{"a": [], "n": 3}"#, "n", 1).0, Some(3));
    assert_eq!(scan(r#"{"a": {}, "n": 3}"#, "n", 1).0, Some(3));
}
