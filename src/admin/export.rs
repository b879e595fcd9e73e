//! `GET /admin/usage?policy=P&format=jsonl|csv[&min_ratio=R][&cursor=C][&limit=N]`:
//! every tracked caller's usage in a policy, for billing, one page per request.
//!
//! A page is listed first (keys only, [`Store::list`]: the memory engine copies a
//! shard's keys under its lock, Redis answers `SCAN`s), so the next page's cursor
//! goes out in the headers (`X-Next-Cursor`, and a `Link` with `rel="next"`; neither
//! on the last page). The body is then written by a task, a batch of callers at a
//! time: each caller's counters are read ([`Store::peek_listed`], one shard lock or
//! one script run each, in Redis a batch's at once), turned into lines on a thread of
//! idle priority ([`idle`]: the export takes the time the proxy leaves), and sent
//! through a small channel to the connection, so a slow reader holds the task, never
//! a lock. Callers are named as the config knows them (`consumer:NAME`, `ip:ADDR`);
//! a keyed bucket by its key parts (`header:x-org=acme&path:2=orders`, the
//! parameters `/admin/usage` takes, and in `jsonl` also as a `key` object, as
//! `/v1/check` takes them), or by its digest (`key:HEX`) when its parts were never
//! kept (see `store::key_parts`).
//!
//! It counts nothing and resets nothing; `usage.rs` answers one caller.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, LINK};
use http::{HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::sync::mpsc;

use super::{problem, query_pairs};
use crate::config::{ConsumerId, PlanId, PolicyId};
use crate::gateway::Gateway;
use crate::http::body::Body;
use crate::http::rate_headers::ceil_secs;
use crate::limit::Report;
use crate::snapshot::{PlanLimit, Snapshot};
use crate::store::listing::{Cursor, Listed};
use crate::store::{CallerKey, Scope, Store};

mod idle;
mod lines;
mod parts;

use lines::{Format, Row, Window};

/// Callers a page lists unless `limit` says otherwise.
const PAGE: usize = 10_000;
/// The largest `limit`: a page's keys are held in memory while it is written.
const MAX_PAGE: usize = 100_000;
/// Callers read and written together: a batch's counters are read (in Redis, at
/// once), then its lines are sent.
const BATCH: usize = 256;

/// What the query asks for.
struct Asked {
    policy: PolicyId,
    format: Format,
    min_ratio: Option<f64>,
    cursor: Option<Cursor>,
    limit: usize,
}

/// The export's answer: a page of lines, written as they are read.
pub(super) async fn export(gateway: &Gateway, request: &Request<Incoming>) -> Response<Body> {
    let snapshot = gateway.snapshot();
    let asked = match parse(request, &snapshot) {
        Ok(asked) => asked,
        Err(why) => return problem(StatusCode::BAD_REQUEST, &why),
    };
    let plans: Vec<PlanId> = (snapshot.plans())
        .filter(|&plan| matches!(snapshot.limits(asked.policy, plan), PlanLimit::Limits(_)))
        .collect();
    let scopes: Vec<&Scope> = (plans.iter())
        .filter_map(|&plan| match snapshot.limits(asked.policy, plan) {
            PlanLimit::Limits(limits) => Some(&limits.scope),
            _ => None,
        })
        .collect();
    let store = gateway.store().clone();
    let (listed, next) = match store.list(&scopes, asked.cursor, asked.limit).await {
        Ok(page) => page,
        Err(err) => {
            let why = format!("the store could not list the policy's callers: {err}");
            return problem(StatusCode::SERVICE_UNAVAILABLE, &why);
        }
    };
    let (chunks, body) = mpsc::channel(2);
    let mut response = Response::new(Body::written(body));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(asked.format.mime()));
    if let Some(next) = next {
        let link = format!("<{}>; rel=\"next\"", next_url(request, next));
        if let (Ok(cursor), Ok(link)) = (
            HeaderValue::from_str(&next.to_string()),
            HeaderValue::from_str(&link),
        ) {
            headers.insert("x-next-cursor", cursor);
            headers.insert(LINK, link);
        }
    }
    let page = Page {
        keyed: snapshot.policy_key(asked.policy).is_some(),
        lines: Arc::new(Lines {
            consumers: consumer_keys(&snapshot),
            snapshot,
            format: asked.format,
        }),
        store,
        plans,
        now_ms: gateway.clock().now_ms(),
        policy: asked.policy,
        min_ratio: asked.min_ratio,
    };
    tokio::spawn(page.write(listed, chunks));
    response
}

