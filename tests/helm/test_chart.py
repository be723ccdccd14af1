"""The Helm chart in deploy/helm/cairn, rendered by the real `helm template`: both modes,
the restricted pod security standard, probes, resources, secrets, Ingress host to the MCP
allow-list, the ServiceMonitor, and the values it must refuse."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "cairn"
SECRET = "0123456789abcdef0123456789abcdef"


def helm():
    found = os.environ.get("HELM") or shutil.which("helm") or str(Path.home() / "go" / "bin" / "helm")
    if not Path(found).exists():
        pytest.fail("helm is not installed (scripts/test installs it)")
    return found


def render(*settings, ok=True):
    args = [helm(), "template", "t", str(CHART), "--namespace", "memory"]
    for setting in settings:
        args += ["--set", setting]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if not ok:
        assert result.returncode != 0, "the chart accepted values it must refuse"
        return result.stderr
    assert result.returncode == 0, result.stderr
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in yaml.safe_load_all(result.stdout) if doc}


def workload(manifests, kind):
    return manifests[(kind, "t-cairn")]


def env_of(container):
    return {item["name"]: item.get("value") for item in container["env"]}


def memory_bytes(quantity):
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    for unit, factor in units.items():
        if quantity.endswith(unit):
            return float(quantity[: -len(unit)]) * factor
    return float(quantity)


def assert_restricted(pod):
    """The restricted Pod Security Standard, as far as a pod spec shows it."""
    spec = pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    assert all("hostPath" not in volume for volume in spec["volumes"])
    for container in spec["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"]["drop"] == ["ALL"] and not context["capabilities"].get("add")
        assert context["seccompProfile"]["type"] == "RuntimeDefault"


def test_embedded_mode_is_one_stateful_replica_that_passes_the_restricted_standard():
    manifests = render(f"jwt.secret={SECRET}")
    statefulset = workload(manifests, "StatefulSet")
    assert ("Deployment", "t-cairn") not in manifests
    assert statefulset["spec"]["replicas"] == 1
    claim = statefulset["spec"]["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == "data" and claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    pod = statefulset["spec"]["template"]
    assert_restricted(pod)
    container = pod["spec"]["containers"][0]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert container["image"] == f"localhost/cairn:{chart['appVersion']}"
    probes = {name: container[name]["httpGet"]["path"] for name in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes == {"startupProbe": "/healthz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"}
    # Sized from the benchmarks: the peak at 100k facts (1.3 GiB) fits under the limit.
    limits = container["resources"]["limits"]
    assert memory_bytes(limits["memory"]) >= 1.3 * (1 << 30)
    assert memory_bytes(container["resources"]["requests"]["memory"]) >= 430 * (1 << 20)
    env = env_of(container)
    assert env["CAIRN_DATA_DIR"] == "/data" and env["CAIRN_LISTEN"] == "0.0.0.0:8080"
    assert env["CAIRN_JWT_SECRET_FILE"].startswith("/var/run/secrets/cairn/jwt/")
    assert "CAIRN_JWT_SECRET" not in env, "the secret never sits in the pod spec"
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    assert mounts["jwt"]["readOnly"] is True and mounts["data"]["mountPath"] == "/data"
    secret = manifests[("Secret", "t-cairn-jwt")]
    assert secret["stringData"]["jwt-secret"] == SECRET
    hosts = env["CAIRN_MCP_ALLOWED_HOSTS"].split(",")
    assert "t-cairn" in hosts and "t-cairn.memory.svc.cluster.local" in hosts


def test_cluster_mode_is_a_deployment_with_credentials_from_a_secret():
    manifests = render("mode=cluster", "replicas=3", "cluster.url=https://search.internal:9200",
                       "cluster.existingSecret=search-credentials", "cluster.secretKeys={username,password,ca.crt}",
                       "jwt.existingSecret=cairn-keys")
    deployment = workload(manifests, "Deployment")
    assert ("StatefulSet", "t-cairn") not in manifests
    assert ("Secret", "t-cairn-jwt") not in manifests, "an existing Secret is used, not made"
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]
    assert_restricted(pod)
    env = env_of(pod["spec"]["containers"][0])
    assert env["CAIRN_BACKEND"] == "opensearch" and env["CAIRN_CLUSTER_URL"] == "https://search.internal:9200"
    assert env["CAIRN_CLUSTER_USERNAME_FILE"] == "/var/run/secrets/cairn/cluster/username"
    assert env["CAIRN_CLUSTER_PASSWORD_FILE"] == "/var/run/secrets/cairn/cluster/password"
    assert env["CAIRN_CLUSTER_CA_CERT"] == "/var/run/secrets/cairn/cluster/ca.crt"
    assert "CAIRN_CLUSTER_API_KEY_FILE" not in env
    assert "CAIRN_CLUSTER_REPLICAS" not in env, "bootstrap chooses by default"
    replicated = workload(render("mode=cluster", "cluster.url=https://search.internal:9200",
                                 "cluster.indexReplicas=2", "jwt.existingSecret=cairn-keys"), "Deployment")
    assert env_of(replicated["spec"]["template"]["spec"]["containers"][0])["CAIRN_CLUSTER_REPLICAS"] == "2"
    volumes = {volume["name"]: volume for volume in pod["spec"]["volumes"]}
    assert volumes["cluster-credentials"]["secret"]["secretName"] == "search-credentials"
    assert volumes["jwt"]["secret"]["secretName"] == "cairn-keys"


def test_the_ingress_host_is_served_with_tls_and_allowed_by_mcp():
    manifests = render(f"jwt.secret={SECRET}", "ingress.enabled=true", "ingress.host=memory.example.org",
                       "ingress.tlsSecret=memory-tls", "ingress.className=nginx")
    ingress = manifests[("Ingress", "t-cairn")]
    assert ingress["spec"]["tls"] == [{"hosts": ["memory.example.org"], "secretName": "memory-tls"}]
    assert ingress["spec"]["rules"][0]["host"] == "memory.example.org"
    env = env_of(workload(manifests, "StatefulSet")["spec"]["template"]["spec"]["containers"][0])
    assert "memory.example.org" in env["CAIRN_MCP_ALLOWED_HOSTS"].split(",")


def test_a_service_monitor_scrapes_metrics_when_asked():
    assert ("ServiceMonitor", "t-cairn") not in render(f"jwt.secret={SECRET}")
    monitor = render(f"jwt.secret={SECRET}", "serviceMonitor.enabled=true")[("ServiceMonitor", "t-cairn")]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert "bearerTokenSecret" not in monitor["spec"]["endpoints"][0]


def test_the_operator_scrape_credential_reaches_cairn_and_the_monitor():
    manifests = render(
        f"jwt.secret={SECRET}",
        "serviceMonitor.enabled=true",
        "serviceMonitor.tokenSecret.name=scrape",
    )
    endpoint = manifests[("ServiceMonitor", "t-cairn")]["spec"]["endpoints"][0]
    assert endpoint["bearerTokenSecret"] == {"name": "scrape", "key": "metrics-token"}
    pod = workload(manifests, "StatefulSet")["spec"]["template"]["spec"]
    env = {variable["name"]: variable.get("value") for variable in pod["containers"][0]["env"]}
    assert env["CAIRN_METRICS_TOKEN_FILE"] == "/var/run/secrets/cairn/metrics/metrics-token"
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["metrics-token"]["secret"]["secretName"] == "scrape"
    mounts = {mount["name"]: mount for mount in pod["containers"][0]["volumeMounts"]}
    assert mounts["metrics-token"]["readOnly"] is True


def test_a_config_file_carries_per_tenant_review_policies(tmp_path):
    config = 'review = "supersession"\n[tenants.clinic]\nreview = "all"\n'
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"config": config}))
    args = [helm(), "template", "t", str(CHART), "--namespace", "memory", "--set", f"jwt.secret={SECRET}",
            "--values", str(values)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    manifests = {(doc["kind"], doc["metadata"]["name"]): doc for doc in yaml.safe_load_all(result.stdout) if doc}
    assert manifests[("ConfigMap", "t-cairn-config")]["data"]["cairn.toml"] == config
    pod = workload(manifests, "StatefulSet")["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert env_of(container)["CAIRN_CONFIG"] == "/etc/cairn/cairn.toml"
    assert {"name": "config", "mountPath": "/etc/cairn", "readOnly": True} in container["volumeMounts"]
    assert {"name": "config", "configMap": {"name": "t-cairn-config"}} in pod["spec"]["volumes"]
    assert pod["metadata"]["annotations"]["checksum/config"]
    assert_restricted(pod)
    # Without a config file, nothing of it is rendered.
    plain = render(f"jwt.secret={SECRET}")
    assert ("ConfigMap", "t-cairn-config") not in plain
    assert "CAIRN_CONFIG" not in env_of(workload(plain, "StatefulSet")["spec"]["template"]["spec"]["containers"][0])


def test_a_jwks_url_needs_no_secret():
    manifests = render("jwt.jwksUrl=https://id.example.org/.well-known/jwks.json")
    env = env_of(workload(manifests, "StatefulSet")["spec"]["template"]["spec"]["containers"][0])
    assert env["CAIRN_JWT_JWKS_URL"].endswith("jwks.json") and "CAIRN_JWT_SECRET_FILE" not in env
    assert ("Secret", "t-cairn-jwt") not in manifests


@pytest.mark.parametrize("settings, reason", [
    ([f"jwt.secret={SECRET}", "image.tag=latest"], "not latest"),
    (["mode=cluster", f"jwt.secret={SECRET}"], "cluster.url is required"),
    (["mode=sharded", f"jwt.secret={SECRET}"], "mode must be"),
    ([], "jwt.secret"),
    (["mode=cluster", "cluster.url=http://x:9200", "cluster.existingSecret=s", "cluster.secretKeys={token}",
      f"jwt.secret={SECRET}"], "unknown key token"),
])
def test_values_it_must_refuse(settings, reason):
    assert reason in render(*settings, ok=False)


def test_shutdown_grace_and_a_disruption_budget_for_rolling_updates():
    embedded = render(f"jwt.secret={SECRET}")
    pod = workload(embedded, "StatefulSet")["spec"]["template"]["spec"]
    env = {variable["name"]: variable.get("value") for variable in pod["containers"][0]["env"]}
    assert env["CAIRN_SHUTDOWN_GRACE_SECONDS"] == "25"
    assert pod["terminationGracePeriodSeconds"] == 60, "longer than both graces"
    assert ("PodDisruptionBudget", "t-cairn") not in embedded, "one embedded replica has nothing to keep"

    cluster = render("mode=cluster", "cluster.url=http://search:9200", "jwt.existingSecret=keys",
                     "shutdownGraceSeconds=40")
    pod = workload(cluster, "Deployment")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 90
    budget = cluster[("PodDisruptionBudget", "t-cairn")]
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == workload(cluster, "Deployment")["spec"]["selector"]["matchLabels"]
    single = render("mode=cluster", "cluster.url=http://search:9200", "jwt.existingSecret=keys", "replicas=1")
    assert ("PodDisruptionBudget", "t-cairn") not in single
