"""The real HAProxy for the front-door tests: a rendered config started in a folder, waited for
until ``ready()`` (a failure shows HAProxy's own log); and the base of the stand-in servers
(replicas, engines, providers) the tests put behind it."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hetflow.workloads.serve.front import haproxy_binary


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def start_haproxy(root: Path, config: str, ready: Callable[[], bool],
                  env: dict[str, str] | None = None, timeout_s: float = 10) -> tuple[subprocess.Popen, Path]:
    """``config`` written to ``root/haproxy.cfg`` and run (its log: ``root/haproxy.log``) until
    ``ready()``; the process and the log's path."""
    (root / "haproxy.cfg").write_text(config)
    log = root / "haproxy.log"
    proc = subprocess.Popen([haproxy_binary(), "-W", "-db", "-f", str(root / "haproxy.cfg")],
                            stdout=subprocess.DEVNULL, stderr=log.open("wb"), env=env)
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    return proc, log


def stop_all(proc: subprocess.Popen, servers: list[http.server.ThreadingHTTPServer]) -> None:
    """HAProxy ended, then the stand-in servers behind it."""
    proc.terminate()
    proc.wait(10)
    for srv in servers:
        srv.shutdown()
        srv.server_close()


class StandIn(http.server.BaseHTTPRequestHandler):
    """A stand-in server's handler: HTTP/1.1 keep-alive as the real ones, no request log, and a
    client that hangs up early (HAProxy's health checks do) is not an error."""

    protocol_version = "HTTP/1.1"

    def send_json(self, status: int, payload: object, headers: dict[str, str] | None = None) -> None:
        """One whole JSON answer with its length (and ``headers``)."""
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def send_events(self, events: list[dict]) -> None:
        """A whole server-sent-event stream (``data: {...}`` each, then ``data: [DONE]``) with
        its length, as OpenAI-compatible servers stream."""
        data = "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except ConnectionError:
            pass


class Held:
    """Slow requests a test's stand-in servers are answering now (``answer``), and the way a
    test fills a queue limit's slots and holds them there while more requests arrive
    (``then_more``): a burst of all of them at once lets a request pass the free-slot check in
    the moment before a slot is counted - one per HAProxy thread (access.no_free_slot)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.gate: threading.Event | None = None

    def answer(self, delay_s: float) -> None:
        """In a handler: ``delay_s`` seconds, or until released while a test holds the slots."""
        with self.lock:
            self.in_flight += 1
        try:
            gate = self.gate
            if gate is not None:
                gate.wait(10)
            else:
                time.sleep(delay_s)
        finally:
            with self.lock:
                self.in_flight -= 1

    def then_more(self, one: Callable[[int], object], slots: int = 4) -> tuple[list, list]:
        """``slots`` requests (``one(i)``) that fill the slots and are held there, then as many
        more while they are; both results."""
        import concurrent.futures as cf

        self.gate = gate = threading.Event()
        try:
            with cf.ThreadPoolExecutor(2 * slots) as pool:
                running = [pool.submit(one, i) for i in range(slots)]
                deadline = time.monotonic() + 5
                while self.in_flight < slots and time.monotonic() < deadline:
                    time.sleep(0.005)
                assert self.in_flight == slots, self.in_flight
                more = list(pool.map(one, range(slots, 2 * slots)))
                gate.set()
                return [r.result() for r in running], more
        finally:
            gate.set()
            self.gate = None


POLL_S = 0.02  # how often a stand-in server's loop looks whether it is to stop


def serve_in_thread(handler: type[http.server.BaseHTTPRequestHandler]) -> http.server.ThreadingHTTPServer:
    """``handler`` served on a free 127.0.0.1 port from a daemon thread (``shutdown()`` it)."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # shutdown() waits for the loop's next look at its flag: every 0.5 s by default, which was
    # 22 s of the unit tests' teardowns (38 tests, two servers each, 2026-12-07)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": POLL_S}, daemon=True).start()
    return srv


PROVIDER_KEY = "sk-provider-secret-for-the-llm-fallback"


class OpenAIProvider(StandIn):
    """An external OpenAI-compatible provider at base path ``/prov/v1`` that wants its own key
    (``PROVIDER_KEY``): chat completions and completions, whole or streamed (one chunk), each
    "from upstream" under the model it was asked for (and ``by``: ``upstream:<model>``), with
    usage. Subclass it per test: ``seen`` keeps what each request carried."""

    seen: list[dict] = []
    health_status = 200  # what its model list (the front door's health check) answers
    post_status = 200  # what its completions answer (not 200: an error body)

    def _ok(self) -> bool:
        return self.headers.get("authorization") == f"Bearer {PROVIDER_KEY}"

    def do_GET(self) -> None:
        self.send_json(type(self).health_status if self._ok() and self.path == "/prov/v1/models" else 401,
                       {"object": "list", "data": [{"id": "gpt-up", "object": "model"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        type(self).seen.append({"path": self.path, "body": body,
                                "authorization": self.headers.get("authorization")})
        chat = self.path == "/prov/v1/chat/completions"
        if not self._ok():
            return self.send_json(401, {"error": "bad upstream key"})
        if not chat and self.path != "/prov/v1/completions":
            return self.send_json(404, {"error": self.path})
        if type(self).post_status != 200:
            return self.send_json(type(self).post_status, {"error": "the provider is failing"})
        model = body.get("model")
        choice = ({"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "from upstream"}}
                  if chat else {"index": 0, "finish_reason": "stop", "text": "from upstream"})
        if not body.get("stream"):
            return self.send_json(200, {
                "id": "up-1", "object": "chat.completion" if chat else "text_completion", "created": 1,
                "model": model, "by": f"upstream:{model}", "choices": [choice],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
        delta = ({"index": 0, "delta": {"content": "from upstream"}, "finish_reason": "stop"}
                 if chat else choice)
        self.send_events([{"id": "up-1", "object": "chat.completion.chunk" if chat else "text_completion",
                           "created": 1, "model": model, "choices": [delta]}])
        return None
