"""HTTP framing and connection handling of the real `darkserve serve`, over
raw sockets (http.client would fix the requests up): each finding of the
red-team run is a case here.

  - request smuggling: Content-Length with Transfer-Encoding, two different
    Content-Lengths, whitespace before a colon, Host missing or twice on
    HTTP/1.1, NUL or CR in a header value -> one 400, and the connection
    closes (bytes behind the request are never run as another request);
  - a percent-encoded NUL or control byte in the path -> 400 before routing
    (a session is not deleted by /v1/sessions/<id>%00junk);
  - Content-Length -1 / abc / 2^64 -> exactly one well-formed error answer;
    Transfer-Encoding other than chunked -> 501 at once; a chunk size past
    the body limit -> 413 at once, and so is a chunked body that grows past
    it, while the client is still sending;
  - large uploads: beyond --max-uploads at once -> 429;
  - connections: sequential clients of one address that leave their old
    connections open are not refused at the per-address bound; a refusal is
    a 429, logged and counted; half-open connections from other addresses
    do not keep /health waiting.

The first request of a connection is checked by the server's front door on
the raw bytes, later ones by its request hook: the cases that both can see
run both ways. Every read has a bound, so a server that hangs fails a test
instead of stalling it; nothing asserts how fast anything is.
"""
import json
import re
import select
import socket
import threading
import time

import pytest

from ds_server import wait_for

READ_S = 20          # bound on any one answer
GET_OK = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"


def connect(port, src="127.0.0.1"):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(READ_S)
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    return s


def read_all(s, limit_s=READ_S):
    """Everything the server sends until it closes (or limit_s passes: then
    b"<open>" is appended, so a test can tell a kept-open connection)."""
    out = b""
    end = time.monotonic() + limit_s
    s.settimeout(0.2)
    while time.monotonic() < end:
        try:
            b = s.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return out + b"<reset>"
        if not b:
            return out
        out += b
    return out + b"<open>"


def read_answer(s):
    """One whole answer (status, headers, body) off s; None at EOF."""
    buf = b""
    s.settimeout(READ_S)
    while b"\r\n\r\n" not in buf:
        b = s.recv(65536)
        if not b:
            return None
        buf += b
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    hd = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
    n = int(hd.get("content-length", "0"))
    while len(rest) < n:
        b = s.recv(65536)
        if not b:
            break
        rest += b
    return status, hd, rest[:n]


def answers(raw):
    """The status lines in raw bytes (an answer with a second header block
    inside its body shows up as two)."""
    return re.findall(rb"HTTP/1\.[01] (\d{3}) ", raw)


def one_error(raw, status):
    """raw holds exactly one answer, well-formed, with status and a JSON
    error body of its declared length; -> the error object."""
    assert answers(raw) == [str(status).encode()], raw[:600]
    head, _, body = raw.partition(b"\r\n\r\n")
    n = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head).group(1))
    assert len(body) == n, raw[:600]  # nothing after the body: the server closed
    err = json.loads(body)["error"]
    assert err["message"] and err["code"]
    assert re.search(rb"(?i)\r\nconnection: *close", head), head
    return err


def ask(port, raw, first=True):
    """Sends raw on a new connection (after one good request on it when not
    first) and returns what the server sent after that request."""
    s = connect(port)
    try:
        if not first:
            s.sendall(GET_OK)
            assert read_answer(s)[0] == 200
        s.sendall(raw)
        return read_all(s)
    finally:
        s.close()


@pytest.fixture(scope="module")
def srv(tiny):
    return tiny


# ---- smuggling ----

SMUGGLE = (b"POST /tokenize HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
           b"Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
           b"GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n")


@pytest.mark.parametrize("first", [True, False])
def test_content_length_with_transfer_encoding_is_refused_and_closes(srv, first):
    raw = ask(srv.port, SMUGGLE, first)
    err = one_error(raw, 400)
    assert err["code"] == "malformed_request" and "Transfer-Encoding" in err["message"]
    assert b"/v1/models" not in raw and b'"object":"list"' not in raw


FRAMING_400 = {
    "two Content-Lengths": b"POST /tokenize HTTP/1.1\r\nHost: t\r\nContent-Type: "
                           b"application/json\r\nContent-Length: 2\r\nContent-Length: 20\r\n\r\n{}",
    "space before colon": b"POST /tokenize HTTP/1.1\r\nHost: t\r\nContent-Type: application/json"
                          b"\r\nTransfer-Encoding : chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "no Host on 1.1": b"GET /v1/models HTTP/1.1\r\n\r\n",
    "two Hosts": b"GET /v1/models HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    "bare CR in a value": b"GET /v1/models HTTP/1.1\r\nHost: t\r\nX-A: a\rb\r\n\r\n",
}


