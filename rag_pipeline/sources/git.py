"""Git books: a book is the tree of a ref of a git repository (``RAG_SOURCES``, see
:mod:`.declared`), optionally one subfolder of it.

What is indexed is the tree of the commit the ref names, never a work tree: each book's
repository is fetched into a bare cache repository of its own (``<RAG_CACHE_DIR>/git/``) and
read from there with the git CLI. A look at a book costs one ``git ls-remote`` (the ref's
commit now) while the commit is one already listed in this process; a new commit costs one
``git fetch`` and one ``git ls-tree -r``. A file's version is its blob id (a content token,
:data:`~rag_pipeline.models.VersionKey`): the run summary records each file's blob id and
SHA-256, so a new commit reads only the blobs whose id moved (added, modified, renamed), and a
rewritten history (a force-push) is compared the same way: by blob id, never by the history.
The book's revision is the commit, recorded in every point the run writes. Blobs are read with
one ``git cat-file --batch`` process per repository.

A remote that cannot be reached or a ref that does not exist is a crawl error of the whole book
(naming the repository, the ref and git's reason): nothing of it is read, no indexed file is
taken for deleted, every other book goes on, and the next look tries again.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import subprocess
import threading
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rag_pipeline.models import FileError, SourceFile, printable
from rag_pipeline.sources.base import (
    BookListing,
    BookSource,
    BookUnavailableError,
    BookVersions,
    FileVersion,
    SourceReadError,
    too_large,
)
from rag_pipeline.sources.crawl import is_book_path
from rag_pipeline.urls import without_credentials

__all__ = ["GitBookSpec", "GitError", "GitSource", "git_available"]

#: seconds a ``git ls-remote`` / ``git fetch`` may take before the book fails this look
LS_REMOTE_TIMEOUT_S = 60.0
FETCH_TIMEOUT_S = 600.0
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_SHORT_HEX = re.compile(r"^[0-9a-f]{4,39}$")
#: what ``git check-ref-format`` refuses anywhere in a ref, and what would be an option
_BAD_REF = re.compile(r"(\.\.|@\{|[\x00-\x20\x7f~^:?*\[\\]|^-|^/|/$|\.lock$|//)")
#: git never asks for a password on a terminal; ssh never prompts either; a book's ``path``
#: is a folder's name, never a pattern (``docs*`` or ``:(top)`` would name other folders)
_GIT_ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_ASKPASS": "",
    "SSH_ASKPASS": "",
    "GIT_LITERAL_PATHSPECS": "1",
}
#: what git takes from the environment to find a repository's parts (``git rev-parse
#: --local-env-vars``, and a push's quarantine): set around a process started from a git
#: hook or a work tree, they would send the cache repository's reads and writes elsewhere
_REPOSITORY_ENV = frozenset(
    {
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_COMMON_DIR",
        "GIT_DIR",
        "GIT_GRAFT_FILE",
        "GIT_IMPLICIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_INTERNAL_SUPER_PREFIX",
        "GIT_NAMESPACE",
        "GIT_NO_REPLACE_OBJECTS",
        "GIT_OBJECT_DIRECTORY",
        "GIT_PREFIX",
        "GIT_QUARANTINE_PATH",
        "GIT_REPLACE_REF_BASE",
        "GIT_SHALLOW_FILE",
        "GIT_WORK_TREE",
    }
)
#: a mode of ``git ls-tree``: a regular file (executable or not)
_FILE_MODES = {"100644", "100755"}
#: the other modes of a tree's entries, in words
_OTHER_MODES = {"120000": "a symbolic link", "160000": "a submodule (gitlink)"}


def _git_env() -> dict[str, str]:
    """The environment of every git process: this one's, without what would point git at
    another repository, and never prompting."""
    env = {k: v for k, v in os.environ.items() if k not in _REPOSITORY_ENV}
    return {**env, **_GIT_ENV}


class GitError(Exception):
    """A git command failed; ``str()`` is git's reason in a line."""


