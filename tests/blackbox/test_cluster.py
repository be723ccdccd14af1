"""The service on real search-cluster nodes, OpenSearch and Elasticsearch: bootstrap
through the CLI (idempotent, a wrong mapping reported, the text analysis it chose), the
cluster down at start (503s, then recovery by itself), and the node stopped mid-ingest
(every acknowledged write present afterwards)."""

import json
import os
import subprocess
import urllib.request
import uuid

import pytest

from conftest import REPO, binary, cluster_url, wait_for

ENGINES = ["opensearch", "elasticsearch"]
# A second node of each engine, started and stopped by the fault test.
SPARE_PORTS = {
    "opensearch": int(os.environ.get("CAIRN_TEST_SPARE_OPENSEARCH_PORT", "9201")),
    "elasticsearch": int(os.environ.get("CAIRN_TEST_SPARE_ELASTICSEARCH_PORT", "9251")),
}


def node(engine, command, port):
    variable = "OPENSEARCH_PORT" if engine == "opensearch" else "ELASTICSEARCH_PORT"
    env = dict(os.environ, **{variable: str(port)})
    subprocess.run([str(REPO / "scripts" / engine), command], env=env, check=True, timeout=300,
                   capture_output=True)


def http(method, url, body=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def cli(env, *args):
    full = dict(os.environ, **env)
    return subprocess.run([binary(), *args], env=full, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("engine", ENGINES)
def test_bootstrap_is_idempotent_and_refuses_a_wrong_mapping(tmp_path, engine):
    main = cluster_url(engine)
    prefix = f"cairn-bb-{uuid.uuid4().hex[:12]}"
    env = {"CAIRN_BACKEND": engine, "CAIRN_CLUSTER_URL": main, "CAIRN_INDEX_PREFIX": prefix,
           "CAIRN_DATA_DIR": str(tmp_path), "CAIRN_JWT_SECRET": "x" * 32}
    try:
        first = cli(env, "bootstrap")
        assert first.returncode == 0, first.stderr
        assert "13 indices created" in first.stdout, first.stdout
        assert f"storage is ready ({engine} " in first.stdout, first.stdout
        # The OpenSearch test node has analysis-common; the Elasticsearch one is bare.
        analyzer = "cairn_text" if engine == "opensearch" else "the standard analyzer"
        assert "text analysis: recall matches Cairn's Porter stems" in first.stdout, first.stdout
        assert analyzer in first.stdout, first.stdout
        second = cli(env, "bootstrap")
        assert second.returncode == 0 and "0 indices created, 13 already in place" in second.stdout, second.stdout
    finally:
        http("DELETE", f"{main}/{prefix}-*")

    wrong = f"cairn-bb-{uuid.uuid4().hex[:12]}"
    assert http("PUT", f"{main}/{wrong}-facts",
                {"mappings": {"properties": {"text": {"type": "keyword"}}}}) == 200
    try:
        refused = cli(dict(env, CAIRN_INDEX_PREFIX=wrong), "bootstrap")
        assert refused.returncode != 0
        assert f"{wrong}-facts" in refused.stderr and "text is keyword, expected text" in refused.stderr, refused.stderr
    finally:
        http("DELETE", f"{main}/{wrong}-*")


@pytest.mark.parametrize("engine", ENGINES)
def test_cluster_down_at_start_and_node_stopped_mid_ingest(make_server, tmp_path, engine):
    cluster_url(engine)
    port = SPARE_PORTS[engine]
    node(engine, "stop", port)
    prefix = f"cairn-faults-{uuid.uuid4().hex[:12]}"
    server = make_server(tmp_path / "cluster", {
        "CAIRN_BACKEND": engine, "CAIRN_CLUSTER_URL": f"http://127.0.0.1:{port}",
        "CAIRN_INDEX_PREFIX": prefix}).start()
    token = server.mint("acme")
    try:
        assert server.call("GET", "/readyz").status == 503
        refused = server.call("POST", "/v1/users/u1/facts", token, {"text": "The user likes tea"})
        assert refused.status == 503, refused.body
        assert refused.json()["error"]["code"] == "unavailable"

        node(engine, "start", port)
        assert wait_for(lambda: server.call("GET", "/readyz").status == 200, 90), "the service did not recover"

        acknowledged, failed = [], 0
        for index in range(30):
            if index == 10:
                node(engine, "stop", port)
            if index == 20:
                node(engine, "start", port)
                wait_for(lambda: server.call("GET", "/readyz").status == 200, 90)
            response = server.call("POST", "/v1/users/u1/facts", token, {"text": f"Durable fact number {index}"})
            if response.status == 201:
                acknowledged.append(response.json()["fact"]["id"])
            else:
                assert response.status == 503, response.body
                assert response.json()["error"]["code"] == "unavailable"
                failed += 1
        assert failed >= 10, "writes while the node was down got errors"
        assert len(acknowledged) >= 20
        for fact_id in acknowledged:
            response = server.call("GET", f"/v1/users/u1/facts/{fact_id}", token)
            assert response.status == 200, f"acknowledged {fact_id} lost"
        recall = server.call("POST", "/v1/users/u1/recall", token, {"query": "durable fact", "k": 50})
        assert recall.status == 200 and len(recall.json()["hits"]) == len(acknowledged)
    finally:
        http("DELETE", f"http://127.0.0.1:{port}/{prefix}-*")
        node(engine, "stop", port)


@pytest.mark.parametrize("engine", ENGINES)
def test_consolidation_and_erasure_on_a_cluster(make_server, tmp_path, engine):
    main = cluster_url(engine)
    prefix = f"cairn-bb-{uuid.uuid4().hex[:12]}"
    server = make_server(tmp_path / "consolidation", {
        "CAIRN_BACKEND": engine, "CAIRN_CLUSTER_URL": main, "CAIRN_INDEX_PREFIX": prefix}).start()
    token = server.mint("acme")
    try:
        assert wait_for(lambda: server.call("GET", "/readyz").status == 200, 60)
        for said in ["I love Adidas sneakers", "My Adidas broke after a month", "I'm switching to Puma"]:
            response = server.call("POST", "/v1/users/sam/episodes", token,
                                   {"messages": [{"role": "user", "content": said}], "consolidate": "sync"})
            assert response.status == 201 and response.json()["consolidation"]["ran"], response.body
        facts = server.call("GET", "/v1/users/sam/facts?status=all", token).json()["items"]
        status = {fact["text"]: fact["status"] for fact in facts}
        assert status["The user loves Adidas sneakers."] == "superseded", status
        assert status["The user is switching to Puma."] == "active", status
        recall = server.call("POST", "/v1/users/sam/recall", token,
                             {"query": "what sneakers should I buy", "k": 3, "tiers": ["semantic"], "explain": True})
        hits = recall.json()["hits"]
        assert any("Puma" in hit["text"] for hit in hits) and all("loves Adidas" not in hit["text"] for hit in hits)
        assert any(hit["explain"]["knn_rank"] is not None for hit in hits), hits

        # Background consolidation through the job queue kept in the cluster.
        queued = server.call("POST", "/v1/users/ann/episodes", token,
                             {"messages": [{"role": "user", "content": "I work at Globex"}]})
        assert queued.status == 201 and queued.json()["consolidation"]["queued"]
        assert wait_for(lambda: server.call("GET", "/v1/users/ann/facts", token).json()["items"], 30)

        erased = server.call("DELETE", "/v1/users/sam", token)
        assert erased.status == 200, erased.body
        deleted = erased.json()["deleted"]
        assert deleted["episodes"] == 3 and deleted["facts"] == 3, deleted
        assert server.call("GET", "/v1/users/sam/facts?status=all", token).json()["items"] == []
        assert server.call("GET", "/v1/users/ann/facts", token).json()["items"], "the other user is untouched"
    finally:
        http("DELETE", f"{main}/{prefix}-*")


def test_a_service_on_another_embedding_model_is_refused_before_it_serves(make_server, tmp_path):
    """Two services on one index prefix with different embedding models: the second
    never becomes ready and refuses every read and write with the reason (no vectors of
    its model reach the kNN index); the first keeps serving."""
    main = cluster_url("opensearch")
    prefix = f"cairn-bb-{uuid.uuid4().hex[:12]}"
    operator = "space-check-operator-credential-0123456789"
    env = {"CAIRN_BACKEND": "opensearch", "CAIRN_CLUSTER_URL": main, "CAIRN_INDEX_PREFIX": prefix,
           "CAIRN_METRICS_TOKEN": operator}
    first = make_server(tmp_path / "first", env).start()
    try:
        assert wait_for(lambda: first.call("GET", "/readyz").status == 200, 60), first.log.read_text()
        token = first.mint("acme")
        said = {"messages": [{"role": "user", "content": "My sister lives in Porto"}], "consolidate": "sync"}
        assert first.call("POST", "/v1/users/sam/episodes", token, said).status == 201

        second = make_server(tmp_path / "second", dict(env, CAIRN_EMBEDDING_MODEL="e5-small-v2")).start()

        def refused():
            answer = second.call("GET", "/readyz", headers={"Authorization": f"Bearer {operator}"})
            return answer if answer.status == 503 and "e5-small-v2/384" in answer.body else None
        readiness = wait_for(refused, 60)
        assert readiness, second.log.read_text()
        assert "all-minilm-l6-v2/384" in readiness.body, readiness.body
        other = second.mint("acme")
        write = second.call("POST", "/v1/users/sam/episodes", other,
                            {"messages": [{"role": "user", "content": "She moved to Lisbon"}]})
        assert write.status == 503, write.body
        recall = second.call("POST", "/v1/users/sam/recall", other, {"query": "where does my sister live"})
        assert recall.status == 503, recall.body
        assert wait_for(lambda: "cannot be used as configured" in second.log.read_text(), 10), \
            second.log.read_text()

        hits = first.call("POST", "/v1/users/sam/recall", token, {"query": "where does my sister live"}).json()["hits"]
        assert any("Porto" in hit["text"] for hit in hits), hits
        assert http("POST", f"{main}/{prefix}-episodes/_refresh") == 200
        found = json.loads(urllib.request.urlopen(f"{main}/{prefix}-episodes/_count", timeout=30).read())
        assert found["count"] == 1, found
    finally:
        http("DELETE", f"{main}/{prefix}-*")
