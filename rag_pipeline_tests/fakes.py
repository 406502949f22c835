"""Small HTTP servers on 127.0.0.1 that speak just enough of the OpenAI and Qdrant APIs.

They are real servers (the clients under test make real HTTP requests with their own retry
logic), scripted to fail in the ways production services do.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np


class _QuietHTTPServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that gave up (timed out) is what the scripts ask for, not the fake's error;
        # its traceback would land in whatever output a test captures at that moment
        if isinstance(sys.exc_info()[1], BrokenPipeError | ConnectionResetError):
            return
        super().handle_error(request, client_address)


class _Server:
    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = _QuietHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.fake = self  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def __enter__(self):  # type: ignore[no-untyped-def]
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _vector(text: str, dim: int) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


class FakeOpenAI(_Server):
    """POST /v1/embeddings. ``script`` holds what the next requests get: "ok", a status code
    (429, 500, 503...; answered with retry-after-ms 10), a (status, retry-after-ms) pair,
    "hang" (sleep past the client's timeout, or until ``released`` is set), "garbage" (an
    HTML page with status 200) or a malformed answer with status 200 (see
    :data:`BAD_ANSWERS`); when empty, ``default`` ("ok" unless set).

    ``latency_s`` delays every answer (a real API takes hundreds of ms). ``rate_limit`` =
    (requests, window_s) answers 429 with a Retry-After to a request that arrives when the
    last ``window_s`` seconds already hold that many accepted ones, as a rate-limited account.
    Every request's arrival is recorded in ``arrivals`` (monotonic time, status), and the most
    requests in flight at once in ``max_in_flight``.
    """

    def __init__(
        self,
        dim: int = 1536,
        *,
        latency_s: float = 0.0,
        rate_limit: tuple[int, float] | None = None,
        floats_only: bool = False,
    ) -> None:
        self.dim = dim
        self.floats_only = floats_only  # ignore encoding_format=base64, as some servers do
        self.script: deque[Any] = deque()
        self.default: Any = "ok"
        self.requests: list[dict] = []
        self.hang_s = 3.0
        #: set: a hanging request (and every later one) answers at once
        self.released = threading.Event()
        #: a request with an input holding this text hangs, whatever the script says
        self.hang_on: str | None = None
        self.latency_s = latency_s
        self.rate_limit = rate_limit
        self.arrivals: list[tuple[float, int]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        super().__init__(_OpenAIHandler)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def admit(self) -> tuple[int, float]:
        """Record an arrival; (429, seconds to wait) if it is over the rate limit, else (200, 0)."""
        with self.lock:
            now = time.monotonic()
            status, wait_s = 200, 0.0
            if self.rate_limit is not None:
                limit, window = self.rate_limit
                recent = [t for t, s in self.arrivals if s == 200 and t > now - window]
                if len(recent) >= limit:
                    status, wait_s = 429, recent[len(recent) - limit] + window - now
            self.arrivals.append((now, status))
            if status == 200:
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
            return status, wait_s

    def done(self) -> None:
        with self.lock:
            self.in_flight -= 1

    def max_in_window(self, window_s: float) -> int:
        """The most accepted requests that arrived within any ``window_s`` seconds."""
        times = sorted(t for t, s in self.arrivals if s == 200)
        best, first = 0, 0
        for last, t in enumerate(times):
            while times[first] <= t - window_s:
                first += 1
            best = max(best, last - first + 1)
        return best

    @property
    def rejected(self) -> int:
        return sum(1 for _, s in self.arrivals if s == 429)


class _OpenAIHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def _json(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        fake: FakeOpenAI = self.server.fake  # type: ignore[attr-defined]
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        status, wait_s = fake.admit()
        if status == 429:
            self._json(
                429,
                {"error": {"message": "Rate limit reached", "type": "requests"}},
                {"retry-after-ms": str(math.ceil(wait_s * 1000) + 1)},
            )
            return
        try:
            self._answer(fake, body)
        finally:
            fake.done()

    def _answer(self, fake: FakeOpenAI, body: dict) -> None:
        fake.requests.append(body)
        if fake.latency_s:
            time.sleep(fake.latency_s)
        action = fake.script.popleft() if fake.script else fake.default
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if fake.hang_on is not None and any(fake.hang_on in str(t) for t in texts):
            action = "hang"
        if action == "hang":
            fake.released.wait(fake.hang_s)
            action = "ok"
        if action == "garbage":  # a proxy's error page answered with status 200
            data = b"<html>502 Bad Gateway</html>"
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if isinstance(action, int | tuple):
            status, retry_after_ms = action if isinstance(action, tuple) else (action, 10)
            message = "Rate limit reached" if status == 429 else "The server had an error"
            self._json(
                status,
                {"error": {"message": message, "type": "server_error"}},
                {"retry-after-ms": str(retry_after_ms)},
            )
            return
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = []
        for i, text in enumerate(inputs):
            vector = _vector(str(text), fake.dim)
            if action == "wrong_dim":
                vector = vector[:-1]
            elif action == "nan" and i < 2:
                vector = np.full_like(vector, np.nan)
            elif action == "zero" and i == 0:
                vector = np.zeros_like(vector)
            embedding: Any = (
                base64.b64encode(vector.tobytes()).decode()
                if body.get("encoding_format") == "base64" and not fake.floats_only
                else vector.tolist()
            )
            if action == "bad_base64" and isinstance(embedding, str):
                embedding = "not base64!" + embedding[11:]
            data.append({"object": "embedding", "index": i, "embedding": embedding})
        if action == "duplicate_index" and len(data) > 1:  # index 0 missing, the last twice
            data = [*data[1:], {**data[0], "index": len(data) - 1}]
        tokens = sum(len(str(t).split()) for t in inputs)
        self._json(
            200,
            {
                "object": "list",
                "data": data,
                "model": body["model"],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )


#: answers with status 200 that are not one good vector per input: every check of an answer
BAD_ANSWERS = ("duplicate_index", "wrong_dim", "nan", "zero", "bad_base64", "garbage")


class FakeQdrant(_Server):
    """The few REST calls that create a collection and its payload indexes, recorded."""

    def __init__(self) -> None:
        self.collections: dict[str, dict] = {}
        self.indexes: dict[str, dict[str, Any]] = {}
        self.api_keys: list[str | None] = []
        super().__init__(_QdrantHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class _QdrantHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def _ok(self, result: Any) -> None:
        data = json.dumps({"result": result, "status": "ok", "time": 0.0}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _parts(self) -> list[str]:
        return [p for p in self.path.split("?")[0].split("/") if p]

    def do_GET(self) -> None:
        fake: FakeQdrant = self.server.fake  # type: ignore[attr-defined]
        fake.api_keys.append(self.headers.get("api-key"))
        parts = self._parts()
        if not parts:
            self._ok({"title": "qdrant - vector search engine", "version": "1.15.0"})
            return
        if parts[0] == "collections" and len(parts) == 3 and parts[2] == "exists":
            self._ok({"exists": parts[1] in fake.collections})
            return
        if parts[0] == "collections" and len(parts) == 2 and parts[1] in fake.collections:
            created = fake.collections[parts[1]]
            schema = {
                k: {
                    "data_type": "keyword"
                    if "type" not in v or v.get("type") == "keyword"
                    else v["type"],
                    "points": 0,
                }
                for k, v in fake.indexes.get(parts[1], {}).items()
            }
            self._ok(
                {
                    "status": "green",
                    "optimizer_status": "ok",
                    "segments_count": 1,
                    "points_count": 0,
                    "indexed_vectors_count": 0,
                    "config": {
                        "params": {
                            "vectors": created["vectors"],
                            "sparse_vectors": created.get("sparse_vectors"),
                            "shard_number": created.get("shard_number", 1),
                            "replication_factor": created.get("replication_factor", 1),
                        },
                        "hnsw_config": {"m": 16, "ef_construct": 100, "full_scan_threshold": 10000},
                        "optimizer_config": {
                            "deleted_threshold": 0.2,
                            "vacuum_min_vector_number": 1000,
                            "default_segment_number": 0,
                            "flush_interval_sec": 5,
                        },
                        "wal_config": {"wal_capacity_mb": 32, "wal_segments_ahead": 0},
                    },
                    "payload_schema": schema,
                }
            )
            return
        self.send_error(404)

    def do_PUT(self) -> None:
        fake: FakeQdrant = self.server.fake  # type: ignore[attr-defined]
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        parts = self._parts()
        if parts[0] == "collections" and len(parts) == 2:
            fake.collections[parts[1]] = body
            self._ok(True)
            return
        if parts[0] == "collections" and len(parts) == 3 and parts[2] == "index":
            schema = body.get("field_schema")
            fake.indexes.setdefault(parts[1], {})[body["field_name"]] = (
                schema if isinstance(schema, dict) else {"type": schema}
            )
            self._ok({"operation_id": 1, "status": "completed"})
            return
        self.send_error(404)
