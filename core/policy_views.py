"""Read-only views of a policy for operators: the per-tool verdict matrix and the autonomy summary.

Pure: the API folds in the agents' ``mcp__*`` tools and serves these for drafts and versions alike.
"""

from __future__ import annotations

from collections.abc import Mapping
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


def tool_status(policy: Policy, tool: str, access: str | None = None) -> dict[str, Any]:
    """The tagged verdict of one tool: ``{"status": "unconditional"|"conditional"|"default", "action", …}``.
    ``access``: a brokered tool's access class, for rules narrowed by class."""
    for index, rule in enumerate(policy.tools):
        if rule.matches(tool, access):
            constraints = _constraints(rule)
            if constraints is None:
                return {"status": "unconditional", "action": rule.action, "rule": index}
            return {"status": "conditional", "action": rule.action, "rule": index, "constraints": constraints}
    return {"status": "default", "action": policy.defaults.tool_action}


ExtraTools = Mapping[str, tuple[str | None, str | None]] | list[str] | tuple[str, ...]


def matrix(policy: Policy, extra_tools: ExtraTools = ()) -> list[dict[str, Any]]:
    """One row per canonical tool and per extra (``mcp__``) tool: what this policy does with it.

    A row is ``{tool, group, server, status}`` with ``status`` the tagged object of ``tool_status``
    (spec/api-surface.md "Matrix rows"): clients switch on ``row["status"]["status"]``. Extra tools
    given as a mapping carry their ``(access, approval)``, shown on the row (an unclassified brokered
    tool has ``access: null``: the gate denies it whatever the policy says, and the row says so).
    """
    classes = extra_tools if isinstance(extra_tools, Mapping) else dict.fromkeys(extra_tools, (None, None))
    rows = []
    for tool in [*CANONICAL, *sorted(set(classes) - set(CANONICAL))]:
        mcp = split_mcp(tool)
        row: dict[str, Any] = {"tool": tool, "group": GROUP_OF.get(tool), "server": mcp[0] if mcp else None}
        if mcp is not None and tool in classes:
            access, approval = classes[tool]
            row["access"], row["approval"] = access, approval
            if access is None:
                row["status"] = {"status": "unclassified", "action": "deny"}
            elif access == "write" and approval == "always":
                status = tool_status(policy, tool, access)
                if status["action"] != "deny":
                    status = {**status, "action": "approve", "approval": "always"}
                row["status"] = status
            else:
                row["status"] = tool_status(policy, tool, access)
        else:
            row["status"] = tool_status(policy, tool)
        rows.append(row)
    return rows


def overview(policy: Policy, extra_tools: ExtraTools = ()) -> dict[str, Any]:
    return {
        "autonomy_summary": autonomy_summary(policy),
        "defaults": policy.defaults.model_dump(),
        "budgets": policy.budgets.model_dump(),
        "approvals": policy.approvals.model_dump(),
        "egress": policy.egress,
        "matrix": matrix(policy, extra_tools),
    }
