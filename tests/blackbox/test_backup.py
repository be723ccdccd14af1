"""Backup and restore of the embedded store through the real binary, under write load."""

import subprocess
import threading
import time

import pytest

from conftest import binary


def cli(args, env, timeout=120):
    return subprocess.run([binary(), *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_a_backup_under_write_load_restores_every_acknowledged_write(make_server, tmp_path):
    server = make_server(tmp_path / "live").start()
    token = server.mint("acme")
    acknowledged = []
    stop = threading.Event()

    def write(worker):
        index = 0
        while not stop.is_set():
            index += 1
            answer = server.call("POST", "/v1/users/ada/facts", token,
                                 {"text": f"The user keeps {index} books on shelf {worker}"})
            assert answer.status == 201, answer.body
            acknowledged.append(answer.json()["fact"]["id"])

    writers = [threading.Thread(target=write, args=(worker,)) for worker in range(2)]
    for thread in writers:
        thread.start()
    try:
        time.sleep(1.0)
        before = list(acknowledged)
        target = tmp_path / "cairn-backup.sqlite3"
        backed_up = cli(["backup", "--to", str(target)], server.env)
        assert backed_up.returncode == 0, backed_up.stderr
        assert "backed up" in backed_up.stdout and target.is_file()
        during = len(acknowledged)
        time.sleep(0.5)
    finally:
        stop.set()
        for thread in writers:
            thread.join()
    assert len(before) > 10 and len(acknowledged) > during, "writes went on around the backup"

    # The running server's directory cannot be restored over, and is left as it was.
    refused = cli(["restore", "--from", str(target)], server.env)
    assert refused.returncode != 0 and "in use" in refused.stderr, refused.stderr
    # Nor can a second server share it.
    with pytest.raises(RuntimeError, match="in use"):
        make_server(tmp_path / "live").start()
    assert server.call("GET", "/readyz").status == 200

    elsewhere = make_server(tmp_path / "restored")
    restored = cli(["restore", "--from", str(target)], elsewhere.env)
    assert restored.returncode == 0, restored.stderr
    elsewhere.start()
    token = elsewhere.mint("acme")
    for fact_id in before:
        found = elsewhere.call("GET", f"/v1/users/ada/facts/{fact_id}", token)
        assert found.status == 200, (fact_id, found.body)
    hits = elsewhere.call("POST", "/v1/users/ada/recall", token, {"query": "books on shelf", "k": 5}).json()["hits"]
    assert hits, "the restored store answers recalls"
