"""The examples of the docs run as written. Every fenced block whose info string is
`sh,run` in README.md or docs/src is executed, page by page and in order, by bash with
`-euo pipefail` against a fresh `cairn serve` in development mode (the way `scripts/run`
serves), its data directory at `./data` of the working directory. The only changes are
the binary's path and the port. A block that cannot run here (Helm on a real cluster,
an MCP client that is not installed) is left unmarked."""

import re
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, Server, binary

BLOCK = re.compile(r"^```sh,run\n(.*?)^```$", re.M | re.S)


def pages():
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs" / "src").rglob("*.md"))]:
        blocks = BLOCK.findall(path.read_text())
        if blocks:
            found.append((path.relative_to(REPO).as_posix(), blocks))
    return found


def test_the_marked_examples_are_found():
    found = dict(pages())
    for page in ["README.md", "docs/src/getting-started.md", "docs/src/guides/mcp.md"]:
        assert page in found, f"{page} has no block marked sh,run"


@pytest.mark.parametrize("page,blocks", pages(), ids=[page for page, _ in pages()])
def test_a_pages_examples_run_as_written(tmp_path, page, blocks):
    served = Server(tmp_path / "data", {"CAIRN_DEV": "true"})
    served.env.pop("CAIRN_JWT_SECRET")
    served.start()
    try:
        script = "\n".join(blocks)
        script = script.replace("target/debug/cairn", str(Path(binary()).resolve()))
        script = script.replace("127.0.0.1:8080", f"127.0.0.1:{served.port}")
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env={"PATH": served.env["PATH"], "HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, f"{page}:\n{result.stdout}\n{result.stderr}"
    finally:
        served.stop()
