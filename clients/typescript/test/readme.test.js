// The README's examples, run as written against the real binary.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { startService } from "./harness.js";

const run = promisify(execFile);
const root = fileURLToPath(new URL("..", import.meta.url));

test("the README examples run", async () => {
  const blocks = readFileSync(`${root}README.md`, "utf8").split("```js\n").slice(1).map((b) => b.split("```")[0]);
  assert.ok(blocks.length >= 2);
  const service = await startService();
  try {
    for (const code of blocks) {
      // The examples import the package by name; run them from the package directory.
      const source = code
        .replaceAll('from "cairn-memory/ai"', 'from "./dist/ai.js"')
        .replaceAll('from "cairn-memory"', 'from "./dist/index.js"');
      const env = { ...process.env, CAIRN_URL: service.base, CAIRN_TOKEN: service.mint("acme") };
      await run(process.execPath, ["--input-type=module", "-e", source], { cwd: root, env });
    }
  } finally {
    await service.stop();
  }
});
