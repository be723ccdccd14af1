"""The service on secured search clusters: TLS with a CA the test makes with openssl,
basic authentication, mutual TLS, and skipped verification, against a real
Elasticsearch node with security on (file and PKI realms) and a real OpenSearch node
with its security plugin. API keys and bearer tokens follow Elasticsearch's documented
header formats and are checked by a STAND-IN: a small local TLS proxy that verifies the
header and forwards to the unsecured test node (the bare Elasticsearch distribution
cannot create API keys: its `.security` mapping needs analysis-common).

Every failure must say which it is on /readyz, without the secret, answer 503
`unavailable` on routes, and heal by itself once the credentials work."""

import base64
import http.client
import json
import os
import ssl
import subprocess
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import REPO, cluster_url, delete_indices, wait_for
from pki import make_pki

SECURED_PORTS = {
    "elasticsearch": int(os.environ.get("CAIRN_TEST_SECURED_ELASTICSEARCH_PORT", "9260")),
    "opensearch": int(os.environ.get("CAIRN_TEST_SECURED_OPENSEARCH_PORT", "9270")),
}
PASSWORD = "s3cret-Pa55word-for-cairn"


def script(engine, *args, secure_dir, port):
    variable = "OPENSEARCH_PORT" if engine == "opensearch" else "ELASTICSEARCH_PORT"
    env = dict(os.environ, **{variable: str(port), f"CAIRN_{engine.upper()}_SECURE_DIR": str(secure_dir)})
    result = subprocess.run([str(REPO / "scripts" / engine), *args], env=env, timeout=600,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def secured_node(engine, pki, users):
    """Starts (fresh) the secured node of `engine` with the given users; returns its URL
    and a function that stops it."""
    port = SECURED_PORTS[engine]
    # A node left from an earlier run may hold other certificates.
    script(engine, "stop", secure_dir=pki, port=port)
    if engine == "elasticsearch":
        script(engine, "start", secure_dir=pki, port=port)
        for name, password in users:
            script(engine, "user", name, password, secure_dir=pki, port=port)
    else:
        env_users = " ".join(f"{name}:{password}" for name, password in users)
        os.environ["CAIRN_OPENSEARCH_USERS"] = env_users
        try:
            script(engine, "start", secure_dir=pki, port=port)
        finally:
            del os.environ["CAIRN_OPENSEARCH_USERS"]
    return f"https://127.0.0.1:{port}", lambda: script(engine, "stop", secure_dir=pki, port=port)


@pytest.fixture(scope="module")
def secured_elasticsearch(pki):
    cluster_url("elasticsearch")
    url, stop = secured_node("elasticsearch", pki, [("cairn", PASSWORD)])
    yield url
    stop()


@pytest.fixture(scope="module")
def secured_opensearch(pki):
    cluster_url("opensearch")
    url, stop = secured_node("opensearch", pki, [("cairn", PASSWORD)])
    yield url
    stop()


def start(make_server, tmp_path, engine, url, settings):
    prefix = f"cairn-sec-{os.urandom(6).hex()}"
    env = {"CAIRN_BACKEND": engine, "CAIRN_CLUSTER_URL": url, "CAIRN_INDEX_PREFIX": prefix, **settings}
    server = make_server(tmp_path / prefix, env).start()
    server.prefix = prefix
    return server, server.mint("acme")


def works(server, token):
    """Ready, and a write is recalled."""
    assert wait_for(lambda: server.call("GET", "/readyz").status == 200, 90), server.call("GET", "/readyz").body
    written = server.call("POST", "/v1/users/u1/facts", token, {"text": "The user sails a blue catamaran"})
    assert written.status == 201, written.body
    recall = server.call("POST", "/v1/users/u1/recall", token, {"query": "catamaran", "tiers": ["semantic"]})
    assert recall.status == 200 and recall.json()["hits"], recall.body


def refused(server, token, expected, secrets):
    """Not ready with `expected` in the detail, routes 503 `unavailable`, and no secret
    anywhere: not in the detail, the error bodies or the log."""
    detail = {}

    def says_why():
        answer = server.call("GET", "/readyz")
        detail["body"] = answer.body
        return answer.status == 503 and expected in (answer.json() or {}).get("detail", "")

    assert wait_for(says_why, 30), detail.get("body")
    write = server.call("POST", "/v1/users/u1/facts", token, {"text": "The user likes tea"})
    assert write.status == 503 and write.json()["error"]["code"] == "unavailable", write.body
    log = server.log.read_text()
    for secret in secrets:
        assert secret not in detail["body"] and secret not in write.body
        assert secret not in log, "a secret reached the log"
    return detail["body"]


def test_elasticsearch_basic_auth_with_a_custom_ca(make_server, tmp_path, pki, secured_elasticsearch):
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD + "\n")
    server, token = start(make_server, tmp_path, "elasticsearch", secured_elasticsearch, {
        "CAIRN_CLUSTER_USERNAME": "cairn", "CAIRN_CLUSTER_PASSWORD_FILE": str(password_file),
        "CAIRN_CLUSTER_CA_CERT": str(pki / "ca.pem")})
    works(server, token)
    assert PASSWORD not in server.log.read_text()


