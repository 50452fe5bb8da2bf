"""The benchmark workflow (.github/workflows/benchmarks.yml) against GitHub's workflow schema
(check-jsonschema's bundled copy, so no network), and what its steps run."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "benchmarks.yml"


def _check_jsonschema() -> list[str]:
    exe = Path(sys.executable).with_name("check-jsonschema")
    if exe.exists():
        return [str(exe)]
    if shutil.which("check-jsonschema"):
        return ["check-jsonschema"]
    pytest.skip("check-jsonschema is not installed (pip install -e '.[test]')")


def test_workflow_is_valid_for_github():
    out = subprocess.run([*_check_jsonschema(), "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_schema_check_catches_a_broken_workflow(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text(WORKFLOW.read_text().replace("runs-on: ubuntu-latest", "runs_on: ubuntu-latest"))
    out = subprocess.run([*_check_jsonschema(), "--builtin-schema", "vendor.github-workflows", str(bad)],
                         capture_output=True, text=True)
    assert out.returncode == 1


def test_workflow_runs_the_suite_the_gate_and_stores_artifacts():
    from ruamel.yaml import YAML  # a dependency of check-jsonschema
    _check_jsonschema()
    wf = YAML(typ="safe").load(WORKFLOW.read_text())
    cpu, gpu = wf["jobs"]["cpu"], wf["jobs"]["gpu"]
    run = "\n".join(s.get("run", "") for s in cpu["steps"])
    assert "make venv" in run and "make venv" in (ROOT / "README.md").read_text()  # the README's install command
    assert cpu["env"]["TORCH_INDEX_URL"].endswith("/whl/cpu")  # CPU build on hosted runners
    assert "--bench-suite cpu --benchmark-json bench.json" in run
    assert "routerbench report bench.json" in run
    assert "routerbench gate bench.json --rules .ci/gate.toml" in run and "GITHUB_STEP_SUMMARY" in run
    assert '"$rc" -eq 3' in run  # inconclusive is a warning
    uploads = [s for s in cpu["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert uploads and "bench.json" in uploads[0]["with"]["path"]
    assert gpu["runs-on"] == ["self-hosted", "gpu"]
    assert "--bench-suite gpu" in "\n".join(s.get("run", "") for s in gpu["steps"])
    assert (ROOT / ".ci" / "gate.toml").is_file()
