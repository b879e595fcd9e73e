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
fn proxy_errors_become_gateway_answers_and_client_body_refusals() {
    let (upstream, target) = (|| "shop".to_string(), || "127.0.0.1:9".to_string());
    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    let cases = [
        (
            ProxyError::Connect {
                upstream: upstream(),
                target: target(),
                source: refused,
            },
            StatusCode::BAD_GATEWAY,
            Some("127.0.0.1:9"),
        ),
        (
            ProxyError::BadResponse {
                upstream: upstream(),
                target: target(),
                reason: "more than one Content-Length",
            },
            StatusCode::BAD_GATEWAY,
            Some("127.0.0.1:9"),
        ),
        (
            ProxyError::BadUri {
                upstream: upstream(),
                target: target(),
            },
            StatusCode::BAD_GATEWAY,
            Some("127.0.0.1:9"),
        ),
        (
            ProxyError::Timeout {
                upstream: upstream(),
                target: Some(target()),
            },
            StatusCode::GATEWAY_TIMEOUT,
            Some("127.0.0.1:9"),
        ),
        (
            ProxyError::BodyTooLarge,
            StatusCode::PAYLOAD_TOO_LARGE,
            None,
        ),
        (ProxyError::BodyTooSlow, StatusCode::REQUEST_TIMEOUT, None),
        (ProxyError::BadBody, StatusCode::BAD_REQUEST, None),
    ];
    for (err, status, logged) in cases {
        let client_body = logged.is_none();
        let refusal = Refusal::from(err);
        assert_eq!(refusal.status(), status, "{refusal:?}");
        assert_eq!(refusal.target(), logged, "{refusal:?}");
        assert_eq!(refusal.closes_connection(), client_body, "{refusal:?}");
        if !client_body {
            assert_eq!(refusal.outcome(), Outcome::UpstreamError);
            assert!(
                refusal.to_string().starts_with("upstream shop "),
                "{refusal}"
            );
        }
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
