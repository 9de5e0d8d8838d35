"""Read-only views of a policy for operators: the per-tool verdict matrix and the autonomy summary.

Pure: the API folds in the agents' ``mcp__*`` tools and serves these for drafts and versions alike.
"""

from __future__ import annotations

from typing import Any

from core.policy import Policy, ToolRule
from core.tools import CANONICAL, GROUP_OF, split_mcp


def autonomy_summary(policy: Policy) -> dict[str, Any]:
    return {
        "permitted": policy.autonomy.permitted,
        "default_fallback": policy.autonomy.on_approval_rule,
        "allow_overrides": sum(1 for r in policy.tools if r.on_autonomous == "allow"),
        "deny_overrides": sum(1 for r in policy.tools if r.on_autonomous == "deny"),
    }


def _constraints(rule: ToolRule) -> dict[str, Any] | None:
    """All six keys of the spec's ``constraints``, ``None`` for the kind (paths or shell) a rule lacks."""
    if rule.shell is None and rule.paths is None:
        return None
    paths, shell = rule.paths, rule.shell
    return {
        "paths_allow": list(paths.allow) if paths else None,
        "paths_deny": list(paths.deny) if paths else None,
        "paths_on_no_match": ("approve" if paths.allow else rule.action) if paths else None,
        "shell_allow_prefixes": list(shell.allow_prefixes) if shell else None,
        "shell_deny_regex": list(shell.deny_regex) if shell else None,
        "shell_on_no_match": shell.on_no_match if shell else None,
    }


def tool_status(policy: Policy, tool: str) -> dict[str, Any]:
    """The tagged verdict of one tool: ``{"status": "unconditional"|"conditional"|"default", "action", …}``."""
    for index, rule in enumerate(policy.tools):
        if rule.matches(tool):
            constraints = _constraints(rule)
            if constraints is None:
                return {"status": "unconditional", "action": rule.action, "rule": index}
            return {"status": "conditional", "action": rule.action, "rule": index, "constraints": constraints}
    return {"status": "default", "action": policy.defaults.tool_action}


def matrix(policy: Policy, extra_tools: list[str] | tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """One row per canonical tool and per extra (``mcp__``) tool: what this policy does with it.

    A row is ``{tool, group, server, status}`` with ``status`` the tagged object of ``tool_status``
    (spec/api-surface.md "Matrix rows"): clients switch on ``row["status"]["status"]``.
    """
    rows = []
    for tool in [*CANONICAL, *sorted(set(extra_tools) - set(CANONICAL))]:
        mcp = split_mcp(tool)
        rows.append(
            {
                "tool": tool,
                "group": GROUP_OF.get(tool),
                "server": mcp[0] if mcp else None,
                "status": tool_status(policy, tool),
            }
        )
    return rows


def overview(policy: Policy, extra_tools: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "autonomy_summary": autonomy_summary(policy),
        "defaults": policy.defaults.model_dump(),
        "budgets": policy.budgets.model_dump(),
        "approvals": policy.approvals.model_dump(),
        "egress": policy.egress,
        "matrix": matrix(policy, extra_tools),
    }
