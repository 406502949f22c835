"""Embedding providers behind one interface (:class:`~.base.Embedder`), chosen through one
table (:mod:`.registry`): ``local`` (default), ``openai`` and ``hash``."""

from __future__ import annotations

from rag_pipeline.embed import base as _base
from rag_pipeline.embed import registry as _registry
from rag_pipeline.embed.base import *  # noqa: F403 - re-exported: its __all__ is the API
from rag_pipeline.embed.registry import *  # noqa: F403 - re-exported: its __all__ is the API

__all__ = [*_base.__all__, *_registry.__all__]
