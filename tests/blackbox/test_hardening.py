"""Regression tests for defects found by an adversarial review, against the real binary
on the embedded store and on each search-cluster engine whose test node is set
(CAIRN_TEST_OPENSEARCH_URL, CAIRN_TEST_ELASTICSEARCH_URL)."""

import contextlib
import threading
import time
import uuid

import pytest

from conftest import cluster_url, delete_indices

BACKENDS = ["embedded", "opensearch", "elasticsearch"]


@contextlib.contextmanager
def served(make_server, data_dir, backend, extra_env=None):
    """A ready server on `backend` and an admin token of tenant acme; the server is
    stopped and its indices deleted afterwards."""
    env = dict(extra_env or {})
    prefix = url = None
    if backend != "embedded":
        url = cluster_url(backend)
        prefix = f"cairn-bb-{uuid.uuid4().hex[:12]}"
        env.update({"CAIRN_BACKEND": backend, "CAIRN_CLUSTER_URL": url, "CAIRN_INDEX_PREFIX": prefix})
    server = make_server(data_dir, env).start()
    try:
        token = server.mint("acme")
        ready(server)
        yield server, token
    finally:
        server.stop()
        if prefix:
            delete_indices(url, prefix)


def ready(server):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.call("GET", "/readyz").status == 200:
            return
        time.sleep(0.25)
    raise AssertionError("the server never became ready")


def nothing_left(server, token, user):
    facts = server.call("GET", f"/v1/users/{user}/facts?status=all&limit=100", token).json()["items"]
    decisions = server.call("GET", f"/v1/users/{user}/decisions?limit=100", token).json()["items"]
    hits = server.call("POST", f"/v1/users/{user}/recall", token,
                       {"query": "which places does the user love"}).json()["hits"]
    return facts, decisions, hits


