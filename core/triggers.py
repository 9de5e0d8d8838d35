"""Trigger subscriptions, pure: token shapes, invocation limits, narrowing overrides, event matching.

Nothing here touches the database, the clock or the network; ``services.triggers`` does that.
"""

from __future__ import annotations

import posixpath
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from core.digests import canonical_json, document_digest
from core.errors import BadRequest
from core.templates import placeholders, require_only

TRIGGER_TOKEN_PREFIX = "fbx_trig_"
CALLBACK_SECRET_PREFIX = "fbx_whsec_"
KINDS = ("api", "schedule", "event")
CONCURRENCY_POLICIES = ("allow", "skip_if_running", "replace")
REPLACED_REASON = "replaced by a newer invocation of this subscription"

MAX_TASK_CHARS = 16_384
MAX_CONTEXT_BYTES = 8_192
MAX_IDEMPOTENCY_KEY = 200
CLAIM_STEAL_SECS = 60.0

SUPPORTED_EVENTS = ("pull_request.opened", "pull_request.reopened", "pull_request.synchronize")
DEFAULT_EVENTS = ("pull_request.opened", "pull_request.reopened")
PUBLISH_KINDS = ("pr_comment", "check")
DEFAULT_PUBLISH = ("pr_comment",)
# What an event-driven run's template may use (domain §11: the PR context keys).
EVENT_CONTEXT_KEYS = frozenset(
    {
        "repository",
        "pr_number",
        "pr_title",
        "pr_url",
        "pr_author",
        "head_sha",
        "head_ref",
        "base_sha",
        "base_ref",
        "action",
        "event",
        "fork",
    }
)
SCHEDULE_CONTEXT_KEYS = frozenset({"fire_time"})

_HEX64 = re.compile(r"[0-9a-f]{64}")
_REPOSITORY = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}")
_KEY_TEXT = re.compile(r"[\x21-\x7e]+")


def trigger_token(random_hex: str) -> str:
    """``fbx_trig_<64 hex>`` from 32 random bytes the caller supplies (core reads no randomness)."""
    if not _HEX64.fullmatch(random_hex):
        raise ValueError("a trigger token needs 64 lowercase hex characters of randomness")
    return TRIGGER_TOKEN_PREFIX + random_hex


def callback_secret(random_hex: str) -> str:
    """``fbx_whsec_<64 hex>``: the HMAC key of the subscription's signed callbacks."""
    if not _HEX64.fullmatch(random_hex):
        raise ValueError("a callback secret needs 64 lowercase hex characters of randomness")
    return CALLBACK_SECRET_PREFIX + random_hex


def looks_like_trigger_token(token: str) -> bool:
    return token.startswith(TRIGGER_TOKEN_PREFIX) and bool(_HEX64.fullmatch(token[len(TRIGGER_TOKEN_PREFIX) :]))


def callback_context(subscription_id: str) -> str:
    """The sealing context of a subscription's callback secret (a blob moved elsewhere fails to open)."""
    return f"subscription:{subscription_id}:callback"


# ---- one invocation ---------------------------------------------------------------------------


# Keys the server mints for its own fires (schedule fire times, run-now, unkeyed invokes): a caller
# who could claim one first would pre-empt that fire with a run of its own choosing.
RESERVED_KEY_PREFIXES = ("sched:", "run-now:", "auto-")


def check_idempotency_key(key: str) -> str:
    if not key or len(key) > MAX_IDEMPOTENCY_KEY:
        raise BadRequest(f"Idempotency-Key must be 1..{MAX_IDEMPOTENCY_KEY} characters")
    if not _KEY_TEXT.fullmatch(key):
        raise BadRequest("Idempotency-Key must be printable ASCII without spaces")
    if key.lower().startswith(RESERVED_KEY_PREFIXES):
        prefixes = ", ".join(RESERVED_KEY_PREFIXES)
        raise BadRequest(f"Idempotency-Key may not start with {prefixes} (reserved for the server's own fires)")
    return key