/// Reads the query: `policy` and `format` are required, the rest optional, nothing
/// else is taken. The error says what is wrong.
fn parse(request: &Request<Incoming>, snapshot: &Snapshot) -> Result<Asked, String> {
    let (mut policy, mut format, mut min_ratio, mut cursor, mut limit) =
        (None, None, None, None, PAGE);
    for (name, value) in query_pairs(request) {
        match &*name {
            "policy" => match snapshot.policy_id(&value) {
                Some(id) => policy = Some(id),
                None => return Err(format!("unknown policy \"{value}\"")),
            },
            "format" => match &*value {
                "jsonl" => format = Some(Format::Jsonl),
                "csv" => format = Some(Format::Csv),
                _ => return Err(format!("format must be jsonl or csv, not \"{value}\"")),
            },
            "min_ratio" => match value.parse::<f64>() {
                Ok(ratio) if ratio.is_finite() && ratio >= 0.0 => min_ratio = Some(ratio),
                _ => {
                    return Err(format!(
                        "min_ratio must be a number from 0, not \"{value}\""
                    ));
                }
            },
            "cursor" => match value.parse::<Cursor>() {
                Ok(at) => cursor = Some(at),
                Err(()) => return Err(format!("\"{value}\" is not a cursor this API gave")),
            },
            "limit" => match value.parse::<usize>() {
                Ok(n) if (1..=MAX_PAGE).contains(&n) => limit = n,
                _ => return Err(format!("limit must be 1 to {MAX_PAGE}, not \"{value}\"")),
            },
            other => return Err(format!("unknown parameter \"{other}\" for a usage export")),
        }
    }
    let policy = policy.ok_or("policy is required")?;
    let format = format.ok_or("format is required: jsonl or csv")?;
    Ok(Asked {
        policy,
        format,
        min_ratio,
        cursor,
        limit,
    })
}

/// The request's URL with `cursor` set to `next`.
fn next_url(request: &Request<Incoming>, next: Cursor) -> String {
    let mut url = form_urlencoded::Serializer::new(String::new());
    for (name, value) in query_pairs(request).filter(|(name, _)| name != "cursor") {
        url.append_pair(&name, &value);
    }
    url.append_pair("cursor", &next.to_string());
    format!("{}?{}", request.uri().path(), url.finish())
}

/// One page being written.
struct Page {
    /// What names callers and writes their lines, shared with the idle thread.
    lines: Arc<Lines>,
    store: Store,
    /// The plans listed, indexed like the scopes given to the listing.
    plans: Vec<PlanId>,
    now_ms: u64,
    policy: PolicyId,
    min_ratio: Option<f64>,
    /// The policy has a `key`: its buckets are named by their parts.
    keyed: bool,
}

/// One caller's counters as read, to be named and written by [`Lines::text`].
struct Counted {
    caller: CallerKey,
    plan: PlanId,
    /// A keyed bucket's parts as the store keeps them, if it kept them.
    parts: Option<Box<str>>,
    windows: Vec<Window>,
}

impl Page {
    /// Writes the lines of `listed`, a batch at a time, to `chunks`; stops when the
    /// client goes away, or with an error line when the store fails. Each batch's
    /// counters are read here, its lines written on the idle thread ([`idle`]).
    async fn write(self, listed: Vec<Listed>, chunks: mpsc::Sender<Bytes>) {
        let format = self.lines.format;
        if !format.head().is_empty() && chunks.send(Bytes::from(format.head())).await.is_err() {
            return;
        }
        for batch in listed.chunks(BATCH) {
            let reads = batch.iter().map(|listed| self.read(listed));
            let mut counted = Vec::with_capacity(batch.len());
            let mut failed = None;
            for read in all(reads.collect()).await {
                match read {
                    Ok(Some(read)) => counted.push(read),
                    Ok(None) => {}
                    Err(err) => {
                        failed = Some(err.to_string());
                        break;
                    }
                }
            }
            let lines = Arc::clone(&self.lines);
            let mut text = idle::run(move || lines.text(&counted)).await;
            if let Some(why) = &failed {
                format.error(why, &mut text);
            }
            if !text.is_empty() && chunks.send(Bytes::from(text)).await.is_err() {
                return;
            }
            if failed.is_some() {
                return;
            }
        }
    }

