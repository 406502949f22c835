"""The query service: the retrieval commands as a long-lived HTTP JSON API (FastAPI).

The model and the store are loaded once. Every body is exactly what the matching command
prints with ``--json`` (the same request objects build it); errors are ``{"detail": "..."}``:
400 for bad input (a request without ``book`` included: no book, no answer), 404 for an id the
book does not hold, 422 for a parameter of the wrong type, 502 for a bad answer of the
embedder (a NaN or zero vector, a malformed body), 503 while the store stays busy past its busy
wait or the embedder is unavailable (timeout, 429 after retries, no connection, or a book
indexed with a model this process cannot embed queries with), or a book switched to another
model under a search again and again (:meth:`Service.search`). An embedded
store is shared with ingestion runs through :class:`StoreHolder`.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Annotated, Any, TypeVar
from urllib.parse import parse_qsl

import numpy as np
from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi import params as params_module
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rag_pipeline import __version__
from rag_pipeline.config import EmbedderConfig, Settings
from rag_pipeline.embed import (
    Embedder,
    EmbedderUnavailableError,
    EmbedError,
    EmbedServiceError,
    check_query_vector,
    create_embedder,
    kind_of,
)
from rag_pipeline.embed.base import embedder_source
from rag_pipeline.json_text import json_text
from rag_pipeline.models import validate_book_id
from rag_pipeline.recipes.lazy import LazyRecipe
from rag_pipeline.recipes.recipe import IndexRecipe
from rag_pipeline.retrieve import expand_context, get_document
from rag_pipeline.retrieve.lineage import describe_point, read_point
from rag_pipeline.retrieve.params import (
    BOOK,
    CONTEXT_PARAMS,
    SEARCH_PARAMS,
    Param,
    repeated,
    search_request,
    single_valued,
)
from rag_pipeline.retrieve.request import SearchRequest, results_json
from rag_pipeline.retrieve.search import EmbeddedQuery, Hit, HitGroup, QueryEmbedder
from rag_pipeline.retrieve.view import BookViewError, read_under_one_view, searched_signature
from rag_pipeline.schema import COLLECTION_SCHEMA
from rag_pipeline.serve.holder import StoreHolder
from rag_pipeline.store import (
    BookBusyError,
    BookDamagedError,
    StoreBusyError,
    StoreDamagedError,
    StoreError,
    StoreResourceError,
    StoreUnavailableError,
    VectorStore,
    holds_nothing,
    open_empty_store,
    open_store,
)
from rag_pipeline.store.errors import resource_limit
from rag_pipeline.store.filters import check_point_id

__all__ = [
    "CachedQueryEmbedder",
    "CliJSONResponse",
    "HeadAsGet",
    "Service",
    "create_app",
    "query_recipe",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


class CliJSONResponse(JSONResponse):
    """JSON rendered as the CLI renders ``--json`` (``str()`` for anything else), compact."""

    def render(self, content: Any) -> bytes:
        return json_text(content).encode()


class CachedQueryEmbedder:
    """Query vectors of recent query texts (LRU), in front of the embedder, which runs at most
    ``parallel`` inferences at once (more would only contend for the cores).

    Each book's queries are cached apart (:meth:`for_book`): a hit is answered at once where a
    miss runs the model, and ``/health`` counts hits, so a cache shared by every book told a
    client of one book whether a text had been searched in another."""

    def __init__(self, embedder: QueryEmbedder, size: int = 1024, parallel: int = 1) -> None:
        self._embedder = embedder
        self._size = size
        self._cache: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self._model = threading.BoundedSemaphore(max(parallel, 1))
        self.hits = self.misses = 0

    @property
    def source(self) -> str:
        return embedder_source(self._embedder)

    @property
    def dimension(self) -> int | None:
        dimension = getattr(self._embedder, "dimension", None)
        return dimension if isinstance(dimension, int) else None

    def embed_query(self, text: str, book: str = "") -> np.ndarray:
        """The vector of ``text``, cached among ``book``'s queries."""
        key = (book, text)
        with self._lock:
            vector = self._cache.get(key)
            if vector is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return vector
        with self._model:
            vector = np.array(self._embedder.embed_query(text), dtype=np.float32)
        check_query_vector(vector, self)  # raises: a bad vector is never cached
        vector.setflags(write=False)
        with self._lock:
            self.misses += 1
            if self._size > 0:
                self._cache[key] = vector
                while len(self._cache) > self._size:
                    self._cache.popitem(last=False)
        return vector

    def for_book(self, book: str) -> BookQueries:
        """This cache as one book's searches use it (its own entries only)."""
        return BookQueries(self, book)