class GitBookSpec(BaseModel):
    """One git book of the sources file: ``{git: URL-or-path, ref: main, path: docs}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    git: str = Field(min_length=1, description="a path or URL git can fetch")
    ref: str = Field("HEAD", min_length=1, description="a branch, tag or commit sha")
    path: str = Field("", description="the subfolder of the repository that is the book")

    @field_validator("git")
    @classmethod
    def _fetchable(cls, value: str) -> str:
        if value.startswith("-") or any(ord(c) < 32 for c in value):
            raise ValueError(f"not a repository path or URL: {without_credentials(repr(value))}")
        return value

    @field_validator("ref")
    @classmethod
    def _valid_ref(cls, value: str) -> str:
        if _BAD_REF.search(value):
            raise ValueError(f"not a branch, tag or commit name git accepts: {value!r}")
        if _HEX40.match(value.lower()):
            return value.lower()  # a commit's sha, as git accepts it in either case
        return value

    @field_validator("path")
    @classmethod
    def _inside_repository(cls, value: str) -> str:
        parts = [p for p in value.strip("/").split("/") if p and p != "."]
        if value.startswith("/") and value.strip("/"):
            raise ValueError(f"must be relative to the repository's root: {value!r}")
        if any(p == ".." or any(ord(c) < 32 for c in p) for p in parts):
            raise ValueError(f"must be a folder inside the repository: {value!r}")
        return "/".join(parts)

    @property
    def where(self) -> str:
        """The book's origin in words: ``repo@ref:path`` (a URL's credentials never shown)."""
        return f"{self.shown_git}@{self.ref}" + (f":{self.path}" if self.path else "")

    @property
    def shown_git(self) -> str:
        """The repository as messages, plans and metadata show it: without credentials."""
        return without_credentials(self.git)


def git_available() -> bool:
    """The git CLI can be run."""
    try:
        subprocess.run(["git", "--version"], capture_output=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def _git(repo: Path, *args: str, timeout: float = 120.0, stdin: bytes | None = None) -> bytes:
    """Run ``git --git-dir=repo args``; :class:`GitError` with git's last line of stderr."""
    try:
        done = subprocess.run(
            ["git", f"--git-dir={repo}", *args],
            input=stdin,
            capture_output=True,
            timeout=timeout,
            env=_git_env(),
            check=False,
        )
    except FileNotFoundError:
        raise GitError("the git command is not installed") from None
    except subprocess.TimeoutExpired:
        raise GitError(f"git {args[0]} took longer than {timeout:.0f} s") from None
    except OSError as exc:
        raise GitError(f"cannot run git: {exc.strerror}") from None
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
        fatal = [ln for ln in lines if ln.startswith(("fatal: ", "error: "))]
        reason = (fatal or lines or [f"git {args[0]} exited {done.returncode}"])[0].strip()
        reason = without_credentials(reason)  # (git shows a remote's URL as it was given)
        raise GitError(reason.removeprefix("fatal: ").removeprefix("error: "))
    return done.stdout


@dataclass
class _Blobs:
    """One ``git cat-file --batch`` process of a repository, for this process."""

    repo: Path
    lock: threading.Lock = field(default_factory=threading.Lock)
    proc: subprocess.Popen[bytes] | None = None
    pid: int = 0

    def read(self, blob: str, max_bytes: int) -> bytes:
        with self.lock:
            try:
                return self._read(blob, max_bytes)
            except (OSError, ValueError) as exc:  # the process died: the next read restarts it
                self.close()
                raise SourceReadError(errno.EIO, f"cannot read git blob {blob}: {exc}") from None

    def _read(self, blob: str, max_bytes: int) -> bytes:
        if self.proc is None or self.pid != os.getpid() or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                ["git", f"--git-dir={self.repo}", "cat-file", "--batch"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=_git_env(),
            )
            self.pid = os.getpid()
            weakref.finalize(self, _end, self.proc)  # ended with its reader
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(blob.encode() + b"\n")
        self.proc.stdin.flush()
        header = self.proc.stdout.readline().split()
        if len(header) != 3 or header[1] != b"blob":
            raise SourceReadError(errno.ENOENT, f"git blob {blob} is not in the repository")
        size = int(header[2])
        if size > max_bytes:
            # refused by its header's size: the blob is skipped in bounded blocks, never held
            # (a file of gigabytes would otherwise sit in memory to be refused)
            left = size + 1  # and the newline after it
            while left > 0:
                block = self.proc.stdout.read(min(left, 1 << 20))
                if not block:
                    raise ValueError("the cat-file process ended early")
                left -= len(block)
            raise SourceReadError(errno.EFBIG, too_large(size, max_bytes))
        data = self.proc.stdout.read(size + 1)[:size]  # and the newline after it
        if len(data) != size:
            raise ValueError("the cat-file process ended early")
        return data

    def close(self) -> None:
        if self.proc is not None and self.pid == os.getpid():
            _end(self.proc)
        self.proc = None


