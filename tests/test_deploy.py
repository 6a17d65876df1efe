"""deploy/: the Kubernetes manifests validate against the Kubernetes schemas (offline), the
kustomizations compose, the Dockerfile and the systemd unit follow their rules, and the
config files they carry load in the config model and agree with the paths and ports
that the manifests mount and probe."""

from __future__ import annotations

import copy
import json
import pathlib
import re
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import kubernetes_validate
import pytest
import yaml
from conftest import EXAMPLE_BUNDLE, ROOT

from toolauthz.bundle import load_bundle
from toolauthz.server import config as config_module
from toolauthz.server.config import Settings, load_settings

DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
KUSTOMIZATIONS = ["base", "overlays/postgres", "overlays/central", "overlays/monitoring", "overlays/console",
                  "overlays/bundle-server"]
# Custom resources the Kubernetes schemas do not hold: each is checked, as strictly,
# against the part of its CRD's schema that the manifests use.
SERVICE_MONITOR_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "additionalProperties": False, "required": ["name"],
                     "properties": {"name": {"type": "string"}, "labels": {"type": "object"}}},
        "spec": {"type": "object", "additionalProperties": False, "required": ["selector", "endpoints"], "properties": {
            "selector": {"type": "object", "additionalProperties": False, "properties": {
                "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}}},
            "endpoints": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False, "required": ["port"],
                "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                               "interval": {"type": "string", "pattern": "^[0-9]+[smh]$"}}}}}}}}
# The oldest release with native sidecars (an init container with restartPolicy: Always)
# enabled by default, and the newest that kubernetes-validate ships.
KUBERNETES_VERSIONS = ["1.29", kubernetes_validate.latest_version()]

# Config keys and environment overrides that the manifests use and that other parts of
# issue 18 and issue 16 add to toolauthz/server/config.py (the store URL, metrics, callers'
# roles). Only these may be unknown to the config model; shrink the list as they land.
EXPECTED_FROM_OTHER_WORK_KEYS = {"store"}
EXPECTED_FROM_OTHER_WORK_ENV = {"TOOLAUTHZ_STORE"}


# ---------------------------------------------------------------- YAML and kustomize

def documents(path: pathlib.Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def identity(resource: dict[str, Any]) -> tuple[str, str, str]:
    return resource["apiVersion"], resource["kind"], resource["metadata"]["name"]


def strategic_merge(target: Any, patch: Any) -> Any:
    """Kubernetes' strategic merge for the shapes these manifests patch: maps merge key by
    key, lists of named items (containers, volumes, env) merge by name, anything else is
    replaced."""
    if isinstance(target, dict) and isinstance(patch, dict):
        merged = dict(target)
        for key, value in patch.items():
            merged[key] = strategic_merge(target[key], value) if key in target else copy.deepcopy(value)
        return merged
    if isinstance(target, list) and isinstance(patch, list) and all(
            isinstance(item, dict) and "name" in item for item in [*target, *patch]):
        merged_list = [copy.deepcopy(item) for item in target]
        for item in patch:
            at = next((i for i, old in enumerate(merged_list) if old["name"] == item["name"]), None)
            if at is None:
                merged_list.append(copy.deepcopy(item))
            else:
                merged_list[at] = strategic_merge(merged_list[at], item)
        return merged_list
    return copy.deepcopy(patch)


def build(directory: pathlib.Path) -> list[dict[str, Any]]:
    """What `kustomize build DIRECTORY` gives for the features these kustomizations use,
    failing on a missing file, a patch of a resource that is not there, or a duplicate."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    assert set(kustomization) <= {"apiVersion", "kind", "resources", "patches", "labels"}, directory
    resources: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        assert path.exists(), f"{directory}: resource `{entry}` does not exist"
        resources += build(path) if path.is_dir() else documents(path)
    ids = [identity(r) for r in resources]
    assert len(ids) == len(set(ids)), f"{directory}: a resource is declared twice: {ids}"
    for entry in kustomization.get("patches", []):
        assert set(entry) == {"path"}, entry
        path = directory / entry["path"]
        assert path.is_file(), f"{directory}: patch `{entry['path']}` does not exist"
        for patch in documents(path):
            matches = [i for i, r in enumerate(resources) if identity(r) == identity(patch)]
            assert len(matches) == 1, f"{path}: patches {identity(patch)}, which {directory} does not declare"
            resources[matches[0]] = strategic_merge(resources[matches[0]], patch)
    for entry in kustomization.get("labels", []):
        for resource in resources:
            resource["metadata"].setdefault("labels", {}).update(entry["pairs"])
    return resources


def built(name: str) -> list[dict[str, Any]]:
    return build(KUBERNETES / name)


def resource_files() -> list[pathlib.Path]:
    """Every YAML file under deploy/kubernetes that a kustomization lists as a resource."""
    files = []
    for name in KUSTOMIZATIONS:
        kustomization = yaml.safe_load((KUBERNETES / name / "kustomization.yaml").read_text())
        files += [KUBERNETES / name / entry for entry in kustomization.get("resources", [])
                  if (KUBERNETES / name / entry).is_file()]
    return files


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a network connection fails the test."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("the test tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


# ---------------------------------------------------------------- schemas and composition

def validate(resource: dict[str, Any], version: str) -> None:
    if resource["kind"] == "ServiceMonitor":
        import jsonschema
        jsonschema.validate(resource, SERVICE_MONITOR_SCHEMA)
        return
    kubernetes_validate.validate(resource, version, strict=True)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_against_the_kubernetes_schemas(version, no_network):
    checked = 0
    for path in resource_files():
        for resource in documents(path):
            validate(resource, version)
            checked += 1
    for name in KUSTOMIZATIONS:
        for resource in built(name):  # the patched resources too
            validate(resource, version)
            checked += 1
    assert checked >= 40


def test_the_validator_refuses_a_broken_manifest(no_network):
    deployment = next(r for r in built("base") if r["kind"] == "Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsNonRot"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


def test_every_file_under_deploy_kubernetes_is_used():
    listed = {path.resolve() for path in resource_files()}
    for name in KUSTOMIZATIONS:
        kustomization = yaml.safe_load((KUBERNETES / name / "kustomization.yaml").read_text())
        listed |= {(KUBERNETES / name / p["path"]).resolve() for p in kustomization.get("patches", [])}
        listed.add((KUBERNETES / name / "kustomization.yaml").resolve())
    present = {p.resolve() for p in KUBERNETES.rglob("*.yaml")}
    assert present == listed


def test_a_patch_of_a_missing_resource_is_refused(tmp_path):
    shutil.copytree(KUBERNETES, tmp_path / "k")
    patch = tmp_path / "k" / "overlays" / "postgres" / "store-patch.yaml"
    patch.write_text(patch.read_text().replace("name: agent\n", "name: agnet\n", 1))
    with pytest.raises(AssertionError, match="does not declare"):
        build(tmp_path / "k" / "overlays" / "postgres")


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) is not installed")
@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_kustomize_builds_what_the_test_composes(name):
    out = subprocess.run(["kubectl", "kustomize", str(KUBERNETES / name)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    by_id = {identity(r): unordered(r) for r in yaml.safe_load_all(out) if r}
    ours = {identity(r): unordered(r) for r in built(name)}
    assert by_id == ours


def unordered(value: Any) -> Any:
    """Lists of named items in a canonical order: where a patch adds one is not meaningful."""
    if isinstance(value, dict):
        return {k: unordered(v) for k, v in value.items()}
    if isinstance(value, list):
        items = [unordered(v) for v in value]
        if all(isinstance(v, dict) and "name" in v for v in items):
            return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
        return items
    return value


# ---------------------------------------------------------------- the pod and its config

@dataclass(frozen=True)
class SidecarPod:
    """A Deployment's toolauthz container, its pod, and the settings it runs with."""

    deployment: dict[str, Any]
    container: dict[str, Any]
    settings: Settings
    config_text: str

    @property
    def pod(self) -> dict[str, Any]:
        return self.deployment["spec"]["template"]["spec"]

    def mounts(self, container: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
        return {m["mountPath"]: m for m in (container or self.container).get("volumeMounts", [])}

    def volume(self, name: str) -> dict[str, Any]:
        return next(v for v in self.pod["volumes"] if v["name"] == name)

    def containers(self) -> list[dict[str, Any]]:
        return [*self.pod.get("initContainers", []), *self.pod["containers"]]


def settings_from_text(text: str, where: pathlib.Path) -> Settings:
    """load_settings on a config text, less the keys still expected from other work."""
    data = yaml.safe_load(text)
    unknown = set(data) - set(Settings.model_fields)
    assert unknown <= EXPECTED_FROM_OTHER_WORK_KEYS, f"keys the config model does not know: {unknown}"
    for key in unknown:
        del data[key]
    where.write_text(yaml.safe_dump(data), encoding="utf-8")
    return load_settings(where)


def configmap_text(resources: list[dict[str, Any]], name: str, key: str) -> str:
    configmap = next(r for r in resources if r["kind"] == "ConfigMap" and r["metadata"]["name"] == name)
    return configmap["data"][key]


def sidecar_pods(name: str, tmp_path: pathlib.Path) -> list[SidecarPod]:
    resources = built(name)
    pods = []
    for deployment in (r for r in resources if r["kind"] == "Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        container = next(c for c in [*spec.get("initContainers", []), *spec["containers"]]
                         if c["name"] == "toolauthz")
        assert container["args"][:2] == ["serve", "--config"]
        config_path = pathlib.PurePosixPath(container["args"][2])
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(config_path.parent))
        volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        text = configmap_text(resources, volume["configMap"]["name"], config_path.name)
        settings = settings_from_text(text, tmp_path / f"{deployment['metadata']['name']}.yaml")
        pods.append(SidecarPod(deployment, container, settings, text))
    return pods


def all_sidecar_pods(tmp_path: pathlib.Path) -> Iterator[tuple[str, SidecarPod]]:
    for name in KUSTOMIZATIONS:
        for pod in sidecar_pods(name, tmp_path):
            yield name, pod


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_every_pod_is_locked_down(tmp_path):
    for name in KUSTOMIZATIONS:
        for resource in built(name):
            if resource["kind"] not in ("Deployment", "Job"):
                continue
            pod = resource["spec"]["template"]["spec"]
            where = f"{name}: {resource['metadata']['name']}"
            assert pod["securityContext"]["runAsNonRoot"] is True, where
            assert pod["securityContext"]["runAsUser"] != 0, where
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert pod["automountServiceAccountToken"] is False, where
            for container in [*pod.get("initContainers", []), *pod["containers"]]:
                context = container["securityContext"]
                assert context["allowPrivilegeEscalation"] is False, (where, container["name"])
                assert context["capabilities"] == {"drop": ["ALL"]}, (where, container["name"])
                assert context["readOnlyRootFilesystem"] is True, (where, container["name"])
                assert context["runAsNonRoot"] is True, (where, container["name"])
                for kind in ("requests", "limits"):
                    assert set(container["resources"][kind]) == {"cpu", "memory"}, (where, container["name"])


def test_keys_come_from_secrets_mounted_read_only_with_mode_0400(tmp_path):
    for name, pod in all_sidecar_pods(tmp_path):
        secrets = {v["name"]: v["secret"] for v in pod.pod["volumes"] if "secret" in v}
        assert {"toolauthz-token-keys", "toolauthz-audit-key"} <= {s["secretName"] for s in secrets.values()}
        for secret in secrets.values():
            assert secret["defaultMode"] == 0o400, name
        for container in pod.containers():
            for mount in container.get("volumeMounts", []):
                if mount["name"] in secrets:
                    assert mount.get("readOnly") is True, (name, container["name"], mount)
        # The sidecar reads its copies, owned by its uid, from the in-memory `keys` volume.
        mounts = pod.mounts()
        keys_mount = mounts[str(pod.settings.keys_dir)]
        audit_mount = mounts[str(pod.settings.audit_key_file)]
        assert keys_mount["name"] == audit_mount["name"] == "keys"
        assert keys_mount["readOnly"] is audit_mount["readOnly"] is True
        assert pod.volume("keys")["emptyDir"]["medium"] == "Memory"
        installer = next(c for c in pod.pod["initContainers"] if c["name"] == "install-keys")
        script = installer["command"][-1]
        installed = {m["mountPath"]: m for m in installer["volumeMounts"] if m["name"] == "keys"}
        [keys_root] = installed
        assert f"{keys_root}/{keys_mount['subPath']}/" in script
        assert f"{keys_root}/{audit_mount['subPath']}" in script
        assert "-m 0400" in script and "-m 0700" in script
        if pod.container in pod.pod["initContainers"]:  # a native sidecar starts after the keys are in place
            assert pod.pod["initContainers"].index(installer) < pod.pod["initContainers"].index(pod.container)


def test_the_paths_in_the_config_are_the_mounted_ones(tmp_path):
    for name, pod in all_sidecar_pods(tmp_path):
        mounts = pod.mounts()
        if pod.settings.bundle_server is None:
            assert str(pod.settings.bundle) in mounts, name
            assert pod.volume(mounts[str(pod.settings.bundle)]["name"])["configMap"]["name"] == "toolauthz-policies"
        else:  # a bundle server's credentials from a Secret, the verification keys beside them
            server = pod.settings.bundle_server
            for path in (server.bearer_token_file, server.ca_file):
                assert path is not None and str(path.parent) in mounts, (name, path)
                assert "secret" in pod.volume(mounts[str(path.parent)]["name"]), (name, path)
                assert mounts[str(path.parent)]["readOnly"] is True
            assert pod.settings.bundle_verification is not None
            for key in pod.settings.bundle_verification.keys:
                assert str(key.file.parent) in mounts, (name, key.file)
        assert str(pod.settings.data_dir) in mounts, name
        assert "/tmp" in mounts, name
        for listener in pod.settings.listeners:
            if listener.tls is not None:
                for path in (listener.tls.cert, listener.tls.key, listener.tls.client_ca):
                    assert path is not None and str(path.parent) in mounts, (name, path)
                    assert "secret" in pod.volume(mounts[str(path.parent)]["name"]), (name, path)


def test_the_unix_socket_is_on_a_volume_shared_with_the_agent(tmp_path):
    pods = sidecar_pods("base", tmp_path)
    [pod] = pods
    [unix] = [listener for listener in pod.settings.listeners if listener.address.startswith("unix://")]
    socket_path = pathlib.PurePosixPath(unix.address.removeprefix("unix://"))
    mount = pod.mounts()[str(socket_path.parent)]
    assert "emptyDir" in pod.volume(mount["name"])
    agent = next(c for c in pod.pod["containers"] if c["name"] == "agent-runtime")
    assert pod.mounts(agent)[str(socket_path.parent)]["name"] == mount["name"]
    assert {e["name"]: e.get("value") for e in agent["env"]}["TOOLAUTHZ_SERVER"] == unix.address
    assert unix.mode == 0o660 and pod.pod["securityContext"]["fsGroup"] == pod.pod["securityContext"]["runAsGroup"]


def test_the_probes_dial_a_health_only_listener_off_loopback(tmp_path):
    for name, pod in all_sidecar_pods(tmp_path):
        ports = {p["containerPort"] for p in pod.container["ports"]}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            port = pod.container[probe]["grpc"]["port"]
            listeners = [li for li in pod.settings.listeners
                         if not li.address.startswith("unix:") and port_of(li.address) == port]
            assert len(listeners) == 1, (name, probe)
            health = listeners[0]
            # The kubelet dials the pod IP: a loopback listener would fail every probe.
            assert health.address.rsplit(":", 1)[0] in ("0.0.0.0", "[::]"), (name, health.address)
            assert health.services == () and health.tls is None, (name, health)
            assert port in ports, (name, probe)


def test_metrics_and_services_name_ports_that_exist(tmp_path):
    for name in KUSTOMIZATIONS:
        pods = sidecar_pods(name, tmp_path)
        for pod in pods:
            data = yaml.safe_load(pod.config_text)
            if "metrics_listen" in data:
                assert port_of(data["metrics_listen"]) in {p["containerPort"] for p in pod.container["ports"]}
        for service in (r for r in built(name) if r["kind"] == "Service"):
            selector = service["spec"]["selector"].items()
            [pod] = [p for p in pods if selector <= p.deployment["spec"]["template"]["metadata"]["labels"].items()]
            port_names = {p["name"]: p["containerPort"] for c in pod.containers() for p in c.get("ports", [])}
            for port in service["spec"]["ports"]:
                assert port["targetPort"] in port_names, (name, port)
            tls_ports = {port_of(li.address) for li in pod.settings.listeners if li.tls is not None}
            assert tls_ports and tls_ports <= set(port_names.values())


def test_the_central_listener_requires_client_certificates(tmp_path):
    central = next(p for p in sidecar_pods("overlays/central", tmp_path)
                   if p.deployment["metadata"]["name"] == "toolauthz-central")
    exposed = [li for li in central.settings.listeners if li.services]
    assert exposed and all(li.tls is not None and li.tls.client_ca is not None for li in exposed)
    assert {s for li in exposed for s in li.services} == {"approvals", "audit"}
    # The agents' sidecars in that overlay serve the authorizer alone.
    agent = next(p for p in sidecar_pods("overlays/central", tmp_path) if p.deployment["metadata"]["name"] == "agent")
    assert {s for li in agent.settings.listeners for s in li.services} == {"authorizer"}


def test_environment_overrides_are_ones_the_sidecar_reads(tmp_path):
    known = set(config_module.ENVIRONMENT) | {"TOOLAUTHZ_SERVER"}
    for name in KUSTOMIZATIONS:
        for resource in built(name):
            if resource["kind"] not in ("Deployment", "Job"):
                continue
            pod = resource["spec"]["template"]["spec"]
            for container in [*pod.get("initContainers", []), *pod["containers"]]:
                for env in container.get("env", []):
                    if env["name"].startswith("TOOLAUTHZ_"):
                        assert env["name"] in known | EXPECTED_FROM_OTHER_WORK_ENV, (name, env["name"])
                    if env["name"] == "TOOLAUTHZ_STORE":  # which Secret: test_each_container_reads_its_own_store_secret
                        assert set(env["valueFrom"]["secretKeyRef"]) == {"name", "key"}
                assert not any("$(TOOLAUTHZ_STORE)" in arg for arg in container.get("args", [])), \
                    "a secret on a command line shows in the node's process list"


# ---------------------------------------------------------------- store roles, disruption, network

def secrets_read(container: dict[str, Any], pod: dict[str, Any]) -> set[str]:
    """Every Secret a container can read: through its environment or a mounted volume."""
    names = set()
    for env in container.get("env", []):
        ref = env.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            names.add(ref["name"])
    for source in container.get("envFrom", []):
        if "secretRef" in source:
            names.add(source["secretRef"]["name"])
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        secret = volumes[mount["name"]].get("secret")
        if secret:
            names.add(secret["secretName"])
    return names


@pytest.mark.parametrize("name", ["overlays/postgres", "overlays/central", "overlays/monitoring", "overlays/console",
                                  "overlays/bundle-server"])
def test_each_container_reads_its_own_store_secret(name):
    """The migration runs as the schema's owner and grants the serving role; every sidecar
    connects as that serving role, so it can append to the audit trail, never rewrite it."""
    resources = built(name)
    [job] = [r for r in resources if r["kind"] == "Job"]
    [migrate] = job["spec"]["template"]["spec"]["containers"]
    assert migrate["args"][:2] == ["store", "migrate"] and "--serving-role" in migrate["args"]
    assert secrets_read(migrate, job["spec"]["template"]["spec"]) == {"toolauthz-store-owner"}
    reading = {}
    for deployment in (r for r in resources if r["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            reading[(deployment["metadata"]["name"], container["name"])] = secrets_read(container, pod)
    assert all("toolauthz-store-owner" not in secrets for secrets in reading.values()), reading
    sidecars = {key: secrets for key, secrets in reading.items() if key[1] == "toolauthz"}
    assert sidecars and all("toolauthz-store-serving" in secrets for secrets in sidecars.values()), sidecars
    assert {key for key, secrets in reading.items() if "toolauthz-store-serving" in secrets} == set(sidecars)


def test_the_central_deployment_survives_a_drain_and_a_node_loss():
    resources = built("overlays/central")
    central = next(r for r in resources if r["kind"] == "Deployment" and r["metadata"]["name"] == "toolauthz-central")
    labels = central["spec"]["template"]["metadata"]["labels"]
    [budget] = [r for r in resources if r["kind"] == "PodDisruptionBudget"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert 1 <= budget["spec"]["minAvailable"] < central["spec"]["replicas"]
    [term] = central["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()


def _admitted(policies: list[dict[str, Any]], labels: dict[str, str], port: int) -> list[list[dict[str, Any]]]:
    """For each NetworkPolicy rule that opens `port` on pods with `labels`: its `from`
    ([] = from anywhere)."""
    rules = []
    for policy in policies:
        if not policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items():
            continue
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        for rule in policy["spec"].get("ingress", []):
            if any(p["port"] == port for p in rule.get("ports", [])):
                rules.append(rule.get("from", []))
    return rules


MONITORING = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_network_policies_admit_metrics_from_monitoring_and_the_api_from_the_runtime(name, tmp_path):
    resources = built(name)
    policies = [r for r in resources if r["kind"] == "NetworkPolicy"]
    for pod in sidecar_pods(name, tmp_path):
        labels = pod.deployment["spec"]["template"]["metadata"]["labels"]
        assert any(p["spec"]["podSelector"]["matchLabels"].items() <= labels.items() for p in policies), \
            "every sidecar's pod is under a NetworkPolicy (default deny for what it does not open)"
        annotations = pod.deployment["spec"]["template"]["metadata"]["annotations"]
        metrics = port_of(pod.settings.metrics_listen)
        assert annotations["prometheus.io/scrape"] == "true" and int(annotations["prometheus.io/port"]) == metrics
        assert _admitted(policies, labels, metrics) == [MONITORING]
        for listener in pod.settings.listeners:
            if listener.address.startswith("unix:"):
                continue
            sources = _admitted(policies, labels, port_of(listener.address))
            if listener.services:  # an API: the runtime's pods and the labelled clients only
                assert sources == [[{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "agent"}}},
                                    {"podSelector": {"matchLabels": {"toolauthz.io/central-client": "true"}}}]]
            else:  # health only: the kubelet's probes, from the node
                assert sources == [[]]


def test_the_console_is_reached_only_through_oauth2_proxy(tmp_path):
    resources = built("overlays/console")
    central = next(p for p in sidecar_pods("overlays/console", tmp_path)
                   if p.deployment["metadata"]["name"] == "toolauthz-central")
    console = central.settings.console
    assert central.settings.console_listen.startswith("127.0.0.1:")  # loopback: the proxy in the pod only
    assert console.sign_in == "proxy" and console.proxy is not None
    assert console.proxy.trusted == ("127.0.0.1/32",) and console.proxy.tenant
    proxy = next(c for c in central.pod["containers"] if c["name"] == "oauth2-proxy")
    assert f"--upstream=http://{central.settings.console_listen}/" in proxy["args"]
    assert "--pass-user-headers=true" in proxy["args"]
    assert secrets_read(proxy, central.pod) == {"toolauthz-console-oauth2"}
    service = next(r for r in resources if r["kind"] == "Service" and r["metadata"]["name"] == "toolauthz-console")
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["console"]
    assert {p["name"]: p["containerPort"] for p in proxy["ports"]}["console"] == 4180


@pytest.mark.parametrize("name", ["overlays/central", "overlays/monitoring", "overlays/console"])
def test_metrics_are_not_on_the_public_service(name):
    resources = built(name)
    public = next(r for r in resources if r["kind"] == "Service" and r["metadata"]["name"] == "toolauthz-central")
    assert [p["name"] for p in public["spec"]["ports"]] == ["grpc-tls"]
    metrics = next(r for r in resources if r["kind"] == "Service" and
                   r["metadata"]["name"] == "toolauthz-central-metrics")
    assert [p["targetPort"] for p in metrics["spec"]["ports"]] == ["metrics"]


def test_the_service_monitor_selects_the_metrics_service():
    resources = built("overlays/monitoring")
    [monitor] = [r for r in resources if r["kind"] == "ServiceMonitor"]
    selected = [r for r in resources if r["kind"] == "Service" and
                monitor["spec"]["selector"]["matchLabels"].items() <= r["metadata"]["labels"].items()]
    assert [r["metadata"]["name"] for r in selected] == ["toolauthz-central-metrics"]
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == {p["name"] for p in selected[0]["spec"]["ports"]}


# ---------------------------------------------------------------- the bundle ConfigMap

def test_the_policies_configmap_is_the_example_bundle_and_loads(tmp_path):
    for name in ("base", "overlays/central"):
        resources = built(name)
        configmap = next(r for r in resources if r["metadata"]["name"] == "toolauthz-policies")
        for deployment in (r for r in resources if r["kind"] == "Deployment"):
            volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "policies")
            items = volume["configMap"]["items"]
            assert {i["key"] for i in items} == set(configmap["data"]), "every key projected, no missing key"
            projected = tmp_path / name.replace("/", "_") / deployment["metadata"]["name"]
            for item in items:
                (projected / item["path"]).parent.mkdir(parents=True, exist_ok=True)
                (projected / item["path"]).write_text(configmap["data"][item["key"]], encoding="utf-8")
            assert load_bundle(projected).version == load_bundle(EXAMPLE_BUNDLE).version


def test_the_generator_reproduces_the_committed_bundle_files(tmp_path):
    copy_root = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, copy_root)
    generated = ["base/policies.yaml", "base/policies-volume.yaml", "overlays/central/policies-volume.yaml"]
    for rel in generated:
        (copy_root / rel).unlink()
    subprocess.run([sys.executable, str(KUBERNETES / "bundle-configmap.py"), str(EXAMPLE_BUNDLE), str(copy_root)],
                   check=True, timeout=60, cwd=ROOT)
    for rel in generated:
        expected = (KUBERNETES / rel).read_text().replace(f"`{EXAMPLE_BUNDLE.as_posix()}`", "`policies`")
        got = (copy_root / rel).read_text().replace(f"`{EXAMPLE_BUNDLE.as_posix()}`", "`policies`")
        assert got == expected, f"{rel} is stale: run deploy/kubernetes/bundle-configmap.py policies deploy/kubernetes"


# ---------------------------------------------------------------- Dockerfile

@dataclass(frozen=True)
class Instruction:
    keyword: str
    value: str
    stage: int


def dockerfile() -> list[Instruction]:
    """The instructions, with continuation lines joined and comments dropped."""
    lines = []
    pending = ""
    for raw in (DEPLOY / "Dockerfile").read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or not stripped:
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    assert not pending
    instructions, stage = [], -1
    for line in lines:
        keyword, _, value = line.partition(" ")
        if keyword.upper() == "FROM":
            stage += 1
        instructions.append(Instruction(keyword.upper(), value.strip(), stage))
    return instructions


def exec_form(value: str) -> list[str]:
    assert value.startswith("["), f"not exec form: {value}"
    parsed = json.loads(value)
    assert isinstance(parsed, list) and all(isinstance(v, str) for v in parsed)
    return parsed


def test_the_dockerfile_is_multi_stage_on_a_pinned_tag():
    instructions = dockerfile()
    froms = [i.value.split() for i in instructions if i.keyword == "FROM"]
    assert len(froms) >= 2
    for words in froms:
        image = words[0]
        name, _, tag = image.partition(":")
        assert tag and tag != "latest" and re.search(r"\d", tag), f"`{image}` is not pinned by a version tag"
        assert len(words) == 3 and words[1].upper() == "AS"
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"#.*FROM \S+@sha256:", text), "say how to pin the base by digest"
    assert not [i for i in instructions if i.keyword == "ADD"], "COPY, never ADD (no remote URLs, no tar magic)"
    build_stage = froms[0][2]
    final = [i for i in instructions if i.stage == len(froms) - 1]
    assert any(i.keyword == "COPY" and f"--from={build_stage}" in i.value for i in final)


def test_the_dockerfile_installs_exactly_the_locked_versions():
    instructions = dockerfile()
    last = max(i.stage for i in instructions)
    build_runs = " ".join(i.value for i in instructions if i.stage == 0 and i.keyword == "RUN")
    final_runs = " ".join(i.value for i in instructions if i.stage == last and i.keyword == "RUN")
    assert "pip wheel" in build_runs and "-c requirements.lock" in build_runs
    assert "pip install --no-index" in final_runs and "requirements.lock" in final_runs
    for instruction in instructions:
        if instruction.keyword == "COPY" and "--from" not in instruction.value:
            *sources, _destination = instruction.value.split()
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
    lock = (ROOT / "requirements.lock").read_text().splitlines()
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[^=\s]+", line) for line in lock if line and not line.startswith("#"))


def test_the_image_runs_as_a_numeric_non_root_user_on_a_read_only_root():
    instructions = dockerfile()
    last = max(i.stage for i in instructions)
    final = [i for i in instructions if i.stage == last]
    users = [i.value for i in final if i.keyword == "USER"]
    assert users, "the runtime stage sets USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0 and (not gid or int(gid) != 0)
    after_user = final[[i.keyword for i in final].index("USER"):]
    assert not [i for i in after_user if i.keyword == "RUN"], "nothing runs as the image user at build time"
    env = " ".join(i.value for i in final if i.keyword == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env  # no __pycache__ writes on a read-only root
    volumes = {v for i in final if i.keyword == "VOLUME" for v in exec_form(i.value)}
    settings = load_settings(DEPLOY / "toolauthz.yaml")
    socket_dirs = {str(pathlib.PurePosixPath(li.address.removeprefix("unix://")).parent)
                   for li in settings.listeners if li.address.startswith("unix://")}
    assert {str(settings.data_dir), "/tmp", *socket_dirs} <= volumes  # keys live under data_dir


def test_the_image_checks_its_health_through_grpc_health():
    from toolauthz.cli.main import build_parser

    instructions = dockerfile()
    [healthcheck] = [i.value for i in instructions if i.keyword == "HEALTHCHECK"]
    command = exec_form(healthcheck.split(" CMD ", 1)[1])
    assert command[:2] == ["toolauthz", "health"]
    args = build_parser().parse_args(command[1:])  # a command the CLI accepts
    settings = load_settings(DEPLOY / "toolauthz.yaml")
    assert args.server in {li.address for li in settings.listeners}
    [entrypoint] = [exec_form(i.value) for i in instructions if i.keyword == "ENTRYPOINT"]
    [cmd] = [exec_form(i.value) for i in instructions if i.keyword == "CMD"]
    assert entrypoint == ["toolauthz"] and cmd[:2] == ["serve", "--config"]
    copies = {i.value.split()[-1]: i.value.split()[-2] for i in instructions if i.keyword == "COPY"}
    assert copies[cmd[2]] == "deploy/toolauthz.yaml"
    build_parser().parse_args(cmd)


def test_the_dockerignore_keeps_keys_and_data_out_of_the_build_context():
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".toolauthz", ".venv", ".git", "**/*.pem"} <= ignored


# ---------------------------------------------------------------- systemd

def unit_settings() -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in (DEPLOY / "systemd" / "toolauthz.service").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def test_the_systemd_unit_is_hardened_and_matches_its_config():
    unit = unit_settings()
    assert unit["ProtectSystem"] == ["strict"]
    assert unit["NoNewPrivileges"] == ["yes"]
    assert unit.get("DynamicUser") == ["yes"] or unit["User"][0] not in ("", "root", "0")
    for flag in ("PrivateTmp", "PrivateDevices", "ProtectHome", "ProtectKernelTunables", "ProtectKernelModules",
                 "ProtectControlGroups", "RestrictSUIDSGID", "LockPersonality", "RestrictNamespaces"):
        assert unit[flag] == ["yes"], flag
    assert unit["CapabilityBoundingSet"] == [""]
    settings = load_settings(DEPLOY / "systemd" / "toolauthz.yaml")
    exec_start = shlex.split(unit["ExecStart"][0])
    assert exec_start[1:3] == ["serve", "--config"] and exec_start[3] == "/etc/toolauthz/toolauthz.yaml"
    writable = set(" ".join(unit["ReadWritePaths"]).split())
    assert str(settings.data_dir) == "/var/lib/" + unit["StateDirectory"][0] and str(settings.data_dir) in writable
    for listener in settings.listeners:
        if listener.address.startswith("unix://"):
            socket_dir = pathlib.PurePosixPath(listener.address.removeprefix("unix://")).parent
            assert str(socket_dir) == "/run/" + unit["RuntimeDirectory"][0] and str(socket_dir) in writable
        else:
            assert listener.address.startswith("127.0.0.1:"), "a VM's plaintext listener stays on loopback"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_unit(tmp_path):
    unit = tmp_path / "toolauthz.service"
    shutil.copy(DEPLOY / "systemd" / "toolauthz.service", unit)
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=120)
    problems = [line for line in (result.stdout + result.stderr).splitlines()
                if line.strip() and "is not executable" not in line and "/opt/toolauthz/bin/toolauthz" not in line]
    assert not problems, problems


# ---------------------------------------------------------------- config files carried

def test_every_config_file_loads_in_the_config_model(tmp_path):
    texts = [(DEPLOY / "toolauthz.yaml").read_text(), (DEPLOY / "systemd" / "toolauthz.yaml").read_text()]
    for name in KUSTOMIZATIONS:
        texts += [r["data"]["toolauthz.yaml"] for r in built(name)
                  if r["kind"] == "ConfigMap" and "toolauthz.yaml" in r.get("data", {})]
    assert len(texts) >= 5
    for n, text in enumerate(texts):
        settings = settings_from_text(text, tmp_path / f"{n}.yaml")
        assert settings.generate_missing_keys is False  # production: keys come from the operator
        assert settings.listeners, "every deployment names its listeners"


def test_an_unknown_config_key_is_caught(tmp_path):
    text = (DEPLOY / "toolauthz.yaml").read_text() + "metrics_listn: 0.0.0.0:9090\n"
    with pytest.raises(AssertionError, match="metrics_listn"):
        settings_from_text(text, tmp_path / "x.yaml")
