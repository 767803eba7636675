"""A tiny agent loop with cellhost's execute_code tool, in the Anthropic
Messages shape and in the OpenAI Chat Completions shape, against scripted
model replies (no network, no API key): the "model" asks for three cells,
and what the first defines the later ones use, because the session's
kernel keeps its state from call to call.

    cellhost serve &              # a daemon on http://127.0.0.1:8787
    python examples/agent_loop.py [URL]

Swap `scripted_*` for a real client call (`anthropic.Anthropic().messages
.create(..., tools=[tool.anthropic()])`, `openai.OpenAI().chat.completions
.create(..., tools=[tool.openai_chat()])`) and the loop stays the same.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from cellhost import Client
from cellhost.tools import ExecuteCode

CELLS = [
    "import math\nr = 2",
    "area = math.pi * r ** 2\nround(area, 3)",
    "print(f'the area is {area:.2f}')",
]


def scripted_anthropic(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Replies as `messages.create` would: one tool_use per turn, then text."""
    turn = sum(1 for m in messages if m["role"] == "assistant")
    if turn < len(CELLS):
        block = {
            "type": "tool_use",
            "id": f"toolu_{turn}",
            "name": "execute_code",
            "input": {"code": CELLS[turn]},
        }
        return {"role": "assistant", "content": [block], "stop_reason": "tool_use"}
    last = messages[-1]["content"][0]["content"][0]["text"]
    return {
        "role": "assistant",
        "content": [{"type": "text", "text": f"Done: {last}"}],
        "stop_reason": "end_turn",
    }


def scripted_openai(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Replies as `chat.completions.create` would (its message)."""
    turn = sum(1 for m in messages if m["role"] == "assistant")
    if turn < len(CELLS):
        call = {
            "id": f"call_{turn}",
            "type": "function",
            "function": {"name": "execute_code", "arguments": json.dumps({"code": CELLS[turn]})},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"role": "assistant", "content": f"Done: {messages[-1]['content']}"}


def anthropic_loop(tool: ExecuteCode) -> str:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the area of r=2?"}]
    while True:
        reply = scripted_anthropic(messages)
        messages.append({"role": reply["role"], "content": reply["content"]})
        uses = [b for b in reply["content"] if b["type"] == "tool_use"]
        if not uses:
            return str(reply["content"][0]["text"])
        results = [tool.anthropic_result(b["id"], b["input"]) for b in uses]
        messages.append({"role": "user", "content": results})


def openai_loop(tool: ExecuteCode) -> str:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the area of r=2?"}]
    while True:
        reply = scripted_openai(messages)
        messages.append(reply)
        calls = reply.get("tool_calls") or []
        if not calls:
            return str(reply["content"])
        for c in calls:
            messages += tool.openai_chat_result(c["id"], c["function"]["arguments"])


def main() -> None:
    url = sys.argv[1] if len(sys.argv) > 1 else None
    with Client(url) as client:
        for name, loop in (("anthropic", anthropic_loop), ("openai", openai_loop)):
            # One session per conversation: its id would be the chat's id.
            tool = ExecuteCode(client, f"example-{name}-{os.getpid()}")
            print(f"{name}: {loop(tool)}")
            tool.session.dispose()


if __name__ == "__main__":
    main()
