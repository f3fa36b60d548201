"""benchmarks/gpu_decode's flow on the CPU (`--cpu-dry-run`: the host stand-in for nvImageCodec, the transform graph on
the CPU EP): it measures both paths per size, counts where images were decoded, and checks the GPU path's pixels
against the CPU path's on the same full decode. No Ray. Its figures are this CPU's: only the flow is asserted."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import gpu_decode


def test_the_dry_run_measures_both_paths_and_agrees_with_the_cpu_path(tmp_path: Path) -> None:
    assert gpu_decode.main(["--cpu-dry-run", "--batch", "2", "--seconds", "0", "--out", str(tmp_path)]) == 0
    (result_file,) = tmp_path.glob("*-gpu-decode-dryrun.json")
    result = json.loads(result_file.read_text())
    assert result["decoder"] == "standin" and result["dry_run"] and result["verdict"].startswith("agrees")
    assert set(result["sizes"]) == {"640x480", "1920x1080"}
    for r in result["sizes"].values():
        assert r["cpu_path"]["images_per_s"] > 0 and r["gpu_path"]["images_per_s"] > 0
        assert set(r["decoded"]) == {"hardware"} and not r["errors"]  # baseline JPEGs: all by the "device"
        assert len(r["mean_abs_diff"]) == 5 and max(r["mean_abs_diff"]) <= gpu_decode.MAX_MEAN_DIFF
    assert (tmp_path / result_file.name.replace(".json", ".png")).is_file()
