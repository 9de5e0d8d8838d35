"""Trigger subscriptions, pure parts: token shapes, invocation limits, narrowing, event matching."""

from __future__ import annotations

import secrets

import pytest

from core.errors import BadRequest
from core.triggers import (
    EVENT_CONTEXT_KEYS,
    MAX_CONTEXT_BYTES,
    RepositoryEvent,
    callback_context,
    callback_secret,
    check_idempotency_key,
    check_template,
    context_variables,
    event_filter,
    event_variables,
    is_within,
    looks_like_trigger_token,
    matches,
    narrow_workspace,
    request_digest,
    subscription_kind,
    trigger_token,
)

BASE = {"kind": "local_copy", "path": "/srv/repos/app"}
CONN = "0192f000-0000-7000-8000-000000000001"


def test_tokens_have_the_documented_shapes() -> None:
    raw = secrets.token_hex(32)
    assert trigger_token(raw) == "fbx_trig_" + raw and looks_like_trigger_token(trigger_token(raw))
    assert callback_secret(raw) == "fbx_whsec_" + raw
    for bad in ("abc", raw.upper(), raw + "0"):
        with pytest.raises(ValueError):
            trigger_token(bad)
    assert not looks_like_trigger_token("fbx_sess_" + raw)
    assert callback_context("s1") == "subscription:s1:callback"


def test_context_values_must_be_scalars_and_fit_8_kib() -> None:
    assert context_variables({"n": 3, "ok": False, "f": 1.5, "s": "x"}) == {
        "n": "3",
        "ok": "false",
        "f": "1.5",
        "s": "x",
    }
    assert context_variables(None) == {}
    with pytest.raises(BadRequest, match=r"context\.x must be a string, number or boolean"):
        context_variables({"x": [1]})
    with pytest.raises(BadRequest, match="over the 8192 byte limit"):
        context_variables({"big": "a" * MAX_CONTEXT_BYTES})


def test_request_digest_ignores_key_order_but_not_values() -> None:
    a = request_digest(None, {"x": 1, "y": "2"}, None)
    assert a == request_digest(None, {"y": "2", "x": 1}, None)
    assert a != request_digest(None, {"x": 2, "y": "2"}, None)
    assert a != request_digest("task", {"x": 1, "y": "2"}, None)
    assert request_digest(None, None, None) == request_digest(None, {}, None)


def test_idempotency_keys_are_bounded_printable_ascii() -> None:
    assert check_idempotency_key("order-17:retry") == "order-17:retry"
    for bad in ("", "a" * 201, "has space", "tab\t", "ünï"):
        with pytest.raises(BadRequest, match="Idempotency-Key"):
            check_idempotency_key(bad)


def test_callers_cannot_claim_the_keys_the_server_mints_for_its_own_fires() -> None:
    for reserved in ("sched:2030-01-01T09:00:00Z", "SCHED:x", "run-now:1", "auto-abc"):
        with pytest.raises(BadRequest, match="reserved"):
            check_idempotency_key(reserved)
    assert check_idempotency_key("schedule-17") == "schedule-17"


def test_a_workspace_override_narrows_to_a_subdirectory_only() -> None:
    assert narrow_workspace(BASE, {"path": "/srv/repos/app/pkg/"}) == {
        "kind": "local_copy",
        "path": "/srv/repos/app/pkg",
    }
    assert narrow_workspace(BASE, {}) == BASE
    for path in ("/srv/repos/app/../other", "/srv/repos/application", "/etc", "/srv/repos"):
        with pytest.raises(BadRequest, match="must stay inside"):
            narrow_workspace(BASE, {"path": path})
    with pytest.raises(BadRequest, match="absolute"):
        narrow_workspace(BASE, {"path": "pkg"})


def test_a_workspace_override_cannot_retarget_or_invent_refs() -> None:
    with pytest.raises(BadRequest, match="another repository"):
        narrow_workspace(BASE, {"repository": "acme/other"})
    for field in ("ref", "commit_sha"):
        with pytest.raises(BadRequest, match=f"workspace.{field}"):
            narrow_workspace(BASE, {field: "main"})
    with pytest.raises(BadRequest, match="scratch: there is nothing to narrow"):
        narrow_workspace(None, {"path": "/tmp"})
    with pytest.raises(BadRequest, match="unknown workspace override field"):
        narrow_workspace(BASE, {"kind": "scratch"})


