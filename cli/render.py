"""How the CLI prints runs and ledger events (one line per event)."""

from __future__ import annotations

from typing import Any

ICONS = {
    "session.created": "◆",
    "session.status_changed": "→",
    "workspace.initialized": "▣",
    "agent.message": "💬",
    "tool.requested": "?",
    "tool.decision": "⚖",
    "approval.requested": "✋",
    "approval.decided": "✔",
    "run.result": "■",
    "run.error": "✖",
    "artifact.collected": "📎",
    "artifact.missing": "⚠",
    "budget.exceeded": "$",
    "run.quiesce_requested": "⏸",
}


def event_line(event: dict[str, Any]) -> str:
    kind = event["type"]
    data = event["payload"].get("data", {})
    icon = ICONS.get(kind, "·")
    if kind == "session.status_changed":
        text = f"status {data.get('from')} → {data.get('to')}" + (f" ({data['reason']})" if data.get("reason") else "")
    elif kind == "agent.message":
        text = str(data.get("text", "")).strip().replace("\n", "\n       ")
    elif kind == "tool.requested":
        text = f"{data.get('tool_call_id')} asks: {data.get('summary')}"
    elif kind == "tool.decision":
        text = f"{data.get('tool_call_id')} {data.get('verdict').upper()} by {data.get('source')}"
        if data.get("reason"):
            text += f" — {data['reason']}"
    elif kind == "approval.requested":
        text = f"{data.get('tool_call_id')} needs a human: {data.get('summary')} (approval {data.get('approval_id')})"
    elif kind == "approval.decided":
        text = f"{data.get('tool_call_id')} {data.get('decision')} by {data.get('decided_by')}"
    elif kind == "run.result":
        text = f"result {data.get('outcome')}: {data.get('summary', '')}"
    elif kind == "workspace.initialized":
        text = f"workspace ready ({data.get('files')} files, baseline {str(data.get('base_commit', ''))[:10]})"
    else:
        text = ", ".join(f"{k}={v}" for k, v in data.items())
    return f"{event['seq']:>4} {icon} {text}"


def run_line(run: dict[str, Any]) -> str:
    agent = run.get("run_spec", {}).get("agent_name", "?")
    line = f"{run['id']}  {run['status']:<22} {agent:<16} {run['task'][:60]}"
    action = run.get("pending_action")
    if action:  # waiting_for_connection: say what a person must do
        line += f"\n    ↳ waits for slot '{action['slot']}': {action['reason']} — {action['how']}"
    return line
