"""Cost of a change against the collection size: N books of F files, through the CLI.

    python bench/scale.py [--books 5 50 1000] [--files 20] [--work DIR] [--json]
                          [--corpus ../shared/corpora/powershell-docs/books] [--no-sensor]
                          [--prebuilt] [--rounds 7]
                          [--sensor-tree 1000x100] [--big-book 1000000] [--queries 200]

For each N, builds N books of F Markdown files copied from the shared powershell-docs corpus
(or, when it is absent, the test fixtures), each copy ending with a line that names its book
and file so that no two files are identical. With the hash embedder (the pipeline's own cost,
not the model's) and a fresh store, cache and DAGSTER_HOME per size, runs `rag-pipeline` under
`/usr/bin/time -v` for: (a) the first ingest (and how many Dagster runs it took); (b) an
ingest with no change (median of three); (c) one file of one book with a section appended,
then an ingest (which plans every book); (c') the same with `ingest --book`; (d) `plan
--json`; (e) a search in one book; and (g) a books_sensor tick evaluated in-process, cold and
warm. Prints process CPU seconds (user + sys, the figure to compare: wall time on a shared
machine swings), wall, peak RSS and the size of DAGSTER_HOME, the store and the cache after
each step; (f) is DAGSTER_HOME's growth per book run.

``--prebuilt``: the books are ingested in-process by the pipeline's stages before (a) (no
Dagster: a third of a CLI first ingest's CPU), so (a) only adds their partitions; the steps
after it are the same. ``--rounds R``: (i) after (a)-(g) of every size, R rounds in which each
size in turn gets a no-change ``ingest`` and a one-file edit (another file of another book
each round) and ``ingest``: the median CPU s of each, and each size's edit as a ratio to the
first size's (issue 40's measure: interleaved, so that both sizes see the same machine).

``--sensor-tree BxF``: a tree of B books of F small files (not ingested), and a sensor tick
over it, cold (no cursor: every file hashed, every book requested) and warm (nothing changed).

``--big-book N``: beside 5 small books, one book of about N chunk points, built in-process by
the ingest pipeline (``IngestPipeline.run``) in slices of files, its dense vectors made by the
hash embedder but recorded as the default local model's (so that `search` and `serve` embed
their queries with the real model: embedding N chunks with it would take hours here; the
index's vectors only shape the HNSW graph; every book records that model, and the CLI runs
with ``RAG_EMBEDDER=local``; ``--reuse`` measures again on the books a run built). Then (h1)
one file of a small book edited and `rag-pipeline ingest`; (h2) `rag-pipeline search` in the
big book (hybrid); (h3) `rag-pipeline serve` answering ``--queries`` hybrid searches in the big
book one after another: p50, p99 and the service's RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = REPO.parent / "shared" / "corpora" / "powershell-docs" / "books"
FIXTURE_CORPUS = REPO / "rag_pipeline_tests" / "fixtures" / "corpus"
GNU_TIME = Path("/usr/bin/time")
EDIT_BOOK_INDEX = 0  # the book and file (c) edits, and the book (e) searches
EDIT_FILE_INDEX = 0
SEARCH_QUERY = "how do I loop over the items of a collection"
NO_CHANGE_REPEATS = 3  # (b) is cheap and noisy: the median of this many runs
EDIT_SECTION = (
    "\n\n## Scale benchmark edit\n\nThis section was appended by bench/scale.py to change one "
    "file of one book, so that the next ingest has exactly one file to read again.\n"
)

# A books_sensor tick in a fresh process, on the DAGSTER_HOME instance the ingests used:
# the first tick has no cursor (it hashes every file), the warm ones start from its cursor.
SENSOR_TICK = """
import json, statistics, sys, time
from dagster import DagsterInstance, build_sensor_context
from rag_pipeline.config import load_settings
from rag_pipeline.defs.sensors import build_books_sensor
from rag_pipeline.ingest.pipeline import IngestPipeline
sensor = build_books_sensor()
# the sensor's one resource: the pipeline (it reads only its book source: no model is loaded)
resources = {"pipeline": IngestPipeline.from_settings(load_settings(data_dir=sys.argv[1]))}
with DagsterInstance.get() as instance:
    c0, w0 = time.process_time(), time.perf_counter()
    first = sensor(build_sensor_context(instance=instance, resources=resources))
    cold = (time.process_time() - c0, time.perf_counter() - w0)
    cursor = getattr(first, "cursor", None)
    for request in getattr(first, "dynamic_partitions_requests", None) or []:  # as the daemon
        if hasattr(request, "partition_keys") and type(request).__name__.startswith("Add"):
            keys = list(request.partition_keys)
            instance.add_dynamic_partitions(request.partitions_def_name, keys)
    warm = []
    for _ in range(3):
        c0, w0 = time.process_time(), time.perf_counter()
        result = sensor(
            build_sensor_context(instance=instance, cursor=cursor, resources=resources)
        )
        warm.append((time.process_time() - c0, time.perf_counter() - w0))
