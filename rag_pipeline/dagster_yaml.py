"""The settings of ``$DAGSTER_HOME/dagster.yaml`` the product relies on, checked in one place.

A home keeps the ``dagster.yaml`` it was given: ``make`` copies the repository's only when the
home has none, and so does the CLI. A home set up by an older version therefore lacks what
later versions rely on (the run coordinator that keeps the check badge truthful, the limits
that keep two runs of one book apart). :func:`review_home_config` says what is missing, and
replaces the file when it is an unmodified copy of an older version of the project's own (its
digest is one of :data:`EARLIER_VERSIONS`): a file someone edited is never rewritten, its
owner is told what to add instead. No dagster import: the CLI calls it before Dagster loads.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "COORDINATOR",
    "EARLIER_VERSIONS",
    "REQUIRED_SNIPPET",
    "REQUIRED_TAG_LIMITS",
    "HomeConfigReview",
    "missing_settings",
    "project_dagster_yaml",
    "review_home_config",
]

#: the settings the product relies on, as a user adds them to a home's dagster.yaml (merged
#: into its sections): the one place they are written, which the check below reads
REQUIRED_SNIPPET = """\
run_coordinator:
  module: rag_pipeline.defs.coordinator
  class: BookRunCoordinator
run_monitoring:
  enabled: true
run_retries:
  enabled: true
concurrency:
  runs:
    max_concurrent_runs: 2
    tag_concurrency_limits:
      - key: dagster/partition
        value:
          applyLimitPerUniqueValue: true
        limit: 1
      - key: rag/book
        value:
          applyLimitPerUniqueValue: true
        limit: 1
"""
_REQUIRED: dict[str, Any] = yaml.safe_load(REQUIRED_SNIPPET)
COORDINATOR = (_REQUIRED["run_coordinator"]["module"], _REQUIRED["run_coordinator"]["class"])
#: the limits that keep two runs of one book from executing at once
REQUIRED_TAG_LIMITS: tuple[dict[str, Any], ...] = tuple(
    _REQUIRED["concurrency"]["runs"]["tag_concurrency_limits"]
)

#: sha256 of every dagster.yaml this project shipped before the current one (git history of
#: the repository's dagster.yaml, test_dagster_yaml checks it is complete), and of the
#: telemetry-only file the CLI wrote into a home created outside a checkout: a home holding
#: one of these byte for byte was never edited, so it is replaced by the current file
EARLIER_VERSIONS = frozenset(
    {
        "a955d51a88ed3dc1722f505b960622c1266095338a0440afa3980a74e038a9de",
        "ff3333c5e9a3f4c7bcab95bab30826ae216c8c7440b17c62794587a56caf0ff6",
        "9a3791475bdf7e374b70d8c4576c9a3ddf25c56775109986c4aeae149e7e6d07",
        "dbfbfc4b89fd678539e0e1ae3de92d43fe1375188c3495f0cf01eee252b521e7",
        "967a5e20b66fc80cbbaf8cc31587a6057dfe6ca8d1705de17648e3a46d88d018",
        "be725efbf4c48261e26b52e955426fc5484960317d88f00028a06e28d6e14319",
        "47c03c45692e58607535dc3debd60e2fa17b51d5366c757cad1a48e90208d909",
        "16f88333359c5bde5b51a27fd973df554e4a1b9e72c673d11d0a8151d7d93425",
        "dce89265d597fd818a84d1a696dcd4916ea9657b3216f57d2961f2421aaafb5f",
        "e8211a0ec2a69674af8fd894367dccb8b6da0ba914c1a699c252ee74d7c33a2c",
        "fbffaeb7567193b56928c9e6853393cc7a1703efa9748eca440e64a25efa1d1c",
        "fa52681e735d44118bdd3a4e0599229772ae7a4f766e1694c4ba7fa5c62a206d",
        "07a5f5a0b3bd7f166d0e0b9e65b20dc2be9a3adb33d2b449024b4f9b453c4e90",
        hashlib.sha256(b"telemetry:\n  enabled: false\n").hexdigest(),
    }
)


def project_dagster_yaml() -> Path | None:
    """The repository's dagster.yaml beside the installed package (a checkout or an editable
    install), else the one in the working folder; None when neither exists."""
    for candidate in (Path(__file__).resolve().parents[1] / "dagster.yaml", Path("dagster.yaml")):
        if candidate.is_file():
            return candidate
    return None


def _section(config: Mapping[str, Any], *keys: str) -> Mapping[str, Any]:
    node: Any = config
    for key in keys:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def missing_settings(config: Mapping[str, Any]) -> list[str]:
    """What ``config`` (a parsed dagster.yaml) lacks of the settings the product relies on,
    one line each saying why it matters; [] when nothing is missing. Values a deployment
    tunes (how many runs at once, retries, intervals) are the owner's: only their presence
    is required. Both places Dagster reads the run queue's limits from are accepted."""
    missing = []
    coordinator = _section(config, "run_coordinator")
    if (coordinator.get("module"), coordinator.get("class")) != COORDINATOR:
        missing.append(
            f"run_coordinator: {'.'.join(COORDINATOR)} (Dagster's run queue, which also keeps "
            "the parse_errors badge of a UI-launched run on what is known)"
        )
    queue = {**_section(coordinator, "config"), **_section(config, "concurrency", "runs")}
    if "max_concurrent_runs" not in queue:
        missing.append(
            "concurrency.runs.max_concurrent_runs (without it the queue starts every run at "
            "once, each run worker with its own model)"
        )
    limits = queue.get("tag_concurrency_limits") or []
    for required in REQUIRED_TAG_LIMITS:
        if not any(
            isinstance(limit, Mapping)
            and limit.get("key") == required["key"]
            and limit.get("limit") == required["limit"]
            and _section(limit, "value") == required["value"]
            for limit in limits
        ):
            missing.append(
                f"concurrency.runs.tag_concurrency_limits: {required['key']}, limit "
                f"{required['limit']} per unique value (two runs of one book never execute "
                "at once)"
            )
    if _section(config, "run_monitoring").get("enabled") is not True:
        missing.append(
            "run_monitoring.enabled: true (a run whose worker died is failed and its pool "
            "slots freed, not left STARTED)"
        )
    if _section(config, "run_retries").get("enabled") is not True:
        missing.append(
            "run_retries.enabled: true (a sensor's failed run is launched again, not left "
            "until the next edit)"
        )
    return missing