@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("case", sorted(FRAMING_400))
def test_framing_errors_get_one_400_and_close(srv, case, first):
    err = one_error(ask(srv.port, FRAMING_400[case], first), 400)
    assert err["code"] == "malformed_request"


def test_nul_in_a_header_value_is_refused(srv):
    # seen on the raw bytes: libmicrohttpd would cut the value at the NUL
    err = one_error(ask(srv.port, b"GET /v1/models HTTP/1.1\r\nHost: t\r\nX-A: a\x00b\r\n\r\n"),
                    400)
    assert "control character" in err["message"]


def test_http10_without_host_is_served(srv):
    raw = ask(srv.port, b"GET /health HTTP/1.0\r\n\r\n")
    assert answers(raw) == [b"200"], raw[:300]


def test_head_size_bound(srv):
    ok = ask(srv.port, b"GET /health HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 12000 +
             b"\r\nConnection: close\r\n\r\n")
    assert answers(ok) == [b"200"], ok[:300]
    err = one_error(ask(srv.port, b"GET /health HTTP/1.1\r\nHost: t\r\nX-Big: " +
                        b"a" * 20000 + b"\r\n\r\n"), 431)
    assert err["code"] == "headers_too_large"


# ---- broken answers ----

@pytest.mark.parametrize("value,status", [(b"-1", 400), (b"abc", 400),
                                          (b"18446744073709551616", 413)])
