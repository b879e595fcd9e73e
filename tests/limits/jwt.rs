//! End-to-end JWT bearer tokens: signed in the test with keys generated in the test
//! (RSA, RSA-PSS, P-256, Ed25519, HMAC), verified by the gateway against key files
//! and a secret; every way a token can be wrong is a 401 with
//! `WWW-Authenticate: Bearer error="invalid_token"`, and a strike toward a ban.

use crate::support;

use std::path::Path;
use std::process::Command;

use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::json;
use support::{Live, Req, Resp, live_at, t0};

const SECRET: &str = "an-hmac-secret-of-at-least-32-bytes!";

/// Private (PKCS#8 PEM) and public key files `NAME.key` and `NAME.pem` in `dir`.
fn openssl_key(dir: &Path, name: &str, args: &[&str]) -> Vec<u8> {
    let key = dir.join(format!("{name}.key"));
    let status = Command::new("openssl")
        .args(["genpkey", "-out"])
        .arg(&key)
        .args(args)
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let public = Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&key)
        .arg("-out")
        .arg(dir.join(format!("{name}.pem")))
        .output()
        .unwrap();
    assert!(public.status.success());
    std::fs::read(key).unwrap()
}

struct Keys {
    rsa: EncodingKey,
    ec: EncodingKey,
    ed: EncodingKey,
    hs: EncodingKey,
    /// The RSA public key's PEM, which an algorithm-confusion attack signs HS with.
    rsa_public: Vec<u8>,
}

fn keys(dir: &Path) -> Keys {
    let rsa = openssl_key(
        dir,
        "rsa",
        &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
    );
    let ec = openssl_key(
        dir,
        "ec",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    );
    let ed = openssl_key(dir, "ed", &["-algorithm", "ED25519"]);
    Keys {
        rsa: EncodingKey::from_rsa_pem(&rsa).unwrap(),
        ec: EncodingKey::from_ec_pem(&ec).unwrap(),
        ed: EncodingKey::from_ed_pem(&ed).unwrap(),
        hs: EncodingKey::from_secret(SECRET.as_bytes()),
        rsa_public: std::fs::read(dir.join("rsa.pem")).unwrap(),
    }
}

fn config(extra: &str) -> String {
    format!(
        r#"
        [identity.jwt]
        keys = ["rsa.pem", "ec.pem", "ed.pem"]
        secret = "{SECRET}"
        issuer = "https://idp.test/"
        audience = ["orders-api"]
        plan_claim = "tier"
        leeway = "30s"
        {extra}
        [ban]
        after = 5
        within = "1m"
        [policies.p]
        anonymous = {{ per_minute = 1 }}
        registered = {{ per_minute = 2 }}
        gold = {{ per_minute = 4 }}
        [policies.org]
        anonymous = {{ per_minute = 1 }}
        registered = {{ per_minute = 3 }}
        gold = {{ per_minute = 3 }}
        key = ["claim:org_id"]
        [[consumers]]
        name = "listed"
        key = "demo-key-listed"
        plan = "gold"
        [[routes]]
        name = "org"
        path_prefix = "/org"
        respond = {{ status = 200, body = "ok" }}
        policy = "org"
        [[routes]]
        name = "api"
        path_prefix = "/"
        respond = {{ status = 200, body = "ok" }}
        policy = "p"
        "#
    )
}

async fn start(extra: &str) -> (Live, Keys) {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys(dir.path());
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config(extra)).unwrap();
    (live_at(dir, path).await, keys)
}

/// The gateway's clock, in seconds.
fn now() -> u64 {
    t0() / 1_000
}

fn claims(sub: &str) -> serde_json::Value {
    json!({"sub": sub, "iss": "https://idp.test/", "aud": "orders-api", "exp": now() + 3_600})
}

fn token(alg: Algorithm, key: &EncodingKey, claims: &serde_json::Value) -> String {
    encode(&Header::new(alg), claims, key).unwrap()
}

async fn get(gw: &Live, path: &str, token: &str) -> Resp {
    Req::get(path)
        .header("authorization", &format!("Bearer {token}"))
        .send(gw.addr)
        .await
}

/// As [`get`], from a loopback address of its own: strikes are per address.
async fn get_from(gw: &Live, n: usize, token: &str) -> Resp {
    Req::get("/x")
        .header("authorization", &format!("Bearer {token}"))
        .from(&format!("127.0.3.{}", n + 1))
        .send(gw.addr)
        .await
}