def test_elasticsearch_wrong_password_is_reported_and_heals(make_server, tmp_path, pki, secured_elasticsearch):
    late = f"late-{os.urandom(3).hex()}"
    secret = f"{PASSWORD}-{late}"
    server, token = start(make_server, tmp_path, "elasticsearch", secured_elasticsearch, {
        "CAIRN_CLUSTER_USERNAME": late, "CAIRN_CLUSTER_PASSWORD": secret,
        "CAIRN_CLUSTER_CA_CERT": str(pki / "ca.pem")})
    body = refused(server, token, "rejected the credentials", [secret])
    assert "basic authentication" in body, body
    # The operator creates the user with the password Cairn holds: no restart needed.
    script("elasticsearch", "user", late, secret, secure_dir=pki, port=SECURED_PORTS["elasticsearch"])
    works(server, token)


def test_elasticsearch_unknown_ca_is_reported(make_server, tmp_path, pki, secured_elasticsearch):
    server, token = start(make_server, tmp_path, "elasticsearch", secured_elasticsearch, {
        "CAIRN_CLUSTER_USERNAME": "cairn", "CAIRN_CLUSTER_PASSWORD": PASSWORD,
        "CAIRN_CLUSTER_CA_CERT": str(pki / "rogue-ca.pem")})
    refused(server, token, "unknown CA", [PASSWORD])


def test_elasticsearch_mutual_tls(make_server, tmp_path, pki, secured_elasticsearch):
    """The PKI realm authenticates the client certificate alone; one from another CA is
    refused during the handshake."""
    server, token = start(make_server, tmp_path, "elasticsearch", secured_elasticsearch, {
        "CAIRN_CLUSTER_CA_CERT": str(pki / "ca.pem"),
        "CAIRN_CLUSTER_CLIENT_CERT": str(pki / "client.pem"),
        "CAIRN_CLUSTER_CLIENT_KEY": str(pki / "client-key.pem")})
    works(server, token)
    other, other_token = start(make_server, tmp_path, "elasticsearch", secured_elasticsearch, {
        "CAIRN_CLUSTER_CA_CERT": str(pki / "ca.pem"),
        "CAIRN_CLUSTER_CLIENT_CERT": str(pki / "rogue-client.pem"),
        "CAIRN_CLUSTER_CLIENT_KEY": str(pki / "rogue-client-key.pem")})
    refused(other, other_token, "refused the client certificate", [])


def test_elasticsearch_skipped_verification_is_warned(make_server, tmp_path, secured_elasticsearch):
    server, token = start(make_server, tmp_path, "elasticsearch", secured_elasticsearch, {
        "CAIRN_CLUSTER_USERNAME": "cairn", "CAIRN_CLUSTER_PASSWORD": PASSWORD,
        "CAIRN_CLUSTER_TLS_INSECURE": "true"})
    works(server, token)
    log = server.log.read_text()
    assert "CAIRN_CLUSTER_TLS_INSECURE" in log and "not verified" in log, log[-2000:]


class StandIn:
    """A STAND-IN for a secured Elasticsearch front: TLS with the test CA's node
    certificate, an `Authorization` check in Elasticsearch's documented formats
    (`ApiKey base64(id:key)`, `Bearer token`) answering 401 with Elasticsearch's error
    body (an expired API key says so), and everything else forwarded to the unsecured
    test node with the header removed."""

    def __init__(self, pki, upstream, accepted, expired):
        self.seen = []
        target = urllib.parse.urlsplit(upstream)
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle_any(self):
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else None
                authorization = self.headers.get("authorization", "")
                stand_in.seen.append(authorization)
                if authorization not in accepted:
                    more = "API key: api key is expired" if authorization in expired else None
                    error = {"type": "security_exception",
                             "reason": "unable to authenticate with provided credentials and anonymous access "
                                       "is not allowed for this request"}
                    if more:
                        error["additional_unsuccessful_credentials"] = more
                    self.reply(401, json.dumps({"error": error, "status": 401}).encode(),
                               {"content-type": "application/json", "x-elastic-product": "Elasticsearch"})
                    return
                connection = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                headers = {key: value for key, value in self.headers.items()
                           if key.lower() in ("content-type", "accept")}
                connection.request(self.command, self.path, body=body, headers=headers)
                answer = connection.getresponse()
                payload = answer.read()
                forwarded = {key: value for key, value in answer.getheaders()
                             if key.lower() in ("content-type", "x-elastic-product")}
                self.reply(answer.status, payload, forwarded)
                connection.close()

            def reply(self, status, payload, headers):
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = handle_any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki / "node.pem", pki / "node-key.pem")
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()


