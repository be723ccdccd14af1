"""Consolidation survives kill -9 mid-run: after a restart the queued job runs once and
no fact is duplicated. The LLM provider is a FAKE: a scripted OpenAI-compatible server
on loopback, so the real provider client runs."""

import time

from conftest import wait_for


def test_a_run_killed_mid_consolidation_completes_once_after_restart(make_server, tmp_path, fake_llm):
    data = tmp_path / "consolidation"
    env = {"CAIRN_LLM_KIND": "openai", "CAIRN_LLM_BASE_URL": fake_llm.url, "CAIRN_LLM_MODEL": "scripted",
           "CAIRN_LLM_TIMEOUT_MS": "120000", "CAIRN_CONSOLIDATION_RETRY_BASE_MS": "200"}
    first = make_server(data, env).start()
    token = first.mint("acme")
    fake_llm.hold.set()
    said = ["I love the Alps", "I love Kyoto", "I love Patagonia"]
    response = first.call("POST", "/v1/users/ivy/episodes", token,
                          {"messages": [{"role": "user", "content": text} for text in said]})
    assert response.status == 201, response.body
    assert response.json()["consolidation"]["queued"] is True
    assert fake_llm.held.wait(30), "the worker never asked the provider"
    first.kill()

    fake_llm.hold.clear()
    second = make_server(data, env).start()

    def facts():
        items = second.call("GET", "/v1/users/ivy/facts?status=all&limit=100", token).json()["items"]
        return items if len(items) >= 3 else None

    items = wait_for(facts)
    assert items, "the facts did not appear in time"
    texts = sorted(item["text"] for item in items)
    assert texts == ["The user loves Kyoto.", "The user loves Patagonia.", "The user loves the Alps."], texts
    # Nothing left to do: the job is gone and the watermark is past every episode.
    again = second.call("POST", "/v1/users/ivy/consolidate", token, {})
    assert again.status == 200, again.body
    assert again.json()["episodes_read"] == 0
    time.sleep(1.5)
    items = second.call("GET", "/v1/users/ivy/facts?status=all&limit=100", token).json()["items"]
    assert len(items) == 3, "no fact was written twice"
    decisions = second.call("GET", "/v1/users/ivy/decisions?limit=100", token).json()["items"]
    assert sorted(d["kind"] for d in decisions) == ["NEW", "NEW", "NEW"], decisions


def test_the_offline_pipeline_consolidates_in_the_background(server):
    token = server.mint("acme")
    response = server.call("POST", "/v1/users/noa/episodes", token,
                           {"messages": [{"role": "assistant", "content": "Where do you live these days?"},
                                         {"role": "user", "content": "I moved to Porto last spring"}]})
    assert response.status == 201, response.body

    def active():
        items = server.call("GET", "/v1/users/noa/facts", token).json()["items"]
        return items or None

    items = wait_for(active)
    assert items, "the fact did not appear in time"
    assert [item["text"] for item in items] == ["The user moved to Porto last spring."]
    metrics = server.call("GET", "/metrics").body
    assert 'cairn_consolidation_runs_total{result="ok",trigger="job"}' in metrics


def test_sigterm_lets_the_run_in_progress_finish_before_the_process_ends(make_server, tmp_path, fake_llm):
    """A rolling update stops a replica with SIGTERM: it takes no new job, and the run in
    progress finishes (within CAIRN_SHUTDOWN_GRACE_SECONDS) before the process ends, so
    its facts are written when it has exited instead of waiting for the job's lease."""
    import json
    import signal
    import subprocess

    from conftest import binary

    data = tmp_path / "graceful"
    env = {"CAIRN_LLM_KIND": "openai", "CAIRN_LLM_BASE_URL": fake_llm.url, "CAIRN_LLM_MODEL": "scripted",
           "CAIRN_LLM_TIMEOUT_MS": "60000", "CAIRN_SHUTDOWN_GRACE_SECONDS": "20"}
    server = make_server(data, env).start()
    token = server.mint("acme")
    fake_llm.delay = 3.0
    response = server.call("POST", "/v1/users/ivy/episodes", token,
                           {"messages": [{"role": "user", "content": "I love the harbour"}]})
    assert response.status == 201, response.body
    assert wait_for(lambda: fake_llm.extractions >= 1, 30), "the worker never asked the provider"
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=60) == 0, server.log.read_text()

    exported = tmp_path / "ivy.json"
    result = subprocess.run([binary(), "export", "--tenant", "acme", "--user", "ivy", "--out", str(exported)],
                            env=server.env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    document = json.loads(exported.read_text())
    assert [fact["text"] for fact in document["facts"]] == ["The user loves the harbour."], document["facts"]
    assert document["consolidated_episodes"] == 1
