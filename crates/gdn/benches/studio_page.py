"""The page part of `cargo bench -p gdn --bench studio`: opens the studio in
headless Chromium (Selenium), and measures the first paint (from the start
of navigation to the first view drawn with its data), view switches (click
to the view drawn), and how late lines appended to an event log reach the
page over the live stream. Arguments: the studio's URL, an events.jsonl to
append to. Prints a Markdown table."""

import json
import statistics
import sys
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

URL, LOG = sys.argv[1], sys.argv[2]

options = webdriver.ChromeOptions()
options.binary_location = "/usr/bin/chromium"
for flag in ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", "--window-size=1500,900", "--user-data-dir=" + tempfile.mkdtemp()]:
    options.add_argument(flag)
driver = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)


def wait(check, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.01)
    raise SystemExit("timed out")


def switches():
    return driver.execute_script("return window.__studio.timings.switches")


rows = []
try:
    for attempt in range(3):
        driver.get(URL + "/?attempt=" + str(attempt) + "#view=graph")
        wait(lambda: driver.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
        rows.append(("first paint (graph, whole project)", driver.execute_script("return window.__studio.timings.firstPaint")))
    wait(lambda: driver.find_element(By.ID, "live").get_attribute("data-state") == "live")
    for view in ["flow", "traces", "graph", "flow", "traces", "graph"]:
        before = len(switches())
        driver.find_element(By.CSS_SELECTOR, f"[data-view={view}]").click()
        wait(lambda: len(switches()) > before)
        rows.append((f"switch to {view}", switches()[-1]["ms"]))
    driver.find_element(By.CSS_SELECTOR, "[data-view=traces]").click()
    for index in [1, 2, 3]:
        before = len(switches())
        driver.find_elements(By.CSS_SELECTOR, ".trace-item")[index].click()
        wait(lambda: len(switches()) > before)
        rows.append(("open a trace", switches()[-1]["ms"]))
    driver.find_element(By.CSS_SELECTOR, "[data-view=flow]").click()
    for key in ["k-7", "k-8"]:
        before = len(switches())
        driver.find_element(By.CSS_SELECTOR, f"[data-testid=instance][data-key='{key}']").click()
        wait(lambda: len(switches()) > before)
        rows.append(("switch to one instance (flow)", switches()[-1]["ms"]))
    before = len(switches())
    driver.find_element(By.CSS_SELECTOR, "[data-testid=scope-project]").click()
    wait(lambda: len(switches()) > before)
    rows.append(("back to the whole project (flow)", switches()[-1]["ms"]))

    # Live: 20 tool calls appended to an agent's event log, 100 ms apart.
    for i in range(20):
        now = int(time.time() * 1000)
        line = {"type": "tool.completed", "traceId": "f" * 32, "spanId": f"{i:016x}", "parentSpanId": "e" * 16,
                "timestamp": now, "agentName": "desk", "instanceKey": "k-7", "turnId": "live",
                "toolCallId": f"live{i}", "toolName": "bash__exec", "status": "ok", "duration": 1.0}
        with open(LOG, "a") as log:
            log.write(json.dumps(line) + "\n")
        time.sleep(0.1)
    wait(lambda: len([e for e in driver.execute_script("return window.__studio.timings.live") if e["atMs"] and e["subtype"] == "tool.completed"]) >= 20)
    live = [e["receivedMs"] - e["atMs"] for e in driver.execute_script("return window.__studio.timings.live")]
    shown = driver.execute_script("return document.querySelectorAll('.flow-row[data-subtype=\"tool.completed\"]').length")
finally:
    driver.quit()

print("| page | ms |\n|---|---|")
for name, ms in rows:
    print(f"| {name} | {ms:.0f} |")
print(f"| live: log line written → on the page (median of {len(live)}) | {statistics.median(live):.0f} |")
print(f"| live: worst | {max(live):.0f} |")