print(json.dumps({
    "cold_cpu_s": round(cold[0], 3), "cold_wall_s": round(cold[1], 3),
    "warm_cpu_s": round(statistics.median(c for c, _ in warm), 3),
    "warm_wall_s": round(statistics.median(w for _, w in warm), 3),
    "cold_result": type(first).__name__, "warm_result": type(result).__name__,
    "cold_run_requests": len(getattr(first, "run_requests", None) or []),
}))
"""


def source_files(corpus: Path) -> list[Path]:
    """The Markdown files books are copied from, in a fixed order."""
    files = sorted(p for p in corpus.rglob("*") if p.suffix in (".md", ".mdx") and p.is_file())
    return [p for p in files if p.stat().st_size > 0]


def build_books(pool: list[Path], root: Path, books: int, files: int) -> None:
    """``books`` folders of ``files`` copies each, every copy ending with its own line."""
    for b in range(books):
        book = root / f"book-{b:04d}"
        book.mkdir(parents=True)
        for f in range(files):
            source = pool[(b * files + f) % len(pool)]
            text = source.read_text(encoding="utf-8", errors="replace").rstrip("\n")
            # a closing line, not an opening one: front matter must stay at the top
            marker = f"\n\nScale benchmark copy: book {b}, file {f}, from {source.name}.\n"
            (book / f"f{f:03d}-{source.stem}{source.suffix}").write_text(text + marker)


def folder_kb(path: Path) -> int:
    """Disk the folder takes (allocated blocks: the store preallocates sparse files)."""
    if not path.exists():
        return 0
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file()) // 1024


def parse_gnu_time(text: str) -> dict[str, float]:
    """User + sys CPU, wall and peak RSS from the report of `/usr/bin/time -v`."""
    fields = dict(
        (k.strip(), v.strip()) for k, _, v in (ln.partition(": ") for ln in text.splitlines())
    )
    wall = 0.0
    for part in fields["Elapsed (wall clock) time (h:mm:ss or m:ss)"].split(":"):
        wall = wall * 60 + float(part)
    return {
        "cpu_s": float(fields["User time (seconds)"]) + float(fields["System time (seconds)"]),
        "wall_s": wall,
        "rss_mb": int(fields["Maximum resident set size (kbytes)"]) / 1024,
    }


def run_cli(args: list[str], env: dict[str, str], cwd: Path) -> tuple[dict[str, float], str]:
    """One `rag-pipeline` command: its process figures and its stdout."""
    command = [sys.executable, "-m", "rag_pipeline.cli", *args]
    if GNU_TIME.exists():
        report = cwd / "time.txt"
        proc = subprocess.run(
            [str(GNU_TIME), "-v", "-o", str(report), *command],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
        )
        figures = parse_gnu_time(report.read_text())
    else:  # RUSAGE_CHILDREN deltas: CPU is exact, the peak RSS is the largest child so far
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        figures = {
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "wall_s": time.perf_counter() - started,
            "rss_mb": after.ru_maxrss / 1024,
        }
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"`rag-pipeline {' '.join(args)}` failed with exit {proc.returncode}")
    return {k: round(v, 2) for k, v in figures.items()}, proc.stdout


def books_run(report: dict[str, Any]) -> int:
    return sum(1 for b in report["books"].values() if b["status"] not in ("unchanged", "missing"))


def sensor_tick(env: dict[str, str], cwd: Path, data_dir: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", SENSOR_TICK, str(data_dir)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"sensor tick failed with exit {proc.returncode}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def prebuild(here: Path, data: Path, books: list[str]) -> dict[str, float]:
    """The books ingested in-process by the pipeline's stages (``IngestPipeline.run``, no
    Dagster: about a third of a CLI first ingest's CPU), 50 books a run."""
    from rag_pipeline.config import load_settings
    from rag_pipeline.ingest.pipeline import IngestPipeline

    settings = load_settings(
        data_dir=data, qdrant_path=str(here / "qdrant"), embedder="hash", cache_dir=here / "cache"
    )
    pipeline = IngestPipeline.from_settings(settings)
    c0, w0 = time.process_time(), time.perf_counter()
    for start in range(0, len(books), 50):
        pipeline.run(books[start : start + 50], run_id="bench-build")
        print(f"prebuilt {min(start + 50, len(books))} books", file=sys.stderr, flush=True)
    return {
        "cpu_s": round(time.process_time() - c0, 1),
        "wall_s": round(time.perf_counter() - w0, 1),
    }


