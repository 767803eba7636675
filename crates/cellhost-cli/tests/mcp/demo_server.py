"""A downstream MCP server for code mode tests, built with the official
Python SDK's MCPServer (formerly FastMCP). Runs on stdio."""

import os
import subprocess

from mcp.server.mcpserver import MCPServer

app = MCPServer("demo")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool()
def shout(text: str) -> str:
    """Upper-case a text."""
    return text.upper()


@app.tool()
def fail(why: str) -> str:
    """Always fails with `why`."""
    raise ValueError(why)


@app.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@app.tool()
def spawn_child() -> int:
    """Start a long `sleep` in this server's process group; its pid."""
    return subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL).pid


@app.tool()
def crash() -> str:
    """Exit the server at once (tests the restart)."""
    os._exit(3)


if __name__ == "__main__":
    app.run()
