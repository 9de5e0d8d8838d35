"""Tools that run inside the sandbox and still answer to the gate: sandbox-class capability servers
(stdio MCP, launched here) and sandbox CLI tools (``transport: sandbox_cli``).

Both arrive in ``FLUIDBOX_CAPABILITIES`` as the frozen RunSpec has them (names, schemas, launch lines; never a
URL or a credential). The harness asks ``/permission`` for every ``mcp__<server>__<tool>`` call first (the gate
judges it against the frozen schema), then runs it here:

* a capability server is started once per run, lazily, with ``[command, *args]`` (no shell) in ``/workspace``
  and an environment that holds no token; the sandbox has no network, so neither has the server;
* a sandbox CLI tool runs its declared command with the template's literal arguments and each argument value
  as exactly one argv element: ``; rm -rf /`` stays one literal argument. A value before the template's ``--``
  may not start with ``-`` (no flag the template did not declare).

A CLI tool runs whatever its program reads from the workspace, and the workspace is the agent's: under a policy
that denies ``Bash`` but lets the agent write files, a ``git status`` that obeyed a ``core.fsmonitor`` the agent
put in ``.git/config`` would be a shell by another name. So ``git`` (the catalog's tools, and any tool whose
command is git) runs with no system or global configuration (``HOME`` is the workspace, so ``~/.gitconfig`` is the
agent's too), no pager, editor or prompt, and with every configuration key that makes git run a command
overridden, including those the repository's own configuration (and what it includes) declares for named drivers
(see :func:`git_hardening`). Other programs are run as declared: a CLI tool that reads the workspace (``make``,
``npm``) trusts it, and its access class should say so.

Standard library only (the runner starts with ``python -S``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping
from typing import Any

from runner import tools
from runner.mcp_stdio import StdioMcpError, StdioMcpServer

_PLACEHOLDER = re.compile(r"^\{([a-z_][a-z0-9_]{0,63})\}$")
CLI_DEFAULT_TIMEOUT_S = 60.0


class ToolRefused(ValueError):
    """The call's arguments cannot be turned into a command line (the message says why)."""


class LocalTools:
    """The in-sandbox tools of a run: ``mcp__<name>__<tool>`` → how to run it.

    A plain class, not a dataclass: ``dataclasses`` costs every runner's start a few ms (issue 12).
    """

    def __init__(
        self,
        servers: dict[str, dict[str, Any]] | None = None,
        cli: dict[str, dict[str, dict[str, Any]]] | None = None,
    ) -> None:
        self.servers: dict[str, dict[str, Any]] = {} if servers is None else servers  # sandbox-class servers
        self.cli: dict[str, dict[str, dict[str, Any]]] = {} if cli is None else cli  # slot → tool → declaration
        self._running: dict[str, StdioMcpServer] = {}

    @classmethod
    def from_capabilities(cls, raw: str | None) -> LocalTools:
        """Parse ``FLUIDBOX_CAPABILITIES``; servers of other classes are someone else's (the broker's).

        Raises:
            ValueError: the variable is set but not the documented shape.
        """
        found = cls()
        if not raw or not raw.strip():
            return found
        try:
            doc = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"FLUIDBOX_CAPABILITIES is not JSON: {exc}") from None
        servers = doc.get("servers") if isinstance(doc, dict) else None
        if not isinstance(servers, list):
            raise ValueError("FLUIDBOX_CAPABILITIES has no servers list")
        for server in servers:
            if not isinstance(server, dict):
                continue
            name, kind = server.get("name"), server.get("class")
            tool_list = server.get("tools") or []
            if not isinstance(name, str) or not isinstance(tool_list, list):
                raise ValueError("FLUIDBOX_CAPABILITIES: a server needs a name and a tools list")
            by_name = {t["name"]: t for t in tool_list if isinstance(t, dict) and isinstance(t.get("name"), str)}
            if kind == "sandbox":
                if not isinstance(server.get("command"), str):
                    raise ValueError(f"FLUIDBOX_CAPABILITIES: sandbox server {name!r} has no command")
                found.servers[name] = {
                    "command": server["command"],
                    "args": [str(a) for a in server.get("args") or []],
                    "tools": by_name,
                }
            elif kind == "sandbox_cli":
                found.cli[name] = by_name
        return found

    def owns(self, tool: str) -> bool:
        """Whether ``tool`` (``mcp__<server>__<tool>``) runs here."""
        split = _split(tool)
        if split is None:
            return False
        server, name = split
        return name in self.servers.get(server, {}).get("tools", {}) or name in self.cli.get(server, {})

    def mounted(self) -> list[str]:
        names = [f"mcp__{s}__{t}" for s, spec in self.servers.items() for t in spec["tools"]]
        return names + [f"mcp__{s}__{t}" for s, decls in self.cli.items() for t in decls]

    def call(self, tool: str, arguments: dict[str, Any], root: str) -> dict[str, Any]:
        """Run one (already allowed) call; returns an MCP tool result (``content``, ``isError``).

        Raises:
            ToolRefused: the arguments cannot be placed on the command line.
            StdioMcpError: the capability server failed.
        """
        split = _split(tool)
        if split is None or not self.owns(tool):
            raise ToolRefused(f"{tool} is not a tool of this sandbox")
        server, name = split
        if server in self.cli:
            code, output = run_cli(self.cli[server][name], arguments, root)
            text = output.rstrip("\n") if code == 0 else f"{output.rstrip()}\n→ exit {code}".lstrip()
            return {"content": [{"type": "text", "text": text}], "isError": code != 0}
        running = self._running.get(server)
        if running is None:
            spec = self.servers[server]
            running = StdioMcpServer(server, spec["command"], spec["args"], cwd=root, env=tools.child_env(root))
            self._running[server] = running
        return running.call_tool(name, arguments)

    def stdio_configs(self, root: str) -> dict[str, dict[str, Any]]:
        """The capability servers as the Claude Code CLI's ``mcpServers`` entries (stdio, launched by it)."""
        return {
            name: {"type": "stdio", "command": spec["command"], "args": spec["args"], "env": tools.child_env(root)}
            for name, spec in self.servers.items()
        }

    def close(self) -> None:
        for server in self._running.values():
            server.close()
        self._running.clear()


