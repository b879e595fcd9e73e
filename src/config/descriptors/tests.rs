//! The reference service's README examples, read and looked up as it would.

use std::path::PathBuf;

use super::yaml::read;
use super::{DescriptorRules, RuleLimit};
use crate::limit::{Window, quota};

const MESSAGING: &str = "
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
";

const PER_IP: &str = "
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
";

const WILDCARD_AND_MORE: &str = "
domain: example
descriptors:
  - key: path
    value: /api/*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: path
    value: /api/v1
    rate_limit:
      unit: minute
      requests_per_unit: 5
  - key: ldap
    rate_limit:
      unlimited: true
  - key: service
    value: auth
    shadow_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 3
  - key: client_id
    rate_limit:
      name: client_id_limit
      unit: minute
      requests_per_unit: 10
    descriptors:
      - key: uri
        value: /foo/bar
        rate_limit:
          unit: minute
          requests_per_unit: 20
          replaces:
            - name: client_id_limit
";

fn rules(files: &[(&str, &str)]) -> DescriptorRules {
    let files: Vec<_> = (files.iter())
        .map(|(name, text)| (PathBuf::from(name), text.to_string()))
        .collect();
    read(&files).unwrap_or_else(|problems| panic!("{problems:?}"))
}

fn limit_of(rules: &DescriptorRules, domain: &str, entries: &[(&str, &str)]) -> Option<RuleLimit> {
    let id = rules.find(domain, entries.iter().copied())?;
    Some(rules.rule(id).limit)
}

#[test]
fn the_messaging_example_limits_marketing_per_number_and_every_number() {
    let rules = rules(&[("messaging.yaml", MESSAGING)]);
    let marketing = [("message_type", "marketing"), ("to_number", "2061111111")];
    let day = |n| Some(RuleLimit::Quota(quota(Window::Day, n)));
    assert_eq!(limit_of(&rules, "messaging", &marketing), day(5));
    assert_eq!(
        limit_of(&rules, "messaging", &[("to_number", "2061111111")]),
        day(100)
    );
    // message_type alone reaches a node without a rate_limit; another type none.
    assert_eq!(
        limit_of(&rules, "messaging", &[("message_type", "marketing")]),
        None
    );
    let other = [("message_type", "transactional"), ("to_number", "1")];
    assert_eq!(limit_of(&rules, "messaging", &other), None);
    assert_eq!(limit_of(&rules, "other", &[("to_number", "1")]), None);
    let rule = rules.rule(rules.find("messaging", marketing).unwrap());
    assert_eq!(rule.path, "message_type_marketing.to_number");
}

#[test]
fn an_exact_value_wins_over_the_key_alone_and_zero_refuses_everything() {
    let rules = rules(&[("ip.yaml", PER_IP)]);
    let domain = "edge_proxy_per_ip";
    assert_eq!(
        limit_of(&rules, domain, &[("remote_address", "10.0.0.1")]),
        Some(RuleLimit::Quota(quota(Window::Second, 10)))
    );
    assert_eq!(
        limit_of(&rules, domain, &[("remote_address", "50.0.0.5")]),
        Some(RuleLimit::Nothing)
    );
}

#[test]
fn wildcards_unlimited_shadow_and_replaces_are_read() {
    let rules = rules(&[("example.yaml", WILDCARD_AND_MORE)]);
    let minute = |n| Some(RuleLimit::Quota(quota(Window::Minute, n)));
    assert_eq!(
        limit_of(&rules, "example", &[("path", "/api/v2")]),
        minute(20)
    );
    assert_eq!(
        limit_of(&rules, "example", &[("path", "/api/")]),
        minute(20)
    );
    // An exact value is tried before the prefixes.
    assert_eq!(
        limit_of(&rules, "example", &[("path", "/api/v1")]),
        minute(5)
    );
    assert_eq!(limit_of(&rules, "example", &[("path", "/other")]), None);
    assert_eq!(
        limit_of(&rules, "example", &[("ldap", "x")]),
        Some(RuleLimit::Unlimited)
    );
    let auth = rules.find("example", [("service", "auth")]).unwrap();
    assert!(rules.rule(auth).shadow);
    let uri = [("client_id", "c1"), ("uri", "/foo/bar")];
    let replacing = rules.rule(rules.find("example", uri).unwrap());
    assert_eq!(replacing.replaces, vec!["client_id_limit".to_string()]);
    let client = rules.rule(rules.find("example", [("client_id", "c1")]).unwrap());
    assert_eq!(client.name.as_deref(), Some("client_id_limit"));
    // Deeper than the tree: no rule.
    let deeper = [("client_id", "c1"), ("uri", "/foo/bar"), ("x", "y")];
    assert_eq!(limit_of(&rules, "example", &deeper), None);
}

/// (file text, line, key, what the reason says)
fn problem(text: &str) -> (usize, String, String) {
    let files = [(PathBuf::from("bad.yaml"), text.to_string())];
    let problems = read(&files).expect_err("the file is refused");
    let first = &problems[0];
    assert_eq!(first.file, PathBuf::from("bad.yaml"));
    (first.line, first.key.clone(), first.reason.clone())
}

#[test]
fn a_bad_file_is_refused_with_its_line_and_reason() {
    let unknown_unit = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n";
    let (line, key, reason) = problem(unknown_unit);
    assert_eq!((line, key.as_str()), (5, "descriptors[0].rate_limit.unit"));
    assert!(reason.contains("fortnight"), "{reason}");

    let week = unknown_unit.replace("fortnight", "week");
    let (line, _, reason) = problem(&week);
    assert_eq!(line, 5);
    assert!(reason.contains("week is not supported"), "{reason}");
    let month = unknown_unit.replace("fortnight", "MONTH");
    let files = [(PathBuf::from("month.yaml"), month)];
    let rules = read(&files).expect("month is a calendar period");
    assert_eq!(
        rules.rules[0].limit,
        RuleLimit::Quota(quota(Window::Month, 1))
    );

    let typo = "domain: d\ndescriptors:\n  - key: k\n    rate_limt:\n      unit: second\n";
    let (line, _, reason) = problem(typo);
    assert_eq!(line, 4, "{reason}");
    assert!(reason.contains("rate_limt"), "{reason}");

    let duplicate = "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n";
    let (line, key, reason) = problem(duplicate);
    assert_eq!((line, key.as_str()), (5, "descriptors[1]"));
    assert!(reason.contains("duplicate"), "{reason}");

    let (line, key, _) = problem("descriptors: []\n");
    assert_eq!((line, key.as_str()), (1, "domain"));

    let (line, _, reason) = problem("domain: d\ndescriptors:\n  - key: [\n");
    assert!(line >= 3, "{line}: {reason}");

    let both = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: second\n";
    let (line, _, reason) = problem(both);
    assert_eq!(line, 5, "{reason}");
}

#[test]
fn one_domain_in_two_files_is_refused() {
    let files = [
        (PathBuf::from("a.yaml"), MESSAGING.to_string()),
        (PathBuf::from("b.yaml"), MESSAGING.to_string()),
    ];
    let problems = read(&files).expect_err("refused");
    assert_eq!(problems[0].file, PathBuf::from("b.yaml"));
    assert!(problems[0].reason.contains("a.yaml"), "{:?}", problems[0]);
}
