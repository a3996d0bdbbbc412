"""The chart ships the generated CRDs unchanged (charts/sync_crds.sh copies them)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_chart_crds_are_the_generated_ones() -> None:
    generated = {p.name: p.read_text() for p in (ROOT / "crds").glob("*.yaml")}
    shipped = {p.name: p.read_text() for p in (ROOT / "charts" / "kubeinfer" / "crds").glob("*.yaml")}
    assert generated, "crds/ is empty: run `make crds`"
    assert shipped == generated, "charts/kubeinfer/crds differs from crds/: run `bash charts/sync_crds.sh`"
