//! Cost after the response (`cost_after`): what a response says it cost, found as
//! it streams to the client, in a fixed amount of memory.
//!
//! A route's `CostAfter` names where the cost is: a response header or trailer
//! (`header:NAME`), or a numeric field of a JSON body (`json:PATH`), for a
//! `text/event-stream` answer the last event carrying it ([`sse`]). The [`Meter`]
//! rides on the response body, sees every frame ([`crate::http::body::Watch`]) and, when
//! the body ends, hands what it found (or nothing: not there, not JSON, cut short) to
//! a settle function. It changes no byte of the body and buffers none; what to charge
//! is admission's business ([`crate::admission`]).

pub(crate) mod json;
pub(crate) mod sse;

use bytes::Bytes;
use http::{HeaderMap, HeaderName};
use hyper::body::Frame;

use crate::config::route::{CostAfter, Source};
use crate::http::body::{End, Watch};
use json::JsonField;
use sse::EventStream;

/// How a response's cost was learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// The response said.
    Said(u64),
    /// It did not (or was cut short): charge `default_cost`.
    Unknown,
}

/// Reads a response body for its cost, then settles.
pub(crate) struct Meter<F: FnOnce(Found) + Send + 'static> {
    reading: Reading,
    found: Option<u64>,
    settle: Option<F>,
}

enum Reading {
    /// The cost is in a trailer (if not already in the head).
    Trailer(HeaderName),
    Json(JsonField),
    Events(EventStream),
}

impl<F: FnOnce(Found) + Send + 'static> Meter<F> {
    /// A meter for a response with `headers`, which `settle` is told the cost of.
    pub(crate) fn new(cost_after: &CostAfter, headers: &HeaderMap, settle: F) -> Meter<F> {
        let (reading, found) = match &cost_after.source {
            Source::Header(name) => (Reading::Trailer(name.clone()), number(headers, name)),
            Source::Json(path) => {
                let events = headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|ct| ct.trim_start().get(..17))
                    // Media types are case-insensitive (RFC 9110 section 8.3.1).
                    .is_some_and(|ct| ct.eq_ignore_ascii_case("text/event-stream"));
                match events {
                    true => (Reading::Events(EventStream::new(path.clone())), None),
                    false => (Reading::Json(JsonField::new(path.clone())), None),
                }
            }
        };
        Meter {
            reading,
            found,
            settle: Some(settle),
        }
    }
}

impl<F: FnOnce(Found) + Send + 'static> Watch for Meter<F> {
    fn frame(&mut self, frame: &Frame<Bytes>) {
        match (&mut self.reading, frame.data_ref(), frame.trailers_ref()) {
            (Reading::Json(json), Some(data), _) => json.feed(data),
            (Reading::Events(events), Some(data), _) => events.feed(data),
            (Reading::Trailer(name), _, Some(trailers)) => {
                if let Some(n) = number(trailers, name) {
                    self.found = Some(n);
                }
            }
            _ => {}
        }
    }

    fn end(mut self: Box<Self>, end: End) {
        let found = match &mut self.reading {
            // A header in the head is what the upstream said, however the body ends.
            Reading::Trailer(_) => self.found,
            Reading::Json(json) if end.complete => {
                json.finish();
                json.value()
            }
            Reading::Events(events) if end.complete => {
                events.finish();
                events.value()
            }
            _ => None,
        };
        if let Some(settle) = self.settle.take() {
            settle(found.map_or(Found::Unknown, Found::Said));
        }
    }
}

/// A cost header's value read as a JSON field's is: whole units, a fraction cut
/// (`12.9` is 12); a sign, an exponent, a leading zero (`042`) or anything else is
/// unknown. Sent more than once, the last copy counts, as the last of a JSON
/// body's repeated fields does (and a trailer overrides the head).
fn number(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    let text = headers
        .get_all(name)
        .iter()
        .next_back()?
        .to_str()
        .ok()?
        .trim();
    let whole = match text.split_once('.') {
        Some((whole, fraction))
            if !fraction.is_empty() && fraction.bytes().all(|b| b.is_ascii_digit()) =>
        {
            whole
        }
        Some(_) => return None,
        None => text,
    };
    if whole.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || (whole.len() > 1 && whole.starts_with('0'))
    {
        return None;
    }
    whole.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cost_header_is_read_as_a_json_number_is() {
        let name = HeaderName::from_static("x-tokens");
        let read = |text: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(&name, http::HeaderValue::from_static(text));
            number(&headers, &name)
        };
        assert_eq!(read("42"), Some(42));
        assert_eq!(read(" 42 "), Some(42));
        assert_eq!(read("12.9"), Some(12));
        assert_eq!(read("0"), Some(0));
        assert_eq!(read("0.5"), Some(0));
        for unknown in [
            "+12",
            "-1",
            "1e3",
            "12.",
            ".5",
            "",
            "x",
            "1 2",
            "042",
            "00",
            "1.2.3",
            "99999999999999999999",
        ] {
            assert_eq!(read(unknown), None, "{unknown:?}");
        }
        assert_eq!(number(&HeaderMap::new(), &name), None);
        let mut twice = HeaderMap::new();
        twice.append(&name, http::HeaderValue::from_static("7"));
        twice.append(&name, http::HeaderValue::from_static("42"));
        assert_eq!(number(&twice, &name), Some(42), "the last copy counts");
    }
}
