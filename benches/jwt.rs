//! Verifications per second of first-seen JWTs, per algorithm: the signature check
//! sluice pays once per token (later uses hit its cache by the token's SHA-256).
//!
//! Keys are made with openssl at start (RSA 2048, P-256, Ed25519) and an HMAC secret;
//! each iteration verifies one token signed with that algorithm through jsonwebtoken
//! with the validation sluice uses (issuer and audience checked, exp and nbf left to
//! the gateway's clock).
//!
//! Run: `cargo bench --bench jwt`

#![allow(clippy::unwrap_used)] // a benchmark fails by panicking

use std::hint::black_box;
use std::path::Path;
use std::process::Command;

use criterion::{Criterion, criterion_group, criterion_main};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation, decode, encode};
use serde_json::{Map, Value, json};

fn openssl(dir: &Path, name: &str, args: &[&str]) -> (Vec<u8>, Vec<u8>) {
    let key = dir.join(format!("{name}.key"));
    let public = dir.join(format!("{name}.pem"));
    let ok = Command::new("openssl")
        .args(["genpkey", "-out"])
        .arg(&key)
        .args(args)
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let ok = Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&key)
        .arg("-out")
        .arg(&public)
        .status()
        .unwrap()
        .success();
    assert!(ok);
    (std::fs::read(key).unwrap(), std::fs::read(public).unwrap())
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let (rsa, rsa_pub) = openssl(
        dir.path(),
        "rsa",
        &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
    );
    let (ec, ec_pub) = openssl(
        dir.path(),
        "ec",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    );
    let (ed, ed_pub) = openssl(dir.path(), "ed", &["-algorithm", "ED25519"]);
    let secret = b"an-hmac-secret-of-at-least-32-bytes!";
    let cases = [
        (
            Algorithm::RS256,
            EncodingKey::from_rsa_pem(&rsa).unwrap(),
            DecodingKey::from_rsa_pem(&rsa_pub).unwrap(),
        ),
        (
            Algorithm::PS256,
            EncodingKey::from_rsa_pem(&rsa).unwrap(),
            DecodingKey::from_rsa_pem(&rsa_pub).unwrap(),
        ),
        (
            Algorithm::ES256,
            EncodingKey::from_ec_pem(&ec).unwrap(),
            DecodingKey::from_ec_pem(&ec_pub).unwrap(),
        ),
        (
            Algorithm::EdDSA,
            EncodingKey::from_ed_pem(&ed).unwrap(),
            DecodingKey::from_ed_pem(&ed_pub).unwrap(),
        ),
        (
            Algorithm::HS256,
            EncodingKey::from_secret(secret),
            DecodingKey::from_secret(secret),
        ),
    ];
    let claims =
        json!({"sub": "bench", "iss": "https://idp.test/", "aud": "api", "exp": 4_000_000_000u64});
    let mut group = c.benchmark_group("jwt_verify_first_seen");
    for (alg, signing, verifying) in &cases {
        let token = encode(&Header::new(*alg), &claims, signing).unwrap();
        let mut validation = Validation::new(*alg);
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.required_spec_claims.clear();
        validation.set_audience(&["api"]);
        validation.set_issuer(&["https://idp.test/"]);
        group.bench_function(format!("{alg:?}"), |b| {
            b.iter(|| {
                decode::<Map<String, Value>>(black_box(&token), verifying, &validation).unwrap()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