async fn admitted(gw: &Live, path: &str, token: &str) -> usize {
    for n in 0..10 {
        let resp = get(gw, path, token).await;
        match resp.status.as_u16() {
            200 => continue,
            429 => return n,
            other => panic!("status {other}: {}", resp.text()),
        }
    }
    10
}

#[track_caller]
fn assert_invalid_token(resp: &Resp) {
    resp.problem(401);
    assert_eq!(
        resp.header("www-authenticate"),
        Some("Bearer error=\"invalid_token\""),
        "{}",
        resp.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_every_algorithm_name_their_caller_and_plan() {
    let (gw, k) = start("").await;
    let signed = [
        (Algorithm::RS256, &k.rsa, "rs"),
        (Algorithm::PS256, &k.rsa, "ps"),
        (Algorithm::ES256, &k.ec, "es"),
        (Algorithm::EdDSA, &k.ed, "ed"),
        (Algorithm::HS256, &k.hs, "hs"),
    ];
    for (alg, key, sub) in signed {
        // No plan claim: the default plan, 2 a minute, a budget per subject.
        assert_eq!(
            admitted(&gw, "/x", &token(alg, key, &claims(sub))).await,
            2,
            "{alg:?}"
        );
    }
    // A plan claim naming a plan: its budget; one naming no plan: the default.
    let mut gold = claims("g");
    gold["tier"] = json!("gold");
    assert_eq!(
        admitted(&gw, "/x", &token(Algorithm::ES256, &k.ec, &gold)).await,
        4
    );
    let mut bogus = claims("b");
    bogus["tier"] = json!("platinum");
    assert_eq!(
        admitted(&gw, "/x", &token(Algorithm::ES256, &k.ec, &bogus)).await,
        2
    );
    // A subject that is a listed consumer is that consumer: its plan and budget,
    // shared with its API key.
    let listed = token(Algorithm::RS256, &k.rsa, &claims("listed"));
    assert_eq!(admitted(&gw, "/x", &listed).await, 4);
    let key = Req::get("/x")
        .header("x-api-key", "demo-key-listed")
        .send(gw.addr)
        .await;
    key.problem(429);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_are_401_invalid_token() {
    let (gw, k) = start("").await;
    let good = claims("mallory");
    // alg none, hand-made.
    let none = format!(
        "{}.{}.",
        b64(br#"{"alg":"none","typ":"JWT"}"#),
        b64(good.to_string().as_bytes())
    );
    assert_invalid_token(&get_from(&gw, 0, &none).await);
    // Algorithm confusion: HS256 signed with the RSA public key.
    let confused = token(
        Algorithm::HS256,
        &EncodingKey::from_secret(&k.rsa_public),
        &good,
    );
    assert_invalid_token(&get_from(&gw, 1, &confused).await);
    // Signed by a key the gateway does not know.
    let stranger = EncodingKey::from_secret(b"another-secret-of-at-least-32-bytes");
    assert_invalid_token(&get_from(&gw, 2, &token(Algorithm::HS256, &stranger, &good)).await);
    let mut wrong = Vec::new();
    for (claim, value) in [
        ("exp", json!(now() - 31)),
        ("nbf", json!(now() + 31)),
        ("aud", json!("other-api")),
        ("iss", json!("https://evil.test/")),
        ("sub", json!(42)),
        ("exp", json!("tomorrow")),
        // iss and aud of another type than configured: not passed over.
        ("iss", json!(null)),
        ("iss", json!(5)),
        ("aud", json!(null)),
        ("aud", json!(5)),
        ("aud", json!({"a": "orders-api"})),
        ("aud", json!([5])),
        ("aud", json!(["evil", 5])),
        ("aud", json!(["orders-api", 5])),
    ] {
        let mut claims = good.clone();
        claims[claim] = value;
        wrong.push((claim, claims));
    }
    for claim in ["exp", "iss", "aud"] {
        let mut without = good.clone();
        without.as_object_mut().unwrap().remove(claim);
        wrong.push((claim, without));
    }
    for (n, (what, claims)) in wrong.iter().enumerate() {
        let resp = get_from(&gw, 3 + n, &token(Algorithm::RS256, &k.rsa, claims)).await;
        assert_invalid_token(&resp);
        assert!(resp.text().contains("token"), "{what}: {}", resp.text());
    }
    // An audience array holding the configured one (and only strings) is accepted.
    let mut listed = good.clone();
    listed["aud"] = json!(["other-api", "orders-api"]);
    let resp = get_from(&gw, 60, &token(Algorithm::RS256, &k.rsa, &listed)).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    // A critical header extension sluice does not know (RFC 7515 section 4.1.11).
    let mut header = Header::new(Algorithm::RS256);
    header.crit = Some(vec!["x-bogus".to_string()]);
    let crit = encode(&header, &good, &k.rsa).unwrap();
    assert_invalid_token(&get_from(&gw, 61, &crit).await);
    gw.stop().await;
}

/// A JWK that names its `alg` verifies that algorithm only (RFC 7517 section 4.4):
/// the same RSA key does not verify RS384 or PS256 tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwk_with_an_alg_verifies_only_that_algorithm() {
    let dir = tempfile::tempdir().unwrap();
    let k = keys(dir.path());
    let jwk = jsonwebtoken::jwk::Jwk::from_encoding_key(&k.rsa, Algorithm::RS256).unwrap();
    let mut jwk = serde_json::to_value(jwk).unwrap();
    jwk["kid"] = json!("k1");
    let set = json!({ "keys": [jwk] }).to_string();
    std::fs::write(dir.path().join("rsa.jwk"), set).unwrap();
    let path = dir.path().join("gateway.toml");
    let config = r#"
        [identity.jwt]
        keys = ["rsa.jwk"]
        [policies.p]
        anonymous = { per_minute = 100 }
        registered = { per_minute = 100 }
        [[routes]]
        name = "api"
        path_prefix = "/"
        respond = { status = 200, body = "ok" }
        policy = "p"
    "#;
    std::fs::write(&path, config).unwrap();
    let gw = live_at(dir, path).await;
    let claims = json!({"sub": "alice", "exp": now() + 3_600});
    let resp = get_from(&gw, 0, &token(Algorithm::RS256, &k.rsa, &claims)).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    for (n, alg) in [Algorithm::RS384, Algorithm::PS256].into_iter().enumerate() {
        assert_invalid_token(&get_from(&gw, 1 + n, &token(alg, &k.rsa, &claims)).await);
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leeway_cache_expiry_size_and_duplicate_credentials() {
    let (gw, k) = start("").await;
    // Expired 10 s ago: within the 30 s leeway.
    let mut late = claims("late");
    late["exp"] = json!(now() - 10);
    assert_eq!(
        get(&gw, "/x", &token(Algorithm::ES256, &k.ec, &late))
            .await
            .status,
        200
    );
    // NumericDates with a fraction (RFC 7519 section 2) are read to the second,
    // the strict way: exp rounded down, nbf up; one before 1970 is 1970.
    let t = now() as f64;
    for (i, (exp, nbf, status)) in [
        (t + 60.5, None, 200),
        (t - 40.5, None, 401),
        (t + 60.5, Some(t - 0.25), 200),
        (t + 60.5, Some(t + 40.5), 401),
        (t + 60.5, Some(-1.5), 200),
        (-5.0, None, 401),
        (1e300, None, 200),
    ]
    .into_iter()
    .enumerate()
    {
        let mut fractional = claims(&format!("fractional-{i}"));
        fractional["exp"] = json!(exp);
        if let Some(nbf) = nbf {
            fractional["nbf"] = json!(nbf);
        }
        let resp = get(&gw, "/x", &token(Algorithm::HS256, &k.hs, &fractional)).await;
        assert_eq!(resp.status, status, "exp {exp} nbf {nbf:?}");
    }
    // A token verified (and cached) while valid is refused once it expires.
    let mut short = claims("short");
    short["exp"] = json!(now() + 60);
    let short = token(Algorithm::EdDSA, &k.ed, &short);
    assert_eq!(get(&gw, "/x", &short).await.status, 200);
    gw.advance_secs(120);
    assert_invalid_token(&get(&gw, "/x", &short).await);
    // A 10 KiB token is refused unread.
    let mut big = claims("big");
    big["padding"] = json!("x".repeat(10_000));
    assert_invalid_token(&get(&gw, "/x", &token(Algorithm::HS256, &k.hs, &big)).await);
    // A token and an API key: 400, as two keys are.
    let both = Req::get("/x")
        .header(
            "authorization",
            &format!("Bearer {}", token(Algorithm::HS256, &k.hs, &claims("x"))),
        )
        .header("x-api-key", "demo-key-listed")
        .send(gw.addr)
        .await;
    both.problem(400);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_listed_algorithms_are_accepted() {
    let (gw, k) = start("algorithms = [\"RS256\", \"EdDSA\"]").await;
    let c = claims("a");
    assert_eq!(
        get(&gw, "/x", &token(Algorithm::RS256, &k.rsa, &c))
            .await
            .status,
        200
    );
    assert_invalid_token(&get(&gw, "/x", &token(Algorithm::PS256, &k.rsa, &c)).await);
    assert_invalid_token(&get(&gw, "/x", &token(Algorithm::HS256, &k.hs, &c)).await);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_are_strikes_toward_a_ban() {
    let (gw, k) = start("").await;
    let stranger = EncodingKey::from_secret(b"another-secret-of-at-least-32-bytes");
    for i in 0..5 {
        let forged = token(Algorithm::HS256, &stranger, &claims(&format!("s{i}")));
        assert_invalid_token(&get(&gw, "/x", &forged).await);
    }
    // Banned: even a good token from this address is refused.
    let good = token(Algorithm::HS256, &k.hs, &claims("ok"));
    get(&gw, "/x", &good).await.problem(403);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_keyed_policy_gives_an_organisation_one_budget() {
    let (gw, k) = start("").await;
    let member = |sub: &str, org: serde_json::Value| {
        let mut c = claims(sub);
        c["org_id"] = org;
        token(Algorithm::ES256, &k.ec, &c)
    };
    // Three members of org 7 share its 3 a minute.
    assert_eq!(admitted(&gw, "/org", &member("m1", json!(7))).await, 3);
    get(&gw, "/org", &member("m2", json!(7))).await.problem(429);
    assert_eq!(
        get(&gw, "/org", &member("m3", json!("other"))).await.status,
        200
    );
    gw.stop().await;
}

fn b64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().fold(0u32, |n, &b| n << 8 | u32::from(b)) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

#[test]
fn jwt_settings_are_checked() {
    let parse = |jwt: &str| {
        let text = format!(
            "[identity.jwt]\n{jwt}\n[policies.p]\nanonymous = {{ per_minute = 1 }}\nregistered = {{ per_minute = 1 }}\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nrespond = {{ status = 200 }}\npolicy = \"p\"\n"
        );
        match sluice::config::Config::parse(Path::new("gateway.toml"), &text) {
            Ok(_) => String::new(),
            Err(err) => err.to_string(),
        }
    };
    assert_eq!(parse(&format!("secret = \"{SECRET}\"")), "");
    let err = parse("secret = \"short\"");
    assert!(
        err.contains("identity.jwt.secret") && err.contains("32 bytes"),
        "{err}"
    );
    let err = parse("jwks_url = \"http://idp.test/jwks\"");
    assert!(
        err.contains("identity.jwt.jwks_url") && err.contains("https"),
        "{err}"
    );
    let err = parse("jwks_url = \"https://idp.test/jwks\"\nrefresh = \"5s\"");
    assert!(err.contains("identity.jwt.refresh"), "{err}");
    assert_eq!(parse("jwks_url = \"https://idp.test/jwks\""), "");
    let err = parse("keys = [\"missing.pem\"]");
    assert!(
        err.contains("identity.jwt.keys") && err.contains("missing.pem"),
        "{err}"
    );
    let err = parse(&format!("secret = \"{SECRET}\"\nalgorithms = [\"none\"]"));
    assert!(err.contains("identity.jwt.algorithms"), "{err}");
    let err = parse("");
    assert!(err.contains("needs jwks_url, keys"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_file_is_read_again() {
    let (gw, k) = start("").await;
    let dir = gw.path.parent().unwrap().to_path_buf();
    let old = token(Algorithm::ES256, &k.ec, &claims("r"));
    assert_eq!(get(&gw, "/x", &old).await.status, 200);
    // A new P-256 key replaces ec.pem (written aside, renamed over it).
    let fresh = tempfile::tempdir().unwrap();
    let new_key = EncodingKey::from_ec_pem(&openssl_key(
        fresh.path(),
        "ec",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    ))
    .unwrap();
    std::fs::copy(fresh.path().join("ec.pem"), dir.join("ec.pem.new")).unwrap();
    std::fs::rename(dir.join("ec.pem.new"), dir.join("ec.pem")).unwrap();
    let new = token(Algorithm::ES256, &new_key, &claims("r2"));
    // Each try from an address of its own: a refused token is a strike.
    let started = std::time::Instant::now();
    let mut n = 0;
    while get_from(&gw, n, &new).await.status != 200 {
        assert!(
            started.elapsed().as_secs() < 10,
            "the new key was never read"
        );
        n += 1;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The old key is gone (its verified token was cached by the old config only).
    assert_invalid_token(&get(&gw, "/x", &old).await);
    gw.stop().await;
}

/// A gateway forwarding to `up`, HS256 tokens, `forward` as given, and one listed
/// consumer (`listed`, key `demo-key-listed`), disabled or not.
fn forwarding(up: &support::Upstream, forward: bool, disabled: bool) -> String {
    support::Toml::new()
        .raw(&format!(
            "[identity.jwt]\nsecret = \"{SECRET}\"\nforward = {forward}\n\
             [[consumers]]\nname = \"listed\"\nkey = \"demo-key-listed\"\ndisabled = {disabled}"
        ))
        .upstream("up", &[up.url()])
        .policy(
            "p",
            &[
                ("anonymous", "{ per_minute = 100 }"),
                ("registered", "{ per_minute = 100 }"),
            ],
        )
        .route(support::route("api", "/").upstream("up").policy("p"))
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_token_goes_upstream_only_when_forward_is_set() {
    let up = support::upstream().await;
    let hs = EncodingKey::from_secret(SECRET.as_bytes());
    let bearer = format!("Bearer {}", token(Algorithm::HS256, &hs, &claims("alice")));
    for forward in [false, true] {
        let gw = support::gateway(&forwarding(&up, forward, false)).await;
        // Twice: the first verifies the token, the second finds it cached.
        for _ in 0..2 {
            let resp = Req::get("/x")
                .header("authorization", &bearer)
                .send(gw.addr)
                .await;
            assert_eq!(resp.status, 200, "{}", resp.text());
            let seen = up.last();
            let expected = forward.then_some(bearer.as_str());
            assert_eq!(
                seen.header("authorization"),
                expected,
                "forward = {forward}"
            );
        }
        // An API key in Authorization is removed either way.
        let resp = Req::get("/x")
            .header("authorization", "Bearer demo-key-listed")
            .send(gw.addr)
            .await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(
            up.last().header("authorization"),
            None,
            "forward = {forward}"
        );
        gw.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_disables_a_consumer_refuses_its_cached_token() {
    let up = support::upstream().await;
    let hs = EncodingKey::from_secret(SECRET.as_bytes());
    let listed = token(Algorithm::HS256, &hs, &claims("listed"));
    let other = token(Algorithm::HS256, &hs, &claims("someone-else"));
    let gw = support::gateway(&forwarding(&up, false, false)).await;
    for _ in 0..3 {
        for t in [&listed, &other] {
            let resp = Req::get("/x")
                .header("authorization", &format!("Bearer {t}"))
                .send(gw.addr)
                .await;
            assert_eq!(resp.status, 200, "{}", resp.text());
        }
    }
    let disabled = forwarding(&up, false, true);
    gw.install(sluice::config::Config::parse(Path::new("test.toml"), &disabled).unwrap());
    let seen = up.count();
    // Every request from now on, on any worker thread, refuses the listed consumer's
    // token and still admits the other caller's.
    for _ in 0..4 {
        let refused = Req::get("/x")
            .header("authorization", &format!("Bearer {listed}"))
            .send(gw.addr)
            .await;
        assert_invalid_token(&refused);
        let admitted = Req::get("/x")
            .header("authorization", &format!("Bearer {other}"))
            .send(gw.addr)
            .await;
        assert_eq!(admitted.status, 200, "{}", admitted.text());
    }
    assert_eq!(
        up.count(),
        seen + 4,
        "only the other caller's requests went upstream"
    );
    gw.stop().await;
}