def build_argv(decl: Mapping[str, Any], arguments: Mapping[str, Any]) -> list[str]:
    """The command line of one sandbox CLI call: literals as declared, each value exactly one element.

    Raises:
        ToolRefused: an unknown argument, a non-scalar value, a NUL, or a value before ``--`` that looks
            like a flag.
    """
    template = [str(a) for a in decl.get("args") or []]
    declared = {m.group(1) for a in template if (m := _PLACEHOLDER.match(a))}
    unknown = sorted(set(arguments) - declared)
    if unknown:
        raise ToolRefused(f"undeclared argument(s): {', '.join(unknown)}")
    argv = [str(decl["command"])]
    after_separator = False
    for element in template:
        match = _PLACEHOLDER.match(element)
        if match is None:
            argv.append(element)
            after_separator = after_separator or element == "--"
            continue
        key = match.group(1)
        if key not in arguments:
            continue  # an optional argument the call left out
        value = arguments[key]
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ToolRefused(f"argument {key!r} must be a string or a number")
        text = str(value)
        if "\x00" in text:
            raise ToolRefused(f"argument {key!r} contains a NUL character")
        if not after_separator and text.startswith("-"):
            raise ToolRefused(f"argument {key!r} may not start with '-' (it would be read as an option)")
        argv.append(text)
    return argv


