"""The web page (GET /, server/ui/) in a real browser: Debian's chromium and
chromedriver, driven headless by selenium, against a real `darkserve serve`
on loopback with the tiny model.

What a user does is what the tests do: type a message and watch the reply
stream in, stop a reply mid-stream, fork, delete, export and import
sessions, regenerate and roll back a turn, enter an API key. Model output
that holds markup (forced with a grammar, through the real generation path)
must show as text. Screenshots go to <build>/test-artifacts/ui/.

Where chromium or chromedriver is missing, or cannot start, the tests are
skipped with a message saying so (scripts/deps.sh installs the Debian
packages chromium and chromium-driver, and selenium from
tests/requirements.txt); nothing else skips them.
"""
import json
import os
import shutil

import pytest

from ds_server import BUILD, TINY, Server, wait_for

ART = os.path.join(BUILD, "test-artifacts", "ui")
WAIT_S = 60
CANCELLED = 'darkserve_engine_sequences_finished_total{reason="cancelled"}'

try:
    from selenium import webdriver
    from selenium.common.exceptions import NoAlertPresentException, WebDriverException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait
    SELENIUM_ERR = None
except ImportError as e:  # reported by the browser fixture as a skip reason
    SELENIUM_ERR = e


def _find(*names):
    for n in names:
        p = shutil.which(n) or (n if os.path.isabs(n) and os.access(n, os.X_OK) else None)
        if p:
            return p
    return None


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if SELENIUM_ERR is not None:
        pytest.skip(f"browser tests: selenium cannot be imported ({SELENIUM_ERR}); "
                    "scripts/deps.sh installs it from tests/requirements.txt")
    chromium = _find("chromium", "chromium-browser", "/usr/lib/chromium/chromium")
    driver = _find("chromedriver", "/usr/lib/chromium/chromedriver")
    if not chromium or not driver:
        pytest.skip("browser tests: chromium or chromedriver not found; scripts/deps.sh "
                    "installs the Debian packages chromium and chromium-driver")
    downloads = str(tmp_path_factory.mktemp("downloads"))
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1280,900", "--no-first-run", "--disable-extensions"):
        opts.add_argument(a)
    opts.add_experimental_option("prefs", {
        "download.default_directory": downloads,
        "download.prompt_for_download": False,
        "safebrowsing.enabled": False,
    })
    try:
        d = webdriver.Chrome(options=opts, service=Service(driver))
    except WebDriverException as e:
        pytest.skip(f"browser tests: chromium cannot start ({e.msg or e})")
    d.downloads = downloads
    os.makedirs(ART, exist_ok=True)
    yield d
    d.quit()


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    """A tiny-model server with a constant-size state (performer) and room
    for a reply long enough to be stopped."""
    s = Server(tmp_path_factory.mktemp("ui"), TINY, name="ui", attn="performer",
               args=["--max-tokens-limit", "1000000"])
    yield s
    s.kill()


# ---- page helpers ----

def wait(d, pred, what, timeout=WAIT_S):
    try:
        return WebDriverWait(d, timeout, poll_frequency=0.05).until(lambda _: pred())
    except Exception as e:
        shot(d, "failed-" + what.replace(" ", "-")[:40])
        raise AssertionError(f"timed out waiting for {what}") from e


def shot(d, name):
    d.save_screenshot(os.path.join(ART, name + ".png"))


def fresh_page(d, s, width=1280):
    """The page with empty storage, as a first visit."""
    d.set_window_size(width, 900)
    d.get(s.url("/health"))  # the origin without the page's script, which writes storage
    d.execute_script("localStorage.clear()")
    d.get(s.url("/"))
    wait(d, lambda: d.find_element(By.ID, "model").text not in ("", "connecting…"),
         "the model name")


def set_field(d, field_id, value):
    e = d.find_element(By.ID, field_id)
    e.clear()
    if value:
        e.send_keys(value)


def settings(d, temperature="0", max_tokens="16", seed="", extra=""):
    set_field(d, "temperature", temperature)
    set_field(d, "max_tokens", max_tokens)
    set_field(d, "seed", seed)
    set_field(d, "extra", extra)


def new_chat(d, s, text, width=1280, **kw):
    """A fresh page, the settings kw, one message sent; -> the session's id."""
    fresh_page(d, s, width)
    settings(d, **kw)
    send(d, text)
    return current_id(d)


def busy(d):
    return not d.find_element(By.ID, "send").is_enabled()


