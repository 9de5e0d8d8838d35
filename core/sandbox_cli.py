"""Sandbox CLI tools (``transport: sandbox_cli``): a reviewed CLI of the sandbox image, one tool per command line.

Each tool declares a ``command`` (a program name or absolute path, never a shell line), an ``args`` template and
an argument ``input_schema``. A template element is either a literal or exactly one placeholder ``{name}`` naming
a property of the schema; the runner substitutes each argument value as **one** argv element (no shell, no
splitting, no globbing). A value placed before a literal ``--`` may not start with ``-``, so a model can never
add a flag the template did not declare. The schema must close the argument set (``additionalProperties:
false``) and give every placeholder a scalar type; the gate judges each call against it before the runner runs
anything.

These tools run with **no credential**: nothing secret is ever passed to them (see docs/architecture.md).
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema

from core.errors import BadRequest

PLACEHOLDER = re.compile(r"^\{([a-z_][a-z0-9_]{0,63})\}$")
_COMMAND = re.compile(r"^[A-Za-z0-9_./+-]{1,256}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
SCALAR_TYPES = frozenset({"string", "integer", "number"})
MAX_TOOLS = 64
MAX_ARGS = 64
MAX_TIMEOUT_S = 600.0


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """The normalized tool declarations of a ``sandbox_cli`` connection; 400 naming the first problem."""
    if not isinstance(tools, list) or not tools:
        raise BadRequest(
            "a sandbox_cli connection needs `tools`: a non-empty list of {name, command, args, input_schema}"
        )
    if len(tools) > MAX_TOOLS:
        raise BadRequest(f"a sandbox_cli connection declares at most {MAX_TOOLS} tools")
    out = [check_tool(t) for t in tools]
    names = [t["name"] for t in out]
    if len(names) != len(set(names)):
        raise BadRequest("a sandbox_cli connection declares a tool name more than once")
    return out


def check_tool(tool: Any) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise BadRequest("each sandbox_cli tool is an object")
    unknown = sorted(set(tool) - {"name", "description", "command", "args", "input_schema", "timeout_s"})
    if unknown:
        raise BadRequest(f"unknown field(s) in a sandbox_cli tool: {', '.join(unknown)}")
    name = tool.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise BadRequest("a sandbox_cli tool needs a `name` of letters, digits, '_' and '-'")
    where = f"sandbox_cli tool '{name}'"
    command = tool.get("command")
    if not isinstance(command, str) or not _COMMAND.match(command):
        raise BadRequest(f"{where}: `command` is one program name or absolute path (no spaces, no shell)")
    args = tool.get("args", [])
    if not isinstance(args, list) or len(args) > MAX_ARGS or not all(isinstance(a, str) for a in args):
        raise BadRequest(f"{where}: `args` is a list of at most {MAX_ARGS} strings")
    placeholders: list[str] = []
    for arg in args:
        if "\x00" in arg:
            raise BadRequest(f"{where}: an argument contains a NUL character")
        match = PLACEHOLDER.match(arg)
        if match:
            placeholders.append(match.group(1))
        elif "{" in arg or "}" in arg:
            raise BadRequest(f"{where}: a placeholder is a whole argument `{{name}}`, not part of one ({arg!r})")
    if len(placeholders) != len(set(placeholders)):
        raise BadRequest(f"{where}: a placeholder is used more than once")
    schema = tool.get("input_schema")
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise BadRequest(f"{where}: `input_schema` must be a JSON Schema of type object")
    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise BadRequest(f"{where}: `input_schema` is not a valid JSON Schema: {exc.message}") from None
    if schema.get("additionalProperties") is not False:
        raise BadRequest(f"{where}: `input_schema` must set additionalProperties: false (no undeclared arguments)")
    properties = schema.get("properties") or {}
    if set(properties) != set(placeholders):
        raise BadRequest(
            f"{where}: the schema's properties ({', '.join(sorted(properties)) or 'none'}) must be exactly the "
            f"template's placeholders ({', '.join(sorted(placeholders)) or 'none'})"
        )
    for prop, sub in properties.items():
        if not isinstance(sub, dict) or sub.get("type") not in SCALAR_TYPES:
            raise BadRequest(f"{where}: argument '{prop}' must have a scalar type (string, integer or number)")
    timeout = tool.get("timeout_s", 60)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not 0 < timeout <= MAX_TIMEOUT_S:
        raise BadRequest(f"{where}: `timeout_s` is a number of seconds in (0, {MAX_TIMEOUT_S:g}]")
    description = tool.get("description", "")
    if not isinstance(description, str) or len(description) > 32768:
        raise BadRequest(f"{where}: `description` is a string of at most 32768 characters")
    return {
        "name": name,
        "description": description,
        "command": command,
        "args": list(args),
        "input_schema": schema,
        "timeout_s": float(timeout),
    }
