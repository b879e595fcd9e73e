"""The soak's driver: writes sluice's config, drives mixed traffic, samples sluice's
memory and descriptors every INTERVAL seconds, reloads every 10 s, restarts Redis at
1/3 and 2/3 of the run (STORE=redis), then judges and prints a summary.

  drive.py config   writes the config (environment below) and exits
  drive.py run      drives, samples, judges; exit status 1 when a check fails

Environment (set by benches/soak.sh): SOAK_CONFIG, SOAK_PORT, SOAK_ADMIN, SOAK_UPSTREAM,
SOAK_STORE, SOAK_ON_ERROR, SOAK_REDIS_PORT, SOAK_REDIS_START, SOAK_PID, SOAK_DURATION
(seconds), SOAK_INTERVAL, SOAK_MAX_KEYS, SOAK_CALLERS, SOAK_RATE, SOAK_FD_SLACK.
"""

import hashlib
import http.client
import json
import os
import random
import re
import shlex
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter

ENV = os.environ
PORT = int(ENV.get("SOAK_PORT", "0"))
ADMIN = int(ENV.get("SOAK_ADMIN", "0"))
UPSTREAM = int(ENV.get("SOAK_UPSTREAM", "0"))
STORE = ENV.get("SOAK_STORE", "memory")
REDIS_PORT = int(ENV.get("SOAK_REDIS_PORT", "0") or 0)
# Redis only. "deny": a request Redis cannot decide gets 503 (store down), the one 5xx
# the soak expects, and the limits stay exact. "local" and "allow" decide such requests
# without Redis, so the exactness checks are printed but not judged.
ON_ERROR = ENV.get("SOAK_ON_ERROR", "deny") if STORE == "redis" else None
EXACT_JUDGED = ON_ERROR in (None, "deny")
DURATION = float(ENV.get("SOAK_DURATION", "1800"))
INTERVAL = float(ENV.get("SOAK_INTERVAL", "60"))
MAX_KEYS = int(ENV.get("SOAK_MAX_KEYS", "2000"))
CALLERS = int(ENV.get("SOAK_CALLERS", "6000"))
RATE = float(ENV.get("SOAK_RATE", "1"))
FD_SLACK = int(ENV.get("SOAK_FD_SLACK", "16"))
RSS_RATIO = 1.10
RELOAD_EVERY = 10.0

# The exactness callers: registered consumers, never evicted by the churn.
EXACT_KEY = "soak-exact-key"
SLIDING_KEY = "soak-sliding-key"
# An hour's limit the run never outlives: exactly EXACT_LIMIT of EXACT_SENT admitted.
EXACT_LIMIT = 100
EXACT_SENT = 3 * EXACT_LIMIT
# A minute's limit driven at 1 request a second: the window slides all run long.
SLIDING_LIMIT = 20
CHURN_PER_MINUTE = 5
HOT_CALLERS = 20


def config_text(generation):
    redis = ""
    if STORE == "redis":
        redis = f'url = "redis://127.0.0.1:{REDIS_PORT}/0"\non_error = "{ON_ERROR}"\n'
    exact_window = "per_hour" if DURATION < 3300 else "per_day"
    return f"""# Written by benches/soak.sh; rewritten every {RELOAD_EVERY:.0f} s (generation {generation}).
[server]
listen = "127.0.0.1:{PORT}"
worker_threads = 1
max_connections = 10000
idle_timeout = "60s"

[admin]
listen = "127.0.0.1:{ADMIN}"

[log]
access = "off"

[identity]
api_key_header = "x-api-key"
trusted_proxies = ["127.0.0.1"]

[store]
backend = "{STORE}"
max_keys = {MAX_KEYS}
{redis}
[upstreams.up]
targets = ["http://127.0.0.1:{UPSTREAM}"]

[policies.churn]
anonymous = {{ per_minute = {CHURN_PER_MINUTE}, per_day = {1_000_000 + generation % 2} }}
registered = {{ per_minute = 1000 }}

[policies.exact]
anonymous = "deny"
registered = {{ {exact_window} = {EXACT_LIMIT} }}

[policies.sliding]
anonymous = "deny"
registered = {{ per_minute = {SLIDING_LIMIT} }}

[[consumers]]
name = "soak-exact"
plan = "registered"
key_sha256 = "{hashlib.sha256(EXACT_KEY.encode()).hexdigest()}"

[[consumers]]
name = "soak-sliding"
plan = "registered"
key_sha256 = "{hashlib.sha256(SLIDING_KEY.encode()).hexdigest()}"

[[routes]]
name = "exact"
path_prefix = "/exact/count"
upstream = "up"
policy = "exact"

[[routes]]
name = "sliding"
path_prefix = "/exact/sliding"
upstream = "up"
policy = "sliding"

[[routes]]
name = "all"
path_prefix = "/"
upstream = "up"
policy = "churn"
"""


