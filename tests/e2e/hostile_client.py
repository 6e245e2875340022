#!/usr/bin/env python3
"""Hostile HTTP clients against a running oasis-server, on raw sockets (stdlib only).

    hostile_client.py PORT PROBE [args]

Each probe prints "ok: ..." or "FAILED: ..." lines and exits 1 on any failure. Probes:
  slowloris N SECONDS     N connections trickle request headers one byte per 0.5 s; /health
                          must answer within 1 s throughout; each trickler must get 408 (or be
                          closed) once the server's header timeout passes
  idle N SECONDS [LIMIT]  N connections open and send nothing; /health must answer within 1 s;
                          with LIMIT (--max-connections), at most LIMIT of them stay open
  pipeflood SECONDS       a generation whose client sends bytes nonstop meanwhile: the server
                          accepts no more than socket buffers hold
  busy N                  N connections each hold a half-sent request (a slot); then one more
                          connection must get a fast 503 with Retry-After
  framing MAXBODY         conflicting Content-Length / Transfer-Encoding → 400; a chunked body
                          over MAXBODY → 413; a chunked body that never ends → 408
  reset STREAM MAXTOKENS  a generation whose client resets the connection (RST) at once
                          (STREAM=1: after the first event); prints the elapsed time
  stream_abort MAXTOKENS  a stream read until the server ends it; must end with
                          finish_reason "abort" and [DONE] (run while the server stops)
  flood N MAXTOKENS       N streaming requests at once; /health within 1 s meanwhile; every
                          request gets 200 or a 429/503 with an error body, none hangs
  soak SECONDS CONC [SEED]  mixed traffic (normal, aborted, slow, idle, malformed, probes):
                          no 5xx, no broken answer; prompt lengths from OASIS_SOAK_LENGTHS
                          (comma-separated, default 4,16,120,300)
"""
import json
import os
import select
import socket
import struct
import sys
import threading
import time

PORT = int(sys.argv[1])
failed = False


def ok(msg):
    print("ok: " + msg, flush=True)


def bad(msg):
    global failed
    failed = True
    print("FAILED: " + msg, flush=True)


def connect(timeout=10.0):
    s = socket.create_connection(("127.0.0.1", PORT), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_response(s, timeout=10.0):
    """Reads one response (head + Content-Length body or until close); (status, headers, body)."""
    s.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    if b"\r\n\r\n" not in data:
        return None, {}, data
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(body) < n:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
    return status, headers, body


def read_to_close(s):
    """Everything `s` receives until the peer closes it (or an error or timeout)."""
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    return data


def health_latency():
    t = time.monotonic()
    try:
        s = connect(timeout=5)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status, _, _ = read_response(s, timeout=5)
        s.close()
    except OSError:
        status = None
    return status, time.monotonic() - t


def watch_health(seconds, what):
    """Polls /health every 0.25 s for `seconds`; it must answer 200 within 1 s each time."""
    worst = 0.0
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        status, dt = health_latency()
        n += 1
        worst = max(worst, dt)
        if status != 200 or dt > 1.0:
            bad(f"/health during {what}: status {status} after {dt:.2f} s")
            return
        time.sleep(0.25)
    ok(f"/health answered {n} times during {what}, worst {worst * 1000:.0f} ms")


def probe_slowloris(n, seconds):
    socks = []
    for _ in range(n):
        socks.append(connect())
    request = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    stop = threading.Event()
    got = {}

    def trickle(i, s):
        pos = 0
        status = None
        while not stop.is_set():
            # An answer (the server's 408) ends the trickle.
            readable, _, _ = select.select([s], [], [], 0.5)
            if readable:
                break
            try:
                s.sendall(request[pos % len(request):pos % len(request) + 1])
            except OSError:
                break
            pos += 1
        try:
            status, _, _ = read_response(s, timeout=5)
        except OSError:
            status = "closed"
        got[i] = status

    threads = [threading.Thread(target=trickle, args=(i, s)) for i, s in enumerate(socks)]
    for t in threads:
        t.start()
    watch_health(seconds, f"{n} slowloris connections")
    stop.set()
    for t in threads:
        t.join()
    timed_out = sum(1 for v in got.values() if v == 408)
    if timed_out + sum(1 for v in got.values() if v in ("closed", None)) != n:
        bad(f"slowloris connections answered {sorted(set(map(str, got.values())))}")
    elif timed_out == 0:
        bad("no slowloris connection got 408 from the header timeout")
    else:
        ok(f"{timed_out} of {n} slowloris connections got 408 (the rest were closed)")
    for s in socks:
        s.close()


def closed_by_server(s):
    """True when the server closed `s` (EOF or reset), without blocking."""
    r, _, _ = select.select([s], [], [], 0)
    if not r:
        return False
    try:
        return s.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def probe_idle(n, seconds, limit=None):
    socks = [connect() for _ in range(n)]
    watch_health(seconds, f"{n} idle connections")
    if limit is not None:
        # Each connection past the limit closed one longest-idle connection (not the same one
        # again while it was closing): at most `limit` of ours are open.
        time.sleep(0.5)
        alive = sum(not closed_by_server(s) for s in socks)
        if alive <= limit:
            ok(f"{alive} of {n} idle connections still open (--max-connections {limit})")
        else:
            bad(f"{alive} of {n} idle connections still open, over --max-connections {limit}")
    for s in socks:
        s.close()


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) >> 10
    return 0


