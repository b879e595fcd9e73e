//! End-to-end JWKS URL: the gateway fetches the identity provider's key set from a
//! real https server started by the test (its certificate from a CA made in the
//! test), picks up a rotated key when a token names an unknown `kid` (never
//! fetching more than once per 30 s, however many `kid`s are sprayed), keeps the last
//! good set when the provider goes away, shows its state in `/readyz` and
//! `sluice_jwks_refreshes_total`, and revokes every token a key verified from the
//! fetch that finds the key gone from the set.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper_util::rt::TokioIo;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use serde_json::json;
use support::{Live, Req, Resp, live_at, metric, t0};

/// An RSA key made with openssl: its signing key and its public JWK.
pub(super) fn rsa_key(dir: &Path, kid: &str) -> (EncodingKey, serde_json::Value) {
    let key = dir.join(format!("{kid}.key"));
    let made = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&key)
        .output()
        .unwrap();
    assert!(made.status.success());
    let modulus = Command::new("openssl")
        .args(["rsa", "-noout", "-modulus", "-in"])
        .arg(&key)
        .output()
        .unwrap();
    let text = String::from_utf8(modulus.stdout).unwrap();
    let hex_n = text.trim().strip_prefix("Modulus=").unwrap();
    let n = b64(&const_hex::decode(hex_n).unwrap());
    let jwk = json!({"kty": "RSA", "kid": kid, "alg": "RS256", "use": "sig", "n": n, "e": "AQAB"});
    (
        EncodingKey::from_rsa_pem(&std::fs::read(key).unwrap()).unwrap(),
        jwk,
    )
}

