"""Helpers the report tests share."""

from __future__ import annotations


def row(frame, **where):
    """The one row of ``frame`` whose columns equal ``where`` (fails when there is not exactly one)."""
    sel = frame
    for k, v in where.items():
        sel = sel[sel[k] == v]
    assert len(sel) == 1, f"{where}: {len(sel)} rows"
    return sel.iloc[0]
