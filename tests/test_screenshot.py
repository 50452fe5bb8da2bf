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
    from test_noise_report import _rows_b  # a small paired eager/compiled fixture (tests/ is on sys.path)

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


#: Measured in the page by Chromium: elements whose right edge passes the viewport outside a
#: scrolling box, the tallest table row, and each image's shown width over its own (1 = not
#: scaled down). Written into the DOM, which ``--dump-dom`` prints after the script ran.
LAYOUT_PROBE = """<script>
window.addEventListener('load', () => {
  const vw = document.documentElement.clientWidth;
  const cut = [...document.querySelectorAll('p, h2, h3, table, figure, img, nav')]
    .filter(e => !e.closest('.wide') && e.getBoundingClientRect().right > vw + 1)
    .map(e => e.tagName + ':' + (e.textContent || '').slice(0, 40));
  const rows = [...document.querySelectorAll('tbody tr')].map(r => r.getBoundingClientRect().height);
  const heads = [...document.querySelectorAll('thead tr')].map(r => r.getBoundingClientRect().height);
  const tall = [...document.querySelectorAll('tbody tr')].filter(r => r.getBoundingClientRect().height > 40)
    .map(r => r.textContent.slice(0, 120));
  const scale = [...document.querySelectorAll('img')].map(i => i.getBoundingClientRect().width / i.naturalWidth);
  const first = document.querySelector('.wide');  // the summary's table: the first screen
  const first_scrolls = first ? first.scrollWidth > first.clientWidth + 1 : null;
  const out = document.createElement('pre');
  out.id = 'layout';
  out.textContent = JSON.stringify({vw, cut, max_row: Math.max(0, ...rows), max_head: Math.max(0, ...heads), tall, min_scale: Math.min(1, ...scale),
                                    imgs: scale.length, height: document.documentElement.scrollHeight, first_scrolls});
  document.body.appendChild(out);
});
</script>"""


def _noisy_wide_run(d: Path) -> Path:
    """Thirteen routers paired with prenorm in two shapes, every case's timing noisy on four
    readings (the page of a busy machine: a wide paired table, a long ``noisy`` column)."""
    from harness.rundir.writer import RunWriter
    routers = ["block_attnres", "denseformer", "dhc", "full_attnres", "haares", "layerscale", "mhc",
               "rezero", "shc", "wav_v1"]
    with RunWriter(d, "busy", "s", base={"device": "cpu"}) as w:
        for dm in (32, 64):
            with w.unit([f"g{dm}"], kind="group") as u:
                for k, router in enumerate(["prenorm", *routers]):
                    key = f"{router}|eager|{dm}"
                    common = dict(case_key=key, router=router, impl="naive", backend="eager", mode="fwd_bwd",
                                  workload="decoder", d_model=dm, n_layers=4, n_heads=2, seq_len=8,
                                  batch_size=2, dtype="float32", seed=0, attempt=1)
                    for i in range(8):
                        u.write(**common, metric="step_time", value=(1 + 0.1 * k) * (1 + 0.3 * (i % 2)),
                                unit="ms", repeat=i, pair=i)
                    for metric, value in (("cpu_util", 0.21), ("cpu_pressure", 0.83), ("iqr_rel", 0.31),
                                          ("ci_width_rel", 0.44)):
                        u.write(**common, metric=metric, value=value, unit="ratio")
    return d


@pytest.mark.skipif(BROWSER is None, reason="no Chromium on PATH (Debian: apt install chromium)")
def test_a_busy_machines_report_fits_the_page_in_chromium(tmp_path):
    """At 1280 px: no text, table or figure cut at the right (wide tables scroll in their own
    box, the summary's needs none), no table row taller than two lines (a header five) (the ``noisy`` column is compact), figures not
    scaled below 90 % of their pixels, and the noisy reasons still in full in paired.csv."""
    import json
    out = build_report([_noisy_wide_run(tmp_path / "run")], tmp_path / "report")
    page = out["report.html"].read_text(encoding="utf-8")
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", LAYOUT_PROBE + "</body>"), encoding="utf-8")
    res = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,1500",
                          "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=180)
    dom = res.stdout
    assert '<pre id="layout">' in dom, res.stderr[-2000:]
    m = json.loads(dom.split('<pre id="layout">', 1)[1].split("</pre>", 1)[0].replace("&quot;", '"'))
    assert m["cut"] == [] and m["vw"] <= 1280
    assert m["first_scrolls"] is False, m  # the summary's table fits the page: no scrolling on the first screen
    assert m["imgs"] >= 3 and m["min_scale"] >= 0.9, m
    assert m["max_row"] <= 40 and m["max_head"] <= 110, m  # px: 2 lines a row, 5 a header
    csv = (tmp_path / "report" / "paired.csv").read_text(encoding="utf-8")
    assert "cpu_pressure 0.830 > 0.2" in csv and "cpu_pressure .83" in page
    import re  # every summary sentence of this all-noisy run gives its ratio and CI, flagged, none withheld
    md = (tmp_path / "report" / "report.md").read_text(encoding="utf-8").split("## Warnings")[0]
    said = [line for line in md.splitlines() if " over prenorm at " in line]
    assert len(said) == 10, said
    shape = re.compile(r": [+\u2212]\d+ % eager \[CI \u2212?\d+ to \+?\d+ %\].*\(noisy group\)\.$")
    assert all(shape.search(line) for line in said), said


def _png_dpi(path: Path) -> float:
    """The dots per inch a PNG was saved at (its pHYs chunk, pixels per metre)."""
    data = path.read_bytes()
    at = data.index(b"pHYs") + 4
    return int.from_bytes(data[at:at + 4], "big") * 0.0254


def test_figures_print_at_full_size_and_one_run_has_no_run_legend(tmp_path):
    """Every figure of a 10-router, two-shape report is at most the page's 1,200 px and saved
    at ≥ 100 dpi (its text not shrunk to fit: the paired grid was once 34 dpi, 5 px text); the
    paired grid names its run in the title, and draws a run legend only for two runs."""
    from reports import load_frame
    from reports.paired import paired_ratio_grid, paired_ratio_table
    from reports.plotting import MAX_WIDTH_PX
    one = _noisy_wide_run(tmp_path / "a")
    out = build_report([one], tmp_path / "report")
    pngs = sorted(p for p in out.values() if str(p).endswith(".png"))
    assert any(p.name == "paired_ratios.png" for p in pngs)
    sizes = {p.name: (png_size(p)[0], round(_png_dpi(p))) for p in pngs}
    assert all(w <= MAX_WIDTH_PX and dpi >= 100 for w, dpi in sizes.values()), sizes
    fig = paired_ratio_grid(paired_ratio_table(load_frame([one]), n_boot=50))
    assert fig.legends == [] and "(run busy)" in fig._suptitle.get_text()
    # a second run of the same cases: both runs side by side, each in the legend
    import shutil as sh
    sh.copytree(one, tmp_path / "b")
    (tmp_path / "b" / "records.jsonl").write_text(
        (one / "records.jsonl").read_text(encoding="utf-8").replace('"busy"', '"again"'), encoding="utf-8")
    fig = paired_ratio_grid(paired_ratio_table(load_frame([one, tmp_path / "b"]), n_boot=50))
    assert [[t.get_text() for t in lg.get_texts()] for lg in fig.legends] == [["again", "busy"]]
