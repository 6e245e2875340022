#!/usr/bin/env python3
"""Measures an oasis-server HTTP front under connection pressure (stdlib only, loopback):

    tools/bench_http_front.py SERVER [--label NAME] [--idle 1000] [--streams 200] [--extra ...]

Starts SERVER (CPU backend, embedded model, --port 0), then measures
  1. /health latency (p50, p99, max over 200 sequential requests) with IDLE idle keep-alive
     connections open;
  2. the server's thread count with STREAMS concurrent streaming requests open (each reading
     slowly), and /health latency meanwhile;
  3. /health throughput: 16 keep-alive clients for 3 s.
Prints one line per measurement and a RESULT line. Raise `ulimit -n` above IDLE first.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time


def start(server, extra):
    p = subprocess.Popen([server, "--backend", "cpu", "--port", "0", "--log-level", "warn"] + extra,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    port = None
    for line in p.stdout:
        if "listening on http://" in line:
            port = int(line.strip().rsplit(":", 1)[1])
        if "ready" in line:
            break
    threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
    return p, port


def get_health(sock):
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096)
    head, body = data.split(b"\r\n\r\n", 1)
    n = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
    while len(body) < n:
        body += sock.recv(4096)
    return head.split(b" ")[1]


def health_latencies(port, n):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            get_health(s)
            s.close()
            out.append(time.perf_counter() - t)
        except OSError:
            out.append(10.0)
    return out


def summary(lat):
    lat = sorted(lat)
    return (f"p50 {statistics.median(lat) * 1e3:.2f} ms, p99 {lat[int(len(lat) * 0.99) - 1] * 1e3:.2f} ms, "
            f"max {lat[-1] * 1e3:.2f} ms")


def threads_of(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("server")
    ap.add_argument("--label", default="server")
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[])
    a = ap.parse_args()
    p, port = start(a.server, ["--max-num-seqs", str(a.streams), "--max-waiting", "4096"] + a.extra)
    try:
        base_threads = threads_of(p.pid)
        # 1. idle connections
        idle = []
        for _ in range(a.idle):
            try:
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            except OSError as e:
                print(f"could only open {len(idle)} idle connections: {e}")
                break
        time.sleep(0.5)
        lat = health_latencies(port, 200)
        failed = sum(1 for x in lat if x >= 10.0)
        print(f"{a.label}: /health with {len(idle)} idle connections: {summary(lat)}, failed {failed}")
        print(f"{a.label}: threads with {len(idle)} idle connections: {threads_of(p.pid)} (at rest {base_threads})")
        for s in idle:
            s.close()
        time.sleep(0.5)
        # 2. slow streams
        body = (b'{"prompt": "once upon a time", "max_tokens": 3000, "ignore_eos": true, "stream": true}')
        req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        streams = []
        for _ in range(a.streams):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(req)
            streams.append(s)
        time.sleep(2.0)
        th = threads_of(p.pid)
        lat = health_latencies(port, 100)
        print(f"{a.label}: threads with {a.streams} open streams: {th}; /health meanwhile: {summary(lat)}")
        for s in streams:
            s.close()
        time.sleep(1.0)
        # 3. throughput
        stop = time.perf_counter() + 3.0
        counts = [0] * 16

        def client(i):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            while time.perf_counter() < stop:
                get_health(s)
                counts[i] += 1
            s.close()

        ts = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        rps = sum(counts) / 3.0
        print(f"{a.label}: /health throughput, 16 keep-alive clients: {rps:.0f} req/s")
        print(f"RESULT {a.label} streams_health_max_ms={sorted(lat)[-1] * 1e3:.1f} stream_threads={th} health_rps={rps:.0f}")
    finally:
        p.terminate()
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


if __name__ == "__main__":
    main()
