"""A real S3-compatible server for the object-store tests and benchmark: moto's S3 in server
mode (werkzeug, HTTP on 127.0.0.1, a random port) in a thread of this process.

Every request it answers is logged (method, path, query), so a test counts the GETs a run
made whatever process made them. Two faults a real server shows are switched on per test, in
front of moto (which accepts any credentials and any read): an access key refused as AWS
refuses an unknown one (403 InvalidAccessKeyId), and a bucket whose objects may be listed but
not read (403 AccessDenied on GET and HEAD of an object). A listing's pages may be made
small (``page_size``), as a server may answer fewer keys than asked.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

_CREDENTIAL = re.compile(r"Credential=([^/]+)/")

#: the credentials the tests give the S3 client (moto accepts any)
AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
#: settings of the developer's environment that would send the tests elsewhere
FOREIGN_AWS = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


def use_test_credentials(monkeypatch: Any) -> None:
    """This process's S3 clients given :data:`AWS`, and nothing of :data:`FOREIGN_AWS`."""
    for var, value in AWS.items():
        monkeypatch.setenv(var, value)
    for var in FOREIGN_AWS:
        monkeypatch.delenv(var, raising=False)


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # /bucket/key (path-style)
    query: str

    @property
    def bucket(self) -> str:
        return self.path.lstrip("/").split("/", 1)[0]

    @property
    def is_object(self) -> bool:
        """A request for one object (not the bucket's listing)."""
        return "/" in self.path.lstrip("/") and self.path.lstrip("/").split("/", 1)[1] != ""

    @property
    def is_download(self) -> bool:
        return self.method == "GET" and self.is_object

    @property
    def is_listing(self) -> bool:
        return self.method == "GET" and not self.is_object and "list-type=2" in self.query


class S3Server:
    """moto's S3 on ``self.url``; ``self.requests``: every request answered, in order."""

    def __init__(self) -> None:
        from moto.server import create_backend_app
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise

        self.requests: list[Request] = []
        self.refused_keys: set[str] = set()
        self.unreadable_buckets: set[str] = set()
        #: at most this many keys a listing's page (None: the server's 1,000), as a server
        #: may answer fewer than asked
        self.page_size: int | None = None
        self._moto = create_backend_app("s3")
        self._server = make_server("127.0.0.1", 0, self._app, threaded=True)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=10)

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        request = Request(
            environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), environ.get("QUERY_STRING", "")
        )
        self.requests.append(request)
        key = _CREDENTIAL.search(environ.get("HTTP_AUTHORIZATION", ""))
        if key is not None and key.group(1) in self.refused_keys:
            return _error(
                start_response,
                "InvalidAccessKeyId",
                "The AWS Access Key Id you provided does not exist in our records.",
            )
        if (
            request.method in ("GET", "HEAD")
            and request.is_object
            and request.bucket in self.unreadable_buckets
        ):
            return _error(start_response, "AccessDenied", "Access Denied")
        if self.page_size is not None and request.is_listing:
            from urllib.parse import parse_qsl, urlencode

            query = dict(parse_qsl(request.query, keep_blank_values=True))
            query["max-keys"] = str(self.page_size)
            environ = {**environ, "QUERY_STRING": urlencode(query)}
        result: Iterable[bytes] = self._moto(environ, start_response)
        return result

    def downloads(self, since: int = 0) -> list[Request]:
        """The object GETs answered since request number ``since``."""
        return [r for r in self.requests[since:] if r.is_download]

    def client(self) -> Any:
        """A boto3 client of this server (the tests' own writes)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )


def _error(start_response: Callable[..., Any], code: str, message: str) -> list[bytes]:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    ).encode()
    start_response(
        "403 Forbidden", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))]
    )
    return [body]


def closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on (an unreachable endpoint)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
