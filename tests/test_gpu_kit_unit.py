"""The GPU kit's pieces (benchmarks/gpu_kit): parts cut and put back byte for byte, run.sh's receive and its
refusals, which distributions are carried, the C API library's exclusion, the CUDA library folders on the node.
Pure: no Ray, no network, small files."""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata, util
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon

from benchmarks.gpu_kit import __main__ as cli
from benchmarks.gpu_kit import aside, build, contents, node, pack, plan, prune, segments, wheels
from benchmarks.gpu_kit.closure import Found, said, walk

RUN_SH = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_kit" / "run.sh"
ELF = b"\x7fELF" + bytes(60)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- parts


def test_parts_are_cut_at_exact_offsets_and_named_with_their_count(tmp_path: Path) -> None:
    parts = pack.Parts(tmp_path, 10)
    for chunk in (b"abc", b"defghijklmnop", b"qrstuvwxy"):  # 25 bytes in writes that straddle the cuts
        parts.write(chunk)
    listed = parts.finish()
    assert [p["name"] for p in listed] == ["part-01-of-03.bin", "part-02-of-03.bin", "part-03-of-03.bin"]
    assert [(tmp_path / p["name"]).read_bytes() for p in listed] == [b"abcdefghij", b"klmnopqrst", b"uvwxy"]
    assert [p["sha256"] for p in listed] == [sha256(b"abcdefghij"), sha256(b"klmnopqrst"), sha256(b"uvwxy")]
    assert parts.whole.hexdigest() == sha256(b"abcdefghijklmnopqrstuvwxy") and parts.total == 25
    assert not list(tmp_path.glob(".part-*"))


def _tree(root: Path) -> dict[str, bytes]:
    """A small staged kit: incompressible bytes (so it spans several parts), text, an ELF file, a nested folder."""
    files = {
        "kit.json": b'{"build_id": "b1"}\n',
        "project/app.py": b"X = 1\n",
        "models/m.onnx": os.urandom(30_000),
        "site/pkg/__init__.py": b"X = 1\n",
        "site/pkg/blob.bin": os.urandom(40_000),
        "site/pkg/lib.so": ELF + os.urandom(20_000),
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def test_the_streams_put_together_are_the_segments_byte_for_byte(tmp_path: Path) -> None:
    staging, out = tmp_path / "staging", tmp_path / "out"
    staging.mkdir()
    out.mkdir()
    files = _tree(staging)
    split = segments.split(staging, [])
    assert split["engines"] == ["kit.json", "models/m.onnx", "project/app.py"]  # the site's packages: no engine's
    streams = segments.streams(staging, split)
    assert [(s.segment, s.kind) for s in streams] == [("engines", "plain"), ("serving", "x86"), ("serving", "plain")]
    made = pack.archive(staging, streams, out, part_bytes=16 * 1024, preset=0, workers=2)
    parts = made["parts"]
    assert len(parts) >= 5
    assert all(p["bytes"] == 16 * 1024 for p in parts[:-1]) and 0 < parts[-1]["bytes"] <= 16 * 1024
    joined = b"".join((out / p["name"]).read_bytes() for p in parts)
    assert sha256(joined) == made["sha256"] and len(joined) == made["bytes"]
    assert all(sha256((out / p["name"]).read_bytes()) == p["sha256"] for p in parts)
    back: dict[str, bytes] = {}
    for s in made["streams"]:
        piece = joined[s["offset"] : s["offset"] + s["bytes"]]
        assert sha256(piece) == s["sha256"]
        with tarfile.open(fileobj=io.BytesIO(lzma.decompress(piece)), mode="r:") as tar:
            back |= {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
            assert {m.uid for m in tar.getmembers()} == {0}
    assert back == files
    x86 = next(s for s in made["streams"] if s["kind"] == "x86")
    assert x86["files"] == 1 and x86["file_bytes"] == len(files["site/pkg/lib.so"])
    assert made["tar_bytes"] > sum(map(len, files.values()))


def test_part_sizes_default_to_the_room_beside_the_checkout_take_kib_for_tests_and_stop_above_60_mib() -> None:
    args = cli.parser().parse_args(["build", "x", "--part-kib", "0.5"])
    assert cli.part_bytes(args) == 512
    assert cli.part_bytes(cli.parser().parse_args(["build", "x"])) is None  # plan.room of the checkout measured
    with pytest.raises(wheels.KitError, match="at most 60 MiB"):
        cli.part_bytes(cli.parser().parse_args(["build", "x", "--part-mib", "61"]))
    assert pack.parse_preset("9e") == 9 | lzma.PRESET_EXTREME and pack.preset_name(pack.parse_preset("9e")) == "9e"
    assert plan.room(13 * plan.MIB) == 64 * plan.MIB - 13 * plan.MIB - plan.FOLDER_RESERVE - plan.MARGIN


def test_what_travels_is_what_git_tracks_or_does_not_ignore_and_shared(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True)
    (repo / "shared").mkdir()
    ignore = "/kit/\n*.log\n/shared/\n"
    sizes = {"a.py": 100, ".gitignore": len(ignore), "benchmarks/results/r.json": 1000, "new.txt": 10, "shared/s.md": 7}
    for rel, n in {**sizes, "kit/part.bin": 5000, "x.log": 50}.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(b"x" * n)
    (repo / ".gitignore").write_text(ignore)
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "a.py", ".gitignore", "benchmarks/results/r.json"], check=True)
    travelling = contents.travelling_bytes(repo)
    assert travelling == {"bytes": sum(sizes.values()), "files": 5, "results_bytes": 1000}
    assert contents.ignored(repo, repo / "kit") and not contents.ignored(repo, repo / "benchmarks")
    assert contents.work_tree(repo / "kit" / "not-yet") == repo.resolve()


