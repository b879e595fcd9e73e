//! TLS termination end to end, with certificates made at test time: HTTP/1.1 and
//! HTTP/2 over TLS chosen by ALPN, certificates chosen by SNI, rotation of the files
//! on disk (and a bad pair that never replaces a good one), `X-Forwarded-Proto`, and
//! the handshake time limit.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, ServerName};
use support::{Toml, connect, gateway, read_until_closed, route, upstream};
use tokio::io::AsyncWriteExt;
use tokio_rustls::TlsConnector;

/// A private CA that signs leaf certificates.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new() -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Ca { issuer }
    }

    /// Writes a certificate for `names` and its key as `<stem>.pem` and
    /// `<stem>-key.pem` in `dir`; returns the certificate's DER.
    fn leaf(&self, dir: &Path, stem: &str, names: &[&str]) -> CertificateDer<'static> {
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        write_atomically(&dir.join(format!("{stem}.pem")), &cert.pem());
        write_atomically(&dir.join(format!("{stem}-key.pem")), &key.serialize_pem());
        cert.der().clone()
    }

    fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.issuer.der().clone()).unwrap();
        roots
    }
}

/// Replaces `path` the way cert-manager does: a new file renamed over the old one.
fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn tls_config(dir: &Path, up: &support::Upstream, extra: &str) -> String {
    let file = |name: &str| -> PathBuf { dir.join(name) };
    Toml::new()
        .raw(&format!(
            "[server]\nheader_timeout = \"1s\"\n[server.tls]\nlisten = \"127.0.0.1:0\"\ncert = {:?}\nkey = {:?}\n\
             sni = [{{ cert = {:?}, key = {:?} }}]\n{extra}",
            file("a.pem"),
            file("a-key.pem"),
            file("b.pem"),
            file("b-key.pem"),
        ))
        .upstream("up", &[up.url()])
        .route(route("all", "/").upstream("up"))
        .build()
}

/// A TLS client session: the certificate the server presented and what ALPN chose.
struct Session {
    stream: tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
}

impl Session {
    async fn open(
        addr: std::net::SocketAddr,
        roots: rustls::RootCertStore,
        name: &str,
        alpn: &[&[u8]],
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> Result<Session, std::io::Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let tcp = connect(addr, None).await;
        let stream = TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from(name.to_string()).unwrap(), tcp)
            .await?;
        Ok(Session { stream })
    }

    fn presented(&self) -> CertificateDer<'static> {
        self.stream.get_ref().1.peer_certificates().unwrap()[0].clone()
    }

    fn alpn(&self) -> Option<Vec<u8>> {
        self.stream.get_ref().1.alpn_protocol().map(|p| p.to_vec())
    }

    /// One GET over the session, HTTP/2 if ALPN chose it; (status, version).
    async fn get(self, path: &str) -> (u16, http::Version) {
        let h2 = self.alpn().as_deref() == Some(b"h2");
        let io = TokioIo::new(self.stream);
        let request = http::Request::get(format!("https://a.example{path}"))
            .header("host", "a.example")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let response = if h2 {
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                    .await
                    .unwrap();
            tokio::spawn(conn);
            let mut request = request;
            request.headers_mut().remove("host");
            sender.send_request(request).await.unwrap()
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            let mut request = request;
            *request.uri_mut() = path.parse().unwrap();
            sender.send_request(request).await.unwrap()
        };
        let (status, version) = (response.status().as_u16(), response.version());
        let _ = response.into_body().collect().await;
        (status, version)
    }
}

