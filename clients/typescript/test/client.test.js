// The client against the real binary: every method, errors with codes and request
// ids, retries that honour Retry-After, pagination.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Cairn, CairnError } from "../dist/index.js";
import { startService } from "./harness.js";

let service;
before(async () => {
  service = await startService();
});
after(async () => {
  await service.stop();
});

const collect = async (iterator) => {
  const items = [];
  for await (const entry of iterator) items.push(entry);
  return items;
};

test("every method answers with the documented shapes", async () => {
  const cairn = new Cairn({ baseUrl: service.base, token: service.mint("acme") });
  const ingested = await cairn.ingest(
    "alice",
    [
      { role: "user", content: "I moved to Lisbon last spring." },
      { role: "assistant", content: "Nice!" },
      { role: "user", content: "I love hiking." },
    ],
    { session_id: "s1", consolidate: "sync" },
  );
  assert.equal(ingested.episode_ids.length, 2);
  assert.equal(ingested.consolidation.ran, true);
  assert.equal((await cairn.getEpisode("alice", ingested.episode_ids[0])).session_id, "s1");
  assert.deepEqual(
    (await collect(cairn.episodes("alice", 1))).map((e) => e.id),
    [...ingested.episode_ids].reverse(),
  );

  const written = await cairn.writeFact("alice", { text: "The user is vegetarian.", fact_type: "preference" });
  assert.equal(written.created, true);
  assert.equal(written.decision.kind, "NEW");
  assert.equal((await cairn.writeFact("alice", { text: "The user is vegetarian." })).created, false);
  assert.equal((await cairn.retractFact("alice", written.fact.id, "test")).status, "retracted");
  assert.deepEqual((await cairn.tombstones("alice")).map((t) => [t.fact_id, t.reason]), [[written.fact.id, "retracted"]]);
  const porto = (await cairn.writeFact("alice", { text: "The user works in Porto." })).fact;
  const braga = (await cairn.writeFact("alice", { text: "The user works in Braga.", supersedes: porto.id })).fact;
  assert.deepEqual((await cairn.factHistory("alice", braga.id)).map((f) => [f.id, f.status]),
    [[porto.id, "superseded"], [braga.id, "active"]]);
  assert.deepEqual((await collect(cairn.decisions("alice", 50, "UPDATES"))).map((d) => [d.fact_id, d.gate]), [[braga.id, "judge"]]);
  assert.deepEqual((await collect(cairn.episodes("alice", 50, "elsewhere"))), []);
  const doomed = (await cairn.writeFact("alice", { text: "The user owns a kayak." })).fact;
  assert.equal(await cairn.forgetFact("alice", doomed.id), doomed.id);
  assert.ok((await collect(cairn.facts("alice", { status: "all", pageSize: 1 }))).length >= 2);

  const playbook = await cairn.createPlaybook("alice", { name: "Deploy", trigger: "a deploy", steps: ["test", "ship"] });
  const second = await cairn.addPlaybookVersion("alice", playbook.id, { steps: ["test", "tag", "ship"], base_version: 1 });
  assert.equal(second.version, 2);
  assert.deepEqual((await cairn.playbookVersions("alice", playbook.id)).map((p) => p.version), [1, 2]);
  assert.equal((await cairn.recordOutcome("alice", playbook.id, true)).success_count, 1);
  assert.deepEqual((await cairn.getPlaybook("alice", playbook.id)).steps, ["test", "tag", "ship"]);
  assert.equal((await collect(cairn.playbooks("alice"))).length, 1);

  const result = await cairn.recall("alice", "where does the user live", { k: 5, explain: true });
  assert.ok(result.hits.some((hit) => hit.tier === "semantic" && hit.text.includes("Lisbon")));
  assert.ok(result.hits.every((hit) => hit.explain));
  await cairn.writeFact("alice", { text: "The user's sister Anna is a nurse." });
  assert.ok((await cairn.entities("alice")).some((entity) => entity.name === "Anna"));
  const anna = await cairn.entity("alice", "my sister");
  assert.equal(anna.kind, "person");
  assert.equal(anna.facts[0].text, "The user's sister Anna is a nurse.");
  const answer = await cairn.answer("alice", "Which city did I move to?");
  assert.ok(answer.known && answer.answer.includes("Lisbon") && answer.citations.length >= 1, JSON.stringify(answer));
  assert.deepEqual(await cairn.answer("alice", "What is my favourite guitar brand?"), { answer: "", known: false, citations: [] });
  assert.match((await cairn.profile("alice", { query: "hiking", k: 2 })).context, /Lisbon/);
  assert.equal((await cairn.consolidate("alice", { dry_run: true })).dry_run, true);
  assert.ok((await collect(cairn.decisions("alice"))).length >= 1);
  assert.deepEqual(await cairn.jobs("alice"), []);
  assert.ok((await collect(cairn.audit("alice"))).some((event) => event.action === "fact.create"));
  assert.deepEqual((await collect(cairn.users())).map((u) => u.user), ["alice"]);
  const imported = await cairn.importUser("bob", await cairn.exportUser("alice"));
  assert.equal(imported.format, "cairn");
  const mem0 = await cairn.importUser("carol", { results: [{ memory: "Likes green tea" }] }, "mem0");
  assert.deepEqual(mem0.imported, { created: 1, duplicates: 0, tombstoned: 0 });
  assert.equal((await cairn.eraseUser("carol")).deleted.facts, 1);
  assert.deepEqual(await cairn.health(), { status: "ok" });
});

