"""The canonical tool vocabulary: the names runners translate their native tools into before asking
the gate, and the groups the governance matrix shows."""

from __future__ import annotations

from typing import Any

GROUPS: dict[str, tuple[str, ...]] = {
    "files": ("Read", "Write", "Edit", "MultiEdit", "NotebookRead", "NotebookEdit"),
    "search": ("Glob", "Grep", "LS"),
    "shell": ("Bash", "BashOutput", "KillShell", "EnterWorktree", "ExitWorktree"),
    "web": ("WebFetch", "WebSearch", "DesignSync"),
    "meta": (
        "TodoWrite", "Task", "ToolSearch", "Agent", "Workflow", "Skill", "TaskCreate", "TaskGet", "TaskList",
        "TaskOutput", "TaskStop", "TaskUpdate", "SendMessage", "AskUserQuestion", "EnterPlanMode",
        "ExitPlanMode", "ReportFindings", "Monitor", "CronCreate", "CronDelete", "CronList", "ScheduleWakeup",
        "PushNotification",
    ),
}  # fmt: skip
GROUP_OF: dict[str, str] = {tool: group for group, tools in GROUPS.items() for tool in tools}
CANONICAL: tuple[str, ...] = tuple(tool for tools in GROUPS.values() for tool in tools)
# Tools that start sub-executions the gate may not see; no seeded policy allows them.
NESTING = frozenset({"Agent", "Task", "Workflow", "Skill", "TaskCreate"})

# Common native spellings of other harnesses, mapped onto the canonical names.
ALIASES: dict[str, str] = {
    "shell": "Bash", "bash": "Bash", "exec": "Bash", "run_command": "Bash",
    "read_file": "Read", "write_file": "Write", "edit_file": "Edit", "apply_patch": "MultiEdit",
    "list_dir": "LS", "glob": "Glob", "grep": "Grep", "web_fetch": "WebFetch", "web_search": "WebSearch",
}  # fmt: skip


def split_mcp(tool: str) -> tuple[str, str] | None:
    """``mcp__<server>__<tool>`` → (server, tool); server aliases never contain ``__``."""
    if not tool.startswith("mcp__"):
        return None
    server, sep, name = tool[5:].partition("__")
    return (server, name) if sep and server and name else None


def canonicalize(tool: str, tool_input: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Translate a native tool call to the canonical name and input shape the policies speak."""
    name = ALIASES.get(tool, tool)
    data = dict(tool_input)
    if name == "Bash" and "command" not in data:
        for key in ("cmd", "script"):
            if isinstance(data.get(key), str):
                data["command"] = data.pop(key)
                break
        if isinstance(data.get("argv"), list):
            data["command"] = " ".join(str(a) for a in data.pop("argv"))
    if name in ("Read", "Write", "Edit") and "file_path" not in data:
        for key in ("path", "filePath", "filename"):
            if isinstance(data.get(key), str):
                data["file_path"] = data.pop(key)
                break
    return name, data