def run_cli(decl: Mapping[str, Any], arguments: Mapping[str, Any], root: str) -> tuple[int, str]:
    """Execute a sandbox CLI tool without a shell in ``root``; ``(exit code, merged output capped at 16 KiB)``."""
    argv = build_argv(decl, arguments)
    timeout = float(decl.get("timeout_s") or CLI_DEFAULT_TIMEOUT_S)
    env = tools.child_env(root)
    if os.path.basename(argv[0]) == "git":
        argv, env = git_hardening(argv, root, env)
    try:
        proc = subprocess.run(
            argv,
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        partial = exc.output or b""
        return tools.TIMEOUT_EXIT_CODE, tools._cap(partial, len(partial)) + f"\n[timed out after {timeout:g}s]"
    except OSError as exc:
        return 127, f"cannot run {argv[0]}: {exc.strerror or exc}"
    code = proc.returncode
    return (128 - code if code < 0 else code), tools._cap(proc.stdout, len(proc.stdout))


# ---- git: a CLI that runs what its configuration names --------------------------------------------------------

GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",  # HOME is the workspace: ~/.gitconfig and ~/.config/git are the agent's
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    "GIT_EDITOR": ":",
    "GIT_SEQUENCE_EDITOR": ":",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_OPTIONAL_LOCKS": "0",  # a read (status) leaves the index alone: no index write, no post-index-change
}
# Keys that name a command (or make git start one) whatever the repository says, given as command-line
# configuration, which outranks the repository's. Child gits (submodules, gc) inherit them.
GIT_FIXED: tuple[tuple[str, str], ...] = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.pager", "cat"),
    ("core.editor", ":"),
    ("sequence.editor", ":"),
    ("core.askPass", ""),
    ("credential.helper", ""),  # an empty value clears every helper configured before it
    ("core.sshCommand", "ssh"),
    ("core.attributesFile", "/dev/null"),
    ("protocol.ext.allow", "never"),  # ext:: runs a command; the sandbox has no network for git:// or ssh
    ("protocol.git.allow", "never"),  # (and core.gitProxy would run one for git://)
    ("protocol.ssh.allow", "never"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("push.gpgSign", "false"),
    ("log.showSignature", "false"),
    ("merge.verifySignatures", "false"),
    ("gpg.program", "gpg"),
    ("gpg.openpgp.program", "gpg"),
    ("gpg.x509.program", "gpgsm"),
    ("gpg.ssh.program", "ssh-keygen"),
    # A submodule is a repository whose configuration is read by a child git: never look into one.
    ("diff.ignoreSubmodules", "all"),
    ("diff.submodule", "short"),
    ("status.submoduleSummary", "false"),
    ("submodule.recurse", "false"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
)
# Keys that name a command but have no neutral value: emptied only when the repository sets them (git then
# refuses to run the empty command: ``diff.external`` fails a diff unless the tool passes ``--no-ext-diff``).
GIT_IF_SET = {"diff.external": "", "core.alternaterefscommand": "", "gpg.ssh.defaultkeycommand": ""}
# Per-driver keys (``<section>.<name>.<key>``) that name a command, and what neutralizes each: an empty filter
# is no filter; a textconv of ``cat`` shows the file as it is (an empty one would fail the diff); an empty
# external diff or merge driver is refused.
GIT_DRIVER_KEYS = {
    "filter": (("clean", ""), ("smudge", ""), ("process", ""), ("required", "false")),
    "diff": (("textconv", "cat"), ("command", "")),
    "merge": (("driver", ""),),
    "difftool": (("cmd", ""),),
    "mergetool": (("cmd", ""),),
    "credential": (("helper", ""),),
    "remote": (("uploadpack", "git-upload-pack"), ("receivepack", "git-receive-pack"), ("proxy", "")),
    "submodule": (("ignore", "all"), ("update", "checkout")),
}
# Global options of git that take the next argument as their value.
_GIT_GLOBALS_WITH_VALUE = frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--config-env"})
GIT_PROBE_TIMEOUT_S = 10.0


def git_hardening(argv: list[str], root: str, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """``argv`` and ``env`` for a git that runs nothing the workspace names: no pager (``--no-pager``), the
    environment of :data:`GIT_ENV`, and through ``GIT_CONFIG_COUNT`` the overrides of :data:`GIT_FIXED` plus, for
    each driver the repository's configuration declares (its includes followed), its command keys neutralized
    (:data:`GIT_DRIVER_KEYS`), each submodule it or ``.gitmodules`` names ignored, each alias and each key of
    :data:`GIT_IF_SET` it sets emptied.

    Repository-local configuration cannot be switched off, so it is read first (``git config --list``, which
    starts nothing) by a git with the tool's own global options (``-C``, ``--git-dir``…), to learn those names.
    The template's own ``-c`` options still win: the operator wrote them.
    """
    hardened = {**env, **GIT_ENV}
    fixed = _config_env(list(GIT_FIXED))
    globals_ = _git_globals(argv[1:])
    probe_env = {**hardened, **fixed}
    names = _git_names([argv[0], *globals_, "config", "--list", "--name-only", "-z"], root, probe_env)
    top = _git_output([argv[0], *globals_, "rev-parse", "--show-toplevel"], root, probe_env).strip()
    if top:
        gitmodules = os.path.join(top, ".gitmodules")
        source = ["--file", gitmodules] if os.path.lexists(gitmodules) else ["--blob", ":.gitmodules"]
        names += _git_names([argv[0], *globals_, "config", *source, "--list", "--name-only", "-z"], root, probe_env)
    overrides = list(GIT_FIXED)
    seen: set[tuple[str, str]] = set()
    for name in names:
        section, _, rest = name.partition(".")
        subsection, _, _key = rest.rpartition(".")
        if name.lower() in GIT_IF_SET:
            overrides.append((name, GIT_IF_SET[name.lower()]))
        elif section == "alias" and rest:
            overrides.append((name, ""))  # an empty alias is refused rather than run
        elif subsection and section in GIT_DRIVER_KEYS and (section, subsection) not in seen:
            seen.add((section, subsection))
            overrides += [(f"{section}.{subsection}.{k}", v) for k, v in GIT_DRIVER_KEYS[section]]
    return [argv[0], "--no-pager", *argv[1:]], {**hardened, **_config_env(overrides)}


def _git_globals(args: list[str]) -> list[str]:
    """The global options at the head of a git command line (up to its subcommand)."""
    out: list[str] = []
    i = 0
    while i < len(args) and args[i].startswith("-"):
        out.append(args[i])
        if args[i] in _GIT_GLOBALS_WITH_VALUE and i + 1 < len(args):
            out.append(args[i + 1])
            i += 1
        i += 1
    return out


def _git_output(argv: list[str], root: str, env: dict[str, str]) -> str:
    try:
        done = subprocess.run(
            argv, cwd=root, env=env, stdin=subprocess.DEVNULL, capture_output=True,
            timeout=GIT_PROBE_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.decode("utf-8", "surrogateescape") if done.returncode == 0 else ""


def _git_names(argv: list[str], root: str, env: dict[str, str]) -> list[str]:
    return [n for n in _git_output(argv, root, env).split("\0") if n]


def _config_env(pairs: list[tuple[str, str]]) -> dict[str, str]:
    env = {"GIT_CONFIG_COUNT": str(len(pairs))}
    for i, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    return env


def _split(tool: str) -> tuple[str, str] | None:
    if not tool.startswith("mcp__"):
        return None
    server, sep, name = tool[5:].partition("__")
    return (server, name) if sep and server and name else None


__all__ = ["LocalTools", "StdioMcpError", "ToolRefused", "build_argv", "git_hardening", "run_cli"]