#: git's refusal to take a lock another git holds (or a killed one left)
#: (its ``.lock``, or the file whose ``.lock`` it is)
_STALE_LOCK = re.compile(
    r"Unable to create '([^']+\.lock)': File exists|could not lock config file (.+): File exists"
)


def _git_alone(repo: Path, *args: str, timeout: float = 120.0) -> bytes:
    """:func:`_git` by the holder of :func:`_exclusive`: a lock file of git's in the cache
    repository then was left by a git killed mid-way (an ingest killed during a fetch or
    the cache's creation), and is removed (it failed the book at every look until removed
    by hand)."""
    try:
        return _git(repo, *args, timeout=timeout)
    except GitError as exc:
        stale = _STALE_LOCK.search(str(exc))
        lock = stale and (stale.group(1) or f"{stale.group(2)}.lock")
        if not lock or not _remove_stale_lock(repo, lock):
            raise
    return _git(repo, *args, timeout=timeout)


def _remove_stale_lock(repo: Path, lock: str) -> bool:
    """Remove ``lock`` if it is a lock file inside the cache repository ``repo`` (only
    :func:`_exclusive`'s holder calls this: no git of this product holds it); whether it
    was."""
    path = Path(lock)
    try:
        if not path.resolve().is_relative_to(repo.resolve()):
            return False
        path.unlink()
    except OSError:
        return False
    return True


