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


def rs256(key, kid, claims):
    """A compact RS256 JWS with a key id, signed here (the CLI mints without `kid`)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    def encode(value):
        raw = json.dumps(value, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    signing_input = f"{encode({'alg': 'RS256', 'typ': 'JWT', 'kid': kid})}.{encode(claims)}"
    signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return signing_input + "." + base64.urlsafe_b64encode(signature).rstrip(b"=").decode()


def rsa_jwk(key, kid):
    numbers = key.public_key().public_numbers()
    return {"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256",
            "n": b64url(numbers.n, 256), "e": b64url(numbers.e, 3)}


def test_jwks_url_rotates_keys_without_a_restart(make_server, tmp_path):
    import http.server
    import threading
    import time

    first = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    second = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    served = {"jwks": {"keys": [rsa_jwk(first, "k1")]}, "fetches": 0}

    class Jwks(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            served["fetches"] += 1
            body = json.dumps(served["jwks"]).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    idp = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Jwks)
    threading.Thread(target=idp.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{idp.server_address[1]}/.well-known/jwks.json"
        server = make_server(tmp_path / "jwks-data", {"CAIRN_JWT_JWKS_URL": url})
        del server.env["CAIRN_JWT_SECRET"]
        server.start()
        now = int(time.time())
        claims = {"sub": "svc", "tenant": "acme", "scope": "memory:read memory:write", "iat": now, "exp": now + 600}
        old = rs256(first, "k1", claims)
        assert server.call("GET", "/v1/users/u1/facts", old).status == 200
        assert served["fetches"] == 1, "fetched once at start, then cached"

        # The identity provider rotates: only the second key is served now.
        served["jwks"] = {"keys": [rsa_jwk(second, "k2")]}
        time.sleep(2.2)
        new = rs256(second, "k2", claims)
        assert server.call("POST", "/v1/users/u1/facts", new, {"text": "The user rotates keys"}).status == 201
        assert served["fetches"] == 2, "an unknown kid fetched the set again"
        refused = server.call("GET", "/v1/users/u1/facts", old)
        assert refused.status == 401 and refused.json()["error"]["code"] == "invalid_token"

        # Forged key ids cannot make the service hammer the provider.
        for attempt in range(5):
            forged = rs256(first, f"forged-{attempt}", claims)
            assert server.call("GET", "/v1/users/u1/facts", forged).status == 401
        assert served["fetches"] <= 3, served["fetches"]
    finally:
        idp.shutdown()


def test_a_hanging_identity_provider_stalls_no_request(make_server, tmp_path):
    """After its first answer the identity provider hangs. Once the cached key set is due
    for a refresh, tokens whose key is held are still answered at once while one refresh
    runs in the background, HS256 tokens beside the JWKS never wait on it, and a burst
    of tokens naming unknown key ids waits for one fetch, shared."""
    import http.server
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    released = threading.Event()
    served = {"fetches": 0}

    class Jwks(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            served["fetches"] += 1
            if served["fetches"] > 1:
                released.wait(60)
            body = json.dumps({"keys": [rsa_jwk(key, "k1")]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:
                pass

        def log_message(self, *args):
            pass

    idp = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Jwks)
    idp.daemon_threads = True
    threading.Thread(target=idp.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{idp.server_address[1]}/.well-known/jwks.json"
        server = make_server(tmp_path / "hanging-data",
                             {"CAIRN_JWT_JWKS_URL": url, "CAIRN_JWT_JWKS_REFRESH_SECONDS": "1"}).start()
        assert served["fetches"] == 1
        now = int(time.time())
        claims = {"sub": "svc", "tenant": "acme", "scope": "memory:read memory:write", "iat": now, "exp": now + 600}
        held = rs256(key, "k1", claims)
        shared = server.mint("acme")
        time.sleep(2.2)
        # The cached set is past its refresh interval, and the provider hangs.
        for _ in range(5):
            assert server.call("GET", "/v1/users/u1/facts", held).status == 200
            assert server.call("GET", "/v1/users/u1/facts", shared).status == 200
        assert served["fetches"] == 2, f"one refresh in the background: {served['fetches']}"
        time.sleep(5.5)  # the hanging refresh times out
        unknown = [rs256(key, f"unknown-{index}", claims) for index in range(4)]
        with ThreadPoolExecutor(max_workers=4) as pool:
            waiting = [pool.submit(server.call, "GET", "/v1/users/u1/facts", token) for token in unknown]
            statuses = [future.result(timeout=60).status for future in waiting]
        assert statuses == [401] * 4, statuses
        assert served["fetches"] <= 4, f"the burst shares its fetch: {served['fetches']}"
    finally:
        released.set()
        idp.shutdown()


def test_jwks_fetches_refuse_foreign_redirects_and_oversized_sets(make_server, tmp_path):
    """A JWKS URL that redirects to another origin, or answers a key set larger than
    1 MiB, gives no keys: its tokens are refused (a same-origin redirect is followed)."""
    import http.server
    import threading
    import time

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwks = json.dumps({"keys": [rsa_jwk(key, "k1")]})

    def serve(answer):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                status, headers, body = answer(self.path)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"

    elsewhere, elsewhere_url = serve(lambda path: (200, {"content-type": "application/json"}, jwks.encode()))

    def redirecting(path):
        if path == "/moved":
            return 302, {"location": elsewhere_url + "/jwks.json"}, b""
        if path == "/here":
            return 302, {"location": "/jwks.json"}, b""
        return 200, {"content-type": "application/json"}, jwks.encode()

    origin, origin_url = serve(redirecting)
    padded = (jwks[:-1] + " " * (2 * 1024 * 1024) + "}").encode()
    huge, huge_url = serve(lambda path: (200, {"content-type": "application/json"}, padded))
    try:
        now = int(time.time())
        claims = {"sub": "svc", "tenant": "acme", "scope": "memory:read", "iat": now, "exp": now + 600}
        token = rs256(key, "k1", claims)
        for name, url, expected in [("same-origin", origin_url + "/here", 200),
                                    ("foreign", origin_url + "/moved", 401),
                                    ("oversized", huge_url + "/jwks.json", 401)]:
            server = make_server(tmp_path / f"{name}-data", {"CAIRN_JWT_JWKS_URL": url})
            del server.env["CAIRN_JWT_SECRET"]
            server.start()
            assert server.call("GET", "/v1/users/u1/facts", token).status == expected, name
            server.stop()
    finally:
        for httpd in (elsewhere, origin, huge):
            httpd.shutdown()
