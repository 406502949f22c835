"""The differential check of incremental ingest: after any sequence of changes to the books,
``rag-pipeline ingest`` leaves exactly the index a clean build of the same folder gives.

A seeded random sequence of file operations (edits, same-size edits with the old times put
back, renames, swaps, moves between books, deletions, additions, ``touch``, the same bytes
rewritten, permission changes, an edit while an ingest runs, ``kill -9`` of an ingest at a
random moment, a book folder removed and brought back, books added and removed), each followed
by ``rag-pipeline ingest``, the path production runs (the CLI, which plans and executes the
Dagster job), as real processes. After each step ``plan`` must say every book is unchanged;
every ``compare_every`` steps the point-id set of every book must equal that of a clean build
(a fresh store and Dagster home, the same books): point ids are content-derived, so equal
sets are equal indexes.

The suite runs a short sequence (``test_differential.py``); ``bench/differential.py`` runs
long ones over several seeds and prints the figures.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_pipeline_tests.helpers import Cli, LiveProcess
from rag_pipeline_tests.phasepoint import PHASES, Phases

__all__ = [
    "Differential",
    "GitDifferential",
    "LiveDifferential",
    "Outcome",
    "clean_point_sets",
    "diverging",
    "point_sets",
]

_WORDS = (
    "robot",
    "sensor",
    "actuator",
    "planner",
    "lidar",
    "camera",
    "joint",
    "torque",
    "gazebo",
    "topic",
    "service",
    "action",
    "node",
    "launch",
    "param",
    "frame",
    "transform",
    "kinematics",
    "odometry",
    "costmap",
    "navigation",
    "grasp",
    "policy",
    "reward",
    "simulation",
    "controller",
    "trajectory",
    "latency",
    "bandwidth",
    "firmware",
    "emu",
    "fox",
    "owl",
    "zebra",
    "penguin",
)


def _text(rng: random.Random, title: str, words: int) -> str:
    body = " ".join(rng.choice(_WORDS) for _ in range(words))
    return f"# {title}\n\n{body}.\n"


def point_sets(qdrant: Path) -> dict[str, set[str]]:
    """Every book's point ids as the store at ``qdrant`` holds them (a fresh handle)."""
    from rag_pipeline.config import load_settings
    from rag_pipeline.schema import COLLECTION_SCHEMA, book_filter
    from rag_pipeline.store import open_store

    settings = load_settings(qdrant_path=str(qdrant))
    with open_store(settings.store(), COLLECTION_SCHEMA) as store:
        return {b: {r.id for r in store.scroll(book_filter(b), fields=[])} for b in store.tenants()}


def clean_point_sets(data: Path, build: Path) -> tuple[dict[str, set[str]], str]:
    """Every book's point ids in a clean build of the books in ``data`` as they are now (a
    copy, a fresh store and Dagster home under ``build``, removed after), and what went wrong
    with the build itself ("" when nothing)."""
    shutil.copytree(data, build / "books", symlinks=True)
    cli = Cli(build, build / "books")
    Path(cli.env["DAGSTER_HOME"]).mkdir()
    done = cli("ingest", "--json", check=False)
    problem = "" if done.returncode == 0 else f"clean build exit {done.returncode}: "
    problem += done.stderr[-400:] if problem else ""
    sets = point_sets(Path(cli.env["RAG_QDRANT_PATH"]))
    shutil.rmtree(build, ignore_errors=True)
    return sets, problem


def diverging(ours: dict[str, set[str]], clean: dict[str, set[str]]) -> list[str]:
    """Per book that differs: how many points only one side holds."""
    out = []
    for book in sorted(set(ours) | set(clean)):
        mine, theirs = ours.get(book, set()), clean.get(book, set())
        if mine != theirs:
            out.append(
                f"book {book}: {len(mine - theirs)} points only here, "
                f"{len(theirs - mine)} only in the clean build"
            )
    return out


