"""What every figure of a report shares: saving a PNG at most :data:`MAX_WIDTH_PX` wide (with the
CSV of its numbers beside it), one colour per variant or per router across a report, titles that
name the device and the shape, panel grids with one legend, and ratio and measured-value axes.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only; never open a window (CI, SSH, CUDA boxes without a display)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from routers import BASELINE, impls  # noqa: E402

from .frame import options_without_impl  # noqa: E402,F401

DPI = 110


#: Widest PNG a report embeds, in pixels (the HTML page is 1,200 px wide).
MAX_WIDTH_PX = 1200


def png_size(path: Path | str) -> tuple[int, int]:
    """(width, height) in pixels of a PNG file, from its IHDR chunk."""
    head = Path(path).read_bytes()[16:24]
    return int.from_bytes(head[:4], "big"), int.from_bytes(head[4:], "big")


def save_png(fig: plt.Figure, path: Path | str, dpi: int = DPI) -> Path:
    """Save ``fig`` (tight bounding box) at ``dpi``, lowered when needed so the image is at most
    :data:`MAX_WIDTH_PX` wide, and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    for _ in range(6):  # text snaps to whole pixels, so the width is not linear in the dpi
        width = png_size(path)[0]
        if width <= MAX_WIDTH_PX:
            break
        dpi *= min(MAX_WIDTH_PX / width, 0.97)
        fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return path


def save_named(fig: plt.Figure, out_dir: Path | str, name: str) -> Path:
    """``fig`` saved as ``<out_dir>/<name>.png`` (:func:`save_png`)."""
    return save_png(fig, Path(out_dir) / f"{name}.png")


def save_with_data(fig: plt.Figure, out_dir: Path | str, name: str, data: pd.DataFrame) -> Path:
    """The PNG and, beside it with the same stem, the CSV of the numbers it draws."""
    path = save_named(fig, out_dir, name)
    data.to_csv(path.with_suffix(".csv"), index=False)
    return path


def variant_hue(df: pd.DataFrame, data: pd.DataFrame) -> dict:
    """Hue arguments for ``data``: one colour per variant of the whole frame ``df``, so a router
    keeps its colour in every figure of a report; prenorm first."""
    variants = sorted(df["variant"].unique(), key=lambda v: (not v.startswith(BASELINE), v))
    colors = sns.color_palette("tab10" if len(variants) <= 10 else "husl", len(variants))
    present = set(data["variant"])
    return {"hue": "variant", "hue_order": [v for v in variants if v in present],
            "palette": dict(zip(variants, colors))}


def measured_ticks(g, values, log2: bool) -> None:
    """Ticks at the measured values only (widths and depths are a few powers of two)."""
    values = sorted(float(v) for v in pd.unique(values))
    for ax in g.axes.flat:
        if log2:
            ax.set_xscale("log", base=2)
        ax.set_xticks(values, [f"{v:g}" for v in values])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def backend_label(frame: pd.DataFrame) -> pd.Series:
    """The backend of each row, with its compile mode and scope where it has them
    (``compile:default:layer``)."""
    label = frame["backend"].where(frame["compile_mode"] == "", frame["backend"] + ":" + frame["compile_mode"])
    if "compile_scope" in frame:
        label = label.where(frame["compile_scope"] == "", label + ":" + frame["compile_scope"])
    return label


def facet(frame: pd.DataFrame, col: str) -> str | None:
    """Use ``col`` as a facet only when it takes several values."""
    return col if frame[col].nunique() > 1 else None


def device_title(df: pd.DataFrame) -> str:
    """The device name(s) for a title: ``device_name`` (added by :func:`reports.render.
    build_report` from each run's manifest) where known, else the ``device`` column."""
    for col in ("device_name", "device"):
        if col in df:
            names = [n for n in dict.fromkeys(df[col].astype(str)) if n and n != "nan"]
            if names:
                return ", ".join(names)
    return "unknown device"


#: Tick candidates of a ratio axis (log scale): dense near 1, where the comparisons sit.
RATIO_TICKS = (0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 1.1, 1.2, 1.3, 1.5, 1.75, 2,
                2.5, 3, 4, 5, 7, 10)


