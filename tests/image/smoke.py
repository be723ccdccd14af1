#!/usr/bin/env python3
"""Smoke test of the container image (run by `scripts/image smoke`): start it with a
named volume, check readiness, a write and a recall that finds it, the image's health
check, that the service does not run as root, and that a restarted container still has
the write. Then bring up deploy/compose.yaml with podman-compose and wait for its health
check to pass. Prints the cold start time. Removes its containers and volumes."""

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

TAG = sys.argv[1]
NAME = f"cairn-smoke-{secrets.token_hex(4)}"
VOLUME = f"{NAME}-data"
SECRET = secrets.token_hex(32)


def podman(*args, check=True):
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {result.stderr.strip()}")
    return result


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


PORT = free_port()
BASE = f"http://127.0.0.1:{PORT}"


def call(method, path, token=None, body=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(BASE + path, data=data, method=method)
    request.add_header("content-type", "application/json")
    if token:
        request.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def wait_ready(deadline_seconds=120):
    started = time.monotonic()
    while time.monotonic() - started < deadline_seconds:
        try:
            if call("GET", "/readyz")[0] == 200:
                return time.monotonic() - started
        except OSError:
            pass
        state = podman("inspect", "--format", "{{.State.Status}}", NAME).stdout.strip()
        if state not in ("running", "created", "configured"):
            raise AssertionError(f"the container is {state}: {podman('logs', NAME, check=False).stderr[-2000:]}")
        time.sleep(0.2)
    raise AssertionError(f"not ready in {deadline_seconds} s: {podman('logs', NAME, check=False).stderr[-2000:]}")


def main():
    podman("volume", "create", VOLUME)
    try:
        started = time.monotonic()
        podman("run", "-d", "--name", NAME, "-p", f"127.0.0.1:{PORT}:8080", "-v", f"{VOLUME}:/data",
               "-e", f"CAIRN_JWT_SECRET={SECRET}", TAG)
        cold_start = wait_ready()
        print(f"smoke: cold start to ready {cold_start:.1f} s ({time.monotonic() - started:.1f} s with podman run)")

        uid = podman("exec", NAME, "id", "-u").stdout.strip()
        assert uid != "0", "the service runs as root"
        pid1_uid = podman("exec", NAME, "sh", "-c", "stat -c %u /proc/1").stdout.strip()
        assert pid1_uid == uid, (pid1_uid, uid)
        assert podman("exec", NAME, "cairn", "healthcheck").returncode == 0
        health = podman("healthcheck", "run", NAME, check=False)
        assert health.returncode == 0, f"the image's HEALTHCHECK failed: {health.stdout} {health.stderr}"

        token = podman("exec", NAME, "cairn", "token", "mint", "--tenant", "acme",
                       "--scope", "memory:read,memory:write").stdout.strip()
        status, written = call("POST", "/v1/users/ada/facts", token, {"text": "The user grows tomatoes on a balcony"})
        assert status == 201, written
        fact_id = written["fact"]["id"]
        status, recalled = call("POST", "/v1/users/ada/recall", token, {"query": "what does the user grow?", "k": 3})
        assert status == 200 and recalled["hits"] and recalled["hits"][0]["id"] == fact_id, recalled

        podman("restart", "--time", "20", NAME)
        wait_ready()
        status, found = call("GET", f"/v1/users/ada/facts/{fact_id}", token)
        assert status == 200 and found["text"] == "The user grows tomatoes on a balcony", found
        print(f"smoke: uid {uid}, write and recall, health check, restart kept the write")
    finally:
        podman("rm", "-f", "-t", "0", NAME, check=False)
        podman("volume", "rm", "-f", VOLUME, check=False)


def compose():
    """deploy/compose.yaml starts the image and its health check passes."""
    project = f"{NAME}-compose"
    port = free_port()
    env = {**os.environ, "CAIRN_JWT_SECRET": SECRET, "CAIRN_PORT": str(port)}
    command = [sys.executable, "-m", "podman_compose", "-p", project, "-f", "deploy/compose.yaml"]
    up = subprocess.run([*command, "up", "-d"], env=env, capture_output=True, text=True, timeout=300)
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        container = f"{project}_cairn_1"
        deadline = time.monotonic() + 120
        while podman("healthcheck", "run", container, check=False).returncode != 0:
            assert time.monotonic() < deadline, podman("logs", container, check=False).stderr[-2000:]
            time.sleep(0.5)
        status = podman("inspect", "--format", "{{.State.Health.Status}}", container).stdout.strip()
        assert status == "healthy", status
        print(f"smoke: deploy/compose.yaml is {status}")
    finally:
        subprocess.run([*command, "down", "-v"], env=env, capture_output=True, text=True, timeout=300)


if __name__ == "__main__":
    main()
    compose()
