// Starts the real `cairn` binary for the client's tests and mints its tokens.
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const repo = resolve(fileURLToPath(import.meta.url), "../../../..");
const secret = "typescript-client-secret-0123456789";
export const binary =
  process.env.CAIRN_BIN ?? join(process.env.CARGO_TARGET_DIR ?? join(repo, "target"), "debug", "cairn");

function freePort() {
  return new Promise((done, fail) => {
    const server = createServer();
    server.once("error", fail);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => done(port));
    });
  });
}

export async function startService(extraEnv = {}) {
  const dataDir = mkdtempSync(join(tmpdir(), "cairn-ts-"));
  const port = await freePort();
  const env = {
    PATH: process.env.PATH ?? "",
    CAIRN_LISTEN: `127.0.0.1:${port}`,
    CAIRN_DATA_DIR: join(dataDir, "data"),
    CAIRN_JWT_SECRET: secret,
    CAIRN_RATE_LIMIT_PER_SECOND: "0",
    CAIRN_LOG_LEVEL: "warn",
    CAIRN_MODELS_DIR: process.env.CAIRN_MODELS_DIR ?? join(repo, ".models"),
    ...extraEnv,
  };
  const child = spawn(binary, ["serve"], { env, stdio: "ignore" });
  const base = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`cairn exited with ${child.exitCode}`);
    try {
      if ((await fetch(`${base}/healthz`)).ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) throw new Error("cairn did not become healthy in 30 s");
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    base,
    mint(tenant, scope = "memory:read,memory:write,memory:admin") {
      return execFileSync(binary, ["token", "mint", "--tenant", tenant, "--scope", scope, "--ttl", "1h"], {
        env,
      })
        .toString()
        .trim();
    },
    async stop() {
      child.kill("SIGTERM");
      await new Promise((r) => (child.exitCode !== null ? r() : child.once("exit", r)));
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}
