"""Console benchmark: time to first render of a user's facts page, with 10,000 facts
(or as many as the first argument says), in headless Chromium against the release
binary on the embedded store, plus the page weight.

    cargo build --release -p cairn-server
    python3 tests/blackbox/bench_console.py [facts]

The facts go in through one mem0 import (embedded and gated like any write)."""

import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest  # noqa: E402  (the black-box harness: the real binary)
from test_console import chromium  # noqa: E402

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    target = os.environ.get("CARGO_TARGET_DIR", str(conftest.REPO / "target"))
    os.environ.setdefault("CAIRN_BIN", str(Path(target) / "release" / "cairn"))
    with tempfile.TemporaryDirectory() as directory:
        server = conftest.Server(Path(directory) / "data", {"CAIRN_MAX_TEXT_CHARS": "2000"}).start()
        try:
            token = server.mint("bench")
            started = time.monotonic()
            memories = [{"memory": f"Fact number {index}: the user noted item {index * 7919 % 100003}."}
                        for index in range(count)]
            request = urllib.request.Request(f"{server.base}/v1/users/big/import?format=mem0", method="POST",
                                             data=json.dumps({"results": memories}).encode(),
                                             headers={"authorization": f"Bearer {token}",
                                                      "content-type": "application/json"})
            report = json.loads(urllib.request.urlopen(request, timeout=3600).read())
            print(f"loaded {report['imported']['created']} facts in {time.monotonic() - started:.0f} s")

            options = webdriver.ChromeOptions()
            options.binary_location = chromium()
            for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"):
                options.add_argument(argument)
            driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
            try:
                driver.get(f"{server.base}/ui")
                driver.execute_script("sessionStorage.setItem('cairn.inspector.token', arguments[0])", token)
                timings = []
                for _ in range(5):
                    driver.get("about:blank")
                    driver.get(f"{server.base}/ui#/users/big/facts")
                    timings.append(driver.execute_async_script("""
                        const done = arguments[arguments.length - 1];
                        const check = () => document.querySelector('tr[data-fact]')
                            ? done(performance.now()) : requestAnimationFrame(check);
                        check();
                    """))
                rows = len(driver.find_elements("css selector", "tr[data-fact]"))
                timings.sort()
                print(f"first render of the facts page ({count} facts, {rows} rows shown): "
                      f"median {timings[2]:.0f} ms, best {timings[0]:.0f} ms, worst {timings[-1]:.0f} ms "
                      "(from navigation start, page load included)")
            finally:
                driver.quit()
            weight = sum(len(urllib.request.urlopen(f"{server.base}{path}").read())
                         for path in ("/ui", "/ui/assets/app.js", "/ui/assets/app.css"))
            print(f"page weight: {weight} bytes uncompressed (page, script, style; nothing else is loaded)")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
