"""What every response of the app's own routes (tiles, descriptors, overlays, OpenSeadragon's files) shares: the
header that stops a browser guessing a type other than the one sent, error bodies that are plain sentences, and
numbers in paths bounded before they are used.

- :func:`nosniff` adds ``X-Content-Type-Options: nosniff`` to a response (a 404's ``text/plain`` sentence is then
  never run as a script or drawn as HTML, whatever it holds);
- :func:`sentence` is an error response: a plain sentence, that header, never the requested path echoed (the
  sentence names what is missing in words of the server, not the id the browser sent);
- :func:`path_number` reads a number of a path (a level, a column) as an int at most :data:`MOST_DIGITS` digits
  long, None otherwise: a 5,000-digit level is a 404, never Python's own limit on int's digits (a 500).
"""

from __future__ import annotations

from starlette.responses import PlainTextResponse, Response

__all__ = ["nosniff", "sentence", "path_number", "MOST_DIGITS"]

MOST_DIGITS = 9  # far more than any level, column or row of a slide of 10^9 pixels a side needs
NOSNIFF = ("X-Content-Type-Options", "nosniff")


def nosniff(response: Response) -> Response:
    """``response`` with ``X-Content-Type-Options: nosniff`` (returned, for ``return nosniff(Response(...))``)."""
    response.headers[NOSNIFF[0]] = NOSNIFF[1]
    return response


def sentence(text: str, status_code: int = 404) -> Response:
    """A plain-text error response of the sentence ``text`` (which must not quote the request) and the header."""
    return nosniff(PlainTextResponse(f"{text}\n", status_code=status_code))


def path_number(text: str) -> int | None:
    """The non-negative int that ``text`` spells in at most :data:`MOST_DIGITS` ASCII digits, else None."""
    if not (0 < len(text) <= MOST_DIGITS and text.isascii() and text.isdigit()):
        return None
    return int(text)