def measure_size(
    pool: list[Path],
    work: Path,
    books: int,
    files: int,
    with_sensor: bool,
    prebuilt: bool = False,
) -> dict[str, Any]:
    """Steps (a)-(g) for one collection size, in its own folder (``prebuilt``: the books
    ingested in-process first, see :func:`prebuild`; (a) then adds their partitions)."""
    here = work / f"books-{books}x{files}"
    shutil.rmtree(here, ignore_errors=True)
    data, home = here / "books", here / "dagster_home"
    build_books(pool, data, books, files)
    home.mkdir(parents=True)
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    env = scenario_env(here, data, home)
    prebuilt_figures = (
        prebuild(here, data, sorted(p.name for p in data.iterdir())) if prebuilt else None
    )

    def disk() -> dict[str, int]:
        return {
            "home_kb": folder_kb(home),
            # what the IO manager keeps per book (replaced by each run); the rest of
            # DAGSTER_HOME is run and event history, which grows with every run
            "home_storage_kb": folder_kb(home / "storage"),
            "store_kb": folder_kb(here / "qdrant"),
            "cache_kb": folder_kb(here / "cache"),
        }

    empty_home_kb = folder_kb(home)
    steps: dict[str, Any] = {}

    figures, out = run_cli(["ingest", "--json"], env, here)
    report = json.loads(out)
    runs = books_run(report)
    steps["first_ingest"] = {
        **figures,
        **({"prebuilt": prebuilt_figures} if prebuilt_figures else {}),
        "cpu_s_per_book": round(figures["cpu_s"] / books, 3),
        "books_run": runs,
        "dagster_runs": len({b["run_id"] for b in report["books"].values() if b["run_id"]}),
        "chunks": sum(b["chunks"] for b in report["books"].values()),
        **disk(),
    }
    home_after_first = steps["first_ingest"]["home_kb"]

    repeats = [run_cli(["ingest", "--json"], env, here) for _ in range(NO_CHANGE_REPEATS)]
    cpus = [f["cpu_s"] for f, _ in repeats]
    middle = repeats[cpus.index(statistics.median_low(cpus))]
    steps["no_change_ingest"] = {
        **middle[0],
        "cpu_s_all": cpus,
        "books_run": books_run(json.loads(middle[1])),
        **disk(),
    }

    book = data / f"book-{EDIT_BOOK_INDEX:04d}"
    edited = sorted(book.iterdir())[EDIT_FILE_INDEX]
    edited.write_text(edited.read_text() + EDIT_SECTION)
    home_before_edit = folder_kb(home)
    figures, out = run_cli(["ingest", "--json"], env, here)
    report = json.loads(out)
    steps["one_file_edit_ingest"] = {
        **figures,
        "books_run": books_run(report),
        "embedded": sum(b["embedded"] for b in report["books"].values()),
        "file": f"{book.name}/{edited.name}",
        **disk(),
    }
    home_growth_edit = steps["one_file_edit_ingest"]["home_kb"] - home_before_edit

    edited.write_text(edited.read_text() + EDIT_SECTION.replace("appended", "appended again"))
    figures, out = run_cli(["ingest", "--book", book.name, "--json"], env, here)
    report = json.loads(out)
    steps["one_file_edit_ingest_book"] = {
        **figures,
        "books_run": books_run(report),
        "embedded": sum(b["embedded"] for b in report["books"].values()),
        **disk(),
    }

    figures, _ = run_cli(["plan", "--json"], env, here)
    steps["plan"] = {**figures, **disk()}

    query = ["search", SEARCH_QUERY, "--book", book.name, "--json"]
    figures, out = run_cli(query, env, here)
    steps["search"] = {**figures, "hits": len(json.loads(out)), **disk()}

    if with_sensor:
        steps["sensor_tick"] = {**sensor_tick(env, here, data), **disk()}

    after = steps["search"]
    book_runs = (
        runs
        + steps["one_file_edit_ingest"]["books_run"]
        + steps["one_file_edit_ingest_book"]["books_run"]
    )
    return {
        "books": books,
        "files_per_book": files,
        "folder": str(here),
        "steps": steps,
        "dagster_home": {
            "after_kb": after["home_kb"],
            "storage_kb": after["home_storage_kb"],
            "book_runs": book_runs,
            "growth_kb_per_book_run": round((after["home_kb"] - empty_home_kb) / book_runs, 1),
            "first_ingest_growth_kb_per_book_run": round(
                (home_after_first - empty_home_kb) / max(runs, 1), 1
            ),
            # can be negative: SQLite gives back pages of its write-ahead log
            "one_file_edit_growth_kb": home_growth_edit,
        },
    }