def test_api_keys_and_bearer_tokens_through_a_stand_in(make_server, tmp_path, pki):
    upstream = cluster_url("elasticsearch")
    api_key = base64.b64encode(b"VuaCfGcBCdbkQm-e5aOx:ui2lp2axTNmsyakw9tvNnw").decode()
    expired = base64.b64encode(b"expiredKeyId:expiredSecretPart").decode()
    bearer = "dGhpcyBpcyBub3QgYSByZWFsIHRva2VuIGJ1dCBpdCBpcyBjb29s"
    stand_in = StandIn(pki, upstream, accepted={f"ApiKey {api_key}", f"Bearer {bearer}"},
                       expired={f"ApiKey {expired}"})
    prefixes = []
    try:
        ca = {"CAIRN_CLUSTER_CA_CERT": str(pki / "ca.pem")}
        key_file = tmp_path / "api-key"
        key_file.write_text(api_key + "\n")
        server, token = start(make_server, tmp_path, "elasticsearch", stand_in.url,
                              {"CAIRN_CLUSTER_API_KEY_FILE": str(key_file), **ca})
        prefixes.append(server.prefix)
        works(server, token)
        server.stop()
        assert f"ApiKey {api_key}" in stand_in.seen and all(seen == f"ApiKey {api_key}" for seen in stand_in.seen)

        operator = "operator-scrape-credential-0123456789"
        stale, stale_token = start(make_server, tmp_path, "elasticsearch", stand_in.url,
                                   {"CAIRN_CLUSTER_API_KEY": expired, "CAIRN_METRICS_TOKEN": operator, **ca})
        prefixes.append(stale.prefix)
        body = refused(stale, stale_token, "rejected the credentials", [expired])
        assert "API key" in body, body
        # The cluster's own words are for the operator's credential, not the public body.
        assert "api key is expired" not in body, body
        detailed = stale.call("GET", "/readyz", operator)
        assert "api key is expired" in (detailed.json() or {}).get("detail", ""), detailed.body
        assert expired not in detailed.body
        stale.stop()

        stand_in.seen.clear()
        server, token = start(make_server, tmp_path, "elasticsearch", stand_in.url,
                              {"CAIRN_CLUSTER_BEARER_TOKEN": bearer, **ca})
        prefixes.append(server.prefix)
        works(server, token)
        assert stand_in.seen and all(seen == f"Bearer {bearer}" for seen in stand_in.seen)
    finally:
        stand_in.close()
        # The stand-in forwards to the shared test node: leave nothing behind there.
        for prefix in prefixes:
            delete_indices(upstream, prefix)


def test_opensearch_security_plugin_basic_auth_and_tls(make_server, tmp_path, pki, secured_opensearch):
    server, token = start(make_server, tmp_path, "opensearch", secured_opensearch, {
        "CAIRN_CLUSTER_USERNAME": "cairn", "CAIRN_CLUSTER_PASSWORD": PASSWORD,
        "CAIRN_CLUSTER_CA_CERT": str(pki / "ca.pem")})
    works(server, token)
    wrong, wrong_token = start(make_server, tmp_path, "opensearch", secured_opensearch, {
        "CAIRN_CLUSTER_USERNAME": "cairn", "CAIRN_CLUSTER_PASSWORD": "not-" + PASSWORD,
        "CAIRN_CLUSTER_CA_CERT": str(pki / "ca.pem")})
    refused(wrong, wrong_token, "rejected the credentials", ["not-" + PASSWORD])
    untrusted, untrusted_token = start(make_server, tmp_path, "opensearch", secured_opensearch, {
        "CAIRN_CLUSTER_USERNAME": "cairn", "CAIRN_CLUSTER_PASSWORD": PASSWORD,
        "CAIRN_CLUSTER_CA_CERT": str(pki / "rogue-ca.pem")})
    refused(untrusted, untrusted_token, "unknown CA", [PASSWORD])


def test_opensearch_security_plugin_mutual_tls(make_server, tmp_path, pki, secured_opensearch):
    server, token = start(make_server, tmp_path, "opensearch", secured_opensearch, {
        "CAIRN_CLUSTER_CA_CERT": str(pki / "ca.pem"),
        "CAIRN_CLUSTER_CLIENT_CERT": str(pki / "client.pem"),
        "CAIRN_CLUSTER_CLIENT_KEY": str(pki / "client-key.pem")})
    works(server, token)
