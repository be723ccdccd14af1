"""RS256 with a PEM public key and ES256 with a JWKS document, minted by the CLI."""

import base64
import json

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa


def pem_private(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def pem_public(key):
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


def b64url(number: int, length: int) -> str:
    return base64.urlsafe_b64encode(number.to_bytes(length, "big")).rstrip(b"=").decode()


def start_without_secret(make_server, tmp_path, keys_file):
    server = make_server(tmp_path / "keys-data", {"CAIRN_JWT_PUBLIC_KEYS": str(keys_file)})
    del server.env["CAIRN_JWT_SECRET"]
    return server.start()


def test_rs256_pem(make_server, tmp_path):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (tmp_path / "public.pem").write_bytes(pem_public(key))
    (tmp_path / "private.pem").write_bytes(pem_private(key))
    (tmp_path / "stranger.pem").write_bytes(pem_private(stranger))
    server = start_without_secret(make_server, tmp_path, tmp_path / "public.pem")
    good = server.mint("acme", extra=["--private-key", str(tmp_path / "private.pem")])
    bad = server.mint("acme", extra=["--private-key", str(tmp_path / "stranger.pem")])
    assert server.call("POST", "/v1/users/u1/facts", good, {"text": "The user signs with RSA"}).status == 201
    refused = server.call("POST", "/v1/users/u1/facts", bad, {"text": "forged"})
    assert refused.status == 401 and refused.json()["error"]["code"] == "invalid_token"
    assert len(server.call("GET", "/v1/users/u1/facts", good).json()["items"]) == 1


def test_es256_jwks(make_server, tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    numbers = key.public_key().public_numbers()
    jwks = {"keys": [{"kty": "EC", "crv": "P-256", "kid": "k1", "use": "sig", "alg": "ES256",
                      "x": b64url(numbers.x, 32), "y": b64url(numbers.y, 32)}]}
    (tmp_path / "jwks.json").write_text(json.dumps(jwks))
    (tmp_path / "ec.pem").write_bytes(pem_private(key))
    other = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "other.pem").write_bytes(pem_private(other))
    server = start_without_secret(make_server, tmp_path, tmp_path / "jwks.json")
    token = server.mint("acme", scope="memory:read", extra=["--private-key", str(tmp_path / "ec.pem")])
    assert server.call("GET", "/v1/users/u1/facts", token).status == 200
    assert server.call("POST", "/v1/users/u1/facts", token, {"text": "no write scope"}).status == 403
    forged = server.mint("acme", extra=["--private-key", str(tmp_path / "other.pem")])
    assert server.call("GET", "/v1/users/u1/facts", forged).status == 401
