"""The exceptions of the cellhost client."""

from __future__ import annotations


class CellhostError(Exception):
    """Anything this client raises."""


class DaemonUnreachable(CellhostError):
    """No cellhost daemon answered at the client's URL."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(
            f"no cellhost server at {url} ({reason}); start one with `cellhost serve`, "
            "or point CELLHOST_URL at the one you run"
        )


class APIError(CellhostError):
    """The daemon refused or failed a request: its `{"error": {"code", "message"}}`."""

    def __init__(self, status: int, code: str, message: str) -> None:
        self.status = status
        self.code = code
        self.message = message
        super().__init__(f"{message} (HTTP {status}, {code})")


class Unauthorized(APIError):
    """401: the bearer token is missing or wrong (CELLHOST_TOKEN)."""


class NotFound(APIError):
    """404: no such session, child or file."""


class BadRequest(APIError):
    """400: what was sent is not valid; the message says what to send."""


class Conflict(APIError):
    """409: the session is not in a state that allows it (no live kernel, a fork target in use)."""


def for_status(status: int, code: str, message: str) -> APIError:
    """The exception class that matches an HTTP status."""
    cls: type[APIError] = {
        400: BadRequest,
        401: Unauthorized,
        404: NotFound,
        409: Conflict,
    }.get(status, APIError)
    return cls(status, code, message)
