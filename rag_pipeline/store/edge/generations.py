"""A book's generations on Qdrant Edge: the searched one (``current.json``) and one being built
beside it for a new recipe (``pending.json``), switched in by one atomic replace of the
pointer (:class:`~rag_pipeline.store.capabilities.Generations`)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rag_pipeline.store.capabilities import Generations
from rag_pipeline.store.edge.catalog import checked_pointer
from rag_pipeline.store.edge.common import log
from rag_pipeline.store.edge.files import (
    _CURRENT,
    _GENERATION,
    _PENDING,
    _SUMMARY,
    _check_book_name,
    _Layout,
    _Pointer,
    _read_layout,
    _read_pointer,
    _readable,
    _remove_folder,
    _signature,
    _sweep_unnamed_generations,
    _unlink,
    _write_json,
    _write_layout,
)
from rag_pipeline.store.edge.handle import Handle

__all__ = ["EdgeGenerations"]


def _recipe_of(pointer: _Pointer | None) -> dict[str, str] | None:
    """The recipe tag a book's pointer records (None: no pointer, or none recorded)."""
    recipe = None if pointer is None else pointer[1].get("recipe")
    return dict(recipe) if isinstance(recipe, dict) else None


class EdgeGenerations(Generations):
    """The generations of :class:`~rag_pipeline.store.edge.store.EdgeStore` (a mixin)."""

    _layout: _Layout | None  # the handle's (see Handle)

    def current_recipe(self: Handle, tenant: str) -> dict[str, str] | None:
        if not _readable(tenant):
            return None
        return _recipe_of(_read_pointer(self.books_folder / tenant / _CURRENT))

    def searched_recipe(self: Handle, tenant: str) -> dict[str, str] | None:
        """The tag of the generation this handle routed ``tenant`` to (routing takes the
        book's lock, so no switch can come between this answer and the handle's reads)."""
        with self._lock:
            if not _readable(tenant) or self._absent(tenant):
                return None
            state = self._route(tenant)
            if state.generation is None:
                return None
            pointer = _read_pointer(state.folder / (_PENDING if state.pending else _CURRENT))
            recipe = None if pointer is None else pointer[1].get("recipe")
            return dict(recipe) if isinstance(recipe, dict) else None

    def adopt_recipe(self: Handle, tenant: str, recipe: Mapping[str, str]) -> bool:
        with self._lock:
            _check_book_name(tenant)
            state = self._route(tenant)
            current = _read_pointer(state.folder / _CURRENT)
            if current is None or _signature(current[1]) is not None:
                return False
            _write_json(state.folder / _CURRENT, {**current[1], "recipe": dict(recipe)})
            self._forget(tenant)  # a builder routes it again, now against the tag
            return True

    def pending_recipe(self: Handle, tenant: str) -> dict[str, str] | None:
        return EdgeGenerations.recipes(self, tenant)[1]

    def recipes(self: Handle, tenant: str) -> tuple[dict[str, str] | None, dict[str, str] | None]:
        """Each pointer read once (a pending pointer naming the current generation, a switch
        killed after its replace, is no pending build)."""
        if not _readable(tenant):
            return None, None
        folder = self.books_folder / tenant
        pending = _read_pointer(folder / _PENDING)
        current = checked_pointer(str(folder)) or _read_pointer(folder / _CURRENT)
        if pending is not None and current is not None and current[0] == pending[0]:
            pending = None
        return _recipe_of(current), _recipe_of(pending)

    def _pointers(self: Handle, tenant: str) -> tuple[Path, _Pointer | None, _Pointer | None]:
        """The book's folder and its pending and current pointers, read under the book's
        lock with the handle's routing of it dropped; a pending pointer naming the current
        generation (a switch killed after its replace) is no pending build: None."""
        _check_book_name(tenant)
        self._hold(tenant)
        self._forget(tenant)
        folder = self.books_folder / tenant
        pending, current = _read_pointer(folder / _PENDING), _read_pointer(folder / _CURRENT)
        if pending is not None and current is not None and current[0] == pending[0]:
            pending = None
        return folder, pending, current

    def leftovers(self: Handle, tenant: str) -> list[str]:
        """A pending pointer naming the current generation and generation folders neither
        pointer names: a switch (or drop) killed after its replace (read without the lock:
        only a hint that the book's run should tidy it, under the lock)."""
        if not _readable(tenant):
            return []
        folder = self.books_folder / tenant
        if not (folder / _PENDING).exists():
            # one stat a book a plan: a switch removes its pending pointer last, so a switch
            # killed part way always leaves it (a drop killed part way leaves an unnamed
            # folder the book's next write sweeps)
            return []
        pending, current = _read_pointer(folder / _PENDING), _read_pointer(folder / _CURRENT)
        named = {p[0] for p in (pending, current) if p is not None}
        out = [_PENDING] if pending and current and pending[0] == current[0] else []
        with contextlib.suppress(OSError):
            out += sorted(
                child.name
                for child in folder.iterdir()
                if _GENERATION.fullmatch(child.name) and child.name not in named
            )
        return out

    def drop_pending(self: Handle, tenant: str) -> bool:
        with self._lock:
            folder, pending, _ = self._pointers(tenant)
            _unlink(folder / _PENDING)  # first: a kill from here on leaves no pending named
            _sweep_unnamed_generations(folder)  # what a killed switch or drop left
            if pending is None:
                return False
            _remove_folder(folder / pending[0])
            log.info("book %s: the pending generation %s was dropped", tenant, pending[0])
            return True

    def switch(self: Handle, tenant: str, *, keep_old: bool = False) -> bool:
        with self._lock:
            folder, pending, current = self._pointers(tenant)
            if pending is None:
                _unlink(folder / _PENDING)
                return False
            _unlink(folder / _SUMMARY)  # it described the old generation
            _write_json(folder / _CURRENT, pending[1])  # the switch: one atomic replace
            self._follow_dimension(pending[1].get("dense_dim"))
            if current is not None:
                old = folder / current[0]
                if keep_old:
                    old.rename(folder / f"old-{current[0]}")
                else:
                    _remove_folder(old)
            # last: until the old generation is gone, the pending pointer (naming the current
            # generation now) is what tells a plan that a kill left something (leftovers)
            _unlink(folder / _PENDING)
            log.info("book %s now searches generation %s", tenant, pending[0])
            return True

    def _follow_dimension(self: Handle, dim: Any) -> None:
        """layout.json's dimension follows the generations switched in (a new model's)."""
        if not isinstance(dim, int) or self._layout is None or dim == self._layout.dense_dim:
            return
        self._layout_lock.acquire(self._busy_wait_s)
        try:
            layout = _read_layout(self.folder) or self._layout
            self._layout = _Layout(dim, layout.payload_indexes)
            _write_layout(self.folder, self._layout)
        finally:
            self._layout_lock.release()
