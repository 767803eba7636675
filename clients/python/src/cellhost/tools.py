"""A ready-made `execute_code` tool for the agent SDKs: its definition in
the shapes the OpenAI (Chat Completions and Responses) and Anthropic
(Messages) APIs take, and a handler that runs the model's code in the
conversation's session and answers in the shape each API wants back:
the same text the MCP server gives a model, and the images.

    tool = ExecuteCode(Client(), session="conversation-42")
    # Anthropic:  tools=[tool.anthropic()]; for a tool_use block b:
    #             content.append(tool.anthropic_result(b.id, b.input))
    # OpenAI chat: tools=[tool.openai_chat()]; for a tool call c:
    #             messages += tool.openai_chat_result(c.id, c.function.arguments)
    # OpenAI Responses: tools=[tool.openai_responses()]; for an item i:
    #             input += tool.openai_responses_result(i.call_id, i.arguments)

No SDK is imported here: the shapes are plain dicts (the client's tests
check them against the official SDKs' types)."""

from __future__ import annotations

import json
from typing import Any

from .client import Client, Session
from .errors import APIError, CellhostError
from .render import IMAGE_MIMES
from .results import CellResult, Json

NAME = "execute_code"

DESCRIPTION = (
    "Run Python code in a persistent kernel that belongs to this conversation: variables, "
    "imports, functions and files persist from call to call (like a Jupyter notebook). "
    "Returns what was printed (also by C code and subprocesses), the value of the last "
    "expression, the error with a short traceback, images, and a plain sentence whenever "
    "the kernel's state was reset or lost. A cell that runs past `timeout` is interrupted "
    "(state kept). Use `reset: true` to start from a fresh kernel. Files live in the "
    "session's workspace, the kernel's working directory."
)

PARAMETERS: Json = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "description": "Python source to run."},
        "reset": {
            "type": "boolean",
            "description": "Restart the kernel (discarding all state) before running.",
        },
        "timeout": {
            "type": "number",
            "description": "Seconds before the cell is interrupted (default 60).",
        },
    },
    "required": ["code"],
    "additionalProperties": False,
}


class ExecuteCode:
    """The `execute_code` tool of one conversation (`session`: its id or a
    `Session`), for any agent SDK."""

    def __init__(
        self, client: Client, session: str | Session, *, default_timeout: float | None = 60.0
    ) -> None:
        self.session = client.session(session) if isinstance(session, str) else session
        self.default_timeout = default_timeout

    # --- definitions ---------------------------------------------------

    def anthropic(self) -> Json:
        """The tool for Anthropic Messages' `tools`."""
        return {"name": NAME, "description": DESCRIPTION, "input_schema": PARAMETERS}

    def openai_chat(self) -> Json:
        """The tool for OpenAI Chat Completions' `tools`."""
        return {
            "type": "function",
            "function": {"name": NAME, "description": DESCRIPTION, "parameters": PARAMETERS},
        }

    def openai_responses(self) -> Json:
        """The tool for the OpenAI Responses API's `tools`."""
        return {
            "type": "function",
            "name": NAME,
            "description": DESCRIPTION,
            "parameters": PARAMETERS,
            "strict": False,
        }

    # --- running ---------------------------------------------------------

    def run(self, arguments: str | Json | None) -> CellResult | str:
        """Run the model's arguments (a JSON string or a dict): the result,
        or a sentence saying what was wrong with the call."""
        try:
            args: Any = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError as e:
            return f'The arguments were not JSON ({e}); send {{"code": "..."}}.'
        if not isinstance(args, dict) or not isinstance(args.get("code"), str):
            return 'execute_code takes {"code": "<python source>"} (and reset, timeout).'
        unknown = sorted(set(args) - {"code", "reset", "timeout"})
        if unknown:
            names = ", ".join(unknown)
            return f"execute_code has no argument {names}; it takes code, reset, timeout."
        timeout = args.get("timeout", self.default_timeout)
        try:
            return self.session.run(
                args["code"],
                reset=bool(args.get("reset", False)),
                timeout=float(timeout) if timeout is not None else None,
            )
        except APIError as e:
            return f"The call was refused: {e.message}"
        except CellhostError as e:
            return f"The code could not be run: {e}"

    @staticmethod
    def _parts(outcome: CellResult | str) -> tuple[str, list[tuple[str, str]], bool]:
        """The text, the images (mime, base64) and whether it is an error."""
        if isinstance(outcome, str):
            return outcome, [], True
        images = [(d.mime, d.data) for d in outcome.displays if d.mime in IMAGE_MIMES]
        return outcome.text(), images, not outcome.ok

    def anthropic_result(self, tool_use_id: str, arguments: str | Json | None) -> Json:
        """Run the call; its `tool_result` block (text, then the images)."""
        text, images, error = self._parts(self.run(arguments))
        content: list[Json] = [{"type": "text", "text": text}]
        for mime, data in images:
            content.append(
                {"type": "image", "source": {"type": "base64", "media_type": mime, "data": data}}
            )
        return {
            "type": "tool_result",
            "tool_use_id": tool_use_id,
            "content": content,
            "is_error": error,
        }

    def openai_chat_result(self, tool_call_id: str, arguments: str | Json | None) -> list[Json]:
        """Run the call; the messages to append: the `tool` message, then
        (when the cell made images, which a tool message cannot carry) a
        `user` message with them."""
        text, images, _ = self._parts(self.run(arguments))
        messages: list[Json] = [{"role": "tool", "tool_call_id": tool_call_id, "content": text}]
        if images:
            parts: list[Json] = [{"type": "text", "text": f"Images from {NAME}:"}]
            parts += [
                {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}}
                for mime, data in images
            ]
            messages.append({"role": "user", "content": parts})
        return messages

    def openai_responses_result(self, call_id: str, arguments: str | Json | None) -> list[Json]:
        """Run the call; the input items to append: its `function_call_output`
        (text, then the images)."""
        text, images, _ = self._parts(self.run(arguments))
        if not images:
            return [{"type": "function_call_output", "call_id": call_id, "output": text}]
        output: list[Json] = [{"type": "input_text", "text": text}]
        output += [
            {"type": "input_image", "image_url": f"data:{mime};base64,{data}"}
            for mime, data in images
        ]
        return [{"type": "function_call_output", "call_id": call_id, "output": output}]
