"""`cairn export` and `cairn import` through the real binary, on both backends: a user
exported, erased and imported answers as before, with tombstones still blocking; a mem0
document comes in through the write gates."""

import json
import subprocess

import pytest

from conftest import REPO, binary
from test_hardening import BACKENDS, served

QUERIES = ["where does the user live", "which instrument does the user play", "what does the user own"]


def cli(args, env, timeout=300):
    return subprocess.run([binary(), *args], env=env, capture_output=True, text=True, timeout=timeout)


def answers(server, token):
    result = []
    for query in QUERIES:
        answer = server.call("POST", "/v1/users/ada/recall", token, {"query": query, "k": 3, "tiers": ["semantic"]})
        assert answer.status == 200, answer.body
        result.append([(hit["text"], hit["status"]) for hit in answer.json()["hits"]])
    return result


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_user_exported_erased_and_imported_answers_as_before(make_server, tmp_path, backend):
    embedded = backend == "embedded"
    with served(make_server, tmp_path / "portability", backend) as (server, token):
        for text in ["The user lives in Porto", "The user plays the oboe", "The user owns a kiln"]:
            assert server.call("POST", "/v1/users/ada/facts", token, {"text": text}).status == 201
        moved = server.call("POST", "/v1/users/ada/facts", token, {"text": "The user lives in Braga"}).json()
        kiln = server.call("GET", "/v1/users/ada/facts?limit=10", token).json()["items"]
        kiln_id = next(fact["id"] for fact in kiln if fact["text"] == "The user owns a kiln")
        assert server.call("POST", f"/v1/users/ada/facts/{kiln_id}/retract", token, {}).status == 200
        assert moved["fact"]["id"]
        before = answers(server, token)

        out = tmp_path / "ada.json"
        export = ["export", "--tenant", "acme", "--user", "ada", "--out", str(out)]
        if embedded:
            refused = cli(export, server.env)
            assert refused.returncode != 0 and "while the service runs" in refused.stderr, refused.stderr
            server.stop()
        exported = cli(export, server.env)
        assert exported.returncode == 0, exported.stderr
        document = json.loads(out.read_text())
        assert document["format"] == "cairn-export" and len(document["facts"]) == 4
        assert (out.stat().st_mode & 0o777) == 0o600
        if embedded:
            server.start()
        assert server.call("DELETE", "/v1/users/ada", token).status == 200
        if embedded:
            server.stop()
        imported = cli(["import", "--tenant", "acme", "--user", "ada", "--from", str(out)], server.env)
        assert imported.returncode == 0, imported.stderr
        assert json.loads(imported.stdout)["imported"]["facts"] == 4
        again = cli(["import", "--tenant", "acme", "--user", "ada", "--from", str(out)], server.env)
        assert again.returncode != 0 and "erase the user first" in again.stderr, again.stderr

        mem0 = cli(["import", "--tenant", "acme", "--user", "alice", "--format", "mem0",
                    "--from", str(REPO / "tests/fixtures/mem0_get_all.json")], server.env)
        assert mem0.returncode == 0, mem0.stderr
        assert json.loads(mem0.stdout)["imported"] == {"created": 4, "duplicates": 0, "tombstoned": 0}
        if embedded:
            server.start()
        assert answers(server, token) == before
        blocked = server.call("POST", "/v1/users/ada/facts", token, {"text": "The user owns a kiln"})
        assert blocked.status == 409 and blocked.json()["error"]["code"] == "tombstoned", blocked.body
        alice = server.call("POST", "/v1/users/alice/recall", token, {"query": "cricket", "k": 1}).json()
        assert alice["hits"][0]["text"] == "Likes to play cricket on weekends"
