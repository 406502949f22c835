"""What is shown of a URL: never the credentials it may carry.

A setting's URL may hold a user and password (``https://user:key@qdrant.example``: basic
authentication in front of a server); the URL itself is used to connect, and only
:func:`shown_url` of it is ever printed, logged or answered (the query service has no
authentication: its ``/health``, its errors and lineage's links are read by any client).
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["shown_url"]


def shown_url(url: object) -> str:
    """``url`` without its user and password (``https://host/...``), as text."""
    text = str(url)
    try:
        parts = urlsplit(text)
    except ValueError:
        return text.rpartition("@")[2] if "://" in text else text
    if "@" not in parts.netloc:
        return text
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
