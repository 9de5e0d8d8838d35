"""``workspace-info``: the catalog's authless in-image MCP server (stdio), run inside the sandbox.

Its one tool, ``summary``, counts the files and bytes under the server's working directory (``/workspace``:
the runner starts capability servers there) per language, by file extension. It reads names and sizes only,
never contents; links are not followed; ``.git`` is skipped; the walk is iterative and stops at
``MAX_ENTRIES`` entries or ``MAX_DEPTH`` levels, saying so (``truncated``), so no tree the agent built can
make it run away.

Started by path (``python3 /opt/fluidbox/runner/workspace_info.py``), not as a module: a capability server
gets the sandbox's allow-listed environment, which sets no ``PYTHONPATH``. It imports the ``mcp`` SDK and the
standard library only (both are in the runner image and in the control plane's virtualenv).
"""

from __future__ import annotations

import json
import os
import stat

from mcp.server.mcpserver import MCPServer

MAX_ENTRIES = 200_000
MAX_DEPTH = 64
LANGUAGES = {
    ".py": "Python", ".pyi": "Python", ".js": "JavaScript", ".mjs": "JavaScript", ".cjs": "JavaScript",
    ".jsx": "JavaScript", ".ts": "TypeScript", ".tsx": "TypeScript", ".go": "Go", ".rs": "Rust", ".java": "Java",
    ".kt": "Kotlin", ".rb": "Ruby", ".php": "PHP", ".c": "C", ".h": "C", ".cc": "C++", ".cpp": "C++",
    ".hpp": "C++", ".cs": "C#", ".swift": "Swift", ".scala": "Scala", ".sh": "Shell", ".bash": "Shell",
    ".sql": "SQL", ".html": "HTML", ".css": "CSS", ".scss": "CSS", ".md": "Markdown", ".rst": "reStructuredText",
    ".json": "JSON", ".yaml": "YAML", ".yml": "YAML", ".toml": "TOML", ".xml": "XML", ".txt": "Text",
}  # fmt: skip

server = MCPServer("workspace-info", version="1")


def summarize(root: str) -> dict[str, object]:
    """Files and bytes under ``root`` per language (see the module docstring for the bounds)."""
    languages: dict[str, dict[str, int]] = {}
    files = size = entries = 0
    truncated = False
    stack: list[tuple[str, int]] = [(root, 0)]
    while stack:
        directory, depth = stack.pop()
        try:
            listing = list(os.scandir(directory))
        except OSError:
            continue
        for entry in listing:
            entries += 1
            if entries > MAX_ENTRIES:
                truncated = True
                stack.clear()
                break
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if entry.name == ".git":
                    continue
                if depth + 1 >= MAX_DEPTH:
                    truncated = True
                else:
                    stack.append((entry.path, depth + 1))
            elif stat.S_ISREG(st.st_mode):
                files += 1
                size += st.st_size
                language = LANGUAGES.get(os.path.splitext(entry.name)[1].lower(), "Other")
                tally = languages.setdefault(language, {"files": 0, "bytes": 0})
                tally["files"] += 1
                tally["bytes"] += st.st_size
    ordered = dict(sorted(languages.items(), key=lambda kv: (-kv[1]["bytes"], kv[0])))
    return {"files": files, "bytes": size, "languages": ordered, "truncated": truncated}


@server.tool(description="Count files and bytes per language under /workspace.")
def summary() -> str:
    return json.dumps(summarize(os.getcwd()))


if __name__ == "__main__":
    server.run("stdio")
