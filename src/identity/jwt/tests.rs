use super::*;
use jsonwebtoken::{EncodingKey, Header, encode};
use std::path::Path;

const SECRET: &str = "a-secret-of-at-least-thirty-two-bytes!";

fn verifier() -> JwtVerifier {
    let text = format!("[identity.jwt]\nsecret = \"{SECRET}\"\nalgorithms = [\"HS256\"]\n");
    let config = Config::parse(Path::new("t.toml"), &text).unwrap();
    JwtVerifier::new(&config, config.identity.jwt.as_ref().unwrap())
}

fn token(sub: &str, exp_s: u64) -> String {
    let claims = serde_json::json!({"sub": sub, "exp": exp_s});
    let key = EncodingKey::from_secret(SECRET.as_bytes());
    encode(&Header::default(), &claims, &key).unwrap()
}

fn named(n: u64) -> impl FnOnce(&str, PlanId) -> Who {
    move |_: &str, plan| Who::Named(n, plan)
}

#[test]
fn a_recent_slot_holds_one_token_found_by_all_its_bytes() {
    let mut recent = Recent {
        verifier: 0,
        slots: Vec::new(),
    };
    recent.serve(7);
    let verified = |who| {
        Arc::new(Verified {
            consumer: "c".into(),
            plan: PlanId::ANONYMOUS,
            claims: Map::new(),
            who,
            exp_s: 0,
            nbf_s: None,
            key: None,
        })
    };
    let token = b"eyJ.one.SIGNATURE".to_vec();
    // Same last eight bytes, so the same slot: another token.
    let other = b"eyJ.two.SIGNATURE".to_vec();
    assert_eq!(Recent::slot(&token), Recent::slot(&other));
    recent.put(&token, verified(Who::Disabled));
    assert_eq!(recent.get(&token).unwrap().who, Who::Disabled);
    assert!(recent.get(&other).is_none());
    recent.put(&other, verified(Who::Consumer(ConsumerId::new(3))));
    assert!(recent.get(&token).is_none());
    assert_eq!(
        recent.get(&other).unwrap().who,
        Who::Consumer(ConsumerId::new(3))
    );
    // Another verifier's requests find nothing of this one's.
    recent.serve(8);
    assert!(recent.get(&other).is_none());
    assert_eq!(recent.slots.len(), RECENT_SLOTS);
}

#[test]
fn a_cached_token_keeps_its_caller_and_is_still_checked_for_time() {
    let jwt = verifier();
    let exp_s = 1_000_000;
    let t = token("alice", exp_s);
    let first = jwt.verify(t.as_bytes(), 999_000_000, named(1)).unwrap();
    assert_eq!(first.who, Who::Named(1, first.plan));
    assert_eq!(&*first.consumer, "alice");
    // Found again without resolving again (a resolver that would say otherwise).
    let again = jwt.verify(t.as_bytes(), 999_000_000, named(2)).unwrap();
    assert_eq!(again.who, Who::Named(1, again.plan));
    // Expiry is checked on every use, cached or not.
    let late = (exp_s + jwt.leeway_s + 1) * 1_000;
    assert_eq!(
        jwt.verify(t.as_bytes(), late, named(1)).unwrap_err(),
        "the token has expired"
    );
    // A token differing in one byte of its signature is not the cached one.
    let mut forged = t.clone().into_bytes();
    let i = forged.len() - 10;
    forged[i] = if forged[i] == b'A' { b'B' } else { b'A' };
    assert!(jwt.verify(&forged, 999_000_000, named(1)).is_err());
}

#[test]
fn another_config_s_verifier_resolves_the_same_token_afresh() {
    let t = token("bob", 2_000_000);
    let old = verifier();
    let new = verifier();
    let seen = old.verify(t.as_bytes(), 1_000, named(1)).unwrap();
    assert_eq!(seen.who, Who::Named(1, seen.plan));
    // On the same thread, the new config's verifier (say, the consumer disabled
    // since) is not answered from the old one's table.
    let disabled = |_: &str, _| Who::Disabled;
    assert_eq!(
        new.verify(t.as_bytes(), 1_000, disabled).unwrap().who,
        Who::Disabled
    );
    assert_eq!(
        old.verify(t.as_bytes(), 1_000, named(3)).unwrap().who,
        Who::Named(1, seen.plan)
    );
}
