"""Full ingest of a Markdown corpus through `rag-pipeline ingest` (Dagster, local model).

    python bench/ingest.py [--corpus ../shared/corpora/powershell-docs/books]
                           [--engine client|edge] [--workdir .rag/bench/ingest-client]
                           [--pure-pass]

Prints wall time, chunks/s, peak RSS of the ingest process, the pure embedding time (time spent
inside the embedder, summed over books) and the ratio wall / pure embedding. ``--pure-pass``
also re-embeds every indexed chunk in a fresh process with nothing else running, in fp32 twice:
as the embedder does now (batches sorted by token count) and as the pipeline did before
(sorted by characters, batches of 32), and reports the ingest's wall time as a ratio to each,
so that the noise of a shared machine cancels.

    nice -n 5 python bench/ingest.py --precision-rounds 2 [--book community]

instead runs full ingests of the corpus (or of one book of it) with RAG_LOCAL_PRECISION=fp32
and with the default (unset: ``auto``, int8 on CPUs with VNNI/AMX), interleaved (fp32, auto,
auto, fp32, ...), each into a fresh store and DAGSTER_HOME (the ONNX graphs are cached once,
beforehand), and prints each ingest process's CPU seconds and wall, and the ratio of the
medians auto / fp32 (also against the fp32 runs' own embedding time, the pure-pass analogue).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from common import run_json, save_results

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = REPO.parent / "shared" / "corpora" / "powershell-docs" / "books"


def run_ingest(
    corpus: Path,
    workdir: Path,
    engine: str,
    cache: Path | None = None,
    precision: str | None = None,
) -> tuple[dict, float, float, float]:
    """One timed ingest: its report, wall, peak RSS (MB) and CPU seconds (user + sys).

    ``precision`` sets RAG_LOCAL_PRECISION (None: whatever this shell has, else the default)."""
    cache = cache or workdir / "cache"
    env = {
        **os.environ,
        "RAG_DATA_DIR": str(corpus),
        "RAG_QDRANT_PATH": str(workdir / "qdrant"),
        "RAG_QDRANT_EMBEDDED": engine,
        "RAG_CACHE_DIR": str(cache),
        "DAGSTER_HOME": str(workdir / "dagster_home"),
        "RAG_EMBEDDER": "local",
        "DO_NOT_TRACK": "1",
        "PYTHONWARNINGS": "ignore",
    }
    env.pop("RAG_QDRANT_URL", None)
    if precision is not None:
        env["RAG_LOCAL_PRECISION"] = precision
    (workdir / "dagster_home").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "dagster.yaml", workdir / "dagster_home" / "dagster.yaml")
    # warm the ONNX graph cache so the timed run measures ingestion, not a one-off build
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import os; from rag_pipeline.embed.local import LocalEmbedder;"
            f"LocalEmbedder(cache_dir={str(cache / 'models')!r}, "
            # the settings' default: with `auto`, int8 is quantized here, not in the timed run
            "precision=os.environ.get('RAG_LOCAL_PRECISION', 'auto')).embed(['warm'])",
        ],
        env=env,
        check=True,
    )
    # a launcher whose only child is the ingest, so the peak it reports is the ingest's own
    # (RUSAGE_CHILDREN here would include the warm-up, which quantizes the model)
    ingest = [sys.executable, "-m", "rag_pipeline.cli", "ingest", "--json"]
    report, wall, stderr = run_json([sys.executable, "-c", PEAK_OF, *ingest], env, workdir)
    usage = dict(kv.split("=") for kv in stderr.rstrip().rsplit("\n", 1)[-1].split())
    return report, wall, float(usage["peak_kb"]) / 1024, float(usage["cpu_s"])


PEAK_OF = """
import resource, subprocess, sys
code = subprocess.call(sys.argv[1:])
u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"peak_kb={u.ru_maxrss} cpu_s={u.ru_utime + u.ru_stime:.2f}", file=sys.stderr)
sys.exit(code)
"""


SCAN = """
import json, sys, time
from rag_pipeline.config import load_settings
from rag_pipeline.embed.local import LocalEmbedder
from rag_pipeline.models import compose_embed_text
from rag_pipeline.schema import COLLECTION_SCHEMA, chunks_of
from rag_pipeline.store import open_store
settings = load_settings()
emb = LocalEmbedder(cache_dir=settings.cache_dir / "models", precision="fp32")
texts = []
with open_store(settings.store(), COLLECTION_SCHEMA) as store:
    for book in store.tenants():
        for r in store.scroll(chunks_of(book),
                              fields=["title", "section_title", "text"]):
            p = r.payload
            texts.append(compose_embed_text(p["title"], p.get("section_title"), p["text"]))
# what the model would see: counted again with its tokenizer, not read from the payload
counts = [n + emb.tokenizer.special_tokens for n in emb.tokenizer.count(texts)]
out = {"chunks": len(texts), "max_tokens": max(counts),
       "over_model_limit": sum(n > emb.max_seq_length for n in counts)}
if sys.argv[1] == "embed":
    emb.embed(texts[:8])
    t = time.perf_counter()
    emb.embed(texts)  # fp32, batches sorted by token count (what the embedder does now)
    out["seconds"] = time.perf_counter() - t
    # fp32 as the pipeline embedded before: texts sorted by characters, batches of 32
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    _, items = emb._prepare([texts[i] for i in order])
    t = time.perf_counter()
    for start in range(0, len(items), 32):
        emb._embed_batch(items[start : start + 32])
    out["seconds_char_sorted"] = time.perf_counter() - t
