"""Plugins follow the run (docs/PLUGINS.md): a run records the plugins it loaded in spec.toml and
manifest.json; report, summary, compare and gate load them from there without --plugin; a plugin
missing at report time is a sentence of the report, never an error; ``--supervise``'s child and
``--isolate``'s children load the parent's plugins; a resume refuses a changed plugin file; a run
directory that records no plugin reads as before.

Every command that loads a plugin runs in a subprocess: a plugin loaded into the test process
would stay in ``routers.ROUTERS`` for the tests after it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.rundir import plugins as run_plugins
from harness.spec.base import _dumps_subset, read_toml, tomllib

ROOT = Path(__file__).resolve().parents[1]
NAME = "gated_follow"
#: A plugin router: h_{k+1} = h_k + sigmoid(g_k) u_k, with an ideal forward I/O of 4 (prenorm: 3),
#: so its floor's extra bytes are 1 element of d per token and sublayer: B·T·2L·d·4 bytes in float32.
PLUGIN = f'''
import torch
from torch import nn
from routers.api import Router, register_router
ROUTERBENCH_API_VERSION = 1


@register_router("{NAME}")
class GatedFollow(Router):
    """Gated residual: h_(k+1) = h_k + sigmoid(g_k) u_k."""

    def __init__(self, d_model, n_layers):
        super().__init__(d_model, n_layers)
        self.gate = nn.Parameter(torch.full((2 * n_layers,), 2.0))

    def init_state(self, embedding, region=False):
        return embedding

    def params(self, state, slot, region=False):
        return (self.gate[slot.index],)

    def read(self, state, role, params):
        return state

    def write(self, state, role, params, update):
        return state + torch.sigmoid(params[0]) * update

    def output(self, state, params=()):
        return state

    def reference(self, embedding, updates):
        h, reads = embedding.double(), []
        for k, u in enumerate(updates):
            reads.append(h)
            h = h + torch.sigmoid(self.gate[k].double()) * u.double()
        return reads, h

    def analytic_fwd_flops(self, batch_size, seq_len):
        return float(len(self.slots) * 3 * self.d_model * batch_size * seq_len)

    def live_state_bytes(self, batch_size, seq_len, dtype=None, impl=None):
        return batch_size * seq_len * self.d_model * torch.empty((), dtype=dtype or torch.float32).element_size()

    def ideal_io_per_token(self, schedule=None):
        return 4.0

    def ideal_io_fwd_per_token(self):
        return 4.0

    def ideal_io_fwd_bwd_per_token(self):
        return 8.0
'''
D, L, T, B = 16, 2, 8, 2
EXTRA_BYTES = B * T * 2 * L * D * 4 * (4.0 - 3.0)
RUN = ["run", "--routers", f"prenorm,{NAME}", "--widths", str(D), "--depths", str(L), "--n-heads", "2",
       "--seq-len", str(T), "--batch-size", str(B), "--modes", "fwd", "--backends", "eager",
       "--smallest-backends", "", "--no-train", "--quiet", "--no-flops", "--repeats", "3", "--warmup-s", "0",
       "--remeasure-s", "0", "--max-attempts", "1"]


def _rb(*args, cwd=ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("ROUTERBENCH_PLUGINS", "ROUTERBENCH_SUPERVISED",
                                                            "ROUTERBENCH_FAULT")}
    e.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", "harness.cli", *map(str, args)], cwd=cwd, env=e,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A supervised run whose units are measured in isolated children, with the plugin given
    by --plugin to the parent only: ``(run dir, plugin file, out root)``."""
    tmp = tmp_path_factory.mktemp("follow")
    plugin = tmp / "myplugin.py"
    plugin.write_text(PLUGIN)
    res = _rb("--plugin", plugin, *RUN, "--no-report", "--supervise", "--isolate", "--out", tmp / "out",
              "--run-id", "r1")
    assert res.returncode == 0, res.stdout + res.stderr
    return next((tmp / "out").glob("*/r1")), plugin, tmp / "out"