def assistant_msgs(d):
    return d.find_elements(By.CSS_SELECTOR, "#log .msg-assistant")


def last_reply(d):
    """(raw text, rendered text, status line) of the last assistant message."""
    return d.execute_script("""
        const a = [...document.querySelectorAll('#log .msg-assistant')].pop();
        if (!a) return null;
        const st = a.querySelector('.msg-status');
        return [a.dataset.raw, a.querySelector('.msg-body').textContent,
                st ? st.textContent : ''];""")


def send(d, text, enter=False):
    """Sends a message and waits until its reply has ended."""
    n = len(assistant_msgs(d))
    box = d.find_element(By.ID, "prompt")
    box.send_keys(text)
    if enter:
        box.send_keys(Keys.ENTER)
    else:
        d.find_element(By.ID, "send").click()
    wait(d, lambda: len(assistant_msgs(d)) == n + 1, "the reply's message")
    wait(d, lambda: assistant_msgs(d)[-1].get_attribute("aria-busy") == "false"
         and not busy(d), "the reply's end")
    return last_reply(d)


def current_id(d):
    h = d.find_element(By.ID, "info-h").text
    assert h.startswith("Session "), h
    return h[len("Session "):]


def item(d, sid):
    items = d.find_elements(By.CSS_SELECTOR, f'#session-list li[data-id="{sid}"]')
    return items[0] if items else None


def item_button(d, sid, cls):
    wait(d, lambda: item(d, sid) is not None, f"session {sid[:8]} in the list")
    return item(d, sid).find_element(By.CSS_SELECTOR, "button." + cls)


def no_alert(d):
    try:
        d.switch_to.alert
    except NoAlertPresentException:
        return True
    return False


def special_ids(s):
    """Token ids of the tiny model's special tokens (end of turn and text)."""
    ids = []
    for t in ("<|im_end|>", "<|endoftext|>", "<|im_start|>"):
        st, body, _ = s.post("/tokenize", {"text": t, "add_special": False})
        assert st == 200 and len(body["tokens"]) == 1, body
        ids.append(body["tokens"][0])
    return ids


# ---- tests ----

def test_chat_streams_a_reply(browser, srv):
    d = browser
    fresh_page(d, srv)
    settings(d, temperature="0", max_tokens="24")
    raw, shown, note = send(d, "Hello there", enter=True)
    assert raw and shown.strip(), "no reply text"
    sid = current_id(d)
    # the page's text is the concatenation of the streamed events: the same
    # greedy reply the API gives from the same state
    st, other, _ = srv.post("/v1/sessions", {})
    assert st == 201
    st, ref, _ = srv.post(f"/v1/sessions/{other['id']}/generate",
                          {"messages": [{"role": "user", "content": "Hello there"}],
                           "temperature": 0, "max_tokens": 24, "stream": False})
    assert st == 200, ref
    assert raw == ref["text"]
    assert note == ("Cut at the max tokens setting." if ref["finish_reason"] == "length" else "")
    # metrics strip and session panel
    assert d.find_element(By.ID, "m-ttft").text.endswith(" ms")
    assert d.find_element(By.ID, "m-tokens").text == str(ref["usage"]["completion_tokens"])
    st, info, _ = srv.json("GET", f"/v1/sessions/{sid}")
    assert d.find_element(By.ID, "i-tokens").text == str(info["tokens"])
    assert "performer" in d.find_element(By.ID, "i-attn").text
    meta = item(d, sid).find_element(By.CSS_SELECTOR, ".meta").text
    assert f"{info['tokens']} tokens" in meta and "performer" in meta
    # a second turn: the table of state sizes by turn grows, the state does not
    send(d, "And again")
    d.find_element(By.CSS_SELECTOR, "#growth summary").click()
    rows = d.find_elements(By.CSS_SELECTOR, "#growth-rows tr")
    assert len(rows) >= 2 and rows[-1].text.startswith("2 (now)")
    # the user's message is shown as typed
    users = d.find_elements(By.CSS_SELECTOR, "#log .msg-user .msg-body")
    assert [u.text for u in users] == ["Hello there", "And again"]
    shot(d, "chat")