print(json.dumps(out))
"""


def scan_index(workdir: Path, engine: str, embed: bool) -> dict:
    """Chunks in the index counted with the model's tokenizer; optionally re-embedded alone."""
    env = {
        **os.environ,
        "RAG_QDRANT_PATH": str(workdir / "qdrant"),
        "RAG_QDRANT_EMBEDDED": engine,
        "RAG_CACHE_DIR": str(workdir / "cache"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", SCAN, "embed" if embed else "count"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout)


def cpu_description() -> dict[str, object]:
    """The CPU's model name and its int8 dot-product flags (what `auto` looks at)."""
    model = platform.processor()
    flags: set[str] = set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    return {
        "model": model,
        "int8_flags": sorted(flags & {"avx512_vnni", "avx_vnni", "amx_int8"}),
    }


def compare_precisions(args: argparse.Namespace, workdir: Path) -> None:
    """Interleaved full ingests, fp32 vs the default precision, fresh store each time."""
    corpus = args.corpus
    if args.book:
        corpus = workdir / "corpus"
        shutil.copytree(args.corpus / args.book, corpus / args.book)
    cache = workdir / "cache"  # the ONNX graphs, shared: not part of the index
    os.environ.pop("RAG_LOCAL_PRECISION", None)  # "auto" is the settings' default, unset
    order = [("fp32", "auto")[(i + i // 2) % 2] for i in range(2 * args.precision_rounds)]
    runs: list[dict[str, object]] = []
    for i, label in enumerate(order):
        here = workdir / f"run-{i}-{label}"
        precision = "fp32" if label == "fp32" else None  # None: unset, the default
        report, wall, peak_mb, cpu_s = run_ingest(corpus, here, args.engine, cache, precision)
        books = report["books"].values()
        run = {
            "precision": label,
            "wall_s": round(wall, 1),
            "cpu_s": round(cpu_s, 1),
            "embed_s_in_run": round(sum(b["embed_seconds"] for b in books), 1),
            "chunks": sum(b["chunks"] for b in books),
            "peak_rss_mb": round(peak_mb),
        }
        print(json.dumps(run), flush=True)
        runs.append(run)
        shutil.rmtree(here, ignore_errors=True)

    def median(label: str, key: str) -> float:
        return float(statistics.median(float(str(r[key])) for r in runs if r["precision"] == label))

    figures = {
        "corpus": str(corpus),
        "cpu": cpu_description(),
        "runs": runs,
        "ratio_auto_to_fp32_wall": round(median("auto", "wall_s") / median("fp32", "wall_s"), 3),
        "ratio_auto_to_fp32_cpu": round(median("auto", "cpu_s") / median("fp32", "cpu_s"), 3),
        # the fp32 runs' embedding time: the pure fp32 pass of the same chunks, in-run
        "ratio_auto_wall_to_fp32_embed": round(
            median("auto", "wall_s") / median("fp32", "embed_s_in_run"), 3
        ),
    }
    save_results("ingest-precision", figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--engine", choices=["client", "edge"], default="client")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--pure-pass", action="store_true")
    parser.add_argument(
        "--precision-rounds", type=int, default=0, help="fp32 vs auto ingests, N of each"
    )
    parser.add_argument("--book", default=None, help="with --precision-rounds: one book only")
    args = parser.parse_args()
    if not args.corpus.is_dir():
        raise SystemExit(f"{args.corpus} is missing (the shared corpora sit beside the repo)")
    workdir = (args.workdir or REPO / ".rag" / "bench" / f"ingest-{args.engine}").resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)

    if args.precision_rounds:
        compare_precisions(args, workdir)
        return
    report, wall, peak_mb, cpu_s = run_ingest(args.corpus, workdir, args.engine)
    books = report["books"]
    chunks = sum(b["chunks"] for b in books.values())
    embedded = sum(b["embedded"] for b in books.values())
    tokens = sum(b["tokens"] for b in books.values())
    embed_s = sum(b["embed_seconds"] for b in books.values())
    files = sum(b["files"] for b in books.values())
    errors = [m for b in books.values() for m in b["error_messages"]]
    figures = {
        "engine": args.engine,
        "books": len(books),
        "files": files,
        "file_errors": len(errors),
        "chunks": chunks,
        "embedded": embedded,
        "tokens_embedded": tokens,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu_s, 1),
        "chunks_per_s": round(chunks / wall, 1),
        "embed_s_in_run": round(embed_s, 1),
        "ratio_wall_to_embed_in_run": round(wall / embed_s, 3) if embed_s else None,
        "peak_rss_mb": round(peak_mb),
    }
    scan = scan_index(workdir, args.engine, embed=args.pure_pass)
    figures["max_chunk_tokens"] = scan["max_tokens"]
    figures["truncated_chunks"] = scan["over_model_limit"]
    if args.pure_pass:
        figures["pure_fp32_embed_s"] = round(scan["seconds"], 1)
        figures["ratio_wall_to_pure_fp32"] = round(wall / scan["seconds"], 3)
        figures["pure_fp32_char_sorted_embed_s"] = round(scan["seconds_char_sorted"], 1)
        figures["ratio_wall_to_pure_fp32_char_sorted"] = round(
            wall / scan["seconds_char_sorted"], 3
        )
    save_results(f"ingest-{args.engine}", figures)
    for message in errors:
        print(f"  file error: {message}")


if __name__ == "__main__":
    main()