test("errors carry status, code and request id", async () => {
  const reader = new Cairn({ baseUrl: service.base, token: service.mint("acme", "memory:read") });
  await assert.rejects(reader.writeFact("alice", { text: "The user likes tea." }), (error) => {
    assert.ok(error instanceof CairnError);
    assert.equal(error.status, 403);
    assert.equal(error.code, "insufficient_scope");
    assert.match(error.requestId, /^req_/);
    return true;
  });
  await assert.rejects(reader.getFact("alice", "fact_nope"), { status: 404, code: "not_found" });
  await assert.rejects(reader.recall("alice", "x", { k: 0 }), { status: 422, code: "invalid_request" });
  await assert.rejects(new Cairn({ baseUrl: service.base, token: "nope" }).recall("alice", "x"), {
    status: 401,
    code: "invalid_token",
  });
  await assert.rejects(new Cairn({ baseUrl: "http://127.0.0.1:9", maxRetries: 0 }).health(), {
    status: 0,
    code: "connection_failed",
  });
});

test("rate-limited calls are retried after the wait the server names", async () => {
  const limited = await startService({ CAIRN_RATE_LIMIT_PER_SECOND: "1", CAIRN_RATE_LIMIT_BURST: "1" });
  try {
    const token = limited.mint("acme");
    const cairn = new Cairn({ baseUrl: limited.base, token });
    const started = Date.now();
    for (let index = 0; index < 3; index++) {
      await cairn.writeFact("alice", { text: `The user likes color number ${index}.` });
    }
    assert.ok(cairn.retries >= 2, `retries ${cairn.retries}`);
    assert.ok(Date.now() - started >= 1500);
    const impatient = new Cairn({ baseUrl: limited.base, token, maxRetries: 0 });
    await assert.rejects(
      (async () => {
        for (let index = 0; index < 3; index++) await impatient.recall("alice", "color");
      })(),
      (error) => error.status === 429 && error.code === "rate_limited" && error.retryAfter >= 1,
    );
  } finally {
    await limited.stop();
  }
});

test("reviewers approve and reject held outcomes", async () => {
  const held = await startService({ CAIRN_REVIEW: "supersession" });
  try {
    const writer = new Cairn({ baseUrl: held.base, token: held.mint("acme") });
    const reviewer = new Cairn({ baseUrl: held.base, token: held.mint("acme", "memory:review") });
    for (const userId of ["alice", "bob"]) {
      const porto = (await writer.writeFact(userId, { text: "The user lives in Porto." })).fact;
      const moved = await writer.writeFact(userId, { text: "The user lives in Lisbon.", supersedes: porto.id });
      assert.equal(moved.decision.kind, "HELD_FOR_REVIEW");
      assert.equal(moved.fact.status, "pending");
    }
    const shown = await writer.recall("alice", "where does the user live", { tiers: ["semantic"], include_pending: true });
    assert.ok(shown.hits.some((hit) => hit.text === "The user lives in Lisbon." && hit.status === "pending"));
    const [review] = await collect(reviewer.reviews("alice"));
    assert.equal(review.kind, "supersession");
    assert.equal(review.target?.text, "The user lives in Porto.");
    assert.deepEqual((await collect(reviewer.tenantReviews(1))).map((r) => r.user), ["alice", "bob"]);
    assert.equal((await reviewer.reviewCounts()).supersession, 2);
    const writeOnly = new Cairn({ baseUrl: held.base, token: held.mint("acme", "memory:read,memory:write") });
    await assert.rejects(writeOnly.approveReview("alice", review.id), (error) => error instanceof CairnError && error.status === 403);
    const approved = await reviewer.approveReview("alice", review.id);
    assert.equal(approved.decision.kind, "APPROVED");
    assert.equal(approved.fact.status, "active");
    await assert.rejects(reviewer.approveReview("alice", review.id), (error) => error instanceof CairnError && error.status === 409);
    const [other] = await collect(reviewer.reviews("bob"));
    const rejected = await reviewer.rejectReview("bob", other.id, { reason: "a visit", tombstone: true });
    assert.equal(rejected.review.note, "a visit");
    assert.equal((await reviewer.reviewCounts()).total, 0);
    assert.equal((await writer.eraseUser("bob")).deleted.reviews, 1);
  } finally {
    await held.stop();
  }
});
