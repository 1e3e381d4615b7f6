"""The deployment files: Kubernetes manifests valid against the Kubernetes schema (offline, with the
schemas kubernetes-validate ships), probes and ports wired to the server's routes, and the compose
file wiring the server to coturn."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"
K8S_VERSION = "1.30.0"
DRAIN_TIMEOUT_S = 30  # the server's default WORLDRTC_DRAIN_TIMEOUT_S


def manifests() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DOCKER / "k8s" / "worldrtc.yaml").read_text()) if d]


def deployments() -> list[dict[str, Any]]:
    return [d for d in manifests() if d["kind"] == "Deployment"]


@pytest.mark.parametrize("doc", manifests(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_each_manifest_is_valid_kubernetes(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_validator_rejects_a_broken_manifest() -> None:
    broken = copy.deepcopy(deployments()[0])
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = {"no": "port"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


@pytest.mark.parametrize("deployment", deployments(), ids=lambda d: d["metadata"]["name"])
def test_probes_ports_and_lifecycle_match_the_server(deployment: dict[str, Any]) -> None:
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/capacityz"  # readiness is capacity
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["startupProbe"]["httpGet"]["path"] == "/readyz"
    ports = {(p["containerPort"], p["protocol"]) for p in container["ports"]}
    assert {(8000, "TCP"), (40000, "UDP")} <= ports
    assert pod["hostNetwork"] is True and pod["terminationGracePeriodSeconds"] > DRAIN_TIMEOUT_S
    env = {e["name"]: e for e in container["env"]}
    assert env["WORLDRTC_PUBLIC_URL"]["value"] == "http://$(NODE_IP):8000"
    assert env["WORLDRTC_API_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "api-token"
    assert "memory" in container["resources"]["limits"]


def test_the_gpu_shape_asks_for_gpus_and_mounts_weights_read_only() -> None:
    (gpu,) = [d for d in deployments() if d["metadata"]["labels"]["worldrtc/shape"] == "4gpu"]
    container = gpu["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert (
        "--placement" in container["args"] and container["args"][container["args"].index("--placement") + 1] == "4gpu"
    )
    (mount,) = container["volumeMounts"]
    assert mount["readOnly"] is True and mount["mountPath"] == "/weights"


def test_the_service_balances_over_every_shape() -> None:
    (service,) = [d for d in manifests() if d["kind"] == "Service"]
    for deployment in deployments():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()


def test_compose_wires_the_server_to_coturn() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    server, turn = compose["services"]["worldrtc"], compose["services"]["coturn"]
    assert server["environment"]["WORLDRTC_TURN_SECRET"] == "${TURN_SECRET:?set TURN_SECRET}"
    assert "--use-auth-secret" in turn["command"] and "--static-auth-secret=${TURN_SECRET}" in turn["command"]
    assert re.search(r"turn:\$\{PUBLIC_HOST\}:3478", server["environment"]["WORLDRTC_TURN_URLS"])
    assert server["network_mode"] == turn["network_mode"] == "host"
    assert int(server["stop_grace_period"].rstrip("s")) > DRAIN_TIMEOUT_S
