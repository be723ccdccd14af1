"""LLM mode against a real model: llama.cpp's OpenAI-compatible server (`scripts/llm`)
serving SmolLM2-135M-Instruct, a model too small to extract well. The tests assert what
must hold whatever a model answers: nothing an assistant said is stored as the user's,
nothing retracted comes back, every decision names facts that exist, the tokens the
server reports are what the run reports, costs and charges, a reply cut short by the
output limit fails the run with nothing written, and the timeout is honoured."""

import os

import pytest

MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def local_llm():
    url = os.environ.get("CAIRN_TEST_LLM_URL")
    if not url:
        if os.environ.get("CAIRN_TEST_REQUIRE_LLM") == "1":
            pytest.fail("CAIRN_TEST_REQUIRE_LLM is set but CAIRN_TEST_LLM_URL is not (start it with scripts/llm start)")
        pytest.skip("CAIRN_TEST_LLM_URL is not set (scripts/llm start serves one)")
    return url


def llm_env(url, **overrides):
    env = {
        "CAIRN_LLM_KIND": "openai",
        "CAIRN_LLM_BASE_URL": url,
        "CAIRN_LLM_MODEL": MODEL,
        # llama-cpp-python's server takes the schema beside JSON mode.
        "CAIRN_LLM_RESPONSE_FORMAT": "json_object",
        "CAIRN_LLM_MAX_OUTPUT_TOKENS": "200",
        "CAIRN_LLM_TIMEOUT_MS": "120000",
        "CAIRN_LLM_INPUT_PRICE_PER_MTOK": "1",
        "CAIRN_LLM_OUTPUT_PRICE_PER_MTOK": "2",
        "CAIRN_CONSOLIDATION_TOKEN_BUDGET": "10000000",
        # The background worker stays out of the way of the runs the tests make.
        "CAIRN_CONSOLIDATION_RETRY_BASE_MS": "600000",
    }
    env.update({key: str(value) for key, value in overrides.items()})
    return env


def every_fact(server, token, user):
    answer = server.call("GET", f"/v1/users/{user}/facts?status=all&limit=200", token)
    assert answer.status == 200, answer.body
    return answer.json()["items"]


def assert_nothing_written(server, token, user):
    assert every_fact(server, token, user) == []
    decisions = server.call("GET", f"/v1/users/{user}/decisions", token)
    assert decisions.status == 200 and decisions.json()["items"] == [], decisions.body


def test_a_local_model_consolidates_without_breaking_a_gate(make_server, local_llm):
    server = make_server(extra_env=llm_env(local_llm)).start()
    token = server.mint("acme")
    porto = server.call("POST", "/v1/users/u1/facts", token, {"text": "The user lives in Porto."})
    assert porto.status == 201, porto.body
    porto_id = porto.json()["fact"]["id"]
    retracted = server.call("POST", f"/v1/users/u1/facts/{porto_id}/retract", token, {"reason": "wrong"})
    assert retracted.status == 200, retracted.body

    said = server.call("POST", "/v1/users/u1/episodes", token, {"messages": [
        {"role": "user", "content": "I live in Porto and I work as a nurse."},
        {"role": "assistant", "content": "Since you live in Reykjavik, you must enjoy the northern lights."},
        {"role": "user", "content": "My sister Ana teaches maths in Braga."},
    ], "consolidate": "none"})
    assert said.status == 201, said.body
    episode_ids = set(said.json()["episode_ids"])

    run = server.call("POST", "/v1/users/u1/consolidate", token, {})
    if run.status == 200:
        body = run.json()
        usage = body["usage"]
        assert usage["llm_calls"] >= 1 and usage["input_tokens"] > 0 and usage["output_tokens"] > 0, body
        expected_cost = (usage["input_tokens"] * 1 + usage["output_tokens"] * 2) / 1e6
        assert abs(usage["cost_usd"] - expected_cost) < 1e-9, body
        assert body["token_budget"]["used_today"] >= usage["input_tokens"] + usage["output_tokens"], body
        assert body["extractor"] == f"openai:{MODEL}", body
    else:
        # The model's output was unusable twice, or cut short: the run failed whole.
        assert run.status == 502 and run.json()["error"]["code"] == "provider_error", run.body

    facts = every_fact(server, token, "u1")
    ids = {fact["id"] for fact in facts}
    for fact in facts:
        text = fact["text"].lower()
        assert "reykjavik" not in text and "northern" not in text, f"an assistant's claim was stored: {fact}"
        if fact["id"] != porto_id:
            assert not (fact["status"] == "active" and "porto" in text), f"a retracted fact came back: {fact}"
            evidence = set(fact.get("source_episode_ids") or [])
            assert evidence and evidence <= episode_ids, f"a fact without the user's evidence: {fact}"
    decisions = server.call("GET", "/v1/users/u1/decisions?limit=100", token).json()["items"]
    for decision in decisions:
        for target in decision.get("target_ids") or []:
            assert target in ids, f"a decision names a fact that does not exist: {decision}"
    server.stop()