def test_stop_mid_stream_cancels_on_the_server(browser, srv):
    d = browser
    fresh_page(d, srv)
    bias = {str(i): -100 for i in special_ids(srv)}  # the reply cannot end by itself
    settings(d, temperature="1", max_tokens="1000000", seed="3",
             extra=json.dumps({"logit_bias": bias}))
    before = srv.metrics().get(CANCELLED, 0)
    d.find_element(By.ID, "prompt").send_keys("Tell me everything")
    d.find_element(By.ID, "send").click()
    # streaming: text on the page while the reply is still running
    wait(d, lambda: assistant_msgs(d) and len((last_reply(d) or [""])[0]) > 40 and busy(d),
         "streamed text while the reply runs")
    assert assistant_msgs(d)[-1].get_attribute("aria-busy") == "true"
    shot(d, "streaming")
    d.find_element(By.ID, "stop").click()
    wait(d, lambda: not busy(d), "the stop")
    raw, _, note = last_reply(d)
    assert note == "Stopped." and raw
    assert wait_for(lambda: srv.metrics().get(CANCELLED, 0) >= before + 1, 30), \
        "the server did not cancel the generation"
    # the session stays usable: the next message gets a whole reply
    sid = current_id(d)
    settings(d, temperature="0", max_tokens="8")
    raw2, _, note2 = send(d, "Short, please")
    assert raw2 and note2 in ("", "Cut at the max tokens setting.")
    st, info, _ = srv.json("GET", f"/v1/sessions/{sid}")
    assert st == 200 and info["turns"] == 2
    shot(d, "stopped")


def test_fork_and_delete(browser, srv):
    d = browser
    src = new_chat(d, srv, "Fork me", max_tokens="6")
    item_button(d, src, "fork").click()
    wait(d, lambda: current_id(d) != src, "the fork to open")
    fork = current_id(d)
    st, a, _ = srv.json("GET", f"/v1/sessions/{src}")
    st2, b, _ = srv.json("GET", f"/v1/sessions/{fork}")
    assert st == st2 == 200 and a["tokens"] == b["tokens"]
    assert item(d, fork).get_attribute("aria-current") == "true"
    # the fork shows the conversation it was copied from
    assert d.find_element(By.CSS_SELECTOR, "#log .msg-user .msg-body").text == "Fork me"
    shot(d, "forked")
    # delete takes two clicks
    item_button(d, fork, "delete").click()
    assert item(d, fork) is not None
    assert item_button(d, fork, "delete").text == "Confirm delete"
    item_button(d, fork, "delete").click()
    wait(d, lambda: item(d, fork) is None, "the deleted session to leave the list")
    assert srv.json("GET", f"/v1/sessions/{fork}")[0] == 404
    assert srv.json("GET", f"/v1/sessions/{src}")[0] == 200
    assert d.find_element(By.ID, "info-h").text == "No session"


def test_export_then_import(browser, srv):
    d = browser
    sid = new_chat(d, srv, "Remember the number 42", max_tokens="6")
    path = os.path.join(d.downloads, sid + ".dsst")
    st, _, blob = srv.request("GET", f"/v1/sessions/{sid}/state")
    assert st == 200
    item_button(d, sid, "export").click()
    wait(d, lambda: os.path.exists(path) and os.path.getsize(path) == len(blob),
         "the exported file")
    with open(path, "rb") as f:
        assert f.read() == blob
    before = {x["id"] for x in srv.json("GET", "/v1/sessions?limit=1000")[1]["data"]}
    d.find_element(By.ID, "import-file").send_keys(path)
    wait(d, lambda: d.find_element(By.ID, "info-h").text not in ("No session", "Session " + sid),
         "the imported session to open")
    new = current_id(d)
    assert new not in before
    st, a, _ = srv.json("GET", f"/v1/sessions/{sid}")
    st2, b, _ = srv.json("GET", f"/v1/sessions/{new}")
    assert (b["tokens"], b["state_bytes"], b["turns"]) == (a["tokens"], a["state_bytes"], a["turns"])
    assert "Imported from " + sid + ".dsst" in d.find_element(By.ID, "log").text
    # it continues exactly as the original: the same greedy reply
    settings(d, temperature="0", max_tokens="12")
    raw, _, _ = send(d, "Which number?")
    st, ref, _ = srv.post(f"/v1/sessions/{sid}/generate",
                          {"messages": [{"role": "user", "content": "Which number?"}],
                           "temperature": 0, "max_tokens": 12, "stream": False})
    assert st == 200 and raw == ref["text"]
    shot(d, "imported")