def test_the_results_go_aside_from_what_travels_and_come_back_untouched(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True)
    (repo / "a.py").write_text("a")
    (repo / "benchmarks" / "results" / "r.json").write_text("r" * 1000)
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    assert contents.travelling_bytes(repo)["bytes"] == 1001
    assert "set aside" in aside.aside(repo) and aside.is_aside(repo)
    assert contents.travelling_bytes(repo) == {"bytes": 1, "files": 1, "results_bytes": 0}
    assert (repo / "benchmarks" / "results" / "r.json").read_text() == "r" * 1000  # the files stay
    assert "already" in aside.aside(repo)
    aside.back(repo)
    assert not aside.is_aside(repo) and contents.travelling_bytes(repo)["bytes"] == 1001
    assert subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout == ""
    (repo / "benchmarks" / "results" / "r.json").write_text("changed")
    with pytest.raises(wheels.KitError, match="has changes of its own"):
        aside.aside(repo)


# --------------------------------------------------------------------------- run.sh: receive, and run's refusals


@pytest.fixture
def kit(tmp_path: Path) -> Path:
    """A kit of three parts as build lays it out (call-N/ folders of run.sh, manifest.json and one part), from a tiny
    tree: the engines segment ends in the first part."""
    staging, out = tmp_path / "staging", tmp_path / "kit"
    staging.mkdir()
    out.mkdir()
    _tree(staging)
    split = segments.split(staging, [])
    made = pack.archive(staging, segments.streams(staging, split), out, part_bytes=32 * 1024, preset=0)
    parts = made.pop("parts")
    assert len(parts) == 3
    seg_parts = build.segment_parts(parts, made["streams"])
    assert seg_parts["engines"] == ["part-01-of-03.bin"]
    manifest = {"build_id": "b1", "built": "2026-12-04T00:00:00+00:00", "parts": parts, "archive": made}
    manifest["segments"] = {seg: {"parts": seg_parts[seg], "files": len(split[seg])} for seg in split}
    opts = build.Options(out=out, python_version="3.12", part_bytes=None, node_has={}, models=tmp_path)
    build.lay_out(opts, parts, manifest)
    return out


def _sh(kit_home: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "APP_KIT_HOME": str(kit_home), "KIT_PYTHON": sys.executable, "OUT": str(kit_home / "out")}
    return subprocess.run(["bash", *map(str, args)], capture_output=True, text=True, env=env, timeout=60)


def _call(kit: Path, i: int, into: Path) -> Path:
    """What one call carries: its folder, copied (the call's copy vanishes after it)."""
    shutil.copytree(kit / f"call-{i}", into)
    return into