def probe_pipeflood(seconds):
    """A long streamed generation whose client sends bytes nonstop while it reads the stream:
    the server must not read (and buffer) them without bound. With OASIS_SERVER_PID its
    resident memory must not grow by more than 64 MiB."""
    pid = os.environ.get("OASIS_SERVER_PID")
    rss0 = rss_mib(pid) if pid else 0
    peak = rss0
    body = json.dumps({"prompt": "once upon a time", "max_tokens": 4000, "temperature": 1.0,
                       "ignore_eos": True, "stream": True}).encode()
    s = connect()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    s.setblocking(False)
    junk = b"A" * 65536
    sent = 0
    head = b""
    tail = b""
    got = 0
    start = time.monotonic()
    end = start + seconds
    # Only while the answer streams: once it ends the rest is a (bad) next request, whose 400
    # is followed by a lingering close that reads and drops what comes.
    done = False
    while time.monotonic() < end and not done:
        try:
            sent += s.send(junk)
        except BlockingIOError:
            time.sleep(0.01)
        except OSError:
            break
        try:
            chunk = s.recv(65536)
            got += len(chunk)
            if len(head) < 512:
                head += chunk[:512]
            done = b"data: [DONE]" in tail + chunk
            tail = (tail + chunk)[-64:]
        except BlockingIOError:
            pass
        except OSError:
            break
        if pid:
            peak = max(peak, rss_mib(pid))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()  # a reset: the generation is aborted
    flood = time.monotonic() - start
    what = (f"{sent >> 20} MiB accepted, RSS {rss0} -> {peak} MiB, {got} bytes of stream read, "
            f"from a client sending while answered ({flood:.2f} s)")
    if not head.startswith(b"HTTP/1.1 200") or b"data: " not in head:
        bad(f"the flooding client's stream did not run: {head[:200]!r}; {what}")
    elif flood < 0.3:
        bad(f"the answer ended too soon to test: {what}")
    elif sent < 64 << 20 and peak - rss0 < 64:
        # Loopback socket buffers hold a few MiB; an unbounded read takes hundreds a second.
        ok(what)
    else:
        bad(what)


def open_partial(n, head):
    """n connections, each having sent `head`: the start of a request and nothing more."""
    socks = []
    for _ in range(n):
        s = connect()
        s.sendall(head)
        socks.append(s)
    return socks