def test_spec_and_manifest_record_the_plugin(run):
    d, plugin, _ = run
    sha = hashlib.sha256(plugin.read_bytes()).hexdigest()
    spec = tomllib.loads((d / "spec.toml").read_text())
    manifest = json.loads((d / "manifest.json").read_text())
    for recs in (spec["plugins"], manifest["plugins"], manifest["sessions"][0]["plugins"]):
        assert len(recs) == 1
        assert recs[0]["file"] == str(plugin.resolve()) and recs[0]["sha256"] == sha
        assert recs[0]["routers"] == [NAME] and recs[0]["impls"] == []
    assert run_plugins.recorded(d) == manifest["plugins"]


def test_supervised_isolated_children_measured_the_plugin_router(run):
    d, _, _ = run
    rows = [json.loads(x) for x in (d / "records.jsonl").read_text().splitlines()]
    ok = [r for r in rows if r.get("metric") == "step_time" and r.get("router") == NAME]
    assert len(ok) == 3 and {r["status"] for r in ok} == {"ok"}


def test_readers_load_the_recorded_plugin(run):
    d, _, _ = run
    res = _rb("report", d)
    assert res.returncode == 0, res.stderr
    md = (d / "report.md").read_text()
    assert f"| {NAME} " in md and "not loaded" not in md
    floor = pd.read_csv(d / "floor.csv")
    assert floor.set_index("router").loc[NAME, "extra_bytes"] == EXTRA_BYTES  # its own cost model
    res = _rb("summary", d)
    assert res.returncode == 0, res.stderr
    assert NAME in res.stdout and "not loaded" not in res.stdout
    rules = d.parent / "rules.toml"
    rules.write_text(f'[[rule]]\nmetric = "overhead_vs_prenorm"\nmax_pct = 10000\nrouters = ["{NAME}"]\n')
    res = _rb("gate", d, "--rules", rules)
    assert res.returncode in (0, 3), res.stdout + res.stderr  # its name is known: the rule loads
    assert NAME in res.stdout


def test_resume_refuses_a_changed_plugin(run, tmp_path):
    d, plugin, out = run
    shutil.copytree(d.parent, tmp_path / d.parent.name)
    copy = tmp_path / d.parent.name / d.name
    changed = tmp_path / "changed.py"
    changed.write_text(plugin.read_text() + "\n# changed\n")
    spec = (copy / "spec.toml").read_text().replace(str(plugin.resolve()), str(changed))
    (copy / "spec.toml").write_text(spec)
    res = _rb("run", "--config", copy / "spec.toml", "--out", tmp_path, "--run-id", d.name)
    assert res.returncode == 2, res.stdout + res.stderr
    err = res.stderr.strip().splitlines()[-1]
    assert err.startswith("routerbench: error: --run-id r1: this run was started with plugin ")
    assert "sha256" in err and "restore" in err


def test_a_plugin_missing_at_report_time_is_said_not_raised(run, tmp_path):
    d, plugin, _ = run
    copies = []
    for i in (1, 2):
        shutil.copytree(d, tmp_path / f"c{i}" / d.name)
        copies.append(tmp_path / f"c{i}" / d.name)
    moved = plugin.with_suffix(".away")
    plugin.rename(moved)
    try:
        res = _rb("report", copies[0])
        assert res.returncode == 0, res.stderr
        md = (copies[0] / "report.md").read_text()
        assert f"Plugins: plugin {plugin.resolve()} not loaded" in md and f"{NAME}: floor and cost models not declared" in md
        assert f"| {NAME} " in md  # its measured rows are still reported
        assert math.isnan(pd.read_csv(copies[0] / "floor.csv").set_index("router").loc[NAME, "extra_bytes"])
        html = (copies[0] / "report.html").read_text()
        assert "not loaded" in html
        res = _rb("summary", copies[0])
        assert res.returncode == 0 and f"Plugins: plugin {plugin.resolve()} not loaded" in res.stdout
        res = _rb("compare", *copies, "--out", tmp_path / "cmp")
        assert res.returncode == 0, res.stderr
        assert "not loaded" in (tmp_path / "cmp" / "compare.md").read_text()
        rules = tmp_path / "rules.toml"
        rules.write_text(f'[[rule]]\nmetric = "overhead_vs_prenorm"\nmax_pct = 10000\nrouters = ["{NAME}"]\n')
        res = _rb("gate", copies[0], "--rules", rules)
        assert res.returncode == 2 and f"unknown name '{NAME}'" in res.stderr
        assert "not loaded" in res.stderr  # why it is unknown comes first
    finally:
        moved.rename(plugin)


