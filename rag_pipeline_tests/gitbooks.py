"""Git repositories for the tests of git books: a work tree whose commits a sources file
(``RAG_SOURCES``) names, and the export of a ref's tree as a folder book (the oracle a clean
build of the ref is compared with)."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

__all__ = ["NEEDS_GIT", "GitRepo", "paragraphs", "write_sources"]

#: the tests of git books need the git CLI (.ci/run installs it from Debian)
NEEDS_GIT = pytest.mark.skipif(shutil.which("git") is None, reason="the git CLI is not installed")

_ENV = {
    "GIT_AUTHOR_NAME": "Ada Writer",
    "GIT_AUTHOR_EMAIL": "ada@example.com",
    "GIT_COMMITTER_NAME": "Ada Writer",
    "GIT_COMMITTER_EMAIL": "ada@example.com",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def paragraphs(title: str, sections: int = 4, seed: str = "") -> str:
    """A page of ``sections`` sections of one paragraph each (a chunk or so a section)."""
    from rag_pipeline_tests.conftest import section

    body = "\n\n".join(
        section(f"{title} part {i}", paragraphs=2, words=60, seed=seed) for i in range(sections)
    )
    return f"# {title}\n\n{body}\n"


class GitRepo:
    """A git repository with a work tree at ``path`` (branch ``main``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.git("init", "--quiet", "--initial-branch=main")

    def git(self, *args: str) -> str:
        import os

        done = subprocess.run(
            ["git", "-C", str(self.path), *args],
            capture_output=True,
            text=True,
            env={**os.environ, **_ENV},
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(f"git {' '.join(args)}: {done.stderr}")
        return done.stdout.strip()

    def write(self, files: dict[str, str]) -> None:
        for name, text in files.items():
            path = self.path / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    def commit(self, message: str, files: dict[str, str] | None = None) -> str:
        """Write ``files``, stage every change, commit; the new commit's sha."""
        self.write(files or {})
        self.git("add", "--all")
        self.git("commit", "--quiet", "--allow-empty", "-m", message)
        return self.head()

    def head(self) -> str:
        return self.git("rev-parse", "HEAD")

    def files(self, under: str = "") -> list[str]:
        """The files of HEAD's tree (under ``under``)."""
        listed = self.git("ls-tree", "-r", "--name-only", "HEAD", *([under] if under else []))
        return [line for line in listed.splitlines() if line]

    def export(self, target: Path, under: str = "") -> None:
        """HEAD's tree (its folder ``under``) written to ``target``: a folder book of it."""
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(self.path), "archive", "--format=tar", "HEAD"],
            capture_output=True,
            check=True,
        ).stdout
        prefix = f"{under}/" if under else ""
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            for member in tar.getmembers():
                if member.isfile() and member.name.startswith(prefix):
                    out = target / member.name[len(prefix) :]
                    out.parent.mkdir(parents=True, exist_ok=True)
                    extracted = tar.extractfile(member)
                    assert extracted is not None
                    out.write_bytes(extracted.read())


def write_sources(path: Path, books: dict[str, dict[str, str]]) -> Path:
    """A sources file declaring ``books`` (book id -> entry), as YAML."""
    import yaml

    path.write_text(yaml.safe_dump({"books": books}, sort_keys=True))
    return path
