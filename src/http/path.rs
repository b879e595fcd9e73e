//! Normalisation of the request path before route matching.
//!
//! Every spelling of a path that an upstream could read as the same resource
//! is mapped to one canonical form, so that a route (or a rate limit bound to
//! a route) cannot be bypassed with `//admin`, `/x/../admin`, `/%61dmin` and
//! the like. The upstream receives the normalised path. The rules follow
//! RFC 3986 (sections 2.3, 6.2.2 and 5.2.4), and the result is a fixed point:
//! `normalize(normalize(p)) == normalize(p)`.
//!
//! What it does:
//! - decodes escaped unreserved characters (`%61` -> `a`, `%2E` -> `.`) and
//!   writes every other escape with uppercase hex digits (`%c3` -> `%C3`);
//! - percent-encodes raw ASCII bytes that are not allowed in a path segment
//!   (space, `"`, `[`, `{`, `|`, `?`, `#`, ...);
//! - collapses runs of `/` and removes `.` and `..` segments (after decoding),
//!   keeping a trailing slash.
//!
//! What it rejects: a path not starting with `/`, malformed escapes, `%2F`
//! and `%5C` (they would split segments differently upstream), a raw `\`,
//! NUL and control characters (raw or escaped), non-ASCII bytes, and a `..`
//! that climbs above the root.
//!
//! What it deliberately does not do: it does not see the query string (the
//! caller splits it off first), it does not handle the `*` request target of
//! `OPTIONS`, it does not decode escapes of reserved characters (`%3B` stays
//! `%3B`, as it may mean something different from `;` upstream) and it does
//! not apply Unicode normalisation.

use std::borrow::Cow;

/// Why a request path was refused; the message can be shown to the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PathError {
    #[error("path must start with '/'")]
    NotAbsolute,
    #[error("invalid percent-encoding in path")]
    InvalidPercentEncoding,
    #[error("encoded '/' or '\\' in path")]
    EncodedSeparator,
    #[error("'\\' in path")]
    Backslash,
    #[error("NUL or control character in path")]
    ControlCharacter,
    #[error("non-ASCII character in path")]
    NonAscii,
    #[error("path escapes above the root")]
    AboveRoot,
    #[error("percent-encoded bytes in path that are not UTF-8 (overlong or truncated)")]
    InvalidUtf8,
    #[error("';' path parameters are not allowed on this route")]
    Parameters,
}

/// Whether a normalised path holds `;` path parameters (raw or as `%3B`), which
/// upstreams such as Tomcat, Jetty and Spring strip before matching: `/admin;x` is
/// `/admin` to them, a path the routes never saw.
pub(crate) fn has_parameters(path: &str) -> bool {
    path.as_bytes().contains(&b';') || path.contains("%3B")
}

/// Normalises the path component (no query string: the caller splits it off
/// first).
///
/// Returns `Cow::Borrowed` without allocating when `path` is already normal.
pub(crate) fn normalize(path: &str) -> Result<Cow<'_, str>, PathError> {
    if is_normal(path) {
        Ok(Cow::Borrowed(path))
    } else {
        normalize_owned(path).map(Cow::Owned)
    }
}

/// Fast check: true exactly when `normalize_owned(path) == Ok(path)`.
/// Anything unusual (including every error case) answers false.
fn is_normal(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    let mut segments = rest.split('/').peekable();
    while let Some(segment) = segments.next() {
        let is_last = segments.peek().is_none();
        if (segment.is_empty() && !is_last) || segment == "." || segment == ".." {
            return false;
        }
        let bytes = segment.as_bytes();
        // Escaped non-ASCII bytes of the character being read: they must spell UTF-8.
        let mut utf8 = [0u8; 4];
        let mut utf8_len = 0;
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' {
                match escaped_byte(bytes, i) {
                    Some(value)
                        if is_upper_hex(bytes[i + 1])
                            && is_upper_hex(bytes[i + 2])
                            && keeps_escape(value) =>
                    {
                        if !value.is_ascii() {
                            utf8[utf8_len] = value;
                            utf8_len += 1;
                            match std::str::from_utf8(&utf8[..utf8_len]) {
                                Ok(_) => utf8_len = 0,
                                Err(e) if e.error_len().is_none() && utf8_len < 4 => {}
                                Err(_) => return false,
                            }
                        } else if utf8_len > 0 {
                            return false;
                        }
                    }
                    _ => return false,
                }
                i += 3;
            } else if is_pchar(bytes[i]) && utf8_len == 0 {
                i += 1;
            } else {
                return false;
            }
        }
        if utf8_len > 0 {
            return false;
        }
    }
    true
}