def write_config(generation):
    path = ENV["SOAK_CONFIG"]
    with open(path + ".new", "w") as f:
        f.write(config_text(generation))
    os.replace(path + ".new", path)


# ---- shared state -------------------------------------------------------------------

stop = threading.Event()
lock = threading.Lock()
# (component, class) -> count; the class is a status class ("2xx"), STORE_DOWN (a 503
# with the store-down problem body, which with on_error = "deny" is configured), or
# "error" (no answer).
tally = Counter()
statuses = Counter()  # (component, status) -> count, for the exactness callers
events = []  # (seconds since start, text)
START = time.monotonic()
STORE_DOWN = "503 store down"
# h2load reports status classes only: its 5xx are told apart by sluice's metrics.
H2_5XX = "5xx, body unseen"
ANSWERS = ("1xx", "2xx", "3xx", "4xx", "5xx", STORE_DOWN, H2_5XX)
# What sluice's refusal says when the store cannot decide and on_error = "deny".
STORE_DOWN_DETAIL = "the rate limit store is unavailable; try again shortly"


def answer_class(status, body):
    """A status's class for the tally: a 503 whose problem body is sluice's store-down
    refusal is STORE_DOWN, any other 5xx stays "5xx"."""
    if status == 503:
        try:
            problem = json.loads(body)
        except ValueError:
            problem = None
        if (isinstance(problem, dict) and problem.get("status") == 503
                and problem.get("detail") == STORE_DOWN_DETAIL):
            return STORE_DOWN
    return f"{status // 100}xx"


def note(component, status, body=b""):
    with lock:
        if status is None:
            tally[(component, "error")] += 1
        else:
            tally[(component, answer_class(status, body))] += 1
            statuses[(component, status)] += 1


def event(text):
    with lock:
        events.append((time.monotonic() - START, text))
    print(f"  [{(time.monotonic() - START) / 60:5.1f} min] {text}", flush=True)


def caller():
    """A caller address: a fifth of requests from a few hot callers (limited), the
    rest from a pool of CALLERS, three times max_keys (the table churns)."""
    if random.random() < 0.2:
        return f"10.200.0.{random.randrange(HOT_CALLERS)}"
    i = random.randrange(CALLERS)
    return f"10.1.{i >> 8}.{i & 255}"


def paced(rate):
    """Yields until stop, sleeping so the loop runs `rate` times a second."""
    period = 1.0 / rate
    due = time.monotonic()
    while not stop.is_set():
        due += period
        yield
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            due = time.monotonic()


def get(conn, path, headers):
    """One request on `conn`: (status, body, whether the server closes)."""
    conn.request("GET", path, headers=headers)
    resp = conn.getresponse()
    return resp.status, resp.read(), resp.will_close


# ---- traffic ------------------------------------------------------------------------

def keep_alive(rate):
    """Keep-alive HTTP/1.1, callers from X-Forwarded-For (127.0.0.1 is trusted)."""
    conn = None
    for _ in paced(rate):
        try:
            conn = conn or http.client.HTTPConnection("127.0.0.1", PORT, timeout=10)
            status, body, closes = get(conn, "/api/ka", {"x-forwarded-for": caller()})
            note("keep-alive", status, body)
            if closes:
                conn.close()
                conn = None
        except (OSError, http.client.HTTPException):
            note("keep-alive", None)
            conn = None


def new_connections(rate):
    """One request per connection; half from their own source address 127.x.y.z
    (not a trusted proxy: the address is the caller), half through X-Forwarded-For."""
    for _ in paced(rate):
        source, headers = None, {"connection": "close"}
        if random.random() < 0.5:
            i = random.randrange(CALLERS)
            source = (f"127.{2 + (i >> 16)}.{(i >> 8) & 255}.{i & 255}", 0)
        else:
            headers["x-forwarded-for"] = caller()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=10,
                                              source_address=source)
            status, body, _ = get(conn, "/api/new", headers)
            note("new-conn", status, body)
            conn.close()
        except (OSError, http.client.HTTPException):
            note("new-conn", None)


