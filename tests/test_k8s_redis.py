"""GCS fault tolerance on Kubernetes: the RayService's gcsFaultToleranceOptions and k8s/redis (the Redis for
clusters without one) agree on the address and the Secret, Redis persists, and only the GCS may reach it."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.test_k8s import K8S, K8S_VERSION, OVERLAYS, kustomize, one, pod_templates

REDIS = K8S / "redis"
CLEANUP = "redis-cleanup"  # ray.io/node-type of the Pod of KubeRay's Redis cleanup Job (a copy of the head's)


@pytest.fixture(scope="module")
def redis() -> list[dict[str, Any]]:
    out = kustomize(REDIS)
    assert not out.patches_unmatched and not out.images_unmatched
    return out.docs


def redis_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = one(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def test_redis_objects_validate_against_kubernetes(redis: list[dict[str, Any]]) -> None:
    import kubernetes_validate

    assert {d["kind"] for d in redis} == {"ConfigMap", "Service", "StatefulSet", "NetworkPolicy"}
    for doc in redis:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        assert doc["metadata"]["namespace"] == "image-classifier"


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_every_rayservice_keeps_its_gcs_in_the_redis_of_k8s_redis(overlay: str, redis: list[dict[str, Any]]) -> None:
    ft = one(kustomize(OVERLAYS[overlay]).docs, "RayService")["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
    assert ft.get("backend", "redis") == "redis"
    assert "externalStorageNamespace" not in ft  # KubeRay's default, the RayCluster's UID: an upgrade's two clusters
    # never share keys
    svc = one(redis, "Service")
    host, port = ft["redisAddress"].split(":")
    assert host == svc["metadata"]["name"] and int(port) in {p["port"] for p in svc["spec"]["ports"]}
    # The password: the Secret Redis itself reads, never a literal in a manifest.
    assert "value" not in ft["redisPassword"]
    secret = ft["redisPassword"]["valueFrom"]["secretKeyRef"]
    env = {e["name"]: e for e in redis_container(redis)["env"]}
    assert env["REDISCLI_AUTH"]["valueFrom"]["secretKeyRef"] == secret
    assert "$(REDISCLI_AUTH)" in redis_container(redis)["args"]


def test_redis_persists_what_the_gcs_writes(redis: list[dict[str, Any]]) -> None:
    conf = dict(
        line.split(None, 1)
        for line in one(redis, "ConfigMap")["data"]["redis.conf"].splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    )
    assert conf["appendonly"] == "yes" and conf["appendfsync"] in ("everysec", "always")
    assert conf["maxmemory-policy"] == "noeviction"  # evicting a GCS table would corrupt the cluster's state
    sts = one(redis, "StatefulSet")
    claims = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
    mounts = {m["mountPath"]: m["name"] for m in redis_container(redis)["volumeMounts"]}
    assert mounts[conf["dir"]] in claims, "Redis's dir must be on the PersistentVolume"
    config_mount = next(p for p, n in mounts.items() if n == "config")
    assert redis_container(redis)["args"][:2] == ["redis-server", f"{config_mount}/redis.conf"]
    assert sts["spec"]["replicas"] == 1  # what KubeRay supports: a standalone Redis


def test_only_the_gcs_may_reach_redis(redis: list[dict[str, Any]]) -> None:
    policy = one(redis, "NetworkPolicy")
    pod_labels = one(redis, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rules = policy["spec"]["ingress"]
    assert [p["port"] for r in rules for p in r["ports"]] == [6379]
    peers = [peer for r in rules for peer in r["from"]]
    assert all(set(peer) == {"podSelector"} for peer in peers), "no namespaceSelector or ipBlock: this namespace only"

    def admitted(labels: dict[str, str]) -> bool:
        for peer in peers:
            sel = peer["podSelector"]
            exprs = sel.get("matchExpressions", [])
            assert all(e["operator"] == "In" for e in exprs)
            if sel.get("matchLabels", {}).items() <= labels.items() and all(
                labels.get(e["key"]) in e["values"] for e in exprs
            ):
                return True
        return False

    rs = one(kustomize(K8S).docs, "RayService")
    for group, template in pod_templates(rs).items():
        node_type = "head" if group == "head" else "worker"
        labels = dict(template["metadata"]["labels"], **{"ray.io/node-type": node_type})
        assert admitted(labels) == (group == "head"), group
        if group == "head":  # KubeRay's cleanup Job runs the head's template under another node type
            assert admitted(dict(labels, **{"ray.io/node-type": CLEANUP}))
    assert not admitted({"ray.io/node-type": "head"}), "a head of another service"
    assert not admitted({"app.kubernetes.io/name": "ingress-nginx"})


def test_the_redis_pod_meets_the_restricted_pod_security_standard(redis: list[dict[str, Any]]) -> None:
    spec = one(redis, "StatefulSet")["spec"]["template"]["spec"]
    pod, c = spec["securityContext"], redis_container(redis)
    sc = c["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] not in (None, 0)
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["readOnlyRootFilesystem"] is True
    assert c["resources"]["requests"] == c["resources"]["limits"]
    assert ":" in c["image"] and not c["image"].endswith(":latest")


def test_the_redis_kustomization_is_apart_from_the_service() -> None:
    """Users with their own Redis apply k8s/ alone: k8s/redis is not among its resources."""
    base = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert not any("redis" in r for r in base["resources"])
