"""What the studio's browser tests share: a JSON line per check, failing
with a message, waiting with a deadline, and headless Chromium over
WebDriver (Selenium) with a profile of its own.

Imported by browser_test.py and token_browser_test.py (Python puts a
script's own folder first on its import path).
"""

import json
import sys
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service


def report(check, **details):
    print(json.dumps({"check": check, **details}), flush=True)


def fail(message):
    print(message, file=sys.stderr, flush=True)
    sys.exit(1)


def until(what, check, timeout=15.0):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as error:  # a stale element while the page re-renders
            last = error
        time.sleep(0.05)
    fail(f"timed out waiting for {what} (last error: {last})")


def browser(window_size):
    """Headless Chromium of `window_size` ("W,H")."""
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", f"--window-size={window_size}",
    ]:
        options.add_argument(flag)
    options.add_argument("--user-data-dir=" + tempfile.mkdtemp(prefix="studio-chromium-"))
    return webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)