@contextmanager
def _exclusive(repo: Path) -> Iterator[None]:
    """Held by one process (and thread) at a time for the cache repository ``repo``: its
    creation and its fetches. Two at once (a sensor tick and an ``ingest``, live mode's look)
    collide on git's own lock files (``config.lock``, a ref's ``.lock``) and one fails the
    book; the second waits, then finds the work done."""
    try:
        repo.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(repo.parent / f"{repo.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise GitError(f"cannot create the cache folder {repo.parent}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # (let go when the file is closed, or the process ends)
        yield
    finally:
        os.close(fd)


def _end(proc: subprocess.Popen[bytes]) -> None:
    """End a ``cat-file --batch`` process: its input closed, then killed if still there."""
    for pipe in (proc.stdin, proc.stdout):
        try:
            if pipe is not None:
                pipe.close()
        except OSError:
            pass
    try:
        proc.kill()
        proc.wait(timeout=5)
    except (OSError, subprocess.SubprocessError):
        pass


@dataclass
class _Book:
    """What this process knows of one git book: its cache repository, the commits it holds,
    the tree listed for the last commit, and its blob reader."""

    spec: GitBookSpec
    repo: Path
    lock: threading.Lock = field(default_factory=threading.Lock)
    ready: bool = False
    commits: set[str] = field(default_factory=set)
    listed: BookVersions | None = None
    #: why the last look at the book failed (None: it listed ``listed``)
    failure: str | None = None
    blobs: _Blobs | None = None
    #: blob id -> size, as the last listing found them: a blob over the limit is refused by
    #: it, never streamed through ``cat-file`` at every look (one of an older listing is)
    sizes: dict[str, int] = field(default_factory=dict)


class GitSource(BookSource):
    """Books as refs of git repositories (``books``: book id -> spec), fetched into bare
    repositories under ``cache_dir``."""

    def __init__(
        self,
        books: Mapping[str, GitBookSpec],
        *,
        cache_dir: Path | str,
        max_file_bytes: int = 10 * 1024 * 1024,
    ) -> None:
        self.books = dict(books)
        self.cache_dir = Path(cache_dir)
        self.max_file_bytes = max_file_bytes
        self.description = f"git books of the sources file (cache {self.cache_dir})"
        self.book_noun = "git book"
        self._state: dict[str, _Book] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"GitSource({sorted(self.books)!r})"

    def __getstate__(self) -> dict[str, object]:
        # a process of its own (a Dagster step) starts its own git processes
        return {k: v for k, v in self.__dict__.items() if k not in ("_state", "_lock")}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._state = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        """End the blob readers this process started."""
        for book in self._state.values():
            if book.blobs is not None:
                book.blobs.close()

    # -- the contract -------------------------------------------------------------------------

    def list_books(self) -> BookListing:
        return BookListing(tuple(sorted(self.books)))

    def versions(self, book_id: str) -> BookVersions:
        book = self._book(book_id)
        with book.lock:
            try:
                commit = self._resolve(book)
                if book.listed is None or book.listed.revision != commit:
                    book.listed = self._list(book_id, book, commit)
            except GitError as exc:
                book.failure = f"git {book.spec.where}: {exc}"
                raise BookUnavailableError(book.failure) from None
            book.failure = None
            return book.listed

    def read(self, book_id: str, file: FileVersion | SourceFile, boundary: str) -> bytes:
        if not isinstance(file.key, str):
            raise SourceReadError(errno.EINVAL, "not a file of a git tree")
        book = self._book(book_id)
        size = book.sizes.get(file.key)
        if size is not None and size > self.max_file_bytes:
            raise SourceReadError(errno.EFBIG, too_large(size, self.max_file_bytes))
        if book.blobs is None:
            book.blobs = _Blobs(book.repo)
        return book.blobs.read(file.key, self.max_file_bytes)

    def is_gone(self, book_id: str, source_file: str | None = None) -> bool:
        if source_file is None:
            return book_id not in self.books
        if book_id not in self.books:
            return True
        book = self._book(book_id)
        if book.listed is None or book.failure is not None:
            try:  # as of now (what a look in this process found is what the run read)
                self.versions(book_id)
            except BookUnavailableError:
                return False  # the tree cannot be looked at: nothing is taken for deleted
        assert book.listed is not None
        # an entry the listing refused (a file turned into a link or a submodule) is there:
        # its indexed chunks stay, as a folder's file turned into a link out does
        listed = {v.source_file for v in book.listed.files}
        listed.update(e.source_file for e in book.listed.errors)
        return source_file not in listed

    def exists(self) -> bool:
        return True

    def notifies(self, book_id: str) -> bool:
        return False  # no notification of a new commit: every look asks the remote

    def why_unreadable(self, book_id: str, source_file: str) -> str:
        failure = self._book(book_id).failure
        return failure or "the file is in the tree but its blob could not be read"

    def why_not_a_book(self, book_id: str) -> str:
        return "is not a git book of the sources file"

    def locate(self, book_id: str, source_file: str) -> str:
        spec = self.books[book_id]
        inside = "/".join(p for p in (spec.path, source_file) if p)
        return f"{spec.shown_git}@{spec.ref}:{inside}"

    def describe(self, book_id: str) -> dict[str, str]:
        spec = self.books[book_id]
        return {"kind": "git", "location": spec.shown_git, "ref": spec.ref, "path": spec.path}

    def revision_info(self, book_id: str, revision: str) -> dict[str, str] | None:
        if not _HEX40.match(revision) or book_id not in self.books:
            return None
        book = self._book(book_id)
        try:
            self._ready(book)
            out = _git(book.repo, "show", "-s", "--format=%H%x00%an <%ae>%x00%aI%x00%s", revision)
        except GitError:
            return None
        fields = out.decode("utf-8", "replace").strip().split("\0") + [""] * 4
        sha, author, date, subject = fields[:4]
        return {"sha": sha, "author": author, "date": date, "subject": subject}

    def revision_range(self, book_id: str, old: str, new: str) -> str | None:
        if not _HEX40.match(new) or (old and not _HEX40.match(old)) or book_id not in self.books:
            return None  # (what an index records is a commit; anything else is no argument)
        if not old:
            return f"commit {new[:12]} (first ingest)"
        if old == new:
            return f"commit {new[:12]} (already indexed)"
        book = self._book(book_id)
        try:
            self._ready(book)
            count = _git(book.repo, "rev-list", "--count", f"{old}..{new}").decode().strip()
            _git(book.repo, "merge-base", "--is-ancestor", old, new)
        except GitError:
            return (
                f"commits {old[:12]}..{new[:12]}: the indexed commit is not an ancestor of the "
                "ref's (history rewritten): files compared by blob id"
            )
        said = f"commits {old[:12]}..{new[:12]} ({count} commit{'s' if count != '1' else ''}"
        renamed = self._renames(book, old, new)
        if renamed:
            shown = ", ".join(f"{a} -> {b}" for a, b in renamed[:5])
            said += f"; renamed: {shown}" + (
                f" and {len(renamed) - 5} more" if len(renamed) > 5 else ""
            )
        return said + ")"

    def _renames(self, book: _Book, old: str, new: str) -> list[tuple[str, str]]:
        """The book's files git's diff between the two commits finds renamed (its rename
        detection); their chunks' vectors are reused, nothing is embedded for them."""
        prefix = f"{book.spec.path}/" if book.spec.path else ""
        try:
            out = _git(
                book.repo,
                "diff",
                "--name-status",
                "-z",
                "-M",
                "--diff-filter=R",
                old,
                new,
                *(["--", prefix] if prefix else []),
            )
        except GitError:
            return []
        fields = out.decode("utf-8", "replace").split("\0")
        renames = []
        for i in range(0, len(fields) - 2, 3):
            if fields[i].startswith("R"):
                a, b = fields[i + 1][len(prefix) :], fields[i + 2][len(prefix) :]
                if is_book_path(b):
                    renames.append((a, b))
        return renames

    # -- git -----------------------------------------------------------------------------------

    def _book(self, book_id: str) -> _Book:
        with self._lock:
            book = self._state.get(book_id)
            if book is None:
                spec = self.books[book_id]
                # the repository without credentials: a rotated token keeps the cache
                name = hashlib.sha256(spec.shown_git.encode()).hexdigest()[:12]
                book = _Book(spec, self.cache_dir / "git" / f"{book_id}-{name}.git")
                self._state[book_id] = book
            return book

    def _ready(self, book: _Book) -> None:
        """The cache repository exists (``git init`` is safe to repeat, and repairs one a
        kill left half made)."""
        if book.ready:
            return
        if all((book.repo / part).exists() for part in ("HEAD", "config", "objects", "refs")):
            book.ready = True  # made whole by an earlier process
            return
        with _exclusive(book.repo):
            _git_alone(book.repo, "init", "--bare", "--quiet", str(book.repo))
        book.ready = True

    def _has_commit(self, book: _Book, sha: str) -> bool:
        if sha in book.commits:
            return True
        try:
            _git(book.repo, "cat-file", "-e", f"{sha}^{{commit}}")
        except GitError:
            return False
        book.commits.add(sha)
        return True

    def _resolve(self, book: _Book) -> str:
        """The commit the book's ref names now, fetched into the cache repository."""
        self._ready(book)
        spec = book.spec
        if _HEX40.match(spec.ref):
            if not self._has_commit(book, spec.ref):
                self._fetch(book, spec.ref, f"refs/rag/tips/{spec.ref}")
            if not self._has_commit(book, spec.ref):
                raise GitError(f"commit {spec.ref} is not in the repository")
            return spec.ref
        listed = _git(book.repo, "ls-remote", "--", spec.git, timeout=LS_REMOTE_TIMEOUT_S)
        refs: dict[str, str] = {}
        for line in listed.decode("utf-8", "replace").splitlines():
            sha, _, name = line.partition("\t")
            refs[name] = sha
        # a branch before a tag of the same name (what ``ref: main`` means), then git's
        # other names of a ref (``tags/v1``, ``heads/main``)
        for name in (
            spec.ref,
            f"refs/heads/{spec.ref}",
            f"refs/tags/{spec.ref}",
            f"refs/{spec.ref}",
        ):
            found = refs.get(f"{name}^{{}}") or refs.get(name)  # a tag: the commit it names
            if found is None:
                continue
            if not self._has_commit(book, found):
                self._fetch(book, name, f"refs/rag/tips/{found}")
                if not self._has_commit(book, found):  # the ref moved since ls-remote
                    tip = _git(book.repo, "rev-parse", f"refs/rag/tips/{found}^{{commit}}")
                    found = tip.decode().strip()
                    book.commits.add(found)
            return found
        if _SHORT_HEX.match(spec.ref):  # an abbreviated commit: fetch the branches and tags
            self._fetch(book, "refs/heads/*", "refs/rag/heads/*", "+refs/tags/*:refs/rag/tags/*")
            try:
                out = _git(book.repo, "rev-parse", "--verify", f"{spec.ref}^{{commit}}")
            except GitError:
                raise GitError(f"no branch, tag or commit {spec.ref!r} in the repository") from None
            return out.decode().strip()
        raise GitError(f"no branch, tag or commit {spec.ref!r} in the repository")

    def _fetch(self, book: _Book, remote_ref: str, local_ref: str, *more: str) -> None:
        """Fetch ``remote_ref`` into ``local_ref`` (and the refspecs ``more``)."""
        args = ["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--", book.spec.git]
        args += [f"+{remote_ref}:{local_ref}", *more]
        with _exclusive(book.repo):
            _git_alone(book.repo, *args, timeout=FETCH_TIMEOUT_S)

    def _list(self, book_id: str, book: _Book, commit: str) -> BookVersions:
        """The Markdown files of the commit's tree under the book's path, each with its blob id
        (its version); symbolic links and names that are not UTF-8 are crawl errors."""
        prefix = f"{book.spec.path}/" if book.spec.path else ""
        args = ["ls-tree", "-r", "-l", "-z", "--full-tree", commit]  # -l: each blob's size
        if prefix:
            args += ["--", prefix]
        out = _git(book.repo, *args)
        if prefix and not out:
            # a folder that is not there (or a file where it was) is no answer: its files are
            # not taken for deleted
            try:
                path_type = _git(book.repo, "cat-file", "-t", f"{commit}:{book.spec.path}")
            except GitError:
                path_type = b""
            if path_type.strip() != b"tree":
                raise GitError(f"no folder {book.spec.path!r} in commit {commit[:12]}")
        files: list[FileVersion] = []
        errors: list[FileError] = []
        sizes: dict[str, int] = {}
        for entry in out.split(b"\0"):
            if not entry:
                continue
            meta, _, raw = entry.partition(b"\t")
            mode, kind, blob, size = meta.decode().split()
            raw_rel = raw[len(prefix.encode()) :]
            if not is_book_path(raw_rel.decode("utf-8", "surrogateescape")):
                continue  # not Markdown, or hidden, as in a book folder
            try:
                rel = raw_rel.decode("utf-8")
            except UnicodeDecodeError:
                shown = printable(raw_rel.decode("utf-8", "surrogateescape"))
                why = "file name is not valid UTF-8; rename it to ingest it"
                errors.append(FileError(book_id, shown, "crawl", why))
                continue
            if kind != "blob" or mode not in _FILE_MODES:
                # never followed: a link's target is a path of the host or the work tree, a
                # submodule's files are another repository's
                what = _OTHER_MODES.get(mode, f"not a regular file (mode {mode})")
                errors.append(
                    FileError(book_id, rel, "crawl", f"{what} in git; refused, never followed")
                )
                continue
            sizes[blob] = int(size)
            files.append(FileVersion(rel, blob, f"{commit}:{prefix}{rel}", version=blob))
        files.sort(key=lambda f: f.source_file)
        book.sizes = sizes
        return BookVersions(book_id, commit, tuple(files), tuple(errors), commit)
