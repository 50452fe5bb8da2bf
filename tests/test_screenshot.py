"""A report page as a reader sees it: headless Chromium at 1280×1500 (skipped without Chromium)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from reports import build_report
from reports.plotting import png_size

ROOT = Path(__file__).resolve().parents[1]
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(BROWSER is None, reason="no Chromium on PATH (Debian: apt install chromium)")
def test_a_report_page_renders_in_headless_chromium(tmp_path):
    from test_noise import _rows_b  # a small paired eager/compiled fixture (tests/ is on sys.path)

    from harness.rundir.writer import RunWriter
    with RunWriter(tmp_path / "run", "r", "s", base={"device": "cpu"}) as w:
        with w.unit(["x"], kind="group") as u:
            for backend, ratio in (("eager", 1.2), ("compile", 1.1)):
                _rows_b(u, "prenorm", backend, [1.0, 1.1, 0.9, 1.0, 1.05, 0.95])
                _rows_b(u, "haares", backend, [ratio * x for x in (1.0, 1.1, 0.9, 1.0, 1.05, 0.95)])
    page = build_report([tmp_path / "run"])["report.html"]
    shot = tmp_path / "report.png"
    res = subprocess.run(["bash", str(ROOT / "scripts" / "screenshot_report.sh"), str(page), str(shot)],
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    assert png_size(shot) == (1280, 1500)
