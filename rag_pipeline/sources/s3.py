"""Object-store books: a prefix of an S3 (or S3-compatible) bucket per book.

A book is declared by an :class:`S3BookSpec` (``s3://bucket/prefix/``, optionally an endpoint
and a region); its files are the ``*.md`` / ``*.mdx`` objects under the prefix, each named by
its key relative to the prefix (``source_file``). Credentials come from boto3's usual chain
(``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, an instance role).

Change detection is the listing's: a file's version (:class:`~rag_pipeline.models.FileKey`)
holds its size and a 63-bit digest of its ETag and LastModified, so a look at an unchanged
book is one ListObjectsV2 request per 1,000 objects and no download (the SHA-256 recorded
with that version stands for the bytes, as a folder's stat does). An ETag names the bytes of
one write (writes are atomic), so no clock tick can hide a change: a version is never racy.

A book whose prefix cannot be listed, or whose objects the credentials may not read (an
unreachable endpoint, refused credentials, a denied read) raises :class:`BookUnavailableError`:
the book fails with the reason, its indexed points stay, the next run looks again.
"""

from __future__ import annotations

import errno
import hashlib
import re
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pydantic

from rag_pipeline.models import FileError, FileKey, SourceFile, validate_book_id
from rag_pipeline.sources.base import (
    BookListing,
    BookSource,
    BookUnavailableError,
    BookVersions,
    FileNow,
    FileVersion,
    SourceReadError,
    too_large,
)
from rag_pipeline.sources.crawl import MARKDOWN_SUFFIXES, is_book_path
from rag_pipeline.sources.folder import DEFAULT_MAX_FILE_BYTES
from rag_pipeline.urls import without_credentials

if TYPE_CHECKING:
    from botocore.client import BaseClient

__all__ = ["S3BookSpec", "S3Source", "object_key_version"]

# bucket names as S3 accepts them (3-63 lowercase letters, digits, '.', '-')
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
#: a region name as botocore accepts one
_REGION = re.compile(r"(?![0-9]+$)(?!-)[a-zA-Z0-9-]{1,63}(?<!-)")
#: what a request's signature header holds, which an HTTP client's error may quote
_SIGNED = re.compile(r"\b(Credential|Signature)=[^,\s'\"]+")
#: errors that say the object is not there (a file deleted since the look)
_GONE_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
#: seconds to reach an endpoint and to wait for an answer; attempts per request (a dead
#: endpoint fails the book in seconds, not minutes)
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 60
MAX_ATTEMPTS = 3


class S3BookSpec(pydantic.BaseModel):
    """One book in an object store: ``s3://bucket/prefix/`` and where to reach it."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    #: ``s3://bucket/prefix/`` (the prefix may be empty: the whole bucket)
    s3: str
    #: an S3-compatible server (MinIO, Ceph, moto: ``http://127.0.0.1:9000``); None: AWS
    endpoint_url: str | None = None
    #: the bucket's region (None: boto3's default, ``AWS_DEFAULT_REGION``)
    region: str | None = None

    @pydantic.field_validator("s3")
    @classmethod
    def _valid_url(cls, value: str) -> str:
        if not value.startswith("s3://"):
            shown = without_credentials(repr(value))
            raise ValueError(f"{shown} is not an s3:// URL (write s3://bucket/prefix/)")
        bucket, _, prefix = value[len("s3://") :].partition("/")
        if not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise ValueError(
                f"{value!r}: {bucket!r} is not a bucket name (3-63 lowercase letters, digits, "
                "'.' or '-')"
            )
        if (
            prefix.startswith("/")
            or "//" in prefix
            or any(p in (".", "..") for p in prefix.split("/"))
        ):
            raise ValueError(f"{value!r}: the prefix {prefix!r} has an empty, '.' or '..' part")
        # a prefix names a folder: "runbooks" must not also take "runbooks-old/"
        return f"s3://{bucket}/{prefix}" + ("/" if prefix and not prefix.endswith("/") else "")

    @pydantic.field_validator("endpoint_url")
    @classmethod
    def _valid_endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not re.fullmatch(r"https?://[^/\s]+/?", value):
            raise ValueError(
                f"{without_credentials(repr(value))} is not an http(s)://host[:port] URL"
            )
        if "@" in value:
            # a key in the URL would be shown wherever the endpoint is (messages, plans, logs)
            raise ValueError(
                f"{without_credentials(repr(value))} holds credentials: give them as "
                "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or a profile), not in the URL"
            )
        return value

    @pydantic.field_validator("region")
    @classmethod
    def _valid_region(cls, value: str | None) -> str | None:
        # botocore's own rule, at once: a region it refuses (or one with a newline, which it
        # took and put in a request header, then quoted the signed header in its error)
        if not value:
            return None  # (boto3's default)
        if not _REGION.fullmatch(value):
            raise ValueError(f"{value!r} is not a region name (letters, digits and '-')")
        return value

    @property
    def bucket(self) -> str:
        return self.s3[len("s3://") :].partition("/")[0]

    @property
    def prefix(self) -> str:
        return self.s3[len("s3://") :].partition("/")[2]

    @property
    def where(self) -> str:
        """The book's objects, for messages: the URL and the endpoint."""
        return self.s3 + (f" at {self.endpoint_url}" if self.endpoint_url else "")