class BookQueries:
    """A :class:`CachedQueryEmbedder` seen by one book's searches: a query embedder whose
    cache entries are the book's own."""

    def __init__(self, cache: CachedQueryEmbedder, book: str) -> None:
        self._cache, self._book = cache, book
        self.source = cache.source
        self.dimension = cache.dimension

    def embed_query(self, text: str) -> np.ndarray:
        return self._cache.embed_query(text, self._book)


def warm_up(recipe: IndexRecipe, config: EmbedderConfig) -> None:
    """Load the configured model before the first request when it runs here (a local model).
    An API is not called: one down at the start leaves the service up, answering 503 for the
    queries it must embed and every book indexed with a model made here."""
    if kind_of(config).runs_here:
        recipe.embedder.embed_query("warm up")


def query_recipe(settings: Settings, model_threads: int | None = None) -> tuple[LazyRecipe, int]:
    """The recipes the service embeds queries with (each book's recorded model, each loaded
    once), and how many inferences may run at once: one per ``model_threads`` cores (default:
    every core on one inference at a time).

    Measured on 2 busy cores, MiniLM, 58k chunks, hybrid search over HTTP: 2 threads answer
    one client sooner (p50 11 ms against 14-15 ms with 1 thread), 1 thread with 2 inferences
    at once serves 20 clients 10-15% more requests per second (99 -> 110 in 60 s runs)."""
    config = settings.embedding()
    cores = os.cpu_count() or 1
    threads = min(model_threads or cores, cores)
    if not kind_of(config).runs_here:  # a remote API or the hash stand-in: no threads
        return LazyRecipe(config, settings.chunking()), 4

    def with_threads(config: EmbedderConfig) -> Embedder:
        """A model run here gets the service's threads (a book recorded with another
        provider's model, a change of provider not migrated yet, gets that provider's)."""
        return create_embedder(config, threads=threads)

    recipes = LazyRecipe(config, settings.chunking(), make_embedder=with_threads)
    return recipes, max(cores // threads, 1)


#: book shards the service keeps loaded between requests (the least recently asked closed
#: first): a request for one of them searches at once, another loads its shard first (a few
#: hundredths of a second for a small book, ~0.4 s at a million points). A loaded small book
#: holds ~27 MB of its files' pages, a million-point one ~150 MB plus what its searches read.
SERVED_BOOKS_LOADED = 16
#: books whose recorded model the service remembers at most (a few hundred bytes each; the
#: least recently asked forgotten first, read again from the store when asked)
BOOKS_REMEMBERED = 4096
#: how long the service trusts what it read of a book's recorded model; a reopened store
#: (after an ingest run on the embedded folder) is read again at once
BOOK_MODEL_TTL_S = 30.0


class Service:
    """What the endpoints share: settings, the recipes (each model loaded once), the held
    store, and which model each book's queries are embedded with."""

    def __init__(
        self,
        settings: Settings,
        recipe: IndexRecipe | LazyRecipe,
        *,
        cache_size: int = 1024,
        parallel: int = 1,
        book_ttl_s: float = BOOK_MODEL_TTL_S,
    ):
        self.settings = settings
        self.recipes = (
            recipe
            if isinstance(recipe, LazyRecipe)
            else LazyRecipe(settings.embedding(), settings.chunking(), recipe)
        )
        #: the recipe of a book with nothing indexed yet (the configured one)
        self.recipe = self.recipes.get()
        self._lock = threading.Lock()
        self._cache_size, self._parallel = cache_size, parallel
        self._embedders: dict[str, CachedQueryEmbedder] = {}
        self.embedder = self._embedder_of(self.recipe)
        self._book_ttl_s = book_ttl_s
        #: book -> (its recorded model's recipe, when read, the store opening it was read in,
        #: the signature of the generation the handle read then); the least recently asked
        #: forgotten past :data:`BOOKS_REMEMBERED` (a client naming ever new books must not
        #: grow the process)
        self._books: OrderedDict[str, tuple[IndexRecipe, float, int, str | None]] = OrderedDict()
        config = settings.store()
        self.store_config, self.store_target = config, config.target

        def opener(wait_s: float) -> VectorStore:
            kept = replace(config, busy_wait_s=wait_s, loaded_books=SERVED_BOOKS_LOADED)
            return open_store(kept, COLLECTION_SCHEMA)

        self.holder = StoreHolder(opener, busy_wait_s=config.busy_wait_s)

    def client_text(self, text: str) -> str:
        """An error's text as a client reads it: the store's and the data folder's paths
        named by their settings (``$RAG_QDRANT_PATH/rag_chunks``). The service has no
        authentication: where the files of every book lie is the operator's to know."""
        folders = {
            "$RAG_QDRANT_PATH": self.store_config.path if not self.store_config.url else None,
            "$RAG_DATA_DIR": str(self.settings.data_dir),
        }
        spelled = [
            (form, name)
            for name, folder in folders.items()
            if folder and folder != ":memory:"
            for form in {folder, os.path.abspath(folder), os.path.realpath(folder)}
            if len(form.rstrip("/")) > 1  # "/" or "." would be every path's part
        ]
        for form, name in sorted(spelled, key=lambda pair: -len(pair[0])):  # longest first
            text = text.replace(form.rstrip("/"), name)
        return text

    def busy_text(self, book: str | None, exc: StoreBusyError) -> str:
        """What a client reads of a store (or a book of it) still busy past the busy wait:
        what was busy and what to do, never who holds it (the holder's pid, host, command
        line and run name other books: the log says them)."""
        what = f"book {book!r}" if book and isinstance(exc, BookBusyError) else "the store"
        return (
            f"{what} is in use by another process (a run writing it); waited "
            f"{self.store_config.busy_wait_s:g}s (RAG_BUSY_WAIT_S): ask again shortly"
        )

    def start(self) -> None:
        warm_up(self.recipe, self.settings.embedding())
        self.holder.start()

    def close(self) -> None:
        self.holder.close()

    def read(self, fn: Callable[[VectorStore], T]) -> T:
        """``fn`` of the held store; of an empty one while the store holds nothing yet (a
        read never creates it: :func:`~rag_pipeline.store.holds_nothing`)."""
        if holds_nothing(self.store_config):
            empty = open_empty_store(self.store_config, COLLECTION_SCHEMA)
            try:
                return fn(empty)
            finally:
                empty.close()
        with self.holder.store() as store:
            return fn(store)

    def _embedder_of(self, recipe: IndexRecipe) -> CachedQueryEmbedder:
        with self._lock:
            cached = self._embedders.get(recipe.embedding_model)
            if cached is None:
                cached = CachedQueryEmbedder(recipe.embedder, self._cache_size, self._parallel)
                self._embedders[recipe.embedding_model] = cached
            return cached

    @property
    def query_cache(self) -> dict[str, int]:
        with self._lock:
            embedders = list(self._embedders.values())
        return {"hits": sum(e.hits for e in embedders), "misses": sum(e.misses for e in embedders)}

    def book_recipe(self, store: VectorStore, book_id: str) -> IndexRecipe:
        """The recipe of the model ``book_id`` records (read again after ``book_ttl_s``, once
        the store was reopened, or when the handle reads another generation of the book: it
        may let go of a book and route it again, see LockGroup);
        :class:`RecordedModelUnavailableError` (503) when this process cannot embed with it."""
        return self.book_view(store, book_id)[0]

    def book_view(self, store: VectorStore, book_id: str) -> tuple[IndexRecipe, str | None]:
        """The book's recipe (see :meth:`book_recipe`) and the signature of the generation
        it was read for (:func:`searched_signature`)."""
        signature = searched_signature(store, book_id)  # the generation searched now
        return self.recipe_under(store, book_id, signature), signature

    def recipe_under(self, store: VectorStore, book_id: str, signature: str | None) -> IndexRecipe:
        """The book's recipe (see :meth:`book_recipe`) under the view of its generation
        ``signature`` (read by the caller: :func:`searched_signature`)."""
        opening, now = self.holder.stats.opens, time.monotonic()
        with self._lock:
            known = self._books.get(book_id)
            if known is not None:
                self._books.move_to_end(book_id)
        if (
            known is not None
            and known[2:] == (opening, signature)
            and now - known[1] < self._book_ttl_s
        ):
            return known[0]
        recipe = self.recipes.for_book(store, book_id, purpose="search").recipe
        with self._lock:
            self._books[book_id] = (recipe, now, opening, signature)
            self._books.move_to_end(book_id)
            while len(self._books) > BOOKS_REMEMBERED:
                self._books.popitem(last=False)
        return recipe

    def embed_first(self, request: SearchRequest) -> tuple[str, np.ndarray] | None:
        """The request's query embedded by the model its book records, with the store let go
        of while the model (or an embedding API: seconds, a minute when it is down) runs: a run
        that needs the store meanwhile gets it (it waited behind the request and failed busy).
        (model, vector); None for a search that embeds nothing."""
        if not request.needs_embedder:
            return None
        book = request.book_id
        recipe = self.read(lambda store: self.book_recipe(store, book))
        return recipe.embedding_model, self._embedder_of(recipe).embed_query(request.query, book)

    def search(
        self,
        store: VectorStore,
        request: SearchRequest,
        embedded: tuple[str, np.ndarray] | None = None,
    ) -> list[Hit] | list[HitGroup]:
        """``request`` run with its query embedded by the model of the generation it searches,
        under one view of the book (:func:`~rag_pipeline.retrieve.view.read_under_one_view`,
        the rule of every answer read in several reads): the handle may let go of the book
        between the choice of the model and the search (another request backs off, see
        LockGroup), and an ingest may switch it to another model; then the query is embedded
        again with the new model and searched again. An engine error under an unchanged view,
        where the generation holds vectors of another dimension than the model makes, is a
        :class:`BookViewError` naming both."""
        book_id = request.book_id
        if not request.needs_embedder:
            sparse = self.recipe.sparse
            return read_under_one_view(
                store, book_id, lambda _: request.run(store, None, sparse), what="search"
            )

        def search_under(signature: str | None) -> list[Hit] | list[HitGroup]:
            recipe = self.recipe_under(store, book_id, signature)
            embedder: BookQueries | EmbeddedQuery = self._embedder_of(recipe).for_book(book_id)
            if embedded is not None and embedded[0] == recipe.embedding_model:
                embedder = EmbeddedQuery(embedder, request.query, embedded[1])
            try:
                return request.run(store, embedder, self.recipe.sparse)
            except (StoreBusyError, StoreUnavailableError, StoreResourceError):
                raise  # waited for already: answered as it is
            except StoreError:
                if searched_signature(store, book_id) == signature:
                    held, made = store.dimension_of(book_id), embedder.dimension
                    if held is not None and made is not None and held != made:
                        raise BookViewError(
                            book_id,
                            f"its searched index holds {held}-dimension vectors while the "
                            f"model it records ({recipe.embedding_model}) makes {made}",
                        ) from None
                raise  # read_under_one_view: a switch is searched again, else it stands

        return read_under_one_view(store, book_id, search_under, what="search")


NO_BOOK = "the book query parameter is required: every answer is scoped to one book"
#: endpoints that answer for one book only
TENANT_PATHS = ("search", "context", "document", "lineage")


def _book(book: str | None) -> str:
    if not book:
        raise HTTPException(400, NO_BOOK)
    try:
        return validate_book_id(book)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None


def _point(value: str) -> str:
    try:
        return check_point_id(value)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None


def _refuse_ambiguous(
    query: QueryParams,
    raw_query: bytes,
    known: frozenset[str],
    single: frozenset[str],
    in_path: frozenset[str],
) -> None:
    """400 naming the first parameter that would give the request another meaning than the
    one read: a name or value whose percent-escapes are not UTF-8 text (the service would
    read U+FFFD in its place and search for that), a name the route does not take (a
    misspelled filter would be dropped: a wider answer than asked), one that takes one value
    given more than once (:func:`~rag_pipeline.retrieve.params.repeated`), or a path
    parameter repeated in the query."""
    for name, value in parse_qsl(
        raw_query.decode("latin-1"), keep_blank_values=True, errors="surrogateescape"
    ):
        for text in (name, value):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                shown = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
                raise HTTPException(
                    400, f"query parameter {shown!r} is not UTF-8 text (percent-encode UTF-8)"
                ) from None
    for name in query:  # each name once, in the request's order
        if name in in_path:
            raise HTTPException(
                400, f"{name!r} is a path parameter: it cannot also be given in the query"
            )
        if name not in known:
            raise HTTPException(
                400, f"unknown query parameter {name!r}; this path takes {', '.join(sorted(known))}"
            )
    twice = repeated([name for name, _ in query.multi_items()], single)
    if twice is not None:
        raise HTTPException(
            400, f"query parameter {twice[0]!r} is given {twice[1]} times: it takes one value"
        )


def one_meaning(
    params: Sequence[Param], *, query: Sequence[str] = (), path: Sequence[str] = ()
) -> params_module.Depends:
    """A route's dependency that refuses an ambiguous request before any parameter is read
    (:func:`_refuse_ambiguous`): the route takes the query parameters ``params`` and
    ``query``, each one value unless repeatable; its ``path`` names cannot be given in the
    query too."""
    known = frozenset(p.name for p in params) | frozenset(query)
    single = single_valued(params) | frozenset(query)
    in_path = frozenset(path)

    def refuse(request: Request) -> None:
        raw = request.scope.get("query_string", b"")
        _refuse_ambiguous(request.query_params, raw, known, single, in_path)

    depends: params_module.Depends = Depends(refuse)
    return depends


def declared(params: Sequence[Param]) -> Callable[..., dict[str, Any]]:
    """A dependency whose query parameters are ``params`` (name, default, bounds, choices,
    repeatable: :mod:`rag_pipeline.retrieve.params`), returning their values. Each value is
    taken as text and read by :meth:`Param.read`, the CLI's rule (FastAPI's types took
    ``limit=1.0``); the documented schema is the parameter's type. A value refused is a 422
    naming the parameter, as FastAPI's own."""

    def values(**given: Any) -> dict[str, Any]:
        read: dict[str, Any] = {}
        for p in params:
            text = given[p.name]
            if text is None:
                read[p.name] = p.default
            elif p.repeatable:
                read[p.name] = [_read(p, t) for t in text]
            else:
                read[p.name] = _read(p, text)
        return read

    values.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                p.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=Query(None, description=p.help),
                annotation=_annotation(p),
            )
            for p in params
        ]
    )
    return values


