"""Rendering a report: one list of :class:`Section` s as ``report.md`` and as a self-contained
``report.html`` (inline CSS, figures as base64 PNG data URIs), so both documents say the same
thing; numbers formatted under the report's column headers (:data:`COLUMN_STYLE`). What the
sections hold is :mod:`reports.sections`.
"""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd

from . import floor, impls, paired, paper_baseline, sentences, summary
from .frame import SHAPE_COLS

#: Report header and number format of each measured column.
COLUMN_STYLE = {
    "median_ms": ("median step (ms)", "{:.3f}"), "iqr_ms": ("IQR (ms)", "{:.3f}"),
    "n": ("repeats", None), "prenorm_ms": ("prenorm (ms)", "{:.3f}"),
    "overhead_pct": ("overhead vs prenorm (%)", "{:+.1f}"), "gflop_fwd": ("fwd GFLOP", "{:.3f}"),
    "router_flop_pct": ("router FLOP (%)", "{:.2f}"), "saved_mib": ("saved act. (MiB)", "{:.2f}"),
    "saved_ratio": ("saved / prenorm", "{:.2f}"), "router_state_mib": ("router state (MiB)",
                                                                      "{:.3f}"),
    "state_ratio": ("state / prenorm", "{:.2f}"),
    "peak_mib": ("peak alloc. (MiB)", "{:.1f}"), "ops_fwd": ("ops fwd", "{:,.0f}"),
    "ops_bwd": ("ops bwd", "{:,.0f}"), "ops_ratio": ("ops / prenorm", "{:.2f}"),
    "params_matrix": ("matrix params", "{:,.0f}"),
    "params_router": ("router params", "{:,.0f}"), "target_loss": ("target (nats)", "{:.4f}"),
    "time_to_target": ("time to target (s)", sentences.fmt_sig),
    "steps_to_target": ("steps", None),
    "tokens_to_target": ("tokens", "{:,.0f}"), "token_budget": ("token budget", "{:,.0f}"),
    "loss_at_token_budget": ("loss at budget (nats)", "{:.4f}"),
    "final_val_loss": ("final val loss", "{:.4f}"), "final_step": ("final step", None),
    "median_time_to_target": ("median time to target (s)", sentences.fmt_sig),
    "min_s": ("min (s)", sentences.fmt_sig), "max_s": ("max (s)", sentences.fmt_sig),
    "median_loss_at_budget": ("median loss at budget", "{:.4f}"),
    "tokens_per_s": ("tokens/s", "{:,.0f}"), "model_gflop": ("model GFLOP/step", "{:.3f}"),
    "model_tflops": ("model TFLOP/s", "{:.3f}"), "device_name": ("device name", None),
    "peak_tflops": ("peak BF16 TFLOP/s", "{:.0f}"), "mfu_pct": ("MFU (%)", "{:.2f}"), "hfu_pct": ("HFU (%, dispatched FLOPs)", "{:.2f}"),
    "train_time": ("training clock (s)", sentences.fmt_sig),
    "compile_time": ("compile time (s)", "{:.2f}"), "graphs_fwd": ("fwd graphs", "{:.0f}"),
    "graphs_bwd": ("bwd graphs", "{:.0f}"), "recompiles": ("recompiles", "{:.0f}"),
    "graph_breaks": ("graph breaks", "{:.0f}"), "fxgraph_cache_hit": ("FX cache hits", "{:.0f}"),
    "fxgraph_cache_miss": ("FX cache misses", "{:.0f}"), "aot_cache_hit": ("AOT cache hits", "{:.0f}"),
    "aot_cache_miss": ("AOT cache misses", "{:.0f}"),
}
COLUMN_STYLE.update(paired.COLUMN_STYLE)  # headers of the paired-timing table
COLUMN_STYLE.update(floor.COLUMN_STYLE)
COLUMN_STYLE.update(summary.COLUMN_STYLE)
COLUMN_STYLE.update(impls.COLUMN_STYLE)
COLUMN_STYLE.update(paper_baseline.COLUMN_STYLE)
#: Case columns that, when equal in every row, move into a sentence above the table.
_COMMON = ("run_id", "options", "impl", "backend", "compile_mode", "compile_scope", "mode", "workload",
           *SHAPE_COLS, "device", "seed", "interval")


def compact_noise(reasons: str) -> str:
    """The ``noisy`` cell as a table shows it: each reading that crossed its threshold with its
    value, the threshold left out, the readings of a partner (``prenorm: …``) after the case's
    own, each once (``"iqr_rel 0.310 > 0.15; prenorm: cpu_pressure 0.830 > 0.2"`` ->
    ``"iqr_rel .31; prenorm cpu_pressure .83"``). The full reasons stay in ``paired.csv`` and
    the Warnings section names the thresholds: a case's row is one line, not 240 px tall."""
    groups: dict[str, dict[str, str]] = {}
    for part in str(reasons).split(";"):
        who, _, reading = part.strip().rpartition(": ")
        words = reading.split()
        if not words:
            continue
        try:
            value = f"{float(words[1]):.2f}".replace("0.", ".", 1) if len(words) > 1 else ""
        except ValueError:
            value = ""
        groups.setdefault(who, {}).setdefault(words[0], f"{words[0]} {value}".strip())
    return "; ".join((f"{who} " if who else "") + ", ".join(g.values()) for who, g in groups.items())


def _flag(reasons: str) -> str:
    """The summary's ``<backend>_noisy`` cell as shown: ``yes`` (the readings are in the paired
    tables and Warnings; the summary table stays within the first screen's width)."""
    return "yes"


