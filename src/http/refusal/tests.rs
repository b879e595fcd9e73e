use super::*;

fn problem<'a>(detail: &str, violated: &'a [&'static str]) -> Problem<'a> {
    Problem {
        kind: QUOTA_EXCEEDED,
        title: "Too Many Requests",
        status: 429,
        detail: detail.to_string(),
        violated,
    }
}

#[test]
fn a_repeated_refusal_shares_its_rendered_body() {
    let first = problem_body(&problem("per_minute limit of 1", &["minute"]));
    let again = problem_body(&problem("per_minute limit of 1", &["minute"]));
    assert_eq!(first.as_ptr(), again.as_ptr());
    let expected = problem("per_minute limit of 1", &["minute"]);
    assert_eq!(first, serde_json::to_vec(&expected).unwrap());
}

#[test]
fn a_different_refusal_is_rendered_afresh() {
    let minute = problem_body(&problem("per_minute limit of 1", &["minute"]));
    for (detail, violated) in [
        ("per_minute limit of 1", &["minute", "day"][..]),
        ("per_minute limit of 2", &["minute"][..]),
        ("per_minute limit of 1", &[][..]),
    ] {
        let body = problem_body(&problem(detail, violated));
        assert_ne!(body, minute);
        assert_eq!(
            body,
            serde_json::to_vec(&problem(detail, violated)).unwrap()
        );
    }
    let other = problem_body(&Problem {
        status: 503,
        ..problem("per_minute limit of 1", &["minute"])
    });
    assert!(
        std::str::from_utf8(&other)
            .unwrap()
            .contains("\"status\":503")
    );
}