def test_model_markup_is_shown_as_text(browser, srv):
    d = browser
    fresh_page(d, srv)
    text = ("<script>alert(1)</script> **bold** `<b>x</b>`\n\n"
            "```html\n<img src=x onerror=alert(2)>\n```\n\n- <i>item</i>\n")
    literal = json.dumps(text)  # a GBNF literal takes the same escapes as JSON here
    settings(d, temperature="0", max_tokens="200",
             extra=json.dumps({"grammar": "root ::= " + literal}))
    raw, shown, _ = send(d, "Say something dangerous")
    assert raw == text
    log = d.find_element(By.ID, "log")
    for tag in ("script", "img", "b", "i"):
        assert log.find_elements(By.TAG_NAME, tag) == [], f"a <{tag}> element in the log"
    body = assistant_msgs(d)[-1].find_element(By.CSS_SELECTOR, ".msg-body")
    assert body.find_element(By.TAG_NAME, "p").text.startswith("<script>alert(1)</script>")
    assert body.find_element(By.TAG_NAME, "strong").text == "bold"
    assert body.find_element(By.CSS_SELECTOR, "p code").text == "<b>x</b>"
    assert body.find_element(By.CSS_SELECTOR, "pre code").text == "<img src=x onerror=alert(2)>"
    assert body.find_element(By.CSS_SELECTOR, ".codeblock .lang").text == "html"
    assert body.find_element(By.CSS_SELECTOR, "ul li").text == "<i>item</i>"
    assert no_alert(d)
    assert d.execute_script("return document.scripts.length") == 1
    shot(d, "markup-as-text")


def test_regenerate_and_rollback(browser, srv):
    d = browser
    sid = new_chat(d, srv, "One", temperature="0", max_tokens="10")
    raw2, _, _ = send(d, "Two")
    assert d.find_element(By.ID, "regen").is_enabled()
    d.find_element(By.ID, "regen").click()
    wait(d, lambda: not busy(d) and assistant_msgs(d)[-1].get_attribute("aria-busy") == "false",
         "the regenerated reply")
    assert len(assistant_msgs(d)) == 2
    assert last_reply(d)[0] == raw2  # greedy: the same reply again
    st, info, _ = srv.json("GET", f"/v1/sessions/{sid}")
    assert info["turns"] == 2
    d.find_element(By.ID, "rollback").click()
    wait(d, lambda: len(assistant_msgs(d)) == 1, "the rolled back turn to go")
    assert d.find_element(By.ID, "prompt").get_attribute("value") == "Two"
    st, info, _ = srv.json("GET", f"/v1/sessions/{sid}")
    assert info["turns"] == 1
    assert d.find_element(By.ID, "i-turns").text == "1"


def test_narrow_screen_and_labels(browser, srv):
    d = browser
    new_chat(d, srv, "A narrow screen", width=380, max_tokens="6")
    assert d.execute_script(
        "return document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    # every control has an accessible name
    unnamed = d.execute_script("""
        return [...document.querySelectorAll('input, textarea, select, button')].filter((e) =>
            !(e.labels && e.labels.length) && !e.getAttribute('aria-label') &&
            !e.textContent.trim()).map((e) => e.id || e.outerHTML.slice(0, 60));""")
    assert unnamed == []
    shot(d, "narrow")
    d.set_window_size(1280, 900)


def test_api_key_is_asked_once(browser, servers):
    s = servers(model=TINY, attn="performer", args=["--api-key", "sesame"])
    d = browser
    fresh_page(d, s)
    dialog = d.find_element(By.ID, "key-dialog")
    wait(d, lambda: dialog.get_attribute("open") is not None, "the key dialog")
    shot(d, "api-key")
    d.find_element(By.ID, "key-input").send_keys("wrong")
    d.find_element(By.ID, "key-save").click()
    # a wrong key is refused: the next request asks again
    d.find_element(By.ID, "refresh").click()
    wait(d, lambda: dialog.get_attribute("open") is not None, "the key dialog again")
    set_field(d, "key-input", "sesame")
    d.find_element(By.ID, "key-save").click()
    wait(d, lambda: dialog.get_attribute("open") is None, "the dialog to close")
    settings(d, max_tokens="4")
    raw, _, note = send(d, "With a key")
    assert raw and "Error" not in note
    assert d.execute_script("return localStorage.getItem('darkserve.apiKey')") == "sesame"
    d.get(s.url("/"))
    wait(d, lambda: d.find_elements(By.CSS_SELECTOR, "#session-list li[data-id]"),
         "the session list with the stored key")
    assert d.find_element(By.ID, "key-dialog").get_attribute("open") is None