def cutters(rate):
    """Streamed responses (1 MiB, chunked, about a second long) that clients cut:
    before the answer, after the head, mid-body with FIN or with RST; one in ten is
    read to its end."""
    kinds = ["before", "head", "fin", "rst", "rst", "fin", "head", "fin", "rst", "full"]
    for _ in paced(rate):
        kind = random.choice(kinds)
        s = socket.socket()
        s.settimeout(10)
        try:
            s.connect(("127.0.0.1", PORT))
            s.sendall(f"GET /stream/cut HTTP/1.1\r\nhost: soak\r\n"
                      f"x-forwarded-for: {caller()}\r\n\r\n".encode())
            if kind == "before":
                time.sleep(0.005)
                with lock:
                    tally[("cut", "before the answer")] += 1
                continue
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = s.recv(65536)
                if not chunk:
                    raise ConnectionError("closed before the head")
                data += chunk
            status = int(data.split(b" ", 2)[1])
            if status != 200:
                note("cut", status, refusal_body(s, data))
                continue
            note("cut", status)
            if kind == "head":
                continue
            want = {"fin": 65536, "rst": 200_000, "full": None}[kind]
            got = len(data)
            while want is None or got < want:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += len(chunk)
                if want is None and chunk.endswith(b"0\r\n\r\n"):
                    break
            if kind == "rst":
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if kind == "full":
                with lock:
                    tally[("cut", "read-whole")] += 1
        except (OSError, ValueError, IndexError):
            note("cut", None)
        finally:
            s.close()


def refusal_body(s, data):
    """The body of a refusal (Content-Length framed) whose head is in `data`."""
    head, _, body = data.partition(b"\r\n\r\n")
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    want = int(m.group(1)) if m else 0
    while len(body) < want:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return body


def h2_bursts(every):
    """HTTP/2 (h2c, prior knowledge) bursts from h2load, one caller per burst."""
    n = 0
    while not stop.wait(every if n else 2):
        n += 1
        xff = f"10.250.0.{n % 50}"
        try:
            out = subprocess.run(
                ["h2load", "-n", str(int(400 * RATE)), "-c", "2", "-m", "8",
                 "-H", f"x-forwarded-for: {xff}", f"http://127.0.0.1:{PORT}/h2/burst"],
                capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired):
            note("h2", None)
            continue
        m = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
        # "failed" counts every answer but 2xx and 3xx; "errored", those with none.
        r = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, \d+ succeeded, "
                      r"\d+ failed, (\d+) errored", out)
        if not m or not r:
            note("h2", None)
            continue
        with lock:
            for cls, v in zip(["2xx", "3xx", "4xx", H2_5XX], m.groups()):
                tally[("h2", cls)] += int(v)
            tally[("h2", "error")] += int(r.group(3)) + int(r.group(1)) - int(r.group(2))


def consumer(component, path, key, gap, count):
    """A registered consumer at one request every `gap` seconds (`count` in all, or
    until the end), straight through the Redis restarts: with on_error = "deny" a
    request Redis cannot decide is refused with 503, never counted elsewhere."""
    conn, sent = None, 0
    for _ in paced(1.0 / gap):
        if count is not None and sent >= count:
            break
        try:
            conn = conn or http.client.HTTPConnection("127.0.0.1", PORT, timeout=10)
            status, body, _ = get(conn, path, {"x-api-key": key})
            note(component, status, body)
            sent += 1
        except (OSError, http.client.HTTPException):
            note(component, None)
            conn = None
    with lock:
        tally[(component, "sent")] = sent


# ---- control: reloads, Redis restarts, samples ---------------------------------------

def admin(path, method="GET"):
    req = urllib.request.Request(f"http://127.0.0.1:{ADMIN}{path}", method=method)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, resp.read().decode()


def metrics():
    """The metrics as {name: [(labels, value)]}."""
    out = {}
    for line in admin("/metrics")[1].splitlines():
        m = re.match(r"^([a-z_:]+)(\{[^}]*\})? ([0-9.eE+-]+|NaN)$", line)
        if m:
            out.setdefault(m.group(1), []).append((m.group(2) or "", float(m.group(3))))
    return out


def metric(ms, name, label=""):
    return sum(v for labels, v in ms.get(name, []) if label in labels)


