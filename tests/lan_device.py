"""A laptop or a phone on the LAN, for tests/test_tls_lan.py: run inside the test's
"device" network namespace (``ip netns exec``), it opens gpulab at its IP address in
Debian's Chromium (a phone's screen and user agent with ``--phone``), logs in, opens
the project's JupyterLab and prints what the person saw as one JSON line.

    python lan_device.py URL USER PASSWORD PROJECT SCREENSHOT [--phone]

Chromium trusts the CA only if $HOME's NSS database does (tls_kit.nss_home).
"""

from __future__ import annotations

import json
import sys

from browser_kit import CHROMIUM, CHROMIUM_ARGS
from playwright.sync_api import expect, sync_playwright


def main(argv: list[str]) -> dict:
    url, user, password, project, shot = argv[:5]
    phone = "--phone" in argv[5:]
    seen: dict = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(**(p.devices["Pixel 7"] if phone else {}))
        page = context.new_page()
        try:
            page.goto(url + "/hub/login")
        except Exception as e:  # noqa: BLE001 - what the person would see, reported
            seen["error"] = str(e).splitlines()[0]
            browser.close()
            return seen
        page.fill("#username_input", user)
        page.fill("#password_input", password)
        page.click("#login_submit")
        page.wait_for_url(url + "/hub/**")
        page.goto(f"{url}/user/{user}/{project}/lab")
        expect(page.locator("#jp-main-dock-panel")).to_be_attached(timeout=90_000)
        page.wait_for_timeout(1500)
        page.screenshot(path=shot)
        seen.update(
            url=page.url,
            origin=page.evaluate("window.location.origin"),
            mobile=page.evaluate("navigator.userAgent").find("Mobile") >= 0,
            width=page.viewport_size["width"] if page.viewport_size else 0,
        )
        browser.close()
    return seen


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
