"""`gdn studio` with a token, in headless Chromium over WebDriver (Selenium):
the URL `gdn studio` printed (with `?token=`) opens the page, whose own
requests — the data API and the live stream — then carry the session cookie
it set; the cookie is out of the page's scripts' reach (HttpOnly), the page
without the token in its URL still works in the same browser, and a browser
without the cookie is refused.

Run by crates/gdn/tests/studio.rs. Arguments: the printed URL and the
instance key the page must list. Prints one JSON object per check; exits 1
on the first failure (its message on stderr).
"""

import sys

from selenium.webdriver.common.by import By

from browser_support import browser, fail, report, until

URL, KEY = sys.argv[1], sys.argv[2]
BASE = URL.split("/?token=")[0]


def shows_the_studio(driver, what):
    until(f"{what}: the page's first paint", lambda: driver.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
    items = until(f"{what}: the instance {KEY}", lambda: [
        e.text for e in driver.find_elements(By.CSS_SELECTOR, "[data-testid=instance]") if KEY in e.text
    ])
    until(f"{what}: the live stream", lambda: driver.find_element(By.ID, "live").get_attribute("data-state") == "live")
    return items


def main():
    driver = browser("1200,800")
    try:
        driver.get(URL)
        items = shows_the_studio(driver, "the printed URL")
        report("token url", instances=items)
        cookie = driver.execute_script("return document.cookie")
        if cookie != "":
            fail(f"the page's scripts can read a cookie: {cookie!r}")
        cookies = driver.get_cookies()
        session = [c for c in cookies if c["name"].startswith("gdn-studio-")]
        if not session or not session[0].get("httpOnly") or session[0].get("sameSite") != "Strict":
            fail(f"the session cookie should be HttpOnly and SameSite=Strict: {cookies}")
        report("cookie", httpOnly=session[0]["httpOnly"], sameSite=session[0]["sameSite"])
        # The same browser, the URL without the token: the cookie suffices.
        driver.get(BASE + "/#view=flow")
        report("cookie only", instances=shows_the_studio(driver, "the URL without the token"))
    finally:
        driver.quit()

    # Another browser, without the cookie: refused.
    other = browser("1200,800")
    try:
        other.get(BASE + "/")
        text = until("the refusal", lambda: other.find_element(By.TAG_NAME, "body").text)
        if "unauthorized" not in text:
            fail(f"a browser without the token should be refused: {text!r}")
        report("no token", text=text)
    finally:
        other.quit()


if __name__ == "__main__":
    main()
