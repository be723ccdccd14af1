"""Answer benchmark: the cost of `POST /v1/users/{user}/answer` for a question that names
many people (1,000 by default, or as many as the first argument says) beside
`POST /v1/users/{user}/recall` of the same text, against the release binary on the
embedded store with its defaults (the text limit raised to hold the question).

    cargo build --release -p cairn-server
    python3 tests/blackbox/bench_answer.py [names]

An answer recalls once for the question and once for the user's own name, whatever
the question holds; this prints both medians of five."""

import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest  # noqa: E402  (the black-box harness: the real binary)


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    target = os.environ.get("CARGO_TARGET_DIR", str(conftest.REPO / "target"))
    os.environ.setdefault("CAIRN_BIN", str(Path(target) / "release" / "cairn"))
    with tempfile.TemporaryDirectory() as directory:
        server = conftest.Server(Path(directory) / "data", {"CAIRN_MAX_TEXT_CHARS": "100000"}).start()
        try:
            token = server.mint("bench")

            def timed(path, body):
                request = urllib.request.Request(f"{server.base}{path}", method="POST",
                                                 data=json.dumps(body).encode(),
                                                 headers={"authorization": f"Bearer {token}",
                                                          "content-type": "application/json"})
                started = time.perf_counter()
                urllib.request.urlopen(request, timeout=600).read()
                return (time.perf_counter() - started) * 1000

            timed("/v1/users/u1/facts", {"text": "The user's name is Caroline"})
            names = [f"Zo{chr(97 + i // 676 % 26)}{chr(97 + i // 26 % 26)}{chr(97 + i % 26)}" for i in range(count)]
            question = "What did " + ", ".join(names) + " paint?"
            answers = sorted(timed("/v1/users/u1/answer", {"query": question}) for _ in range(5))
            recalls = sorted(timed("/v1/users/u1/recall", {"query": question}) for _ in range(5))
            print(f"a question naming {count} people: answer median {answers[2]:.0f} ms, "
                  f"recall of the same text median {recalls[2]:.0f} ms")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
