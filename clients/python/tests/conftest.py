"""Starts the real `cairn` binary for the client's tests (the black-box harness)."""

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("cairn_blackbox_harness", REPO / "tests" / "blackbox" / "conftest.py")
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)
Server = harness.Server


@pytest.fixture
def service(tmp_path):
    server = Server(tmp_path / "data").start()
    yield server
    server.stop()


@pytest.fixture
def make_service(tmp_path):
    started = []

    def make(extra_env=None):
        server = Server(tmp_path / f"data{len(started)}", extra_env).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()
