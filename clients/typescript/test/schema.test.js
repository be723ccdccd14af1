// The committed types are what openapi-typescript makes of the reviewed document.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);
const root = fileURLToPath(new URL("..", import.meta.url));

test("src/schema.d.ts is generated from the current OpenAPI document", async () => {
  const out = join(mkdtempSync(join(tmpdir(), "cairn-schema-")), "schema.d.ts");
  const bin = join(root, "node_modules", ".bin", "openapi-typescript");
  await run(bin, ["../../service/cairn-server/tests/openapi.json", "--default-non-nullable", "false", "-o", out], {
    cwd: root,
  });
  assert.equal(
    readFileSync(out, "utf8"),
    readFileSync(join(root, "src", "schema.d.ts"), "utf8"),
    "run `npm run generate` and commit src/schema.d.ts",
  );
});
