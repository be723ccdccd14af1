// The AI SDK tools in a real generateText loop, driven by the SDK's mock model, against
// the real binary.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { generateText, stepCountIs } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { Cairn } from "../dist/index.js";
import { cairnTools } from "../dist/ai.js";
import { startService } from "./harness.js";

let service;
before(async () => {
  service = await startService();
});
after(async () => {
  await service.stop();
});

const usage = {
  inputTokens: { total: 10, noCache: 10, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 5, text: 5, reasoning: 0 },
};
const call = (id, toolName, input) => ({
  content: [{ type: "tool-call", toolCallId: id, toolName, input: JSON.stringify(input) }],
  finishReason: { unified: "tool-calls", raw: "tool_calls" },
  usage,
  warnings: [],
});

test("a generateText loop remembers and recalls through the tools", async () => {
  const client = new Cairn({ baseUrl: service.base, token: service.mint("acme") });
  const script = [
    call("c1", "remember", { text: "The user is allergic to peanuts." }),
    call("c2", "recallMemories", { query: "allergies" }),
    {
      content: [{ type: "text", text: "Noted: no peanuts." }],
      finishReason: { unified: "stop", raw: "stop" },
      usage,
      warnings: [],
    },
  ];
  const prompts = [];
  const model = new MockLanguageModelV3({
    doGenerate: async (options) => {
      prompts.push(options.prompt);
      return script[prompts.length - 1];
    },
  });
  const result = await generateText({
    model,
    tools: cairnTools(client, "alice"),
    stopWhen: stepCountIs(5),
    prompt: "I'm allergic to peanuts. What do you know about me?",
  });
  assert.equal(result.text, "Noted: no peanuts.");
  const outputs = result.steps.flatMap((step) => step.toolResults.map((r) => [r.toolName, r.output]));
  assert.equal(outputs[0][0], "remember");
  assert.match(outputs[0][1], /^Saved as fact_/);
  assert.equal(outputs[1][0], "recallMemories");
  assert.match(outputs[1][1], /allergic to peanuts/);
  const facts = [];
  for await (const fact of client.facts("alice")) facts.push(fact.text);
  assert.deepEqual(facts, ["The user is allergic to peanuts."]);
});

test("the tools act on their user only and report refusals to the model", async () => {
  const reader = new Cairn({ baseUrl: service.base, token: service.mint("acme", "memory:read") });
  const tools = cairnTools(reader, "bob");
  assert.deepEqual(Object.keys(tools).sort(), ["forgetMemory", "recallMemories", "remember", "retractMemory"]);
  const refused = await tools.remember.execute({ text: "The user likes tea." }, { toolCallId: "x", messages: [] });
  assert.match(refused, /insufficient_scope/);
  const writer = new Cairn({ baseUrl: service.base, token: service.mint("acme") });
  const writerTools = cairnTools(writer, "bob");
  const saved = await writerTools.remember.execute({ text: "The user plays the cello." }, { toolCallId: "y", messages: [] });
  const id = saved.split(" ").at(-1).replace(/\.$/, "");
  assert.match(await writerTools.retractMemory.execute({ memoryId: id }, { toolCallId: "z", messages: [] }), /^Retracted/);
  assert.equal((await writer.getFact("bob", id)).status, "retracted");
  const alice = await writer.recall("alice", "cello");
  assert.ok(alice.hits.every((hit) => !hit.text.includes("cello")), "bob's fact reached alice");
});