/// An https server on 127.0.0.1 answering GET with the current key set; counts
/// requests. Its CA is written to `dir/ca.pem`.
struct Provider {
    port: u16,
    set: Arc<Mutex<serde_json::Value>>,
    fetches: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

async fn provider(dir: &Path, keys: Vec<serde_json::Value>) -> Provider {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let private = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], private)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let set = Arc::new(Mutex::new(json!({"keys": keys})));
    let fetches = Arc::new(AtomicUsize::new(0));
    let (served, counted) = (set.clone(), fetches.clone());
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, served, counted) = (acceptor.clone(), served.clone(), counted.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service =
                    hyper::service::service_fn(move |_: http::Request<hyper::body::Incoming>| {
                        counted.fetch_add(1, Ordering::SeqCst);
                        let body = served.lock().unwrap().to_string();
                        async move {
                            Ok::<_, std::convert::Infallible>(http::Response::new(
                                http_body_util::Full::new(Bytes::from(body)),
                            ))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Provider {
        port,
        set,
        fetches,
        task,
    }
}

async fn start(dir: tempfile::TempDir, port: u16) -> Live {
    start_refreshing(dir, port, "10m").await
}

async fn start_refreshing(dir: tempfile::TempDir, port: u16, refresh: &str) -> Live {
    let config = format!(
        r#"
        [identity.jwt]
        jwks_url = "https://127.0.0.1:{port}/.well-known/jwks.json"
        ca_file = "ca.pem"
        refresh = "{refresh}"
        [policies.p]
        anonymous = {{ per_minute = 1 }}
        registered = {{ per_minute = 1000 }}
        [[routes]]
        name = "api"
        path_prefix = "/"
        respond = {{ status = 200, body = "ok" }}
        policy = "p"
        "#
    );
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config).unwrap();
    live_at(dir, path).await
}

fn token(kid: &str, key: &EncodingKey) -> String {
    token_for(&format!("user-{kid}"), kid, key)
}

fn token_for(sub: &str, kid: &str, key: &EncodingKey) -> String {
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some(kid.to_string());
    let claims = json!({"sub": sub, "exp": t0() / 1_000 + 3_600});
    encode(&header, &claims, key).unwrap()
}

async fn get(gw: &Live, token: &str, from: usize) -> Resp {
    Req::get("/x")
        .header("authorization", &format!("Bearer {token}"))
        .from(&format!("127.0.4.{}", from % 250 + 1))
        .send(gw.addr)
        .await
}

/// Waits (real time) until `token` is admitted; panics after `limit`.
async fn wait_admitted(gw: &Live, token: &str, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut n = 0;
    while get(gw, token, n).await.status != 200 {
        assert!(started.elapsed() < limit, "not admitted within {limit:?}");
        n += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_fetched_rotated_bounded_and_kept_when_the_provider_goes_away() {
    let dir = tempfile::tempdir().unwrap();
    let (k1, jwk1) = rsa_key(dir.path(), "k1");
    let (k2, jwk2) = rsa_key(dir.path(), "k2");
    let idp = provider(dir.path(), vec![jwk1.clone()]).await;
    let gw = start(dir, idp.port).await;
    wait_admitted(&gw, &token("k1", &k1), Duration::from_secs(10)).await;
    let ready = gw.admin(Req::get("/readyz")).await.json();
    assert_eq!(ready["jwks"]["state"]["keys"], 1, "{ready}");
    assert_eq!(ready["jwks"]["state"]["ok"], 1, "{ready}");
    // The provider rotates: k2 is published. A k2 token wakes a fetch, which waits
    // out 30 s after the last one; meanwhile a spray of unknown kids adds none.
    idp.set
        .lock()
        .unwrap()
        .clone_from(&json!({"keys": [jwk1, jwk2]}));
    let before = idp.fetches.load(Ordering::SeqCst);
    for i in 0..200 {
        let resp = get(&gw, &token(&format!("spray-{i}"), &k2), i).await;
        assert_eq!(resp.status, 401);
    }
    let took = wait_admitted(&gw, &token("k2", &k2), Duration::from_secs(45)).await;
    let fetched = idp.fetches.load(Ordering::SeqCst) - before;
    assert_eq!(fetched, 1, "fetches during the spray and the rotation");
    eprintln!("rotated key admitted after {took:?}");
    // The provider goes away: the last good set keeps verifying.
    idp.task.abort();
    assert_eq!(get(&gw, &token("k1", &k1), 1).await.status, 200);
    assert_eq!(get(&gw, &token("k2", &k2), 2).await.status, 200);
    let text = gw.admin(Req::get("/metrics")).await.text();
    assert_eq!(
        metric(&text, "sluice_jwks_refreshes_total{result=\"ok\"}"),
        Some(2.0)
    );
    gw.stop().await;
}

/// Successful fetches the gateway has counted.
async fn fetched_ok(gw: &Live) -> Option<f64> {
    let text = gw.admin(Req::get("/metrics")).await.text();
    metric(&text, "sluice_jwks_refreshes_total{result=\"ok\"}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_dropped_from_the_set_revokes_the_tokens_it_verified_at_that_fetch() {
    let dir = tempfile::tempdir().unwrap();
    let (k1, jwk1) = rsa_key(dir.path(), "k1");
    let (k2, jwk2) = rsa_key(dir.path(), "k2");
    let idp = provider(dir.path(), vec![jwk1.clone(), jwk2.clone()]).await;
    let gw = start_refreshing(dir, idp.port, "30s").await;
    // Two callers of k1 and one of k2, each seen many times (on every worker's own
    // table of recent tokens, and in the shared cache).
    let (alice, bob) = (token_for("alice", "k1", &k1), token_for("bob", "k1", &k1));
    let carol = token_for("carol", "k2", &k2);
    wait_admitted(&gw, &alice, Duration::from_secs(10)).await;
    for i in 0..20 {
        for t in [&alice, &bob, &carol] {
            assert_eq!(get(&gw, t, i).await.status, 200);
        }
    }
    assert_eq!(fetched_ok(&gw).await, Some(1.0));
    // The provider rotates k1 out. The next fetch (30 s after the first) finds it
    // gone: from then on, k1's tokens are refused, those seen before included.
    idp.set.lock().unwrap().clone_from(&json!({"keys": [jwk2]}));
    let started = Instant::now();
    let mut served_after_fetch = 0;
    loop {
        let fetched = fetched_ok(&gw).await == Some(2.0);
        let status = get(&gw, &alice, 0).await.status;
        if fetched {
            // The fetch was counted before this request was sent.
            served_after_fetch += usize::from(status == 200);
            break;
        }
        if status != 200 {
            // The fetch may land between reading the metric and sending the
            // request; a refusal is right only if that fetch is then counted.
            assert_eq!(status, 401, "k1's token refused with {status}");
            let counted = Instant::now();
            while fetched_ok(&gw).await != Some(2.0) {
                assert!(
                    counted.elapsed() < Duration::from_secs(5),
                    "k1 refused before the fetch that drops it"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(45),
            "no second fetch"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "k1 dropped by the provider; refused from the fetch {:?} later",
        started.elapsed()
    );
    for i in 0..20 {
        for t in [&alice, &bob] {
            let refused = get(&gw, t, i).await;
            served_after_fetch += usize::from(refused.status == 200);
            refused.problem(401);
        }
        // A key still in the set keeps its tokens.
        assert_eq!(get(&gw, &carol, i).await.status, 200);
    }
    assert_eq!(served_after_fetch, 0, "k1 tokens served after the fetch");
    // A new token of k1 is refused too; k2's new ones verify.
    get(&gw, &token_for("dave", "k1", &k1), 1)
        .await
        .problem(401);
    assert_eq!(get(&gw, &token_for("erin", "k2", &k2), 2).await.status, 200);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_answering_garbage_is_an_error_in_readyz_and_the_metric() {
    let dir = tempfile::tempdir().unwrap();
    let (k1, _) = rsa_key(dir.path(), "k1");
    let idp = provider(dir.path(), vec![json!({"kty": "nonsense"})]).await;
    let gw = start(dir, idp.port).await;
    let started = Instant::now();
    loop {
        let text = gw.admin(Req::get("/metrics")).await.text();
        if metric(&text, "sluice_jwks_refreshes_total{result=\"error\"}") == Some(1.0) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no failed fetch counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ready = gw.admin(Req::get("/readyz")).await.json();
    assert!(ready["jwks"]["state"]["last_error"].is_string(), "{ready}");
    let resp = get(&gw, &token("k1", &k1), 0).await;
    resp.problem(401);
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
