"""The SM-limit campaign's bookkeeping (benchmarks/sm_campaign.py) on one small
scenario: the windows it reads add up, targets follow from the unlimited run, every
class it ran is reported. Nothing here passes or fails on the controller's accuracy:
that is the benchmark's figure."""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path
from types import ModuleType

import pytest

from .conftest import ROOT, Built


@pytest.fixture(scope="module")
def campaign() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sm_campaign",
                                                  ROOT / "benchmarks/sm_campaign.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sm_campaign"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_water_fill(campaign: ModuleType) -> None:
    assert campaign.water_fill(100.0, [50.0, 50.0], [30.0, 90.0]) == ([30.0, 70.0],
                                                                      [True, False])
    # a 1-process and a 3-process container asking for 60 and 70: the second is held
    # at 70, the first gets the rest
    assert campaign.water_fill(100.0, [25.0, 75.0], [60.0, 70.0]) == ([30.0, 70.0],
                                                                      [False, True])
    alloc, capped = campaign.water_fill(90.0, [10.0, 20.0, 30.0], [100.0] * 3)
    assert capped == [False] * 3 and alloc == pytest.approx([15.0, 30.0, 45.0])


def test_draw_is_seeded_and_sized(campaign: ModuleType) -> None:
    import random

    a = campaign.draw(random.Random(3), 16, list(campaign.BY_NAME))
    assert a == campaign.draw(random.Random(3), 16, list(campaign.BY_NAME))
    assert {s.kernel for s in a} == set(campaign.BY_NAME)  # stratified: every class
    for s in a:
        if not s.cls.cpu_bound:  # the grid gives the class's device time on its SMs
            assert abs(s.kernel_ns - s.cls.ns) <= 8, s
        assert 1 <= len(s.limits) == len(s.procs) <= 4


def test_one_scenario(built: Built, tmp_path: Path, campaign: ModuleType,
                      capsys: pytest.CaptureFixture[str]) -> None:
    m = campaign
    sc = m.Scenario(sms=80, kernel="10us", limits=(30, 90), procs=(1, 2), policy="fixed",
                    sample_ms=50, blocks=80 * 16 + 1, block_ns=4950)
    assert sc.waves == 2 and sc.kernel_ns == 10_000
    b = m.Built(built.lib, built.fakes, built.drv)
    none = m.run(b, tmp_path, sc, "none", 1.2, 0.5)
    got = m.run(b, tmp_path, sc, "shim", 1.2, 0.5)
    for r in (none, got):
        assert len(r.shares) == 2 and len(r.shares[0]) == len(r.total) >= 5
        for j, t in enumerate(r.total):  # exact accounting: the device is never over 100 %
            assert t == pytest.approx(r.shares[0][j] + r.shares[1][j])
            assert min(r.shares[0][j], r.shares[1][j]) >= 0.0 and t <= 100.5
    # 10 us kernels from 3 processes keep the device busy without limits
    assert statistics.mean(none.total) >= 90.0, none.total
    tg, capped = m.targets(sc, none, None)
    assert sum(tg) == pytest.approx(sum(none.means()))
    for i, c in enumerate(capped):
        assert (tg[i] == sc.limits[i]) if c else (tg[i] < sc.limits[i])
    err = m.errors(sc, tg, capped, got.shares)
    assert [len(e[0]) for e in err] == [len(got.total)] * 2
    assert all(x >= 0 for e in err for x in [*e[0], e[1]])
    cs = [m.Container(sc, i, tg[i], capped[i], statistics.mean(got.shares[i]),
                      statistics.mean(none.shares[i]), err[i],
                      m.errors(sc, tg, capped, none.shares)[i], 1.0) for i in range(2)]
    row = m.summarise("10us", "fixed", cs)
    assert (row.scenarios, row.containers) == (1, 2) and row.judged is not None
    m.print_tables(cs)
    out = capsys.readouterr().out
    assert "10us" in out and "fixed" in out and out.count("kernel class") == 1
