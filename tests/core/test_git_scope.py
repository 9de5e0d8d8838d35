"""Where a stored git credential may be sent: only to repositories under its connection's base URL."""

from __future__ import annotations

import pytest

from core.errors import BadRequest
from core.runspec import WorkspaceSpec, repository_in_scope, workspace_doc


@pytest.mark.parametrize(
    ("base", "url", "ok"),
    [
        ("https://git.example.com/team", "https://git.example.com/team/app.git", True),
        ("https://git.example.com/team/", "https://git.example.com/team/sub/app.git", True),
        ("https://git.example.com", "https://git.example.com/anyone/app.git", True),
        ("https://git.example.com/team/app.git", "https://git.example.com/team/app.git", True),
        ("https://git.example.com/team", "https://git.example.com/team-other/app.git", False),
        ("https://git.example.com/team", "https://evil.example.com/team/app.git", False),
        ("https://git.example.com/team", "https://git.example.com.evil.net/team/app.git", False),
        ("https://git.example.com/team", "https://git.example.com:8443/team/app.git", False),
        ("https://git.example.com/team", "http://git.example.com/team/app.git", False),
    ],
)
def test_a_credential_goes_only_to_repositories_under_its_base_url(base: str, url: str, ok: bool) -> None:
    assert repository_in_scope(base, url) is ok


def test_a_workspace_names_its_credential_by_id_and_never_inline() -> None:
    cid = "01a23b40-da9e-79a4-8023-e2a6fa152508"
    doc = workspace_doc(WorkspaceSpec(kind="git_repository", url="https://git.example.com/a.git", credential=cid))
    assert doc == {"kind": "git_repository", "url": "https://git.example.com/a.git", "ref": None, "credential": cid}
    plain = workspace_doc(WorkspaceSpec(kind="git_repository", url="http://127.0.0.1:8080/a.git"))
    assert plain is not None and "credential" not in plain
    for url, credential, message in [
        ("https://git.example.com/a.git", "user:token", "id of a `git` connection"),
        ("https://x:y@git.example.com/a.git", None, "must not carry credentials"),
        ("http://git.example.com/a.git", None, "https://"),
        ("file:///srv/a", cid, "takes no `credential`"),
    ]:
        with pytest.raises(BadRequest, match=message.replace("(", r"\(")):
            workspace_doc(WorkspaceSpec(kind="git_repository", url=url, credential=credential))
