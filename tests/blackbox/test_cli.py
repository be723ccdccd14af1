"""The command line: configuration errors name the key, dev mode, minting, bootstrap."""

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


def test_bootstrap_is_idempotent(tmp_path):
    env = base_env(tmp_path)
    for _ in range(2):
        result = run(["bootstrap"], env)
        assert result.returncode == 0, result.stderr
    assert (tmp_path / "data" / "cairn.sqlite3").exists()


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