def object_key_version(etag: str, last_modified: object, size: int) -> FileKey:
    """An object's version as change detection compares it: its size and a digest of its
    ETag and LastModified (a rewrite with the same bytes moves LastModified: it is read again,
    which costs a download, never a missed change). The stat-only fields are 0."""
    digest = hashlib.sha256(f"{etag}\0{last_modified}".encode()).digest()
    return FileKey(0, int.from_bytes(digest[:8], "big") >> 1, size, 0, 0, 0)


def _reason(exc: BaseException) -> str:
    """Why a request failed, in words (an S3 error's code and message)."""
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    if isinstance(exc, ClientError):
        code = _error_code(exc)
        message = str(exc.response.get("Error", {}).get("Message") or "").strip()
        return without_credentials(f"{code}: {message}" if message else code)
    if isinstance(exc, EndpointConnectionError):
        return "cannot connect to the endpoint"  # (the message names it)
    if isinstance(exc, NoCredentialsError):
        return "no AWS credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile)"
    return _SIGNED.sub(r"\1=***", without_credentials(str(exc) or type(exc).__name__))


def _error_code(exc: BaseException) -> str:
    from botocore.exceptions import ClientError

    if not isinstance(exc, ClientError):
        return ""
    error: Mapping[str, Any] = exc.response.get("Error", {})
    return str(error.get("Code") or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode"))


class S3Source(BookSource):
    """Books as prefixes of S3 buckets, one :class:`S3BookSpec` per book id."""

    def __init__(
        self, books: Mapping[str, S3BookSpec], *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    ) -> None:
        for book_id in books:
            validate_book_id(book_id)
        self.books = dict(books)
        self.max_file_bytes = max_file_bytes
        self.description = (
            "object store books ("
            + ", ".join(f"{b}: {s.where}" for b, s in sorted(self.books.items()))
            + ")"
        )
        self.book_noun = "object store book"
        self._clients: dict[tuple[str | None, str | None], BaseClient] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"S3Source({self.books!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, S3Source) and (other.books, other.max_file_bytes) == (
            self.books,
            self.max_file_bytes,
        )

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.books.items())), self.max_file_bytes))

    def client(self, spec: S3BookSpec) -> BaseClient:
        """The S3 client of the spec's endpoint and region (one per process; boto3 clients
        are thread-safe), with short timeouts and few attempts."""
        key = (spec.endpoint_url, spec.region)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                import boto3
                from botocore.config import Config

                config = Config(
                    connect_timeout=CONNECT_TIMEOUT_S,
                    read_timeout=READ_TIMEOUT_S,
                    retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
                    # an S3-compatible server is reached by its address: path-style URLs
                    s3={"addressing_style": "path" if spec.endpoint_url else "auto"},
                )
                client = boto3.session.Session().client(
                    "s3", endpoint_url=spec.endpoint_url, region_name=spec.region, config=config
                )
                self._clients[key] = client
            return client

    def _spec(self, book_id: str) -> S3BookSpec:
        spec = self.books.get(book_id)
        if spec is None:
            raise BookUnavailableError(f"no object store book {book_id!r} is declared")
        return spec

    def _unavailable(self, book_id: str, what: str, exc: BaseException) -> BookUnavailableError:
        spec = self.books[book_id]
        return BookUnavailableError(
            f"object store book {book_id!r}: cannot {what} {spec.where}: {_reason(exc)}; its "
            "indexed points are kept and the next run tries again"
        )

    def list_books(self) -> BookListing:
        # the declared books: no request (a book that cannot be listed fails on its own)
        return BookListing(tuple(sorted(self.books)))

    def versions(self, book_id: str) -> BookVersions:
        from botocore.exceptions import BotoCoreError, ClientError

        spec = self._spec(book_id)
        files: list[FileVersion] = []
        errors: list[FileError] = []
        try:
            pages = self.client(spec).get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=spec.bucket, Prefix=spec.prefix):
                for obj in page.get("Contents", ()):
                    key = str(obj["Key"])
                    if not key.startswith(spec.prefix):
                        # a server that answers beyond the prefix asked for: another book's
                        # objects are never listed as this book's (tenant isolation)
                        errors.append(
                            FileError(
                                book_id,
                                key,
                                "crawl",
                                f"object key {key!r} is outside the book's prefix "
                                f"{spec.prefix!r}: the server answered beyond it; not read",
                            )
                        )
                        continue
                    rel = key[len(spec.prefix) :]
                    if rel.lower().endswith(MARKDOWN_SUFFIXES) and any(
                        p in ("", ".", "..") for p in rel.split("/")
                    ):
                        # a name no folder could hold ("a//b.md", "../x.md", "./y.md"): said,
                        # never taken for a hidden file nor resolved (it names no other file)
                        errors.append(
                            FileError(
                                book_id,
                                rel,
                                "crawl",
                                f"object key {key!r} has an empty, '.' or '..' path part: "
                                "not a file name; rename the object to ingest it",
                            )
                        )
                        continue
                    if not is_book_path(rel):
                        continue  # a folder marker ("guide/"), an image, a hidden file, ...
                    etag = str(obj["ETag"])
                    listed = object_key_version(etag, obj["LastModified"], int(obj["Size"]))
                    files.append(FileVersion(rel, listed, key, version=etag.strip('"')))
        except (BotoCoreError, ClientError) as exc:
            raise self._unavailable(book_id, "list", exc) from None
        files.sort(key=lambda f: f.source_file)
        return BookVersions(book_id, spec.s3, tuple(files), tuple(errors))

    def read(self, book_id: str, file: FileVersion | SourceFile, boundary: str) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        spec = self._spec(book_id)
        key = file.location or spec.prefix + file.source_file
        if not key.startswith(spec.prefix) or boundary not in ("", spec.s3):
            # a location outside the book's prefix is never read (tenant isolation)
            raise SourceReadError(errno.EPERM, f"{key!r} is not an object of {spec.s3}")
        listed = file.key.size if isinstance(file.key, FileKey) else 0
        if listed > self.max_file_bytes:  # refused by the size its listing names: no request
            raise SourceReadError(errno.EFBIG, too_large(listed, self.max_file_bytes, "object"))
        try:
            answer = self.client(spec).get_object(Bucket=spec.bucket, Key=key)
            size = int(answer["ContentLength"])
            if size > self.max_file_bytes:
                answer["Body"].close()
                raise SourceReadError(errno.EFBIG, too_large(size, self.max_file_bytes, "object"))
            data: bytes = answer["Body"].read(self.max_file_bytes + 1)
            answer["Body"].close()
        except ClientError as exc:
            if _error_code(exc) in _GONE_CODES:
                raise SourceReadError(errno.ENOENT, "cannot read object: it was deleted") from None
            raise self._unavailable(book_id, "read", exc) from None
        except BotoCoreError as exc:
            raise self._unavailable(book_id, "read", exc) from None
        if len(data) > self.max_file_bytes:  # more than its header said
            raise SourceReadError(errno.EFBIG, too_large(len(data), self.max_file_bytes, "object"))
        if file.version is not None and str(answer["ETag"]).strip('"') != file.version:
            # written since the look: these bytes are not the version it listed (the ETag, not
            # LastModified: a listing may keep milliseconds that the GET's header drops)
            raise SourceReadError(
                errno.EAGAIN, "the object was replaced while it was read; the next run reads it"
            )
        return data

    def is_gone(self, book_id: str, source_file: str | None = None) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        spec = self.books.get(book_id)
        if spec is None:
            return True  # no longer declared: the book is gone
        if source_file is None:
            return False  # a declared book is there (an empty prefix: its files are gone)
        try:
            self.client(spec).head_object(Bucket=spec.bucket, Key=spec.prefix + source_file)
        except ClientError as exc:
            return _error_code(exc) in _GONE_CODES
        except BotoCoreError:
            return False  # cannot tell: nothing is deleted for it
        return False

    def exists(self) -> bool:
        return True  # each book answers for itself (versions, is_gone)

    def locate(self, book_id: str, source_file: str) -> str:
        spec = self.books.get(book_id)
        return f"{spec.s3}{source_file}" if spec else f"{book_id}/{source_file}"

    def describe(self, book_id: str) -> dict[str, str]:
        # (the base's said kind "book": the Dagster UI's source_kind of an S3 book)
        spec = self.books.get(book_id)
        if spec is None:
            return super().describe(book_id)
        return {"kind": "s3", "location": spec.s3, "endpoint": spec.endpoint_url or ""}

    def why_unreadable(self, book_id: str, source_file: str) -> str:
        return f"the object {self.locate(book_id, source_file)} exists but could not be read"

    def why_not_a_book(self, book_id: str) -> str:
        return "is not declared as an object store book"

    def file_now(self, book_id: str, source_file: str) -> FileNow:
        try:
            return super().file_now(book_id, source_file)
        except BookUnavailableError as exc:  # listed, but its read denied or unreachable:
            return FileNow(True, None, str(exc))  # not known to be gone (as a listing failure)