def context_variables(context: dict[str, Any] | None) -> dict[str, str]:
    """Template variables from an invocation ``context``: scalars only, 8 KiB at most."""
    if not context:
        return {}
    size = len(canonical_json(context).encode())
    if size > MAX_CONTEXT_BYTES:
        raise BadRequest(f"context is {size} bytes, over the {MAX_CONTEXT_BYTES} byte limit")
    out: dict[str, str] = {}
    for key, value in context.items():
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, int | float | str):
            out[key] = str(value)
        else:
            raise BadRequest(f"context.{key} must be a string, number or boolean")
    return out


def request_digest(task: str | None, context: dict[str, Any] | None, workspace: dict[str, Any] | None) -> str:
    """What an Idempotency-Key is bound to: the canonical ``{task, context, workspace}``."""
    return document_digest({"task": task, "context": context or {}, "workspace": workspace})


def check_task_override(task: str) -> str:
    if not task.strip():
        raise BadRequest("task must not be empty")
    if len(task) > MAX_TASK_CHARS:
        raise BadRequest(f"task is {len(task)} characters, over the {MAX_TASK_CHARS} character limit")
    return task


def narrow_workspace(base: dict[str, Any] | None, override: dict[str, Any]) -> dict[str, Any]:
    """Apply an invocation's workspace override to the subscription's (or revision's) workspace.

    Overrides only narrow. The workspaces of this build are ``scratch`` and ``local_copy``: a
    local_copy may be narrowed to a sub-directory of its path; there is no repository to swap and no
    ref or commit to pin yet (those arrive with git workspaces and are refused here, naming why).
    The caller still resolves symlinks before trusting the result (that needs the file system).
    """
    unknown = sorted(set(override) - {"path", "repository", "ref", "commit_sha"})
    if unknown:
        raise BadRequest(f"unknown workspace override field(s): {', '.join(unknown)}")
    if base is None or base.get("kind") != "local_copy" or not base.get("path"):
        raise BadRequest("this subscription's workspace is scratch: there is nothing to narrow")
    if override.get("repository") is not None:
        raise BadRequest("cannot retarget a local_copy workspace to another repository")
    for field in ("ref", "commit_sha"):
        if override.get(field) is not None:
            raise BadRequest(f"workspace.{field}: a local_copy workspace has no git ref or commit to narrow to")
    path = override.get("path")
    if path is None:
        return dict(base)
    if not isinstance(path, str) or not path.startswith("/"):
        raise BadRequest("workspace.path must be an absolute path")
    root = posixpath.normpath(base["path"])
    wanted = posixpath.normpath(path)
    if not is_within(root, wanted):
        raise BadRequest(f"workspace.path must stay inside the subscription's workspace {root}")
    return {"kind": "local_copy", "path": wanted}


