"""The web page's routes over HTTP (server/ui/ui.c): GET / and /ui/{name} serve
exactly the files of server/ui/ that the build embedded (so the generator
cannot drift from the sources), with their content types, a
Content-Security-Policy that runs scripts from the server's origin only,
and an ETag that If-None-Match turns into 304; --no-ui takes the routes
away; the page needs no API key (the API behind it does).

The browser tests are in test_ui_browser.py.
"""
import glob
import os
import re
from html.parser import HTMLParser

from ds_server import ROOT, TINY

UI_DIR = os.path.join(ROOT, "server", "ui")
TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".js": "text/javascript; charset=utf-8"}


def ui_files():
    """{name: bytes} of the files the Makefile embeds (server/ui/*.html, .css, .js)."""
    out = {}
    for ext in TYPES:
        for p in glob.glob(os.path.join(UI_DIR, "*" + ext)):
            with open(p, "rb") as f:
                out[os.path.basename(p)] = f.read()
    return out


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f'"{h:016x}"'


def test_every_file_is_served_as_it_is_in_the_tree(tiny):
    files = ui_files()
    assert {"index.html", "app.js", "app.css"} <= set(files)
    for name, data in files.items():
        paths = [f"/ui/{name}"] + (["/"] if name == "index.html" else [])
        for path in paths:
            st, hd, body = tiny.request("GET", path)
            assert st == 200, (path, body[:200])
            assert body == data, f"{path}: the embedded bytes differ from server/ui/{name} " \
                                 "(rebuild: make)"
            assert hd["content-type"] == TYPES[os.path.splitext(name)[1]]
            assert hd["etag"] == fnv1a64(data)
            assert hd["cache-control"] == "no-cache"
            assert hd["x-content-type-options"] == "nosniff"
            csp = hd["content-security-policy"]
            assert "script-src 'self'" in csp and "default-src 'none'" in csp
            assert "unsafe-inline" not in csp and "unsafe-eval" not in csp


def test_unknown_files_are_404(tiny):
    for path in ("/ui/nope.js", "/ui/embed.c", "/ui/", "/ui/app.js/x", "/index.html"):
        st, body, _ = tiny.json("GET", path)
        assert st == 404, path
        assert body["error"]["code"] == "not_found"


def test_if_none_match_gives_304(tiny):
    st, hd, _ = tiny.request("GET", "/ui/app.js")
    etag = hd["etag"]
    for inm in (etag, "W/" + etag, f'"0000000000000000", {etag}', "*"):
        st, hd2, body = tiny.request("GET", "/ui/app.js", headers={"If-None-Match": inm})
        assert st == 304, inm
        assert body == b""
        assert hd2["etag"] == etag
    st, _, body = tiny.request("GET", "/ui/app.js", headers={"If-None-Match": '"0123"'})
    assert st == 200 and body
    # another file's tag is not this one's
    _, hd_css, _ = tiny.request("GET", "/ui/app.css")
    assert hd_css["etag"] != etag
    st, _, _ = tiny.request("GET", "/ui/app.js", headers={"If-None-Match": hd_css["etag"]})
    assert st == 200


def test_head(tiny):
    st, hd, body = tiny.request("HEAD", "/")
    assert st == 200 and body == b""
    assert hd["content-type"] == TYPES[".html"]
    assert hd["etag"] == fnv1a64(ui_files()["index.html"])


class _Markup(HTMLParser):
    def __init__(self):
        super().__init__()
        self.scripts, self.inline, self.handlers, self.styles = [], [], [], []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.handlers += [k for k in a if k.startswith("on")]
        if "style" in a:
            self.styles.append(tag)
        if tag == "style":
            self.styles.append("<style>")
        if tag == "script":
            self.scripts.append(a.get("src"))
            self._in_script = True

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script and data.strip():
            self.inline.append(data)


def test_page_runs_under_its_policy():
    """The CSP allows no inline script or style: the page has none, and the
    files it loads are the embedded ones."""
    m = _Markup()
    m.feed(ui_files()["index.html"].decode())
    assert m.scripts == ["/ui/app.js"]
    assert m.inline == [] and m.handlers == [] and m.styles == []
    js = ui_files()["app.js"].decode()
    # model output goes into the page as text: no HTML parsing of strings
    for bad in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                "new Function"):
        assert bad not in js, bad
    assert re.search(r'href="/ui/app\.css"', ui_files()["index.html"].decode())


def test_no_ui(servers):
    s = servers(model=TINY, args=["--no-ui"])
    for path in ("/", "/ui/app.js", "/ui/index.html"):
        st, body, _ = s.json("GET", path)
        assert st == 404, path
        assert body["error"]["code"] == "not_found"
    assert s.json("GET", "/health")[0] == 200


def test_page_needs_no_key_but_the_api_does(servers):
    s = servers(model=TINY, args=["--api-key", "k1"])
    for path in ("/", "/ui/app.js", "/ui/app.css"):
        assert s.request("GET", path)[0] == 200, path
    assert s.request("GET", "/v1/sessions")[0] == 401
    assert s.request("GET", "/v1/sessions", headers={"Authorization": "Bearer k1"})[0] == 200