def _read(p: Param, text: str) -> Any:
    try:
        return p.read(text)
    except ValueError as exc:
        problem = {"loc": ("query", p.name), "msg": str(exc)}  # the message shows the text
        raise RequestValidationError([problem]) from None


def _annotation(p: Param) -> Any:
    """Text (read by :func:`_read`); the document shows the parameter's type
    (:func:`documented`)."""
    return list[str] | None if p.repeatable else str | None


def param_schema(p: Param) -> dict[str, Any]:
    """The OpenAPI schema of a declared parameter: its type, bounds, choices and default."""
    schema: dict[str, Any] = {"type": {int: "integer", float: "number"}.get(p.kind, "string")}
    if p.choices:
        schema["enum"] = list(p.choices)
    if p.minimum is not None:
        schema["minimum"] = p.minimum
    if p.maximum is not None:
        schema["maximum"] = p.maximum
    if p.repeatable:
        return {"type": "array", "items": schema, "title": p.name}
    if p.default is not None:
        schema["default"] = p.default
    return {**schema, "title": p.name}


BookParam = Annotated[str | None, Query(description=BOOK.help)]
SearchValues = Annotated[dict[str, Any], Depends(declared(SEARCH_PARAMS))]
ContextValues = Annotated[dict[str, Any], Depends(declared(CONTEXT_PARAMS))]