def probe_busy(n):
    socks = open_partial(n, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # half a request
    time.sleep(0.5)
    t = time.monotonic()
    s = connect()
    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = read_response(s, timeout=5)
    dt = time.monotonic() - t
    if status == 503 and "retry-after" in headers and dt < 1.0:
        try:
            err = json.loads(body)["error"]["message"]
        except (ValueError, KeyError):
            err = None
        if err:
            ok(f"connection {n + 1} got 503 with Retry-After in {dt * 1000:.0f} ms: {err}")
        else:
            bad(f"the 503 has no OpenAI error body: {body[:200]!r}")
    else:
        bad(f"connection {n + 1} got {status} {headers} after {dt:.2f} s")
    for s in socks:
        s.close()


def probe_trickle(n):
    """n connections (the whole --max-connections) send a request head promising a body, then
    one body byte at a time: after a second of that, a new connection (/health) must get a place
    (the slowest sender is closed for it), not a 503."""
    socks = open_partial(n, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 100000\r\n\r\n{")
    time.sleep(1.2)
    for s in socks:
        try:
            s.sendall(b" ")
        except OSError:
            pass
    statuses = []
    for _ in range(3):
        status, dt = health_latency()
        statuses.append((status, round(dt, 3)))
    if all(st == 200 and dt < 0.5 for st, dt in statuses):
        ok(f"/health past {n} connections trickling their bodies: {statuses}")
    else:
        bad(f"/health past {n} trickling connections: {statuses}")
    for s in socks:
        s.close()


def probe_noread(max_tokens):
    """A stream whose client never reads (a small receive buffer, no recv): once 8 MiB of it
    are waiting unsent, the server aborts the request and cuts the connection instead of
    generating on and keeping the whole answer in memory. Prints the seconds it took."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    s.connect(("127.0.0.1", PORT))
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
                       "n": 4, "ignore_eos": True, "stream": True, "logprobs": True,
                       "top_logprobs": 20}).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    t = time.monotonic()
    print("streaming", flush=True)
    time.sleep(float(os.environ.get("NOREAD_HOLD_S", "120")))  # the caller kills us sooner
    s.close()
    print(f"held {time.monotonic() - t:.1f} s")


def expect(name, raw, want, timeout=10.0):
    s = connect()
    t = time.monotonic()
    try:
        s.sendall(raw)
        status, _, body = read_response(s, timeout=timeout)
    except OSError as e:
        status, body = None, str(e).encode()
    dt = time.monotonic() - t
    if status == want:
        ok(f"{name}: {status} in {dt:.2f} s")
    else:
        bad(f"{name}: got {status}, want {want}: {body[:300]!r}")
    s.close()


def probe_framing(max_body):
    body = b'{"prompt": "hi", "max_tokens": 1}'
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    n = str(len(body)).encode()
    expect("two different Content-Lengths",
           head + b"Content-Length: " + n + b"\r\nContent-Length: 3\r\n\r\n" + body, 400)
    expect("Content-Length with chunked",
           head + b"Content-Length: " + n + b"\r\nTransfer-Encoding: chunked\r\n\r\n" + body, 400)
    expect("chunked with Content-Length",
           head + b"Transfer-Encoding: chunked\r\nContent-Length: " + n + b"\r\n\r\n" + body, 400)
    expect("Transfer-Encoding gzip", head + b"Transfer-Encoding: gzip\r\n\r\n" + body, 400)
    chunked = b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    expect("Transfer-Encoding gzip, chunked (a coding never applied)",
           head + b"Transfer-Encoding: gzip, chunked\r\n\r\n" + chunked, 400)
    expect("Transfer-Encoding gzip then chunked in two fields",
           head + b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked, 400)
    expect("Transfer-Encoding chunked, chunked",
           head + b"Transfer-Encoding: chunked, chunked\r\n\r\n" + chunked, 400)
    expect("Transfer-Encoding Chunked (any case) frames the body",
           head + b"Transfer-Encoding: Chunked\r\n\r\n" + chunked, 200)
    # A chunked body larger than the limit, sent in 64 KiB chunks: 413 without reading it all.
    s = connect()
    s.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"x" * 65536
    sent = 0
    try:
        while sent <= max_body + 2 * len(chunk):
            s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            sent += len(chunk)
    except OSError:
        pass
    try:
        status, _, bodytext = read_response(s, timeout=10)
    except OSError:
        status, bodytext = None, b""
    if status == 413:
        ok(f"a chunked body over {max_body} bytes: 413 after {sent} bytes sent")
    else:
        bad(f"a chunked body over {max_body} bytes: got {status} {bodytext[:200]!r}")
    s.close()
    # A chunked body that never ends: 408 once the body timeout passes.
    expect("a chunked body that never ends",
           head + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", 408, timeout=30)
    # A header section over the limit: 431.
    expect("headers over the limit",
           b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (200 << 10) + b"\r\n\r\n", 431)
    # HTTP/1.0 has no transfer codings; HTTP/1.1 needs a Host header; empty lines before a
    # request line are skipped.
    expect("HTTP/1.0 with Transfer-Encoding chunked",
           head.replace(b"HTTP/1.1", b"HTTP/1.0") + b"Transfer-Encoding: chunked\r\n\r\n" + chunked, 400)
    expect("HTTP/1.1 without Host", b"GET /health HTTP/1.1\r\n\r\n", 400)
    expect("HTTP/1.0 without Host", b"GET /health HTTP/1.0\r\n\r\n", 200)
    expect("empty lines before the request line",
           b"\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n", 200)
    # HEAD is served where GET is: the GET's head, no body; 405 names the allowed methods.
    s = connect()
    s.sendall(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n"
              b"Connection: close\r\n\r\n")
    s.settimeout(10)
    data = read_to_close(s)
    s.close()
    parts = data.split(b"HTTP/1.1 ")
    heads = [p.split(b"\r\n\r\n", 1) for p in parts[1:]]
    if (len(heads) == 2 and heads[0][0].startswith(b"200") and heads[0][1] == b""
            and b"content-length:" in heads[0][0].lower() and heads[1][0].startswith(b"200")
            and heads[1][1].startswith(b"{")):
        ok("HEAD /health: 200, no body (the pipelined GET after it answered with one)")
    else:
        bad(f"HEAD /health then GET: {data[:400]!r}")
    s = connect()
    s.sendall(b"DELETE /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, _ = read_response(s)
    s.close()
    if status == 405 and headers.get("allow") == "POST":
        ok("405 with Allow: POST")
    else:
        bad(f"DELETE /v1/completions: {status} {headers}")
    # The server still serves after all that.
    status, dt = health_latency()
    if status == 200:
        ok("/health after the framing probes")
    else:
        bad(f"/health after the framing probes: {status}")


def generation(stream, max_tokens):
    body = json.dumps({"prompt": "once upon a time", "max_tokens": max_tokens,
                       "ignore_eos": True, "stream": stream}).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def probe_reset(stream, max_tokens):
    s = connect()
    s.sendall(generation(stream, max_tokens))
    if stream:
        s.settimeout(10)
        data = b""
        while b"data:" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    else:
        time.sleep(0.2)
    # SO_LINGER 0: close sends a RST, as a client that crashed or timed out would.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    ok(f"reset a {'streaming' if stream else 'non-streaming'} request")


def probe_stream_abort(max_tokens):
    s = connect()
    s.sendall(generation(True, max_tokens))
    s.settimeout(60)
    print("streaming", flush=True)
    data = read_to_close(s)
    text = data.decode("utf-8", "replace")
    reasons = [json.loads(line[6:])["choices"][0].get("finish_reason")
               for line in text.splitlines()
               if line.startswith("data: {") and '"choices"' in line]
    if "abort" in reasons and "data: [DONE]" in text:
        ok("the stream ended with finish_reason abort and [DONE] at shutdown")
    else:
        bad(f"the stream at shutdown ended with {reasons[-3:]} and {text[-200:]!r}")


def probe_flood(n, max_tokens):
    results = [None] * n
    stop = threading.Event()

    def one(i):
        try:
            s = connect(timeout=60)
            s.sendall(generation(True, max_tokens))
            s.settimeout(60)
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
                if data.endswith(b"0\r\n\r\n") or (b"\r\n\r\n" in data and
                                                   b"content-length" in data.lower()):
                    if b"data: [DONE]" in data or b"content-length" in data.lower():
                        break
            status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None
            results[i] = (status, b"data: [DONE]" in data, b'"error"' in data)
            s.close()
        except OSError as e:
            results[i] = ("error", str(e), False)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    watcher = threading.Thread(target=lambda: watch_health(3, f"{n} streaming requests"))
    watcher.start()
    for t in threads:
        t.join(timeout=120)
    stop.set()
    watcher.join()
    done = sum(1 for r in results if r and r[0] == 200 and r[1])
    refused = sum(1 for r in results if r and r[0] in (429, 503) and r[2])
    if done + refused == n:
        ok(f"{n} streaming requests: {done} completed with [DONE], {refused} refused with 429/503")
    else:
        bad(f"{n} streaming requests: {done} done, {refused} refused, others "
            f"{[r for r in results if not (r and ((r[0] == 200 and r[1]) or r[0] in (429, 503)))][:5]}")


def probe_soak(seconds, concurrency, seed):
    """Mixed traffic for `seconds`: normal requests (streamed or not, short or long prompts),
    10% aborted mid-way (closed or reset), slow bodies, idle connections, malformed bodies,
    /health and /metrics. Every request that is not abandoned must end 2xx/4xx with a whole
    body; a 5xx anywhere fails the probe."""
    import random
    rng_master = random.Random(seed)
    stats = {"ok": 0, "aborted": 0, "slow": 0, "idle": 0, "bad": 0, "probe": 0, "429": 0}
    errors = []
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def count(k):
        with lock:
            stats[k] += 1

    def err(msg):
        with lock:
            if len(errors) < 20:
                errors.append(msg)

    lengths = [int(x) for x in os.environ.get("OASIS_SOAK_LENGTHS", "4,16,120,300").split(",")]

    def body_for(rng):
        n = rng.choice(lengths)
        prompt = [rng.randrange(3, 500) for _ in range(n)]
        return {"prompt": prompt, "max_tokens": rng.randint(1, 24), "temperature": rng.choice([0, 0.8]),
                "seed": rng.randrange(1 << 30), "stream": rng.random() < 0.5, "ignore_eos": True}

    def request_bytes(obj, path="/v1/completions"):
        b = json.dumps(obj).encode()
        return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(b)).encode() + b"\r\n\r\n" + b), b

    def read_all(s, stream):
        """Reads one whole response: Content-Length or chunked; returns (status, body)."""
        s.settimeout(60)
        data = b""
        while b"\r\n\r\n" not in data:
            c = s.recv(65536)
            if not c:
                raise OSError("closed before the head")
            data += c
        head, rest = data.split(b"\r\n\r\n", 1)
        status = int(head.split(b" ", 2)[1])
        h = head.lower()
        if b"transfer-encoding: chunked" in h:
            while not rest.endswith(b"0\r\n\r\n"):
                c = s.recv(65536)
                if not c:
                    raise OSError("closed inside a chunked body")
                rest += c
        else:
            n = int(h.split(b"content-length:")[1].split(b"\r\n")[0])
            while len(rest) < n:
                c = s.recv(65536)
                if not c:
                    raise OSError("closed inside a body")
                rest += c
        return status, rest

    def worker(wid):
        rng = random.Random(rng_master.randrange(1 << 30) + wid)
        while time.monotonic() < end:
            r = rng.random()
            try:
                if r < 0.10:  # abort mid-way: close or reset after a moment
                    obj = body_for(rng)
                    obj["max_tokens"] = 200
                    s = connect()
                    s.sendall(request_bytes(obj)[0])
                    time.sleep(rng.random() * 0.3)
                    if rng.random() < 0.5:
                        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.close()
                    count("aborted")
                elif r < 0.15:  # a slow body, trickled in 8 pieces over ~0.4 s
                    raw, _ = request_bytes(body_for(rng))
                    s = connect()
                    step = max(1, len(raw) // 8)
                    for i in range(0, len(raw), step):
                        s.sendall(raw[i:i + step])
                        time.sleep(0.05)
                    status, _ = read_all(s, False)
                    s.close()
                    if status >= 500:
                        err(f"slow body: {status}")
                    count("slow")
                elif r < 0.20:  # an idle connection held for a while
                    s = connect()
                    time.sleep(rng.random())
                    s.close()
                    count("idle")
                elif r < 0.25:  # malformed
                    s = connect()
                    junk = rng.choice([b'{"prompt": ', b'[1,2]', b'{"prompt": "x", "max_tokens": -1}',
                                       b'{"prompt": "x", "temperature": "hot"}'])
                    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                              str(len(junk)).encode() + b"\r\n\r\n" + junk)
                    status, _ = read_all(s, False)
                    s.close()
                    if status != 400:
                        err(f"malformed body: {status}")
                    count("bad")
                elif r < 0.30:
                    s = connect()
                    s.sendall(rng.choice([b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
                                          b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"]))
                    status, _ = read_all(s, False)
                    s.close()
                    if status != 200:
                        err(f"probe: {status}")
                    count("probe")
                else:
                    obj = body_for(rng)
                    raw, _ = request_bytes(obj)
                    s = connect()
                    s.sendall(raw)
                    status, body = read_all(s, obj["stream"])
                    s.close()
                    if status == 429:
                        count("429")
                    elif status != 200:
                        err(f"request: {status} {body[:200]!r}")
                    elif obj["stream"] and b"data: [DONE]" not in body:
                        err("a stream without [DONE]")
                    else:
                        count("ok")
            except OSError as e:
                err(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(stats.values())
    if errors:
        bad(f"soak: {len(errors)}+ errors in {total} actions: {errors[:5]}")
    else:
        ok(f"soak: {total} actions in {seconds:.0f} s with {concurrency} clients: {stats}")


probe = sys.argv[2]
args = sys.argv[3:]
if probe == "slowloris":
    probe_slowloris(int(args[0]), float(args[1]))
elif probe == "idle":
    probe_idle(int(args[0]), float(args[1]), int(args[2]) if len(args) > 2 else None)
elif probe == "pipeflood":
    probe_pipeflood(float(args[0]))
elif probe == "busy":
    probe_busy(int(args[0]))
elif probe == "noread":
    probe_noread(int(args[0]))
elif probe == "trickle":
    probe_trickle(int(args[0]))
elif probe == "framing":
    probe_framing(int(args[0]))
elif probe == "reset":
    probe_reset(args[0] == "1", int(args[1]))
elif probe == "stream_abort":
    probe_stream_abort(int(args[0]))
elif probe == "soak":
    probe_soak(float(args[0]), int(args[1]), int(args[2]) if len(args) > 2 else 1)
elif probe == "flood":
    probe_flood(int(args[0]), int(args[1]))
else:
    print("unknown probe " + probe)
    sys.exit(2)
sys.exit(1 if failed else 0)
