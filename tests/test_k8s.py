"""k8s/: the manifests parse and validate, agree with configs/prod.yaml, pyproject.toml and the
Dockerfile, and give every Serve deployment the nodes it needs (and only those).

No cluster, no network, no Ray: the few kustomize features k8s/ uses (resources, namespace, images,
JSON 6902 patches) are re-implemented here to render each overlay, core objects are checked with
kubernetes-validate, and the RayService with KubeRay's own CRD schema (the shared validator beside
the repository) when it is there.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.batch.cli import parser
from app.ops import k8s

REPO = Path(__file__).resolve().parent.parent
K8S = REPO / "k8s"
PROD = REPO / "configs" / "prod.yaml"
# kubernetes-validate ships schemas for 1.25-1.37; 1.33 is what the managed offerings run widely.
K8S_VERSION = "1.33.0"
CRD_VALIDATOR = REPO.parent / "shared" / "tools" / "validate_rayservice.py"
OVERLAYS = {
    "base": K8S,
    "cpu": K8S / "overlays" / "cpu",
    "gpu": K8S / "overlays" / "gpu",
    "gpu-shared-cache": K8S / "overlays" / "gpu-shared-cache",
    "incremental": K8S / "overlays" / "incremental",
}
CUSTOM_KINDS = {("ray.io/v1", "RayService"), ("monitoring.coreos.com/v1", "PodMonitor")}
APP_LABEL = {"app.kubernetes.io/part-of": "image-classifier"}
SERVE_SVC = "image-classifier-serve-svc"
INCREMENTAL = "NewClusterWithIncrementalUpgrade"
# The Service Istio deploys for the Gateway KubeRay creates under the incremental strategy (k8s/overlays/incremental).
GATEWAY_SVC = "image-classifier-gateway-istio"
GATEWAY_PODS = {"gateway.networking.k8s.io/gateway-name": "image-classifier-gateway"}


# --------------------------------------------------------------------------- a small kustomize


@dataclass
class Rendered:
    docs: list[dict[str, Any]]
    images_unmatched: list[str]
    patches_unmatched: list[str]


def _load_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def _pointer(path: str) -> list[str]:
    assert path.startswith("/"), f"JSON pointer must start with '/': {path!r}"
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def apply_json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add / remove / replace / test: what k8s/ uses of what kustomize supports."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = _pointer(op["path"])
        parent, last = _walk(doc, parts[:-1]), parts[-1]
        kind = op["op"]
        if kind == "test":
            assert _walk(doc, parts) == op["value"], f"JSON patch test failed at {op['path']}"
        elif kind == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif kind == "replace":
            _walk(doc, parts)  # must exist
            parent[int(last) if isinstance(parent, list) else last] = copy.deepcopy(op["value"])
        elif kind == "add":
            if isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), copy.deepcopy(op["value"]))
            else:
                parent[last] = copy.deepcopy(op["value"])
        else:
            raise AssertionError(f"JSON patch op {kind!r} is not used by k8s/ and not implemented here")
    return doc


def _targets(target: dict[str, str], doc: dict[str, Any]) -> bool:
    group, _, version = doc["apiVersion"].rpartition("/")
    want = {"group": group, "version": version, "kind": doc["kind"], "name": doc["metadata"]["name"]}
    return all(want[k] == v for k, v in target.items())


def _split_image(image: str) -> tuple[str, str | None]:
    name, _, _digest = image.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon + 1 :]
    return name, None


def _set_images(node: Any, rule: dict[str, str]) -> bool:
    """kustomize's images transformer: every `image` under any containers/initContainers list."""
    hit = False
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                for c in value:
                    name, tag = _split_image(c["image"])
                    if name == rule["name"]:
                        c["image"] = f"{rule.get('newName', name)}:{rule.get('newTag', tag)}"
                        hit = True
            hit = _set_images(value, rule) or hit
    elif isinstance(node, list):
        for item in node:
            hit = _set_images(item, rule) or hit
    return hit


def kustomize(root: Path) -> Rendered:
    kust = yaml.safe_load((root / "kustomization.yaml").read_text(encoding="utf-8"))
    unknown = set(kust) - {"apiVersion", "kind", "namespace", "resources", "images", "patches"}
    assert not unknown, f"{root}: this test's kustomize does not implement {sorted(unknown)}"
    docs: list[dict[str, Any]] = []
    images_unmatched: list[str] = []
    patches_unmatched: list[str] = []
    for res in kust.get("resources", []):
        path = root / res
        assert path.exists(), f"{root / 'kustomization.yaml'}: resource {res} does not exist"
        if path.is_dir():
            sub = kustomize(path)
            docs += sub.docs
            images_unmatched += sub.images_unmatched
            patches_unmatched += sub.patches_unmatched
        else:
            docs += _load_docs(path)
    for patch in kust.get("patches", []):
        path = root / patch["path"]
        assert path.is_file(), f"{root / 'kustomization.yaml'}: patch {patch['path']} does not exist"
        ops = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert isinstance(ops, list), f"{path}: only JSON 6902 patches (a list of ops) are used in k8s/"
        hits = [i for i, d in enumerate(docs) if _targets(patch["target"], d)]
        if len(hits) != 1:
            patches_unmatched.append(f"{path} matched {len(hits)} objects")
        for i in hits:
            docs[i] = apply_json_patch(docs[i], ops)
    for rule in kust.get("images", []):
        if not any([_set_images(d, rule) for d in docs]):
            images_unmatched.append(f"{root}: images entry {rule['name']!r} matches no container")
    if "namespace" in kust:
        for d in docs:
            if d["kind"] != "Namespace":
                d["metadata"]["namespace"] = kust["namespace"]
    return Rendered(docs, images_unmatched, patches_unmatched)


