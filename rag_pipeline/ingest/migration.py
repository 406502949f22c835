"""A recipe change of one book: built beside the searched index, switched once complete.

A run's store handles are *builders* of the book's recipe (see
:meth:`rag_pipeline.resources.StoreOpener.open`): on a store with generations (Qdrant Edge) a
book searched with another recipe is read and written in a pending generation beside it, so
searches, the service and lineage keep answering from the old one. Once the run's writes and
checks have passed, :func:`finish_build` switches the book atomically, unless the switch would
lose what the old index serves (a file that could not be read or parsed keeps its last good
chunks in place; a new build has none of them): then the build stays pending and says why.

Stores without generations (a Qdrant server, ``:memory:``) write in place, as before.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from rag_pipeline.ingest.index import read_index_state
from rag_pipeline.recipes.choice import most_common
from rag_pipeline.recipes.recipe import IndexRecipe
from rag_pipeline.schema import EMBEDDING_MODEL, SIGNATURE, SOURCE_FILE, chunks_of
from rag_pipeline.store import VectorStore
from rag_pipeline.store.capabilities import generations_of

__all__ = [
    "BuildStart",
    "SwitchOutcome",
    "describe_recipes",
    "finish_build",
    "migration_label",
    "resumed_build",
    "start_build",
]

RecipeTag = Mapping[str, str]


def migration_label(old: RecipeTag, new: RecipeTag) -> str:
    """What a recipe change is, as the ``rag/migration`` run tag says it: the models when
    they differ (``fp32-model -> int8-model``), else the signatures (a chunker or budget
    change)."""
    old_model, new_model = old.get(EMBEDDING_MODEL, ""), new.get(EMBEDDING_MODEL, "")
    if old_model and new_model and old_model != new_model:
        return f"{old_model} -> {new_model}"
    return f"recipe {old.get(SIGNATURE, '?')} -> {new.get(SIGNATURE, '?')}"


def describe_recipes(
    current: RecipeTag | None, pending: RecipeTag | None, fallback: str = ""
) -> str:
    """A book's recipe as the collection look shows it: the searched model (``fallback``,
    e.g. its chunks' models, for an index without a tag), and the one being built beside
    while a build is pending (``model → other pending``)."""
    label = (current or {}).get(EMBEDDING_MODEL) or fallback
    if pending is None:
        return label
    model = pending.get(EMBEDDING_MODEL, "")
    if model == label or not model:
        model = f"recipe {pending.get(SIGNATURE, '?')}"
    return f"{label} → {model} pending"


@dataclass(frozen=True)
class BuildStart:
    """The book's searched recipe before the run, and the run's."""

    old: dict[str, str] | None
    new: dict[str, str]
    #: a build beside was already pending for the run's recipe (a killed run resumes it)
    resumed: bool = False

    @property
    def migration(self) -> bool:
        return self.old is not None and self.old.get(SIGNATURE) != self.new[SIGNATURE]

    @property
    def label(self) -> str | None:
        return migration_label(self.old, self.new) if self.old and self.migration else None


def start_build(store: VectorStore, book_id: str, recipe: IndexRecipe) -> BuildStart:
    """Read (with a reader handle, before the run's builders open) which recipe the book is
    searched with. A book indexed before indexes were tagged is tagged here from what its
    document records say, so that a change is built beside it, not over it."""
    new = recipe.tag()
    generations = generations_of(store)
    if generations is None:  # the store writes every recipe in place
        return BuildStart(None, new)
    old = generations.current_recipe(book_id)
    if old is None:
        old = _recorded_tag(store, book_id)
        if old is not None:
            generations.adopt_recipe(book_id, old)
    return BuildStart(old, new, resumed_build(store, book_id, recipe) is not None)


def resumed_build(store: VectorStore, book_id: str, recipe: IndexRecipe) -> dict[str, str] | None:
    """The tag of the build of ``recipe`` pending beside the book's searched index, which a
    run of the recipe resumes (its builder handles read and write it, reusing the vectors
    already there); None when there is none. The one rule the run (:func:`start_build`) and
    its plan follow."""
    generations = generations_of(store)
    if generations is None:
        return None
    pending = generations.pending_recipe(book_id)
    return pending if pending is not None and pending.get(SIGNATURE) == recipe.signature else None


def _recorded_tag(store: VectorStore, book_id: str) -> dict[str, str] | None:
    """The tag of an untagged book, from its document records (their most common signature)
    and its chunks' model; None when the book holds nothing."""
    signature = read_index_state(store, book_id, documents_only=True).recorded_signature
    if signature is None:
        return None
    tag = {SIGNATURE: signature}
    model = most_common(store.counts_by(chunks_of(book_id), EMBEDDING_MODEL))
    if model:
        tag[EMBEDDING_MODEL] = model
    return tag


@dataclass(frozen=True)
class SwitchOutcome:
    """What the end of a run did with the book's pending build."""

    pending: bool  # a build beside was pending when the run ended
    switched: bool = False
    kept_old: bool = False
    #: why the build stays pending (empty when switched or nothing was pending)
    held_back: list[str] = field(default_factory=list)

    @property
    def state(self) -> str:
        if self.switched:
            return "switched (old index kept)" if self.kept_old else "switched"
        return "pending" if self.pending else "in place"


def finish_build(
    store: VectorStore,
    book_id: str,
    *,
    failed_files: Collection[str],
    checks_passed: bool,
    recipe: RecipeTag,
    keep_old: bool = False,
) -> SwitchOutcome:
    """Switch the book to its pending build of ``recipe`` (the run's; ``store``: a reader
    handle, opened after the run's builders closed), if the run's checks passed and no file
    whose chunks the old index serves failed in the build (``failed_files``: read, parse,
    chunk and crawl errors). A pending build of *another* recipe (one given up, e.g. a
    setting changed back while it was unfinished) is never switched to: it is dropped, since
    this run wrote the book's searched index in place."""
    generations = generations_of(store)
    pending = None if generations is None else generations.pending_recipe(book_id)
    if generations is None:
        return SwitchOutcome(pending=False)
    if pending is None:
        if generations.leftovers(book_id):  # a switch killed after its replace: tidied
            generations.drop_pending(book_id)
        return SwitchOutcome(pending=False)
    if pending.get(SIGNATURE) != recipe[SIGNATURE]:
        generations.drop_pending(book_id)
        return SwitchOutcome(pending=False)
    held_back = []
    if not checks_passed:
        held_back.append("the index consistency check of the new build failed")
    if failed_files:
        served = store.counts_by(chunks_of(book_id), SOURCE_FILE)
        lost = sorted(name for name in failed_files if served.get(name, 0) > 0)
        if lost:
            held_back.append(
                f"{len(lost)} file(s) the old index serves failed in the new build and would "
                f"lose their chunks: {', '.join(lost[:5])}{' ...' if len(lost) > 5 else ''}; "
                "fix them and run the book again"
            )
    if held_back:
        return SwitchOutcome(pending=True, held_back=held_back)
    switched = generations.switch(book_id, keep_old=keep_old)
    return SwitchOutcome(pending=True, switched=switched, kept_old=switched and keep_old)
