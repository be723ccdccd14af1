"""The getting-started walk-through (docs/src/getting-started.md) against the real binary: ingest, write, supersede, recall, retract, erase."""


def test_walkthrough(server):
    token = server.mint("acme")
    porto = server.call("POST", "/v1/users/alice/episodes", token, {
        "session_id": "s1", "consolidate": "sync",
        "messages": [{"role": "user", "content": "I live in Porto"}],
    })
    assert porto.status == 201, porto.body
    ingest = server.call("POST", "/v1/users/alice/episodes", token, {
        "session_id": "s1", "consolidate": "sync",
        "messages": [
            {"role": "assistant", "content": "How is the new job going?"},
            {"role": "user", "content": "I just moved to Lisbon for a job at Nimbus"},
        ],
    })
    assert ingest.status == 201, ingest.body
    assert len(ingest.json()["episode_ids"]) == 1
    run = ingest.json()["consolidation"]["run"]
    assert [d["kind"] for d in run["decisions"]] == ["UPDATES"], run
    decisions = server.call("GET", "/v1/users/alice/decisions", token).json()["items"]
    assert [d["kind"] for d in decisions] == ["UPDATES", "NEW"]

    first = server.call("POST", "/v1/users/alice/facts", token, {"text": "The user works in marketing", "fact_type": "identity"})
    assert first.status == 201, first.body
    first_id = first.json()["fact"]["id"]
    second = server.call("POST", "/v1/users/alice/facts", token,
                         {"text": "The user works in sales", "fact_type": "identity", "supersedes": first_id})
    assert second.status == 201, second.body
    assert second.json()["decision"]["kind"] == "UPDATES"

    recall = server.call("POST", "/v1/users/alice/recall", token, {"query": "Where does the user live?", "explain": True})
    assert recall.status == 200
    hits = recall.json()["hits"]
    texts = [hit["text"] for hit in hits]
    assert "The user just moved to Lisbon for a job at Nimbus." in texts
    assert "The user lives in Porto." not in texts
    assert all("explain" in hit for hit in hits)

    retract = server.call("POST", f"/v1/users/alice/facts/{second.json()['fact']['id']}/retract", token, {"reason": "never said"})
    assert retract.status == 200 and retract.json()["fact"]["status"] == "retracted"
    again = server.call("POST", "/v1/users/alice/facts", token, {"text": "The user works in sales"})
    assert again.status == 409 and again.json()["error"]["code"] == "tombstoned"
    dry = server.call("POST", "/v1/users/alice/consolidate", token, {"from_start": True, "dry_run": True})
    assert dry.status == 200 and dry.json()["episodes_read"] == 2

    erase = server.call("DELETE", "/v1/users/alice", token)
    assert erase.status == 200
    assert erase.json()["deleted"]["facts"] == 4
    assert erase.json()["deleted"]["episodes"] == 2
    listed = server.call("GET", "/v1/users/alice/facts?status=all", token)
    assert listed.json()["items"] == []


def test_openapi_and_probes_need_no_token(server):
    assert server.call("GET", "/healthz").status == 200
    assert server.call("GET", "/readyz").status == 200
    document = server.call("GET", "/openapi.json").json()
    assert "/v1/users/{user}/recall" in document["paths"]
    assert server.call("GET", "/v1/users/alice/facts").status == 401
