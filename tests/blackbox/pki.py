"""Test certificates made with openssl: a CA, a node certificate for 127.0.0.1 and
localhost, a client certificate (common name `cairn-mtls`) for mutual TLS, and a second
CA that signed nothing the nodes trust."""

import subprocess
from pathlib import Path


def _run(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(directory, name, subject):
    _run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj", subject,
         "-keyout", f"{name}-key.pem", "-out", f"{name}.pem", cwd=directory)


def _signed(directory, name, subject, ca, extensions):
    (directory / f"{name}.ext").write_text(extensions)
    _run("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
         "-keyout", f"{name}-key.pem", "-out", f"{name}.csr", cwd=directory)
    _run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}-key.pem",
         "-CAcreateserial", "-days", "30", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=directory)


def make_pki(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    _ca(directory, "ca", "/CN=cairn-test-ca")
    _ca(directory, "rogue-ca", "/CN=somebody-else")
    _signed(directory, "node", "/CN=cairn-node", "ca",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
            "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n")
    _signed(directory, "client", "/CN=cairn-mtls", "ca",
            "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n")
    _signed(directory, "rogue-client", "/CN=cairn-mtls", "rogue-ca",
            "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n")
    return directory