/// Full normalisation, always allocating.
fn normalize_owned(path: &str) -> Result<String, PathError> {
    let rest = path.strip_prefix('/').ok_or(PathError::NotAbsolute)?;
    // `out` holds the kept segments, each written as "/segment".
    let mut out = String::with_capacity(path.len());
    let mut segment = String::new();
    let mut trailing_slash = false;
    for raw in rest.split('/') {
        decode_segment(raw, &mut segment)?;
        trailing_slash = matches!(segment.as_str(), "" | "." | "..");
        match segment.as_str() {
            "" | "." => {}
            ".." => {
                let parent = out.rfind('/').ok_or(PathError::AboveRoot)?;
                out.truncate(parent);
            }
            _ => {
                out.push('/');
                out.push_str(&segment);
            }
        }
    }
    if out.is_empty() || trailing_slash {
        out.push('/');
    }
    Ok(out)
}

/// Writes the canonical form of one raw segment (no `/` in it) into `out`.
fn decode_segment(raw: &str, out: &mut String) -> Result<(), PathError> {
    out.clear();
    let bytes = raw.as_bytes();
    // Escaped non-ASCII bytes in a row must spell UTF-8: `%C0%AE` (an overlong
    // `.`) is decoded to `.` by some upstreams and would climb a directory there.
    let mut encoded = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        if byte == b'%'
            && let Some(value) = escaped_byte(bytes, i)
            && !value.is_ascii()
        {
            encoded.push(value);
        } else if !encoded.is_empty() {
            std::str::from_utf8(&encoded).map_err(|_| PathError::InvalidUtf8)?;
            encoded.clear();
        }
        if byte == b'%' {
            let value = escaped_byte(bytes, i).ok_or(PathError::InvalidPercentEncoding)?;
            if value == b'/' || value == b'\\' {
                return Err(PathError::EncodedSeparator);
            }
            check_byte(value, false)?;
            if is_unreserved(value) {
                out.push(char::from(value));
            } else {
                push_escaped(out, value);
            }
            i += 3;
            continue;
        }
        check_byte(byte, true)?;
        if is_pchar(byte) {
            out.push(char::from(byte));
        } else {
            push_escaped(out, byte);
        }
        i += 1;
    }
    if !encoded.is_empty() {
        std::str::from_utf8(&encoded).map_err(|_| PathError::InvalidUtf8)?;
    }
    Ok(())
}

/// Rejects control characters, and (for raw bytes) backslash and non-ASCII.
fn check_byte(byte: u8, raw: bool) -> Result<(), PathError> {
    if byte < 0x20 || byte == 0x7F {
        Err(PathError::ControlCharacter)
    } else if raw && byte == b'\\' {
        Err(PathError::Backslash)
    } else if raw && !byte.is_ascii() {
        Err(PathError::NonAscii)
    } else {
        Ok(())
    }
}

/// The byte encoded by the escape starting at `bytes[i] == b'%'`, if valid.
fn escaped_byte(bytes: &[u8], i: usize) -> Option<u8> {
    let high = hex_value(*bytes.get(i + 1)?)?;
    let low = hex_value(*bytes.get(i + 2)?)?;
    Some(high << 4 | low)
}

/// Whether an escaped byte stays escaped in a normal path (and is allowed).
fn keeps_escape(value: u8) -> bool {
    !is_unreserved(value) && value != b'/' && value != b'\\' && check_byte(value, false).is_ok()
}

fn push_escaped(out: &mut String, byte: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(char::from(HEX[usize::from(byte >> 4)]));
    out.push(char::from(HEX[usize::from(byte & 0x0F)]));
}

