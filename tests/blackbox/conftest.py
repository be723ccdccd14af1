"""Black-box fixtures: start the real `cairn` binary and talk to it over HTTP."""

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SECRET = "blackbox-secret-blackbox-secret-0123"


# The search-cluster engines the black-box tests run on, each with the variable naming
# its node. A backend named in CAIRN_TEST_BACKENDS (scripts/test names every one it
# starts) must have its node: its cases fail, never skip, without one.
CLUSTER_VARIABLES = {
    "opensearch": "CAIRN_TEST_OPENSEARCH_URL",
    "elasticsearch": "CAIRN_TEST_ELASTICSEARCH_URL",
}
REQUIRED_BACKENDS = [name.strip() for name in os.environ.get("CAIRN_TEST_BACKENDS", "").split(",") if name.strip()]


def cluster_url(engine):
    """The test node of `engine`; fails the test when the run requires it and it is
    missing, skips it otherwise."""
    variable = CLUSTER_VARIABLES[engine]
    url = os.environ.get(variable)
    if not url:
        if engine in REQUIRED_BACKENDS:
            pytest.fail(f"CAIRN_TEST_BACKENDS requires {engine}, but {variable} is not set")
        pytest.skip(f"{variable} is not set")
    return url


def delete_indices(url, prefix):
    """Deletes the indices of a test's prefix (ignoring a node that is gone)."""
    request = urllib.request.Request(f"{url}/{prefix}-*", method="DELETE")
    try:
        urllib.request.urlopen(request, timeout=30).read()
    except OSError:
        pass


def wait_for(predicate, seconds=30):
    """Polls `predicate` until it returns a true value (returned) or `seconds` pass
    (then `False`)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    return False


def binary() -> str:
    explicit = os.environ.get("CAIRN_BIN")
    if explicit:
        return explicit
    target = os.environ.get("CARGO_TARGET_DIR", str(REPO / "target"))
    return str(Path(target) / "debug" / "cairn")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):
        return json.loads(self.body) if self.body else None


def request(method, url, token=None, body=None, headers=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("content-type", "application/json")
    if token:
        req.add_header("authorization", f"Bearer {token}")
    for key, value in (headers or {}).items():
        req.add_header(key, value)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return Response(resp.status, dict(resp.headers), resp.read().decode())
    except urllib.error.HTTPError as error:
        return Response(error.code, dict(error.headers), error.read().decode())


class Server:
    """One `cairn serve` process with its own data directory and port."""

    def __init__(self, data_dir: Path, extra_env=None):
        self.data_dir = data_dir
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {
            "PATH": os.environ.get("PATH", ""),
            "CAIRN_LISTEN": f"127.0.0.1:{self.port}",
            "CAIRN_DATA_DIR": str(data_dir),
            "CAIRN_JWT_SECRET": SECRET,
            "CAIRN_RATE_LIMIT_PER_SECOND": "0",
            "CAIRN_LOG_LEVEL": "warn",
            "CAIRN_MODELS_DIR": os.environ.get("CAIRN_MODELS_DIR", str(REPO / ".models")),
        }
        self.env.update(extra_env or {})
        self.process = None
        self.log = data_dir / f"server-{self.port}.log"

    def start(self):
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen([binary(), "serve"], env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"cairn exited with {self.process.returncode}: {self.log.read_text()}")
            try:
                if request("GET", self.base + "/healthz").status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("cairn did not become healthy in 30 s")

    def kill(self):
        """SIGKILL: no shutdown hooks, no flushing; what was acknowledged must survive."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def mint(self, tenant, scope="memory:read,memory:write,memory:admin", user=None, ttl="1h", extra=()):
        args = [binary(), "token", "mint", "--tenant", tenant, "--scope", scope, "--ttl", ttl, *extra]
        if user:
            args += ["--user", user]
        result = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    def call(self, method, path, token=None, body=None, **kwargs):
        return request(method, self.base + path, token=token, body=body, **kwargs)


@pytest.fixture
def server(tmp_path):
    instance = Server(tmp_path / "data").start()
    yield instance
    instance.stop()


@pytest.fixture
def make_server(tmp_path):
    started = []

    def make(data_dir=None, extra_env=None):
        instance = Server(data_dir or tmp_path / f"data{len(started)}", extra_env)
        started.append(instance)
        return instance

    yield make
    for instance in started:
        instance.stop()


class FakeLlm:
    """A FAKE LLM provider: a scripted OpenAI-compatible server on loopback, so the
    real provider client runs. Answers extraction prompts with one fact per user message
    "I love X", and every judgement with NEW. While `hold` is set, extraction requests
    hang (the process is killed during one); `delay` seconds hold up each extraction
    before it is answered."""

    def __init__(self):
        self.hold = threading.Event()
        self.delay = 0.0
        self.held = threading.Event()
        self.extractions = 0
        self.prompts = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                prompt = body["messages"][1]["content"]
                if prompt.startswith("Candidate: "):
                    answer = {"verdict": "NEW", "target": None, "reason": "scripted"}
                else:
                    fake.extractions += 1
                    fake.prompts.append(prompt)
                    if fake.hold.is_set():
                        fake.held.set()
                        time.sleep(60)
                        return
                    time.sleep(fake.delay)
                    facts = []
                    for match in re.finditer(r"^- id=(\S+) at=\S+: I love (.+)$", prompt, re.M):
                        facts.append({"text": f"The user loves {match.group(2)}.", "fact_type": "preference",
                                      "confidence": 0.9, "expires_in_hours": None, "valid_from": None,
                                      "valid_to": None, "source_episode_ids": [match.group(1)],
                                      "span": match.group(0)})
                    answer = {"facts": facts, "playbooks": []}
                reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": json.dumps(answer)}}],
                                    "usage": {"prompt_tokens": 10, "completion_tokens": 10}}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()


@pytest.fixture
def fake_llm():
    fake = FakeLlm()
    yield fake
    fake.close()

