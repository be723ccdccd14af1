"""The client against the real binary: every method, typed results, errors with codes
and request ids, retries that honour Retry-After, pagination, and the async client."""

import asyncio
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

import cairn
from cairn import AsyncCairn, Cairn

README = Path(__file__).resolve().parents[1] / "README.md"


def test_every_method_returns_typed_results(service):
    client = Cairn(service.base, service.mint("acme"))
    ingested = client.ingest("alice", [("user", "I moved to Lisbon last spring."),
                                       {"role": "assistant", "content": "Nice!"},
                                       {"role": "user", "content": "I love hiking.", "timestamp": datetime(2026, 5, 1)}],
                             session_id="s1", consolidate="sync")
    assert isinstance(ingested, cairn.IngestResult) and len(ingested.episode_ids) == 2
    assert ingested.consolidation.ran and ingested.consolidation.run.extractor == "offline"
    episode = client.get_episode("alice", ingested.episode_ids[1])
    assert isinstance(episode, cairn.Episode) and episode.occurred_at.year == 2026 and episode.session_id == "s1"
    assert [e.id for e in client.episodes("alice", page_size=1)] == list(reversed(ingested.episode_ids))
    assert [e.id for e in client.episodes("alice", session_id="s1")] == list(reversed(ingested.episode_ids))
    assert list(client.episodes("alice", session_id="elsewhere")) == []

    written = client.write_fact("alice", "The user is vegetarian.", fact_type="preference", confidence=0.8)
    assert isinstance(written, cairn.FactWrite) and written.created and written.decision.kind == "NEW"
    assert isinstance(written.fact.created_at, datetime) and written.fact.confidence == pytest.approx(0.8)
    assert client.write_fact("alice", "The user is vegetarian.").created is False
    retracted = client.retract_fact("alice", written.fact.id, reason="test")
    assert isinstance(retracted, cairn.Fact) and retracted.status == "retracted"
    tombstones = client.tombstones("alice")
    assert [(t.fact_id, t.reason) for t in tombstones] == [(written.fact.id, "retracted")]
    assert isinstance(tombstones[0], cairn.Tombstone) and isinstance(tombstones[0].created_at, datetime)
    client.write_fact("alice", "The user's sister Anna is a nurse.")
    assert "Anna" in [e.name for e in client.entities("alice")]
    anna = client.entity("alice", "my sister")
    assert isinstance(anna, cairn.Entity) and anna.kind == "person" and anna.facts[0].text.startswith("The user's sister")
    assert [h.text for h in client.recall("alice", "job", entity="Anna", tiers=["semantic"]).hits] == [
        "The user's sister Anna is a nurse."]
    porto = client.write_fact("alice", "The user works in Porto.").fact
    braga = client.write_fact("alice", "The user works in Braga.", supersedes=porto.id).fact
    assert [(f.id, f.status) for f in client.fact_history("alice", porto.id)] == [
        (porto.id, "superseded"), (braga.id, "active")]
    assert [d.fact_id for d in client.decisions("alice", kind="UPDATES")] == [braga.id]
    assert {d.gate for d in client.decisions("alice", kind="RETRACTED")} == {"request"}
    doomed = client.write_fact("alice", "The user owns a kayak.").fact
    assert client.forget_fact("alice", doomed.id) == doomed.id

    playbook = client.create_playbook("alice", "Deploy", "a deploy", ["test", "ship"])
    assert isinstance(playbook, cairn.Playbook) and playbook.version == 1
    second = client.add_playbook_version("alice", playbook.id, ["test", "tag", "ship"], base_version=1)
    assert second.version == 2
    assert [p.version for p in client.playbook_versions("alice", playbook.id)] == [1, 2]
    assert client.record_outcome("alice", playbook.id, True).success_count == 1
    assert client.get_playbook("alice", playbook.id).steps == ["test", "tag", "ship"]
    assert [p.id for p in client.playbooks("alice")] == [playbook.id]

    result = client.recall("alice", "where does the user live", k=5, explain=True, tiers=["semantic", "episodic"])
    assert isinstance(result, cairn.RecallResult) and result.hits
    assert all(isinstance(hit, cairn.RecallHit) and hit.explain is not None for hit in result.hits)
    assert any(hit.tier == "semantic" and "Lisbon" in hit.text for hit in result.hits)
    assert {hit.tier for hit in result.hits} <= {"semantic", "episodic"}
    hiking = lambda at: [h.text for h in client.recall("alice", "hiking", tiers=["semantic"], valid_at=at).hits
                         if "hiking" in h.text]
    assert hiking(datetime(2026, 5, 2)) and not hiking(datetime(2026, 4, 30)), "valid from when it was said"
    answer = client.answer("alice", "Which city did I move to?")
    assert isinstance(answer, cairn.Answer) and answer.known and "Lisbon" in answer.answer and answer.citations
    assert client.answer("alice", "What is my favourite guitar brand?") == cairn.Answer("", False, [])
    profile = client.profile("alice", query="hiking", k=2)
    assert isinstance(profile, cairn.Profile) and "Lisbon" in profile.context

    assert isinstance(client.consolidate("alice", dry_run=True), cairn.Consolidation)
    assert all(isinstance(d, cairn.Decision) for d in client.decisions("alice"))
    assert client.jobs("alice") == []
    assert {e.action for e in client.audit("alice")} >= {"episode.ingest", "fact.create", "fact.retract", "fact.forget"}
    assert [u.user for u in client.users()] == ["alice"]
    exported = client.export_user("alice")
    imported = client.import_user("bob", exported)
    assert imported.format == "cairn" and imported.imported["facts"] >= 1
    mem0 = client.import_user("carol", {"results": [{"memory": "Likes green tea"}]}, format="mem0")
    assert mem0.imported == {"created": 1, "duplicates": 0, "tombstoned": 0}
    receipt = client.erase_user("carol")
    assert isinstance(receipt, cairn.ErasureReceipt) and receipt.deleted.facts == 1
    assert client.health() == {"status": "ok"}
    client.close()


