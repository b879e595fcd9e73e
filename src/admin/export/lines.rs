//! The usage export's lines: one JSON object per caller (`jsonl`), or one CSV row
//! per caller and window (`csv`, after a header row).

use serde::Serialize;

/// How a page is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Format {
    Jsonl,
    Csv,
}

/// One caller's usage.
#[derive(Debug, Serialize)]
pub(super) struct Row<'a> {
    pub caller: String,
    /// A keyed bucket's parts, in the policy's order, decoded.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "in_order")]
    pub key: Option<Vec<(String, String)>>,
    pub plan: String,
    #[serde(rename = "limits")]
    pub windows: &'a [Window],
}

/// One window of a caller's.
#[derive(Debug, Serialize)]
pub(super) struct Window {
    pub window: &'static str,
    pub used: u32,
    pub limit: u32,
    /// Seconds since the epoch; written as RFC 3339.
    #[serde(serialize_with = "rfc3339")]
    pub resets_at: u64,
    pub reset_after: u64,
}

/// A bucket's parts as a JSON object, in order.
fn in_order<S: serde::Serializer>(
    parts: &Option<Vec<(String, String)>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let parts = parts.as_deref().unwrap_or_default();
    let mut map = serializer.serialize_map(Some(parts.len()))?;
    for (name, value) in parts {
        map.serialize_entry(name, value)?;
    }
    map.end()
}

fn rfc3339<S: serde::Serializer>(secs: &u64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&timestamp(*secs))
}

/// `secs` since the epoch as RFC 3339 in UTC (`2026-03-01T00:00:00Z`).
fn timestamp(secs: u64) -> String {
    let secs = i64::try_from(secs).unwrap_or(i64::MAX);
    jiff::Timestamp::from_second(secs)
        .unwrap_or(jiff::Timestamp::MAX)
        .to_string()
}

impl Format {
    pub(super) fn mime(self) -> &'static str {
        match self {
            Format::Jsonl => "application/jsonl",
            Format::Csv => "text/csv; charset=utf-8",
        }
    }

    /// What a page starts with.
    pub(super) fn head(self) -> &'static str {
        match self {
            Format::Jsonl => "",
            Format::Csv => "caller,plan,window,used,limit,resets_at,reset_after\n",
        }
    }

    /// Appends `row`'s line (lines) to `text`.
    pub(super) fn write(self, row: &Row<'_>, text: &mut String) {
        match self {
            Format::Jsonl => {
                text.push_str(&serde_json::to_string(row).unwrap_or_default());
                text.push('\n');
            }
            Format::Csv => {
                for w in row.windows {
                    let line = format!(
                        "{},{},{},{},{},{},{}\n",
                        field(&row.caller),
                        field(&row.plan),
                        w.window,
                        w.used,
                        w.limit,
                        timestamp(w.resets_at),
                        w.reset_after
                    );
                    text.push_str(&line);
                }
            }
        }
    }

    /// Appends the line that says the page was cut short by `why`.
    pub(super) fn error(self, why: &str, text: &mut String) {
        match self {
            Format::Jsonl => {
                let line = serde_json::json!({"error": why});
                text.push_str(&line.to_string());
            }
            Format::Csv => {
                text.push_str("#error,");
                text.push_str(&field(why));
            }
        }
        text.push('\n');
    }
}

/// A CSV field, quoted when it holds a comma, a quote or a line break.
fn field(value: &str) -> String {
    match value.contains([',', '"', '\n', '\r']) {
        true => format!("\"{}\"", value.replace('"', "\"\"")),
        false => value.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> Row<'static> {
        Row {
            caller: "consumer:a,b".to_string(),
            key: None,
            plan: "pro".to_string(),
            windows: &[Window {
                window: "month",
                used: 3,
                limit: 10,
                resets_at: 1_772_319_600,
                reset_after: 86_410,
            }],
        }
    }

    #[test]
    fn a_row_as_a_json_line_and_as_csv() {
        let mut text = String::new();
        Format::Jsonl.write(&row(), &mut text);
        assert_eq!(
            text,
            "{\"caller\":\"consumer:a,b\",\"plan\":\"pro\",\"limits\":[{\"window\":\"month\",\"used\":3,\"limit\":10,\"resets_at\":\"2026-02-28T23:00:00Z\",\"reset_after\":86410}]}\n"
        );
        let mut text = String::new();
        Format::Csv.write(&row(), &mut text);
        assert_eq!(
            text,
            "\"consumer:a,b\",pro,month,3,10,2026-02-28T23:00:00Z,86410\n"
        );
    }

    #[test]
    fn a_keyed_bucket_shows_its_parts_as_a_key_object_and_a_quoted_csv_caller() {
        let keyed = Row {
            caller: "header:x-org=acme, inc&header:x-team=\"blue\"".to_string(),
            key: Some(vec![
                ("header:x-org".into(), "acme, inc".into()),
                ("header:x-team".into(), "\"blue\"".into()),
            ]),
            ..row()
        };
        let mut text = String::new();
        Format::Jsonl.write(&keyed, &mut text);
        let line: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            line["key"],
            serde_json::json!({"header:x-org": "acme, inc", "header:x-team": "\"blue\""})
        );
        assert!(text.find("\"key\"") < text.find("\"plan\""), "{text}");
        let mut text = String::new();
        Format::Csv.write(&keyed, &mut text);
        assert_eq!(
            text,
            "\"header:x-org=acme, inc&header:x-team=\"\"blue\"\"\",pro,month,3,10,2026-02-28T23:00:00Z,86410\n"
        );
    }
}
