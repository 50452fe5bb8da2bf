"""reports/compare.py and ``routerbench compare``: two runs on two devices, run B exactly 2x slower."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.rundir.writer import RunWriter
from reports.compare import NothingToCompare, build_compare, load_runs, run_labels, step_time_compare

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PRENORM = [10.0, 11.0, 9.0, 10.5, 12.0]
RATIOS = {"prenorm": 1.0, "haares": 1.2, "block_attnres": 1.5}  # the same in every pair
DEVICES = {"run-a": ("cuda-nvidia-h100", "NVIDIA H100 80GB HBM3"),
           "run-b": ("cuda-nvidia-a100", "NVIDIA A100-SXM4-40GB")}


def write_group(w, routers, *, scale=1.0, d_model=64, mode="fwd", pair=True):
    """One paired group (prenorm and ``routers``) as its unit of resume, every time × ``scale``."""
    keys = {r: f"{r}|{mode}|d{d_model}" for r in routers}
    with w.unit(keys.values(), kind="group") as u:
        for router in routers:
            cols = dict(case_key=keys[router], router=router, router_options={}, impl="naive",
                        backend="eager", mode=mode, workload="decoder", d_model=d_model, n_layers=2,
                        n_heads=4, seq_len=64, batch_size=2, dtype="float32", seed=0)
            for i, t in enumerate(PRENORM):
                u.write(**cols, metric="step_time", value=t * RATIOS[router] * scale, unit="ms",
                        repeat=i, pair=i if pair else None)


def make_run(root, run_id, *, scale=1.0, extra_width=None, modes=("fwd", "fwd_bwd"), pair=True):
    slug, name = DEVICES[run_id]
    d = root / slug / run_id
    with RunWriter(d, run_id, "s1", base={"device": "cuda"}) as w:
        for mode in modes:
            write_group(w, list(RATIOS), scale=scale, mode=mode, pair=pair)
        if extra_width:
            write_group(w, ["prenorm", "haares"], scale=scale, d_model=extra_width)
    manifest = {"run_id": run_id, "git_sha": f"{run_id}-sha".ljust(40, "0"),
                "environment": {"device": "cuda", "device_name": name, "device_slug": slug,
                                "torch": "2.5.1"}}
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d


@pytest.fixture
def runs(tmp_path):
    return [make_run(tmp_path, "run-a", extra_width=128), make_run(tmp_path, "run-b", scale=2.0)]


def test_run_labels_tell_twins_apart():
    runs = [{"device_name": "H100", "git_sha": "a" * 40, "run_id": "r1"},
            {"device_name": "H100", "git_sha": "b" * 40, "run_id": "r2"},
            {"device_name": "A100", "git_sha": "a" * 40, "run_id": "r3"}]
    assert run_labels(runs) == ["H100 @ " + "a" * 12, "H100 @ " + "b" * 12, "A100"]
    same = [{"device_name": "cpu", "git_sha": "", "run_id": "x"}] * 2
    assert run_labels(same) == ["cpu · x #1", "cpu · x #2"]


def test_compare_tables_figures_and_pages(runs, tmp_path):
    a, b = (DEVICES[r][1] for r in ("run-a", "run-b"))
    df, table = load_runs(runs)
    assert list(table["label"]) == [a, b] and set(df["run_id"]) == {a, b}
    steps, partial = step_time_compare(df, [a, b])
    assert len(steps) == 2 * 3  # modes x routers in both runs
    assert steps[f"{b} / {a}"].tolist() == pytest.approx([2.0] * 6)
    assert len(partial) == 2 and set(partial["in runs"]) == {a}  # the d=128 group of run A only

    paths = build_compare(runs, tmp_path / "cmp")
    md = paths["compare.md"].read_text()
    paired_part, step_part = md.split("## Step time")
    for router, cell in (("haares", "1.200 [1.200, 1.200]"), ("block_attnres", "1.500 [1.500, 1.500]")):
        side = [ln for ln in paired_part.splitlines() if ln.startswith(f"| {router} ")]
        assert len(side) == 2 and all(ln.count(cell) == 2 for ln in side)  # 2 modes x 2 devices
    step_rows = [ln for ln in step_part.split("## Cases")[0].splitlines() if ln.startswith("| ")]
    assert f"{a} (ms)" in step_rows[0] and f"{b} / {a}" in step_rows[0]
    assert [ln.rstrip(" |").rsplit("|", 1)[1].strip() for ln in step_rows[1:]] == ["2.000"] * 6
    assert "6 case(s) in common" in md and "2 in only some runs" in md
    assert a in md and b in md and "2.5.1" in md and "run-a-sha0" in md
    for stem in ("compare_paired_ratios", "compare_step_ratios"):
        assert paths[f"{stem}.png"].read_bytes()[:8] == PNG_MAGIC
        assert f"]({stem}.png)" in md
    data = pd.read_csv(paths["compare_paired_ratios.csv"])
    assert set(data["device_name"]) == {a, b} and set(data["run"]) == {a, b}
    assert data.loc[data.router == "haares", "ratio"].tolist() == pytest.approx([1.2] * 4)
    steps_csv = pd.read_csv(paths["compare_step_ratios.csv"])
    assert steps_csv["ratio"].tolist() == pytest.approx([2.0] * 6)
    html = paths["compare.html"].read_text()
    assert html.count('src="data:image/png;base64,') == 2 and "max-width:1200px" in html


def test_unpaired_runs_still_compare_step_times(tmp_path):
    runs = [make_run(tmp_path, r, scale=s, modes=("fwd",), pair=False)
            for r, s in (("run-a", 1.0), ("run-b", 2.0))]
    paths = build_compare(runs, tmp_path / "cmp")
    assert "compare_paired_ratios.png" not in paths and "compare_step_ratios.png" in paths
    assert "No case has paired step times" in paths["compare.md"].read_text()
    assert pd.read_csv(paths["compare_step_ratios.csv"])["ratio"].tolist() == pytest.approx([2.0] * 3)


def test_no_common_case(tmp_path):
    a = make_run(tmp_path, "run-a", modes=("fwd",))
    b = make_run(tmp_path, "run-b", modes=("fwd_bwd",))
    with pytest.raises(NothingToCompare, match="no case in common"):
        build_compare([a, b], tmp_path / "cmp")


def invoke(*args):
    return CliRunner().invoke(main, [str(x) for x in args], catch_exceptions=False)


def test_cli_compare(runs, tmp_path):
    res = invoke("compare", tmp_path)  # a folder holding both runs: in path order, run-b first
    assert res.exit_code == 0, res.output
    out = runs[1].parent / "compare-run-b"
    assert (out / "compare.html").is_file() and (out / "compare.md").is_file()
    assert str(out / "compare.html") in res.output
    res = invoke("compare", *runs, "--out", tmp_path / "mine")
    assert res.exit_code == 0 and (tmp_path / "mine" / "compare.md").is_file()


def test_cli_bad_inputs_exit_2_with_one_line(tmp_path):
    a = make_run(tmp_path, "run-a", modes=("fwd",))
    res = invoke("compare", a)
    assert res.exit_code == 2 and "two or more" in res.output
    assert res.output.strip().count("\n") == 0 and res.output.startswith("routerbench: error:")
    b = make_run(tmp_path, "run-b", modes=("fwd_bwd",))
    res = invoke("compare", a, b, "--out", tmp_path / "cmp")
    assert res.exit_code == 2 and "no case in common" in res.output
    assert res.output.strip().count("\n") == 0
