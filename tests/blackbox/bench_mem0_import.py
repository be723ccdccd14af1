"""mem0 import memory benchmark: how much a mem0 `get_all` document of about 24 MiB
(120,000 memories with metadata, or as many as the first argument says) raises the
service's peak resident memory while it is read and refused (its last memory belongs to
another user), against the release binary on the embedded store with its defaults.

    cargo build --release -p cairn-server
    python3 tests/blackbox/bench_mem0_import.py [memories]

The document is read straight into memories, by its shape: its own bytes plus the
memories' text, not a generic tree of the whole document first."""

import json
import os
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest  # noqa: E402  (the black-box harness: the real binary)


def peak_and_resident(pid):
    fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status") if ":" in line)
    return int(fields["VmHWM"].split()[0]) // 1024, int(fields["VmRSS"].split()[0]) // 1024


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 120_000
    target = os.environ.get("CARGO_TARGET_DIR", str(conftest.REPO / "target"))
    os.environ.setdefault("CAIRN_BIN", str(Path(target) / "release" / "cairn"))
    with tempfile.TemporaryDirectory() as directory:
        server = conftest.Server(Path(directory) / "data").start()
        try:
            token = server.mint("bench")
            memories = [{"id": f"m{index}", "memory": f"The user noted item number {index} of the collection " + "x" * 60,
                         "user_id": "u1", "metadata": {"source": "chat", "index": index}} for index in range(count)]
            memories.append({"memory": "not this user's", "user_id": "someone-else"})
            body = json.dumps({"results": memories}).encode()
            before = peak_and_resident(server.process.pid)
            request = urllib.request.Request(f"{server.base}/v1/users/u1/import?format=mem0", method="POST",
                                             data=body, headers={"authorization": f"Bearer {token}",
                                                                 "content-type": "application/json"})
            try:
                urllib.request.urlopen(request, timeout=600).read()
                status = 201
            except urllib.error.HTTPError as error:
                status = error.code
            after = peak_and_resident(server.process.pid)
            print(f"a mem0 document of {len(body) / 2**20:.1f} MiB ({count} memories), answered {status}: "
                  f"peak resident memory {before[0]} MiB before, {after[0]} MiB after (+{after[0] - before[0]} MiB)")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