def reloader():
    """Every 10 s: a rewritten file (the watcher reloads), then POST /admin/reload."""
    generation = 0
    while not stop.wait(RELOAD_EVERY):
        generation += 1
        try:
            if generation % 2:
                write_config(generation)
            else:
                status, body = admin("/admin/reload", "POST")
                if status != 200:
                    event(f"reload refused: {status} {body}")
        except OSError as e:
            event(f"reload failed: {e}")
    with lock:
        tally[("reload", "ticks")] = generation


def redis_ping():
    try:
        return subprocess.run(["redis-cli", "-p", str(REDIS_PORT), "ping"],
                              capture_output=True, text=True, timeout=5).stdout.strip() == "PONG"
    except (OSError, subprocess.TimeoutExpired):
        return False


def restart_redis(n):
    event(f"Redis restart {n}: shutdown (saving), down for 3 s")
    subprocess.run(["redis-cli", "-p", str(REDIS_PORT), "shutdown", "save"],
                   capture_output=True, timeout=30)
    time.sleep(3)
    subprocess.run(shlex.split(ENV["SOAK_REDIS_START"]), capture_output=True, timeout=30)
    deadline = time.monotonic() + 30
    while not redis_ping() and time.monotonic() < deadline:
        time.sleep(0.2)
    while time.monotonic() < deadline:
        try:
            if metric(metrics(), "sluice_store_fallback") == 0:
                break
        except OSError:
            pass
        time.sleep(0.5)
    event(f"Redis restart {n}: back, sluice out of fallback")


def redis_restarts():
    for n, at in ((1, DURATION / 3), (2, 2 * DURATION / 3)):
        if stop.wait(max(0.0, START + at - time.monotonic())):
            return
        restart_redis(n)


samples = []  # (minute, rss KiB, fds, tracked callers)


def sample(pid):
    with open(f"/proc/{pid}/status") as f:
        rss = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    ms = metrics()
    return rss, fds, ms


def fmt_counts(ms):
    with lock:
        sent = sum(v for (c, k), v in tally.items() if k in ANSWERS)
        down = sum(v for (c, k), v in tally.items() if k == STORE_DOWN)
        fivexx = sum(v for (c, k), v in tally.items() if k in ("5xx", H2_5XX))
        errors = sum(v for (c, k), v in tally.items() if k == "error")
    return (f"{sent:>9} {down:>5} {fivexx:>5} {errors:>6} "
            f"{int(metric(ms, 'sluice_evicted_callers_total')):>9} "
            f"{int(metric(ms, 'sluice_config_reloads_total', 'ok')):>7}")


def monitor(pid):
    # 503sd: 503 with the store-down body; 5xx: every other 5xx (h2load's included).
    print(f"{'min':>5} {'rss MiB':>8} {'fds':>5} {'tracked':>8} {'requests':>9} {'503sd':>5} "
          f"{'5xx':>5} {'errors':>6} {'evicted':>9} {'reloads':>7}", flush=True)
    n = 0
    while not stop.wait(max(0.0, START + (n + 1) * INTERVAL - time.monotonic())):
        n += 1
        try:
            rss, fds, ms = sample(pid)
        except (OSError, AttributeError) as e:
            event(f"sample failed: {e}")
            continue
        tracked = int(metric(ms, "sluice_tracked_callers"))
        samples.append((n * INTERVAL / 60, rss, fds, tracked))
        print(f"{n * INTERVAL / 60:5.1f} {rss / 1024:8.1f} {fds:5} {tracked:8} {fmt_counts(ms)}",
              flush=True)


# ---- judging -------------------------------------------------------------------------

def max_in_window(times, width):
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - width:
            j += 1
        best = max(best, i - j + 1)
    return best


