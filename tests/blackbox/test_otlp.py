"""Traces reach an OTLP/HTTP collector when one is configured.

The collector here is a fake: a loopback HTTP server that records what it receives."""

import http.server
import threading


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