def interleaved_rounds(work: Path, sizes: list[int], files: int, rounds: int) -> dict[str, Any]:
    """(i) The sizes' one-file edits and no-change ingests in turn, ``rounds`` times, on the
    folders (a)-(g) left (each edit a section appended to another file of another book):
    the median CPU s of each and each size's ratio to the smallest size's edit."""
    runs: dict[int, dict[str, list[float]]] = {n: {"edit": [], "no_change": []} for n in sizes}
    for r in range(rounds):
        for n in sizes:
            here = work / f"books-{n}x{files}"
            data = here / "books"
            env = scenario_env(here, data, here / "dagster_home")
            figures, _ = run_cli(["ingest", "--json"], env, here)
            runs[n]["no_change"].append(figures["cpu_s"])
            book = data / f"book-{(r + 1) % n:04d}"
            edited = sorted(book.iterdir())[(r + 2) % files]
            edited.write_text(edited.read_text() + EDIT_SECTION.replace("appended", f"{r}"))
            figures, out = run_cli(["ingest", "--json"], env, here)
            if books_run(json.loads(out)) != 1:
                raise SystemExit(
                    f"round {r} at {n} books: the edit ran {books_run(json.loads(out))}"
                )
            runs[n]["edit"].append(figures["cpu_s"])
    base = statistics.median(runs[sizes[0]]["edit"])
    return {
        str(n): {
            "rounds": rounds,
            "edit_cpu_s": round(statistics.median(r["edit"]), 2),
            "edit_cpu_s_all": r["edit"],
            "edit_ratio": round(statistics.median(r["edit"]) / base, 3),
            "no_change_cpu_s": round(statistics.median(r["no_change"]), 2),
            "no_change_cpu_s_all": r["no_change"],
        }
        for n, r in runs.items()
    }


def scenario_env(here: Path, data: Path, home: Path, embedder: str = "hash") -> dict[str, str]:
    """The environment of one scenario's commands: its own books, store, cache, instance."""
    env = {
        **os.environ,
        "RAG_DATA_DIR": str(data),
        "RAG_QDRANT_PATH": str(here / "qdrant"),
        "RAG_CACHE_DIR": str(here / "cache"),
        "DAGSTER_HOME": str(home),
        "RAG_EMBEDDER": embedder,
        "DO_NOT_TRACK": "1",
        "PYTHONWARNINGS": "ignore",
    }
    for name in ("RAG_QDRANT_URL", "RAG_QDRANT_EMBEDDED", "RAG_COLLECTION"):
        env.pop(name, None)  # the default embedded engine, whatever this shell has set
    return env


