"""Python client of a cellhost daemon (`cellhost serve`): session-persistent
Python kernels for AI agents.

    from cellhost import Client
    s = Client().session("conversation-1")
    s.run("x = 41")
    s.run("x + 1").value          # '42'

`cellhost.aio.AsyncClient` is the same API for asyncio; `cellhost.tools`
has a ready-made `execute_code` tool for the OpenAI and Anthropic SDKs.
"""

from .client import Client, Event, Files, Session
from .errors import (
    APIError,
    BadRequest,
    CellhostError,
    Conflict,
    DaemonUnreachable,
    NotFound,
    Unauthorized,
)
from .results import (
    CellResult,
    Display,
    Forked,
    ForkReport,
    KernelInfo,
    Restored,
    Skipped,
    SnapshotReport,
    Status,
    Truncated,
)

__version__ = "0.1.0"

__all__ = [
    "APIError",
    "BadRequest",
    "CellResult",
    "CellhostError",
    "Client",
    "Conflict",
    "DaemonUnreachable",
    "Display",
    "Event",
    "Files",
    "ForkReport",
    "Forked",
    "KernelInfo",
    "NotFound",
    "Restored",
    "Session",
    "Skipped",
    "SnapshotReport",
    "Status",
    "Truncated",
    "Unauthorized",
]
