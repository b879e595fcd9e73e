"""The status page in a real headless Chromium, driven by Playwright.

Run by tests/status/browser.rs against a running sluice; prints one JSON line of
what it saw and exits non-zero (with the reason on stderr) when something is wrong:

  - without the token the page is refused: a 401 and the login form, no figures;
  - logging in through the form gives the page, with no console error and no
    Content-Security-Policy violation;
  - a burst from one caller puts it at the top of the refused table without a
    reload (the page redraws from /admin/status every 2 s);
  - its ban is listed, and the page's button lifts it: the caller's next request
    is admitted;
  - a screenshot is written.
"""

import argparse
import http.client
import json
import sys
import time

from playwright.sync_api import sync_playwright


def get(gateway_port, path, source):
    conn = http.client.HTTPConnection("127.0.0.1", gateway_port, timeout=10, source_address=(source, 0))
    conn.request("GET", path)
    status = conn.getresponse().status
    conn.close()
    return status


def fail(reason):
    print(reason, file=sys.stderr)
    sys.exit(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--admin", required=True, help="http://127.0.0.1:PORT")
    parser.add_argument("--gateway-port", type=int, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--caller", required=True, help="a loopback address to burst from")
    parser.add_argument("--screenshot", required=True)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    seen = {}
    problems = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))

        # Without the token: refused, the login form and no figures.
        response = page.goto(args.admin + "/")
        seen["without_token"] = response.status
        if response.status != 401:
            fail(f"GET / without the token answered {response.status}")
        if page.locator("table").count() != 0 or page.locator("form[action='/login']").count() != 1:
            fail("the page without the token is not just the login form")
        # The refused page logs its 401 as a console error: not the page's fault.
        problems.clear()

        # Log in through the form.
        page.fill("#token", args.token)
        with page.expect_navigation():
            page.click("button[type=submit]")
        seen["after_login"] = page.url
        if page.locator("#refused").count() != 1:
            fail("no refused table after logging in: " + page.content()[:500])
        page.evaluate("window.sluiceNotReloaded = true")

        # A burst from one caller: 2 admitted, then 429s until it is banned.
        statuses = [get(args.gateway_port, "/tight", args.caller) for _ in range(6)]
        seen["burst"] = statuses
        name = "ip:" + args.caller
        started = time.monotonic()
        page.wait_for_function(
            "name => { const th = document.querySelector('#refused tbody tr th');"
            " return th !== null && th.textContent === name; }",
            arg=name, timeout=10_000)
        seen["refused_top_after_s"] = round(time.monotonic() - started, 2)
        if not page.evaluate("window.sluiceNotReloaded === true"):
            fail("the page was reloaded instead of redrawn")
        page.wait_for_selector(f"#bans button[data-caller='{name}']", timeout=10_000)
        seen["banned_status"] = get(args.gateway_port, "/open", args.caller)
        if seen["banned_status"] != 403:
            fail(f"the banned caller got {seen['banned_status']}")
        page.screenshot(path=args.screenshot, full_page=True)

        # Lift the ban with the page's button (keyboard-reachable: focus, Enter).
        button = page.locator(f"#bans button[data-caller='{name}']")
        button.focus()
        page.keyboard.press("Enter")
        page.wait_for_function(
            "name => !document.querySelector(`#bans button[data-caller='${name}']`)",
            arg=name, timeout=10_000)
        seen["after_lift"] = get(args.gateway_port, "/open", args.caller)
        if seen["after_lift"] != 200:
            fail(f"after the lift the caller got {seen['after_lift']}")
        seen["summary"] = page.text_content("#summary")
        browser.close()
    if problems:
        fail("; ".join(problems))
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