#: Shape columns of a title and their letters: "d=32 L=4 H=2 T=8 B=2 float32".
SHAPE_TEXT = (("d_model", "d"), ("n_layers", "L"), ("n_heads", "H"), ("seq_len", "T"),
               ("batch_size", "B"), ("dtype", ""))


LETTER = dict(SHAPE_TEXT)


class ImplStyle(Mapping):
    """impl name → one attribute of its registered :class:`routers.impls.Impl` (``line``,
    ``marker``), read at lookup; a name the registry does not know, or an impl that declares none,
    is missing, so ``.get(impl, default)`` gives the figure's declared default."""

    def __init__(self, attr: str) -> None:
        self.attr = attr

    def __getitem__(self, name: str) -> str:
        value = impls.attribute(name, self.attr)
        if value is None:
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter([n for n in impls.names() if impls.attribute(n, self.attr) is not None])

    def __len__(self) -> int:
        return len(list(iter(self)))


#: Line style of an implementation: a router's impls share its colour and differ in dashes
#: (``Impl.line``: naive solid, two_phase dashed, lean dotted).
IMPL_LINES = ImplStyle("line")
#: Marker of an implementation (``Impl.marker``).
IMPL_MARKERS = ImplStyle("marker")


#: What a panel of a cost figure never pools: the run (maybe another machine), the setting, the
#: seed. Shape columns other than the figure's own axes are added by each figure.
PANEL_KEYS = ("run_id", "mode", "workload", "backend", "compile_mode", "compile_scope", "device", "seed")


def shape_text(t: pd.DataFrame, skip: tuple = ()) -> str:
    """The shape of ``t`` for a title, ``"T=8 B=2 float32"``; a column with several values as
    ``"T=8/16"``; the columns in ``skip`` (a figure's axes) left out."""
    parts = []
    for col, letter in SHAPE_TEXT:
        if col in skip or col not in t:
            continue
        values = [v for v in pd.unique(t[col]) if str(v) not in ("", "nan")]
        if values:
            text = "/".join(str(v) for v in sorted(values))
            parts.append(f"{letter}={text}" if letter else text)
    return " ".join(parts)


def suptitle(fig: plt.Figure, *lines: str) -> None:
    """The figure's title, each line wrapped to the width of the figure (device names can be
    long), so that the title never sets the width of the image."""
    chars = int(fig.get_size_inches()[0] * 13)
    fig.suptitle("\n".join(textwrap.fill(line, chars) for line in lines if line), fontsize=10)


def family(t: pd.DataFrame) -> pd.Series:
    """Router and options without the impl: the colour key that keeps a router's impls one hue."""
    return t["router"] + t["options"].map(lambda o: f" ({o})" if (o := options_without_impl(o)) else "")


def variant_labels(df: pd.DataFrame) -> dict[str, str]:
    """Each ``variant`` of ``df`` -> its label in a figure or table: the router, its impl in
    brackets where the variant shows it or the options name it, and its other options, each
    once (``haares [two_phase] (n_blocks=4)``, never ``haares [two_phase] (impl=two_phase)``)."""
    out = {}
    for router, impl, options, variant in (df[["router", "impl", "options", "variant"]]
                                           .drop_duplicates("variant").itertuples(index=False)):
        named = str(variant).startswith(f"{router} [{impl}]") or "impl=" in str(options)
        rest = options_without_impl(options)
        out[variant] = router + (f" [{impl}]" if named and impl else "") + (f" ({rest})" if rest else "")
    return out


def family_palette(df: pd.DataFrame) -> dict:
    """One colour per router (with its options) of the whole frame, prenorm first."""
    families = sorted(set(family(df)), key=lambda f: (not f.startswith(BASELINE), f))
    colors = sns.color_palette("tab10" if len(families) <= 10 else "husl", len(families))
    return dict(zip(families, colors))


#: Inches right of the panels kept for the legend of :func:`figure_legend`.
LEGEND_IN = 2.6


#: Inches: a panel wider than this is drawn alone on its row.
WIDE_PANEL_IN = 6.0


