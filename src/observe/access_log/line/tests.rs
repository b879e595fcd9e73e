use super::*;

fn line<'a>(strings: &'a [&'a str; 9], violated: &'a [&'static str], client: &str) -> Line<'a> {
    Line {
        time: strings[0],
        head: Head {
            request_id: strings[1],
            client: client.parse().unwrap(),
            consumer: Name {
                text: strings[2],
                plain: false,
            },
            plan: Name {
                text: strings[3],
                plain: json_plain(strings[3]),
            },
            route: Name {
                text: strings[4],
                plain: false,
            },
            method: strings[5],
            path: strings[6],
            status: 429,
            outcome: "limited",
            violated,
            would_refuse: if strings[8].is_empty() {
                &[]
            } else {
                &["minute"]
            },
            upstream: (!strings[7].is_empty()).then_some(strings[7]),
            upstream_status: (!strings[7].is_empty()).then_some(200),
        },
        tail: Tail {
            duration_ms: Millis(125),
            upstream_ms: (!strings[7].is_empty()).then_some(Millis(12)),
            bytes: u64::MAX,
            via: (!strings[8].is_empty()).then_some("rls"),
            grpc_status: (!strings[8].is_empty()).then_some(8),
            websocket: (!strings[8].is_empty()).then(|| SocketRecord {
                bytes_up: 10,
                close_code: 1000,
                ..SocketRecord::default()
            }),
            repeated: if strings[8].is_empty() { 0 } else { 41 },
        },
    }
}

#[test]
fn the_json_line_is_what_serde_json_writes() {
    let plain = [
        "2026-11-27T10:00:00.000Z",
        "3f2b8c1e9a4d4e2f",
        "acme",
        "registered",
        "orders",
        "GET",
        "/orders/7",
        "127.0.0.1:8080",
        "",
    ];
    let awkward = [
        "",
        "id \"quoted\" \\ back",
        "ünïcödé",
        "tab\there",
        "new\nline",
        "PURGE",
        "/caf%C3%A9/\u{1}",
        "[::1]:9",
        "x",
    ];
    let clients = ["2001:db8::7", "203.0.113.9", "0.0.0.0", "255.255.255.255"];
    for (strings, violated) in [
        (&plain, &[][..]),
        (&plain, &["minute", "hour"][..]),
        (&awkward, &["second"][..]),
    ] {
        for client in clients {
            let line = line(strings, violated, client);
            let mut ours = Vec::new();
            json(&line, &mut ours);
            let theirs = serde_json::to_vec(&line).unwrap();
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                String::from_utf8(theirs).unwrap()
            );
        }
    }
}

#[test]
fn milliseconds_are_what_serde_json_writes() {
    let micros = (0..20_000u64)
        .chain((0..40).map(|shift| 1u64 << shift))
        .chain([999_999, 1_000_001, 86_400_000_000, 999_999_999_999_999])
        .chain([1_000_000_000_000_000, 1_000_000_000_000_001]);
    let nanos = [0u64, 1, 499, 500, 999_999, 123_456_789, u64::from(u32::MAX)];
    let durations = micros
        .map(Duration::from_micros)
        .chain(nanos.map(Duration::from_nanos))
        .chain([Duration::MAX]);
    for ms in durations.map(Millis::of) {
        let mut ours = Vec::new();
        milliseconds(&mut ours, ms);
        let theirs = serde_json::to_vec(&ms).unwrap();
        assert_eq!(
            String::from_utf8(ours).unwrap(),
            String::from_utf8(theirs).unwrap(),
            "{ms:?}"
        );
    }
}

#[test]
fn no_text_field_can_break_the_line() {
    let forged = [
        "2026-11-27T10:00:00.000Z",
        "id\nforged",
        "evil\n2026-11-27T10:00:01.000Z 10.0.0.1 \"GET /admin\" 200",
        "plan\r",
        "route\u{1b}[31m",
        "GET",
        "/p\u{0}ath\n",
        "up\tstream:1",
        "",
    ];
    let line = line(&forged, &[], "203.0.113.9");
    let mut out = Vec::new();
    text(&line, &mut out);
    let out = String::from_utf8(out).unwrap();
    assert!(
        !out.contains(['\n', '\r', '\u{1b}', '\u{0}', '\t']),
        "{out}"
    );
    assert!(
        out.contains(r"consumer=evil\n2026-11-27T10:00:01.000Z"),
        "{out}"
    );
    assert!(out.contains(r"route=route\u{1b}[31m"), "{out}");
    assert!(out.contains(r"upstream=up\tstream:1"), "{out}");
    assert!(out.contains(r#""GET /p\0ath\n""#), "{out}");
    let plain = Field("acme/o'brien@x.y").to_string();
    assert_eq!(plain, "acme/o'brien@x.y");
    assert_eq!(Field(r"a\b").to_string(), r"a\\b");
}

#[test]
fn every_byte_json_escapes_is_found_wherever_it_is() {
    // Every length a word, its tail or the overlap of the last word can take, every
    // position, every byte, among neighbours that a borrow between bytes could turn
    // into a false alarm (bytes just above the ones flagged, and high bytes).
    for fill in [b'a', 0x21, 0x23, 0x5d, 0x80, 0xff] {
        for len in 0..=40 {
            let bytes = vec![fill; len];
            assert!(!needs_escape(&bytes), "{fill:#x} * {len}");
            for at in 0..len {
                for b in 0..=u8::MAX {
                    let must = b < 0x20 || b == b'"' || b == b'\\';
                    let mut bytes = bytes.clone();
                    bytes[at] = b;
                    assert_eq!(needs_escape(&bytes), must, "{b:#x} at {at} of {len}");
                }
            }
        }
    }
}

#[test]
fn every_escape_is_what_serde_json_writes() {
    let chars = (0..=0x7fu8)
        .map(char::from)
        .chain(['é', '€', '\u{2028}', '😀']);
    for c in chars {
        let value = format!("a{c}b{c}");
        let mut ours = vec![b'"'];
        contents(&mut ours, &value);
        ours.push(b'"');
        let theirs = serde_json::to_vec(&value).unwrap();
        assert_eq!(
            String::from_utf8(ours).unwrap(),
            String::from_utf8(theirs).unwrap(),
            "{c:?}"
        );
    }
}

#[test]
fn the_time_is_what_jiff_writes_across_seconds() {
    let mut stamp = Stamp::default();
    let start = 1_795_867_199_000_u64;
    let times = (0..2_500)
        .map(|i| start + i)
        .chain([0, 999, 1_000, start + 7, start]);
    for ms in times {
        let whole = jiff::Timestamp::from_millisecond(ms as i64).unwrap();
        assert_eq!(stamp.at(ms), format!("{whole:.3}"), "{ms}");
    }
}