def test_spec_toml_plugin_records_round_trip(tmp_path):
    recs = [{"spec": "pkg.mod", "module": "pkg.mod", "dist": "pkg", "version": "1.0", "routers": ["x"],
             "impls": []}]
    text = _dumps_subset({"command": "run", "plugins": recs, "shape": {"widths": [16]}})
    assert tomllib.loads(text)["plugins"] == recs
    path = tmp_path / "spec.toml"
    path.write_text('command = "run"\nplugins = [{spec = "routerbench.routers:x", module = "m"}]\n')
    assert read_toml(str(path), "run") == {}  # an entry point's record: loaded by the command itself


def test_a_run_dir_without_plugin_records_reads_as_before(tmp_path):
    from harness.rundir.writer import RunWriter
    from reports.frame import load_frame
    d = tmp_path / "old"
    with RunWriter(d, "old", "s1", base={"device": "cpu"}) as w, w.unit(["k"], kind="case") as u:
        u.write(case_key="k", router="prenorm", metric="step_time", value=1.0, unit="ms")
        u.commit({"k": "ok"})
    (d / "manifest.json").write_text(json.dumps({"run_id": "old", "sessions": [{"argv": []}]}))
    (d / "spec.toml").write_text('command = "run"\n')
    assert run_plugins.recorded(d) == [] and run_plugins.load_for([d]) == []
    df = load_frame([d])
    assert df.attrs["plugin_notes"] == [] and list(df["router"]) == ["prenorm"]


def test_diagnose_loads_the_recorded_plugin_and_skips_its_runs_without_it(tmp_path):
    plugin = tmp_path / "diagplugin.py"
    plugin.write_text(PLUGIN)
    res = _rb("--plugin", plugin, "train", "--routers", f"prenorm,{NAME}", "--d-model", "16", "--n-layers", "2",
              "--n-heads", "2", "--seq-len", "8", "--batch-size", "4", "--max-steps", "2", "--eval-every", "2",
              "--seeds", "1", "--target-loss", "0.01", "--quiet", "--no-report", "--out", tmp_path / "out",
              "--run-id", "t1")
    assert res.returncode == 0, res.stdout + res.stderr
    d = next((tmp_path / "out").glob("*/t1"))
    res = _rb("diagnose", d, "--out", tmp_path / "with")
    assert res.returncode == 0, res.stderr
    rms = pd.read_csv(tmp_path / "with" / "hidden_rms.csv")
    assert set(rms["router"]) == {"prenorm", NAME}
    plugin.rename(plugin.with_suffix(".away"))
    res = _rb("diagnose", d, "--out", tmp_path / "without")
    assert res.returncode == 0, res.stderr
    assert f"diagnose: Plugins: plugin {plugin.resolve()} not loaded" in res.stderr
    assert f"{NAME}-seed0: router {NAME} is not loaded here (its plugin is missing), skipped" in res.stderr
    assert set(pd.read_csv(tmp_path / "without" / "hidden_rms.csv")["router"]) == {"prenorm"}


def test_a_benchmark_json_keeps_its_plugins_for_the_gate():
    from reports.benchjson import plugin_records
    rec = {"spec": "/x/p.py", "module": "routerbench_plugin_p", "file": "/x/p.py", "sha256": "ab", "routers": ["r"]}
    data = {"benchmarks": [{"extra_info": {"routerbench": 2, "plugins": [rec]}},
                           {"extra_info": {"routerbench": 2, "plugins": [rec]}},
                           {"extra_info": {"routerbench": 2}}]}  # a layout without plugins: none
    assert plugin_records(data) == [rec]
    assert plugin_records({"benchmarks": []}) == []
