//! A keyed bucket's parts as the export shows them, from the text the store keeps
//! (`header:x-org=acme&consumer=<key in hex>`, names and values `%XX`-escaped where
//! they hold `%`, `&`, `=`, controls or non-ASCII bytes).

use std::borrow::Cow;

use percent_encoding::percent_decode_str;

use crate::store::CallerKey;

/// The bucket's caller column (its parts as `/admin/usage` takes them as
/// parameters, `consumer` and `ip` by the caller's name as `name` gives it) and its
/// parts decoded, in order.
pub(super) fn named(
    text: &str,
    name: impl Fn(CallerKey) -> String,
) -> (String, Option<Vec<(String, String)>>) {
    let mut caller = String::new();
    let mut parts = Vec::new();
    for pair in text.split('&') {
        let (part, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decoded = |text: &str| match percent_decode_str(text).decode_utf8_lossy() {
            Cow::Borrowed(text) => text.to_string(),
            Cow::Owned(text) => text,
        };
        let (part, mut value_text) = (decoded(part), value.to_string());
        let mut value = decoded(value);
        if matches!(&*part, "consumer" | "ip")
            && let Ok(key) = u64::from_str_radix(&value, 16)
        {
            value = name(key);
            value_text = value.replace('%', "%25").replace('&', "%26");
        }
        if !caller.is_empty() {
            caller.push('&');
        }
        caller.push_str(pair.split_once('=').map_or(pair, |(name, _)| name));
        caller.push('=');
        caller.push_str(&value_text);
        parts.push((part, value));
    }
    (caller, Some(parts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_read_back_decoded_and_callers_by_name() {
        let text = "consumer=ffff7f000001&header:x-org=acme%26co&query:q=Z%C3%BCrich&path:2=";
        let (caller, parts) = named(text, |key| format!("ip:{key:x}"));
        assert_eq!(
            caller,
            "consumer=ip:ffff7f000001&header:x-org=acme%26co&query:q=Z%C3%BCrich&path:2="
        );
        let parts = parts.unwrap();
        assert_eq!(parts[0], ("consumer".into(), "ip:ffff7f000001".into()));
        assert_eq!(parts[1], ("header:x-org".into(), "acme&co".into()));
        assert_eq!(parts[2], ("query:q".into(), "Zürich".into()));
        assert_eq!(parts[3], ("path:2".into(), String::new()));
    }
}
