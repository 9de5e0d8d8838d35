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
    if rule.shell is None and rule.paths is None:
        return None
    out: dict[str, Any] = {}
    if rule.paths is not None:
        out |= {
            "paths_allow": list(rule.paths.allow),
            "paths_deny": list(rule.paths.deny),
            "paths_on_no_match": "approve" if rule.paths.allow else rule.action,
        }
    if rule.shell is not None:
        out |= {
            "shell_allow_prefixes": list(rule.shell.allow_prefixes),
            "shell_deny_regex": list(rule.shell.deny_regex),
            "shell_on_no_match": rule.shell.on_no_match,
        }
    return out


def tool_status(policy: Policy, tool: str) -> dict[str, Any]:
    for index, rule in enumerate(policy.tools):
        if rule.matches(tool):
            constraints = _constraints(rule)
            if constraints is None:
                return {"status": "unconditional", "action": rule.action, "rule": index}
            return {"status": "conditional", "action": rule.action, "rule": index, "constraints": constraints}
    return {"status": "default", "action": policy.defaults.tool_action}


def matrix(policy: Policy, extra_tools: list[str] | tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """One row per canonical tool and per extra (``mcp__``) tool: what this policy does with it."""
    rows = []
    for tool in [*CANONICAL, *sorted(set(extra_tools) - set(CANONICAL))]:
        mcp = split_mcp(tool)
        rows.append(
            {
                "tool": tool,
                "group": GROUP_OF.get(tool),
                "server": mcp[0] if mcp else None,
                **tool_status(policy, tool),
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