def is_within(root: str, path: str) -> bool:
    """Lexical containment of normalized absolute paths (``/a/b`` is within ``/a``, ``/ab`` is not)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


# ---- a subscription body ----------------------------------------------------------------------


def check_name(name: str) -> str:
    if not name.strip() or len(name) > 200:
        raise BadRequest("name must be 1..200 characters")
    return name


def check_template(kind: str, template: str | None, allow_task_override: bool) -> None:
    """A template is required unless the caller may supply the task; its keys must be suppliable.

    Scheduled and event fires have no caller, so for those kinds ``allow_task_override`` cannot stand
    in for the template: every fire would be skipped for want of a task.
    """
    if template is None or not template.strip():
        if kind in ("schedule", "event"):
            raise BadRequest(
                f"a{'n' if kind == 'event' else ''} {kind} subscription needs a task_template: its fires have "
                "no caller to supply the task, so allow_task_override cannot replace it"
            )
        if not allow_task_override:
            raise BadRequest("provide a task_template or set allow_task_override")
        return
    if len(template) > MAX_TASK_CHARS:
        raise BadRequest(f"task_template is over the {MAX_TASK_CHARS} character limit")
    if kind == "schedule":
        require_only(template, set(SCHEDULE_CONTEXT_KEYS), "scheduled fires")
    elif kind == "event":
        require_only(template, set(EVENT_CONTEXT_KEYS), "repository events")
    else:
        placeholders(template)


def check_policy(policy: str) -> str:
    if policy not in CONCURRENCY_POLICIES:
        raise BadRequest(f"unknown concurrency_policy '{policy}' (expected one of: {', '.join(CONCURRENCY_POLICIES)})")
    return policy


def subscription_kind(has_schedule: bool, has_connection: bool) -> Literal["api", "schedule", "event"]:
    if has_schedule and has_connection:
        raise BadRequest("a subscription is either scheduled or event-driven, not both")
    if has_schedule:
        return "schedule"
    return "event" if has_connection else "api"


def event_filter(
    events: list[str] | None, repositories: list[str] | None, publish: list[str] | None
) -> dict[str, list[str]]:
    """The stored filter of an event subscription, validated."""
    chosen = list(DEFAULT_EVENTS) if events is None else list(events)
    if not chosen:
        raise BadRequest("events must name at least one event (or be omitted for the default)")
    unknown = sorted(set(chosen) - set(SUPPORTED_EVENTS))
    if unknown:
        raise BadRequest(f"unsupported event(s): {', '.join(unknown)} (supported: {', '.join(SUPPORTED_EVENTS)})")
    repos = list(repositories or [])
    bad = [r for r in repos if not _REPOSITORY.fullmatch(r)]
    if bad:
        raise BadRequest(f"repository must be 'owner/name' (got '{bad[0]}')")
    targets = list(DEFAULT_PUBLISH) if publish is None else list(publish)
    wrong = sorted(set(targets) - set(PUBLISH_KINDS))
    if wrong:
        raise BadRequest(f"unknown publish target(s): {', '.join(wrong)} (supported: {', '.join(PUBLISH_KINDS)})")
    return {
        "events": sorted(set(chosen)),
        "repositories": sorted({r.lower() for r in repos}),
        "publish": sorted(set(targets)),
    }


# ---- event matching (the ingress arrives later; the decision is here) ----------------------------


@dataclass(frozen=True)
class RepositoryEvent:
    """A normalized pull-request event as the ingress will hand it to the matcher."""

    event: str  # e.g. "pull_request.opened"
    repository: str  # "owner/name"
    pr_number: int
    pr_title: str = ""
    pr_url: str = ""
    pr_author: str = ""
    head_sha: str = ""
    head_ref: str = ""
    base_sha: str = ""
    base_ref: str = ""
    fork: bool = False

    @property
    def action(self) -> str:
        return self.event.partition(".")[2]


def matches(
    filter_doc: dict[str, Any], connection_id: str | None, event_connection_id: str, ev: RepositoryEvent
) -> bool:
    """Whether an event received on ``event_connection_id`` fires a subscription with this filter."""
    if connection_id is None or connection_id != event_connection_id:
        return False
    if ev.event not in filter_doc.get("events", ()):
        return False
    repos = filter_doc.get("repositories") or []
    return not repos or ev.repository.lower() in repos


def event_variables(ev: RepositoryEvent) -> dict[str, str]:
    """The template variables of an event-driven run (exactly EVENT_CONTEXT_KEYS)."""
    return {
        "repository": ev.repository,
        "pr_number": str(ev.pr_number),
        "pr_title": ev.pr_title,
        "pr_url": ev.pr_url,
        "pr_author": ev.pr_author,
        "head_sha": ev.head_sha,
        "head_ref": ev.head_ref,
        "base_sha": ev.base_sha,
        "base_ref": ev.base_ref,
        "action": ev.action,
        "event": ev.event,
        "fork": "true" if ev.fork else "false",
    }


OutcomeKind = Literal["created", "replay", "skipped", "in_flight"]


class FiredRun(Protocol):
    """What a firing reports of its run (the repository's typed run row has these and more)."""

    @property
    def id(self) -> uuid.UUID: ...

    @property
    def status(self) -> str: ...


@dataclass(frozen=True)
class FireOutcome:
    """What one firing did: ``created`` a run, ``replay`` of an earlier one, ``skipped`` (with the
    reason; ``active_run_id`` for an overlap), or ``in_flight`` (an unbound claim holds the key)."""

    outcome: OutcomeKind
    run: FiredRun | None = None
    reason: str | None = None
    active_run_id: str | None = None
    earlier: bool = False  # the key was claimed by an earlier invocation (replay, or its skip)

    @property
    def session_id(self) -> str | None:
        return str(self.run.id) if self.run else None