@pytest.fixture(scope="module", params=sorted(OVERLAYS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    out = kustomize(OVERLAYS[request.param])
    return request.param, out.docs


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def serve_config(rayservice: dict[str, Any]) -> dict[str, Any]:
    cfg = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    assert isinstance(cfg, dict)
    return cfg


def pod_templates(rayservice: dict[str, Any]) -> dict[str, dict[str, Any]]:
    cluster = rayservice["spec"]["rayClusterConfig"]
    out = {"head": cluster["headGroupSpec"]["template"]}
    out.update({g["groupName"]: g["template"] for g in cluster["workerGroupSpecs"]})
    return out


# --------------------------------------------------------------------------- resource arithmetic

_SUFFIX = {"m": Fraction(1, 1000), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_SUFFIX.update({"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40})


def quantity(value: str | int | float) -> Fraction:
    """A Kubernetes resource quantity ("500m", "8Gi", "2") as an exact number."""
    text = str(value)
    match = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", text)
    assert match and (match.group(2) in _SUFFIX or not match.group(2)), f"not a quantity: {text!r}"
    return Fraction(match.group(1)) * _SUFFIX.get(match.group(2), 1)


def advertised(group: dict[str, Any]) -> dict[str, Fraction]:
    """What a group's Ray nodes advertise, read the way KubeRay and the Ray autoscaler read it:
    the group's `resources`, else rayStartParams, else the Ray container's limits."""
    res = group.get("resources") or {}
    params = group.get("rayStartParams") or {}
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    out: dict[str, Fraction] = {}
    if "CPU" in res:
        out["CPU"] = quantity(res["CPU"])
    elif "num-cpus" in params:
        out["CPU"] = Fraction(params["num-cpus"])
    else:
        out["CPU"] = Fraction(math.ceil(quantity(limits["cpu"])))
    gpu_limits = [quantity(v) for k, v in limits.items() if k.endswith("gpu")]
    if "GPU" in res:
        out["GPU"] = quantity(res["GPU"])
    elif "num-gpus" in params:
        out["GPU"] = Fraction(params["num-gpus"])
    else:
        out["GPU"] = sum(gpu_limits, Fraction(0))
    if res:
        out.update({k: quantity(v) for k, v in res.items() if k not in ("CPU", "GPU", "memory")})
    elif "resources" in params:
        out.update({k: Fraction(str(v)) for k, v in json.loads(params["resources"].strip("'\"")).items()})
    return out


@dataclass(frozen=True)
class Deployment:
    name: str
    asks: dict[str, Fraction]
    min_replicas: int
    max_replicas: int
    label_selector: dict[str, str]
    per_node: int | None = None  # max_replicas_per_node: at least ceil(replicas / per_node) nodes


def deployments(cfg: dict[str, Any]) -> list[Deployment]:
    out = []
    for app in cfg["applications"]:
        for d in app.get("deployments", []):
            opts = d.get("ray_actor_options") or {}
            asks = {"CPU": Fraction(str(opts.get("num_cpus", 1))), "GPU": Fraction(str(opts.get("num_gpus", 0)))}
            asks.update({k: Fraction(str(v)) for k, v in (opts.get("resources") or {}).items()})
            if "autoscaling_config" in d:
                auto = d["autoscaling_config"]
                lo, hi = auto.get("min_replicas", 1), auto.get("max_replicas", 1)
            else:
                lo = hi = d.get("num_replicas", 1)
            selector = opts.get("label_selector") or {}
            out.append(Deployment(d["name"], asks, lo, hi, selector, d.get("max_replicas_per_node")))
    return out


def _label_ok(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """Ray label selectors: "v", "!v", "in(a,b)", "!in(a,b)"."""
    for key, want in selector.items():
        negate = want.startswith("!")
        body = want[1:] if negate else want
        values = body[3:-1].split(",") if body.startswith("in(") else [body]
        if (labels.get(key) in [v.strip() for v in values]) == negate:
            return False
    return True


def can_host(group_resources: dict[str, Fraction], labels: dict[str, str], dep: Deployment) -> bool:
    fits = all(group_resources.get(k, 0) >= v for k, v in dep.asks.items() if v > 0)
    return fits and _label_ok(dep.label_selector, labels)


def pods_for(items: list[dict[str, Fraction]], capacity: dict[str, Fraction]) -> int:
    """Pods of `capacity` that hold all `items` (replica resource asks), first-fit decreasing."""
    pods: list[dict[str, Fraction]] = []
    for item in sorted(items, key=lambda it: (-it.get("GPU", 0), -it.get("CPU", 0))):
        need = {k: v for k, v in item.items() if v > 0}
        for pod in pods:
            if all(pod.get(k, 0) >= v for k, v in need.items()):
                break
        else:
            pod = dict(capacity)
            assert all(pod.get(k, 0) >= v for k, v in need.items()), f"{item} fits no pod of {capacity}"
            pods.append(pod)
        for k, v in need.items():
            pod[k] -= v
    return len(pods)


@dataclass
class GroupPlan:
    deployments: list[str]
    pods_min: int  # what the Serve minimums need, and one pod per replica of a deployment's minimum
    pods_max: int  # what the Serve maximums need


def placement(rayservice: dict[str, Any]) -> tuple[dict[str, list[str]], dict[str, GroupPlan]]:
    """Which groups each deployment can land on, and what each worker group must be able to hold."""
    cluster = rayservice["spec"]["rayClusterConfig"]
    head = dict(cluster["headGroupSpec"], groupName="head")
    groups = {g["groupName"]: g for g in [head, *cluster["workerGroupSpecs"]]}
    eligible: dict[str, list[str]] = {}
    plans = {g: GroupPlan([], 0, 0) for g in groups if g != "head"}
    for dep in deployments(serve_config(rayservice)):
        eligible[dep.name] = [
            g for g, spec in groups.items() if can_host(advertised(spec), spec.get("labels") or {}, dep)
        ]
        if len(eligible[dep.name]) == 1 and eligible[dep.name][0] != "head":
            plans[eligible[dep.name][0]].deployments.append(dep.name)
    for name, plan in plans.items():
        capacity = advertised(groups[name])
        deps = [d for d in deployments(serve_config(rayservice)) if d.name in plan.deployments]
        capped = [d for d in deps if d.per_node]
        most = pods_for([d.asks for d in deps for _ in range(d.max_replicas)], capacity)
        plan.pods_max = max([most, *[math.ceil(d.max_replicas / d.per_node) for d in capped if d.per_node]])
        least = pods_for([d.asks for d in deps for _ in range(d.min_replicas)], capacity)
        plan.pods_min = max([least, *[d.min_replicas for d in deps]])
    return eligible, plans


# --------------------------------------------------------------------------- every file parses


def yaml_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if "templates" not in p.parts)


def test_every_yaml_file_under_k8s_parses() -> None:
    assert yaml_files(), "no manifests under k8s/"
    for path in yaml_files():
        docs = _load_docs(path)
        assert docs, f"{path} is empty"


def test_every_manifest_has_kind_and_name(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    for doc in rendered[1]:
        assert doc.get("apiVersion") and doc.get("kind") and doc.get("metadata", {}).get("name"), doc


def test_kustomizations_reference_existing_files_and_every_patch_and_image_applies() -> None:
    for name, root in OVERLAYS.items():
        out = kustomize(root)
        assert not out.patches_unmatched, f"{name}: {out.patches_unmatched}"
        assert not out.images_unmatched, f"{name}: {out.images_unmatched}"


def test_base_kustomization_lists_every_manifest_in_k8s() -> None:
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    manifests = {p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"}
    assert manifests == listed, f"k8s/*.yaml not applied by `kubectl apply -k k8s/`: {manifests - listed}"


# --------------------------------------------------------------------------- schema validation


def test_core_objects_validate_against_kubernetes(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    import kubernetes_validate

    core = [d for d in rendered[1] if (d["apiVersion"], d["kind"]) not in CUSTOM_KINDS]
    assert {d["kind"] for d in core} >= {"Namespace", "Ingress", "NetworkPolicy"}
    for doc in core:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:  # pragma: no cover - the message is the point
            pytest.fail(f"{rendered[0]}: {doc['kind']}/{doc['metadata']['name']}: {e.message} at {list(e.path)}")


def _run_crd_validator(paths: list[Path]) -> str:
    if not CRD_VALIDATOR.is_file():
        pytest.skip(f"KubeRay CRD validator not found at {CRD_VALIDATOR}")
    proc = subprocess.run(
        [sys.executable, str(CRD_VALIDATOR), *map(str, paths)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_rayservice_validates_against_kuberay_crd() -> None:
    out = _run_crd_validator(sorted(K8S.glob("*.yaml")))
    assert out.strip().splitlines()[-1] == "1 RayService checked, 0 problems", out


def test_every_overlays_rayservice_validates_against_kuberay_crd(tmp_path: Path) -> None:
    paths = []
    for name, root in OVERLAYS.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(one(kustomize(root).docs, "RayService")))
        paths.append(path)
    out = _run_crd_validator(paths)
    assert out.strip().splitlines()[-1] == f"{len(paths)} RayService checked, 0 problems", out


def test_rayservice_follows_kuberay_operator_rules(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    """What the operator's own validation (not the CRD schema) would reject at reconcile time."""
    rs = one(rendered[1], "RayService")
    name = rs["metadata"]["name"]
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 47
    spec = rs["spec"]
    assert spec["upgradeStrategy"]["type"] in ("NewCluster", INCREMENTAL, "None")
    cluster = spec["rayClusterConfig"]
    if spec["upgradeStrategy"]["type"] == INCREMENTAL:  # utils/validation.go, ValidateClusterUpgradeOptions (v1.7.0)
        assert cluster.get("enableInTreeAutoscaling") is True, "the incremental upgrade needs the Ray autoscaler"
        opts = spec["upgradeStrategy"]["clusterUpgradeOptions"]
        surge = opts.get("maxSurgePercent", 100)
        assert 0 <= surge <= 100 and 0 <= opts["stepSizePercent"] <= surge
        assert opts["intervalSeconds"] > 0 and opts["gatewayClassName"]
    else:
        assert "clusterUpgradeOptions" not in spec["upgradeStrategy"]
    assert "upgradeStrategy" not in cluster, "a RayService's cluster may not set its own upgradeStrategy"
    v2 = cluster.get("autoscalerOptions", {}).get("version") == "v2"
    ray = tuple(int(x) for x in cluster["rayVersion"].split("."))
    if cluster.get("authOptions", {}).get("mode") == "token":
        assert ray >= (2, 52, 0)
    label = re.compile(
        r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
    )
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        params = group.get("rayStartParams") or {}
        start_resources = any(k in params for k in ("num-cpus", "num-gpus", "memory", "resources"))
        assert not (start_resources and group.get("resources")), "resources in both rayStartParams and resources"
        assert "labels" not in params
        assert all(label.fullmatch(k) and label.fullmatch(v) for k, v in (group.get("labels") or {}).items())
        assert group["template"]["spec"].get("restartPolicy") in (None, "Never")
        if "groupName" in group:
            assert 0 <= group["minReplicas"] <= group.get("replicas", group["minReplicas"]) <= group["maxReplicas"]
            assert v2 or "idleTimeoutSeconds" not in group, "per-group idleTimeoutSeconds needs autoscaler v2"


# --------------------------------------------------------------------------- generated files


def test_rendered_files_are_committed_byte_for_byte() -> None:
    for path, text in k8s.render(REPO).items():
        assert (REPO / path).read_bytes() == text.encode("utf-8"), (
            f"{path} is stale: run `python -m app.ops.k8s render`"
        )


def test_serve_config_v2_is_configs_prod_yaml() -> None:
    rs = one(_load_docs(K8S / "rayservice.yaml"), "RayService")
    embedded = rs["spec"]["serveConfigV2"]
    assert yaml.safe_load(embedded) == yaml.safe_load(PROD.read_text(encoding="utf-8"))
    # Verbatim, comments included (a literal block keeps exactly one final newline).
    assert embedded == PROD.read_text(encoding="utf-8").rstrip("\n") + "\n"


def test_every_ray_container_runs_with_configs_serve_env(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    from app.config import read_serve_env

    want = read_serve_env()
    assert want.get("RAY_SERVE_ENABLE_HA_PROXY") == "1"
    for group, template in pod_templates(one(rendered[1], "RayService")).items():
        for container in template["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert {k: env.get(k) for k in want} == want, (rendered[0], group, container["name"])


def test_a_template_container_without_the_serve_env_is_refused() -> None:
    template = (REPO / k8s.TEMPLATE).read_text(encoding="utf-8")
    broken = template.replace(f"\n                {k8s.SERVE_ENV_MARK}\n", "\n", 1)  # the head's
    assert broken != template
    with pytest.raises(k8s.RenderError, match="every container"):
        k8s.render_rayservice(broken, PROD.read_text(encoding="utf-8"), "2.60.0", "img:tag", {"A": "1"})


def test_check_fails_on_drift_and_render_fixes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    generated = (k8s.RAYSERVICE, k8s.CPU_PATCH, k8s.SHARED_CACHE_CONFIG, k8s.RAYJOB)
    for rel in (k8s.PYPROJECT, k8s.PROD_CONFIG, k8s.SERVE_ENV_FILE, k8s.TEMPLATE, k8s.RAYJOB_TEMPLATE, *generated):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    assert k8s.main(["render", "--check", "--root", str(tmp_path)]) == 0
    prod = tmp_path / k8s.PROD_CONFIG
    text, n = re.subn(r"weights: \{[^}]*\}", "weights: {int8: 37, fp32: 63}", prod.read_text(), count=1)
    assert n == 1 and text != prod.read_text(), "no Router weights in configs/prod.yaml: update this test"
    prod.write_text(text)
    assert k8s.main(["render", "--check", "--root", str(tmp_path)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert k8s.main(["render", "--root", str(tmp_path)]) == 0
    assert k8s.main(["render", "--check", "--root", str(tmp_path)]) == 0
    rs = one(_load_docs(tmp_path / k8s.RAYSERVICE), "RayService")
    assert "weights: {int8: 37, fp32: 63}" in rs["spec"]["serveConfigV2"]


def test_render_reports_a_missing_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert k8s.main(["render", "--check", "--root", str(tmp_path)]) == 2
    assert "pyproject.toml not found" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("dependency", "version"),
    [('"ray[serve]==2.60.*"', "2.60.0"), ('"ray==2.60.2"', "2.60.2"), ('"ray[serve,default] == 2.7"', "2.7.0")],
)
def test_ray_version_reads_the_pin(dependency: str, version: str) -> None:
    text = f'[project]\nname = "ray-image-classifier"\ndependencies = [\n  {dependency},\n  "rayleigh>=1",\n]\n'
    assert k8s.ray_version(text) == version


@pytest.mark.parametrize("dependency", ['"ray[serve]>=2.60"', '"ray"', '"ray[serve]==2.60.*,!=2.60.1"'])
def test_ray_version_refuses_a_loose_pin(dependency: str) -> None:
    with pytest.raises(k8s.RenderError):
        k8s.ray_version(f"dependencies = [{dependency}]")


def test_project_version_is_the_project_tables() -> None:
    text = '[tool.x]\nversion = "9"\n[project]\nname = "a"\nversion = "1.2.3"\n[tool.y]\nversion = "8"\n'
    assert k8s.project_version(text) == "1.2.3"
    with pytest.raises(k8s.RenderError):
        k8s.project_version('[tool.x]\nversion = "9"\n')


def test_embed_block_round_trips_blank_lines_and_unicode() -> None:
    text = "# ≈ comment\na: 1\n\nb:\n  c: 'x'   # trailing\n\n\n"
    doc = "v: |\n" + k8s.embed_block(text, "  ")
    assert yaml.safe_load(doc)["v"] == text.rstrip("\n") + "\n"
    assert " \n" not in k8s.embed_block(text, "  "), "blank lines must not carry trailing spaces"
    with pytest.raises(k8s.RenderError):
        k8s.embed_block("  indented: 1\n", "  ")


def test_render_rayservice_needs_each_mark_once() -> None:
    good = "a: @IMAGE@\nenv:\n  @SERVE_ENV@\nv: '@RAY_VERSION@'\ns: |\n  @SERVE_CONFIG@\n"
    out = k8s.render_rayservice(good, "x: 1\n", "2.60.0", "img:1", {"K": "1"})
    assert yaml.safe_load(out) == {"a": "img:1", "env": [{"name": "K", "value": "1"}], "v": "2.60.0", "s": "x: 1\n"}
    for bad in (good.replace("@IMAGE@", "i"), good + "@RAY_VERSION@\n", good.replace("  @SERVE", "  s: @SERVE")):
        with pytest.raises(k8s.RenderError):
            k8s.render_rayservice(bad, "x: 1\n", "2.60.0", "img:1")
    assert "#!" not in k8s.render_rayservice("#! a note @RAY_VERSION@\n" + good, "x: 1\n", "2.60.0", "img:1")


def test_cpu_serve_config_only_moves_the_classifiers_to_cpu() -> None:
    prod = yaml.safe_load(PROD.read_text(encoding="utf-8"))
    cpu = k8s.cpu_serve_config(prod)
    for dep in deployments(cpu):
        assert dep.asks["GPU"] == 0, dep
    args = cpu["applications"][0]["args"]
    assert args["device"] == "cpu" and args["require_gpu"] is False and "gpu_mem_limit_bytes" not in args
    # Put back what the transform changes: nothing else may differ.
    back = copy.deepcopy(cpu)
    back["applications"][0]["args"] = dict(prod["applications"][0]["args"])
    for mine, theirs in zip(
        back["applications"][0]["deployments"], prod["applications"][0]["deployments"], strict=True
    ):
        mine.setdefault("ray_actor_options", {})["num_gpus"] = theirs.get("ray_actor_options", {}).get("num_gpus")
    assert back == prod
    assert prod != cpu, "the transform must not change its input"


def test_every_serve_config_is_valid_for_serve_and_the_app(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    """serveConfigV2 of each overlay parses as Ray Serve's deploy schema and the app's typed args."""
    from ray.serve.schema import ServeDeploySchema

    from app.config import AppArgs, ClassifierConfig, RouterConfig

    cfg = serve_config(one(rendered[1], "RayService"))
    ServeDeploySchema.model_validate(cfg)
    for app in cfg["applications"]:
        AppArgs.model_validate(app["args"])
        for dep in app["deployments"]:
            if dep["name"] == "Router":
                RouterConfig.model_validate(dep["user_config"])
            elif dep["name"].startswith("Classifier_"):
                ClassifierConfig.model_validate(dep["user_config"])


# --------------------------------------------------------------------------- versions and images


def _pyproject() -> str:
    return (REPO / "pyproject.toml").read_text(encoding="utf-8")


def test_ray_version_is_the_pinned_one(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    rs = one(rendered[1], "RayService")
    assert rs["spec"]["rayClusterConfig"]["rayVersion"] == k8s.ray_version(_pyproject())


def test_images_agree_across_groups_and_with_the_kustomizations() -> None:
    ray, version = k8s.ray_version(_pyproject()), k8s.project_version(_pyproject())
    gpu_tag = k8s.image_tag(version, ray, k8s.GPU_PLATFORM)
    rs = one(_load_docs(K8S / "rayservice.yaml"), "RayService")
    images = {c["image"] for t in pod_templates(rs).values() for c in t["spec"]["containers"]}
    assert images == {f"{k8s.IMAGE_NAME}:{gpu_tag}"}
    base = yaml.safe_load((K8S / "kustomization.yaml").read_text())["images"]
    assert [(i["name"], i["newTag"]) for i in base] == [(k8s.IMAGE_NAME, gpu_tag)]
    registry = base[0]["newName"]
    want = {
        "base": gpu_tag,
        "gpu": gpu_tag,
        "gpu-shared-cache": gpu_tag,
        "incremental": gpu_tag,
        "cpu": k8s.image_tag(version, ray, k8s.CPU_PLATFORM),
    }
    for name, root in OVERLAYS.items():
        if name != "base":
            rules = yaml.safe_load((root / "kustomization.yaml").read_text())["images"]
            assert [r["name"] for r in rules] == [registry], f"{name}: images must match the base's newName"
        docs = kustomize(root).docs
        used = {c["image"] for t in pod_templates(one(docs, "RayService")).values() for c in t["spec"]["containers"]}
        assert used == {f"{registry}:{want[name]}"}, name


# --------------------------------------------------------------------------- placement and capacity


def test_only_the_gpu_group_advertises_gpus(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    cluster = one(rendered[1], "RayService")["spec"]["rayClusterConfig"]
    head = advertised(cluster["headGroupSpec"])
    assert head["CPU"] == 0 and head["GPU"] == 0, "the head must advertise nothing a replica can use"
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    for group in cluster["workerGroupSpecs"]:
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        gpus = quantity(limits.get("nvidia.com/gpu", 0))
        assert advertised(group)["GPU"] == gpus, f"{group['groupName']}: Ray GPUs must equal the Pod's GPUs"
        spec = group["template"]["spec"]
        if gpus:
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


def _gpu_limit(container: dict[str, Any]) -> Fraction:
    limits = (container.get("resources") or {}).get("limits") or {}
    return sum((quantity(v) for k, v in limits.items() if k.endswith("gpu")), Fraction(0))


def test_no_pod_uses_a_gpu_it_was_not_given(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    """KubeRay sets num-gpus only from a GPU limit (common/pod.go, addWellKnownAcceleratorResources); without one,
    Ray counts the GPUs the container sees, and the NVIDIA runtime shows a container every GPU of its node unless
    NVIDIA_VISIBLE_DEVICES says otherwise (Ray's gpu.rst, "GPU multi-tenancy"). So every Pod without a GPU request
    advertises GPU 0 to Ray and sets NVIDIA_VISIBLE_DEVICES=void in every container (KubeRay copies the Ray
    container's env into its wait-gcs-ready init container); the autoscaler, in the head Pod, too. Pods with a GPU
    leave the variable to the device plugin."""
    docs = rendered[1]
    rs = one(docs, "RayService")
    cluster = rs["spec"]["rayClusterConfig"]
    groups = {"head": cluster["headGroupSpec"], **{g["groupName"]: g for g in cluster["workerGroupSpecs"]}}
    for name, group in groups.items():
        where = f"{rendered[0]}: {name}"
        containers = group["template"]["spec"]["containers"] + group["template"]["spec"].get("initContainers", [])
        given = _gpu_limit(group["template"]["spec"]["containers"][0])
        if given:
            assert all(_env(c).get("NVIDIA_VISIBLE_DEVICES") is None for c in containers), where
            continue
        params, resources = group.get("rayStartParams") or {}, group.get("resources") or {}
        assert params.get("num-gpus") == "0" or resources.get("GPU") == "0", f"{where}: GPU 0 said, not inferred"
        assert advertised(group)["GPU"] == 0, where
        for c in containers:
            assert _env(c).get("NVIDIA_VISIBLE_DEVICES") == "void", f"{where}/{c['name']}"
    autoscaler = {e["name"]: e.get("value") for e in cluster["autoscalerOptions"].get("env", [])}
    assert autoscaler.get("NVIDIA_VISIBLE_DEVICES") == "void"
    assert _gpu_limit(cluster["autoscalerOptions"]) == 0
    # Pods of the overlays (the engine build Job) likewise: a GPU given, or none seen.
    for job in (d for d in docs if d["kind"] == "Job"):
        for c in job["spec"]["template"]["spec"]["containers"]:
            assert _gpu_limit(c) > 0 or _env(c).get("NVIDIA_VISIBLE_DEVICES") == "void", job["metadata"]["name"]


# Labels a GPU operator (GPU feature discovery) adds once a node runs: no node provisioner creates a node for them.
DISCOVERED = re.compile(r"^(nvidia\.com|feature\.node\.kubernetes\.io)/")


def _node_labels_required(spec: dict[str, Any]) -> set[str]:
    keys = set(spec.get("nodeSelector") or {})
    affinity = (spec.get("affinity") or {}).get("nodeAffinity", {})
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    for term in (required or {}).get("nodeSelectorTerms", []):
        keys |= {e["key"] for e in term.get("matchExpressions", [])}
    return keys


def test_gpu_pods_find_gpu_nodes_by_their_gpu_request(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    """The nvidia.com/gpu request confines a Pod to nodes that offer it, and node provisioners (Karpenter, the cluster
    autoscaler) know which instance types do; a required label that only the GPU operator adds after a node exists
    would leave the Pods the Ray autoscaler asks for Pending. Every Pod: GPU Pods request a GPU and require no such
    label; nothing else requires one either."""
    docs = rendered[1]
    specs = {g: t["spec"] for g, t in pod_templates(one(docs, "RayService")).items()}
    specs.update({d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Job"})
    for name, spec in specs.items():
        where = f"{rendered[0]}: {name}"
        assert not {k for k in _node_labels_required(spec) if DISCOVERED.match(k)}, where
        gpu = _gpu_limit(spec["containers"][0])
        if gpu:
            requests = spec["containers"][0]["resources"]["requests"]
            assert quantity(requests["nvidia.com/gpu"]) == gpu, f"{where}: the request is what finds a GPU node"
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        else:
            assert not any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", [])), where


def _router(cfg: dict[str, Any]) -> dict[str, Any]:
    return next(d for d in cfg["applications"][0]["deployments"] if d["name"] == "Router")


def test_the_routers_are_one_per_ray_node_and_the_cpu_group_holds_them(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    """max_replicas_per_node: 1 (Serve's replica scheduling guide): the two Routers kept for availability are in
    two Pods, a hard constraint (a per-node resource each Router asks all of), not a best-effort spread. The
    autoscaler plans it too (autoscaler/_private/resource_demand_scheduler.py `_fits`: every node offers 1 of it),
    so the Router group's pod range must hold one Pod per Router at each end."""
    rs = one(rendered[1], "RayService")
    router = _router(serve_config(rs))
    assert router["max_replicas_per_node"] == 1
    assert "placement_group_bundles" not in router  # Serve refuses the two together
    auto = router["autoscaling_config"]
    assert auto["min_replicas"] >= 2
    eligible, _ = placement(rs)
    (group_name,) = eligible["Router"]
    group = next(g for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == group_name)
    assert group["minReplicas"] >= auto["min_replicas"] and group["maxReplicas"] >= auto["max_replicas"]
    # The Pods themselves spread over Kubernetes nodes (best effort: a required spread could strand scale-ups).
    (spread,) = group["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"


def test_a_new_cluster_starts_at_the_capacity_it_may_have_to_serve() -> None:
    """After a NewCluster upgrade's switch the new cluster takes all traffic: the Preprocessors and Classifiers start at
    initial_replicas = max_replicas (the most the old cluster could have been running), which the worker groups'
    maxReplicas hold, and fall back to the load after their downscale_delay_s. Not the Router: Serve applies
    initial_replicas again on every config change of a deployment (serve/_private/autoscaling_state.py, register),
    and the Router's A/B weights change often; its scale-up takes upscale_delay_s on CPU pods already there."""
    rs = one(_load_docs(K8S / "rayservice.yaml"), "RayService")
    cfg = serve_config(rs)
    for dep in cfg["applications"][0]["deployments"]:
        auto = dep["autoscaling_config"]
        if dep["name"] == "Router":
            assert "initial_replicas" not in auto and "user_config" in dep
            continue
        assert auto["min_replicas"] <= auto["initial_replicas"] == auto["max_replicas"], dep["name"]
    _, plans = placement(rs)
    for group in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        assert group["maxReplicas"] >= plans[group["groupName"]].pods_max, group["groupName"]


def test_every_deployment_lands_on_exactly_one_worker_group(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    """GPU deployments only on GPU pods; CPU-only ones never on GPU pods (nor on the head)."""
    rs = one(rendered[1], "RayService")
    cluster = rs["spec"]["rayClusterConfig"]
    gpu_groups = {g["groupName"] for g in cluster["workerGroupSpecs"] if advertised(g)["GPU"] > 0}
    eligible, _ = placement(rs)
    for dep in deployments(serve_config(rs)):
        groups = eligible[dep.name]
        assert len(groups) == 1 and groups[0] != "head", f"{rendered[0]}: {dep.name} can land on {groups}"
        assert (groups[0] in gpu_groups) == (dep.asks["GPU"] > 0), f"{rendered[0]}: {dep.name} on {groups}"


def test_gpu_pods_advertise_exactly_the_cpus_their_classifiers_need() -> None:
    rs = one(_load_docs(K8S / "rayservice.yaml"), "RayService")
    for group in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        ads = advertised(group)
        if not ads["GPU"]:
            continue
        for dep in deployments(serve_config(rs)):
            if dep.asks["GPU"]:
                assert ads["CPU"] == ads["GPU"] / dep.asks["GPU"] * dep.asks["CPU"], (group["groupName"], dep)


def test_worker_groups_match_the_autoscaling_ranges_of_prod_yaml() -> None:
    """The base: maxReplicas holds every Serve maximum at once, minReplicas the minimums (with the
    replicas of one deployment's minimum on different pods), and not a pod more."""
    rs = one(_load_docs(K8S / "rayservice.yaml"), "RayService")
    _, plans = placement(rs)
    for group in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        plan = plans[group["groupName"]]
        assert plan.deployments, f"{group['groupName']} hosts no deployment"
        got = (group["minReplicas"], group["maxReplicas"])
        assert got == (plan.pods_min, plan.pods_max), f"{group['groupName']}: {got}, prod.yaml needs {plan}"


def test_every_overlay_covers_its_autoscaling_ranges(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    rs = one(rendered[1], "RayService")
    _, plans = placement(rs)
    for group in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        plan = plans[group["groupName"]]
        assert group["minReplicas"] >= plan.pods_min and group["maxReplicas"] >= plan.pods_max, (
            f"{rendered[0]}: {group['groupName']} min/max {group['minReplicas']}/{group['maxReplicas']} < {plan}"
        )


def test_the_cpu_overlay_has_no_gpu_anywhere() -> None:
    docs = kustomize(OVERLAYS["cpu"]).docs
    rs = one(docs, "RayService")
    assert all(advertised(g)["GPU"] == 0 for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"])
    assert "nvidia.com/gpu" not in json.dumps(rs["spec"]["rayClusterConfig"])
    assert serve_config(rs) == k8s.cpu_serve_config(yaml.safe_load(PROD.read_text(encoding="utf-8")))


def test_placement_arithmetic() -> None:
    half = {"CPU": Fraction(1, 2)}
    full = {"CPU": Fraction(1)}
    assert pods_for([half] * 8 + [full] * 32, {"CPU": Fraction(3)}) == 12
    gpu = {"CPU": Fraction(1), "GPU": Fraction(1, 2)}
    assert pods_for([gpu] * 8, {"CPU": Fraction(2), "GPU": Fraction(1)}) == 4
    assert pods_for([gpu] * 3, {"CPU": Fraction(1), "GPU": Fraction(1)}) == 3  # CPU-bound
    assert quantity("500m") == Fraction(1, 2) and quantity("2Gi") == 2**31 and quantity(3) == 3
    assert _label_ok({"pool": "cpu"}, {"pool": "cpu"}) and not _label_ok({"pool": "!cpu"}, {"pool": "cpu"})
    assert _label_ok({"pool": "in(a, cpu)"}, {"pool": "cpu"}) and not _label_ok({"pool": "gpu"}, {})


def test_autoscaling_is_on_with_justified_options(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    cluster = one(rendered[1], "RayService")["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    opts = cluster["autoscalerOptions"]
    assert opts["upscalingMode"] in ("Default", "Aggressive", "Conservative")
    assert opts["idleTimeoutSeconds"] > 0
    lines = (K8S / "templates" / "rayservice.yaml.in").read_text().splitlines()
    for field in ("upscalingMode:", "idleTimeoutSeconds:", "upgradeStrategy:"):
        i = next(n for n, line in enumerate(lines) if line.strip().startswith(field))
        assert "#" in lines[i] or lines[i - 1].strip().startswith("#"), f"{field} has no comment saying why"


# --------------------------------------------------------------------------- security


def _container_contexts(rs: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(where, container securityContext, pod securityContext) for every container KubeRay will run."""
    out = []
    for group, template in pod_templates(rs).items():
        pod_sc = template["spec"].get("securityContext") or {}
        for c in template["spec"].get("containers", []) + template["spec"].get("initContainers", []):
            out.append((f"{group}/{c['name']}", c.get("securityContext") or {}, pod_sc))
    head_pod_sc = pod_templates(rs)["head"]["spec"].get("securityContext") or {}
    autoscaler = rs["spec"]["rayClusterConfig"]["autoscalerOptions"].get("securityContext") or {}
    out.append(("head/autoscaler", autoscaler, head_pod_sc))
    return out


def assert_locked_down(contexts: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> None:
    """Every (where, container securityContext, Pod securityContext): non-root, no escalation, no capabilities, a
    read-only root, the runtime's seccomp profile."""
    for where, sc, pod_sc in contexts:
        assert pod_sc.get("seccompProfile") == {"type": "RuntimeDefault"}, where
        assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, where
        assert sc.get("runAsUser", pod_sc.get("runAsUser")) not in (None, 0), where
        assert sc.get("allowPrivilegeEscalation") is False, where
        assert sc.get("capabilities", {}).get("drop") == ["ALL"] and not sc["capabilities"].get("add"), where
        assert sc.get("readOnlyRootFilesystem") is True, where
        assert not sc.get("privileged"), where


def test_every_container_is_locked_down(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    assert_locked_down(_container_contexts(one(rendered[1], "RayService")))


def test_the_places_ray_writes_are_emptydirs(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    rs = one(rendered[1], "RayService")
    cluster = rs["spec"]["rayClusterConfig"]
    groups = {"head": cluster["headGroupSpec"], **{g["groupName"]: g for g in cluster["workerGroupSpecs"]}}
    for name, group in groups.items():
        spec = group["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        ray = spec["containers"][0]
        mounts = {m["mountPath"]: volumes[m["name"]] for m in ray["volumeMounts"]}
        assert {"/tmp", "/dev/shm", "/home/ray/.cache"} <= set(mounts), name
        assert all("emptyDir" in mounts[p] for p in ("/tmp", "/dev/shm", "/home/ray/.cache")), name
        # The TensorRT cache may become a claim (the template says how); nothing else is mounted.
        assert all("emptyDir" in v or "persistentVolumeClaim" in v for v in mounts.values()), name
        shm = mounts["/dev/shm"]["emptyDir"]
        store = int(group["rayStartParams"]["object-store-memory"])
        assert shm["medium"] == "Memory" and quantity(shm["sizeLimit"]) >= store, f"{name}: /dev/shm < object store"
        assert quantity(ray["resources"]["limits"]["memory"]) >= quantity(shm["sizeLimit"]) + 4 * 2**30, name
        assert not ray.get("readinessProbe") and not ray.get("livenessProbe"), f"{name}: leave probes to KubeRay"
    head_volumes = {v["name"] for v in cluster["headGroupSpec"]["template"]["spec"]["volumes"]}
    assert {m["name"] for m in cluster["autoscalerOptions"]["volumeMounts"]} <= head_volumes


def _env(container: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_gpu_workers_mount_a_writable_trt_cache_at_app_trt_cache_dir(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    """The TensorRT provider writes engines and timing caches to APP_TRT_CACHE_DIR: on every GPU Pod
    that is its own writable volume, while the root filesystem stays read-only."""
    cluster = one(rendered[1], "RayService")["spec"]["rayClusterConfig"]
    gpu_groups = [g for g in cluster["workerGroupSpecs"] if advertised(g)["GPU"] > 0]
    if rendered[0] == "cpu":
        assert not gpu_groups
        return
    assert gpu_groups, f"{rendered[0]}: no GPU worker group"
    for group in gpu_groups:
        where = f"{rendered[0]}: {group['groupName']}"
        spec = group["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        ray = spec["containers"][0]
        cache_dir = _env(ray).get("APP_TRT_CACHE_DIR")
        assert cache_dir and cache_dir.startswith("/"), f"{where}: APP_TRT_CACHE_DIR must be an absolute path"
        mounts = [m for m in ray["volumeMounts"] if m["mountPath"] == cache_dir]
        assert len(mounts) == 1, f"{where}: nothing is mounted at APP_TRT_CACHE_DIR={cache_dir}"
        mount = mounts[0]
        assert not mount.get("readOnly") and not mount.get("subPath"), where
        # Its own volume, with its own size limit: engines cannot fill Ray's /tmp or ~/.cache.
        assert [m["name"] for m in ray["volumeMounts"]].count(mount["name"]) == 1, where
        volume = volumes[mount["name"]]
        if "emptyDir" in volume:
            empty_dir = volume["emptyDir"]
            assert empty_dir.get("medium") != "Memory", f"{where}: engines on disk, not in the Pod's memory"
            assert 2**30 <= quantity(empty_dir["sizeLimit"]) <= 16 * 2**30, where
        else:
            claim = volume["persistentVolumeClaim"]
            assert claim["claimName"] and not claim.get("readOnly"), where
            assert spec["securityContext"].get("fsGroup") is not None, f"{where}: uid 1000 must be able to write"
        assert ray["securityContext"]["readOnlyRootFilesystem"] is True, where
        assert ray["securityContext"].get("runAsUser", spec["securityContext"].get("runAsUser")) not in (None, 0)


def _gpu_worker(docs: list[dict[str, Any]]) -> dict[str, Any]:
    groups = one(docs, "RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return next(g for g in groups if g["groupName"] == "gpu-workers")["template"]["spec"]


def test_the_shared_cache_overlay_puts_every_gpu_pods_engines_on_one_rwx_claim() -> None:
    docs = kustomize(OVERLAYS["gpu-shared-cache"]).docs
    spec = _gpu_worker(docs)
    ray = spec["containers"][0]
    cache_dir = _env(ray)["APP_TRT_CACHE_DIR"]
    mount = next(m for m in ray["volumeMounts"] if m["mountPath"] == cache_dir)
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    claim = one(docs, "PersistentVolumeClaim")
    assert volume == {"name": "trt-cache", "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]}}
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # every GPU node mounts it at once
    assert spec["securityContext"]["fsGroup"] == ray["securityContext"]["runAsGroup"] == 100
    # Everything else of the GPU workers is the base's.
    base = _gpu_worker(kustomize(OVERLAYS["base"]).docs)
    assert [v for v in base["volumes"] if v["name"] != "trt-cache"] == [
        v for v in spec["volumes"] if v["name"] != "trt-cache"
    ]
    assert base["containers"] == spec["containers"]


def test_the_build_engines_job_builds_what_the_gpu_workers_load() -> None:
    """Same image, same serve config, same cache directory on the same claim, same kind of node, a GPU."""
    docs = kustomize(OVERLAYS["gpu-shared-cache"]).docs
    worker = _gpu_worker(docs)
    job = one(docs, "Job")
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == worker["containers"][0]["image"]
    assert c["command"][:4] == ["python", "-m", "app.runtime", "build-engines"] and len(c["command"]) == 5
    config_path = Path(c["command"][4])
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_volume = volumes[mounts[str(config_path.parent)]["name"]]
    config_map = one(docs, "ConfigMap")
    assert config_volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert config_map["data"][config_path.name] == PROD.read_text()
    cache_dir = _env(c)["APP_TRT_CACHE_DIR"]
    assert cache_dir == _env(worker["containers"][0])["APP_TRT_CACHE_DIR"]
    worker_volume = {v["name"]: v for v in worker["volumes"]}["trt-cache"]
    assert volumes[mounts[cache_dir]["name"]]["persistentVolumeClaim"] == worker_volume["persistentVolumeClaim"]
    assert not mounts[cache_dir].get("readOnly")
    assert quantity(c["resources"]["limits"]["nvidia.com/gpu"]) == 1
    assert pod.get("nodeSelector") == worker.get("nodeSelector") and pod["tolerations"] == worker["tolerations"]
    # The namespace's restricted Pod Security Standard.
    sc, pod_sc = c["securityContext"], pod["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] != 0
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"} and pod_sc["fsGroup"] == 100
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_the_engine_build_can_be_applied_before_the_rayservice() -> None:
    """`kubectl apply -k k8s/overlays/gpu-shared-cache -l app.kubernetes.io/component=trt-engines` applies the
    claim, the config and the Job, and nothing else, so the engines can be built before the new cluster starts."""
    docs = kustomize(OVERLAYS["gpu-shared-cache"]).docs
    label = {"app.kubernetes.io/component": k8s.ENGINES_COMPONENT}
    picked = [d for d in docs if label.items() <= (d["metadata"].get("labels") or {}).items()]
    assert sorted(d["kind"] for d in picked) == ["ConfigMap", "Job", "PersistentVolumeClaim"]


def test_requests_equal_limits(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    rs = one(rendered[1], "RayService")
    resources = [
        (f"{g}/{c['name']}", c["resources"]) for g, t in pod_templates(rs).items() for c in t["spec"]["containers"]
    ]
    resources.append(("autoscaler", rs["spec"]["rayClusterConfig"]["autoscalerOptions"]["resources"]))
    for where, res in resources:
        for kind in ("cpu", "memory"):
            assert quantity(res["requests"][kind]) == quantity(res["limits"][kind]), f"{where}: {kind}"
        assert res["requests"] == res["limits"], where


def test_ray_ports_stay_inside_the_cluster(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    docs = rendered[1]
    rs = one(docs, "RayService")
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["serviceType"] == "ClusterIP" and not head.get("enableIngress")
    assert head.get("headService", {}).get("spec", {}).get("type", "ClusterIP") == "ClusterIP"
    assert rs["spec"].get("serveService", {}).get("spec", {}).get("type", "ClusterIP") == "ClusterIP"
    for svc in (d for d in docs if d["kind"] == "Service"):
        assert svc["spec"].get("type", "ClusterIP") == "ClusterIP", svc["metadata"]["name"]
    port = serve_config(rs)["http_options"]["port"]
    backends = [
        p["backend"]["service"]
        for ing in (d for d in docs if d["kind"] == "Ingress")
        for rule in ing["spec"]["rules"]
        for p in rule["http"]["paths"]
    ]
    if rs["spec"]["upgradeStrategy"]["type"] == INCREMENTAL:  # no image-classifier-serve-svc: through the Gateway
        assert backends and all(b == {"name": GATEWAY_SVC, "port": {"number": 80}} for b in backends)
    else:
        assert backends and all(b == {"name": SERVE_SVC, "port": {"number": port}} for b in backends)
    assert f"{rs['metadata']['name']}-serve-svc" == SERVE_SVC


def test_ray_containers_declare_the_ports_kuberay_reads(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    rs = one(rendered[1], "RayService")
    serve_port = serve_config(rs)["http_options"]["port"]
    grpc_port = serve_config(rs)["grpc_options"]["port"]
    for group, template in pod_templates(rs).items():
        ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
        assert ports["serve"] == serve_port and ports["metrics"] == 8080, group
        assert ports["serve-grpc"] == grpc_port, f"{group}: the serve Service's gRPC port (serve-grpc) lands here"
        assert "grpc" not in ports, f"{group}: a gRPC port not named serve-* stays off the serve Service"
        assert "client" not in ports, f"{group}: the Ray client port is not served"
        if group == "head":
            assert ports["gcs-server"] == 6379 and ports["dashboard"] == 8265
            assert ports["as-metrics"] == 44217 and ports["dash-metrics"] == 44227  # KubeRay's head PodMonitor's


def kuberay_serve_service(rs: dict[str, Any], cluster_name: str = "image-classifier-abcde") -> dict[str, Any]:
    """The serve Service KubeRay v1.7.0 builds for a RayService's cluster (common/service.go, BuildServeService):
    every head container port named `serve` or `serve-*`; a port of spec.serveService with the same name replaces
    it (appProtocol kept), unless the upgrade strategy is incremental, which ignores spec.serveService and names
    the Service after the cluster; the selector is always KubeRay's own."""
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    auto = [
        {"name": p["name"], "port": p["containerPort"]}
        for p in head["ports"]
        if p["name"] == "serve" or p["name"].startswith("serve-")
    ]
    incremental = rs["spec"]["upgradeStrategy"]["type"] == INCREMENTAL
    user = {p["name"]: p for p in ((rs["spec"].get("serveService") or {}).get("spec") or {}).get("ports", [])}
    ports = [user.get(p["name"], p) for p in auto] if not incremental else auto
    name = f"{cluster_name if incremental else rs['metadata']['name']}-serve-svc"
    selector = {"ray.io/cluster": cluster_name, "ray.io/serve": "true"}
    return {"metadata": {"name": name}, "spec": {"selector": selector, "ports": ports}}


def test_grpc_reaches_the_cluster_kuberay_switched_to_through_the_serve_service(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    """gRPC and HTTP on KubeRay's serve Service, the one Service KubeRay moves to the new cluster at the switch; the
    gRPC port named serve-* (KubeRay v1.6+ carries those), its appProtocol h2c from spec.serveService. Under the
    incremental strategy KubeRay ignores spec.serveService: that overlay has none, and no gRPC."""
    rs = one(rendered[1], "RayService")
    cfg = serve_config(rs)
    svc = kuberay_serve_service(rs)
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert ports["serve"]["port"] == cfg["http_options"]["port"]
    assert set(svc["spec"]["selector"]) == {"ray.io/cluster", "ray.io/serve"}
    if rs["spec"]["upgradeStrategy"]["type"] == INCREMENTAL:
        assert "serveService" not in rs["spec"], "ignored under the incremental strategy: it would only mislead"
        return
    assert svc["metadata"]["name"] == SERVE_SVC
    grpc = ports["serve-grpc"]
    assert grpc["port"] == cfg["grpc_options"]["port"] and grpc.get("appProtocol") == "kubernetes.io/h2c", grpc
    assert set(ports) == {"serve", "serve-grpc"}, "spec.serveService lists only ports KubeRay carries"
    assert "selector" not in rs["spec"]["serveService"]["spec"], "KubeRay replaces it: do not pretend otherwise"
    # No targetPort: the Service sends to the same port number, which every serving Pod listens on.
    assert "targetPort" not in grpc
    for group, template in pod_templates(rs).items():
        declared = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
        assert declared["serve-grpc"] == grpc["port"], group


def test_no_service_selects_ray_pods_without_the_cluster_kuberay_switched_to(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    """A Service of our own selecting Ray Pods by their serve mark alone would send calls to a new cluster's Pods as
    soon as their proxy is healthy, before KubeRay switches to it (it marks every worker ray.io/serve: "true" and
    leaves the rest to readiness: common/pod.go, BuildPod). Only KubeRay's Services, which name the cluster, do."""
    docs = rendered[1]
    templates = pod_templates(one(docs, "RayService"))
    for svc in (d for d in docs if d["kind"] == "Service"):
        selector = svc["spec"].get("selector") or {}
        for group, template in templates.items():
            labels = {**template["metadata"]["labels"], "ray.io/serve": "true", "ray.io/group": group}
            if selector and selector.items() <= labels.items():
                assert "ray.io/cluster" in selector, f"{rendered[0]}: Service {svc['metadata']['name']} -> {group}"
    assert not (K8S / "grpc-service.yaml").exists()


def test_the_incremental_overlay_follows_the_guide_and_reaches_the_gateway() -> None:
    """maxSurgePercent = one GPU pod's share of the GPU group's maximum (Ray's rayservice-incremental-upgrade.md);
    HTTP in through the Gateway's Service; the Ray Pods take port 8000 from the Gateway's Pods."""
    docs = kustomize(OVERLAYS["incremental"]).docs
    rs = one(docs, "RayService")
    opts = rs["spec"]["upgradeStrategy"]["clusterUpgradeOptions"]
    groups = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    gpus = sum(advertised(g)["GPU"] * g["maxReplicas"] for g in groups)
    per_pod = max(advertised(g)["GPU"] for g in groups)
    assert opts["maxSurgePercent"] == per_pod / gpus * 100 == 25
    assert opts["intervalSeconds"] == 60 and opts["stepSizePercent"] <= opts["maxSurgePercent"]
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "image-classifier-ray"]
    gateway = [
        r
        for r in policy["spec"]["ingress"]
        if any(p.get("podSelector", {}).get("matchLabels") == GATEWAY_PODS for p in r["from"])
    ]
    assert [r["ports"] for r in gateway] == [[{"protocol": "TCP", "port": 8000}]]
    # Everything else is the base's.
    base = one(kustomize(OVERLAYS["base"]).docs, "RayService")
    assert rs["spec"]["rayClusterConfig"] == base["spec"]["rayClusterConfig"]
    assert rs["spec"]["serveConfigV2"] == base["spec"]["serveConfigV2"]


def _peers_for(policies: list[dict[str, Any]], pod_labels: dict[str, str], port: int) -> list[dict[str, Any]]:
    peers = []
    for pol in policies:
        if not pol["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items():
            continue
        for rule in pol["spec"].get("ingress", []):
            assert rule.get("from"), f"{pol['metadata']['name']}: a rule without `from` admits everyone"
            if not rule.get("ports") or any(p["port"] == port for p in rule["ports"]):
                peers += rule["from"]
    return peers


def _namespaces(peer: dict[str, Any]) -> set[str]:
    sel = peer["namespaceSelector"]
    names = {v for k, v in sel.get("matchLabels", {}).items() if k == "kubernetes.io/metadata.name"}
    for expr in sel.get("matchExpressions", []):
        assert expr["key"] == "kubernetes.io/metadata.name" and expr["operator"] == "In", expr
        names |= set(expr["values"])
    assert names, f"namespaces must be named: {peer}"
    return names


def test_network_policy_admits_only_named_sources(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    docs = rendered[1]
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    rs = one(docs, "RayService")
    templates = pod_templates(rs)
    gateway = rs["spec"]["upgradeStrategy"]["type"] == INCREMENTAL
    for group, template in templates.items():
        labels = dict(template["metadata"]["labels"], **{"ray.io/node-type": "head" if group == "head" else "worker"})
        assert any(p["spec"]["podSelector"]["matchLabels"].items() <= labels.items() for p in policies), group
        outside: dict[int, set[str]] = {}
        for port in (8000, 9000, 8080, 8265, 6379, 44217, 44227):
            peers = _peers_for(policies, labels, port)
            for peer in peers:
                if "namespaceSelector" not in peer:  # same namespace: this service's Ray pods (and its Gateway's)
                    allowed = [APP_LABEL, GATEWAY_PODS] if gateway and port == 8000 else [APP_LABEL]
                    assert peer["podSelector"]["matchLabels"] in allowed, (port, peer)
            outside[port] = set().union(*[_namespaces(p) for p in peers if "namespaceSelector" in p])
        assert outside[8000] == {"ingress-nginx"}, (group, outside)
        assert outside[9000] == {"ingress-nginx"}, (group, outside)
        assert outside[8080] == {"monitoring"}, (group, outside)
        assert outside[6379] == set(), (group, outside)
        assert outside[8265] == ({"kuberay-system"} if group == "head" else set()), (group, outside)
        # The autoscaler's and the dashboard's metrics: Prometheus, on the head only (k8s/podmonitor.yaml).
        for port in (44217, 44227):
            assert outside[port] == ({"monitoring"} if group == "head" else set()), (group, port, outside)


def test_pod_monitor_scrapes_the_metrics_port_of_every_ray_pod(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    """Ray's metrics on every Ray Pod; the autoscaler's and the dashboard's on the head, as KubeRay's own head
    PodMonitor scrapes them (config/prometheus/podMonitor.yaml, v1.7.0)."""
    docs = rendered[1]
    monitor = one(docs, "PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    endpoints = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
    assert endpoints == {"metrics", "as-metrics", "dash-metrics"}
    for group, template in pod_templates(one(docs, "RayService")).items():
        assert selector.items() <= template["metadata"]["labels"].items(), group
        names = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
        assert names["metrics"] == 8080, group
        if group == "head":
            assert endpoints <= set(names) and (names["as-metrics"], names["dash-metrics"]) == (44217, 44227)
        else:  # the other two are not declared here, so the Prometheus Operator finds no target for them here
            assert not endpoints - {"metrics"} & set(names), group


def test_namespace_enforces_the_restricted_pod_security_standard(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    ns = one(rendered[1], "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert {d["metadata"].get("namespace") for d in rendered[1] if d["kind"] != "Namespace"} == {ns["metadata"]["name"]}


# --------------------------------------------------------------------------- the image


def dockerfile(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(
        r"\\\n", " ", "\n".join(ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith("#"))
    )
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1].strip()) for ln in text.splitlines() if ln.strip()]


def test_dockerfile_builds_on_the_pinned_ray_and_runs_as_non_root() -> None:
    steps = dockerfile(K8S / "Dockerfile")
    args = dict(a.split("=", 1) for i, a in steps[: [i for i, _ in steps].index("FROM")] if i == "ARG")
    base = next(a for i, a in steps if i == "FROM")
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
    ray = k8s.ray_version(_pyproject())
    assert args["RAY_PLATFORM"] == k8s.GPU_PLATFORM
    assert re.fullmatch(rf"rayproject/ray:{re.escape(ray)}-py3\d+-{k8s.GPU_PLATFORM}", base), base
    users = [a for i, a in steps if i == "USER"]
    assert users, "no USER: the image would run as root"
    user = users[-1].split(":")[0]
    assert user.isdigit() and int(user) != 0, f"final USER {users[-1]!r} must be a numeric non-root uid"
    runs = [a for i, a in steps if i == "RUN"]
    assert any("python -m app.models build" in r and "python -m app.models quantize" in r for r in runs)
    assert any(r.startswith("pip install") for r in runs)


def test_the_image_builds_models_where_prod_yaml_looks_for_them() -> None:
    steps = dockerfile(K8S / "Dockerfile")
    env = " ".join(a for i, a in steps if i == "ENV")
    model_dir = re.search(r"APP_MODEL_DIR=(\S+)", env)
    assert model_dir, "the Dockerfile must set APP_MODEL_DIR"
    args = yaml.safe_load(PROD.read_text())["applications"][0]["args"]
    paths = [v["model_path"] for v in args["variants"].values()] + [args["model"]["labels_path"]]
    assert {str(Path(p).parent) for p in paths} == {model_dir.group(1)}
    assert args["build_default_models"] is False, "a cluster never builds models at start"


def test_the_build_context_is_only_what_the_dockerfile_copies() -> None:
    ignore = (K8S / "Dockerfile.dockerignore").read_text().split()
    allowed = ["!pyproject.toml", "!README.md", "!app/", "!configs/prod.yaml", "!configs/serve.env"]
    assert ignore[ignore.index("*") :][:6] == ["*", *allowed]
    copied = [a for i, a in dockerfile(K8S / "Dockerfile") if i == "COPY"]
    sources = {s for c in copied for s in c.split()[:-1] if not s.startswith("--")}
    assert sources == {"pyproject.toml", "README.md", "app", "configs/prod.yaml", "configs/serve.env"}
    # the Routers compare the Pod's environment with the image's copy of serve.env (app/http/front_report.py)
    env = dict(a.split("=", 1) for i, a in dockerfile(K8S / "Dockerfile") if i == "ENV" and a.startswith("APP_SERVE"))
    assert env == {"APP_SERVE_ENV_FILE": "/home/ray/serve.env"}


def test_the_image_builds_the_tensorrt_ready_int8_model() -> None:
    runs = [a for i, a in dockerfile(K8S / "Dockerfile") if i == "RUN"]
    models = [r for r in runs if "python -m app.models build" in r]
    assert len(models) == 1
    assert "python -m app.models quantize --model" in models[0] and "--config /home/ray/prod.yaml" in models[0]
    assert '--output "$APP_MODEL_DIR/efficientnet_lite0-int8-trt.onnx" --target tensorrt' in models[0]
    assert 'test -f "$APP_MODEL_DIR/efficientnet_lite0-int8-trt.onnx"' in models[0]


# TensorRT: onnxruntime-gpu's TensorRT provider links libnvinfer.so.<TensorRT major>, so the image's TensorRT debs
# (libnvinfer<major>, chosen as the newest <TENSORRT_VERSION>.x built for CUDA <major>) must have that major.
TENSORRT_DEB = re.compile(r'grep "\^\$\{TENSORRT_VERSION\}\\\.\.\*\+cuda(\d+)"')
PROVIDERS = ("libonnxruntime_providers_cuda.so", "libonnxruntime_providers_tensorrt.so")


def _runs() -> list[str]:
    return [a for i, a in dockerfile(K8S / "Dockerfile") if i == "RUN"]


def _args() -> dict[str, str]:
    """The Dockerfile's ARG defaults."""
    return dict(a.split("=", 1) for i, a in dockerfile(K8S / "Dockerfile") if i == "ARG" and "=" in a)


def _tensorrt_pin() -> tuple[int, int, str]:
    """(CUDA major, TensorRT major, the RUN installing it) of the one TensorRT install step."""
    hits = [(m, r) for r in _runs() for m in TENSORRT_DEB.finditer(r)]
    assert len(hits) == 1, f"k8s/Dockerfile must choose TensorRT's deb for one CUDA major once, found {len(hits)}"
    match, run = hits[0]
    major = int(_args()["TENSORRT_VERSION"].split(".")[0])
    assert f'"libnvinfer{major}=$trt" "libnvonnxparsers{major}=$trt"' in run, "the packages must match the major"
    return int(match.group(1)), major, run


def _needed(lib: Path) -> list[str]:
    """The NEEDED entries of a shared library's dynamic section, read with readelf."""
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf (binutils) is not installed")
    if not lib.is_file():
        pytest.skip(f"{lib.name} is not installed here (onnxruntime-gpu on Linux x86_64 only)")
    out = subprocess.run([readelf, "-d", str(lib)], capture_output=True, text=True, check=True, timeout=60).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    assert needed, f"readelf found no NEEDED entries in {lib}"
    return needed


def _soname_majors(needed: list[str], name: str) -> set[int]:
    return {int(m.group(1)) for n in needed if (m := re.fullmatch(rf"{re.escape(name)}\.so\.(\d+)", n))}


def _onnxruntime_capi() -> Path:
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("onnxruntime is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "capi"


def test_dockerfile_pins_tensorrt_10_for_cuda_13() -> None:
    cuda, major, _ = _tensorrt_pin()
    assert major == 10, f"libnvinfer{major} (TensorRT {major}): the TensorRT provider loads libnvinfer.so.10"
    assert k8s.GPU_PLATFORM.startswith(f"cu{cuda}"), f"cu{cuda} TensorRT on a {k8s.GPU_PLATFORM} image"


def test_the_tensorrt_pin_matches_the_sonames_the_installed_provider_needs() -> None:
    """`readelf -d` of the provider in this environment: libnvinfer and libnvonnxparser of the pinned
    TensorRT major, libcudart of the pinned CUDA major."""
    needed = _needed(_onnxruntime_capi() / "libonnxruntime_providers_tensorrt.so")
    cuda, major, _ = _tensorrt_pin()
    assert _soname_majors(needed, "libnvinfer") == {major}, needed
    assert _soname_majors(needed, "libnvonnxparser") == {major}, needed
    assert _soname_majors(needed, "libcudart") == {cuda}, needed
    # The CUDA provider, the TensorRT provider's fallback, is built for the same CUDA major.
    cuda_needed = _needed(_onnxruntime_capi() / "libonnxruntime_providers_cuda.so")
    assert _soname_majors(cuda_needed, "libcudart") == {cuda}, cuda_needed


def _fake_bin(root: Path, **scripts: str) -> dict[str, str]:
    """An environment whose PATH finds these shell scripts (named by keyword) before the real tools."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(root)}


SHELLS = [s for s in ("sh", "bash") if shutil.which(s)]


def _run_step(shell: str, step: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([shell, "-c", step], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize("shell", SHELLS)
def test_tensorrt_is_installed_from_nvidias_apt_repository_on_the_gpu_platform_only(tmp_path: Path, shell: str) -> None:
    """The Dockerfile's TensorRT step, run with stand-ins for apt-get, apt-cache, dpkg and sudo (no docker here):
    the newest 10.16.x deb for CUDA 13 is installed by its exact version, and the build fails when the repository
    has none, when a library the provider NEEDS is missing, or when the engine builder's resource library is."""
    _, _, step = _tensorrt_pin()
    libdir = tmp_path / "usr" / "lib" / "x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    log, madison = tmp_path / "log", tmp_path / "madison"
    env = _fake_bin(
        tmp_path,
        sudo='"$@"',
        **{
            "apt-get": f'echo "apt-get $*" >> {log}',
            "apt-cache": f'cat "{madison}"',
            "dpkg": f'for f in "{libdir}"/*; do echo "$f"; done',
        },
    )
    env["TENSORRT_VERSION"] = _args()["TENSORRT_VERSION"]
    assert env["TENSORRT_VERSION"] == "10.16"
    repo = "https://nvidia.example/repos/ubuntu2404/x86_64  Packages"
    versions = ("10.16.0.72-1+cuda13.0", "10.16.1.11-1+cuda13.0", "10.16.1.11-1+cuda12.9", "11.4.0.106-1+cuda13.0")

    def run(platform: str, libs: tuple[str, ...], offered: tuple[str, ...] = versions) -> tuple[int, list[str]]:
        madison.write_text("".join(f" libnvinfer10 | {v} | {repo}\n" for v in offered))
        for old in libdir.iterdir():
            old.unlink()
        for lib in libs:
            (libdir / lib).touch()
        log.write_text("")
        proc = _run_step(shell, step, dict(env, RAY_PLATFORM=platform))
        return proc.returncode, log.read_text().splitlines()

    complete = ("libnvinfer.so.10", "libnvonnxparser.so.10", "libnvinfer_builder_resource.so.10.16.1")
    assert run("cpu", complete) == (0, []), "the CPU image installs no TensorRT"
    rc, calls = run(k8s.GPU_PLATFORM, complete)
    assert rc == 0, calls
    assert calls[-1] == (
        "apt-get install -y --no-install-recommends libnvinfer10=10.16.1.11-1+cuda13.0 "
        "libnvonnxparsers10=10.16.1.11-1+cuda13.0"
    ), calls
    # only TensorRT 10.16 for CUDA 12.9, or 11.x for CUDA 13: nothing installed, the build fails
    rc, calls = run(k8s.GPU_PLATFORM, complete, ("10.16.1.11-1+cuda12.9", "11.4.0.106-1+cuda13.0"))
    assert rc != 0 and not any("install" in c for c in calls)
    # the ONNX parser missing, the engine builder's resource library missing: each fails the build
    for libs in (complete[::2], complete[:2]):
        assert run(k8s.GPU_PLATFORM, libs)[0] != 0, f"{libs}: TensorRT incomplete, the build must fail"
    assert run("cu128", complete)[0] != 0, "a platform without a TensorRT pin must fail the build, not skip TensorRT"


def test_the_engine_builders_resource_library_is_checked_where_tensorrt_is_installed() -> None:
    """Loaded only when an engine is built, so ldd (the provider check) never sees it: the TensorRT step lists it."""
    _, _, step = _tensorrt_pin()
    assert re.search(r'ls "\$trt_dir"/libnvinfer_builder_resource\*', step), step
    assert "libnvinfer_builder_resource" not in _ldd_step()


def test_the_base_is_rays_python_3_12_cuda_13_image_and_the_project_admits_3_12() -> None:
    """Ray builds its CUDA 13 image for Python 3.12 only (the Dockerfile's header says where that is written);
    the project installs there: requires-python admits 3.12 and its tests run on it (docs/kubernetes.md)."""
    args = _args()
    assert (args["PYTHON_TAG"], args["RAY_PLATFORM"]) == ("py312", "cu130")
    requires = re.search(r'requires-python = "([^"]+)"', _pyproject())
    assert requires
    from packaging.specifiers import SpecifierSet

    assert "3.12" in SpecifierSet(requires.group(1)) and "3.11" in SpecifierSet(requires.group(1))
    header = (K8S / "Dockerfile").read_text().split("FROM ")[0]
    assert "ray-images.json" in header and "has NOT been built" in header


def _ldd_step() -> str:
    steps = [r for r in _runs() if re.search(r"(^|[\s;&|(])ldd\s", r)]
    assert len(steps) == 1, "k8s/Dockerfile must check the providers' libraries with ldd in one RUN"
    return steps[0]


def test_the_ldd_check_runs_after_the_libraries_and_onnxruntime_are_installed() -> None:
    runs = _runs()
    step = _ldd_step()
    assert "not found" in step and all(p in step for p in PROVIDERS)
    _, _, trt = _tensorrt_pin()
    project = next(i for i, r in enumerate(runs) if r.startswith("pip install /tmp/src"))
    assert runs.index(trt) < project < runs.index(step)


@pytest.mark.parametrize("shell", SHELLS)
def test_the_build_fails_when_ldd_finds_a_provider_library_missing(tmp_path: Path, shell: str) -> None:
    """The Dockerfile's ldd step, run with a stand-in ldd: any "not found" fails the GPU build, except
    libcuda.so.1 (the driver, mounted into GPU Pods at run time); the CPU build does not check."""
    step = _ldd_step()
    capi = tmp_path / "capi"
    capi.mkdir()
    for provider in PROVIDERS:
        (capi / provider).touch()
    ldd_out = tmp_path / "ldd"
    ldd_out.mkdir()
    env = _fake_bin(tmp_path, python=f'echo "{capi}"', ldd=f'cat "{ldd_out}/$(basename "$1")"')
    resolved = "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0000000000)\n"
    driver = "\tlibcuda.so.1 => not found\n"

    def run(platform: str = k8s.GPU_PLATFORM, **outputs: str) -> subprocess.CompletedProcess[str]:
        for provider in PROVIDERS:
            (ldd_out / provider).write_text(outputs.get(provider.split("_")[-1].removesuffix(".so"), resolved))
        return _run_step(shell, step, dict(env, RAY_PLATFORM=platform))

    ok = run(cuda=resolved + driver + "\tlibcublasLt.so.13 => /usr/local/cuda/lib64/libcublasLt.so.13 (0x1)\n")
    assert ok.returncode == 0, ok.stderr
    bad = run(tensorrt=resolved + "\tlibnvinfer.so.10 => not found\n")
    assert bad.returncode != 0 and "libnvinfer.so.10" in bad.stderr
    bad = run(cuda=driver + "\tlibcudnn.so.9 => not found\n")
    assert bad.returncode != 0 and "libcudnn.so.9" in bad.stderr and "libcuda.so.1" not in bad.stderr
    assert run("cpu", tensorrt="\tlibnvinfer.so.10 => not found\n").returncode == 0
    (ldd_out / PROVIDERS[1]).unlink()  # ldd itself fails
    assert _run_step(shell, step, dict(env, RAY_PLATFORM=k8s.GPU_PLATFORM)).returncode != 0
    (capi / PROVIDERS[0]).unlink()
    missing = run()
    assert missing.returncode != 0 and PROVIDERS[0] in missing.stderr


@pytest.mark.parametrize("shell", SHELLS)
def test_the_ldd_check_agrees_with_ldd_on_the_installed_providers(tmp_path: Path, shell: str) -> None:
    """The same step with the real ldd and this environment's onnxruntime: it fails exactly when some
    library other than the driver does not resolve here (on a machine without TensorRT: it fails)."""
    ldd = shutil.which("ldd")
    capi = _onnxruntime_capi()
    if ldd is None or not all((capi / p).is_file() for p in PROVIDERS):
        pytest.skip("needs ldd and onnxruntime-gpu's provider libraries")
    unresolved = set()
    for provider in PROVIDERS:
        out = subprocess.run([ldd, str(capi / provider)], capture_output=True, text=True, timeout=60).stdout
        unresolved |= set(re.findall(r"^\s*(\S+) => not found", out, re.M)) - {"libcuda.so.1"}
    env = _fake_bin(tmp_path, python=f'exec "{sys.executable}" "$@"')
    env["PATH"] = f"{env['PATH']}:{Path(ldd).parent}"
    proc = _run_step(shell, _ldd_step(), dict(env, RAY_PLATFORM=k8s.GPU_PLATFORM))
    if unresolved:
        assert proc.returncode != 0, proc.stdout
        # The first provider with a missing library is reported, each of its missing libraries named.
        assert any(lib in proc.stderr for lib in unresolved), proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr


def test_the_cpu_overlay_serves_the_cpu_int8_artifact_not_the_tensorrt_one() -> None:
    from app.ops.k8s import cpu_serve_config

    prod = yaml.safe_load(Path("configs/prod.yaml").read_text())
    assert prod["applications"][0]["args"]["variants"]["int8"]["model_path"].endswith("-int8-trt.onnx")
    cpu = cpu_serve_config(prod)["applications"][0]["args"]["variants"]
    assert cpu["int8"]["model_path"] == "/home/ray/models/efficientnet_lite0-int8.onnx"
    assert cpu["fp32"] == prod["applications"][0]["args"]["variants"]["fp32"]


def test_the_image_runs_the_admission_front_as_serves_haproxy() -> None:
    steps = dockerfile(K8S / "Dockerfile")
    env = " ".join(a for i, a in steps if i == "ENV")
    path = re.search(r"RAY_SERVE_HAPROXY_BINARY_PATH=(\S+)", env)
    assert path and path.group(1).endswith("/bin/app-haproxy"), "Serve must start the front (app/front/)"
    install = next(a for i, a in steps if i == "RUN" and a.startswith("pip install"))
    assert 'test "$(command -v app-haproxy)" = "$RAY_SERVE_HAPROXY_BINARY_PATH"' in install  # built where it points
    assert 'app-haproxy = "app.front.haproxy:main"' in _pyproject()
    # configs/serve.env goes into every Pod and must not point Serve elsewhere; the front's limits are prod.yaml's
    # args.front, rendered beside it into every container's environment.
    serve_env = k8s.parse_serve_env((REPO / "configs" / "serve.env").read_text(), "serve.env")
    assert "RAY_SERVE_HAPROXY_BINARY_PATH" not in serve_env and not any(k.startswith("APP_FRONT_") for k in serve_env)
    rendered = (K8S / "rayservice.yaml").read_text()
    prod = yaml.safe_load(PROD.read_text())["applications"][0]["args"]["front"]
    assert f"{{name: APP_FRONT_MAXCONN_PER_REPLICA, value: '{prod['maxconn_per_replica']}'}}" in rendered
    containers = rendered.count("{name: RAY_SERVE_ENABLE_HA_PROXY")
    assert containers > 1 and rendered.count("{name: APP_FRONT_BUFFER_BYTES, value: '65536'}") == containers


# --------------------------------------------------------------------------- the batch RayJob (k8s/batch/)

BATCH = K8S / "batch"
# KubeRay v1's RayJobSpec fields (ray-operator/apis/ray/v1/rayjob_types.go, v1.7): the CRD beside the repository is the
# RayService's only, so the RayJob's own fields are held to this list and its cluster to the RayService's schema.
RAYJOB_SPEC_FIELDS = {
    "activeDeadlineSeconds", "backoffLimit", "clusterSelector", "deletionStrategy", "entrypoint", "entrypointNumCpus",
    "entrypointNumGpus", "entrypointResources", "jobId", "managedBy", "metadata", "rayClusterSpec", "runtimeEnvYAML",
    "shutdownAfterJobFinishes", "submissionMode", "submitterConfig", "submitterPodTemplate", "suspend",
    "ttlSecondsAfterFinished", "waitingBeforeSubmissionSeconds",
}  # fmt: skip


def rayjob() -> dict[str, Any]:
    return one(kustomize(BATCH).docs, "RayJob")


def rayjob_pod_templates(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every Pod the RayJob makes: its cluster's groups (as the RayService's) and the submitter."""
    out = pod_templates({"spec": {"rayClusterConfig": job["spec"]["rayClusterSpec"]}})
    return out | {"submitter": job["spec"]["submitterPodTemplate"]}


def test_the_rayjobs_cluster_is_the_rayservices() -> None:
    job, rs = rayjob(), one(kustomize(K8S).docs, "RayService")
    assert job["spec"]["rayClusterSpec"] == rs["spec"]["rayClusterConfig"]
    assert job["metadata"]["namespace"] == rs["metadata"]["namespace"]
    rendered = (REPO / k8s.RAYJOB).read_text(encoding="utf-8")
    assert k8s.cluster_block((REPO / k8s.RAYSERVICE).read_text(encoding="utf-8")) in rendered  # comments too
    base = yaml.safe_load((K8S / "kustomization.yaml").read_text())["images"]
    assert yaml.safe_load((BATCH / "kustomization.yaml").read_text())["images"] == base


def test_the_rayjob_is_kuberay_v1_and_its_cluster_validates_against_kuberay_crd(tmp_path: Path) -> None:
    job = rayjob()
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    assert set(job["spec"]) <= RAYJOB_SPEC_FIELDS, set(job["spec"]) - RAYJOB_SPEC_FIELDS
    assert job["spec"]["submissionMode"] in ("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode")
    assert job["spec"]["shutdownAfterJobFinishes"] is True and job["spec"]["backoffLimit"] == 0
    # The same cluster schema as a RayService's (KubeRay's RayClusterSpec): the cluster in a RayService, validated.
    wrapped = {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": job["metadata"]["name"]},
        "spec": {"serveConfigV2": "applications: []\n", "rayClusterConfig": job["spec"]["rayClusterSpec"]},
    }
    path = tmp_path / "rayjob-cluster.yaml"
    path.write_text(yaml.safe_dump(wrapped))
    assert _run_crd_validator([path]).strip().splitlines()[-1] == "1 RayService checked, 0 problems"


def test_every_rayjob_pod_template_validates_as_a_core_pod() -> None:
    import kubernetes_validate

    for name, template in rayjob_pod_templates(rayjob()).items():
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **template.get("metadata", {})}}
        pod["spec"] = template["spec"]
        try:
            kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:  # pragma: no cover - the message is the point
            pytest.fail(f"RayJob {name} Pod: {e.message} at {list(e.path)}")


def test_every_rayjob_container_is_locked_down() -> None:
    job = rayjob()
    templates = rayjob_pod_templates(job)
    contexts = _container_contexts({"spec": {"rayClusterConfig": job["spec"]["rayClusterSpec"]}})
    submitter = templates["submitter"]["spec"]
    contexts += [
        (f"submitter/{c['name']}", c["securityContext"], submitter["securityContext"]) for c in submitter["containers"]
    ]
    assert len(contexts) == len(_container_contexts(one(kustomize(K8S).docs, "RayService"))) + 1
    assert_locked_down(contexts)
    assert submitter["restartPolicy"] == "Never" and submitter["automountServiceAccountToken"] is False
    res = submitter["containers"][0]["resources"]
    assert res["requests"] == res["limits"]


def test_the_rayjob_scores_with_the_images_prod_yaml() -> None:
    words = shlex.split(rayjob()["spec"]["entrypoint"])
    assert words[:4] == ["python", "-m", "app.batch", "score"]
    ns = parser().parse_args(words[3:])
    assert ns.config == "/home/ray/prod.yaml" and ns.input and ns.output
    copied = [a.split() for i, a in dockerfile(K8S / "Dockerfile") if i == "COPY"]
    assert any(c[-2:] == ["configs/prod.yaml", ns.config] for c in copied), "the image must keep prod.yaml there"


def test_the_rayjob_template_needs_its_cluster_mark_once() -> None:
    rs = (REPO / k8s.RAYSERVICE).read_text(encoding="utf-8")
    with pytest.raises(k8s.RenderError, match="exactly once"):
        k8s.render_rayjob("kind: RayJob\nspec:\n  rayClusterSpec: {}\n", rs, "img:tag")
    with pytest.raises(k8s.RenderError, match="last key"):
        k8s.cluster_block(rs + "  more: 1\n")
