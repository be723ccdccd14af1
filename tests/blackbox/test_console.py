"""The inspector console in a real browser (headless Chromium through Selenium) against
the real binary: sign-in, users, a supersession chain, recall with explanations,
retraction, read-only tokens, stored texts that look like markup, and tenants."""

import shutil
import time
import uuid
from pathlib import Path

import pytest
from conftest import cluster_url, delete_indices, wait_for
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as ready
from selenium.webdriver.support.ui import Select, WebDriverWait

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "src" / "console"
SCRIPT_TEXT = "<script>window.__pwned = 1</script> likes jazz"
IMAGE_TEXT = '<img src=x onerror="window.__pwned = 2"> owns a boat'


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("no Chromium found (scripts/test installs Debian's chromium and chromium-driver)")


@pytest.fixture
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = chromium()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900",
                     "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"),
                              options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


def wait(driver, condition, seconds=10):
    return WebDriverWait(driver, seconds).until(condition)


def css(selector):
    return (By.CSS_SELECTOR, selector)


def sign_in(driver, base, token):
    driver.get(f"{base}/ui")
    area = wait(driver, ready.presence_of_element_located(css("#token")))
    area.send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#sign-in button[type=submit]").click()
    wait(driver, ready.presence_of_element_located(css("#tenant")))


def shot(driver, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / f"{name}.png"))


def seed(server):
    admin = server.mint("acme")
    base = "/v1/users/alice"
    porto = server.call("POST", f"{base}/facts", token=admin, body={"text": "The user lives in Porto."}).json()
    lisbon = server.call("POST", f"{base}/facts", token=admin,
                         body={"text": "The user lives in Lisbon.", "supersedes": porto["fact"]["id"]}).json()
    for text in (SCRIPT_TEXT, IMAGE_TEXT, "The user works at Nimbus."):
        assert server.call("POST", f"{base}/facts", token=admin, body={"text": text}).status == 201
    assert server.call("POST", f"{base}/episodes", token=admin, body={
        "messages": [{"role": "user", "content": "I moved from Porto to Lisbon for a job at Nimbus."}],
        "session_id": "s1", "consolidate": "none"}).status == 201
    other = server.mint("globex")
    assert server.call("POST", "/v1/users/globex-user/facts", token=other,
                       body={"text": "The user is a Globex secret."}).status == 201
    return admin, porto["fact"], lisbon["fact"]


def on_backend(backend, make_server, extra_env=None):
    """The service on the embedded store or on the OpenSearch test node, yielded and then
    cleaned up."""
    extra_env = dict(extra_env or {})
    if backend == "embedded":
        yield make_server(extra_env=extra_env).start()
        return
    url = cluster_url("opensearch")
    prefix = f"cairn-ui-{uuid.uuid4().hex[:12]}"
    server = make_server(extra_env={**extra_env, "CAIRN_BACKEND": "opensearch", "CAIRN_CLUSTER_URL": url,
                                    "CAIRN_INDEX_PREFIX": prefix}).start()
    assert wait_for(lambda: server.call("GET", "/readyz").status == 200, 60), "the cluster store never became ready"
    try:
        yield server
    finally:
        server.stop()
        delete_indices(url, prefix)


@pytest.fixture(params=["embedded", "opensearch"])
def backend_server(request, make_server):
    yield from on_backend(request.param, make_server)


@pytest.fixture(params=["embedded", "opensearch"])
def review_server(request, make_server):
    """A service whose policy holds supersessions for review, on both backends."""
    yield from on_backend(request.param, make_server, {"CAIRN_REVIEW": "supersession"})


