"""The Kubernetes manifests in deploy/ stay wired to the server: every environment variable
they set is a server flag's twin (or NCCL's), the probes ask /health on the HTTP port, and the
ranks' arithmetic matches the launcher's (--world_rank is a node's first rank)."""

import os
from dataclasses import fields
from unittest import mock

import pytest
import yaml

from rtp_llm.config.server_config import ServerConfig, parse_server_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFESTS = ["deploy/k8s/single-node.yaml", "deploy/k8s/multi-node-lws.yaml", "deploy/k8s/pd-disaggregated.yaml"]


def _containers(doc):
    if doc["kind"] == "Deployment":
        yield "server", doc["spec"]["template"]["spec"]["containers"][0]
    elif doc["kind"] == "LeaderWorkerSet":
        t = doc["spec"]["leaderWorkerTemplate"]
        yield "leader", t["leaderTemplate"]["spec"]["containers"][0]
        yield "worker", t["workerTemplate"]["spec"]["containers"][0]


def _parse_as_the_server(env, flags):
    """The ServerConfig the launcher makes of the container's environment (set values only),
    validated; --checkpoint_path wins over CHECKPOINT_PATH (the model volume is not here)."""
    with mock.patch.dict(os.environ):
        for name in flags:
            os.environ.pop(name, None)
        os.environ.update({k: v for k, v in env.items() if k in flags and v is not None})
        return parse_server_config([f"--checkpoint_path={ROOT}"])


@pytest.mark.parametrize("path", MANIFESTS)
def test_manifest_env_are_server_flags_and_probes_hit_health(path):
    flags = {f.name.upper() for f in fields(ServerConfig)}
    docs = list(yaml.safe_load_all(open(os.path.join(ROOT, path))))
    found = 0
    for doc in docs:
        for role, c in _containers(doc):
            found += 1
            env = {e["name"]: e.get("value") for e in c["env"]}
            unknown = {n for n in env if n not in flags and not n.startswith("NCCL_")}
            assert not unknown, f"{path} {role}: not server flags: {unknown}"
            config = _parse_as_the_server(env, flags)
            # A PREFILL pod's /health fails while its decode instance is away: no liveness probe
            # (a restart would not bring the decode instance back).
            probes = ("startupProbe", "readinessProbe") if config.role_type == "PREFILL" else (
                "startupProbe", "readinessProbe", "livenessProbe")
            assert config.role_type != "PREFILL" or "livenessProbe" not in c
            for probe in probes:
                if role != "worker":
                    assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}, (path, role, probe)
            if doc["kind"] == "LeaderWorkerSet":
                size = doc["spec"]["leaderWorkerTemplate"]["size"]
                assert config.local_world_size * size == config.world_size == config.tp_size
                assert "--world_rank=$((LWS_WORKER_INDEX * LOCAL_WORLD_SIZE))" in " ".join(c["args"])
    assert found


def test_the_prefill_deployment_reaches_the_decode_rpc_service():
    docs = list(yaml.safe_load_all(open(os.path.join(ROOT, "deploy/k8s/pd-disaggregated.yaml"))))
    flags = {f.name.upper() for f in fields(ServerConfig)}
    roles = {}
    for doc in docs:
        for _, c in _containers(doc):
            env = {e["name"]: e.get("value") for e in c["env"]}
            config = _parse_as_the_server(env, flags)
            roles[config.role_type] = (config, c, {e["name"]: e for e in c["env"]})
    prefill, decode = roles["PREFILL"][0], roles["DECODE"][0]
    host, port = prefill.pd().decode_address.rsplit(":", 1)
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == host)
    rpc = next(p for p in service["spec"]["ports"] if p["port"] == int(port))
    container_port = {p["name"]: p["containerPort"] for p in roles["DECODE"][1]["ports"]}[rpc["targetPort"]]
    assert container_port == int(decode.rpc_bind_address.rsplit(":", 1)[1])
    for role in ("PREFILL", "DECODE"):  # peers read KV blocks at the pod's own address and port
        config, c, env = roles[role]
        assert env["KV_TRANSFER_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert {p["name"]: p["containerPort"] for p in c["ports"]}["kv-transfer"] == config.pd().kv_transfer_port