fn hex_value(byte: u8) -> Option<u8> {
    char::from(byte).to_digit(16).map(|digit| digit as u8)
}

fn is_upper_hex(byte: u8) -> bool {
    byte.is_ascii_digit() || (b'A'..=b'F').contains(&byte)
}

/// RFC 3986 section 2.3.
fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

/// A byte allowed unescaped in a path segment (RFC 3986 `pchar` minus `%`).
fn is_pchar(byte: u8) -> bool {
    is_unreserved(byte) || b"!$&'()*+,;=:@".contains(&byte)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn table() {
        use PathError::*;
        let cases: &[(&str, Result<&str, PathError>)] = &[
            ("/", Ok("/")),
            ("/a/b", Ok("/a/b")),
            ("/a/./b", Ok("/a/b")),
            ("/a/../b", Ok("/b")),
            ("/a/%2e%2E/b", Ok("/b")),
            ("/a/.%2e/b", Ok("/b")),
            ("/%61dmin", Ok("/admin")),
            ("/%7E%2D%5F%2E%41%7a%30", Ok("/~-_.Az0")),
            ("/a%2fb", Err(EncodedSeparator)),
            ("/a%2Fb", Err(EncodedSeparator)),
            ("/a%5Cb", Err(EncodedSeparator)),
            ("/a%5cb", Err(EncodedSeparator)),
            ("/a\\b", Err(Backslash)),
            ("/..", Err(AboveRoot)),
            ("/%2e%2e", Err(AboveRoot)),
            ("/a/../../b", Err(AboveRoot)),
            ("//admin", Ok("/admin")),
            ("/a//b/", Ok("/a/b/")),
            ("/a///b//", Ok("/a/b/")),
            ("//", Ok("/")),
            ("/%zz", Err(InvalidPercentEncoding)),
            ("/%4", Err(InvalidPercentEncoding)),
            ("/%", Err(InvalidPercentEncoding)),
            ("/%g0", Err(InvalidPercentEncoding)),
            ("/caf%c3%a9", Ok("/caf%C3%A9")),
            ("/a%3bb%25", Ok("/a%3Bb%25")),
            ("/a/b/..", Ok("/a/")),
            ("/a/b/%2E", Ok("/a/b/")),
            ("/a/.", Ok("/a/")),
            ("/a/..", Ok("/")),
            ("/.", Ok("/")),
            ("/a/", Ok("/a/")),
            ("/...", Ok("/...")),
            ("/.a/..b", Ok("/.a/..b")),
            ("a/b", Err(NotAbsolute)),
            ("", Err(NotAbsolute)),
            ("*", Err(NotAbsolute)),
            ("/a\0b", Err(ControlCharacter)),
            ("/a\nb", Err(ControlCharacter)),
            ("/a\x7Fb", Err(ControlCharacter)),
            ("/a%00b", Err(ControlCharacter)),
            ("/a%1fb", Err(ControlCharacter)),
            ("/a%7Fb", Err(ControlCharacter)),
            ("/café", Err(NonAscii)),
            (
                "/a b\"{}|^`[]<>?#",
                Ok("/a%20b%22%7B%7D%7C%5E%60%5B%5D%3C%3E%3F%23"),
            ),
            ("/!$&'()*+,;=:@-._~", Ok("/!$&'()*+,;=:@-._~")),
        ];
        for (input, expected) in cases {
            let got = normalize(input);
            assert_eq!(
                got.as_deref().map_err(Clone::clone),
                *expected,
                "input {input:?}"
            );
        }
    }

    #[test]
    fn normal_paths_are_borrowed() {
        for path in [
            "/",
            "/a",
            "/a/b/",
            "/api/v1/users/42",
            "/caf%C3%A9",
            "/a%20b",
            "/...",
        ] {
            assert!(matches!(normalize(path), Ok(Cow::Borrowed(_))), "{path:?}");
        }
    }

    #[test]
    fn error_messages_are_readable() {
        assert_eq!(
            PathError::NotAbsolute.to_string(),
            "path must start with '/'"
        );
        assert_eq!(
            PathError::EncodedSeparator.to_string(),
            "encoded '/' or '\\' in path"
        );
    }

    /// Paths built from tokens; the tokens that cause an error are rarer, so
    /// that most generated paths normalise successfully.
    fn path_strategy() -> impl Strategy<Value = String> {
        let good = prop::sample::select(vec![
            "/", "/", "/", ".", "..", "..", "a", "B", "z", "0", "f", "F", "%2e", "%2E", "%41",
            "%61", "%c3", "%3b", "%25", "~", ";", " ",
        ]);
        let bad = prop::sample::select(vec!["%", "%2f", "%5C", "%00", "\\"]);
        let token = prop_oneof![30 => good, 1 => bad];
        prop::collection::vec(token, 0..24).prop_map(|parts| format!("/{}", parts.concat()))
    }

    /// Fully percent-decodes a string (the escapes are known to be valid).
    fn decode_all(text: &str) -> Vec<u8> {
        let bytes = text.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' {
                out.push(u8::from_str_radix(&text[i + 1..i + 3], 16).unwrap());
                i += 3;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        out
    }

    /// Independent model: the decoded segments an upstream would see, or
    /// `None` if `..` climbs above the root.
    fn model_segments(path: &str) -> Option<Vec<Vec<u8>>> {
        let mut stack: Vec<Vec<u8>> = Vec::new();
        for segment in path.split('/').map(decode_all) {
            match segment.as_slice() {
                b"" | b"." => {}
                b".." => {
                    stack.pop()?;
                }
                _ => stack.push(segment),
            }
        }
        Some(stack)
    }

    #[test]
    fn escapes_of_non_ascii_bytes_must_spell_utf8() {
        assert_eq!(normalize("/caf%c3%a9").unwrap(), "/caf%C3%A9");
        assert_eq!(normalize("/%E2%82%AC/x").unwrap(), "/%E2%82%AC/x");
        for overlong in [
            "/%c0%ae%c0%ae/admin",
            "/%c0%af",
            "/%e0%80%ae",
            "/%c3",
            "/%c3a%a9",
            "/%ff",
        ] {
            assert_eq!(
                normalize(overlong),
                Err(PathError::InvalidUtf8),
                "{overlong}"
            );
        }
    }

    #[test]
    fn path_parameters_are_seen_raw_and_encoded() {
        for with in ["/admin;x", "/api;/x", "/a%3Bb", "/x/;"] {
            assert!(has_parameters(&normalize(with).unwrap()), "{with}");
        }
        assert!(has_parameters(&normalize("/a%3bb").unwrap()));
        assert!(!has_parameters(&normalize("/a/b%3Fc").unwrap()));
    }

    proptest! {
        #[test]
        fn idempotent_and_borrowed(path in path_strategy()) {
            if let Ok(once) = normalize(&path) {
                let twice = normalize(&once);
                prop_assert!(matches!(twice, Ok(Cow::Borrowed(_))));
                prop_assert_eq!(twice.as_deref(), Ok(&*once));
            }
        }

        #[test]
        fn fast_check_agrees_with_full_normalisation(path in path_strategy()) {
            prop_assert_eq!(is_normal(&path), normalize_owned(&path).as_deref() == Ok(&path));
        }

        #[test]
        fn output_is_canonical(path in path_strategy()) {
            if let Ok(out) = normalize(&path) {
                prop_assert!(out.starts_with('/'));
                prop_assert!(!out.contains("//"));
                prop_assert!(out[1..].split('/').all(|s| s != "." && s != ".."));
                let bytes = out.as_bytes();
                for (i, _) in out.match_indices('%') {
                    let hex = &out[i + 1..i + 3];
                    prop_assert_eq!(hex, hex.to_ascii_uppercase());
                    prop_assert!(!is_unreserved(escaped_byte(bytes, i).unwrap()));
                }
            }
        }

        #[test]
        fn matches_simple_model(path in path_strategy()) {
            if let Ok(out) = normalize(&path) {
                let out_segments: Vec<Vec<u8>> =
                    out.split('/').filter(|s| !s.is_empty()).map(decode_all).collect();
                prop_assert_eq!(Some(out_segments), model_segments(&path));
            } else if !path.contains(['%', '\\']) {
                prop_assert_eq!(model_segments(&path), None);
            }
        }
    }
}