@dataclass(frozen=True)
class HomeConfigReview:
    """What :func:`review_home_config` found: ``replaced`` names the copy of the earlier
    file kept aside; ``missing`` what the file still lacks; ``notice`` the lines to show."""

    path: Path
    replaced: Path | None = None
    missing: tuple[str, ...] = ()

    @property
    def notice(self) -> str:
        if self.replaced is not None:
            return (
                f"note: {self.path} was this project's dagster.yaml of an earlier version, "
                f"unmodified: replaced by the current one (the earlier one is {self.replaced})"
            )
        if not self.missing:
            return ""
        source = project_dagster_yaml()
        fix = (
            f"copy {source} over it if you never changed it, else add"
            if source is not None
            else "add"
        )
        lines = "\n".join(f"  - {line}" for line in self.missing)
        snippet = "\n".join(f"    {line}" for line in REQUIRED_SNIPPET.splitlines())
        return (
            f"warning: {self.path} lacks settings this version of rag_pipeline relies on:\n"
            f"{lines}\n"
            f"  To fix it, {fix} the missing entries (restart `make ui` afterwards):\n"
            f"{snippet}"
        )


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _refuse_unless_a_file(path: Path) -> None:
    """Raise an OSError naming ``path`` when it is there but is not a regular file (behind
    its links): reading a FIFO waits for a writer forever, a device such as /dev/zero never
    ends, and Dagster reads it the same way."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # not there (a dangling link included), or unreadable: as a file's read says
    if stat.S_ISREG(mode):
        return
    kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device"
    if stat.S_ISSOCK(mode):
        kind = "a socket"
    raise OSError(
        errno.EINVAL,
        f"{path} is {kind}, not a file: move it aside (the next command writes the default one)",
    )


def review_home_config(home: Path) -> HomeConfigReview:
    """Check ``home/dagster.yaml``; replace an unmodified earlier version of the project's
    file with the current one (the earlier kept as ``dagster.yaml.<digest>.old``, the new
    one renamed into place: a process starting alongside never reads half a file; a link is
    never replaced). An empty file lacks every setting; anything there but a regular file
    (a folder, a FIFO, a device) raises OSError naming it. A file that cannot be read, is not
    YAML or not a mapping is left to Dagster, whose error names it."""
    path = home / "dagster.yaml"
    _refuse_unless_a_file(path)
    try:
        data = path.read_bytes()
    except OSError:  # unreadable: Dagster's own error names the file and the way out
        return HomeConfigReview(path)
    source = project_dagster_yaml()
    # a link is its owner's arrangement (a file shared by homes, managed elsewhere): never
    # turned into a file of ours, whatever it points at
    if source is not None and _digest(data) in EARLIER_VERSIONS and not path.is_symlink():
        current = source.read_bytes()
        if _digest(current) != _digest(data):
            kept = path.with_name(f"dagster.yaml.{_digest(data)[:8]}.old")
            kept.write_bytes(data)
            part = path.with_name(f".dagster.yaml.{os.getpid()}")
            part.write_bytes(current)
            os.replace(part, path)
            return HomeConfigReview(path, replaced=kept)
    try:
        config = yaml.safe_load(data)
    except yaml.YAMLError:
        return HomeConfigReview(path)
    if config is None:  # empty, or comments only: Dagster's defaults, which lack them all
        config = {}
    if not isinstance(config, Mapping):
        return HomeConfigReview(path)
    return HomeConfigReview(path, missing=tuple(missing_settings(config)))
