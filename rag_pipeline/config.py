"""Settings: read once from the environment (``RAG_*``, ``OPENAI_*``), validated, no dagster here.

:class:`Settings` is the only place a default is written. Components never read the environment
themselves: each is handed the small frozen config it needs (the book source,
:class:`ChunkingConfig`, :class:`StoreConfig`) by whoever built the settings.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from pydantic_settings import SettingsError as EnvParseError

from rag_pipeline.sources.base import (
    DEFAULT_HARDWARE_TIER,
    DEFAULT_MAX_FILE_BLOCKS,
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_PATH_PATTERNS,
)
from rag_pipeline.urls import shown_url

if TYPE_CHECKING:
    from rag_pipeline.ingest.live import LiveTiming
    from rag_pipeline.sources.base import BookSource, ParseOptions

__all__ = [
    "COLLECTION_PATTERN",
    "DEFAULT_MAX_FILE_BLOCKS",
    "DEFAULT_PATH_PATTERNS",
    "DEFAULT_SENSOR_INTERVAL_S",
    "BatchConfig",
    "ChunkingConfig",
    "DagsterStateError",
    "EmbedderConfig",
    "Settings",
    "SettingsError",
    "StoreConfig",
    "describe_validation_error",
    "ensure_dagster_home",
    "load_settings",
]

#: the settings that hold a secret: validated as keys, and never shown in a message
SECRET_FIELDS = ("openai_api_key", "qdrant_api_key")
#: a collection name is also a folder name of the embedded stores: no separators, no dots
COLLECTION_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
_PATH_GROUPS = {"module", "chapter", "lesson"}
#: Seconds between books_sensor ticks (RAG_SENSOR_INTERVAL_S). Dagster's sensor daemon looks at
#: its sensors once every 5 s and skips one whose last tick started less than its interval ago,
#: measured from a moment a few ms into the previous pass: 4 ticks on every pass (5 s), while at
#: 5 whether a pass ticks is a matter of milliseconds (5 or 10 s). A warm tick at 200 books
#: costs 0.08 CPU s; freshness and idle CPU are measured in docs/benchmarks.md (section 14).
DEFAULT_SENSOR_INTERVAL_S = 4


class SettingsError(ValueError):
    """A setting is missing, malformed or out of range; the message names the variable."""


class DagsterStateError(RuntimeError):
    """The Dagster instance in ``DAGSTER_HOME`` cannot be used as it is (a damaged database):
    the message names the file and how to recover. Failed work, not a bad setting."""


@dataclass(frozen=True, slots=True)
class BatchConfig:
    """How many books (``RAG_BATCH_BOOKS``) and files to read (``RAG_BATCH_FILES``) one run
    takes at most (see :mod:`rag_pipeline.ingest.batches`); ``max_books=1`` runs every book
    alone."""

    max_books: int = 50
    max_files: int = 500


@dataclass(frozen=True, slots=True)
class ChunkingConfig:
    """Token budget of the chunker (counted with the embedder's own tokenizer)."""

    target_tokens: int = 400
    max_tokens: int = 512
    min_tokens: int = 100
    overlap: float = 0.15
    #: Markdown blocks (every heading, paragraph, list item, fence, table... nested ones too)
    #: a file may hold: markdown-it holds about 1.3 kB and 40 us per block, so a file of tiny
    #: blocks (1 MB of "a\n\n" is 333k) is refused once past it, not parsed whole
    max_blocks: int = DEFAULT_MAX_FILE_BLOCKS


@dataclass(frozen=True, slots=True)
class EmbedderConfig:
    """Which model turns text into dense vectors, and how it is reached."""

    provider: str  # an embedder of rag_pipeline.embed.registry (validated by Settings)
    local_model_dir: Path | None
    cache_dir: Path
    batch_size: int
    openai_api_key: str | None
    openai_base_url: str | None
    openai_model: str
    openai_timeout_s: float
    openai_max_retries: int
    local_precision: Literal["fp32", "int8", "auto"]
    openai_concurrency: int
    openai_requests_per_minute: int | None
    openai_tokens_per_minute: int | None
    #: the dimension of the ``hash`` test embedder (its model is ``hash-<dimension>``)
    hash_dimension: int = 384


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Which Qdrant the index lives in: a server (``url``), an embedded folder, or memory."""

    collection: str
    path: str
    url: str | None
    api_key: str | None
    embedded: Literal["client", "edge"]
    busy_wait_s: float
    timeout_s: float
    retries: int
    shards: int | None = None
    replication_factor: int | None = None
    #: after a book's switch to a new recipe, keep its old generation (``old-<name>``) for
    #: comparison instead of removing it (embedded Edge store only)
    keep_old_recipe: bool = False
    #: book shards one Qdrant Edge handle keeps loaded, least recently used closed first: a
    #: handle that walks every book keeps few; the query service keeps more (see serve/app.py)
    loaded_books: int = 2

    @property
    def target(self) -> str:
        """What a user reads in messages: the server URL or the engine and folder."""
        return shown_url(self.url) if self.url else f"{self.embedded}:{self.path}"


_CHUNKING = ChunkingConfig()


class Settings(BaseSettings):
    """Everything the pipeline, the CLI and the Dagster definitions read from the environment."""

    model_config = SettingsConfigDict(
        env_prefix="RAG_", frozen=True, extra="ignore", populate_by_name=True
    )

    data_dir: Path = Path("data/books")
    # the sources file: books declared once (git repositories, S3 prefixes), beside the
    # folder books of RAG_DATA_DIR (rag_pipeline/sources/declared.py)
    sources: Path | None = None
    qdrant_path: str = Field(".rag/qdrant", min_length=1)
    qdrant_url: str | None = None
    qdrant_api_key: SecretStr | None = None
    # collection layout on a server / cluster (ignored by the embedded stores)
    qdrant_shards: int | None = Field(None, ge=1, le=1024)
    qdrant_replication_factor: int | None = Field(None, ge=1, le=64)
    qdrant_timeout_s: float = Field(30.0, gt=0, le=3600)
    qdrant_retries: int = Field(4, ge=1, le=100)
    # Engine for the embedded folder: "edge" (Qdrant Edge: payload indexes, fast filtered and
    # sparse search) or "client" (qdrant-client local mode: brute force in Python). Measured
    # in docs/benchmarks.md.
    qdrant_embedded: Literal["client", "edge"] = "edge"
    collection: str = "rag_chunks"
    cache_dir: Path = Path(".rag/cache")
    embedder: str = "local"  # a name of rag_pipeline.embed.registry.EMBEDDERS
    local_model_dir: Path | None = None
    embed_batch_size: int = Field(32, ge=1, le=4096)
    openai_api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("OPENAI_API_KEY", "RAG_OPENAI_API_KEY")
    )
    openai_base_url: str | None = Field(
        None, validation_alias=AliasChoices("OPENAI_BASE_URL", "RAG_OPENAI_BASE_URL")
    )
    openai_model: str = "text-embedding-3-small"
    openai_timeout_s: float = Field(30.0, gt=0, le=3600)
    openai_max_retries: int = Field(5, ge=0, le=100)
    max_file_bytes: int = Field(DEFAULT_MAX_FILE_BYTES, ge=1, le=1 << 30)
    # how long a command waits for an embedded store that another process holds
    busy_wait_s: float = Field(30.0, ge=0, le=86400)
    # `serve`: the time a client has to send a whole request (its headers and body), and
    # the connections held at most (default: 1024, at most half the open-files limit)
    serve_read_timeout_s: float = Field(10.0, gt=0, le=3600)
    serve_max_connections: int | None = Field(None, ge=1, le=1_000_000)
    # after a book switches to a new recipe (built beside the old one), keep the old index
    keep_old_recipe: bool = False
    # read as raw text, so that malformed JSON is reported by the validator below
    path_patterns: Annotated[tuple[str, ...], NoDecode] = DEFAULT_PATH_PATTERNS
    default_hardware_tier: int = Field(DEFAULT_HARDWARE_TIER, ge=0, le=1000)
    chunk_target_tokens: int = Field(_CHUNKING.target_tokens, ge=16, le=100_000)
    chunk_max_tokens: int = Field(_CHUNKING.max_tokens, ge=16, le=100_000)
    chunk_min_tokens: int = Field(_CHUNKING.min_tokens, ge=0, le=100_000)
    chunk_overlap: float = Field(_CHUNKING.overlap, ge=0.0, lt=0.5)
    max_file_blocks: int = Field(_CHUNKING.max_blocks, ge=1, le=100_000_000)
    sensor_interval_s: int = Field(DEFAULT_SENSOR_INTERVAL_S, ge=1, le=86400)
    # Books that change together share a run (a partition range): at most this many books,
    # and this many files to read (a kill mid-run costs at most that much work to redo).
    # RAG_BATCH_BOOKS=1 gives every book a run of its own (rag_pipeline/ingest/batches.py).
    batch_books: int = Field(50, ge=1, le=10_000)
    batch_files: int = Field(500, ge=1, le=10_000_000)
    # live mode (`rag-pipeline watch`): quiet after a file's latest change before it is
    # applied (a writer's burst is one change), in milliseconds
    live_debounce_ms: int = Field(100, ge=0, le=60_000)
    # live mode: changes of different books applied at once (one book's never side by side)
    live_workers: int = Field(2, ge=1, le=64)
    # where `lineage` points its run links (the Dagster webserver)
    dagster_url: str = "http://127.0.0.1:3000"
    # Local model precision: fp32, int8 (ONNX Runtime dynamic quantization, its own
    # embedding_model name) or auto, the default: int8 on CPUs with VNNI/AMX int8 instructions
    # (2x faster there; the default mode's SciFact nDCG@10 -0.0051, within the 0.01 issue 21
    # accepts, docs/benchmarks.md), fp32 elsewhere. Under auto a book already indexed keeps its
    # recorded precision (ingest/choice.py): an upgrade re-embeds nothing.
    local_precision: Literal["fp32", "int8", "auto"] = "auto"
    # OpenAI: requests in flight at once within one embed call, and optional client-side
    # limits (none when unset) that no request goes over, in any 60-second window.
    openai_concurrency: int = Field(4, ge=1, le=64)
    openai_requests_per_minute: int | None = Field(None, ge=1, le=1_000_000_000)
    openai_tokens_per_minute: int | None = Field(None, ge=1, le=1_000_000_000_000)
    # The hash test embedder's dimension: its model name is hash-<dimension>, so a change is
    # a recipe change (a change of model and dimension, built beside and switched per book).
    hash_dimension: int = Field(384, ge=8, le=4096)

    def source(self) -> BookSource:
        """The books: a folder per book under ``RAG_DATA_DIR``, and the books ``RAG_SOURCES``
        declares (their git clones cached under ``RAG_CACHE_DIR``)."""
        from rag_pipeline.sources.folder import FolderSource

        folder = FolderSource(Path(self.data_dir), max_file_bytes=self.max_file_bytes)
        if self.sources is None:
            return folder
        from rag_pipeline.sources.declared import DeclaredSources, SourcesFileError

        try:
            return DeclaredSources(
                folder,
                self.sources,
                cache_dir=Path(self.cache_dir),
                max_file_bytes=self.max_file_bytes,
            )
        except SourcesFileError as exc:
            raise SettingsError(f"invalid configuration: {exc}") from None

    def parsing(self) -> ParseOptions:
        """How a file's bytes become a document (path patterns, default hardware tier, limits)."""
        from rag_pipeline.sources.base import ParseOptions

        return ParseOptions(
            tuple(self.path_patterns),
            self.default_hardware_tier,
            self.max_file_bytes,
            self.max_file_blocks,
        )

    def batching(self) -> BatchConfig:
        return BatchConfig(self.batch_books, self.batch_files)

    def live_timing(self) -> LiveTiming:
        from rag_pipeline.ingest.live import LiveTiming

        return LiveTiming(debounce_s=self.live_debounce_ms / 1000)

    def chunking(self) -> ChunkingConfig:
        return ChunkingConfig(
            self.chunk_target_tokens,
            self.chunk_max_tokens,
            self.chunk_min_tokens,
            self.chunk_overlap,
            self.max_file_blocks,
        )

    def embedding(self) -> EmbedderConfig:
        return EmbedderConfig(
            provider=self.embedder,
            local_model_dir=self.local_model_dir,
            cache_dir=Path(self.cache_dir),
            batch_size=self.embed_batch_size,
            openai_api_key=self.openai_api_key.get_secret_value() if self.openai_api_key else None,
            openai_base_url=self.openai_base_url,
            openai_model=self.openai_model,
            openai_timeout_s=self.openai_timeout_s,
            openai_max_retries=self.openai_max_retries,
            local_precision=self.local_precision,
            openai_concurrency=self.openai_concurrency,
            openai_requests_per_minute=self.openai_requests_per_minute,
            openai_tokens_per_minute=self.openai_tokens_per_minute,
            hash_dimension=self.hash_dimension,
        )

    def store(self) -> StoreConfig:
        return StoreConfig(
            collection=self.collection,
            path=self.qdrant_path,
            url=self.qdrant_url,
            api_key=self.qdrant_api_key.get_secret_value() if self.qdrant_api_key else None,
            embedded=self.qdrant_embedded,
            busy_wait_s=self.busy_wait_s,
            timeout_s=self.qdrant_timeout_s,
            retries=self.qdrant_retries,
            shards=self.qdrant_shards,
            replication_factor=self.qdrant_replication_factor,
            keep_old_recipe=self.keep_old_recipe,
        )

    @field_validator("path_patterns", mode="before")
    @classmethod
    def _patterns_from_json(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise ValueError(f"not a JSON list of regexes: {exc}") from None
            if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
                raise ValueError("must be a JSON list of regex strings")
            return tuple(value)
        return value

    @field_validator("path_patterns")
    @classmethod
    def _patterns_compile(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"invalid regex {pattern!r}: {exc}") from None
            unknown = set(compiled.groupindex) - _PATH_GROUPS
            if unknown:
                raise ValueError(
                    f"regex {pattern!r} has groups {sorted(unknown)}; "
                    f"only {sorted(_PATH_GROUPS)} are read"
                )
        return value

    @field_validator("sources", mode="before")
    @classmethod
    def _unset_when_blank(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("sources")
    @classmethod
    def _sources_file_is_valid(cls, value: Path | None) -> Path | None:
        if value is not None:
            from rag_pipeline.sources.declared import SourcesFileError, load_sources

            try:
                load_sources(value)
            except SourcesFileError as exc:  # after "RAG_SOURCES='file': ": the entry, the field
                raise ValueError(exc.problem) from None
        return value

    @field_validator("data_dir", "cache_dir", "local_model_dir", "qdrant_path", mode="before")
    @classmethod
    def _path_is_not_blank(cls, value: object) -> object:
        # An empty value would mean the current folder: for RAG_DATA_DIR, whatever folders it
        # holds would be taken for books (and the indexed ones for removed).
        if isinstance(value, str) and not value.strip():
            raise ValueError("is empty: set a folder path, or unset it for the default")
        return value

    @field_validator("qdrant_url", "openai_base_url", mode="before")
    @classmethod
    def _empty_url_is_none(cls, value: object) -> object:
        return value or None

    @field_validator("qdrant_url", "openai_base_url", "dagster_url")
    @classmethod
    def _url_has_scheme_and_host(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises ValueError on a malformed port
        except ValueError as exc:
            raise ValueError(f"malformed URL {value!r}: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"malformed URL {value!r}: expected http(s)://host[:port]")
        if not _is_host(parts.hostname) or not _is_clean_text(value):
            raise ValueError(
                f"malformed URL {value!r}: its host is not a host name or address, or it "
                "holds spaces, control characters or bytes that are not UTF-8"
            )
        return value.rstrip("/")

    @field_validator(*SECRET_FIELDS, mode="before")
    @classmethod
    def _key_fits_a_header(cls, value: object) -> object:
        # sent in an HTTP header: a key with a non-ASCII character failed every request with
        # an encoding error naming the header, one with a newline (read from a file) or only
        # spaces was refused by the server as a wrong key. Empty is unset. The key is never
        # shown (the message says what is wrong with it).
        if isinstance(value, str) and value:
            if not value.strip():
                raise ValueError("is blank: set the key, or unset it")
            odd = next(
                (c for c in value if not (c.isascii() and c.isprintable()) or c == " "), None
            )
            if odd is not None:
                where = "a space" if odd == " " else f"character U+{ord(odd):04X}"
                raise ValueError(
                    f"holds {where}: a key is printable ASCII without spaces (a trailing "
                    "newline read from a file?)"
                )
        return value

    @field_validator("openai_model")
    @classmethod
    def _model_is_named(cls, value: str) -> str:
        if not value.strip() or value != value.strip():
            raise ValueError("must name a model, without surrounding spaces")
        return value

    @field_validator("embedder")
    @classmethod
    def _known_embedder(cls, value: str) -> str:
        from rag_pipeline.embed.registry import kind_of  # it reads this module's configs

        return kind_of(value).name

    @field_validator("collection")
    @classmethod
    def _safe_collection(cls, value: str) -> str:
        if not COLLECTION_PATTERN.fullmatch(value):
            raise ValueError(
                f"invalid collection name {value!r}: use 1-100 letters, digits, '_' or '-', "
                "starting with a letter or digit"
            )
        return value

    @model_validator(mode="after")
    def _chunk_budget_is_coherent(self) -> Settings:
        if self.chunk_target_tokens > self.chunk_max_tokens:
            raise ValueError(
                f"RAG_CHUNK_TARGET_TOKENS ({self.chunk_target_tokens}) is above "
                f"RAG_CHUNK_MAX_TOKENS ({self.chunk_max_tokens})"
            )
        if self.chunk_min_tokens > self.chunk_target_tokens:
            raise ValueError(
                f"RAG_CHUNK_MIN_TOKENS ({self.chunk_min_tokens}) is above "
                f"RAG_CHUNK_TARGET_TOKENS ({self.chunk_target_tokens})"
            )
        return self


def _is_host(host: str) -> bool:
    """``host`` (as :func:`urlsplit` gives it) is an IP address or a host name a resolver
    takes: labels of letters, digits, "-" and "_" once IDNA-encoded (a space, an empty label or a
    byte that is not UTF-8 failed the first request with an error of the HTTP client)."""
    import ipaddress

    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    try:
        name = host.encode("idna").decode("ascii")
    except UnicodeError:
        return False
    return re.fullmatch(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?", name) is not None


def _is_clean_text(value: str) -> bool:
    """``value`` is UTF-8 text without spaces or control characters."""
    return value.isprintable() and " " not in value and _is_utf8(value)


def _is_utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a byte that is not UTF-8, kept as a lone surrogate
        return False
    return True


def _variable(field: str) -> str:
    """The environment variable a settings field is read from (``field`` may be the alias
    a value was read by, e.g. ``OPENAI_API_KEY``: that is the variable)."""
    if _field_of(field) != field:
        return field
    info = Settings.model_fields.get(field)
    alias = info.validation_alias if info is not None else None
    if isinstance(alias, AliasChoices):
        return str(alias.choices[0])
    return f"RAG_{field.upper()}"


def _field_of(name: str) -> str:
    """The settings field ``name`` is, or an alias of (an error's location names either)."""
    for field, info in Settings.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices) and name in alias.choices:
            return field
    return name


def describe_validation_error(exc: ValidationError) -> str:
    """One line per problem, each naming the environment variable and the value it had."""
    lines = []
    for error in exc.errors(include_url=False):
        field = ".".join(str(part) for part in error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        if not field:  # a model-level check names its variables itself
            lines.append(message)
            continue
        value: Any = error.get("input")
        shown = (
            ""
            if value is None or isinstance(value, dict) or _field_of(field) in SECRET_FIELDS
            else f"={str(value)[:80]!r}"
        )
        lines.append(f"{_variable(field)}{shown}: {message}")
    return "; ".join(lines)


def load_settings(**overrides: Any) -> Settings:
    """Read settings from the environment, with explicit overrides winning.

    Raises :class:`SettingsError` naming every bad variable (never a raw traceback)."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError(f"invalid configuration: {describe_validation_error(exc)}") from None
    except EnvParseError as exc:  # a value the environment source could not even decode
        field = re.search(r'field "(\w+)"', str(exc))
        name = _variable(field.group(1)) if field else "a RAG_ variable"
        raise SettingsError(f"invalid configuration: {name}: {exc}") from None


def ensure_dagster_home(default: Path | str = ".dagster_home") -> Path:
    """``DAGSTER_HOME`` (set to ``./.dagster_home`` when unset), with a dagster.yaml in it: the
    project's own (found beside the package, wherever the command runs), else telemetry off.
    An existing one is reviewed (:mod:`rag_pipeline.dagster_yaml`): an unmodified earlier
    version of the project's is replaced, one lacking what the product relies on is named on
    stderr with the fix."""
    from rag_pipeline.dagster_yaml import project_dagster_yaml, review_home_config

    home = Path(os.environ.get("DAGSTER_HOME") or Path(default).resolve())
    if not home.is_absolute():
        raise SettingsError(f"DAGSTER_HOME={str(home)!r}: must be an absolute path")
    if home.exists() and not home.is_dir():
        raise SettingsError(f"DAGSTER_HOME={str(home)!r}: is a file, not a folder")
    try:
        home.mkdir(parents=True, exist_ok=True)
        os.environ["DAGSTER_HOME"] = str(home)
        config = home / "dagster.yaml"
        if not config.exists():
            project_yaml = project_dagster_yaml()
            text = (
                project_yaml.read_text()
                if project_yaml is not None
                else "telemetry:\n  enabled: false\n"
            )
            # Written aside and renamed: a process starting alongside never reads half a file.
            part = config.with_name(f".dagster.yaml.{os.getpid()}")
            part.write_text(text)
            os.replace(part, config)
        notice = review_home_config(home).notice
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""  # which file of the home
        raise SettingsError(f"DAGSTER_HOME={str(home)!r}: {where}{exc.strerror or exc}") from None
    if notice:
        print(notice, file=sys.stderr)
    return home
