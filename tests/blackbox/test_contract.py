"""The service against its own OpenAPI document: every route's real answers, success
and error, match the declared schemas; then schemathesis fuzzes every route with a
tenant's token and another tenant's memory must come out unchanged."""

import json
import os
import random
import re
import subprocess
import time
from pathlib import Path

from contract import Contract

SESSION = "contract-session"
SNAPSHOT = Path(__file__).resolve().parents[2] / "service/cairn-server/tests/openapi.json"


def tool(name):
    """A command of the API tools' environment (`CAIRN_API_TOOLS`, set by scripts/test),
    or from the PATH."""
    directory = os.environ.get("CAIRN_API_TOOLS")
    return str(Path(directory) / name) if directory else name


def test_every_route_answers_as_its_document_says(make_server):
    # Harsh contradictions wait for a reviewer (CAIRN_REVIEW), so the review routes answer too.
    server = make_server(extra_env={"CAIRN_CONSOLIDATION_WORKER": "false", "CAIRN_REVIEW": "retraction"}).start()
    document = server.call("GET", "/openapi.json").json()
    contract = Contract(document)
    admin = server.mint("acme")
    reader = server.mint("acme", scope="memory:read")

    def call(method, path, body=None, token=admin, expect=None, **kwargs):
        response = contract.check(method, path, server.call(method, path, token=token, body=body, **kwargs))
        if expect is not None:
            assert response.status == expect, f"{method} {path}: {response.status} {response.body[:300]}"
        return response.json() if response.body and response.body.lstrip().startswith(("{", "[")) else response.body

    base = "/v1/users/alice"
    ingested = call("POST", f"{base}/episodes", {
        "messages": [{"role": "user", "content": "I moved to Lisbon last spring."},
                     {"role": "assistant", "content": "How do you like it?"},
                     {"role": "user", "content": "I love hiking in the hills."}],
        "session_id": SESSION, "consolidate": "sync"}, expect=201)
    assert ingested["consolidation"]["ran"] is True
    queued = call("POST", f"{base}/episodes", {"messages": [{"role": "user", "content": "I work at a bakery."}]},
                  expect=201)
    episode_id = ingested["episode_ids"][0]
    call("GET", f"{base}/episodes?limit=2", expect=200)
    call("GET", f"{base}/episodes/{episode_id}", expect=200)

    written = call("POST", f"{base}/facts", {"text": "The user is vegetarian.", "fact_type": "preference"}, expect=201)
    again = call("POST", f"{base}/facts", {"text": "The user is vegetarian."}, expect=200)
    assert again["created"] is False
    doomed = call("POST", f"{base}/facts", {"text": "The user owns a red bicycle."}, expect=201)
    fact_id = written["fact"]["id"]
    call("GET", f"{base}/facts?status=all&limit=5", expect=200)
    call("GET", f"{base}/facts/{fact_id}", expect=200)
    call("POST", f"{base}/facts/{fact_id}/retract", {"reason": "a test"}, expect=200)
    call("POST", f"{base}/facts/{fact_id}/retract", {"reason": "again"}, expect=409)
    history = call("GET", f"{base}/facts/{fact_id}/history", token=reader, expect=200)
    assert fact_id in [fact["id"] for fact in history["items"]]
    tombstones = call("GET", f"{base}/tombstones", token=reader, expect=200)
    assert fact_id in [tombstone["fact_id"] for tombstone in tombstones["items"]]
    call("DELETE", f"{base}/facts/{doomed['fact']['id']}", expect=200)
    call("GET", f"{base}/facts/{doomed['fact']['id']}", expect=404)

    playbook = call("POST", f"{base}/playbooks",
                    {"name": "Deploy", "trigger": "a deploy", "steps": ["test", "ship"]}, expect=201)["playbook"]
    call("GET", f"{base}/playbooks", expect=200)
    call("GET", f"{base}/playbooks/{playbook['id']}", expect=200)
    call("POST", f"{base}/playbooks/{playbook['id']}/versions", {"steps": ["test", "tag", "ship"], "base_version": 1},
         expect=201)
    call("POST", f"{base}/playbooks/{playbook['id']}/versions", {"steps": ["late"], "base_version": 1}, expect=409)
    call("GET", f"{base}/playbooks/{playbook['id']}/versions", expect=200)
    call("POST", f"{base}/playbooks/{playbook['id']}/outcome", {"success": True}, expect=200)

    recalled = call("POST", f"{base}/recall", {"query": "where does the user live", "explain": True,
                                               "include_history": True}, token=reader, expect=200)
    assert recalled["hits"] and "explain" in recalled["hits"][0]
    assert {hit["tier"] for hit in recalled["hits"]} >= {"semantic", "episodic"}
    call("GET", f"{base}/profile?query=hiking&k=3", token=reader, expect=200)
    entities = call("GET", f"{base}/entities", token=reader, expect=200)
    assert "Lisbon" in [entity["name"] for entity in entities["items"]], entities
    call("GET", f"{base}/entities/Lisbon", token=reader, expect=200)
    call("GET", f"{base}/entities/nobody-at-all", token=reader, expect=404)
    answered = call("POST", f"{base}/answer", {"query": "where does the user live?"}, token=reader, expect=200)
    assert answered["known"] is True and answered["citations"], answered
    call("POST", f"{base}/consolidate", {"dry_run": True}, expect=200)
    call("POST", f"{base}/consolidate", raw=b'{"from_start": {}}', expect=422)
    call("POST", f"{base}/consolidate", raw=b'[]', expect=422)
    call("GET", f"{base}/decisions", expect=200)
    retracted = call("GET", f"{base}/decisions?kind=RETRACTED&limit=5", expect=200)["items"]
    assert retracted and {decision["kind"] for decision in retracted} == {"RETRACTED"}
    call("GET", f"{base}/decisions?kind=SOMETIMES", expect=422)
    call("GET", f"{base}/episodes?session_id=s-none", expect=200)
    jobs = call("GET", f"{base}/jobs", expect=200)["items"]
    assert queued["consolidation"]["job_id"] in [job["id"] for job in jobs]
    call("POST", f"{base}/jobs/{jobs[0]['id']}/retry", expect=200)
    call("GET", f"{base}/audit", expect=200)
    call("GET", "/v1/users", expect=200)
    exported = call("GET", f"{base}/export", expect=200)
    call("POST", "/v1/users/bob/import", exported, expect=201)
    call("POST", "/v1/users/carol/import?format=mem0", {"results": [{"memory": "Likes green tea"}]}, expect=201)
    receipt = call("DELETE", "/v1/users/carol", expect=200)
    assert receipt["deleted"]["facts"] == 1

    reviewer = server.mint("acme", scope="memory:review")
    for colour in ("red", "green"):
        blue = call("POST", f"{base}/facts", {"text": f"The user drives a blue car ({colour} test)."}, expect=201)
        held = call("POST", f"{base}/facts", {"text": f"The user drives a {colour} car.",
                                              "supersedes": blue["fact"]["id"], "contradiction": "harsh"}, expect=201)
        assert (held["fact"]["status"], held["decision"]["kind"]) == ("pending", "HELD_FOR_REVIEW"), held
    queue = call("GET", f"{base}/reviews?limit=5", token=reviewer, expect=200)["items"]
    assert [review["kind"] for review in queue] == ["retraction", "retraction"], queue
    tenant_queue = call("GET", "/v1/reviews", token=reviewer, expect=200)
    assert tenant_queue["counts"]["retraction"] == 2, tenant_queue
    call("POST", f"{base}/reviews/{queue[0]['id']}/approve", token=reader, expect=403)
    call("POST", f"{base}/reviews/{queue[0]['id']}/approve", token=reviewer, expect=200)
    call("POST", f"{base}/reviews/{queue[0]['id']}/approve", token=reviewer, expect=409)
    call("POST", f"{base}/reviews/{queue[1]['id']}/reject", {"reason": "never said", "tombstone": True},
         token=reviewer, expect=200)
    call("POST", f"{base}/reviews/rev_none/reject", token=reviewer, expect=404)
    pending = call("POST", f"{base}/recall", {"query": "car", "include_pending": True}, token=reader, expect=200)
    assert "pending" not in {hit["status"] for hit in pending["hits"]}, "both were decided"

    listed = call("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, token=reader,
                  headers={"accept": "application/json, text/event-stream"}, expect=200)
    tools = {tool["name"] for tool in listed["result"]["tools"]}
    assert tools >= {"recall_memory", "write_memory"}
    assert not {name for name in tools if "review" in name or "approve" in name}, "no tool decides on reviews"
    call("GET", "/healthz", expect=200)
    call("GET", "/readyz", expect=200)
    call("GET", "/metrics", expect=200)
    call("GET", "/ui", token=None, expect=200)
    link = server.mint("acme", scope="memory:read", extra=("--ui", "--url", server.base))
    session = call("POST", "/ui/session", {"ticket": link.split("#ticket=", 1)[1]}, token=None, expect=200)
    call("GET", f"{base}/facts", token=session["token"], expect=200)
    call("POST", "/ui/session", {"ticket": "not-a-ticket"}, token=None, expect=401)
    call("GET", "/openapi.json", expect=200)

    # Errors answer with the documented shape and statuses.
    call("GET", f"{base}/facts", token=None, expect=401)
    call("POST", f"{base}/facts", {"text": "x"}, token=reader, expect=403)
    call("POST", f"{base}/facts", {"text": "x", "nonsense": 1}, expect=422)
    call("POST", f"{base}/recall", {"query": "x", "k": 0}, expect=422)
    call("GET", f"{base}/profile?k=101", expect=422)
    call("POST", f"{base}/facts", {"text": "x" * 3_000_000}, expect=413)
    call("GET", f"{base}/episodes?cursor=nonsense", expect=422)
    wrong = server.call("PUT", f"{base}/facts")
    assert wrong.status == 405 and "GET" in wrong.headers.get("Allow", wrong.headers.get("allow", "")), wrong.body
    assert wrong.json()["error"]["code"] == "method_not_allowed"

    untested = {operation["operationId"] for methods in document["paths"].values() for operation in methods.values()}
    untested -= {operation for operation, statuses in contract.answered.items() if any(200 <= s < 300 for s in statuses)}
    assert not untested, f"operations never answered with success: {sorted(untested)}"


