"""The command line: configuration errors name the key, dev mode, minting, bootstrap."""

import json
import subprocess

from conftest import REPO, SECRET, binary, free_port


def run(args, env, timeout=30):
    return subprocess.run([binary(), *args], env=env, capture_output=True, text=True, timeout=timeout)


def base_env(tmp_path):
    return {"PATH": "/usr/bin:/bin", "CAIRN_DATA_DIR": str(tmp_path / "data"), "CAIRN_JWT_SECRET": SECRET,
            "CAIRN_MODELS_DIR": str(REPO / ".models")}


def test_missing_models_stop_the_service_with_the_fix(tmp_path):
    result = run(["serve"], {**base_env(tmp_path), "CAIRN_MODELS_DIR": str(tmp_path / "no-models")})
    assert result.returncode != 0
    assert "libonnxruntime.so" in result.stderr and "scripts/setup" in result.stderr, result.stderr


def test_bad_configuration_names_the_key(tmp_path):
    env = base_env(tmp_path)
    for key, value in [("CAIRN_LISTEN", "not-an-address"), ("CAIRN_RATE_LIMIT_BURST", "lots"),
                       ("CAIRN_JWT_SECRET", "short"), ("CAIRN_BACKEND", "opensearch")]:
        result = run(["serve"], {**env, key: value})
        assert result.returncode != 0
        expected = "CAIRN_CLUSTER_URL" if key == "CAIRN_BACKEND" else key
        assert expected in result.stderr, result.stderr


def test_serve_refuses_to_start_without_a_key(tmp_path):
    env = base_env(tmp_path)
    del env["CAIRN_JWT_SECRET"]
    result = run(["serve"], env)
    assert result.returncode != 0
    assert "CAIRN_JWT_SECRET" in result.stderr


def test_dev_mode_generates_a_secret_the_cli_can_use(make_server, tmp_path):
    server = make_server(tmp_path / "dev", {"CAIRN_DEV": "true"})
    del server.env["CAIRN_JWT_SECRET"]
    server.start()
    secret_file = tmp_path / "dev" / "dev-jwt-secret"
    assert secret_file.exists() and len(secret_file.read_text().strip()) >= 32
    assert (secret_file.stat().st_mode & 0o077) == 0, "the secret is private to its owner"
    token = server.mint("acme")
    assert server.call("GET", "/v1/users/u1/facts", token).status == 200


def test_mint_validates_its_arguments(tmp_path):
    env = base_env(tmp_path)
    result = run(["token", "mint", "--tenant", "acme", "--scope", "memory:everything"], env)
    assert result.returncode != 0 and "--scope" in result.stderr
    result = run(["token", "mint", "--tenant", "bad tenant", "--scope", "memory:read"], env)
    assert result.returncode != 0 and "--tenant" in result.stderr
    result = run(["token", "mint", "--tenant", "acme", "--scope", "memory:read", "--ttl", "soon"], env)
    assert result.returncode != 0 and "--ttl" in result.stderr


def test_mint_makes_tokens_its_own_server_accepts(make_server, tmp_path):
    """Audience and issuer allow-lists and a maximum lifetime: the CLI mints with the
    first of each list, and refuses a lifetime the server would refuse."""
    server = make_server(tmp_path / "lists", {"CAIRN_JWT_AUDIENCE": "memory-api, other-api",
                                              "CAIRN_JWT_ISSUER": "https://idp.example, https://old.example",
                                              "CAIRN_JWT_MAX_TTL_SECONDS": "600"}).start()
    too_long = run(["token", "mint", "--tenant", "acme", "--scope", "memory:read", "--ttl", "1h"], server.env)
    assert too_long.returncode != 0
    assert "--ttl" in too_long.stderr and "CAIRN_JWT_MAX_TTL_SECONDS" in too_long.stderr, too_long.stderr
    token = server.mint("acme", ttl="5m")
    assert server.call("GET", "/v1/users/u1/facts", token).status == 200


def test_bootstrap_is_idempotent(tmp_path):
    env = base_env(tmp_path)
    for _ in range(2):
        result = run(["bootstrap"], env)
        assert result.returncode == 0, result.stderr
    assert (tmp_path / "data" / "cairn.sqlite3").exists()


def test_bootstrap_refuses_a_store_a_service_holds(make_server, tmp_path):
    """Opening the embedded store may upgrade its schema: never under a running server."""
    server = make_server(tmp_path / "held").start()
    result = run(["bootstrap"], server.env)
    assert result.returncode != 0, result.stdout
    assert "stop the service" in result.stderr, result.stderr
    server.stop()
    result = run(["bootstrap"], server.env)
    assert result.returncode == 0, result.stderr