def measure_sensor_tree(work: Path, books: int, files: int) -> dict[str, Any]:
    """A books_sensor tick over ``books`` books of ``files`` small files (not ingested)."""
    here = work / f"sensor-{books}x{files}"
    shutil.rmtree(here, ignore_errors=True)
    data, home = here / "books", here / "dagster_home"
    for b in range(books):
        book = data / f"book-{b:04d}"
        (book / "part").mkdir(parents=True)
        for f in range(files):
            folder = book / "part" if f % 2 else book  # files in two folders, as books are
            (folder / f"f{f:04d}.md").write_text(f"# Book {b}, file {f}\n\nSome text.\n")
    home.mkdir(parents=True)
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    return {
        "books": books,
        "files": books * files,
        **sensor_tick(scenario_env(here, data, home), here, data),
    }


class _RecordedAsTheLocalModel:
    """The hash embedder's vectors, recorded under the default local model's name and cut by
    its tokenizer (bench only: see --big-book)."""

    def __new__(cls) -> Any:
        from rag_pipeline.embed.hashing import HashEmbedder
        from rag_pipeline.embed.local import LocalEmbedder

        local = LocalEmbedder(precision="fp32")  # its tokenizer; its model is never loaded

        class Named(HashEmbedder):
            @property
            def tokenizer(self) -> Any:
                return local.tokenizer

        embedder = Named(local.dimension, max_input_tokens=local.max_seq_length)
        embedder.model_name = local.model_name
        return embedder


BIG_BOOK = "big-book"
BIG_SMALL_BOOKS = 5


def build_big_book(
    pool: list[Path], here: Path, data: Path, points: int, slice_files: int
) -> dict[str, Any]:
    """The small books, then one book of about ``points`` chunk points, written by the
    pipeline's stages a slice of files at a time (each slice is a run of the book: new files
    only). Every book records the default local model (hash vectors under its name): the
    CLI's commands after it run with ``RAG_EMBEDDER=local``, as a user's would, and migrate
    nothing."""
    from rag_pipeline.config import load_settings
    from rag_pipeline.ingest.pipeline import IngestPipeline
    from rag_pipeline.recipes.recipe import IndexRecipe

    settings = load_settings(
        data_dir=data, qdrant_path=str(here / "qdrant"), embedder="hash", cache_dir=here / "cache"
    )
    recipe = IndexRecipe.build(_RecordedAsTheLocalModel(), settings.chunking())
    pipeline = IngestPipeline.from_settings(settings, recipe)
    pipeline.run([f"book-{b:04d}" for b in range(BIG_SMALL_BOOKS)], run_id="bench-build")
    book = data / BIG_BOOK
    book.mkdir(parents=True, exist_ok=True)
    written = files = 0
    c0, w0 = time.process_time(), time.perf_counter()
    while written < points:
        for f in range(files, files + slice_files):
            source = pool[f % len(pool)]
            text = source.read_text(encoding="utf-8", errors="replace").rstrip("\n")
            marker = f"\n\nScale benchmark copy: big book, file {f}, from {source.name}.\n"
            (book / f"f{f:06d}-{source.stem}{source.suffix}").write_text(text + marker)
        files += slice_files
        run = pipeline.run([BIG_BOOK], run_id="bench-build")[BIG_BOOK]
        written += run.written.upserted
        print(f"big book: {files} files, {written} points", file=sys.stderr, flush=True)
    return {
        "points": written,
        "files": files,
        "build_cpu_s": round(time.process_time() - c0, 1),
        "build_wall_s": round(time.perf_counter() - w0, 1),
        "model_recorded": recipe.embedding_model,
    }


def warm_local_model(env: dict[str, str]) -> None:
    """Build the local model's ONNX graph into the scenario's cache before anything is timed
    (a user's first command builds it once)."""
    code = (
        "from rag_pipeline.config import load_settings; "
        "from rag_pipeline.embed import create_embedder; "
        "create_embedder(load_settings().embedding()).embed_query('warm')"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)