#: Text columns shown in a shorter form than the CSV keeps (column -> function of the cell).
DISPLAY = {"noisy": compact_noise, "eager_noisy": _flag, "compile_noisy": _flag}

CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.88em}
th,td{border:1px solid #ccc;padding:.25em .55em;text-align:right}th{background:#f2f2f2}
td:first-child,th:first-child{text-align:left}img{max-width:100%}h1{font-size:1.5em}
.toc{background:#f7f7f7;padding:.4em 1em;margin:1em 0}.toc ol{margin:.3em 0}
h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em}.note{color:#555}
.wide{overflow-x:auto;max-width:100%}th{vertical-align:bottom}td{white-space:nowrap}"""


@dataclass
class Section:
    """One report section: a heading and blocks ``("text", str)``, ``("subtitle", str)``,
    ``("table", DataFrame)`` or ``("figure", Path, caption)``."""

    title: str
    blocks: list[tuple] = field(default_factory=list)


def _cell(value, fmt: str | Callable[[float], str] | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return "–"
    if isinstance(value, str):
        return value
    if fmt:
        return fmt(value) if callable(fmt) else fmt.format(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def display_frame(frame: pd.DataFrame, drop: Iterable[str] = (),
                  move_common: bool = True) -> tuple[pd.DataFrame, list[str]]:
    """A table ready to print: numbers formatted as strings under report headers, empty columns
    dropped and, with ``move_common``, case columns equal in every row dropped too.

    Returns:
        (the formatted frame, the names of the columns equal in every row that were dropped).
    """
    frame = frame.drop(columns=[c for c in drop if c in frame])
    empty = [c for c in frame if frame[c].isna().all() or (frame[c].astype(str) == "").all()]
    common = [c for c in _COMMON if move_common and c in frame and c not in empty
              and len(frame) > 1 and frame[c].astype(str).nunique() == 1]
    frame = frame.drop(columns=empty + common)
    out = pd.DataFrame({COLUMN_STYLE.get(c, (c,))[0]:
                        [_cell(DISPLAY[c](v) if c in DISPLAY and isinstance(v, str) and v else v,
                               COLUMN_STYLE.get(c, (c, None))[1]) for v in frame[c]]
                        for c in frame})
    return out, common


def table_blocks(frame: pd.DataFrame, empty_text: str, drop: Iterable[str] = (),
                  split: Iterable[str] = ()) -> list:
    """A sentence with the columns common to all rows, then the table, or one sub-table per
    value of the ``split`` columns that vary (e.g. one per mode and backend)."""
    if frame.empty:
        return [("text", empty_text)]
    frame = frame.drop(columns=[c for c in drop if c in frame])
    shown, common = display_frame(frame)
    blocks = [("text", "Common to all rows: " + ", ".join(
        f"{c} {_cell(frame[c].iloc[0], None)}" for c in common) + ".")] if common else []
    keys = [c for c in split if c in frame and c not in common]
    if not keys:
        return blocks + [("table", shown)]
    for values, group in frame.groupby(keys, sort=False):
        title = " · ".join(str(v) for v in values if str(v))
        if title:
            blocks.append(("subtitle", title))
        blocks.append(("table", display_frame(group, common + keys, move_common=False)[0]))
    return blocks


def render_markdown(title: str, sections: list[Section], out_dir: Path) -> str:
    """Markdown text; figures as image links relative to ``out_dir``."""
    lines = [f"# {title}", ""]
    for s in sections:
        lines += [f"## {s.title}", ""]
        for kind, *rest in s.blocks:
            if kind == "text":
                lines += [rest[0], ""]
            elif kind == "subtitle":
                lines += [f"### {rest[0]}", ""]
            elif kind == "table":  # a "|" (case keys use it) or a newline would break the row
                cells = rest[0].map(lambda v: v.replace("|", "\\|").replace("\n", " "))
                lines += [cells.to_markdown(index=False, disable_numparse=True), ""]
            else:
                path, caption = rest
                rel = Path(path).resolve().relative_to(Path(out_dir).resolve())
                lines += [f"![{caption}]({rel.as_posix()})", ""]
    return "\n".join(lines)


def render_html(title: str, sections: list[Section]) -> str:
    """A self-contained HTML page: inline CSS, tables via ``DataFrame.to_html``, figures as
    base64 PNG data URIs."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>", '<nav class="toc"><strong>Contents</strong><ol>']
    parts += [f'<li><a href="#s{i}">{html.escape(s.title)}</a></li>' for i, s in enumerate(sections, 1)]
    parts.append("</ol></nav>")
    for i, s in enumerate(sections, 1):
        parts.append(f'<h2 id="s{i}">{html.escape(s.title)}</h2>')
        for kind, *rest in s.blocks:
            if kind == "text":
                parts.append(f'<p class="note">{html.escape(rest[0])}</p>')
            elif kind == "subtitle":
                parts.append(f"<h3>{html.escape(rest[0])}</h3>")
            elif kind == "table":
                # a table wider than the page scrolls in its own box, never cut at the right
                parts.append('<div class="wide">' + rest[0].to_html(index=False, border=0, escape=True)
                             + "</div>")
            else:
                path, caption = rest
                data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
                parts.append(f'<figure><img alt="{html.escape(caption)}" '
                             f'src="data:image/png;base64,{data}"><figcaption>'
                             f"{html.escape(caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)
