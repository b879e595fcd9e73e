//! The status page's rules, with raw requests: who gets the page or the login form,
//! the session cookie's attributes, the CSRF token a cookie-authorised change needs,
//! and a Content-Security-Policy that lets only the page's own style and script run.

use crate::binary::{Sluice, TOKEN};
use crate::support::{Resp, raw};

/// A raw HTTP/1.1 request to the admin listener, `extra` header lines included.
async fn request(
    sluice: &Sluice,
    method: &str,
    target: &str,
    extra: &[String],
    body: &str,
) -> Resp {
    let mut head = format!(
        "{method} {target} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
        sluice.admin,
        body.len()
    );
    for line in extra {
        head.push_str(line);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    head.push_str(body);
    raw(sluice.admin, head.as_bytes()).await
}

/// Logs in through the form; returns the cookie's `name=value`.
async fn log_in(sluice: &Sluice) -> String {
    let form = format!("token={TOKEN}");
    let ctype = "Content-Type: application/x-www-form-urlencoded".to_string();
    let resp = request(sluice, "POST", "/login", &[ctype], &form).await;
    assert_eq!(resp.status, 303, "{}", resp.text());
    assert_eq!(resp.header("location"), Some("/"));
    let cookie = resp.header("set-cookie").expect("a session cookie");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    assert!(
        !cookie.contains(TOKEN),
        "the cookie is not the token: {cookie}"
    );
    cookie.split(';').next().unwrap().to_string()
}

/// The page's CSRF token, from its `<meta name="csrf-token">`.
fn csrf_of(page: &str) -> String {
    let at = page
        .find("name=\"csrf-token\" content=\"")
        .expect("a csrf meta")
        + 27;
    page[at..at + 64].to_string()
}

/// Asserts the CSP of an HTML answer and that the page runs nothing else: the
/// nonce is on its one style and one script, and nothing loads from elsewhere.
#[track_caller]
fn assert_strict_csp(resp: &Resp) {
    assert_eq!(
        resp.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let csp = resp.header("content-security-policy").expect("a CSP");
    assert!(
        csp.starts_with("default-src 'none'; script-src 'nonce-"),
        "{csp}"
    );
    assert!(
        !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
        "{csp}"
    );
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    let nonce = csp
        .split("'nonce-")
        .nth(1)
        .unwrap()
        .split('\'')
        .next()
        .unwrap();
    let page = resp.text();
    let scripts = page.matches("<script").count();
    let nonced = page.matches(&format!("<script nonce=\"{nonce}\">")).count();
    assert_eq!(scripts, nonced, "every script carries the nonce");
    assert_eq!(
        page.matches("<style").count(),
        page.matches(&format!("<style nonce=\"{nonce}\">")).count()
    );
    for forbidden in [
        " style=\"",
        " onclick=",
        " src=\"http",
        " href=\"http",
        "<link",
    ] {
        assert!(!page.contains(forbidden), "{forbidden} in the page");
    }
    assert_eq!(resp.header("cache-control"), Some("no-store"));
    assert_eq!(resp.header("x-frame-options"), Some("DENY"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_token_the_page_is_a_login_form() {
    let sluice = Sluice::start(&crate::config()).await;
    let resp = request(&sluice, "GET", "/", &[], "").await;
    assert_eq!(resp.status, 401);
    assert_strict_csp(&resp);
    let page = resp.text();
    assert!(
        page.contains("<form method=\"post\" action=\"/login\""),
        "{page}"
    );
    assert!(!page.contains("<table"), "no figures without the token");
    // The token in a URL is not a way in.
    let resp = request(&sluice, "GET", &format!("/?token={TOKEN}"), &[], "").await;
    assert_eq!(resp.status, 401);
    // A wrong token in the form: the form again, no cookie.
    let ctype = "Content-Type: application/x-www-form-urlencoded".to_string();
    let resp = request(
        &sluice,
        "POST",
        "/login",
        std::slice::from_ref(&ctype),
        "token=wrong",
    )
    .await;
    assert_eq!(resp.status, 401);
    assert!(resp.header("set-cookie").is_none());
    assert!(resp.text().contains("not the admin token"));
    // Another site's page cannot log a browser in.
    let evil = "Origin: https://evil.example".to_string();
    let form = format!("token={TOKEN}");
    let resp = request(&sluice, "POST", "/login", &[ctype, evil], &form).await;
    assert_eq!(resp.status, 403);
    assert!(resp.header("set-cookie").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_token_the_page_is_drawn_by_the_server_under_a_strict_csp() {
    let sluice = Sluice::start(&crate::config()).await;
    for _ in 0..4 {
        crate::get_from(&sluice, "/tight", "127.0.0.9").await;
    }
    let bearer = format!("Authorization: Bearer {TOKEN}");
    let resp = request(&sluice, "GET", "/", &[bearer], "").await;
    assert_eq!(resp.status, 200);
    assert_strict_csp(&resp);
    let page = resp.text();
    // Readable without a script: the refused caller is in the server's table.
    let refused = page.split("<table id=\"refused\">").nth(1).unwrap();
    let refused = refused.split("</table>").next().unwrap();
    assert!(
        refused
            .contains("<th scope=\"row\">ip:127.0.0.9</th><td>tight</td><td>minute</td><td>2</td>"),
        "{refused}"
    );
    for id in ["routes", "near", "bans", "concurrency"] {
        assert!(page.contains(&format!("<table id=\"{id}\">")), "{id}");
    }
    assert!(page.contains("aria-live=\"polite\""));
    assert!(page.contains("prefers-color-scheme:dark"));
    // A bearer page has no session: no CSRF token in it.
    assert!(!page.contains("<meta name=\"csrf-token\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cookie_reads_and_its_changes_need_the_csrf_token() {
    let sluice = Sluice::start(&crate::config()).await;
    // Banned: 2 admitted, then three 429s.
    for _ in 0..5 {
        crate::get_from(&sluice, "/tight", "127.0.0.10").await;
    }
    let cookie = format!("Cookie: {}", log_in(&sluice).await);
    let page = request(&sluice, "GET", "/", std::slice::from_ref(&cookie), "").await;
    assert_eq!(page.status, 200);
    assert_strict_csp(&page);
    let csrf = csrf_of(&page.text());
    assert!(
        page.text().contains("data-caller=\"ip:127.0.0.10\""),
        "a lift button"
    );
    let status = request(
        &sluice,
        "GET",
        "/admin/status",
        std::slice::from_ref(&cookie),
        "",
    )
    .await;
    assert_eq!(status.status, 200);
    assert_eq!(status.json()["bans"][0]["caller"], "ip:127.0.0.10");

    let lift = "/admin/bans?caller=ip:127.0.0.10";
    // The cookie alone, as another site's form or script would send it: refused.
    let resp = request(&sluice, "DELETE", lift, std::slice::from_ref(&cookie), "").await;
    resp.problem(403);
    let wrong = "X-CSRF-Token: 0000".to_string();
    let resp = request(&sluice, "DELETE", lift, &[cookie.clone(), wrong], "").await;
    resp.problem(403);
    let token = format!("X-CSRF-Token: {csrf}");
    let evil = "Origin: https://evil.example".to_string();
    let resp = request(
        &sluice,
        "DELETE",
        lift,
        &[cookie.clone(), token.clone(), evil],
        "",
    )
    .await;
    resp.problem(403);
    assert_eq!(
        sluice.status().await["bans"].as_array().unwrap().len(),
        1,
        "still banned"
    );
    // From the page (its token, its own origin): lifted.
    let own = format!("Origin: http://{}", sluice.admin);
    let resp = request(
        &sluice,
        "DELETE",
        lift,
        &[cookie.clone(), token.clone(), own],
        "",
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["lifted"], true);
    assert_eq!(crate::get_from(&sluice, "/open", "127.0.0.10").await, 200);

    // Logging out ends the session.
    let resp = request(&sluice, "POST", "/logout", &[cookie.clone(), token], "").await;
    assert_eq!(resp.status, 303);
    assert!(resp.header("set-cookie").unwrap().contains("Max-Age=0"));
    let resp = request(&sluice, "GET", "/admin/status", &[cookie], "").await;
    assert_eq!(resp.status, 401);
}