def test_reviewers_approve_and_reject_held_outcomes(make_service):
    service = make_service({"CAIRN_REVIEW": "supersession"})
    writer = Cairn(service.base, service.mint("acme"))
    reviewer = Cairn(service.base, service.mint("acme", scope="memory:review"))
    for user in ("alice", "bob"):
        porto = writer.write_fact(user, "The user lives in Porto.").fact
        held = writer.write_fact(user, "The user lives in Lisbon.", supersedes=porto.id)
        assert held.decision.kind == "HELD_FOR_REVIEW" and held.fact.status == "pending"
    assert [h.text for h in writer.recall("alice", "where does the user live", tiers=["semantic"]).hits][:1] == [
        "The user lives in Porto."]
    pending = writer.recall("alice", "where does the user live", tiers=["semantic"], include_pending=True)
    assert ("The user lives in Lisbon.", "pending") in [(h.text, h.status) for h in pending.hits]
    (review,) = list(reviewer.reviews("alice"))
    assert isinstance(review, cairn.Review) and review.kind == "supersession" and review.user == "alice"
    assert review.fact.text == "The user lives in Lisbon." and review.target.text == "The user lives in Porto."
    assert [r.user for r in reviewer.tenant_reviews(page_size=1)] == ["alice", "bob"]
    counts = reviewer.review_counts()
    assert isinstance(counts, cairn.ReviewCounts) and (counts.total, counts.supersession) == (2, 2)
    with pytest.raises(cairn.PermissionDeniedError):
        writer_only = Cairn(service.base, service.mint("acme", scope="memory:read,memory:write"))
        writer_only.approve_review("alice", review.id)
    approved = reviewer.approve_review("alice", review.id)
    assert isinstance(approved, cairn.ReviewDecision) and approved.decision.kind == "APPROVED"
    assert approved.fact.status == "active" and approved.review.status == "approved"
    with pytest.raises(cairn.ConflictError):
        reviewer.approve_review("alice", review.id)
    (other,) = list(reviewer.reviews("bob"))
    rejected = reviewer.reject_review("bob", other.id, reason="a visit", tombstone=True)
    assert rejected.review.note == "a visit" and rejected.fact.status == "retracted"
    assert [h.text for h in writer.recall("bob", "where does the user live", tiers=["semantic"]).hits][:1] == [
        "The user lives in Porto."]
    assert reviewer.review_counts().total == 0
    assert writer.erase_user("bob").deleted.reviews == 1


def test_a_low_confidence_threshold_comes_from_the_environment(make_service):
    service = make_service({"CAIRN_REVIEW": "low_confidence", "CAIRN_REVIEW_MIN_CONFIDENCE": "0.6"})
    client = Cairn(service.base, service.mint("acme"))
    unsure = client.write_fact("alice", "The user may own a cat.", confidence=0.5)
    sure = client.write_fact("alice", "The user owns a dog.", confidence=0.7)
    assert (unsure.fact.status, unsure.decision.kind) == ("pending", "HELD_FOR_REVIEW")
    assert (sure.fact.status, sure.decision.kind) == ("active", "NEW")
    assert [r.rule for r in client.reviews("alice")] == ["low_confidence"]


def test_errors_carry_status_code_and_request_id(service):
    reader = Cairn(service.base, service.mint("acme", scope="memory:read"))
    with pytest.raises(cairn.PermissionDeniedError) as denied:
        reader.write_fact("alice", "The user likes tea.")
    assert denied.value.status == 403 and denied.value.code == "insufficient_scope"
    assert denied.value.request_id.startswith("req_")
    with pytest.raises(cairn.NotFoundError) as missing:
        reader.get_fact("alice", "fact_nope")
    assert missing.value.code == "not_found"
    with pytest.raises(cairn.InvalidRequestError) as invalid:
        reader.recall("alice", "x", k=0)
    assert invalid.value.code == "invalid_request" and "k" in invalid.value.message
    with pytest.raises(cairn.AuthenticationError) as unauthenticated:
        Cairn(service.base, "not-a-token").recall("alice", "x")
    assert unauthenticated.value.code == "invalid_token"
    writer = Cairn(service.base, service.mint("acme"))
    fact = writer.write_fact("alice", "The user has three cats.").fact
    writer.retract_fact("alice", fact.id)
    with pytest.raises(cairn.ConflictError) as tombstoned:
        writer.write_fact("alice", "The user has three cats.")
    assert tombstoned.value.code == "tombstoned"
    with pytest.raises(cairn.ConnectionFailed):
        Cairn("http://127.0.0.1:9", "t", max_retries=0).health()