def test_dev_mode_adds_no_secret_beside_an_identity_provider(make_server, tmp_path):
    """With a JWKS URL configured, development mode generates no HS256 secret: the
    identity provider's keys are the only ones trusted."""
    server = make_server(tmp_path / "dev-idp", {"CAIRN_DEV": "true",
                                                "CAIRN_JWT_JWKS_URL": f"http://127.0.0.1:{free_port()}/jwks.json"})
    del server.env["CAIRN_JWT_SECRET"]
    server.start()
    assert not (tmp_path / "dev-idp" / "dev-jwt-secret").exists()
    minted = run(["token", "mint", "--tenant", "acme", "--scope", "memory:read"], server.env)
    if minted.returncode == 0:
        assert server.call("GET", "/v1/users/u1/facts", minted.stdout.strip()).status == 401


def test_healthcheck_reports_readiness_without_a_shell(make_server, tmp_path):
    server = make_server(tmp_path / "health")
    # The service listens on every address; the check asks on loopback.
    server.env["CAIRN_LISTEN"] = f"0.0.0.0:{server.port}"
    server.start()
    ready = run(["healthcheck"], server.env)
    assert ready.returncode == 0 and ready.stdout.strip() == "ready", ready.stderr
    server.stop()
    down = run(["healthcheck", "--timeout", "2"], server.env)
    assert down.returncode != 0 and "nothing answers" in down.stderr, down.stderr
    # A service that answers but whose store is unreachable is not ready either.
    unready = make_server(tmp_path / "unready", {"CAIRN_BACKEND": "opensearch",
                                                 "CAIRN_CLUSTER_URL": f"http://127.0.0.1:{free_port()}"}).start()
    answer = run(["healthcheck"], unready.env)
    assert answer.returncode != 0 and "not ready" in answer.stderr and "503" in answer.stderr, answer.stderr