@dataclass
class Outcome:
    """What a sequence found."""

    seed: int
    steps: int = 0
    comparisons: int = 0
    divergences: list[str] = field(default_factory=list)
    plan_disagreements: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    operations: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    #: ingests that refused to purge every indexed book at once (the operator then named them)
    halts: int = 0

    @property
    def ok(self) -> bool:
        return not (self.divergences or self.plan_disagreements or self.failures)


class Differential:
    """One seeded sequence over a few small books in ``root``."""

    def __init__(self, root: Path, seed: int, *, books: int = 3, files: int = 4) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.outcome = Outcome(seed)
        self.data = root / "books"
        self.stash = root / "stash"  # book folders taken away, to be brought back
        self.data.mkdir(parents=True)
        self.stash.mkdir()
        self.cli = Cli(root, self.data)
        self.cli.env["RAG_BUSY_WAIT_S"] = "30"
        Path(self.cli.env["DAGSTER_HOME"]).mkdir()
        self.serial = 0
        for b in range(books):
            for f in range(files):
                self._write(self.data / f"book-{b}" / f"f{f}.md")
        self.operations: dict[str, Callable[[], str]] = {
            "edit": self.edit,
            "same_size_old_mtime": self.same_size_old_mtime,
            "rename": self.rename,
            "swap_names": self.swap_names,
            "move_between_books": self.move_between_books,
            "delete": self.delete,
            "add": self.add,
            "touch": self.touch,
            "same_bytes": self.same_bytes,
            "chmod": self.chmod,
            "edit_during_ingest": self.edit_during_ingest,
            "kill_ingest": self.kill_ingest,
            "book_away_and_back": self.book_away_and_back,
            "add_book": self.add_book,
            "remove_book": self.remove_book,
        }
        #: an operation's weight in the draw, where it is not 1 (none: a uniform draw)
        self.weights: dict[str, float] = {}

    # -- the books ------------------------------------------------------------------------

    def _write(self, path: Path, text: str | None = None) -> None:
        self.serial += 1
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text or _text(self.rng, f"Part {self.serial}", self.rng.randint(8, 60)))

    def _books(self) -> list[Path]:
        return sorted(p for p in self.data.iterdir() if p.is_dir())

    def _files(self, book: Path | None = None) -> list[Path]:
        books = [book] if book is not None else self._books()
        return sorted(f for b in books for f in b.rglob("*.md"))

    def _pick_file(self) -> Path | None:
        files = self._files()
        return self.rng.choice(files) if files else None

    # -- the operations (each says what it did) ---------------------------------------------

    def edit(self) -> str:
        path = self._pick_file()
        if path is None:
            return self.add()
        self._write(path)
        return f"edit {path.relative_to(self.data)}"

    def same_size_old_mtime(self) -> str:
        """Other bytes of the same length, the old times put back (rsync -t, cp -p, tar)."""
        path = self._pick_file()
        if path is None:
            return self.add()
        st = path.stat()
        old = path.read_bytes()
        new = bytearray(old)
        for i in range(len(new)):
            if chr(new[i]).isalpha():
                new[i] = ord(self.rng.choice("abcdefghijklmnopqrstuvwxyz"))
        path.write_bytes(bytes(new))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        return f"same size, old mtime {path.relative_to(self.data)}"

    def rename(self) -> str:
        path = self._pick_file()
        if path is None:
            return self.add()
        self.serial += 1
        target = path.with_name(f"r{self.serial}.md")
        path.rename(target)
        return f"rename {path.relative_to(self.data)} -> {target.name}"

    def swap_names(self) -> str:
        """Two files of one book, with the same size and times, swap names."""
        books = [b for b in self._books() if len(self._files(b)) >= 2]
        if not books:
            return self.add()
        book = self.rng.choice(books)
        a, b = self.rng.sample(self._files(book), 2)
        text = _text(self.rng, "Twin", 20)
        other = text.replace("Twin", "Twim")
        a.write_text(text)
        b.write_text(other)
        then = time.time() - 3600
        os.utime(a, (then, then))
        os.utime(b, (then, then))
        self.step_ingest()  # both indexed as they are
        tmp = a.with_name(".swap")
        a.rename(tmp)
        b.rename(a)
        tmp.rename(b)
        return f"swap {a.relative_to(self.data)} <-> {b.name}"

    def move_between_books(self) -> str:
        books = self._books()
        path = self._pick_file()
        if path is None or len(books) < 2:
            return self.edit()
        target_book = self.rng.choice([b for b in books if b != path.parents[0]])
        self.serial += 1
        target = target_book / f"m{self.serial}.md"
        path.rename(target)
        return f"move {path.relative_to(self.data)} -> {target.relative_to(self.data)}"

    def delete(self) -> str:
        path = self._pick_file()
        if path is None:
            return self.add()
        path.unlink()
        return f"delete {path.relative_to(self.data)}"

    def add(self) -> str:
        books = self._books()
        if not books:
            return self.add_book()
        self.serial += 1
        path = self.rng.choice(books) / self.rng.choice(["", "sub/"]) / f"n{self.serial}.md"
        self._write(path)
        return f"add {path.relative_to(self.data)}"

    def touch(self) -> str:
        path = self._pick_file()
        if path is None:
            return self.add()
        os.utime(path, None)
        return f"touch {path.relative_to(self.data)}"

    def same_bytes(self) -> str:
        path = self._pick_file()
        if path is None:
            return self.add()
        path.write_bytes(path.read_bytes())
        return f"same bytes {path.relative_to(self.data)}"

    def chmod(self) -> str:
        path = self._pick_file()
        if path is None:
            return self.add()
        mode = self.rng.choice([0o600, 0o644, 0o444, 0o640])
        path.chmod(mode)
        return f"chmod {oct(mode)} {path.relative_to(self.data)}"

    def edit_during_ingest(self) -> str:
        """An edit while an ingest of the same books runs (it may or may not see it: the
        ingest after it must)."""
        first = self.edit()
        proc = self.cli.start("ingest", "--json")
        time.sleep(self.rng.uniform(0.0, 1.0))
        second = self.edit()
        proc.communicate(timeout=600)
        return f"{first}; ingest; {second} while it ran"

    def kill_ingest(self) -> str:
        """``kill -9`` of an ingest at a random moment."""
        did = self.edit()
        proc = self.cli.start("ingest", "--json")
        time.sleep(self.rng.uniform(0.05, 2.0))
        with contextlib.suppress(ProcessLookupError):  # it may have finished already
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        return f"{did}; ingest killed"

    def book_away_and_back(self) -> str:
        """A book folder removed (the next ingest purges it) and brought back."""
        books = self._books()
        if len(books) < 2:
            return self.add_book()
        book = self.rng.choice(books)
        book.rename(self.stash / book.name)
        self.step_ingest()
        (self.stash / book.name).rename(book)
        return f"{book.name} removed, ingested, brought back"

    def add_book(self) -> str:
        self.serial += 1
        book = self.data / f"book-x{self.serial}"
        for f in range(self.rng.randint(1, 3)):
            self._write(book / f"f{f}.md")
        return f"add book {book.name}"

    def remove_book(self) -> str:
        books = self._books()
        if len(books) < 2:
            return self.add_book()
        book = self.rng.choice(books)
        shutil.rmtree(book)
        return f"remove book {book.name}"

    # -- the checks -------------------------------------------------------------------------

    def step_ingest(self) -> dict[str, Any]:
        # past the racy window of what was just written, as a person's next command is: the
        # stats this ingest records are the ones the next plan trusts
        time.sleep(0.1)
        done = self.cli("ingest", "--json", check=False)
        try:
            report: dict[str, Any] = json.loads(done.stdout)
        except ValueError:
            report = {}
        failed = [b for b, r in report.get("books", {}).items() if r["status"] == "failed"]
        if done.returncode not in (0, 1) or failed:
            self.outcome.failures.append(
                f"step {self.outcome.steps}: ingest exit {done.returncode}: {failed} "
                f"{done.stderr[-400:]}"
            )
        if any("refusing to purge all" in w.lower() for w in report.get("warnings", [])):
            # the data folder holds none of the indexed books: by design nothing is purged
            # until an operator names the books (a wrong RAG_DATA_DIR or an unmounted volume
            # looks the same); the operator's answer, as the warning says
            self.outcome.halts += 1
            on_disk = {b.name for b in self._books()}
            for book in sorted(set(point_sets(Path(self.cli.env["RAG_QDRANT_PATH"]))) - on_disk):
                self.cli("ingest", "--book", book, "--json", check=False)
            return self.step_ingest()  # the books on disk, which the refusal left alone
        return report

    def check_plan(self, what: str) -> None:
        done = self.cli("plan", "--json", check=False)
        try:
            books = json.loads(done.stdout)["books"]
        except (ValueError, KeyError):
            self.outcome.failures.append(f"after {what}: plan exit {done.returncode}")
            return
        busy = {b: p["reasons"] for b, p in books.items() if p["action"] != "unchanged"}
        if busy:
            self.outcome.plan_disagreements.append(f"after {what}: plan would run {busy}")

    def clean_build(self) -> dict[str, set[str]]:
        """The point ids of a clean build of the books as they are now."""
        sets, problem = clean_point_sets(self.data, self.root / f"clean-{self.outcome.comparisons}")
        if problem:  # the oracle itself failed: said as such, not as divergence
            self.outcome.failures.append(problem)
        return sets

    def compare(self, what: str) -> None:
        self.outcome.comparisons += 1
        ours = point_sets(Path(self.cli.env["RAG_QDRANT_PATH"]))
        clean = self.clean_build()
        self.outcome.divergences += [f"after {what}: {d}" for d in diverging(ours, clean)]

    def run(
        self,
        steps: int,
        *,
        compare_every: int = 5,
        log: Callable[[str], None] | None = None,
        first: Sequence[str] = (),
    ) -> Outcome:
        """``first``: operations done first, in this order (a short sequence sure to hold
        them), then drawn at random."""
        started = time.perf_counter()
        self.step_ingest()
        names = sorted(self.operations)
        weights = [self.weights.get(n, 1.0) for n in names]
        for step in range(1, steps + 1):
            if step <= len(first):
                name = first[step - 1]
            else:  # (uniform without weights: the draw the recorded seeds were found with)
                name = (
                    self.rng.choices(names, weights)[0] if self.weights else self.rng.choice(names)
                )
            self.outcome.steps = step
            self.outcome.operations[name] = self.outcome.operations.get(name, 0) + 1
            did = self.operations[name]()
            what = f"step {step} ({did})"
            if log is not None:
                log(what)
            self.step_ingest()
            self.check_plan(what)
            if step % compare_every == 0 or step == steps:
                self.compare(what)
        self.outcome.seconds = time.perf_counter() - started
        return self.outcome