def test_malformed_content_length_gets_one_well_formed_answer(srv, value, status):
    raw = ask(srv.port, b"POST /tokenize HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + value + b"\r\n\r\n")
    err = one_error(raw, status)
    assert "Content-Length" in err["message"]


@pytest.mark.parametrize("first", [True, False])
def test_unknown_transfer_coding_gets_501_at_once(srv, first):
    raw = ask(srv.port, b"POST /tokenize HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: xchunked\r\n\r\n", first)
    err = one_error(raw, 501)
    assert err["code"] == "unsupported_transfer_coding" and "xchunked" in err["message"]


def test_chunk_size_past_the_limit_gets_413_at_once(srv):
    # nothing of the chunk is sent: the answer cannot wait for it
    raw = ask(srv.port, b"POST /tokenize HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFF\r\n")
    err = one_error(raw, 413)
    assert err["code"] == "request_too_large"


def test_state_import_with_a_chunk_past_its_limit_gets_413_at_once(srv):
    st, s, _ = srv.post("/v1/sessions", {})
    assert st == 201
    raw = ask(srv.port, f"PUT /v1/sessions/{s['id']}/state HTTP/1.1\r\nHost: t\r\n"
              "Transfer-Encoding: chunked\r\n\r\n40000000\r\n".encode())  # 1 GiB
    assert one_error(raw, 413)["code"] == "request_too_large"
    assert srv.json("DELETE", f"/v1/sessions/{s['id']}")[0] == 200


def send_until_answered(s, chunk, limit):
    """Sends chunk after chunk (never the last one) until the server answers
    or limit bytes went; -> bytes sent."""
    sent = 0
    while sent < limit:
        r, _, _ = select.select([s], [], [], 0)
        if r:
            break
        try:
            s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        except OSError:
            break
        sent += len(chunk)
    return sent


def test_chunked_body_past_the_limit_is_refused_while_it_arrives(servers):
    # a route limit above 1 MiB: the body goes to a temporary file as it comes
    srv = servers(args=["--max-body", "2M"])
    s = connect(srv.port)
    try:
        s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        sent = send_until_answered(s, b" " * 65536, 64 << 20)
        assert sent < 64 << 20
        err = one_error(read_all(s), 413)  # the body never ended: answered in its middle
        assert err["code"] == "request_too_large"
    finally:
        s.close()
    assert srv.json("GET", "/health")[0] == 200
    # a body under the limit still arrives whole through the file
    text = "word " * 300000  # 1.5 MB
    st, r, _ = srv.post("/tokenize", {"text": text})
    assert st == 200 and len(r["tokens"]) > 1000


def test_large_uploads_beyond_the_bound_get_429(servers):
    srv = servers(args=["--max-body", "4M", "--max-uploads", "1"])
    hold = connect(srv.port)
    try:
        # one slow upload holds the only slot
        hold.sendall(b"POST /tokenize HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n")
        def second():
            return ask(srv.port, b"POST /tokenize HTTP/1.1\r\nHost: t\r\n"
                       b"Content-Type: application/json\r\nContent-Length: 2000000\r\n\r\n")
        # the first has taken its slot once its head is in (poll: no sleep)
        raw = wait_for(lambda: (lambda r: r if answers(r) == [b"429"] else None)(second()), 30)
        assert raw, "a second large upload was not refused"
        err = one_error(raw, 429)
        assert err["code"] == "too_many_uploads"
        assert re.search(rb"(?i)\r\nretry-after: *1", raw)
        # small bodies are not uploads: served meanwhile
        assert srv.post("/tokenize", {"text": "hi"})[0] == 200
    finally:
        hold.close()
    # the slot comes back with the first request's end
    assert wait_for(lambda: srv.post("/tokenize", {"text": "word " * 300000})[0] == 200, 30)


# ---- paths ----

def test_encoded_nul_in_the_path_is_refused_before_routing(srv):
    st, s, _ = srv.post("/v1/sessions", {})
    assert st == 201
    sid = s["id"]
    for method, path in [("DELETE", f"/v1/sessions/{sid}%00junk"),
                         ("GET", f"/v1/sessions/{sid}%00/state"),
                         ("GET", "/v1/models%00junk"),
                         ("GET", "/v1/models%0A"),
                         ("GET", f"/v1/sessions/{sid}%2Fstate"),
                         ("GET", "/v1/sessions?limit=2%00junk")]:
        st, body, _ = srv.json(method, path)
        assert st == 400 and body["error"]["code"] == "malformed_request", (path, body)
    # the session was not deleted
    assert srv.json("GET", f"/v1/sessions/{sid}")[0] == 200
    assert srv.json("DELETE", f"/v1/sessions/{sid}")[0] == 200


# ---- connections ----

def test_sequential_clients_of_one_address_are_not_refused(servers):
    """Each client makes its requests one at a time on a new connection and
    lets go of the old one only later (requests.post leaves the socket to
    the garbage collector): the server closes idle kept-alive connections
    of the address instead of refusing the new one."""
    srv = servers(args=["--max-connections-per-address", "4"])
    errors = []

    def client():
        old = None
        for _ in range(15):
            try:
                s = connect(srv.port)
                s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: t\r\nContent-Type: application/json"
                          b"\r\nContent-Length: 12\r\n\r\n{\"text\":\"a\"}")
                a = read_answer(s)
                if not a or a[0] != 200:
                    errors.append(a and a[0])
            except OSError as e:
                errors.append(repr(e))
                s = None
            if old:
                old.close()
            old = s
        if old:
            old.close()

    ths = [threading.Thread(target=client) for _ in range(4)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(120)
    assert not errors, errors
    assert srv.metrics().get(
        'darkserve_http_connections_refused_total{reason="per_address"}', 0) == 0


def test_per_address_refusal_is_answered_logged_and_counted(servers):
    srv = servers(args=["--max-connections-per-address", "2", "--header-timeout", "60s"])
    held = []
    try:
        for _ in range(2):  # two connections that have asked nothing yet
            s = connect(srv.port, "127.0.0.7")
            s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nX-Half: ")
            held.append(s)
        s = connect(srv.port, "127.0.0.7")
        raw = read_all(s)
        s.close()
        err = one_error(raw, 429)
        assert err["code"] == "too_many_connections"
        # another address is served meanwhile
        assert srv.json("GET", "/health")[0] == 200
    finally:
        for s in held:
            s.close()
    m = srv.metrics()
    assert m.get('darkserve_http_connections_refused_total{reason="per_address"}', 0) >= 1
    assert wait_for(lambda: "refused a connection from 127.0.0.7" in srv.log_text(), 10)


def test_half_open_flood_does_not_keep_health_waiting(servers):
    """More half-open connections than --max-connections, from five other
    addresses: they wait at the door (the oldest shed for newcomers), not in
    the server's slots, so /health from 127.0.0.1 is answered."""
    srv = servers(args=["--max-connections", "16", "--header-timeout", "120s",
                        "--idle-timeout", "120s", "--request-timeout", "300s"])
    socks = []
    try:
        for i in range(60):
            s = socket.socket()
            s.bind((f"127.0.0.{2 + i % 5}", 0))
            s.settimeout(READ_S)
            s.connect(("127.0.0.1", srv.port))
            try:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nX-Half: ")
            except OSError:
                pass  # shed already
            socks.append(s)
        for _ in range(3):
            st, r, _ = srv.json("GET", "/health", timeout=READ_S)
            assert st == 200 and r["status"] == "ok"
        assert srv.metrics().get('darkserve_http_connections_refused_total{reason="shed"}',
                                 0) >= 1
    finally:
        for s in socks:
            s.close()
