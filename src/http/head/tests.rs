use super::*;

static KEY: HeaderName = HeaderName::from_static("x-api-key");

#[test]
fn two_keys_or_two_authorizations_are_refused() {
    let host = ("host", "a");
    assert!(!refused(
        "GET",
        &[host, ("x-api-key", "k"), ("authorization", "Bearer k")]
    ));
    assert!(refused(
        "GET",
        &[host, ("x-api-key", "k"), ("x-api-key", "j")]
    ));
    assert!(refused(
        "GET",
        &[
            host,
            ("authorization", "Bearer k"),
            ("authorization", "Bearer j")
        ]
    ));
}

/// `[server]`'s defaults.
fn limits() -> SizeLimits {
    SizeLimits {
        uri_bytes: 8_192,
        header_bytes: 16_384,
        body_bytes: 10_485_760,
    }
}

fn request(method: &str, headers: &[(&str, &str)]) -> Request<()> {
    let mut builder = Request::builder().method(method).uri("/x");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(()).unwrap()
}

fn refused(method: &str, headers: &[(&str, &str)]) -> bool {
    check(&request(method, headers), limits(), &KEY).is_err()
}

#[test]
fn framing_that_two_parsers_could_read_differently_is_refused() {
    let host = ("host", "a.example");
    assert!(!refused("POST", &[host, ("transfer-encoding", "chunked")]));
    assert!(!refused(
        "POST",
        &[host, ("transfer-encoding", " Chunked ")]
    ));
    assert!(refused(
        "POST",
        &[host, ("transfer-encoding", "chunked, chunked")]
    ));
    assert!(refused(
        "POST",
        &[host, ("transfer-encoding", "gzip, chunked")]
    ));
    assert!(refused("POST", &[host, ("transfer-encoding", "gzip")]));
    assert!(refused(
        "POST",
        &[
            host,
            ("transfer-encoding", "chunked"),
            ("transfer-encoding", "chunked")
        ]
    ));
    assert!(refused(
        "POST",
        &[
            host,
            ("transfer-encoding", "chunked"),
            ("content-length", "3")
        ]
    ));
    assert!(refused(
        "POST",
        &[host, ("content-length", "3"), ("content-length", "3")]
    ));
    assert!(!refused("POST", &[host, ("content-length", "3")]));
}

#[test]
fn host_must_be_one_host_name() {
    assert!(!refused("GET", &[("host", "a.example:8080")]));
    assert!(!refused("GET", &[("host", "[::1]:80")]));
    assert!(refused("GET", &[]));
    assert!(refused(
        "GET",
        &[("host", "a.example"), ("host", "b.example")]
    ));
    for good in [
        "a",
        "a.example",
        "a_b.example:1",
        "[::1]",
        "[::ffff:1.2.3.4]:443",
        "a:",
    ] {
        assert!(!refused("GET", &[("host", good)]), "{good:?}");
    }
    let bad_hosts = [
        "tight.example%2e",
        "a b",
        "a@b",
        "",
        "a/b",
        "a\tb",
        "tight.example:abc",
        "tight.example:+80",
        "a:1:2",
        "a,b.example",
        "[::1",
        "[]",
        "[::1]x",
        "a:123456",
        ":80",
    ];
    for bad in bad_hosts {
        let Ok(value) = http::HeaderValue::from_str(bad) else {
            continue;
        };
        let mut req = request("GET", &[]);
        req.headers_mut().insert(HOST, value);
        assert!(check(&req, limits(), &KEY).is_err(), "{bad:?}");
    }
}

#[test]
fn a_target_authority_follows_the_host_rule() {
    let with = |target: &str| {
        let req = Request::builder()
            .uri(target)
            .header("host", "tight.example")
            .body(())
            .unwrap();
        check(&req, limits(), &KEY).is_err()
    };
    assert!(!with("http://tight.example/q"));
    assert!(!with("http://tight.example:8080/q"));
    for bad in [
        "http://x@tight.example/q",
        "http://tight.example:80@x/q",
        "http://tight.example:abc/q",
    ] {
        assert!(with(bad), "{bad}");
    }
}

#[test]
fn standard_methods_in_another_case_are_refused_and_extensions_pass() {
    for bad in ["post", "Get", "dElEtE", "patch"] {
        assert!(refused(bad, &[("host", "a")]), "{bad}");
    }
    for good in ["POST", "GET", "PURGE", "PROPFIND", "purge"] {
        assert!(!refused(good, &[("host", "a")]), "{good}");
    }
}

#[test]
fn http2_values_are_not_trimmed_for_the_upstream_and_a_path_is_a_path() {
    let http2 = |uri: &str, value: &str| {
        let request = Request::builder()
            .version(Version::HTTP_2)
            .uri(uri)
            .header("x-tenant", value)
            .body(())
            .unwrap();
        check(&request, limits(), &KEY).is_err()
    };
    assert!(!http2("http://a.example/x", "acme"));
    assert!(!http2("http://a.example/x", "ac me"));
    for spaced in [" acme", "acme ", "\tacme", "acme\t", " "] {
        assert!(http2("http://a.example/x", spaced), "{spaced:?}");
    }
    assert!(http2("http://a.example?a=b", "acme"));
    assert!(!http2("http://a.example/?a=b", "acme"));
    // HTTP/1's parser has already trimmed what it was sent.
    assert!(!refused("GET", &[("host", "a"), ("x-tenant", " acme")]));
}

#[test]
fn sizes_are_honoured_exactly() {
    let mut small = limits();
    small.header_bytes = 1024;
    small.uri_bytes = 100;
    small.body_bytes = 10;
    let big = "v".repeat(1000);
    let req = request("GET", &[("host", "a"), ("x-big", &big)]);
    assert!(matches!(
        check(&req, small, &KEY),
        Err(Refusal::TooLarge(Oversize::Headers))
    ));
    let req = request("POST", &[("host", "a"), ("content-length", "11")]);
    assert!(matches!(
        check(&req, small, &KEY),
        Err(Refusal::TooLarge(Oversize::Body))
    ));
    let req = request("POST", &[("host", "a"), ("content-length", "10")]);
    assert!(check(&req, small, &KEY).is_ok());
    let long = Request::get(format!("/{}", "a".repeat(100)))
        .header("host", "a")
        .body(())
        .unwrap();
    assert!(matches!(
        check(&long, small, &KEY),
        Err(Refusal::TooLarge(Oversize::Uri))
    ));
}
