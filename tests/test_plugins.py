"""The plugin loader (routers/plugins.py, docs/PLUGINS.md): each bad plugin is one line naming it,
what is wrong and the fix (``ROUTERBENCH_PLUGINS=none`` included), exit 2, before any model is
built, and only for the commands that load routers; good plugins show in ``list`` with their origin
from a file, a config file or an installed entry point; a process that asks for none holds the
built-ins only."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from routers import plugins, registry

ROOT = Path(__file__).resolve().parents[1]
FIX = "(or run with ROUTERBENCH_PLUGINS=none to load no plugin)"

GOOD = textwrap.dedent('''\
    import torch
    from routers.api import Router, register_router

    ROUTERBENCH_API_VERSION = 1


    @register_router("{name}")
    class Half(Router):
        """h_(k+1) = h_k + u_k / 2."""

        def init_state(self, embedding, region=False):
            return embedding

        def read(self, state, role, params):
            return state

        def write(self, state, role, params, update):
            return state + 0.5 * update

        def output(self, state, params=()):
            return state

        def reference(self, embedding, updates):
            h, reads = embedding.double(), []
            for u in updates:
                reads.append(h)
                h = h + 0.5 * u.double()
            return reads, h
    ''')


def good(name: str = "half_tmp") -> str:
    return GOOD.format(name=name)


def test_the_bad_plugins_differ_from_the_good_one():
    assert all(BAD[n][0] != good() and "def read" in good() for n in BAD)
    assert "def read" not in BAD["noread"][0] and "def reference" not in BAD["noref"][0]


#: name -> (the plugin's source, words its one line must hold)
BAD = {
    "broken": ("ROUTERBENCH_API_VERSION = 1\nx = 1\nraise RuntimeError('boom at import')\n",
               ["failed to import: RuntimeError: boom at import", "broken.py:3", "fix the plugin"]),
    "syntax": ("ROUTERBENCH_API_VERSION = 1\n\ndef f(:\n    pass\n", ["SyntaxError", "syntax.py:3"]),
    "nothing": ("ROUTERBENCH_API_VERSION = 1\nx = 1\n",
                ["registered no router and no impl", "@register_router"]),
    "noread": (good().replace("    def read(self, state, role, params):\n        return state\n", ""),
               ["router half_tmp", "does not define read", "docs/PLUGINS.md"]),
    "noref": (good().split("    def reference")[0], ["router half_tmp has no float64 reference",
                                                         "reference(self, embedding, updates)"]),
    "version2": (good().replace("ROUTERBENCH_API_VERSION = 1", "ROUTERBENCH_API_VERSION = 2"),
                 ["written for routerbench's plugin API 2", "this routerbench has API 1", "update the plugin"]),
    "noversion": (good().replace("ROUTERBENCH_API_VERSION = 1\n", ""),
                  ["declares no ROUTERBENCH_API_VERSION", "add `ROUTERBENCH_API_VERSION = 1`"]),
    "clash": (good("half_ok_tmp") + good("prenorm").split("ROUTERBENCH_API_VERSION = 1")[1],
              ["router name 'prenorm' is taken by the built-in router", "register it under another name"]),
}


@pytest.fixture
def clean():
    """Whatever a test loads in this process is forgotten after it."""
    before = set(registry.load_routers())
    yield
    for name in set(registry.ROUTERS) - before:
        registry.ROUTERS.pop(name, None)
        registry.ORIGINS.pop(name, None)
    plugins.LOADED.clear()
    plugins._asked.clear()


def cli(args, env=None, cwd=ROOT):
    """``python -m harness.cli ARGS`` in a fresh process (the repo first on the path)."""
    e = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *(env or {}).pop("_path", [])])}
    e.pop("ROUTERBENCH_PLUGINS", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=e, timeout=300)


def one_line(res, spec: str, words: list[str]) -> str:
    assert res.exit_code == 2, (res.stdout, res.stderr)
    assert res.stdout == "", res.stdout  # nothing else is printed
    line = res.stderr
    assert line.count("\n") == 1 and line.startswith(f"routerbench: error: plugin {spec}: "), line
    assert line.rstrip().endswith(FIX) and "Traceback" not in line, line
    for w in words:
        assert w in line, (w, line)
    return line


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_plugin_is_one_line_and_exit_2(name, tmp_path, clean):
    src, words = BAD[name]
    f = tmp_path / f"{name}.py"
    f.write_text(src)
    res = CliRunner().invoke(main, ["--plugin", str(f), "list"])
    one_line(res, str(f), words)
    # nothing of it stays registered, the clash's first (good) router included
    assert "half_tmp" not in registry.ROUTERS and "half_ok_tmp" not in registry.ROUTERS
    assert registry.ROUTERS["prenorm"].__module__ == "routers.fixed"
    assert not plugins.LOADED


def test_a_module_that_is_not_installed(clean):
    res = CliRunner().invoke(main, ["--plugin", "nosuch_plugin_mod", "list"])
    one_line(res, "nosuch_plugin_mod", ["no module named 'nosuch_plugin_mod' is installed", "pip install"])


def test_a_bad_plugin_stops_run_before_any_work(tmp_path, clean):
    f = tmp_path / "broken.py"
    f.write_text(BAD["broken"][0])
    out = tmp_path / "out"
    res = CliRunner(env={"ROUTERBENCH_PLUGINS": str(f)}).invoke(
        main, ["run", "--out", str(out), "--widths", "16", "--depths", "2"])
    one_line(res, str(f), ["boom at import"])
    assert not out.exists()


def test_status_and_data_are_not_stopped_by_a_bad_plugin(tmp_path):
    env = {"ROUTERBENCH_PLUGINS": str(tmp_path / "missing.py")}
    res = cli(["status", str(tmp_path)], env=dict(env))
    assert "plugin" not in res.stderr and "not a run directory" in res.stderr, res.stderr
    res = cli(["data", "--help"], env=dict(env))
    assert res.returncode == 0 and "Corpora" in res.stdout and res.stderr == ""
    # a command's own help needs no plugin either
    res = CliRunner(env=env).invoke(main, ["run", "--help"])
    assert res.exit_code == 0 and "Usage: " in res.stdout and " run [OPTIONS]" in res.stdout and res.stderr == ""
    # and a --plugin given to a command that loads no router is refused, naming it
    res = cli(["--plugin", str(tmp_path / "x.py"), "status", str(tmp_path)])
    assert res.returncode == 2 and "--plugin: `routerbench status` loads no router; drop --plugin" in res.stderr


def test_a_good_file_plugin_shows_in_list_with_its_origin(tmp_path):
    f = tmp_path / "myr.py"
    f.write_text(good())
    res = cli(["--plugin", str(f), "list"])
    assert res.returncode == 0, res.stderr
    row = [ln for ln in res.stdout.splitlines() if ln.strip().startswith("half_tmp ")]
    assert len(row) == 1 and f"[file {f}]" in row[0] and "h_(k+1) = h_k + u_k / 2." in row[0], res.stdout
    assert "[built-in]" in [ln for ln in res.stdout.splitlines() if ln.strip().startswith("prenorm ")][0]


def _entry_point_dist(tmp_path: Path) -> Path:
    """A distribution ``fakepl-tmp 0.1`` with a ``routerbench.routers`` entry point, as pip would
    install it (its dist-info beside its module)."""
    site = tmp_path / "site"
    (site / "fakepl_tmp-0.1.dist-info").mkdir(parents=True)
    (site / "fakepl_tmp.py").write_text(good("ep_tmp"))
    (site / "fakepl_tmp-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: fakepl-tmp\nVersion: 0.1\n")
    (site / "fakepl_tmp-0.1.dist-info" / "entry_points.txt").write_text("[routerbench.routers]\nep = fakepl_tmp\n")
    return site


def test_entry_points_load_and_none_turns_them_off(tmp_path):
    site = _entry_point_dist(tmp_path)
    res = cli(["list"], env={"_path": [str(site)]})
    assert res.returncode == 0, res.stderr
    assert any(ln.strip().startswith("ep_tmp ") and "[fakepl-tmp 0.1]" in ln for ln in res.stdout.splitlines())
    off = cli(["list"], env={"_path": [str(site)], "ROUTERBENCH_PLUGINS": "none"})
    assert off.returncode == 0 and "ep_tmp" not in off.stdout and "prenorm" in off.stdout
    refused = cli(["--plugin", "fakepl_tmp", "list"], env={"_path": [str(site)], "ROUTERBENCH_PLUGINS": "none"})
    assert refused.returncode == 2 and "turned off by ROUTERBENCH_PLUGINS=none" in refused.stderr


def test_a_process_that_asks_for_none_holds_the_built_ins_only(tmp_path):
    site = _entry_point_dist(tmp_path)
    f = tmp_path / "myr.py"
    f.write_text(good())
    probe = ("import routers, sys\nfrom routers.registry import ORIGINS\n"
             "print(sorted(routers.ROUTERS)); print(set(ORIGINS.values()))\n"
             "print('torch' in sys.modules)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)]), "ROUTERBENCH_PLUGINS": str(f)}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=300)
    names, origins = out.stdout.splitlines()[:2]
    assert "half_tmp" not in names and "ep_tmp" not in names and "'prenorm'" in names, out.stdout + out.stderr
    assert origins == "{'built-in'}"


def test_help_imports_no_torch_with_plugins_set(tmp_path):
    f = tmp_path / "myr.py"
    f.write_text(good())
    probe = ("import sys\nfrom harness.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "print('LOADED', sorted(m for m in ('torch', 'pandas') if m in sys.modules))\n")
    for value in (str(f), str(tmp_path / "broken_missing.py"), "none"):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "ROUTERBENCH_PLUGINS": value}
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=env,
                             timeout=120)
        assert "LOADED []" in out.stdout and "--plugin" in out.stdout, (value, out.stdout, out.stderr)


def test_a_config_files_plugins_key_loads_relative_to_it(tmp_path):
    cfg_dir = tmp_path / "cfg"
    cfg_dir.mkdir()
    (cfg_dir / "myr.py").write_text(good())
    (cfg_dir / "c.toml").write_text('plugins = ["myr.py"]\n[costs]\nrouters = ["half_tmp"]\nwidths = [16]\n'
                                    'depths = [2]\ntokens = 8\njson = true\n')
    res = cli(["costs", "--config", str(cfg_dir / "c.toml")], cwd=tmp_path)  # another cwd: relative to the file
    assert res.returncode == 0, res.stderr
    assert '"router": "half_tmp"' in res.stdout and '"router": "prenorm"' in res.stdout
    (cfg_dir / "bad.toml").write_text('plugins = ["nope.py"]\n[costs]\nrouters = ["prenorm"]\n')
    res = cli(["costs", "--config", str(cfg_dir / "bad.toml")], cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith(f"routerbench: error: plugin {cfg_dir / 'nope.py'}: no such file") and FIX in res.stderr
