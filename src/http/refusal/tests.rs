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

/// The headers of a 429, inserted one by one into a new map.
fn headers_one_by_one(retry_after: u64, policy: &HeaderValue, state: &HeaderValue) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    h.insert(
        http::header::RETRY_AFTER,
        rate_headers::seconds_header(retry_after),
    );
    h.insert(&rate_headers::POLICY_HEADER, policy.clone());
    h.insert(&rate_headers::STATE_HEADER, state.clone());
    h
}

fn limited(retry_ms: u64, policy: &HeaderValue) -> Refusal {
    let mut report = crate::limit::Report::default();
    report.push(crate::limit::LimitStatus {
        quota: crate::limit::quota(crate::limit::Window::Minute, 1),
        total: false,
        used: 1,
        reset_ms: 60_000,
        retry_ms: Some(retry_ms),
    });
    Refusal::Limited {
        detail: "per_minute limit of 1 for plan anonymous on route api".to_string(),
        report: Box::new(report),
        policy_header: Some(policy.clone()),
    }
}

#[test]
fn repeated_429s_carry_their_own_headers_in_order() {
    let policy = HeaderValue::from_static("\"minute\";q=1;w=60");
    for (retry_ms, secs) in [(41_500, 42), (41_200, 42), (40_500, 41), (41_500, 42)] {
        let response = limited(retry_ms, &policy).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        let state = HeaderValue::from_str(&format!("\"minute\";r=0;t={secs}")).unwrap();
        let expected = headers_one_by_one(secs, &policy, &state);
        let got: Vec<_> = response.headers().iter().collect();
        assert_eq!(got, expected.iter().collect::<Vec<_>>());
    }
    let other = HeaderValue::from_static("\"minute\";q=2;w=60");
    let response = limited(41_500, &other).into_response();
    assert_eq!(response.headers()["ratelimit-policy"], other);
    let banned = Refusal::Banned {
        until_ms: 1_000,
        now_ms: 0,
    }
    .into_response();
    let names: Vec<_> = banned.headers().keys().map(|k| k.as_str()).collect();
    assert_eq!(names, ["content-type", "retry-after"]);
    assert_eq!(banned.headers()["retry-after"], "1");
}