def test_a_reply_cut_short_by_the_output_limit_fails_the_run_with_nothing_written(make_server, local_llm):
    """Two calls (the answer and its corrective retry) of a few hundred prompt tokens
    each spend a budget of 300: the tokens the server reported are charged although
    the run failed, so the next run is refused before it calls the model."""
    server = make_server(extra_env=llm_env(local_llm, CAIRN_LLM_MAX_OUTPUT_TOKENS=8,
                                           CAIRN_CONSOLIDATION_TOKEN_BUDGET=300)).start()
    token = server.mint("acme")
    said = server.call("POST", "/v1/users/u2/episodes", token, {
        "messages": [{"role": "user", "content": "I moved to Lisbon last spring."}], "consolidate": "sync"})
    assert said.status == 201, said.body
    consolidation = said.json()["consolidation"]
    assert consolidation["ran"] is False and consolidation["queued"] is True, consolidation
    assert "unparseable" in consolidation["error"], consolidation
    assert_nothing_written(server, token, "u2")
    jobs = server.call("GET", "/v1/users/u2/jobs", token).json()["items"]
    assert any(job["id"] == consolidation["job_id"] for job in jobs), jobs
    again = server.call("POST", "/v1/users/u2/consolidate", token, {})
    assert again.status == 429 and again.json()["error"]["code"] == "token_budget_exhausted", again.body
    assert_nothing_written(server, token, "u2")
    server.stop()


def test_a_model_slower_than_the_timeout_fails_the_run_on_time(make_server, local_llm):
    server = make_server(extra_env=llm_env(local_llm, CAIRN_LLM_TIMEOUT_MS=20, CAIRN_LLM_MAX_RETRIES=1,
                                           CAIRN_LLM_RETRY_BACKOFF_MS=10)).start()
    token = server.mint("acme")
    said = server.call("POST", "/v1/users/u3/episodes", token, {
        "messages": [{"role": "user", "content": "My dog Rex is a beagle."}], "consolidate": "sync"})
    assert said.status == 201, said.body
    message = said.json()["consolidation"]["error"]
    assert "timed out" in message and "gave up after 2 attempts" in message, message
    run = server.call("POST", "/v1/users/u3/consolidate", token, {})
    assert run.status == 502 and run.json()["error"]["code"] == "provider_error", run.body
    assert_nothing_written(server, token, "u3")
    server.stop()


def test_the_answer_route_cites_only_memories_it_was_shown(make_server, local_llm):
    server = make_server(extra_env=llm_env(local_llm)).start()
    token = server.mint("acme")
    ids = set()
    for text in ("The user's sister is called Ana.", "The user works as a nurse.", "The user has a beagle named Rex."):
        written = server.call("POST", "/v1/users/u4/facts", token, {"text": text})
        assert written.status == 201, written.body
        ids.add(written.json()["fact"]["id"])
    answer = server.call("POST", "/v1/users/u4/answer", token, {"query": "What is my dog called?"})
    if answer.status == 200:
        body = answer.json()
        assert set(body["citations"]) <= ids, body
        if not body["known"]:
            assert body["answer"] == "" and body["citations"] == [], body
    else:
        assert answer.status == 502 and answer.json()["error"]["code"] == "provider_error", answer.body
    server.stop()