def test_rate_limited_calls_are_retried_after_the_wait_the_server_names(make_service):
    service = make_service({"CAIRN_RATE_LIMIT_PER_SECOND": "1", "CAIRN_RATE_LIMIT_BURST": "1"})
    token = service.mint("acme")
    client = Cairn(service.base, token)
    started = time.monotonic()
    for index in range(3):
        client.write_fact("alice", f"The user likes color number {index}.")
    assert client.retries >= 2, client.retries
    assert time.monotonic() - started >= 1.5
    impatient = Cairn(service.base, token, max_retries=0)
    impatient.health()  # public: not limited
    with pytest.raises(cairn.RateLimitError) as limited:
        for index in range(3):
            impatient.recall("alice", "color")
    assert limited.value.status == 429 and limited.value.retry_after >= 1


def test_an_unavailable_store_is_retried_then_reported(make_service):
    # A cluster backend whose node is not there: every memory call answers 503.
    service = make_service({"CAIRN_BACKEND": "opensearch", "CAIRN_CLUSTER_URL": "http://127.0.0.1:9",
                            "CAIRN_INDEX_PREFIX": "sdk-unavailable"})
    client = Cairn(service.base, service.mint("acme"), max_retries=2, max_retry_wait=0.2)
    with pytest.raises(cairn.UnavailableError) as unavailable:
        client.recall("alice", "anything")
    assert unavailable.value.code == "unavailable" and client.retries == 2


def test_the_async_client_matches_the_sync_one(service):
    async def scenario():
        async with AsyncCairn(service.base, service.mint("acme")) as client:
            for index in range(5):
                await client.write_fact("dora", f"The user visited city number {index}.")
            facts = [fact async for fact in client.facts("dora", page_size=2)]
            assert len(facts) == 5 and all(isinstance(fact, cairn.Fact) for fact in facts)
            result = await client.recall("dora", "city visited", k=3)
            assert len(result.hits) == 3
            with pytest.raises(cairn.NotFoundError):
                await client.get_fact("dora", "fact_nope")
    asyncio.run(scenario())


def test_the_readme_examples_run(service):
    blocks = README.read_text().split("```python\n")[1:]
    assert len(blocks) >= 3
    environment = dict(os.environ, CAIRN_URL=service.base, CAIRN_TOKEN=service.mint("acme"))
    for block in blocks:
        code = block.split("```", 1)[0]
        result = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, f"{code}\n{result.stdout}\n{result.stderr}"


def test_the_models_match_the_document():
    """Each model has exactly the fields of its schema in the reviewed OpenAPI snapshot
    (which the server's own tests hold equal to the served document)."""
    import dataclasses
    import json

    from cairn import _models

    document = json.loads((Path(__file__).resolve().parents[3] / "service/cairn-server/tests/openapi.json").read_text())
    schemas = document["components"]["schemas"]
    pairs = {
        "Fact": "FactResponse", "Decision": "DecisionResponse", "FactWrite": "FactWriteResponse",
        "Episode": "EpisodeResponse", "Playbook": "PlaybookResponse", "Explanation": "ExplanationResponse",
        "RecallHit": "RecallHitResponse", "RecallResult": "RecallResponse", "Profile": "ProfileResponse",
        "ModelUsage": "ModelUsage", "TokenBudget": "TokenBudgetResponse", "Consolidation": "ConsolidationResponse",
        "IngestConsolidation": "IngestConsolidation", "IngestResult": "IngestResponse", "Job": "JobResponse",
        "AuditEvent": "AuditEventResponse", "UserSummary": "UserSummaryResponse", "ErasedCounts": "ErasedCounts",
        "ErasureReceipt": "ErasureResponse", "Answer": "AnswerResponse", "Entity": "EntityResponse",
        "EntitySummary": "EntitySummaryResponse", "EntityGroup": "EntityGroupResponse",
        "Review": "ReviewResponse", "ReviewCounts": "ReviewCounts", "ReviewDecision": "ReviewDecisionResponse",
    }
    for model, schema_name in pairs.items():
        properties = set()
        pending = [schemas[schema_name]]
        while pending:  # properties of the schema and of its allOf/anyOf parts
            schema = pending.pop()
            properties |= set(schema.get("properties", {}))
            pending.extend(schema.get("allOf", []) + schema.get("anyOf", []))
        fields = {item.name for item in dataclasses.fields(getattr(_models, model))}
        assert fields == properties, f"{model} vs {schema_name}: {sorted(fields ^ properties)}"