def serve_latency(
    env: dict[str, str], cwd: Path, book: str | list[str], queries: int
) -> dict[str, Any]:
    """`rag-pipeline serve` answering hybrid searches in ``book`` one after another (a list:
    each search in the next book of it, round; each book searched once before the timing)."""
    books = [book] if isinstance(book, str) else list(book)
    import http.client
    import socket
    from urllib.parse import urlencode

    from powershell_queries import QUERIES  # bench/, this script's folder

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    log = (cwd / "serve.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rag_pipeline.cli",
            "serve",
            "--port",
            str(port),
            "--cache-size",
            "0",
        ],
        env=env,
        cwd=cwd,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        deadline = time.monotonic() + 120
        while True:
            try:
                conn.request("GET", "/health")
                conn.getresponse().read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("serve did not start") from None
                time.sleep(0.5)
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

        def search(query: str, book: str) -> float:
            params = urlencode({"q": query, "book": book, "mode": "hybrid", "limit": 10})
            started = time.perf_counter()
            conn.request("GET", f"/search?{params}")
            response = conn.getresponse()
            body = response.read()
            if response.status != 200:
                raise SystemExit(f"serve answered {response.status}: {body[:300]!r}")
            return (time.perf_counter() - started) * 1000

        first = search(QUERIES[0], books[0])  # loads the book's shard and the model
        for i, query in enumerate(QUERIES[1 : 20 + len(books)], 1):
            search(query, books[i % len(books)])
        latencies = sorted(
            search(QUERIES[i % len(QUERIES)], books[i % len(books)]) for i in range(queries)
        )
        status = Path(f"/proc/{proc.pid}/status").read_text()
        memory = {
            line.split(":")[0]: int(line.split()[1]) // 1024
            for line in status.splitlines()
            if line.startswith(("VmRSS", "VmHWM", "RssAnon", "RssFile"))
        }
        return {
            "queries": queries,
            "books": len(books),
            "first_ms": round(first, 1),
            "p50_ms": round(statistics.median(latencies), 2),
            "p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))], 2),
            "max_ms": round(latencies[-1], 2),
            "rss_mb": memory,
        }
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def measure_big_book(
    pool: list[Path], work: Path, points: int, queries: int, slice_files: int, reuse: bool
) -> dict[str, Any]:
    """(h) A book of ``points`` points beside small books: an edit of a small book, a search
    and the query service in the big one, all with the default local model (``reuse``: the
    books a previous run of this size built, if they are there)."""
    here = work / f"big-{points}"
    data, home = here / "books", here / "dagster_home"
    steps: dict[str, Any] = {}
    if not (reuse and (data / BIG_BOOK).is_dir()):
        shutil.rmtree(here, ignore_errors=True)
        build_books(pool, data, BIG_SMALL_BOOKS, 20)
        steps["big_book_build"] = build_big_book(pool, here, data, points, slice_files)
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    local = scenario_env(here, data, home, embedder="local")
    warm_local_model(local)
    figures, _ = run_cli(["ingest", "--json"], local, here)  # the partitions, once
    steps["first_cli_ingest"] = figures
    figures, out = run_cli(["ingest", "--json"], local, here)
    steps["no_change_ingest"] = {**figures, "books_run": books_run(json.loads(out))}
    small = sorted((data / "book-0000").iterdir())[0]
    small.write_text(small.read_text() + EDIT_SECTION)
    figures, out = run_cli(["ingest", "--json"], local, here)
    report = json.loads(out)
    steps["small_book_edit_ingest"] = {
        **figures,
        "books_run": books_run(report),
        "embedded": report["books"]["book-0000"]["embedded"],
    }
    query = ["search", SEARCH_QUERY, "--book", BIG_BOOK, "--json"]
    run_cli(query, local, here)  # the shard's pages read once (a first search after a run)
    figures, out = run_cli(query, local, here)
    steps["search_big_book"] = {**figures, "hits": len(json.loads(out))}
    steps["serve_big_book"] = serve_latency(local, here, BIG_BOOK, queries)
    steps["store_mb"] = round(folder_kb(here / "qdrant") / 1024, 1)
    return steps


