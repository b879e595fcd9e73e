//! Request ids: the one an upstream proxy or client sent, if it is well formed, else
//! a new one. The same id goes upstream, back to the client and into the access log.

use http::HeaderValue;

/// Longest incoming id that is kept (a UUID is 36, a W3C trace id 32).
const MAX_LEN: usize = 128;

/// The request's id: `incoming` if it is 1 to 128 characters of `A-Z a-z 0-9` and
/// `- _ . : + / = @` (what UUIDs, ULIDs, trace ids and base64 use), else a new one.
/// Anything else (spaces, quotes, control characters, a megabyte) is replaced rather
/// than passed on, so no log or upstream ever sees it.
pub(crate) fn keep_or_new(incoming: Option<&HeaderValue>) -> HeaderValue {
    match incoming {
        Some(id) if well_formed(id.as_bytes()) => id.clone(),
        _ => generate(),
    }
}

fn well_formed(id: &[u8]) -> bool {
    (1..=MAX_LEN).contains(&id.len())
        && id
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"-_.:+/=@".contains(&b))
}

/// 128 random bits as 32 hex digits.
///
/// The digits are the `Bytes`' owner, in one block with its reference count: the id
/// is cloned into the response and the upstream request, and `Bytes` copied from a
/// slice would allocate a second block (its shared count) at the first clone.
fn generate() -> HeaderValue {
    let mut hex = [0u8; 32];
    let bits = fastrand::u128(..).to_be_bytes();
    const_hex::encode_to_slice(bits, &mut hex).expect("32 digits for 16 bytes");
    HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(hex))
        .expect("hex digits are a valid header value")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_well_formed_id_is_kept() {
        for id in [
            "3f2b8c1e-9a4d-4e2f-8b7a-1c2d3e4f5a6b",
            "01HQ3Z5V2K8M9N0P1Q2R3S4T5V",
            "abc:def/ghi+jk=@x_y.z",
        ] {
            let value = HeaderValue::from_static(id);
            assert_eq!(keep_or_new(Some(&value)), id);
        }
    }

    #[test]
    fn anything_else_is_replaced_by_a_new_id() {
        let long = "a".repeat(129);
        for id in [
            "",
            "has space",
            "quote\"d",
            "semi;colon",
            "tab\there",
            long.as_str(),
        ] {
            let value = HeaderValue::from_str(id).unwrap();
            let replaced = keep_or_new(Some(&value));
            assert_ne!(replaced, id);
            assert_eq!(replaced.len(), 32);
            assert!(well_formed(replaced.as_bytes()));
        }
        let obs = HeaderValue::from_bytes(b"caf\xe9").unwrap();
        assert_eq!(keep_or_new(Some(&obs)).len(), 32);
        assert_ne!(keep_or_new(None), keep_or_new(None));
    }
}
