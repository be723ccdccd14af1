"""The Grafana dashboard in deploy/grafana queries only what the running service's
/metrics exports: every metric name, every label it groups or filters by, and the
route values it filters on."""

import json
import re

from conftest import REPO

DASHBOARD = REPO / "deploy" / "grafana" / "cairn.json"
# Labels Prometheus adds at scrape time, and the histogram bucket label.
SCRAPE_LABELS = {"job", "instance"}


def exported(text):
    """Metric names, label names and label values of an exposition document."""
    names, labels, values = set(), set(), set()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s", line)
        assert match, line
        names.add(match.group(1))
        for label, value in re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', match.group(3) or ""):
            labels.add(label)
            values.add(value)
    return names, labels, values


def test_every_dashboard_query_reads_what_metrics_exports(make_server):
    server = make_server(extra_env={"CAIRN_RATE_LIMIT_PER_SECOND": "1", "CAIRN_RATE_LIMIT_BURST": "20"}).start()
    token = server.mint("acme")
    assert server.call("POST", "/v1/users/ada/facts", token, {"text": "The user keeps bees"}).status == 201
    assert server.call("POST", "/v1/users/ada/recall", token, {"query": "bees"}).status == 200
    ingest = server.call("POST", "/v1/users/ada/episodes", token,
                         {"messages": [{"role": "user", "content": "I live in Ghent."}], "consolidate": "sync"})
    assert ingest.status == 201, ingest.body
    assert server.call("GET", "/v1/users/ada/facts/fact_missing", token).status == 404
    statuses = {server.call("GET", "/v1/users/ada/facts", token).status for _ in range(30)}
    assert 429 in statuses, statuses
    metrics = server.call("GET", "/metrics")
    assert metrics.status == 200
    names, labels, values = exported(metrics.body)

    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] == "Cairn"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)) >= 10
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert expressions
    for expression in expressions:
        used = set(re.findall(r"\bcairn_[a-z_]+\b", expression))
        assert used, expression
        assert used <= names, f"{expression}: {sorted(used - names)} not exported"
        for group in re.findall(r"by \(([^)]*)\)", expression):
            grouped = {label.strip() for label in group.split(",")}
            assert grouped - SCRAPE_LABELS <= labels, f"{expression}: {sorted(grouped - labels)}"
        for label, value in re.findall(r'([a-z_]+)=~?"([^"]*)"', expression):
            if label in SCRAPE_LABELS:
                continue
            assert label in labels, f"{expression}: no label {label}"
            if not any(char in value for char in "|.*"):
                assert value in values, f"{expression}: no series with {label}={value!r}"
