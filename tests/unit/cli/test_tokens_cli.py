"""`crater tokens` on a keys file: the token printed once, only its hash kept; list; revoke."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from crater.cli.main import app
from crater.gateway.apikeys import Scope, read_keys_file, token_hash

runner = CliRunner()


def test_create_list_revoke_on_a_keys_file(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    made = runner.invoke(
        app,
        [
            "tokens",
            "create",
            "--tenant",
            "a",
            "--scope",
            "submit",
            "--scope",
            "read",
            "--name",
            "ci",
            "--file",
            str(keys),
        ],
    )
    assert made.exit_code == 0, made.output
    token = made.stdout.splitlines()[0]
    assert token.startswith("crt_")
    assert token not in keys.read_text()
    [key] = read_keys_file(keys)
    assert key.hash == token_hash(token)
    assert (key.tenant, key.scopes, key.name) == ("a", [Scope.READ, Scope.SUBMIT], "ci")

    listed = runner.invoke(app, ["tokens", "list", "--json", "--file", str(keys)])
    assert listed.exit_code == 0, listed.output
    [line] = [json.loads(x) for x in listed.stdout.splitlines()]
    assert (line["id"], line["revoked"]) == (key.key_id, None)
    assert token not in listed.stdout

    revoked = runner.invoke(app, ["tokens", "revoke", key.key_id, "--file", str(keys)])
    assert revoked.exit_code == 0, revoked.output
    [after] = read_keys_file(keys)
    assert after.revoked is not None

    ambiguous = runner.invoke(app, ["tokens", "revoke", "abc", "--file", str(keys)])
    assert ambiguous.exit_code != 0


def test_an_unknown_scope_is_refused(tmp_path: Path) -> None:
    made = runner.invoke(
        app, ["tokens", "create", "--tenant", "a", "--scope", "root", "--file", str(tmp_path / "k")]
    )
    assert made.exit_code != 0
    assert not (tmp_path / "k").exists()
