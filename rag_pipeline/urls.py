"""What is shown of a URL: never the credentials it may carry.

A setting's URL may hold a user and password (``https://user:key@qdrant.example``: basic
authentication in front of a server; a git remote's token): the URL itself is used to
connect, and only what :func:`without_credentials` leaves of it is ever printed, logged,
recorded or answered (the query service has no authentication: its ``/health``, its errors
and lineage's links are read by any client). One rule for every URL the product is given:
settings, git remotes, object-store endpoints, and the messages that quote them.
"""

from __future__ import annotations

import re

__all__ = ["link_url", "shown_url", "without_credentials"]

#: the user-information part of a URL (``https://user:token@host``)
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s'\"@]+(?:@[^/\s'\"@]+)*@")


def without_credentials(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***``
    (``https://***@host/repo.git``)."""
    return _URL_CREDENTIALS.sub(r"\1***@", text)


def shown_url(url: object) -> str:
    """``url`` as text, without its credentials."""
    return without_credentials(str(url))


def link_url(url: object) -> str:
    """``url`` as a link to follow: its credentials left out altogether (a browser would
    take ``***`` for a user)."""
    return _URL_CREDENTIALS.sub(r"\1", str(url))