def create_app(
    settings: Settings,
    recipe: IndexRecipe | LazyRecipe,
    *,
    cache_size: int = 1024,
    parallel: int = 1,
) -> FastAPI:
    """The application; the store is opened on the first request and held while useful.
    ``recipe``: every book's, or the recipes of the settings (see :func:`query_recipe`, which
    also says ``parallel``: query inferences at once)."""
    service = Service(settings, recipe, cache_size=cache_size, parallel=parallel)
    recipe = service.recipe
    source = settings.source()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.start()
        try:
            yield
        finally:
            service.close()

    app = FastAPI(
        title="rag-pipeline",
        version=__version__,
        description="Tenant-scoped retrieval over the indexed books. Every answer is the "
        "`--json` output of the matching `rag-pipeline` command.",
        lifespan=lifespan,
        default_response_class=CliJSONResponse,
    )
    app.state.service = service
    app.add_middleware(HeadAsGet)
    app.openapi = lambda: documented(app)  # type: ignore[method-assign]

    @app.exception_handler(StoreError)
    async def store_error(request: Request, exc: StoreError) -> Response:
        # a busy store, one book's damaged index (its next ingest rebuilds it), a limit of
        # the machine: 503
        busy = isinstance(
            exc, StoreBusyError | StoreUnavailableError | BookDamagedError | StoreResourceError
        )
        status = 503 if busy else 500
        if isinstance(exc, StoreDamagedError):
            log.error("damaged store: %s", exc)
        elif isinstance(exc, StoreBusyError):
            log.warning("%s", exc)  # who holds it: the operator's to read, not the client's
        detail = service.client_text(str(exc))
        if isinstance(exc, StoreBusyError):
            detail = service.busy_text(request.query_params.get("book"), exc)
        return CliJSONResponse({"detail": detail}, status_code=status)

    @app.exception_handler(OSError)
    async def os_error(request: Request, exc: OSError) -> Response:
        # a limit of the machine met outside the store's own calls (a full disk, no
        # descriptors left): 503 naming it; any other OSError is a bug: 500
        limit = resource_limit(exc)
        if limit is None:
            log.error("unexpected error", exc_info=exc)
            return CliJSONResponse({"detail": "internal error"}, status_code=500)
        return CliJSONResponse({"detail": service.client_text(f"{limit}: {exc}")}, status_code=503)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        # no book, no answer: that comes first, whatever else is wrong with the request
        tenant_path = request.url.path.strip("/").split("/")[0] in TENANT_PATHS
        if tenant_path and not request.query_params.get("book"):
            return CliJSONResponse({"detail": NO_BOOK}, status_code=400)
        return CliJSONResponse({"detail": invalid_parameters(exc)}, status_code=422)

    @app.exception_handler(EmbedError)
    async def embed_error(request: Request, exc: EmbedError) -> Response:
        # the embedder unavailable (timeout, 429 after retries, connection): 503; a bad
        # answer or another failure of the embedding service: 502; a setting's fault: 500
        if isinstance(exc, EmbedderUnavailableError):
            status = 503
        elif isinstance(exc, EmbedServiceError):
            status = 502
        else:
            status = 500
        return CliJSONResponse({"detail": str(exc)}, status_code=status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # as FastAPI answers it; a 405's Allow names HEAD beside GET (HeadAsGet answers it)
        headers = dict(exc.headers or {})
        allow = [m.strip() for m in headers.get("Allow", "").split(",") if m.strip()]
        if "GET" in allow and "HEAD" not in allow:
            headers["Allow"] = ", ".join([*allow, "HEAD"])
        return await http_exception_handler(
            request, StarletteHTTPException(exc.status_code, exc.detail, headers=headers or None)
        )

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> Response:
        # a bug, answered with the documented error body (Starlette's own was a text/plain
        # "Internal Server Error"); never the exception's text, which may name a path or a
        # value of another request. Starlette raises it on to the server, which logs it
        # with its traceback
        return CliJSONResponse({"detail": "internal error"}, status_code=500)

    @app.exception_handler(BookViewError)
    async def book_view_error(request: Request, exc: BookViewError) -> Response:
        return CliJSONResponse({"detail": str(exc)}, status_code=503)

    @app.get("/health")
    def health() -> Response:
        """Liveness and what the service serves (does not touch the store)."""
        stats = service.holder.stats
        body = {
            "status": "ok",
            "version": __version__,
            "collection": settings.collection,
            "store": service.store_target,
            "store_open": service.holder.is_open,
            "store_opens": stats.opens,
            "store_step_asides": stats.step_asides,
            "embedding_model": recipe.embedding_model,
            "sparse_model": recipe.sparse.name,
            "query_cache": service.query_cache,
        }
        return CliJSONResponse(body)

    @app.get("/search", dependencies=[one_meaning([BOOK, *SEARCH_PARAMS], query=["q"])])
    def search(
        values: SearchValues,
        q: Annotated[str, Query(description="the query text")],
        book: BookParam = None,
    ) -> Response:
        """`rag-pipeline search --json`: hits, or groups `{source_file, parent_doc_id, title,
        score, hits}` with `group_by=file`."""
        book_id = _book(book)
        try:
            request = search_request(q, book_id, values)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None

        try:
            embedded = service.embed_first(request)
            results = service.read(lambda store: service.search(store, request, embedded))
        except ValueError as exc:  # a filter the engine refuses
            raise HTTPException(400, str(exc)) from None
        return CliJSONResponse(results_json(results))

    @app.get(
        "/context/{chunk_id}",
        dependencies=[one_meaning([BOOK, *CONTEXT_PARAMS], path=["chunk_id"])],
    )
    def context(
        chunk_id: Annotated[str, Path(description="a chunk's point id")],
        values: ContextValues,
        book: BookParam = None,
    ) -> Response:
        """`rag-pipeline context --json`: the chunk and its neighbours, in order."""
        book_id, point = _book(book), _point(chunk_id)
        hits = service.read(
            lambda s: expand_context(s, book_id, point, prev=values["prev"], next=values["next"])
        )
        return _found(hits and results_json(hits), f"no chunk {point} in book {book_id}")

    @app.get(
        "/document/{parent_doc_id}", dependencies=[one_meaning([BOOK], path=["parent_doc_id"])]
    )
    def document(
        parent_doc_id: Annotated[str, Path(description="a document's id (parent_doc_id)")],
        book: BookParam = None,
    ) -> Response:
        """`rag-pipeline document --json`: every chunk of the document, in order."""
        book_id, doc = _book(book), _point(parent_doc_id)
        hits = service.read(lambda s: get_document(s, book_id, doc))
        return _found(hits and results_json(hits), f"no document {doc} in book {book_id}")

    @app.get("/lineage/{point_id}", dependencies=[one_meaning([BOOK], path=["point_id"])])
    def lineage(
        point_id: Annotated[str, Path(description="a point id")],
        book: BookParam = None,
    ) -> Response:
        """`rag-pipeline lineage --json`: file, section, hashes, run and model of a point."""
        book_id, point = _book(book), _point(point_id)
        record = service.read(lambda s: read_point(s, book_id, point))
        if record is None:
            raise HTTPException(404, f"no point {point} in book {book_id}")
        # the source is asked with the store let go of: a remote may take seconds, and a run
        # waiting for the store meanwhile would fail busy
        return CliJSONResponse(
            describe_point(record, source, book_id, dagster_url=settings.dagster_url)
        )

    return app


class HeadAsGet:
    """HEAD of any path answered as GET answers it, without the body (RFC 9110: a server that
    answers GET answers HEAD; FastAPI's routes answered 405, a monitor's HEAD /health
    included). The status and headers are GET's, Content-Length included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return  # a part of the body: only its end is passed on, empty
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)


#: the body of every error the service answers (a 422 too: see :func:`invalid_parameters`)
ERROR_BODY: dict[str, Any] = {
    "title": "Error",
    "type": "object",
    "properties": {"detail": {"type": "string", "title": "Detail"}},
    "required": ["detail"],
}


def documented(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document, describing what the service reads and sends: each declared
    parameter with its type (:func:`param_schema`; FastAPI sees text), and the 422 body as the
    one sent (:data:`ERROR_BODY`; FastAPI documents its own list of objects)."""
    if app.openapi_schema is None:
        schema = FastAPI.openapi(app)
        declared = {p.name: p for p in (*SEARCH_PARAMS, *CONTEXT_PARAMS)}
        for methods in schema.get("paths", {}).values():
            for operation in methods.values():
                for parameter in operation.get("parameters", []):
                    if parameter["in"] == "query" and parameter["name"] in declared:
                        parameter["schema"] = param_schema(declared[parameter["name"]])
        schemas = schema.get("components", {}).get("schemas", {})
        schemas.pop("ValidationError", None)
        if "HTTPValidationError" in schemas:
            schemas["HTTPValidationError"] = ERROR_BODY
        app.openapi_schema = schema
    return app.openapi_schema


def invalid_parameters(exc: RequestValidationError) -> str:
    """The reason of a 422 as every other error gives one, a text (FastAPI's is a list of
    objects): each parameter named with what is wrong and the value given."""
    problems = []
    for error in exc.errors():
        where = [str(part) for part in error.get("loc", ()) if part not in ("query", "path")]
        name = ".".join(where) or "request"
        given = error.get("input")
        shown = f" (given {str(given)[:80]!r})" if isinstance(given, str | int | float) else ""
        problems.append(f"parameter {name!r}: {error.get('msg', 'invalid')}{shown}")
    return "; ".join(problems) or "invalid request"


def _found(body: Any, missing: str) -> Response:
    """``body`` as JSON; 404 saying ``missing`` when there is nothing (an id the book does
    not hold)."""
    if not body:
        raise HTTPException(404, missing)
    return CliJSONResponse(body)