const BOTH: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h1_and_h2_over_tls_by_alpn_with_the_certificate_sni_asks_for() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let a = ca.leaf(dir.path(), "a", &["a.example"]);
    let b = ca.leaf(dir.path(), "b", &["b.example"]);
    let up = upstream().await;
    let gw = gateway(&tls_config(dir.path(), &up, "")).await;
    let addr = gw.tls_addr();

    // ALPN: h2 when offered, else HTTP/1.1; both reach the upstream as https.
    for (offer, want, version) in [
        (
            &[&b"h2"[..], b"http/1.1"][..],
            &b"h2"[..],
            http::Version::HTTP_2,
        ),
        (
            &[&b"http/1.1"[..]][..],
            &b"http/1.1"[..],
            http::Version::HTTP_11,
        ),
    ] {
        let session = Session::open(addr, ca.roots(), "a.example", offer, BOTH)
            .await
            .unwrap();
        assert_eq!(session.alpn().as_deref(), Some(want));
        assert_eq!(session.presented(), a);
        assert_eq!(session.get("/hello").await, (200, version));
        let seen = up.last();
        assert_eq!(seen.headers["x-forwarded-proto"], "https");
        assert_eq!(seen.target, "/hello");
    }
    // Over TLS too, a head with both lengths is refused and its body's request
    // never reaches the upstream.
    let mut session = Session::open(addr, ca.roots(), "a.example", &[b"http/1.1"], BOTH)
        .await
        .unwrap();
    session
        .stream
        .write_all(
            b"POST /both HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n\
              0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
        )
        .await
        .unwrap();
    let answer = read_until_closed(&mut session.stream, Duration::from_secs(5)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert_eq!(answer.matches("HTTP/1.1 ").count(), 1, "{answer}");
    assert_eq!(up.last().target, "/hello");
    // TLS 1.2 clients are served too.
    let tls12 = Session::open(
        addr,
        ca.roots(),
        "a.example",
        &[b"http/1.1"],
        &[&rustls::version::TLS12],
    )
    .await
    .unwrap();
    assert_eq!(tls12.get("/v12").await.0, 200);
    // SNI picks b's certificate for b.example, the default for any other name (which
    // then fails verification for that name, as it must).
    let session = Session::open(addr, ca.roots(), "b.example", &[b"h2"], BOTH)
        .await
        .unwrap();
    assert_eq!(session.presented(), b);
    assert!(
        Session::open(addr, ca.roots(), "c.example", &[b"h2"], BOTH)
            .await
            .is_err()
    );
    // Plain HTTP on the TLS port gets no answer, only a closed connection.
    let mut plain = connect(addr, None).await;
    plain
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until_closed(&mut plain, Duration::from_secs(5)).await;
    assert!(!answer.starts_with(b"HTTP/1.1 200"), "{answer:?}");
    assert!(up.targets().iter().all(|t| t != "/"), "{:?}", up.targets());
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_certificates_are_served_and_a_bad_pair_never_replaces_a_good_one() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let first = ca.leaf(dir.path(), "a", &["a.example"]);
    ca.leaf(dir.path(), "b", &["b.example"]);
    let up = upstream().await;
    let gw = gateway(&tls_config(dir.path(), &up, "")).await;
    let addr = gw.tls_addr();
    let presented = || async {
        Session::open(addr, ca.roots(), "a.example", &[b"h2"], BOTH)
            .await
            .unwrap()
            .presented()
    };
    assert_eq!(presented().await, first);

    // Rotated on disk: served without a restart once the watcher loaded it (the
    // cert and key are replaced one after the other, so a check may fall between
    // them and count an error first).
    let second = ca.leaf(dir.path(), "a", &["a.example"]);
    reloads_reach(&gw, "ok", 1).await;
    assert_eq!(
        presented().await,
        second,
        "the rotated certificate is served"
    );

    // A key that does not match its certificate: the check runs, rejects it, and
    // the good pair keeps serving.
    let errors = reloads(&gw, "error");
    let other = KeyPair::generate().unwrap();
    write_atomically(&dir.path().join("a-key.pem"), &other.serialize_pem());
    reloads_reach(&gw, "error", errors + 1).await;
    assert_eq!(reloads(&gw, "ok"), 1, "the mismatched pair was not loaded");
    assert_eq!(presented().await, second);
    let session = Session::open(addr, ca.roots(), "a.example", &[b"http/1.1"], BOTH)
        .await
        .unwrap();
    assert_eq!(session.get("/still").await.0, 200);
    gw.stop().await;
}

/// `sluice_tls_reloads_total{result}`: loads of changed certificate files.
fn reloads(gw: &support::Gateway, result: &str) -> u64 {
    let series = format!("sluice_tls_reloads_total{{result=\"{result}\"}}");
    support::metric(&gw.metrics(), &series).expect("the series exists") as u64
}

