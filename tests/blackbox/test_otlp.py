"""Traces reach an OTLP/HTTP collector when one is configured.

The collector here is a fake: a loopback HTTP server that records what it receives."""

import http.server
import json
import re
import threading
from pathlib import Path


class Collector(http.server.BaseHTTPRequestHandler):
    received = []

    def do_POST(self):  # noqa: N802 (the stdlib's naming)
        length = int(self.headers.get("content-length", 0))
        Collector.received.append((self.path, self.headers.get("content-type"), self.rfile.read(length)))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_spans_are_exported_over_otlp_http(make_server):
    Collector.received = []
    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{collector.server_address[1]}"
        server = make_server(extra_env={"CAIRN_OTLP_ENDPOINT": endpoint, "CAIRN_LOG_LEVEL": "info"}).start()
        token = server.mint("acme")
        assert server.call("POST", "/v1/users/u1/facts", token, {"text": "The user traces requests"}).status == 201
        server.stop()  # a graceful stop flushes the batch exporter
    finally:
        collector.shutdown()
    paths = [path for path, _, _ in Collector.received]
    assert "/v1/traces" in paths, paths
    body = b"".join(payload for path, _, payload in Collector.received if path == "/v1/traces")
    assert b"cairn" in body, "the service name travels with the spans"
    assert b"request" in body


def test_log_lines_carry_the_trace_id_when_tracing_is_on(make_server):
    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{collector.server_address[1]}"
        traced = make_server(extra_env={"CAIRN_OTLP_ENDPOINT": endpoint, "CAIRN_LOG_LEVEL": "info",
                                        "CAIRN_LOG_FORMAT": "json"}).start()
        plain = make_server(extra_env={"CAIRN_LOG_LEVEL": "info", "CAIRN_LOG_FORMAT": "json"}).start()
        for server in (traced, plain):
            token = server.mint("acme")
            assert server.call("POST", "/v1/users/u1/facts", token, {"text": "The user reads logs"}).status == 201
            server.stop()
    finally:
        collector.shutdown()

    def completed(server):
        lines = [json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")]
        return [line for line in lines if line.get("fields", {}).get("message") == "request completed"]

    traced_lines = completed(traced)
    assert traced_lines, traced.log.read_text()[-2000:]
    for line in traced_lines:
        trace_id = line["span"].get("trace_id", "")
        assert re.fullmatch(r"[0-9a-f]{32}", trace_id) and trace_id != "0" * 32, line
        assert line["span"]["request_id"]
    assert completed(plain) and all("trace_id" not in line["span"] for line in completed(plain))


def test_every_logged_field_is_in_the_log_fields_reference(make_server, tmp_path):
    """What the service's own modules write at debug level, on requests that succeed and
    one that fails, uses only fields the reference page lists."""
    reference = (Path(__file__).resolve().parents[2] / "docs/src/reference/logs.md").read_text()
    listed = set(re.findall(r"^\| `([a-z_]+)` \|", reference, re.MULTILINE))
    server = make_server(extra_env={"CAIRN_LOG_LEVEL": "debug", "CAIRN_LOG_FORMAT": "json"}).start()
    token = server.mint("acme")
    assert server.call("POST", "/v1/users/u1/facts", token, {"text": "The user reads references"}).status == 201
    assert server.call("POST", "/v1/users/u1/recall", token, {"query": "references"}).status == 200
    assert server.call("POST", "/v1/users/u1/facts", token, {"text": ""}).status == 422
    server.stop()
    lines = [json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")]
    assert any(line.get("span", {}).get("tenant") == "acme" for line in lines), lines[-5:]
    seen = set()
    for line in lines:
        assert {"timestamp", "level", "target", "fields"} <= line.keys(), line
        if not line["target"].startswith("cairn"):
            continue  # a library's own debug lines
        seen |= {key for key in line["fields"] if key != "message"}
        seen |= {key for key in line.get("span", {}) if key != "name"}
    assert {"request_id", "route", "status", "latency_ms"} <= seen, seen
    assert seen <= listed, f"logged but not in the reference: {sorted(seen - listed)}"