def test_receive_stores_each_part_from_its_own_folder_and_names_what_is_missing(kit: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert sorted(p.name for p in (kit / "call-1").iterdir()) == ["manifest.json", "part-01-of-03.bin", "run.sh"]
    first = _call(kit, 1, tmp_path / "c1")
    done = _sh(store, first / "run.sh", "receive", first)
    assert done.returncode == 0, done.stderr
    assert "part-01-of-03.bin: stored" in done.stdout
    assert "stored 1 of 3 parts; still missing: part-02-of-03.bin part-03-of-03.bin" in done.stdout
    shutil.rmtree(first)
    for i in (2, 3):
        call = _call(kit, i, tmp_path / f"c{i}")
        done = _sh(store, call / "run.sh", "receive", call)
        shutil.rmtree(call)
    assert "all 3 parts stored" in done.stdout
    assert {p.name for p in (store / "parts").iterdir()} == {f"part-0{i}-of-03.bin" for i in (1, 2, 3)}
    assert (store / "run.sh").is_file() and (store / "manifest.json").is_file()
    again = _sh(store, kit / "call-2" / "run.sh", "receive", kit / "call-2")
    assert again.stdout.count("already stored, skipped") == 1


def test_a_corrupted_part_is_refused_and_not_stored(kit: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    call = _call(kit, 2, tmp_path / "c2")
    damaged = bytearray((call / "part-02-of-03.bin").read_bytes())
    damaged[100] ^= 0xFF
    (call / "part-02-of-03.bin").write_bytes(bytes(damaged))
    done = _sh(store, call / "run.sh", "call", call)
    assert done.returncode == 2
    assert "refused: part-02-of-03.bin: its sha256 is" in done.stdout and "repeat this call" in done.stdout
    assert not list((store / "parts").iterdir())
    good = _sh(store, kit / "call-2" / "run.sh", "receive", kit / "call-2")
    assert good.returncode == 0 and "stored 1 of 3 parts" in good.stdout


def test_a_call_before_its_segment_is_whole_stores_and_runs_nothing(kit: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    call = _call(kit, 2, tmp_path / "c2")
    done = _sh(store, call / "run.sh", "call", call)
    assert done.returncode == 0 and "nothing new to run yet" in done.stdout, done.stdout + done.stderr
    assert not (store / "root").exists()
    assert "nothing new to run yet" in (store / "out" / "run.log").read_text()  # the console comes back too
    run = _sh(store, store / "run.sh", "run", "engines", "--cpu-dry-run")
    assert run.returncode == 2 and "the engines segment's parts are not all stored: part-01-of-03.bin" in run.stdout
    nothing = _sh(tmp_path / "empty", kit / "call-1" / "run.sh", "run")
    assert nothing.returncode == 2 and "nothing received yet" in nothing.stdout


def test_another_build_arriving_replaces_the_stored_one(kit: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    _sh(store, kit / "call-1" / "run.sh", "receive", kit / "call-1")
    (store / "results").mkdir()
    manifest = json.loads((kit / "manifest.json").read_text())
    other = _call(kit, 2, tmp_path / "other")
    (other / "manifest.json").write_text(json.dumps({**manifest, "build_id": "b2"}))
    done = _sh(store, other / "run.sh", "receive", other)
    assert "the store held another kit" in done.stdout and "stored 1 of 3 parts" in done.stdout
    assert not (store / "results").exists()


def test_run_sh_without_a_command_prints_its_usage(kit: Path, tmp_path: Path) -> None:
    done = _sh(tmp_path / "store", kit / "run.sh")
    assert done.returncode == 0 and "bash run.sh call FOLDER" in done.stdout and "--cpu-dry-run" in done.stdout


# --------------------------------------------------------------------------- what is carried


def _wheel(folder: Path, name: str, version: str, requires: list[str], tag: str = "py3-none-any") -> Path:
    """A minimal wheel: METADATA with its Requires-Dist lines, WHEEL, RECORD, one module."""
    stem = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{stem}-{tag}.whl"
    meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{stem}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}")
        z.writestr(f"{stem}.dist-info/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tag}\n")
        z.writestr(f"{name.replace('-', '_')}.py", "")
        z.writestr(f"{stem}.dist-info/RECORD", "")
    return path


@pytest.fixture
def offered(tmp_path: Path) -> dict[str, wheels.Dist]:
    folder = tmp_path / "wheels"
    folder.mkdir()
    _wheel(folder, "app-a", "1.0", ["dep-b>=2", 'dep-x; extra == "serve"', 'dep-w; sys_platform == "win32"'])
    _wheel(folder, "dep-b", "2.1", ["dep-c"])
    _wheel(folder, "dep-c", "1.0", [])
    _wheel(folder, "dep-x", "1.0", [])
    _wheel(folder, "dep-w", "1.0", [])
    _wheel(folder, "native", "1.0", [], tag="cp312-cp312-manylinux_2_28_x86_64")
    return wheels.offered_by_folder(folder, "3.11")


def test_the_walk_follows_extras_and_markers_of_the_target(offered: dict[str, wheels.Dist]) -> None:
    assert "native" not in offered  # a cp312 wheel is nothing for CPython 3.11
    plain = wheels.carried(["app-a"], offered, {}, "3.11")
    assert plain.carried == ["app-a", "dep-b", "dep-c"] and not plain.walk.problems
    served = wheels.carried(["app-a[serve]"], offered, {}, "3.11")
    assert served.carried == ["app-a", "dep-b", "dep-x", "dep-c"]  # dep-w is Windows'


def test_node_has_leaves_those_distributions_and_what_only_they_need_out(offered: dict[str, wheels.Dist]) -> None:
    found = wheels.carried(["app-a"], offered, wheels.parse_node_has(["Dep_B==2.1", ""]), "3.11")
    assert found.carried == ["app-a"] and found.left_to_node == ["dep-b"]  # dep-c is only dep-b's: the node's too
    assert said(found.walk.demands["dep-b"]) == ["dep-b>=2 (from app-a 1.0)"] and not found.walk.problems
    unpinned = wheels.carried(["app-a", "dep-c"], offered, wheels.parse_node_has(["dep-c", "dep-b==2.1"]), "3.11")
    assert unpinned.carried == ["app-a"] and set(unpinned.left_to_node) == {"dep-b", "dep-c"}
    too_old = wheels.carried(["app-a"], offered, wheels.parse_node_has(["dep-b==1.5"]), "3.11")
    assert too_old.walk.problems == ["app-a 1.0 requires dep-b>=2: found dep-b 1.5"]
    missing = wheels.carried(["app-a", "nowhere>=1"], offered, {}, "3.11")
    assert missing.walk.problems == ["the project requires nowhere>=1: not installed"]


def test_one_the_node_has_at_an_unknown_version_is_carried_where_a_requirement_names_versions(
    offered: dict[str, wheels.Dist],
) -> None:
    choice = wheels.carried(["app-a"], offered, wheels.parse_node_has(["dep-b", "dep-c"]), "3.11")
    assert choice.carried == ["app-a", "dep-b"] and choice.shadowing == ["dep-b"]  # app-a asks for dep-b>=2
    assert choice.left_to_node == ["dep-c"] and not choice.walk.problems  # dep-b asks for any dep-c


def test_the_default_node_has_the_gpu_image_packages() -> None:
    node_has = wheels.parse_node_has(wheels.DEFAULT_NODE_HAS)
    assert node_has["torch"] == "2.11.0" and node_has["numpy"] == "2.5.2" and node_has["protobuf"] is None
    assert {"onnxruntime-gpu", "ray", "pydantic", "fastapi", "starlette"}.isdisjoint(node_has)
    reqs = wheels.project_requirements(contents.REPO / "pyproject.toml")
    names = {Requirement(r).name for r in reqs}
    assert names.isdisjoint(wheels.LEFT_OUT) and {"ray", "onnxruntime-gpu", "protobuf", "grpcio"} <= names
    assert "nvidia-nvimgcodec-cu13" in names  # the `gpu` extra: decode_in: gpu's decoder
    assert "nvidia-nvimgcodec-cu13" not in {Requirement(r).name for r in wheels.project_requirements(
        contents.REPO / "pyproject.toml", extras=())}  # fmt: skip


def test_nvimgcodecs_own_nvidia_init_is_removed_so_the_nodes_nvidia_packages_stay_visible(tmp_path: Path) -> None:
    (tmp_path / "nvidia" / "nvimgcodec").mkdir(parents=True)
    (tmp_path / "nvidia" / "__init__.py").write_text("")
    assert wheels.unshadow_nvidia(tmp_path) and not (tmp_path / "nvidia" / "__init__.py").exists()
    assert (tmp_path / "nvidia" / "nvimgcodec").is_dir() and not wheels.unshadow_nvidia(tmp_path)


def test_the_build_stops_in_one_line_when_a_model_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    models = tmp_path / "models"
    models.mkdir()
    for name in contents.MODEL_FILES:
        (models / name).write_text("x")
    (models / contents.FP16).unlink()
    argv = ["build", str(tmp_path / "kit"), "--models", str(models), "--wheels", str(tmp_path), "--node-has", ""]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "efficientnet_lite0-fp16.onnx missing: run `make models`" in err


def test_the_project_is_what_git_tracks_or_does_not_ignore_but_results(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True)
    for rel in ("tracked.py", "new.py", "ignored.log", "benchmarks/results/r.json", "gone.py"):
        (repo / rel).write_text(rel)
    (repo / ".gitignore").write_text("*.log\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "tracked.py", ".gitignore", "gone.py", "benchmarks/results/r.json"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    (repo / "gone.py").unlink()
    project = contents.project_files(repo)
    assert project.files == [".gitignore", "new.py", "tracked.py"] and project.untracked == ["new.py"]


def test_extension_modules_of_other_pythons_and_the_profiler_binary_are_left_out(tmp_path: Path) -> None:
    pkg = tmp_path / "nvidia" / "nvimgcodec"
    pkg.mkdir(parents=True)
    names = ["impl.cpython-311-x86_64-linux-gnu.so", "impl.cpython-312-x86_64-linux-gnu.so",
             "impl.cpython-313t-x86_64-linux-gnu.so", "impl.abi3.so", "libnvimgcodec.so.0"]  # fmt: skip
    for name in names:
        (pkg / name).write_bytes(ELF)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "py-spy").write_bytes(ELF)
    removed = prune.prune(tmp_path, candidates=(), dynamic=lambda p: (None, ()), python_version="3.12")
    assert sorted(p.name for p in pkg.iterdir()) == ["impl.abi3.so", "impl.cpython-312-x86_64-linux-gnu.so",
                                                     "libnvimgcodec.so.0"]  # fmt: skip
    assert not (tmp_path / "bin" / "py-spy").exists()
    assert {r["file"] for r in removed} == {
        f"nvidia/nvimgcodec/{names[0]}",
        f"nvidia/nvimgcodec/{names[2]}",
        "bin/py-spy",
    }
    assert all("removed" in r for r in removed)


def test_the_engines_segment_is_what_the_engine_steps_need_of_what_the_kit_carries(tmp_path: Path) -> None:
    carried = {
        "onnxruntime-gpu": wheels.Dist("onnxruntime-gpu", "1.31.1", ("numpy>=1.21", "protobuf", "flatbuffers"), "o"),
        "pydantic": wheels.Dist("pydantic", "2.14", ("pydantic-core==2.50.5", "typing-extensions>=4"), "p.whl"),
        "pydantic-core": wheels.Dist("pydantic-core", "2.50.5", ("typing-extensions>=4",), "c.whl"),
        "typing-extensions": wheels.Dist("typing-extensions", "4.16", (), "t.whl"),
        "ray": wheels.Dist("ray", "2.60.0", ("protobuf>=3", "typing-extensions"), "r.whl"),
        "protobuf": wheels.Dist("protobuf", "6.33.6", (), "pb.whl"),
    }
    reqs = ["ray[serve]==2.60.*", "onnxruntime-gpu==1.31.*", "pydantic>=2.7", "numpy>=1.26"]
    assert segments.engine_requirements(reqs) == reqs[1:]
    got = segments.engine_distributions(reqs, carried, "3.12")
    assert sorted(got) == ["onnxruntime-gpu", "protobuf", "pydantic", "pydantic-core", "typing-extensions"]
    site = tmp_path / "site"
    for rel in ("onnxruntime/capi/x.so", "onnxruntime_gpu-1.31.1.dist-info/RECORD", "ray/_raylet.so", "bin/ray"):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(ELF)
    (site / "onnxruntime_gpu-1.31.1.dist-info" / "RECORD").write_text(
        "onnxruntime/capi/x.so,sha256=x,64\n../../bin/onnxruntime_test,,\nonnxruntime_gpu-1.31.1.dist-info/RECORD,,\n"
    )
    (site / "bin" / "onnxruntime_test").write_text("#!python\n")
    (tmp_path / "kit.json").write_text("{}")
    split = segments.split(tmp_path, ["onnxruntime-gpu"])
    assert split["engines"] == ["kit.json", "site/bin/onnxruntime_test", "site/onnxruntime/capi/x.so",
                                "site/onnxruntime_gpu-1.31.1.dist-info/RECORD"]  # fmt: skip
    assert split["serving"] == ["site/bin/ray", "site/ray/_raylet.so"]


def test_the_engines_declaration_covers_what_gpu_check_and_gpu_decode_import() -> None:
    """ENGINE_REQUIREMENTS against the real imports: every third-party distribution that importing the engine steps
    loads is reached from the declared requirements (through installed metadata) or is the node's own."""
    code = (
        "import sys, benchmarks.gpu_check, benchmarks.gpu_decode\n"
        "print('\\n'.join(sorted({m.__file__ for m in list(sys.modules.values()) if getattr(m, '__file__', None)})))"
    )
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                cwd=contents.REPO).stdout.split("\n"))  # fmt: skip
    owner = {}  # an installed file -> its distribution (namespaces such as google.* are shared by several)
    for d in metadata.distributions():
        for f in d.files or []:
            owner[str(Path(str(d.locate_file(f))).resolve())] = canon(d.metadata["Name"])
    dists = {owner[str(Path(f).resolve())] for f in loaded if f and str(Path(f).resolve()) in owner}
    dists -= {canon("ray-image-classifier")}  # the project itself, as installed here (editable)
    node_has = set(wheels.parse_node_has(wheels.DEFAULT_NODE_HAS))

    def lookup(name: str) -> Found | None:
        if name in node_has:
            return Found(name, None, (), walk_on=False)
        try:
            d = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            return None
        return Found(name, d.version, tuple(d.requires or ()))

    project = wheels.project_requirements(contents.REPO / "pyproject.toml")
    reached = set(walk(segments.engine_requirements(project), lookup).found)
    assert dists, loaded
    assert dists <= reached | node_has, dists - reached - node_has


# --------------------------------------------------------------------------- the C API library


def _fake_site(root: Path) -> Path:
    capi = root / "onnxruntime" / "capi"
    capi.mkdir(parents=True)
    for name in ("libonnxruntime.so.1.31.1", "pybind.so", "libonnxruntime_providers_cuda.so"):
        (capi / name).write_bytes(ELF + name.encode())
    (capi / "__init__.py").write_text("from .pybind import *\n")
    info = root / "onnxruntime_gpu-1.31.1.dist-info"
    info.mkdir()
    (info / "RECORD").write_text("onnxruntime/capi/libonnxruntime.so.1.31.1,sha256=x,1\n")  # metadata only
    return root


def _dynamic(needs: dict[str, tuple[str, ...]]) -> prune.Dynamic:
    return lambda p: ("libonnxruntime.so.1" if p.name.startswith("libonnxruntime.so") else None, needs.get(p.name, ()))


def test_the_c_api_library_goes_when_nothing_needs_or_names_it(tmp_path: Path) -> None:
    site = _fake_site(tmp_path)
    removed = prune.prune(site, dynamic=_dynamic({"pybind.so": ("libstdc++.so.6",)}))
    assert removed == [
        {
            "file": "onnxruntime/capi/libonnxruntime.so.1.31.1",
            "bytes": len(ELF) + len(b"libonnxruntime.so.1.31.1"),
            "removed": "no ELF file of the site NEEDs it and no file names it",
        }
    ]
    assert not (site / "onnxruntime/capi/libonnxruntime.so.1.31.1").exists()


def test_the_c_api_library_stays_when_a_library_needs_it_or_a_file_names_it(tmp_path: Path) -> None:
    needed = _fake_site(tmp_path / "a")
    kept = prune.prune(needed, dynamic=_dynamic({"pybind.so": ("libonnxruntime.so.1",)}))
    assert kept[0]["kept"] == "onnxruntime/capi/pybind.so NEEDs libonnxruntime.so.1"
    named = _fake_site(tmp_path / "b")
    (named / "onnxruntime" / "loader.py").write_text('ctypes.CDLL("libonnxruntime.so.1")\n')
    kept = prune.prune(named, dynamic=_dynamic({}))
    assert kept[0]["kept"] == "onnxruntime/loader.py names libonnxruntime.so"
    assert (named / "onnxruntime/capi/libonnxruntime.so.1.31.1").exists()


def test_rays_java_jars_go_while_ray_starts_no_java_worker_without_them(tmp_path: Path) -> None:
    (tmp_path / "ray" / "jars").mkdir(parents=True)
    (tmp_path / "ray" / "jars" / "ray_dist.jar").write_bytes(b"PK" + bytes(98))
    (tmp_path / "ray" / "_private").mkdir()
    services = tmp_path / "ray" / "_private" / "services.py"
    services.write_text("ray_java_installed = True\n")  # a Ray that would need them
    assert prune.prune_jars(tmp_path)[0]["kept"].startswith("ray/_private/services.py no longer says")
    assert (tmp_path / "ray" / "jars").is_dir()
    services.write_text("    ray_java_installed = False\n    try:\n        jars_dir = get_ray_jars_dir()\n")
    assert prune.prune_jars(tmp_path) == [
        {"file": "ray/jars/", "bytes": 100, "removed": "only a JVM loads them; without them "
         "ray/_private/services.py starts no Java worker"}
    ]  # fmt: skip
    assert not (tmp_path / "ray" / "jars").exists() and prune.prune_jars(tmp_path) == []


def test_readelf_proves_it_on_the_installed_onnxruntime() -> None:
    """The rule on the real files: this venv's onnxruntime(-gpu) has its C API library and nothing needs it."""
    spec = util.find_spec("onnxruntime")
    ort = Path(spec.origin if spec and spec.origin else ".").parent
    libs = list((ort / "capi").glob("libonnxruntime.so.*"))
    if not libs or shutil.which("readelf") is None:
        pytest.skip("no libonnxruntime.so.* in this onnxruntime, or no readelf")
    assert prune.readelf_dynamic(libs[0])[0] == "libonnxruntime.so.1"
    assert prune.why_kept(libs[0], ort) is None
    services = ort.parent / prune.JARS_GUARD[0]
    assert not services.is_file() or prune.JARS_GUARD[1] in services.read_text()  # this venv's Ray: the jars could go


# --------------------------------------------------------------------------- on the node


def _lib(folder: Path, *names: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(ELF)


def test_the_cuda_library_folders_are_found_under_the_pythons_nvidia_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch_site, other = tmp_path / "torch-venv" / "site-packages", tmp_path / "user-site"
    system = tmp_path / "cuda-13.0" / "lib"  # the system CUDA's, searched last: libnvjpeg was there on the H200 node
    _lib(system, "libnvjpeg.so.13", "libcudart.so.13")
    monkeypatch.setattr(node, "SYSTEM_CUDA", str(tmp_path / "cuda*" / "lib"))
    _lib(torch_site / "nvidia" / "cu13" / "lib", "libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13",
         "libcurand.so.10", "libcufft.so.12", "libnvJitLink.so.13")  # fmt: skip
    _lib(torch_site / "nvidia" / "cudnn" / "lib", "libcudnn.so.9")
    _lib(torch_site / "nvidia" / "nccl" / "lib", "libnccl.so.2")  # not asked for: not on the path
    _lib(other / "nvidia" / "cu13" / "lib", "libcudart.so.13")  # a second copy: the first site's wins
    (torch_site / "nvidia" / "cu13" / "include").mkdir()
    dirs, missing = node.library_dirs([torch_site, other])
    assert dirs == [torch_site / "nvidia" / "cu13" / "lib", torch_site / "nvidia" / "cudnn" / "lib", system]
    assert not missing
    dirs, missing = node.library_dirs([other, tmp_path / "nothing-here"])
    assert dirs == [other / "nvidia" / "cu13" / "lib", system]
    assert missing == [lib for lib in node.CUDA_LIBRARIES if lib not in ("libcudart.so.13", "libnvjpeg.so.13")]


def test_libdirs_leaves_the_kits_site_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kit_site, node_site = tmp_path / "kit" / "site", tmp_path / "node"
    _lib(kit_site / "nvidia" / "cu13" / "lib", "libcudart.so.13")
    _lib(node_site / "nvidia" / "cu13" / "lib", "libcudart.so.13")
    monkeypatch.setattr(sys, "path", [str(kit_site), str(node_site)])
    monkeypatch.setattr(node.site, "getsitepackages", lambda: [])
    monkeypatch.setattr(node.site, "ENABLE_USER_SITE", False)
    assert node.python_sites([kit_site]) == [node_site.resolve()]
    dirs, _ = node.library_dirs(node.python_sites([kit_site]), ["libcudart.so.13"])
    assert dirs == [(node_site / "nvidia" / "cu13" / "lib").resolve()]


def test_the_requirement_check_names_each_unmet_requirement(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    reqs = ["packaging>=1", "packaging<1", "no-such-distribution-here>=1", 'pytest; sys_platform == "nowhere"']
    (tmp_path / "kit.json").write_text(json.dumps({"requirements": reqs, "engine_requirements": reqs[:1]}))
    assert node.unmet(tmp_path, "engines") == ([], {"kit": 0, "node": 1})  # the engines' requirements alone
    problems, counts = node.unmet(tmp_path)
    version = metadata.version("packaging")
    assert problems == [
        f"the project requires packaging<1: found packaging {version}",
        "the project requires no-such-distribution-here>=1: not installed",
    ]
    assert counts == {"kit": 0, "node": 1}


def test_the_sites_scripts_run_with_the_nodes_python(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "serve").write_text("#!/build/.venv/bin/python\nimport sys\n")
    (bin_dir / "long").write_text("#!/bin/sh\n'''exec' '/a b/python' \"$0\" \"$@\"\n' '''\nimport sys\n")
    (bin_dir / "py-spy").write_bytes(ELF)
    assert node.fix_scripts(bin_dir, "/opt/torch/.venv/bin/python3") == ["long", "serve"]
    assert (bin_dir / "serve").read_text() == "#!/opt/torch/.venv/bin/python3\nimport sys\n"
    assert (bin_dir / "long").read_text() == "#!/opt/torch/.venv/bin/python3\nimport sys\n"
    assert (bin_dir / "py-spy").read_bytes() == ELF
    assert "from app.front import main" in (bin_dir / "app-haproxy").read_text()


@pytest.mark.parametrize("node_regular", [False, True], ids=["node-namespace", "node-regular"])
def test_nvimgcodec_and_the_nodes_nvidia_packages_both_import_whatever_the_nodes_layout(
    tmp_path: Path, node_regular: bool
) -> None:
    kit, node_site = tmp_path / "kit", tmp_path / "node"
    (kit / "nvidia" / "nvimgcodec").mkdir(parents=True)
    (kit / "nvidia" / "nvimgcodec" / "__init__.py").write_text("WHERE = 'kit'\n")
    (node_site / "nvidia" / "cu13").mkdir(parents=True)
    (node_site / "nvidia" / "cu13" / "__init__.py").write_text("WHERE = 'node'\n")
    if node_regular:
        (node_site / "nvidia" / "__init__.py").write_text("")
    said = node.join_nvidia(kit, [kit, node_site])
    assert ("regular package" in said) == node_regular
    code = "import nvidia.nvimgcodec as a, nvidia.cu13 as b; print(a.WHERE, b.WHERE)"
    env = {**os.environ, "PYTHONPATH": f"{kit}{os.pathsep}{node_site}"}
    done = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True)  # -S: no site
    assert done.stdout.strip() == "kit node", done.stderr


def test_the_walk_on_the_node_stops_outside_the_kit() -> None:
    seen: list[str] = []

    def lookup(name: str) -> Found | None:
        seen.append(name)
        return {"a": Found("a", "1", ("b",)), "b": Found("b", "2", ("c>=9",), walk_on=False)}.get(name)

    done = walk(["a>=1"], lookup)
    assert seen == ["a", "b"] and not done.problems