class LiveDifferential(Differential):
    """The same sequences with live mode applying the changes: a ``rag-pipeline watch``
    process runs throughout, and instead of an ingest after each operation, ``plan`` must say
    every book is unchanged within :attr:`SETTLE_S` seconds (polled). ``kill -9`` hits the live
    process at a random moment after an edit (it is then started again: its first look
    catches up), and an edit lands while it applies another. Edits are also timed against
    the live run's phases (:mod:`rag_pipeline_tests.phasepoint`): a second edit right after
    its look scanned the books, after its run read the files, or after it wrote the points,
    and an edit saved as the run starts and reverted after the run read it. The live process
    also records how many runs each book got (:attr:`runs_per_book`)."""

    SETTLE_S = 60.0
    #: how long a timed edit waits for its phase (a change the plan finds unchanged, or one
    #: whose look came before the arming, never reaches the run's phases: counted, not failed)
    PHASE_WAIT_S = 15.0

    def __init__(self, root: Path, seed: int, **options: Any) -> None:
        super().__init__(root, seed, **options)
        # the live process is started from scratch, as a user starts it (LiveProcess); the
        # plans that poll for its work are forked from the warm interpreter, a real process
        # each without a fresh import of Dagster
        self.live: LiveProcess | None = None
        self.killed = 0
        self.settle_seconds: list[float] = []
        self.phases = Phases(root / "phases")
        self.phases_missed = 0
        self.operations["edit_at_phase"] = self.edit_at_phase
        self.operations["edit_reverted_in_run"] = self.edit_reverted_in_run
        self.weights = {"edit_at_phase": 2.0, "edit_reverted_in_run": 2.0}

    def _start_live(self) -> None:
        for left in self.phases.folder.iterdir():  # held phases die with a killed process
            left.unlink()
        self.live = LiveProcess(self.cli, phases=self.phases.folder)
        self.live.next_event("ready", timeout=120)

    def _reached(self, phase: str) -> bool:
        try:
            self.phases.wait(phase, timeout=self.PHASE_WAIT_S)
        except AssertionError:
            (self.phases.folder / f"arm-{phase}").unlink(missing_ok=True)
            self.phases.go(phase)  # a hold that began just now goes on at once
            self.phases_missed += 1
            return False
        return True

    def edit_at_phase(self) -> str:
        """An edit, and a second one (the same file or another of its book) while the live
        run of the first holds at one of its phases."""
        path = self._pick_file()
        if path is None:
            return self.add()
        phase = self.rng.choice(PHASES)
        self.phases.arm(phase)
        self._write(path)
        if not self._reached(phase):
            return f"edit {path.relative_to(self.data)} ({phase} not reached)"
        book = self.data / path.relative_to(self.data).parts[0]
        second = path if self.rng.random() < 0.5 else self.rng.choice(self._files(book))
        self._write(second)
        self.phases.go(phase)
        first, then = path.relative_to(self.data), second.relative_to(self.data)
        return f"edit {first}; edit {then} after its run's {phase}"

    def edit_reverted_in_run(self) -> str:
        """A file that reads A when live mode looks, B as its run starts, A again once the
        run read it (issue 43.1)."""
        path = self._pick_file()
        if path is None:
            return self.add()
        self.serial += 1
        a_text = _text(self.rng, f"Part {self.serial}", self.rng.randint(8, 60))
        self.phases.arm("scan", "read")
        self._write(path, a_text)
        if not self._reached("scan"):
            (self.phases.folder / "arm-read").unlink(missing_ok=True)
            return f"edit {path.relative_to(self.data)} (scan not reached)"
        self._write(path)  # B
        self.phases.go("scan")
        if self._reached("read"):
            self._write(path, a_text)
            self.phases.go("read")
            return f"{path.relative_to(self.data)}: A, B as its run started, A after it read"
        self._write(path, a_text)
        return f"{path.relative_to(self.data)}: A, B, A (read not reached)"

    def run(
        self,
        steps: int,
        *,
        compare_every: int = 5,
        log: Callable[[str], None] | None = None,
        first: Sequence[str] = (),
    ) -> Outcome:
        self._start_live()
        try:
            return super().run(steps, compare_every=compare_every, log=log, first=first)
        finally:
            if self.live is not None:
                self.live.stop()
                self._count_failed_runs()

    def _count_failed_runs(self) -> None:
        assert self.live is not None
        failed = self.live.applied_books("failed")
        if failed:
            self.outcome.failures.append(f"live runs failed for {failed}")

    def edit_during_ingest(self) -> str:
        first = self.edit()
        time.sleep(self.rng.uniform(0.15, 1.2))  # the live process applies the first
        second = self.edit()
        return f"{first}; {second} while live mode applied it"

    def kill_ingest(self) -> str:
        did = self.edit()
        time.sleep(self.rng.uniform(0.05, 2.0))
        assert self.live is not None
        self._count_failed_runs()
        self.live.kill()
        self.killed += 1
        self._start_live()
        return f"{did}; live process killed, started again"

    def step_ingest(self) -> dict[str, Any]:
        """Wait until ``plan`` says every book is unchanged (live mode applied the change)."""
        time.sleep(0.1)
        started = time.monotonic()
        busy: dict[str, Any] = {}
        while time.monotonic() - started < self.SETTLE_S:
            assert self.live is not None
            if self.live.proc.poll() is not None:
                self.outcome.failures.append(
                    f"step {self.outcome.steps}: the live process exited "
                    f"{self.live.proc.returncode}: {''.join(self.live.stderr[-10:])}"
                )
                self._start_live()
            done = self.cli("plan", "--json", check=False)
            try:
                plan: dict[str, Any] = json.loads(done.stdout)
            except ValueError:
                plan = {}
            if any("refusing to purge all" in w.lower() for w in plan.get("warnings", [])):
                self.outcome.halts += 1  # the operator's answer, as the warning says
                on_disk = {b.name for b in self._books()}
                indexed = set(point_sets(Path(self.cli.env["RAG_QDRANT_PATH"])))
                for book in sorted(indexed - on_disk):
                    self.cli("ingest", "--book", book, "--json", check=False)
                continue
            books = plan.get("books", {})
            busy = {b: p["reasons"] for b, p in books.items() if p["action"] != "unchanged"}
            if done.returncode == 0 and not busy:
                self.settle_seconds.append(time.monotonic() - started)
                return {}
            time.sleep(0.25)
        self.outcome.failures.append(
            f"step {self.outcome.steps}: live mode did not apply the change within "
            f"{self.SETTLE_S:g}s: plan would still run {busy}"
        )
        return {}

    @property
    def runs_per_book(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        if self.live is not None:
            for book in self.live.applied_books():
                counts[book] = counts.get(book, 0) + 1
        return counts


class GitDifferential(Differential):
    """The same check over git books (issue 39): a few repositories declared in a sources file
    (``RAG_SOURCES``), changed by commits of random edits, renames, deletions and additions,
    a force-push (the ref reset to an older commit and new commits made on it: rewritten
    history), edits left uncommitted in the work tree, a ``kill -9`` of an ingest, and entries
    removed from and put back in the sources file. The oracle is independent of the git
    source: a clean build of each ref's tree exported as a folder book (``git archive``), with
    the same book ids (point ids derive from the book, the file and the text)."""

    def __init__(self, root: Path, seed: int, *, books: int = 2, files: int = 4) -> None:
        from rag_pipeline_tests.gitbooks import GitRepo

        super().__init__(root, seed, books=0, files=files)
        self.repos: dict[str, GitRepo] = {}
        self.declared: dict[str, dict[str, str]] = {}
        for b in range(books):
            book_id = f"git-{b}"
            repo = GitRepo(root / "repos" / book_id)
            under = "docs" if b % 2 == 0 else ""  # a subfolder as the book, or the whole tree
            for f in range(files):
                self._write(repo.path / under / f"f{f}.md")
            self._write(repo.path / "NOTES.txt", "not markdown\n")
            repo.commit("first")
            self.repos[book_id] = repo
            self.declared[book_id] = {"git": str(repo.path), "ref": "main", "path": under}
        self.sources = root / "sources.yaml"
        self.removed: dict[str, dict[str, str]] = {}
        self._declare()
        self.cli.env["RAG_SOURCES"] = str(self.sources)
        self.operations = {
            "commit_edits": self.commit_edits,
            "commit_rename": self.commit_rename,
            "commit_delete": self.commit_delete,
            "commit_add": self.commit_add,
            "force_push": self.force_push,
            "uncommitted_edit": self.uncommitted_edit,
            "kill_ingest": self.kill_ingest,
            "entry_away_and_back": self.entry_away_and_back,
        }

    def _declare(self) -> None:
        from rag_pipeline_tests.gitbooks import write_sources

        write_sources(self.sources, self.declared)

    def _pick_repo(self) -> tuple[str, Any, str]:
        book_id = self.rng.choice(sorted(self.repos))
        return (
            book_id,
            self.repos[book_id],
            self.declared.get(book_id, self.removed.get(book_id, {})).get("path", ""),
        )

    def _book_files(self, repo: Any, under: str) -> list[str]:
        return [f for f in repo.files(under) if f.endswith(".md")]

    def commit_edits(self) -> str:
        book_id, repo, under = self._pick_repo()
        files = self._book_files(repo, under)
        if not files:
            return self.commit_add()
        picked = self.rng.sample(files, self.rng.randint(1, min(3, len(files))))
        for name in picked:
            self._write(repo.path / name)
        repo.commit(f"edit {len(picked)}")
        return f"{book_id}: commit editing {', '.join(picked)}"

    def commit_rename(self) -> str:
        book_id, repo, under = self._pick_repo()
        files = self._book_files(repo, under)
        if not files:
            return self.commit_add()
        name = self.rng.choice(files)
        self.serial += 1
        target = str(Path(name).with_name(f"r{self.serial}.md"))
        repo.git("mv", name, target)
        repo.commit("rename")
        return f"{book_id}: commit renaming {name} -> {target}"

    def commit_delete(self) -> str:
        book_id, repo, under = self._pick_repo()
        files = self._book_files(repo, under)
        if len(files) < 2:
            return self.commit_add()
        name = self.rng.choice(files)
        repo.git("rm", "--quiet", name)
        repo.commit("delete")
        return f"{book_id}: commit deleting {name}"

    def commit_add(self) -> str:
        book_id, repo, under = self._pick_repo()
        self.serial += 1
        name = str(Path(under) / self.rng.choice(["", "sub"]) / f"n{self.serial}.md")
        self._write(repo.path / name)
        repo.commit("add")
        return f"{book_id}: commit adding {name}"

    def force_push(self) -> str:
        """History rewritten: the ref back to an older commit, then a new commit on it."""
        book_id, repo, under = self._pick_repo()
        count = int(repo.git("rev-list", "--count", "HEAD"))
        back = self.rng.randint(1, max(1, min(3, count - 1))) if count > 1 else 0
        if back:
            repo.git("reset", "--quiet", "--hard", f"HEAD~{back}")
        files = self._book_files(repo, under)
        if files:
            self._write(repo.path / self.rng.choice(files))
        repo.commit("rewritten")
        return f"{book_id}: force-push ({back} commits dropped, one new)"

    def uncommitted_edit(self) -> str:
        """The work tree edited, nothing committed: never indexed (a later commit of the same
        repository commits it with its own edits)."""
        book_id, repo, under = self._pick_repo()
        files = self._book_files(repo, under)
        if not files:
            return self.commit_add()
        name = self.rng.choice(files)
        self._write(repo.path / name)
        return f"{book_id}: uncommitted edit of {name}"

    def kill_ingest(self) -> str:
        did = self.commit_edits()
        proc = self.cli.start("ingest", "--json")
        time.sleep(self.rng.uniform(0.05, 2.0))
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        return f"{did}; ingest killed"

    def entry_away_and_back(self) -> str:
        """A book's entry removed from the sources file (the next ingest purges the book),
        then put back (the next ingest indexes it again)."""
        if len(self.declared) < 2:
            return self.commit_edits()
        book_id = self.rng.choice(sorted(self.declared))
        self.removed[book_id] = self.declared.pop(book_id)
        self._declare()
        self.step_ingest()
        self.declared[book_id] = self.removed.pop(book_id)
        self._declare()
        return f"{book_id}: entry removed, ingested, put back"

    def clean_build(self) -> dict[str, set[str]]:
        """A clean build of each declared ref's tree (its committed files only), as folder
        books: nothing of the git source is used."""
        build = self.root / f"clean-{self.outcome.comparisons}"
        books = build / "books"
        for book_id, entry in self.declared.items():
            self.repos[book_id].export(books / book_id, entry.get("path", ""))
        cli = Cli(build, books)
        Path(cli.env["DAGSTER_HOME"]).mkdir()
        done = cli("ingest", "--json", check=False)
        if done.returncode != 0:
            self.outcome.failures.append(
                f"clean build exit {done.returncode}: {done.stderr[-400:]}"
            )
        sets = point_sets(Path(cli.env["RAG_QDRANT_PATH"]))
        shutil.rmtree(build, ignore_errors=True)
        return sets
