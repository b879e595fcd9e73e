//! `/readyz` and the JWT key set's first fetch, with a real https provider that
//! answers when the test lets it: 503 while the first fetch is in flight (a valid
//! token would be refused), 200 once the set is in; a first fetch that fails is
//! reported in the body and does not hold the gateway unready, and API-key callers
//! are served throughout.

use crate::support;

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use hyper_util::rt::TokioIo;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use serde_json::json;
use support::{Live, Req, live_at, within_for};
use tokio::sync::watch;

/// What the provider answers once let go: a status and a body.
type Answer = (u16, String);

/// An RSA key made with openssl: its signing key and its key set (one JWK).
fn rsa_key_set(dir: &Path, kid: &str) -> (EncodingKey, String) {
    let (signing, jwk) = super::jwks::rsa_key(dir, kid);
    (signing, json!({"keys": [jwk]}).to_string())
}

fn token(kid: &str, key: &EncodingKey) -> String {
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some(kid.to_string());
    let claims = json!({"sub": "user-1", "exp": support::t0() / 1_000 + 3_600});
    encode(&header, &claims, key).unwrap()
}

/// An https provider on 127.0.0.1 that holds every request until `release` sends
/// its answer. Its CA is written to `dir/ca.pem`.
async fn slow_provider(dir: &Path) -> (u16, watch::Sender<Option<Answer>>) {
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
    let (release, released) = watch::channel(None::<Answer>);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, released) = (acceptor.clone(), released.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |_: http::Request<_>| {
                    let mut released = released.clone();
                    async move {
                        let answer = released.wait_for(Option::is_some).await.unwrap().clone();
                        let (status, body) = answer.unwrap();
                        let mut response =
                            http::Response::new(http_body_util::Full::new(Bytes::from(body)));
                        *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
                        Ok::<_, std::convert::Infallible>(response)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (port, release)
}

async fn start(dir: tempfile::TempDir, port: u16) -> Live {
    let config = format!(
        r#"
        [identity.jwt]
        jwks_url = "https://127.0.0.1:{port}/.well-known/jwks.json"
        ca_file = "ca.pem"
        refresh = "10m"
        [policies.p]
        anonymous = {{ per_minute = 100 }}
        registered = {{ per_minute = 1000 }}
        [[consumers]]
        name = "keyed"
        key = "demo-key-keyed"
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

/// `/readyz` until `done` holds of its status and body.
async fn readyz_until(
    gw: &Live,
    done: impl Fn(u16, &serde_json::Value) -> bool,
) -> serde_json::Value {
    within_for("readyz", std::time::Duration::from_secs(15), async {
        loop {
            let resp = gw.admin(Req::get("/readyz")).await;
            let body = resp.json();
            if done(resp.status.as_u16(), &body) {
                return body;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
}

async fn keyed(gw: &Live) -> u16 {
    let resp = Req::get("/x")
        .header("x-api-key", "demo-key-keyed")
        .send(gw.addr)
        .await;
    resp.status.as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_while_the_first_key_set_fetch_is_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let (key, set) = rsa_key_set(dir.path(), "k1");
    let (port, release) = slow_provider(dir.path()).await;
    let gw = start(dir, port).await;
    let waiting = gw.admin(Req::get("/readyz")).await;
    let body = waiting.problem(503);
    assert_eq!(body["jwks"]["keys"], "fetching", "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("jwks_url"),
        "{body}"
    );
    assert_eq!(body["store"], "memory", "{body}");
    // API-key callers are served meanwhile: readiness says what a token would get.
    assert_eq!(keyed(&gw).await, 200);

    // What readiness protects: a valid token is refused until the set is in.
    let bearer = |token: String| {
        Req::get("/x")
            .header("authorization", &format!("Bearer {token}"))
            .send(gw.addr)
    };
    bearer(token("k1", &key)).await.problem(401);

    release.send(Some((200, set))).unwrap();
    let ready = readyz_until(&gw, |status, _| status == 200).await;
    assert_eq!(ready["status"], "ready", "{ready}");
    assert_eq!(ready["jwks"]["keys"], "ok", "{ready}");
    assert_eq!(ready["jwks"]["state"]["ok"], 1, "{ready}");
    assert_eq!(
        bearer(token("k1", &key)).await.status,
        200,
        "ready, and the token is served"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_first_fetch_is_reported_and_does_not_hold_the_gateway_unready() {
    let dir = tempfile::tempdir().unwrap();
    let (port, release) = slow_provider(dir.path()).await;
    let gw = start(dir, port).await;
    gw.admin(Req::get("/readyz")).await.problem(503);
    release
        .send(Some((500, "provider down".to_string())))
        .unwrap();
    let ready = readyz_until(&gw, |status, _| status == 200).await;
    assert_eq!(ready["jwks"]["keys"], "failed", "{ready}");
    assert!(ready["jwks"]["state"]["last_error"].is_string(), "{ready}");
    assert_eq!(ready["jwks"]["state"]["errors"], 1, "{ready}");
    assert_eq!(keyed(&gw).await, 200);
    gw.stop().await;
}
