"""A request's tools and ``tool_choice``, typed (pure): the :data:`Tool` union (function,
MCP server, hosted) and the :data:`ToolChoice` forms, frozen.

:mod:`lmsp.app.tooldefs` reads what a client sends, in either API's spelling, into the
Responses form (each refusal naming its place); :func:`typed_tools` and
:func:`typed_choice` make these objects of it, once. A namespace's tools are kept
flattened, each function or hosted tool naming its ``namespace`` (as they are stored).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Union

import msgspec
from msgspec import Struct, field

from lmsp.protocol.itemtypes import Typed

#: hosted tools of the OpenAI APIs that lmsp cannot run: never offered to the model
HOSTED = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "web_search_2025_08_26",
        "file_search",
        "code_interpreter",
        "image_generation",
        "computer_use",
        "computer_use_preview",
        "local_shell",
        "shell",
        "apply_patch",
        "tool_search",
    }
)
#: the tool types lmsp cannot offer a model (kept as ``offered: false``): the hosted
#: ones, and ``custom`` tools (free-form input, not JSON arguments)
UNOFFERED = HOSTED | {"custom"}


class FunctionTool(Typed, frozen=True, tag="function"):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    #: one of a namespace's tools, flattened (a call names the namespace again)
    namespace: str | None = None
    #: the part of ``parameters`` the grammar enforces, when keywords it cannot were
    #: left out of it (:mod:`lmsp.runner.relax`), and their paths
    enforced: dict[str, Any] | None = field(default=None, name="enforced_parameters")
    relaxed: tuple[str, ...] | None = None

    @property
    def is_strict(self) -> bool:
        """A tool is strict unless it says otherwise (the Responses API's default)."""
        return self.strict is not False

    def grammar_schema(self) -> dict[str, Any]:
        """The schema its calls are held to while they are generated."""
        schema = self.enforced if self.enforced is not None else self.parameters
        return schema or {"type": "object", "properties": {}}


class ToolFilter(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``{"tool_names"?, "read_only"?}`` (OpenAI's ``McpToolFilter``)."""

    tool_names: tuple[str, ...] | None = None
    read_only: bool | None = None


class ApprovalFilters(Struct, frozen=True, kw_only=True, omit_defaults=True):
    always: ToolFilter | None = None
    never: ToolFilter | None = None


class McpTool(Typed, frozen=True, tag="mcp"):
    """An MCP server (:mod:`lmsp.protocol.mcp`); its header values are kept apart and
    shown as ``[redacted]`` here."""

    server_label: str
    server_url: str
    server_description: str | None = None
    allowed_tools: tuple[str, ...] | ToolFilter | None = None
    require_approval: Literal["always", "never"] | ApprovalFilters | None = None
    headers: dict[str, str] | None = None


class HostedTool(Typed, frozen=True, tag="hosted"):
    """A tool lmsp cannot run (:data:`UNOFFERED`): never offered to the model."""

    offered: bool
    namespace: str | None = None


#: one class per hosted type, so that a stored ``{"type": "web_search", …}`` reads back
HOSTED_TYPES: dict[str, type[HostedTool]] = {
    kind: msgspec.defstruct(  # type: ignore[misc]
        f"Hosted_{kind}",
        [],
        bases=(HostedTool,),
        tag=kind,
        frozen=True,
        kw_only=True,
        omit_defaults=True,
    )
    for kind in sorted(UNOFFERED)
}

if TYPE_CHECKING:
    Tool = FunctionTool | McpTool | HostedTool
else:
    Tool = Union[(FunctionTool, McpTool, *HOSTED_TYPES.values())]


# -- tool_choice -------------------------------------------------------------------------------
class FunctionChoice(Typed, frozen=True, tag="function"):
    name: str


class McpChoice(Typed, frozen=True, tag="mcp"):
    server_label: str
    name: str | None = None


class AllowedTools(Typed, frozen=True, tag="allowed_tools"):
    tools: tuple[FunctionChoice, ...]
    mode: Literal["none", "auto", "required"] | None = None


Mode = Literal["none", "auto", "required"]
ToolChoice = Mode | FunctionChoice | McpChoice | AllowedTools

_TOOLS = tuple[Tool, ...]


def typed_tools(read: list[dict[str, Any]]) -> tuple[Tool, ...]:
    """Tools read (and checked) by :mod:`lmsp.app.tooldefs`, as the union."""
    found: tuple[Tool, ...] = msgspec.convert(read, _TOOLS)
    return found


def typed_choice(read: Any) -> ToolChoice | None:
    """A ``tool_choice`` read (and checked) by :mod:`lmsp.app.tooldefs`."""
    if read is None:
        return None
    found: ToolChoice = msgspec.convert(read, ToolChoice)
    return found


def function_tools(tools: tuple[Tool, ...] | None) -> list[FunctionTool]:
    return [tool for tool in tools or () if isinstance(tool, FunctionTool)]


def mcp_tools(tools: tuple[Tool, ...] | None) -> list[McpTool]:
    return [tool for tool in tools or () if isinstance(tool, McpTool)]


def offers_none(choice: ToolChoice | None) -> bool:
    """Does ``tool_choice`` offer no tool at all (``"none"``, or ``allowed_tools`` in
    mode ``"none"``)? Then the model is not told of any, and nothing it writes is a
    call."""
    return choice == "none" or (isinstance(choice, AllowedTools) and choice.mode == "none")