def self_signed(directory, name):
    """A fresh self-signed certificate for localhost and its key, as PEM files."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=1))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
                   .sign(key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (directory / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))
    return certificate.public_bytes(serialization.Encoding.DER)


def test_native_https_serves_and_reloads_a_renewed_certificate(make_server, tmp_path):
    import os
    import socket
    import ssl
    import time

    certificates = tmp_path / "tls"
    first = self_signed(certificates, "cairn-first")
    server = make_server(tmp_path / "https", {"CAIRN_TLS_CERT": str(certificates / "tls.crt"),
                                               "CAIRN_TLS_KEY": str(certificates / "tls.key")})
    server.base = server.base.replace("http://", "https://")

    def presented():
        context = ssl.create_default_context(cafile=None)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
            with context.wrap_socket(raw, server_hostname="localhost") as wrapped:
                wrapped.sendall(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                answer = wrapped.recv(4096)
                return wrapped.getpeercert(binary_form=True), answer

    # Server.start polls /healthz over plain HTTP, which an HTTPS listener refuses.
    server.data_dir.mkdir(parents=True, exist_ok=True)
    with open(server.log, "ab") as log:
        server.process = subprocess.Popen([binary(), "serve"], env=server.env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            certificate, answer = presented()
            break
        except OSError:
            assert time.monotonic() < deadline and server.process.poll() is None, server.log.read_text()
            time.sleep(0.1)
    assert certificate == first and answer.startswith(b"HTTP/1.1 200"), answer
    ready = run(["healthcheck"], server.env)
    assert ready.returncode == 0 and ready.stdout.strip() == "ready", ready.stderr

    # A renewed certificate is served without a restart.
    renewed_directory = tmp_path / "renewed"
    renewed = self_signed(renewed_directory, "cairn-renewed")
    os.replace(renewed_directory / "tls.key", certificates / "tls.key")
    os.replace(renewed_directory / "tls.crt", certificates / "tls.crt")
    deadline = time.monotonic() + 10
    while presented()[0] != renewed:
        assert time.monotonic() < deadline, "the renewed certificate was never served"
        time.sleep(0.3)
    assert run(["healthcheck"], server.env).returncode == 0
    # A half-done renewal (a new certificate beside the old key) keeps the served pair,
    # and so does a broken one; the health check reports the healthy server ready.
    half_done = tmp_path / "half-done"
    self_signed(half_done, "cairn-half-done")
    os.replace(half_done / "tls.crt", certificates / "tls.crt")
    time.sleep(1.5)
    assert presented()[0] == renewed
    assert run(["healthcheck"], server.env).returncode == 0
    (certificates / "tls.crt").write_text("not a certificate")
    time.sleep(1.5)
    assert presented()[0] == renewed
    health = run(["healthcheck"], server.env)
    assert health.returncode == 0 and health.stdout.strip() == "ready", health.stderr
    server.stop()


def test_https_needs_both_files(tmp_path):
    result = run(["serve"], {**base_env(tmp_path), "CAIRN_TLS_CERT": str(tmp_path / "tls.crt")})
    assert result.returncode != 0 and "CAIRN_TLS_KEY" in result.stderr, result.stderr


def test_dashboards_export_writes_saved_objects_for_the_prefix(tmp_path):
    for target, version_field in [("kibana", "coreMigrationVersion"), ("opensearch-dashboards", "migrationVersion")]:
        out = tmp_path / f"{target}.ndjson"
        env = dict(base_env(tmp_path), CAIRN_INDEX_PREFIX="ops-memory")
        result = run(["dashboards", "export", "--target", target, "--out", str(out)], env)
        assert result.returncode == 0, result.stderr
        objects = [json.loads(line) for line in out.read_text().splitlines()]
        summary, objects = objects[-1], objects[:-1]
        assert summary["exportedCount"] == len(objects) and summary["missingRefCount"] == 0
        kinds = {item["type"] for item in objects}
        assert kinds == {"index-pattern", "search", "visualization", "dashboard"}, kinds
        assert all(item["id"].startswith("ops-memory-") and version_field in item for item in objects)
        titles = {item["attributes"]["title"] for item in objects if item["type"] == "index-pattern"}
        assert "ops-memory-audit" in titles and "ops-memory-decisions" in titles, titles
    refused = run(["dashboards", "export", "--target", "grafana"], base_env(tmp_path))
    assert refused.returncode != 0 and "kibana or opensearch-dashboards" in refused.stderr


def test_reembed_moves_the_vectors_beside_a_running_service(make_server, tmp_path):
    """`cairn reembed` builds the new model's vectors while the old service serves, then
    switches in one step; the old service then refuses what needs vectors, naming the
    model to restart with, and a service on the new model finds the same memories."""
    data = tmp_path / "moved"
    old = make_server(data).start()
    token = old.mint("acme")
    for text in ["My dog is called Rex", "I live in Porto", "I work as a nurse"]:
        answer = old.call("POST", "/v1/users/u1/episodes", token,
                          {"messages": [{"role": "user", "content": text}], "consolidate": "sync"})
        assert answer.status == 201, answer.body

    def top(server, query, tiers=("semantic",)):
        answer = server.call("POST", "/v1/users/u1/recall", token,
                             {"query": query, "tiers": list(tiers), "explain": True, "k": 3})
        assert answer.status == 200, answer.body
        return answer.json()["hits"]

    assert "Rex" in top(old, "what is my pet's name")[0]["text"]
    facts_before = sorted(item["text"] for item in old.call("GET", "/v1/users/u1/facts", token).json()["items"])

    env = dict(old.env, CAIRN_EMBEDDING_MODEL="e5-small-v2")
    moved = run(["reembed", "--batch", "2"], env, timeout=120)
    assert moved.returncode == 0, moved.stderr
    assert "e5-small-v2/384" in moved.stdout and "CAIRN_EMBEDDING_MODEL=e5-small-v2" in moved.stdout, moved.stdout
    assert "re-embedding [" in moved.stderr and "records/s" in moved.stderr, moved.stderr

    # The service still on MiniLM: its vectors no longer compare, so it refuses (503, as
    # any store outage is to a caller) and tells its operator what to do in its log.
    refused = old.call("POST", "/v1/users/u1/recall", token, {"query": "what is my pet's name"})
    assert refused.status == 503 and refused.json()["error"]["code"] == "unavailable", refused.body
    assert "restart the service with CAIRN_EMBEDDING_MODEL=e5-small-v2" in old.log.read_text()
    write = old.call("POST", "/v1/users/u1/episodes", token,
                     {"messages": [{"role": "user", "content": "I like tea"}], "consolidate": "none"})
    assert write.status == 503, write.body
    old.stop()

    stale = make_server(data)
    try:
        stale.start()
        raise AssertionError("a service on the old model started on the moved store")
    except RuntimeError as error:
        assert "cairn reembed" in str(error), error
    stale.stop()

    new = make_server(data, {"CAIRN_EMBEDDING_MODEL": "e5-small-v2"}).start()
    hits = top(new, "what is my pet's name")
    assert "Rex" in hits[0]["text"] and hits[0]["explain"]["knn_rank"] == 1, hits
    assert "Porto" in top(new, "which city do I live in", ("episodic",))[0]["text"]
    facts_after = sorted(item["text"] for item in new.call("GET", "/v1/users/u1/facts", token).json()["items"])
    assert facts_after == facts_before

    again = run(["reembed"], dict(new.env), timeout=120)
    assert again.returncode == 0 and "0 records" in again.stdout, (again.stdout, again.stderr)