def panel_grid(n: int, width: float = 4.6, height: float = 3.4) -> tuple[plt.Figure, list]:
    """A figure of ``n`` panels, three to a row (one to a row when a panel is wider than
    :data:`WIDE_PANEL_IN`, so the image is not scaled below :data:`DPI`), and room for a legend
    right of them. ``width`` and ``height`` are one panel's, in inches."""
    ncols = 1 if width > WIDE_PANEL_IN else min(3, n)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols + LEGEND_IN, height * nrows),
                             squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def figure_legend(fig: plt.Figure, axes: list) -> None:
    """One legend right of the first row of panels (below the title), each label once."""
    seen: dict = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    axes[min(2, len(axes) - 1)].legend(list(seen.values()), list(seen), loc="upper left",
                                       bbox_to_anchor=(1.02, 1), frameon=False, fontsize=8)


def x_ticks(ax, values, log2: bool) -> None:
    """Ticks at the measured values only (widths and depths are a few powers of two)."""
    values = sorted(float(v) for v in pd.unique(values))
    if log2:
        ax.set_xscale("log", base=2)
    ax.set_xticks(values, [f"{v:g}" for v in values])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def ratio_axis(ax, axis: str = "y") -> None:
    """A log ratio axis (``axis``: ``"x"`` or ``"y"``) with labelled ticks wherever the data lie, 1
    always among them: an interval of a few noisy pairs can span 100×, and 0.9× must stay
    readable beside it."""
    getattr(ax, f"set_{axis}scale")("log")
    lo, hi = getattr(ax, f"get_{axis}lim")()
    wide = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
    ticks = [t for t in (wide if hi / lo > 10 else RATIO_TICKS) if lo <= t <= hi]
    while len(ticks) > 9:
        ticks = ticks[::2] if 1 in ticks[::2] else ticks[1::2]
    getattr(ax, f"set_{axis}ticks")(ticks, [f"{t:g}" for t in ticks])
    getattr(ax, f"{axis}axis").set_minor_locator(matplotlib.ticker.NullLocator())


def shared_ratio_axes(axes, axis: str = "y") -> None:
    """Every panel of ``axes`` on one log ratio axis (:func:`ratio_axis`) over the union of their
    ranges, with 1 inside it, so that panels read against each other at a glance."""
    axes = [ax for ax in axes if ax.get_visible()]
    if not axes:
        return
    for ax in axes:
        getattr(ax, f"set_{axis}scale")("log")
    lims = [getattr(ax, f"get_{axis}lim")() for ax in axes]
    lo, hi = min(min(a for a, _ in lims), 0.95), max(max(b for _, b in lims), 1.05)
    for ax in axes:
        getattr(ax, f"set_{axis}lim")(lo, hi)
        ratio_axis(ax, axis)


def dodge(x: pd.Series, k: int, n: int, log2: bool, span: float) -> np.ndarray:
    """``x`` of line ``k`` of ``n`` shifted a little, so that error bars of one x stay apart."""
    off = k - (n - 1) / 2
    x = x.astype(float).to_numpy()
    return x * 2 ** (0.035 * off) if log2 else x + 0.012 * span * off


def panel_label(t: pd.DataFrame, keys: list[str], always: tuple = ()) -> pd.Series:
    """Mode and backend always, then each key (and the ``always`` shape columns) that varies."""
    label = t["mode"] + " · " + backend_label(t)
    for col in [*keys, *always]:
        if col in ("mode", "backend", "compile_mode", "compile_scope") or col not in t:
            continue
        if col in always or t[col].nunique() > 1:
            name = f"{LETTER[col]}=" if LETTER.get(col) else "" if col == "dtype" else f"{col} "
            label = label + " · " + name + t[col].astype(str)
    return label


def largest(t: pd.DataFrame, keys: list[str], x: str, fixed: str) -> pd.DataFrame:
    """The rows of each group of ``keys`` at its largest ``fixed``, groups with 2+ values of
    ``x`` there; empty when none."""
    kept = []
    for _, g in t.groupby(keys, dropna=False, sort=False):
        g = g[g[fixed] == g[fixed].max()]
        if g[x].nunique() >= 2:
            kept.append(g)
    return pd.concat(kept) if kept else t.iloc[:0]


def fixed_text(t: pd.DataFrame, fixed: str) -> str:
    """How a title names the shape column ``fixed`` a figure holds at its largest value."""
    values = sorted(pd.unique(t[fixed]))
    return (f"{LETTER[fixed]}={values[0]} (the largest measured)" if len(values) == 1
            else f"{fixed} at the largest of each panel")