def test_console_end_to_end(backend_server, browser):
    server = backend_server
    screenshots = "opensearch" not in server.env.get("CAIRN_BACKEND", "")
    started = time.monotonic()
    admin, porto, lisbon = seed(server)
    page = server.call("GET", "/ui")
    assert page.status == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy and "default-src 'none'" in policy

    # Sign in: the token shows what it may do, and lands in no URL and no lasting storage.
    sign_in(browser, server.base, admin)
    assert browser.find_element(By.ID, "tenant").text == "tenant acme"
    assert "memory:admin" in browser.find_element(By.ID, "scopes").text
    assert admin not in browser.current_url
    assert browser.execute_script("return window.localStorage.length") == 0

    # Users of the tenant, and only of it.
    wait(browser, ready.presence_of_element_located((By.LINK_TEXT, "alice")))
    assert "globex-user" not in browser.find_element(By.TAG_NAME, "main").text
    if screenshots:
        shot(browser, "users")
    browser.find_element(By.LINK_TEXT, "alice").click()
    wait(browser, ready.presence_of_element_located(css("tr[data-fact]")))

    # Stored texts that look like markup show up literally and run nothing.
    text = browser.find_element(By.TAG_NAME, "main").text
    assert SCRIPT_TEXT in text and IMAGE_TEXT in text
    assert browser.find_elements(By.CSS_SELECTOR, "main table img, main table script") == []
    assert browser.execute_script("return window.__pwned === undefined")

    # The supersession chain, followed from the old value to the new one.
    Select(browser.find_element(By.ID, "status-filter")).select_by_value("all")
    wait(browser, ready.presence_of_element_located((By.LINK_TEXT, porto["text"])))
    browser.find_element(By.LINK_TEXT, porto["text"]).click()
    chain = wait(browser, ready.presence_of_element_located(css("#chain")))
    items = chain.find_elements(By.TAG_NAME, "li")
    assert [item.text.split(" ", 1)[0] for item in items] == ["superseded", "active"]
    assert lisbon["text"] in items[1].text
    assert "superseded" in items[0].text and f"by {lisbon['id']}" in items[0].text
    assert f"replaces {porto['id']}" in items[1].text
    if screenshots:
        shot(browser, "fact-history")
    items[1].find_element(By.LINK_TEXT, lisbon["text"]).click()
    wait(browser, ready.text_to_be_present_in_element(css("#fact-text"), lisbon["text"]))
    # ... and back: the newer fact's history names the value it replaced.
    wait(browser, ready.presence_of_element_located(css(f"#chain li[data-fact='{porto['id']}']")))
    back = browser.find_elements(By.CSS_SELECTOR, "#chain li")
    assert [item.get_attribute("data-fact") for item in back] == [porto["id"], lisbon["id"]]
    assert "current" in back[1].get_attribute("class")

    # Episodes of one session, filtered by the service.
    browser.get(f"{server.base}/ui#/users/alice/episodes")
    wait(browser, ready.presence_of_element_located(css("tr[data-session='s1']")))
    session = browser.find_element(By.ID, "session-filter")
    session.send_keys("no-such-session", Keys.ENTER)
    wait(browser, ready.text_to_be_present_in_element(css("main"), "Nothing here."))
    session.clear()
    session.send_keys("s1", Keys.ENTER)
    wait(browser, ready.presence_of_element_located(css("tr[data-session='s1']")))

    # Recall with explanations.
    browser.get(f"{server.base}/ui#/users/alice/recall")
    query = wait(browser, ready.presence_of_element_located(css("#recall-query")))
    query.send_keys("where does the user live", Keys.ENTER)
    wait(browser, ready.presence_of_element_located(css("#recall-results tr[data-hit]")))
    rows = browser.find_elements(By.CSS_SELECTOR, "#recall-results tr[data-hit]")
    assert lisbon["text"] in rows[0].text
    assert rows[0].get_attribute("data-hit") == lisbon["id"]
    headers = browser.find_element(By.CSS_SELECTOR, "#recall-results thead").text
    assert "BM25 rank" in headers and "kNN rank" in headers and "fused" in headers
    # The boosts are shown as multipliers: the query names no one and no time.
    assert "names" in headers and "time" in headers, headers
    boosts = [cell.text for cell in rows[0].find_elements(By.CSS_SELECTOR, "td.name-boost, td.time-boost")]
    assert boosts == ["1.00", "1.00"], boosts
    if screenshots:
        shot(browser, "recall")

    # Retract the fact, confirmed in a dialog, and see it leave recall.
    browser.get(f"{server.base}/ui#/users/alice/fact/{lisbon['id']}")
    wait(browser, ready.element_to_be_clickable(css("#retract"))).click()
    wait(browser, ready.visibility_of_element_located(css("#confirm-reason"))).send_keys("a test")
    browser.find_element(By.ID, "confirm-ok").click()
    wait(browser, ready.text_to_be_present_in_element(css("#fact-status"), "retracted"))
    recalled = server.call("POST", "/v1/users/alice/recall", token=admin,
                           body={"query": "where does the user live"}).json()
    assert lisbon["id"] not in [hit["id"] for hit in recalled["hits"]]

    # The retracted value is a tombstone now (section 2 by keyboard), never showing a value.
    browser.find_element(By.TAG_NAME, "body").send_keys("2")
    wait(browser, ready.presence_of_element_located(css("#tombstones tr[data-tombstone]")))
    assert "/tombstones" in browser.current_url
    row = browser.find_element(By.CSS_SELECTOR, "#tombstones tr[data-tombstone]")
    assert "retracted" in row.text and lisbon["id"] in row.text
    if screenshots:
        shot(browser, "tombstones")

    # Decisions of one kind, with their gate and the evidence they cite.
    browser.get(f"{server.base}/ui#/users/alice/decisions")
    wait(browser, ready.presence_of_element_located(css("tr[data-kind]")))
    Select(browser.find_element(By.ID, "kind-filter")).select_by_value("RETRACTED")
    wait(browser, lambda d: {r.get_attribute("data-kind") for r in d.find_elements(By.CSS_SELECTOR, "tr[data-kind]")}
         == {"RETRACTED"})
    row = browser.find_element(By.CSS_SELECTOR, "tr[data-kind]")
    assert "request" in row.text
    row.find_element(By.CSS_SELECTOR, "button.evidence-toggle").click()
    cited = wait(browser, ready.presence_of_element_located(css(f"blockquote[data-cited='{lisbon['id']}']")))
    assert lisbon["text"] in cited.text and "retracted" in cited.text
    if screenshots:
        shot(browser, "decisions")

    # Narrow screens: the page stays usable at 390 px.
    browser.set_window_size(390, 844)
    browser.get(f"{server.base}/ui#/users/alice/facts")
    wait(browser, ready.presence_of_element_located(css("tr[data-fact]")))
    width = browser.execute_script("return document.documentElement.scrollWidth")
    assert width <= 400, f"the page is {width} px wide at 390"
    if screenshots:
        shot(browser, "facts-narrow")
    browser.set_window_size(1280, 900)

    # A read-only token: no destructive controls, and a forced request is refused.
    browser.find_element(By.XPATH, "//button[text()='Sign out']").click()
    reader = server.mint("acme", scope="memory:read")
    sign_in(browser, server.base, reader)
    browser.get(f"{server.base}/ui#/users/alice/fact/{porto['id']}")
    wait(browser, ready.presence_of_element_located(css("#chain")))
    assert browser.find_elements(By.CSS_SELECTOR, "#retract, #forget, #erase-user") == []
    forced = browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch(arguments[0], {method: "DELETE", headers: {authorization:
            "Bearer " + sessionStorage.getItem("cairn.inspector.token")}}).then(r => done(r.status));
    """, f"/v1/users/alice/facts/{porto['id']}")
    assert forced == 403
    assert server.call("GET", f"/v1/users/alice/facts/{porto['id']}", token=admin).status == 200

    # Another tenant's user is never shown, even asked for by name.
    browser.get(f"{server.base}/ui#/users/globex-user/facts")
    wait(browser, ready.text_to_be_present_in_element(css("main"), "Nothing here."))
    assert "Globex secret" not in browser.find_element(By.TAG_NAME, "main").text

    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"
              and "Content Security Policy" in entry["message"]]
    assert errors == [], errors
    print(f"console: browser test took {time.monotonic() - started:.1f} s")


def test_reviewers_approve_and_reject_in_the_console(review_server, browser):
    server = review_server
    screenshots = "opensearch" not in server.env.get("CAIRN_BACKEND", "")
    admin = server.mint("acme")
    held = {}
    for user in ("alice", "bob"):
        porto = server.call("POST", f"/v1/users/{user}/facts", token=admin,
                            body={"text": "The user lives in Porto."}).json()["fact"]
        moved = server.call("POST", f"/v1/users/{user}/facts", token=admin,
                            body={"text": "The user lives in Lisbon.", "supersedes": porto["id"]}).json()
        assert moved["decision"]["kind"] == "HELD_FOR_REVIEW", moved
        held[user] = (porto, moved["fact"])

    # A writer sees no review controls: no queue, no Reviews section.
    sign_in(browser, server.base, server.mint("acme", scope="memory:read,memory:write"))
    browser.get(f"{server.base}/ui#/users/alice/facts")
    wait(browser, ready.presence_of_element_located(css("tr[data-fact]")))
    assert browser.find_elements(By.CSS_SELECTOR, "#review-queue") == []
    assert "Reviews" not in browser.find_element(By.CSS_SELECTOR, "nav.tabs").text
    browser.find_element(By.XPATH, "//button[text()='Sign out']").click()

    # The tenant's queue, oldest first, with its counts.
    sign_in(browser, server.base, server.mint("acme", scope="memory:review"))
    browser.get(f"{server.base}/ui#/")
    wait(browser, ready.text_to_be_present_in_element(css("#review-counts"), "2 pending"))
    rows = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#review-queue tr[data-review]") or None)
    assert [row.find_element(By.TAG_NAME, "td").text for row in rows] == ["alice", "bob"]
    assert "Lisbon" in rows[0].find_element(By.CSS_SELECTOR, ".proposed").text
    assert "Porto" in rows[0].find_element(By.CSS_SELECTOR, ".current").text
    if screenshots:
        shot(browser, "reviews")

    # Approve alice's move: Lisbon becomes current.
    rows[0].find_element(By.CSS_SELECTOR, "button[data-action='approve']").click()
    wait(browser, ready.element_to_be_clickable(css("#confirm-ok"))).click()
    wait(browser, ready.text_to_be_present_in_element(css("#review-counts"), "1 pending"))
    recalled = server.call("POST", "/v1/users/alice/recall", token=admin,
                           body={"query": "where does the user live", "tiers": ["semantic"]}).json()
    assert recalled["hits"][0]["id"] == held["alice"][1]["id"], recalled

    # Reject bob's from his own section, with a reason, as never true.
    browser.get(f"{server.base}/ui#/users/bob/reviews")
    row = wait(browser, ready.presence_of_element_located(css("#user-reviews tr[data-review]")))
    row.find_element(By.CSS_SELECTOR, "button[data-action='reject']").click()
    wait(browser, ready.visibility_of_element_located(css("#confirm-reason"))).send_keys("only visited")
    browser.find_element(By.ID, "confirm-tombstone").click()
    browser.find_element(By.ID, "confirm-ok").click()
    wait(browser, ready.text_to_be_present_in_element(css("#user-reviews"), "Nothing here."))
    rejected = server.call("GET", f"/v1/users/bob/facts/{held['bob'][1]['id']}", token=admin).json()
    assert (rejected["status"], rejected["retraction_reason"]) == ("retracted", "rejected in review: only visited")
    tombstones = server.call("GET", "/v1/users/bob/tombstones", token=admin).json()["items"]
    assert held["bob"][1]["id"] in [tombstone["fact_id"] for tombstone in tombstones]
    porto = server.call("GET", f"/v1/users/bob/facts/{held['bob'][0]['id']}", token=admin).json()
    assert porto["status"] == "active"


def test_a_login_link_signs_a_tab_in_once_and_is_no_bearer_token(server, browser):
    link = server.mint("acme", scope="memory:read", extra=("--ui", "--url", server.base))
    assert link.startswith(f"{server.base}/ui#ticket=")
    ticket = link.split("#ticket=", 1)[1]
    assert server.call("GET", "/v1/users/alice/facts", token=ticket).status == 401

    browser.get(link)
    wait(browser, ready.presence_of_element_located(css("#tenant")))
    assert browser.find_element(By.ID, "scopes").text == "memory:read"
    assert "ticket" not in browser.current_url
    token = browser.execute_script("return sessionStorage.getItem('cairn.inspector.token')")
    assert token and token != ticket
    assert server.call("GET", "/v1/users/alice/facts", token=token).status == 200
    assert browser.execute_script("return window.localStorage.length") == 0

    # A link opened into the signed-in tab, here another tenant's, never switches its
    # session: the ticket is dropped from the address bar, unused.
    other = server.mint("intruder", scope="memory:read", extra=("--ui", "--url", server.base))
    browser.get(other)
    wait(browser, lambda driver: "ticket" not in driver.current_url)
    assert browser.execute_script("return sessionStorage.getItem('cairn.inspector.token')") == token
    assert "intruder" not in browser.find_element(By.ID, "tenant").text
    unused = server.call("POST", "/ui/session", body={"ticket": other.split("#ticket=", 1)[1]})
    assert unused.status == 200, unused.body

    # A ticket works once.
    again = server.call("POST", "/ui/session", body={"ticket": ticket})
    assert again.status == 401 and "already used" in again.json()["error"]["message"]
    browser.execute_script("sessionStorage.clear()")
    browser.get(f"{server.base}/ui#ticket={ticket}")
    wait(browser, ready.presence_of_element_located(css("#sign-in .error")))
