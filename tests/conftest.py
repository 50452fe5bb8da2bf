"""Fixtures shared by the tests."""

from __future__ import annotations

import pytest

import workloads.decoder


@pytest.fixture
def no_models(monkeypatch):
    """Fail loudly if anything builds a decoder (errors must come first)."""
    def forbidden(*a, **k):
        raise AssertionError("a model was built before the bad option was reported")
    monkeypatch.setattr(workloads.decoder.Decoder, "__init__", forbidden)


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/golden/behaviour.json from this tree (make golden)")