def seed(server, token, user):
    for text in ["I live in Oslo.", "I have a cat called Miso."]:
        response = server.call("POST", f"/v1/users/{user}/episodes", token=token,
                               body={"messages": [{"role": "user", "content": text}], "consolidate": "sync"})
        assert response.status == 201, response.body
    response = server.call("POST", f"/v1/users/{user}/facts", token=token, body={"text": "The user prefers tea."})
    assert response.status == 201, response.body


def snapshot(server, token, user):
    exported = server.call("GET", f"/v1/users/{user}/export", token=token).json()
    exported.pop("exported_at")
    users = server.call("GET", "/v1/users", token=token).json()
    for entry in users["items"]:
        entry.pop("last_activity")
    return exported, users


def test_schemathesis_finds_nothing_and_no_tenant_state_leaks(make_server):
    server = make_server(extra_env={"CAIRN_MAX_BODY_BYTES": "65536"}).start()
    fuzzer = server.mint("fuzz-tenant")
    other = server.mint("other-tenant")
    seed(server, other, "bystander")
    seed(server, fuzzer, "0")
    before = snapshot(server, other, "bystander")

    seed_value = os.environ.get("CAIRN_FUZZ_SEED") or str(random.randrange(1 << 31))
    examples = os.environ.get("CAIRN_FUZZ_EXAMPLES", "50")
    started = time.monotonic()
    result = subprocess.run(
        [tool("st"), "--config-file", str(Path(__file__).with_name("schemathesis.toml")),
         "run", f"{server.base}/openapi.json", "--url", server.base,
         "-H", f"Authorization: Bearer {fuzzer}",
         "--exclude-operation-id", "mcp", "--max-examples", examples, "--workers", "2",
         "--seed", seed_value, "--no-color"],
        capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - started
    output = result.stdout + result.stderr
    cases = re.search(r"(\d+) generated", output)
    print(f"schemathesis: seed {seed_value}, {cases.group(1) if cases else '?'} cases in {seconds:.0f} s")
    problems = output[output.find(" ERRORS "):] if " ERRORS " in output else output
    problems = problems[problems.find(" FAILURES "):] if " FAILURES " in problems else problems
    assert result.returncode == 0, problems[:8000]
    assert cases and int(cases.group(1)) >= 500, output[-2000:]

    after = snapshot(server, other, "bystander")
    assert after == before, "the fuzzed tenant's requests changed another tenant's memory"
    log = server.log.read_text(errors="replace")
    assert "panicked" not in log, log[-3000:]


def test_a_python_client_generates_from_the_document_without_warnings(tmp_path):
    """openapi-python-client reads the document (the reviewed snapshot, which the Rust
    tests hold equal to the served one) and writes a client without a warning."""
    environment = dict(os.environ)
    environment["PATH"] = str(Path(tool("ruff")).parent) + os.pathsep + environment.get("PATH", "")
    result = subprocess.run([tool("openapi-python-client"), "generate", "--path", str(SNAPSHOT)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300, env=environment)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Warning" not in output and "Error" not in output, output
    package = tmp_path / "cairn-client" / "cairn_client"
    assert (package / "api" / "recall" / "recall.py").is_file(), sorted(p.name for p in package.rglob("*.py"))[:40]
    compiled = subprocess.run(["python3", "-m", "compileall", "-q", str(package)], capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