/// Waits (for at most [`support::WAIT`]) until `reloads(result)` reaches `count`.
async fn reloads_reach(gw: &support::Gateway, result: &str, count: u64) {
    support::within("the certificate watcher's check", async {
        while reloads(gw, result) < count {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_handshake_is_cut_at_header_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    ca.leaf(dir.path(), "a", &["a.example"]);
    ca.leaf(dir.path(), "b", &["b.example"]);
    let up = upstream().await;
    let gw = gateway(&tls_config(dir.path(), &up, "")).await;
    let mut silent = connect(gw.tls_addr(), None).await;
    // Half a ClientHello record header, then nothing.
    silent.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    let started = Instant::now();
    // Bounded at half the default header_timeout (10 s): only the configured 1 s
    // cuts it in time, and not before.
    read_until_closed(&mut silent, Duration::from_secs(5)).await;
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "cut after {:?}, before header_timeout",
        started.elapsed()
    );
    gw.stop().await;
}

#[test]
fn a_certificate_that_does_not_load_is_a_config_error_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    ca.leaf(dir.path(), "a", &["a.example"]);
    ca.leaf(dir.path(), "b", &["b.example"]);
    // b's key swapped for a's: they do not match.
    std::fs::copy(dir.path().join("a-key.pem"), dir.path().join("b-key.pem")).unwrap();
    let config = format!(
        "[server.tls]\ncert = {:?}\nkey = {:?}\nsni = [{{ cert = {:?}, key = {:?} }}]\nmin_version = \"1.1\"\n\
         [[routes]]\nname = \"r\"\npath_prefix = \"/\"\nrespond = {{ status = 200 }}\n",
        dir.path().join("a.pem"),
        dir.path().join("missing-key.pem"),
        dir.path().join("b.pem"),
        dir.path().join("b-key.pem"),
    );
    let err = sluice::config::Config::parse(Path::new("gateway.toml"), &config)
        .unwrap_err()
        .to_string();
    assert!(err.contains("gateway.toml:2: server.tls.cert"), "{err}");
    assert!(err.contains("missing-key.pem"), "{err}");
    assert!(
        err.contains("server.tls.sni[0]") && err.contains("does not match"),
        "{err}"
    );
    assert!(err.contains("server.tls.min_version"), "{err}");
}

// ---- https upstreams ------------------------------------------------------------------

/// An https upstream on loopback with a certificate for `names` from `ca`; answers
/// 200 "secure <path>" and counts the TLS connections it accepted.
async fn tls_upstream(
    ca: &Ca,
    dir: &Path,
    names: &[&str],
) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    ca.leaf(dir, "up", names);
    let certs = sluice::tls::pki::load_pair(&dir.join("up.pem"), &dir.join("up-key.pem")).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Fixed(certs)));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            let counter = counter.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let service = hyper::service::service_fn(
                    |request: http::Request<hyper::body::Incoming>| async move {
                        let body = format!("secure {}", request.uri().path());
                        Ok::<_, std::convert::Infallible>(http::Response::new(
                            http_body_util::Full::new(Bytes::from(body)),
                        ))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (addr, accepted)
}

#[derive(Debug)]
struct Fixed(Arc<rustls::sign::CertifiedKey>);

impl rustls::server::ResolvesServerCert for Fixed {
    fn resolve(
        &self,
        _: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstreams_are_verified_against_ca_file_and_pooled() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    std::fs::write(dir.path().join("ca.pem"), ca.issuer.pem()).unwrap();
    let (addr, accepted) = tls_upstream(&ca, dir.path(), &["localhost"]).await;
    let stranger = Ca::new();
    let other_dir = tempfile::tempdir().unwrap();
    let (untrusted, _) = tls_upstream(&stranger, other_dir.path(), &["localhost"]).await;
    let ca_file = dir.path().join("ca.pem");
    let gw = gateway(
        &Toml::new()
            .raw(&format!(
                "[upstreams.secure]\ntargets = [\"https://localhost:{}\"]\nca_file = {ca_file:?}\n\
                 [upstreams.wrong_name]\ntargets = [\"https://127.0.0.1:{}\"]\nca_file = {ca_file:?}\n\
                 [upstreams.untrusted]\ntargets = [\"https://localhost:{}\"]\nca_file = {ca_file:?}\n",
                addr.port(),
                addr.port(),
                untrusted.port()
            ))
            .route(route("secure", "/secure").upstream("secure"))
            .route(route("wrong_name", "/wrong").upstream("wrong_name"))
            .route(route("untrusted", "/untrusted").upstream("untrusted"))
            .build(),
    )
    .await;
    for i in 0..3 {
        let resp = gw.raw_get(&format!("/secure/{i}")).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(resp.text(), format!("secure /secure/{i}"));
    }
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one pooled connection"
    );
    // A certificate for another name, or from a CA not trusted: 502, nothing served.
    assert_eq!(gw.raw_get("/wrong").await.status, 502);
    assert_eq!(gw.raw_get("/untrusted").await.status, 502);
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    gw.stop().await;
}