def judge(pid, upstream):
    checks = []  # (name, ok, detail)
    n = len(samples)
    if n >= 3:
        second = [s[1] for s in samples[n // 3: 2 * n // 3]]
        last = [s[1] for s in samples[2 * n // 3:]]
        ratio = statistics.median(last) / statistics.median(second)
        checks.append(("RSS flat (median last third / second third)", ratio <= RSS_RATIO,
                       f"{statistics.median(second) / 1024:.1f} -> "
                       f"{statistics.median(last) / 1024:.1f} MiB, {ratio:.3f} (<= {RSS_RATIO})"))
        fd2 = statistics.median(s[2] for s in samples[n // 3: 2 * n // 3])
        fd3 = statistics.median(s[2] for s in samples[2 * n // 3:])
        checks.append(("fds flat (median last third vs second third)", fd3 <= fd2 + FD_SLACK,
                       f"{fd2:g} -> {fd3:g} (<= +{FD_SLACK})"))
        top = max(s[3] for s in samples)
        checks.append(("tracked callers within max_keys", top <= MAX_KEYS + 2,
                       f"at most {top} (max_keys {MAX_KEYS}, 2 consumers reserved)"))
    else:
        checks.append(("enough samples", False, f"{n} samples (need 3)"))

    with lock:
        t = Counter(tally)
        st = Counter(statuses)
    # With on_error = "local" or "allow", requests Redis could not decide in time were
    # decided without it: exactness is printed, not judged ("info").
    def judged(ok):
        return ok if EXACT_JUDGED else None

    unjudged = ("" if EXACT_JUDGED else
                f"; not judged: on_error = \"{ON_ERROR}\" decides without Redis")
    sent = t[("exact", "sent")]
    ok, refused = st[("exact", 200)], st[("exact", 429)]
    down, lost = t[("exact", STORE_DOWN)], t[("exact", "error")]
    upstream_exact = upstream["requests"].get("exact/count", 0)
    # Never more than the limit, nor more than the requests sluice could decide. A 503
    # (store down) or a lost answer may still have been counted in Redis (its call timed
    # out after the script ran), so each one may leave the limit one short.
    most = min(EXACT_LIMIT, sent - down)
    least = max(0, min(sent - down, EXACT_LIMIT - down - lost))
    exact_ok = (least <= ok <= most and upstream_exact == ok
                and refused == sent - ok - down)
    checks.append(("exactness: the limit admitted, never more", judged(exact_ok),
                   f"sent {sent}, 200 {ok} (upstream {upstream_exact}), 429 {refused}, "
                   f"503 store down {down}, no answer {lost}; limit {EXACT_LIMIT} per window "
                   f"longer than the run, admitted must be {least}..{most}{unjudged}"))
    arrivals = sorted(upstream["sliding"])
    worst = max_in_window(arrivals, 60 - 0.5)
    s_ok, s_429 = st[("sliding", 200)], st[("sliding", 429)]
    checks.append(("sliding window: no 60 s with more than the limit",
                   judged(worst <= SLIDING_LIMIT),
                   f"busiest 59.5 s at the upstream: {worst} (limit {SLIDING_LIMIT}/min); "
                   f"200 {s_ok}, 429 {s_429}, 503 store down {t[('sliding', STORE_DOWN)]}"
                   f"{unjudged}"))

    ms = metrics()
    # The only configured 5xx: 503 store down, with on_error = "deny". Clients check
    # each HTTP/1.1 503's body; h2load gives classes only, so sluice's side must show
    # that every 5xx it sent was such a refusal (outcome "unavailable"; no concurrency
    # caps are configured, so that is the store), none from the upstream or a failure.
    deny = ON_ERROR == "deny"
    client_down = sum(v for (c, k), v in t.items() if k == STORE_DOWN)
    client_other = sum(v for (c, k), v in t.items() if k == "5xx")
    client_h2 = t[("h2", H2_5XX)]
    sluice_5xx = metric(ms, "sluice_responses_total", 'code="5xx"')
    sluice_down = metric(ms, "sluice_requests_total", 'outcome="unavailable"')
    if deny:
        fine = (client_other == 0 and sluice_5xx == sluice_down
                and client_down + client_h2 <= sluice_down)
        name = "no 5xx but 503 store down (on_error = deny)"
    else:
        fine = client_other + client_down + client_h2 == 0 and sluice_5xx == 0
        name = "no 5xx (none configured)"
    checks.append((name, fine,
                   f"clients: 503 store down {client_down}, HTTP/2 5xx {client_h2}, other 5xx "
                   f"{client_other}; sluice: 5xx {sluice_5xx:g}, of them refused as "
                   f"unavailable {sluice_down:g}"))
    requests = sum(v for (c, k), v in t.items() if k in ANSWERS)
    errors = sum(v for (c, k), v in t.items() if k == "error")
    checks.append(("client errors (failed connections) under 0.1 %",
                   errors <= requests / 1000,
                   f"{errors} of {requests}"))
    reload_ok = metric(ms, "sluice_config_reloads_total", 'result="ok"')
    reload_err = metric(ms, "sluice_config_reloads_total", 'result="error"')
    ticks = t[("reload", "ticks")]
    checks.append(("reloads every 10 s, none failed", reload_err == 0 and reload_ok >= ticks * 0.9,
                   f"{ticks} reload ticks, {reload_ok:g} ok, {reload_err:g} errors"))

    print("\n== soak summary ==")
    store = STORE + (f" (on_error = {ON_ERROR})" if ON_ERROR else "")
    print(f"store {store}, {DURATION / 60:g} min, max_keys {MAX_KEYS}, {CALLERS} + "
          f"{HOT_CALLERS} hot callers, sluice pid {pid}")
    if samples:
        first, mid, end = samples[0], samples[len(samples) // 2], samples[-1]
        print(f"RSS MiB  start {first[1] / 1024:.1f}  middle {mid[1] / 1024:.1f}  "
              f"end {end[1] / 1024:.1f}  (max {max(s[1] for s in samples) / 1024:.1f})")
        print(f"fds      start {first[2]}  middle {mid[2]}  end {end[2]}  "
              f"(max {max(s[2] for s in samples)})")
        print(f"tracked  start {first[3]}  middle {mid[3]}  end {end[3]}")
    comps = sorted({c for c, _ in t if c not in ("reload",)})
    print(f"\n{'traffic':<11} {'2xx':>8} {'4xx':>8} {'503sd':>6} {'5xx':>5} {'errors':>6}")
    for c in comps:
        print(f"{c:<11} {t[(c, '2xx')]:>8} {t[(c, '4xx')]:>8} {t[(c, STORE_DOWN)]:>6} "
              f"{t[(c, '5xx')] + t[(c, H2_5XX)]:>5} {t[(c, 'error')]:>6}")
    print(f"{'total':<11} {sum(t[(c, '2xx')] for c in comps):>8} "
          f"{sum(t[(c, '4xx')] for c in comps):>8} {client_down:>6} "
          f"{client_other + client_h2:>5} {errors:>6}")
    print("(503sd: 503 with the store-down problem body; 5xx: any other, HTTP/2's unseen)")
    print(f"streams at the upstream: {dict(upstream['streams'])}; read whole by clients: "
          f"{t[('cut', 'read-whole')]}; cut before the answer: {t[('cut', 'before the answer')]}")
    limited = metric(ms, "sluice_requests_total", 'outcome="limited"')
    print(f"sluice: 429s {limited:g}, "
          f"evicted callers {metric(ms, 'sluice_evicted_callers_total'):g}, "
          f"store errors {metric(ms, 'sluice_store_errors_total'):g}")
    for at, text in events:
        print(f"event at {at / 60:.1f} min: {text}")
    print(f"\n{'check':<52} {'':4} detail")
    for name, ok, detail in checks:
        verdict = "info" if ok is None else "ok" if ok else "FAIL"
        print(f"{name:<52} {verdict:4} {detail}")
    return all(ok is not False for _, ok, _ in checks)


def run():
    pid = int(ENV["SOAK_PID"])
    threads = [
        threading.Thread(target=keep_alive, args=(40 * RATE,)),
        threading.Thread(target=keep_alive, args=(40 * RATE,)),
        threading.Thread(target=new_connections, args=(15 * RATE,)),
        threading.Thread(target=cutters, args=(4 * RATE,)),
        threading.Thread(target=h2_bursts, args=(20,)),
        threading.Thread(target=consumer, args=(
            "exact", "/exact/count", EXACT_KEY, DURATION * 0.8 / EXACT_SENT, EXACT_SENT)),
        threading.Thread(target=consumer, args=("sliding", "/exact/sliding", SLIDING_KEY, 1.0, None)),
        threading.Thread(target=reloader),
        threading.Thread(target=monitor, args=(pid,)),
    ]
    if STORE == "redis":
        threads.append(threading.Thread(target=redis_restarts))
    for th in threads:
        th.daemon = True
        th.start()
    stop.wait(DURATION)
    stop.set()
    for th in threads:
        th.join(timeout=70)
    time.sleep(1)
    with urllib.request.urlopen(f"http://127.0.0.1:{UPSTREAM}/__counts", timeout=10) as r:
        upstream = json.loads(r.read())
    return 0 if judge(pid, upstream) else 1


if __name__ == "__main__":
    if sys.argv[1:] == ["config"]:
        write_config(0)
    elif sys.argv[1:] == ["run"]:
        sys.exit(run())
    else:
        sys.exit(__doc__)
