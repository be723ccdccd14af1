/**
 * Tools for the Vercel AI SDK (`import { cairnTools } from "cairn-memory/ai"`):
 * remember, recallMemories, retractMemory and forgetMemory, for one user fixed when
 * they are made. The tenant and what is allowed come from the client's token; a model
 * calling the tools can never name another user.
 */
import { jsonSchema, tool } from "ai";
import { Cairn, CairnError } from "./index.js";

const failed = (error: unknown): string => {
  if (error instanceof CairnError) return `error ${error.code}: ${error.message} (request ${error.requestId})`;
  throw error;
};

export function cairnTools(client: Cairn, userId: string, options: { k?: number } = {}) {
  return {
    remember: tool({
      description:
        "Save one lasting fact about the user, as a short self-contained sentence. Pass supersedes with an old fact's id when this fact replaces it.",
      inputSchema: jsonSchema<{ text: string; supersedes?: string }>({
        type: "object",
        properties: { text: { type: "string", minLength: 1 }, supersedes: { type: "string" } },
        required: ["text"],
        additionalProperties: false,
      }),
      execute: async ({ text, supersedes }) => {
        try {
          const written = await client.writeFact(userId, { text, supersedes });
          return written.created ? `Saved as ${written.fact.id}.` : `Already known as ${written.fact.id}.`;
        } catch (error) {
          return failed(error);
        }
      },
    }),
    recallMemories: tool({
      description: "Look up what is known about the user that is relevant to the query.",
      inputSchema: jsonSchema<{ query: string }>({
        type: "object",
        properties: { query: { type: "string", minLength: 1 } },
        required: ["query"],
        additionalProperties: false,
      }),
      execute: async ({ query }) => {
        try {
          const { hits } = await client.recall(userId, query, { k: options.k ?? 5 });
          return hits.length ? hits.map((hit) => `[${hit.id}] ${hit.text}`).join("\n") : "Nothing relevant is known.";
        } catch (error) {
          return failed(error);
        }
      },
    }),
    retractMemory: tool({
      description: "Retract a fact that was never true (the user says it was wrong); the value is refused from then on.",
      inputSchema: jsonSchema<{ memoryId: string; reason?: string }>({
        type: "object",
        properties: { memoryId: { type: "string" }, reason: { type: "string" } },
        required: ["memoryId"],
        additionalProperties: false,
      }),
      execute: async ({ memoryId, reason }) => {
        try {
          const fact = await client.retractFact(userId, memoryId, reason);
          return `Retracted ${fact.id}: ${fact.text}`;
        } catch (error) {
          return failed(error);
        }
      },
    }),
    forgetMemory: tool({
      description: "Forget a fact the user asks to have erased.",
      inputSchema: jsonSchema<{ memoryId: string }>({
        type: "object",
        properties: { memoryId: { type: "string" } },
        required: ["memoryId"],
        additionalProperties: false,
      }),
      execute: async ({ memoryId }) => {
        try {
          return `Forgot ${await client.forgetFact(userId, memoryId)}.`;
        } catch (error) {
          return failed(error);
        }
      },
    }),
  };
}