def print_table(results: list[dict[str, Any]]) -> None:
    print(
        f"{'books x files':<14} {'step':<22} {'cpu s':>8} {'wall s':>8} {'rss MB':>8} "
        f"{'home kB':>9} {'store kB':>9}"
    )
    for size in results:
        label = f"{size['books']} x {size['files_per_book']}"
        for step, f in size["steps"].items():
            cpu = f.get("cpu_s", f.get("warm_cpu_s"))
            wall = f.get("wall_s", f.get("warm_wall_s"))
            rss = f"{f['rss_mb']:8.0f}" if "rss_mb" in f else f"{'':>8}"
            print(
                f"{label:<14} {step:<22} {cpu:8.2f} {wall:8.2f} {rss} "
                f"{f['home_kb']:9d} {f['store_kb']:9d}"
            )
        first = size["steps"]["first_ingest"]
        home = size["dagster_home"]
        print(
            f"{label:<14} first ingest per book: {first['cpu_s_per_book']:.3f} CPU s; "
            f"DAGSTER_HOME {home['after_kb']} kB after {home['book_runs']} book runs: "
            f"{home['growth_kb_per_book_run']} kB per book run "
            f"(IO manager storage: {home['storage_kb']} kB of the total); "
            f"the edit's run {home['one_file_edit_growth_kb']:+d} kB"
        )
        if "sensor_tick" in size["steps"]:
            s = size["steps"]["sensor_tick"]
            print(
                f"{label:<14} sensor tick: cold {s['cold_cpu_s']:.2f} CPU s "
                f"({s['cold_result']}), warm {s['warm_cpu_s']:.2f} CPU s ({s['warm_result']})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--books", type=int, nargs="*", default=[5, 50])
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--work", type=Path, default=None, help="default: a temporary folder")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--no-sensor", action="store_true", help="skip the sensor tick (g)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--sensor-tree", default=None, help="BOOKSxFILES: a sensor tick over them")
    parser.add_argument(
        "--rounds", type=int, default=0, help="(i): interleaved edits of every size, this many"
    )
    parser.add_argument(
        "--prebuilt", action="store_true", help="ingest the books in-process before (a)"
    )
    parser.add_argument("--big-book", type=int, default=0, help="chunk points of one big book")
    parser.add_argument("--big-book-slice", type=int, default=2000, help="files a build run adds")
    parser.add_argument("--queries", type=int, default=200, help="serve's searches (--big-book)")
    parser.add_argument(
        "--reuse", action="store_true", help="--big-book: keep the books built in --work before"
    )
    args = parser.parse_args()
    corpus = args.corpus if args.corpus.is_dir() else FIXTURE_CORPUS
    pool = source_files(corpus)
    if not pool:
        raise SystemExit(f"no Markdown files under {corpus}")
    if not GNU_TIME.exists():
        print("note: /usr/bin/time is missing; using RUSAGE_CHILDREN", file=sys.stderr)
    work = args.work or Path(tempfile.mkdtemp(prefix="rag-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    extra: dict[str, Any] = {}
    try:
        results = [
            measure_size(pool, work, n, args.files, not args.no_sensor, args.prebuilt)
            for n in args.books
        ]
        if args.rounds and args.books:
            extra["interleaved"] = interleaved_rounds(work, args.books, args.files, args.rounds)
        if args.sensor_tree:
            books, files = (int(n) for n in args.sensor_tree.lower().split("x"))
            extra["sensor_tree"] = measure_sensor_tree(work, books, files)
        if args.big_book:
            extra["big_book"] = measure_big_book(
                pool, work, args.big_book, args.queries, args.big_book_slice, args.reuse
            )
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    summary = {"corpus": str(corpus), "source_files": len(pool), "sizes": results, **extra}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"corpus {corpus} ({len(pool)} files); process CPU = user + sys")
        print_table(results)
        for name, figures in extra.items():
            print(f"{name}: {json.dumps(figures)}")
    (REPO / "bench" / "results").mkdir(exist_ok=True)
    (REPO / "bench" / "results" / "scale.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