    /// One caller's counters, or `None` if `min_ratio` leaves it out.
    async fn read(&self, listed: &Listed) -> Result<Option<Counted>, crate::store::StoreError> {
        let snapshot = &self.lines.snapshot;
        let plan = self.plans[listed.scope];
        let consumer = self.lines.consumers.get(&listed.caller).copied();
        let PlanLimit::Limits(limits) = snapshot.limits_for(self.policy, plan, consumer) else {
            return Ok(None);
        };
        let now = snapshot.instant(self.now_ms, limits, snapshot.anchor(consumer));
        let mut report = Report::default();
        (self.store)
            .peek_listed(&limits.scope, listed, &now, &mut report)
            .await?;
        let windows: Vec<Window> = (report.iter().filter(|s| !s.total))
            .map(|s| {
                let reset_after = ceil_secs(s.reset_ms);
                Window {
                    window: s.quota.window.name(),
                    used: s.used,
                    limit: s.quota.limit.get(),
                    resets_at: report.at_ms / 1000 + reset_after,
                    reset_after,
                }
            })
            .collect();
        let ratio = |w: &Window| f64::from(w.used) / f64::from(w.limit);
        if let Some(min) = self.min_ratio
            && !windows.iter().any(|w| ratio(w) >= min)
        {
            return Ok(None);
        }
        let parts = match self.keyed && consumer.is_none() {
            true => self.store.key_parts(&limits.scope, listed).await?,
            false => None,
        };
        Ok(Some(Counted {
            caller: listed.caller,
            plan,
            parts,
            windows,
        }))
    }
}

/// What turns a batch's counters into its lines, on the idle thread.
struct Lines {
    snapshot: Arc<Snapshot>,
    /// The configured consumers by limiter key.
    consumers: HashMap<CallerKey, ConsumerId>,
    format: Format,
}

impl Lines {
    /// The lines of `counted`, in order.
    fn text(&self, counted: &[Counted]) -> String {
        let mut text = String::new();
        for counted in counted {
            let name = |key| caller_name(&self.snapshot, key, &self.consumers);
            let (caller, key) = match &counted.parts {
                Some(parts) => parts::named(parts, name),
                None => (name(counted.caller), None),
            };
            let row = Row {
                caller,
                key,
                plan: self.snapshot.plan_name(counted.plan).to_string(),
                windows: &counted.windows,
            };
            self.format.write(&row, &mut text);
        }
        text
    }
}

/// The configured consumers by limiter key.
fn consumer_keys(snapshot: &Snapshot) -> HashMap<CallerKey, ConsumerId> {
    (0..snapshot.config().consumers.len())
        .map(ConsumerId::new)
        .map(|id| (snapshot.identifier.consumer_key(id), id))
        .collect()
}

/// A limiter key as the admin API names callers: `consumer:NAME`, `ip:ADDR` (an
/// IPv6 caller by its prefix), else `key:HEX` (a keyed bucket whose parts are not
/// known, or a name only an auth layer knew: only digests of those are kept).
fn caller_name(
    snapshot: &Snapshot,
    key: CallerKey,
    consumers: &HashMap<CallerKey, ConsumerId>,
) -> String {
    if let Some(&id) = consumers.get(&key) {
        return format!("consumer:{}", snapshot.consumer_name(id));
    }
    let prefix = snapshot.identifier.ipv6_prefix();
    match key {
        _ if key >> 32 == 0xffff => format!("ip:{}", std::net::Ipv4Addr::from(key as u32)),
        _ if key >> 63 == 0 && prefix <= 64 => {
            let net = std::net::Ipv6Addr::from(u128::from(key) << 64);
            format!("ip:{net}/{prefix}")
        }
        _ => format!("key:{key:016x}"),
    }
}

/// Every future of `futures` run together; their outputs in order.
async fn all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut running: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = running.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, out) in running.iter_mut().zip(done.iter_mut()) {
            if out.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *out = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    done.into_iter().flatten().collect()
}