def test_is_within_is_component_wise() -> None:
    assert is_within("/a/b", "/a/b") and is_within("/a/b", "/a/b/c") and is_within("/", "/x")
    assert not is_within("/a/b", "/a/bc") and not is_within("/a/b", "/a")


def test_templates_must_be_renderable_from_what_the_kind_supplies() -> None:
    check_template("api", "Handle {{anything}}", False)
    check_template("schedule", "Run at {{fire_time}}", False)
    check_template("event", "Review {{repository}}#{{pr_number}} by {{pr_author}}", False)
    check_template("api", None, True)
    with pytest.raises(BadRequest, match="provide a task_template or set allow_task_override"):
        check_template("api", "  ", False)
    for kind in ("schedule", "event"):
        for template in (None, " "):
            with pytest.raises(
                BadRequest, match=f"{kind} subscription needs a task_template: its fires have no caller"
            ):
                check_template(kind, template, True)
    with pytest.raises(BadRequest, match="scheduled fires only supply fire_time"):
        check_template("schedule", "For {{customer}}", False)
    with pytest.raises(BadRequest, match="repository events only supply"):
        check_template("event", "{{fire_time}}", False)


def test_a_subscription_is_scheduled_or_event_driven_not_both() -> None:
    assert subscription_kind(False, False) == "api"
    assert subscription_kind(True, False) == "schedule"
    assert subscription_kind(False, True) == "event"
    with pytest.raises(BadRequest, match="either scheduled or event-driven, not both"):
        subscription_kind(True, True)


def test_event_filter_defaults_and_refusals() -> None:
    assert event_filter(None, None, None) == {
        "events": ["pull_request.opened", "pull_request.reopened"],
        "repositories": [],
        "publish": ["pr_comment"],
    }
    doc = event_filter(["pull_request.synchronize"], ["Acme/App"], ["check", "pr_comment"])
    assert doc == {
        "events": ["pull_request.synchronize"],
        "repositories": ["acme/app"],
        "publish": ["check", "pr_comment"],
    }
    with pytest.raises(BadRequest, match="at least one event"):
        event_filter([], None, None)
    with pytest.raises(BadRequest, match=r"unsupported event\(s\): push"):
        event_filter(["push"], None, None)
    with pytest.raises(BadRequest, match="repository must be 'owner/name'"):
        event_filter(None, ["just-a-name"], None)
    with pytest.raises(BadRequest, match="unknown publish target"):
        event_filter(None, None, ["email"])


def _pr(event: str = "pull_request.opened", repository: str = "acme/app") -> RepositoryEvent:
    return RepositoryEvent(event=event, repository=repository, pr_number=42, pr_author="octo", head_sha="abc")


def test_matching_needs_the_same_connection_a_listed_event_and_a_listed_repository() -> None:
    doc = event_filter(None, ["acme/app"], None)
    assert matches(doc, CONN, CONN, _pr())
    assert matches(doc, CONN, CONN, _pr(repository="ACME/App"))  # GitHub names are case-insensitive
    assert not matches(doc, CONN, "0192f000-0000-7000-8000-000000000002", _pr())
    assert not matches(doc, None, CONN, _pr())
    assert not matches(doc, CONN, CONN, _pr(event="pull_request.synchronize"))
    assert not matches(doc, CONN, CONN, _pr(repository="acme/other"))
    everything = event_filter(["pull_request.synchronize"], [], None)
    assert matches(everything, CONN, CONN, _pr(event="pull_request.synchronize", repository="any/repo"))


def test_event_variables_are_exactly_the_documented_keys() -> None:
    out = event_variables(_pr(event="pull_request.reopened"))
    assert set(out) == EVENT_CONTEXT_KEYS
    assert out["action"] == "reopened" and out["pr_number"] == "42" and out["fork"] == "false"
