"""Clicks through `gdn studio` in headless Chromium over WebDriver (Selenium),
as a person would, and checks what the page shows.

Run by crates/gdn/tests/studio.rs after a real service ran a ticket through
the swarm of tests/fixtures/studio (desk + researcher behind the webhook
Connection `tickets`). Arguments: the studio's URL, the webhook's port, a
folder for screenshots. Prints one JSON object per check; exits 1 on the
first failure (its message on stderr).
"""

import json
import sys
import time
import urllib.request

from selenium.webdriver.common.by import By

from browser_support import browser, fail, report, until

URL, WEBHOOK_PORT, SHOTS = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def texts(driver, selector):
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, selector)]


def shot(driver, name):
    path = f"{SHOTS}/{name}.png"
    driver.save_screenshot(path)
    report("screenshot", path=path)


def click(driver, selector):
    element = until(selector, lambda: driver.find_element(By.CSS_SELECTOR, selector))
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    element.click()
    return element


def post(key, text):
    body = json.dumps({"instanceKey": key, "text": text, "event": "ticket"}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{WEBHOOK_PORT}/", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status


def main():
    driver = browser("1500,900")
    try:
        run(driver)
    finally:
        driver.quit()


def run(driver):
    driver.get(URL + "/#view=graph")
    until("the page's first paint", lambda: driver.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
    until("the live stream", lambda: driver.find_element(By.ID, "live").get_attribute("data-state") == "live")
    first_paint = driver.execute_script("return window.__studio.timings.firstPaintFromStart")
    report("first paint", ms=first_paint)

    # The instances of the project.
    instances = until("the instance t-1", lambda: [t for t in texts(driver, "[data-testid=instance]") if "t-1" in t])
    if "desk" not in instances[0] or "researcher" not in instances[0]:
        fail(f"the instance t-1 should list both agents: {instances}")
    report("instances", items=texts(driver, "[data-testid=instance]"))

    # The graph: agents, the connector, tools, edges with counts.
    nodes = until("the graph", lambda: [e.get_attribute("data-node") for e in driver.find_elements(By.CSS_SELECTOR, "[data-node]")])
    for node in ["agent:desk", "agent:researcher", "connector:tickets", "tool:bash__exec", "tool:agents__request"]:
        if node not in nodes:
            fail(f"the graph has no node {node}: {nodes}")
    edges = {
        e.get_attribute("data-edge"): (int(e.get_attribute("data-total")), int(e.get_attribute("data-errors")))
        for e in driver.find_elements(By.CSS_SELECTOR, "g[data-edge]")
    }
    expected = {
        "agent:desk|connector:tickets": (1, 0),     # one webhook event
        "agent:desk|agent:researcher": (2, 0),      # the request and its answer
        "agent:desk|tool:agents__request": (2, 1),  # two calls, the one to 'billing' failed
        "agent:researcher|tool:bash__exec": (2, 0),
    }
    for key, counts in expected.items():
        if edges.get(key) != counts:
            fail(f"edge {key}: expected (total, errors) {counts}, the page shows {edges.get(key)}; all: {edges}")
    report("graph", nodes=nodes, edges={k: list(v) for k, v in edges.items()})
    shot(driver, "graph")

    # An edge's history.
    driver.execute_script(
        "document.querySelector('g[data-edge=\"agent:desk|agent:researcher\"] .hit')"
        ".dispatchEvent(new MouseEvent('click', {bubbles: true}))"
    )
    body = until("the edge's history", lambda: driver.find_element(By.ID, "flyout-body").text)
    if "request to researcher" not in body or "answer to desk@t-1" not in body:
        fail(f"the edge history should show the request and the answer: {body!r}")
    report("edge history", text=body)
    time.sleep(0.3)  # the flyout slides in
    click(driver, "#flyout-close")
    time.sleep(0.3)

    # The flow: lanes, messages and handoffs in time order, tool calls inline.
    t0 = time.time()
    click(driver, "[data-view=flow]")
    lanes = until("the flow's lanes", lambda: [e.get_attribute("data-lane") for e in driver.find_elements(By.CSS_SELECTOR, "[data-lane]")])
    report("flow switch", ms=(time.time() - t0) * 1000)
    if lanes[:3] != ["connector:tickets", "agent:desk", "agent:researcher"]:
        fail(f"lanes: {lanes}")
    rows = [(r.get_attribute("data-subtype"), r.text.replace("\n", " ")) for r in driver.find_elements(By.CSS_SELECTOR, ".flow-row")]
    subtypes = [s for s, _ in rows]
    order = ["connector.accepted", "agent.request.sent", "tool.completed", "agent.response.sent", "tool.failed", "message.assistant"]
    position = 0
    for wanted in order:
        try:
            position = subtypes.index(wanted, position) + 1
        except ValueError:
            fail(f"the flow should show {order} in this order; it shows {rows}")
    joined = " | ".join(t for _, t in rows)
    for needle in ["printer on fire", "request to researcher", "bash__exec → ok", "agents__request → error AGENT_NOT_FOUND",
                   "ticket answered", "research done", "task.completed"]:
        if needle not in joined:
            fail(f"the flow should show {needle!r}: {joined}")
    if " ms" not in joined:
        fail(f"tool calls should show their duration: {joined}")
    report("flow", rows=rows)
    shot(driver, "flow")

    # The trace of the ticket: connector event → desk's turn → steps → model
    # calls → tool calls; the researcher's turn under the call that asked it;
    # the background command's task until it ended, and the turn its end started.
    t0 = time.time()
    click(driver, "[data-view=traces]")
    until("the trace list", lambda: driver.find_elements(By.CSS_SELECTOR, ".trace-item"))
    report("traces switch", ms=(time.time() - t0) * 1000)
    desk = until("the desk's trace", lambda: [e for e in driver.find_elements(By.CSS_SELECTOR, ".trace-item") if "desk turn" in e.text])
    desk[0].click()
    spans = until("the spans", lambda: spans_of(driver) if len(spans_of(driver)) > 8 else None)
    report("trace", spans=spans)
    types = [s["type"] for s in spans]
    for wanted in ["connector", "turn", "step", "model", "tool", "task"]:
        if wanted not in types:
            fail(f"the trace should have a {wanted} span: {spans}")
    if spans[0]["type"] != "connector" or spans[1]["type"] != "turn" or "desk" not in spans[1]["name"]:
        fail(f"the trace should start with the connector's event and the desk's turn: {spans[:3]}")
    researcher = [s for s in spans if s["type"] == "turn" and "researcher" in s["name"]]
    request = [s for s in spans if s["type"] == "tool" and "agents__request → ok" in s["name"]]
    if not researcher or not request or researcher[0]["depth"] <= request[0]["depth"]:
        fail(f"the researcher's turn should be nested under the desk's agents__request call: {spans}")
    failed = [s for s in spans if s["status"] == "failed" and "AGENT_NOT_FOUND" in s["name"]]
    if not failed:
        fail(f"the failed call should show as failed with its code: {spans}")
    task = [s for s in spans if s["type"] == "task"]
    if task[0]["status"] != "completed" or "→ its end's turn" not in task[0]["name"]:
        fail(f"the task should be completed and link to the turn its end started: {task}")
    shot(driver, "trace")

    # Live: a second ticket while the page is open, without reloading it.
    driver.execute_script("window.__notReloaded = true")
    click(driver, "[data-view=flow]")
    until("the flow", lambda: driver.find_elements(By.CSS_SELECTOR, ".flow-row"))
    posted = time.time()
    if post("t-2", "paper jam on floor 3") != 200:
        fail("the webhook refused the second ticket")
    row = until("the second ticket in the flow", lambda: [r for r in driver.find_elements(By.CSS_SELECTOR, ".flow-row[data-subtype='connector.accepted']") if "paper jam" in r.text])
    shown = time.time()
    live = driver.execute_script("return window.__studio.timings.live")
    accepted = [e for e in live if e["subtype"] == "connector.accepted" and "paper jam" in e["detail"]]
    if not accepted:
        fail(f"the accepted event came without the stream: {live}")
    lag = accepted[0]["receivedMs"] - accepted[0]["atMs"]
    report("live", lagMs=lag, postToRowMs=(shown - posted) * 1000)
    if lag > 1000:
        fail(f"the event reached the page {lag} ms after it was written (should be < 1000)")
    if not driver.execute_script("return window.__notReloaded === true"):
        fail("the page was reloaded")
    instances = until("the instance t-2 in the sidebar", lambda: [t for t in texts(driver, "[data-testid=instance]") if "t-2" in t])
    report("live instance", item=instances[0])

    # The new ticket's trace: its task works (3 s), then completes, live.
    click(driver, "[data-view=traces]")
    item = until("the second desk trace", lambda: (lambda desks: desks if len(desks) >= 2 else None)(
        [e for e in driver.find_elements(By.CSS_SELECTOR, ".trace-item") if "desk turn" in e.text]))
    item[0].click()
    working = until("a working task", lambda: [s for s in spans_of(driver) if s["type"] == "task"], timeout=10)
    report("task while it works", status=working[0]["status"])
    if working[0]["status"] == "working":
        shot(driver, "trace-task-working")
    done = until("the task's end", lambda: [s for s in spans_of(driver) if s["type"] == "task" and s["status"] == "completed"], timeout=20)
    report("task ended", span=done[0])
    if not driver.execute_script("return window.__notReloaded === true"):
        fail("the page was reloaded")
    shot(driver, "trace-live")
    report("switches", timings=driver.execute_script("return window.__studio.timings.switches"))


def spans_of(driver):
    out = []
    for row in driver.find_elements(By.CSS_SELECTOR, ".span-row"):
        name = row.find_element(By.CSS_SELECTOR, ".span-name")
        depth = int(float((name.get_attribute("style") or "padding-left:0px").split(":")[1].strip(" px;") or 0) / 16)
        out.append({
            "type": row.get_attribute("data-type"),
            "status": row.get_attribute("data-status"),
            "name": name.text,
            "depth": depth,
        })
    return out


if __name__ == "__main__":
    main()