def run_and_erase(server, token, user, delay):
    """Starts a consolidation run, erases the user `delay` seconds later; returns both answers."""
    answers = {}

    def consolidate():
        answers["run"] = server.call("POST", f"/v1/users/{user}/consolidate", token, {})

    runner = threading.Thread(target=consolidate)
    runner.start()
    time.sleep(delay)
    answers["erase"] = server.call("DELETE", f"/v1/users/{user}", token)
    runner.join(60)
    return answers["run"], answers["erase"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_erasure_during_a_held_up_consolidation_leaves_nothing(make_server, tmp_path, fake_llm, backend):
    env = {"CAIRN_LLM_KIND": "openai", "CAIRN_LLM_BASE_URL": fake_llm.url, "CAIRN_LLM_MODEL": "scripted",
           "CAIRN_LLM_TIMEOUT_MS": "30000"}
    with served(make_server, tmp_path / "held", backend, env) as (server, token):
        said = [f"I love the village number {index}" for index in range(20)]
        ingest = server.call("POST", "/v1/users/eve/episodes", token,
                             {"messages": [{"role": "user", "content": text} for text in said],
                              "consolidate": "none"})
        assert ingest.status == 201, ingest.body
        # The provider holds the extraction up, so the erasure lands mid-run.
        fake_llm.delay = 1.5
        run, erase = run_and_erase(server, token, "eve", 0.3)
        assert erase.status == 200, erase.body
        assert erase.json()["deleted"]["episodes"] == 20, erase.body
        assert run.status == 409 and run.json()["error"]["code"] == "scope_erased", run.body
        time.sleep(2.0)
        assert nothing_left(server, token, "eve") == ([], [], [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_erasure_racing_an_offline_consolidation_leaves_nothing(make_server, tmp_path, backend):
    """The review's reproduction: 20 first-person messages, a run, an erasure a few
    milliseconds later; at several offsets so the erasure lands before, during and
    after the run's commit."""
    with served(make_server, tmp_path / "offline", backend) as (server, token):
        for round_, delay in enumerate([0.0, 0.005, 0.02, 0.05, 0.1, 0.2]):
            user = f"eve{round_}"
            said = [f"I love the town number {index} of round {round_}" for index in range(20)]
            ingest = server.call("POST", f"/v1/users/{user}/episodes", token,
                                 {"messages": [{"role": "user", "content": text} for text in said],
                                  "consolidate": "none"})
            assert ingest.status == 201, ingest.body
            run, erase = run_and_erase(server, token, user, delay)
            assert erase.status == 200, erase.body
            receipt = erase.json()["deleted"]
            assert receipt["episodes"] == 20, receipt
            assert run.status in (200, 409), run.body
            facts, decisions, hits = nothing_left(server, token, user)
            assert (facts, decisions, hits) == ([], [], []), (delay, receipt, run.body, facts[:2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_recall_cannot_multiply_its_work_by_repeating_a_tier(make_server, tmp_path, backend):
    with served(make_server, tmp_path / "tiers", backend) as (server, token):
        assert server.call("POST", "/v1/users/ada/facts", token, {"text": "The user drinks green tea"}).status == 201
        # About 85,000 copies fit in the default 1 MiB body (as sent here).
        flood = server.call("POST", "/v1/users/ada/recall", token,
                            {"query": "tea", "tiers": ["semantic"] * 85_000})
        assert flood.status == 422, flood.body
        assert flood.json()["error"]["code"] == "invalid_request"
        once = server.call("POST", "/v1/users/ada/recall", token, {"query": "tea", "tiers": ["semantic"]}).json()
        twice = server.call("POST", "/v1/users/ada/recall", token,
                            {"query": "tea", "tiers": ["semantic", "semantic"]}).json()
        assert [hit["id"] for hit in once["hits"]] == [hit["id"] for hit in twice["hits"]] != []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tombstone_is_lifted_only_by_a_newer_restatement(make_server, tmp_path, backend):
    with served(make_server, tmp_path / "reassert", backend) as (server, token):
        said = server.call("POST", "/v1/users/bo/episodes", token,
                           {"messages": [{"role": "user", "content": "I am allergic to cats"}], "consolidate": "none"})
        assert said.status == 201, said.body
        old_evidence = said.json()["episode_ids"][0]
        created = server.call("POST", "/v1/users/bo/facts", token, {"text": "The user is allergic to cats"})
        fact_id = created.json()["fact"]["id"]
        assert server.call("POST", f"/v1/users/bo/facts/{fact_id}/retract", token, {}).status == 200

        refused = server.call("POST", "/v1/users/bo/facts", token, {"text": "The user is allergic to cats"})
        assert refused.status == 409 and refused.json()["error"]["code"] == "tombstoned", refused.body
        assert "reassert" not in refused.json()["error"]["message"]
        # A write token alone, or an episode older than the tombstone, lifts nothing.
        for body in [{"reassert": True}, {"reassert": True, "evidence_episode_id": old_evidence}]:
            again = server.call("POST", "/v1/users/bo/facts", token, {"text": "The user is allergic to cats", **body})
            assert again.status == 409 and again.json()["error"]["code"] == "tombstoned", again.body

        restated = server.call("POST", "/v1/users/bo/episodes", token,
                               {"messages": [{"role": "user", "content": "It turns out I really am allergic to cats"}],
                                "consolidate": "none"})
        evidence = restated.json()["episode_ids"][0]
        lifted = server.call("POST", "/v1/users/bo/facts", token,
                             {"text": "The user is allergic to cats", "reassert": True})
        assert lifted.status == 201, lifted.body
        assert lifted.json()["fact"]["source_episode_ids"] == [evidence]
        trail = server.call("GET", "/v1/users/bo/audit?limit=100", token).json()["items"]
        actions = [event["action"] for event in trail]
        assert "tombstone.lift" in actions and actions.count("fact.write_refused") == 3, actions


@pytest.mark.parametrize("backend", BACKENDS)
def test_explained_scores_do_not_depend_on_other_tenants_memory(make_server, tmp_path, backend):
    with served(make_server, tmp_path / "statistics", backend) as (server, token):
        for text in ["The user runs marathons in Lisbon", "The user collects vintage cameras",
                     "The user keeps cameras in a drawer"]:
            assert server.call("POST", "/v1/users/ada/facts", token, {"text": text}).status == 201

        def explained():
            answer = server.call("POST", "/v1/users/ada/recall", token,
                                 {"query": "lisbon cameras", "tiers": ["semantic"], "explain": True})
            assert answer.status == 200, answer.body
            return {hit["id"]: hit["explain"]["bm25_score"] for hit in answer.json()["hits"]}

        before = explained()
        assert len(before) == 3 and all(score > 0 for score in before.values()), before
        # Another tenant (same user id) and another user of the tenant store the words at scale.
        for other, user in [(server.mint("evil"), "ada"), (token, "bob")]:
            for index in range(25):
                text = f"The user has cameras number {index}" + (" from Lisbon" if index % 5 == 0 else "")
                assert server.call("POST", f"/v1/users/{user}/facts", other, {"text": text}).status == 201
        after = explained()
        assert before.keys() == after.keys()
        for fact_id, score in before.items():
            assert abs(score - after[fact_id]) < 1e-9, (before, after)
