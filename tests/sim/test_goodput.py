"""Pollux's goodput model (hetflow.scheduling.goodput) against Sia's own simulator's code.

``goodput-fits.json`` holds what the artifact's ``goodput.py`` (autograd gradient, scipy 1.11)
fitted to 15 sets of profiled points and the batch size it then chose for one placement
(tests/fixtures/sia/README.md); hetflow's fit (a written-out gradient, this scipy) must land on
the same parameters and the same choice.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.optimize

from hetflow.scheduling.goodput import GoodputModel, GradParams, PerfParams, _objective, fit_perf_params

CASES = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "sia" / "goodput-fits.json").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[f"{len(c['points'])}pts-{i}" for i, c in enumerate(CASES)])
def test_fit_and_choice_match_the_reference(case) -> None:
    cols = [np.array(c, dtype=float) for c in zip(*case["points"])]
    got = fit_perf_params(*cols)
    ref = PerfParams(*case["params"])
    # the same optimum: the objective agrees to 1e-6 and so do the parameters it pins down
    assert _objective(np.array(got), *cols)[0] == pytest.approx(_objective(np.array(ref), *cols)[0], abs=1e-6)
    np.testing.assert_allclose(got, ref, rtol=2e-3, atol=1e-6)
    model = GoodputModel(got, GradParams(0.02, 0.3), 32)
    good, atomic, accum = model.optimize(2, 8, 512, (4, 64))
    assert (atomic, accum) == tuple(case["optimize_2x8"][1:])
    assert good == pytest.approx(case["optimize_2x8"][0], rel=1e-3)


def test_objective_gradient_is_the_derivative() -> None:
    cols = [np.array(c, dtype=float) for c in zip(*CASES[-1]["points"])]
    x = np.array([0.2, 0.01, 0.3, 0.02, 0.1, 0.01, 1.5])
    _, grad = _objective(x, *cols)
    numeric = scipy.optimize.approx_fprime(x, lambda y: _objective(y, *cols)[0], 1e-6)
    np.testing.assert_allclose(grad, numeric, rtol=1e-3, atol=1e-3)


def test_efficiency_and_throughput_follow_the_model() -> None:
    m = GoodputModel(PerfParams(0.05, 0.01, 0.1, 0.01, 0.05, 0.005, 1.0), GradParams(sqr=1.0, var=4.0), 32)
    # at the initial batch every example counts fully; a batch twice as large buys (4+1)/(2+1) iterations' worth
    assert float(m.efficiency(32)) == pytest.approx(1.0)
    assert float(m.efficiency(64)) == pytest.approx((5 / 3) / 2)
    # one replica alone: no exchange (gamma 1 adds the ~0 network time): batch / (compute)
    assert float(m.throughput(1, 1, 32, 0)) == pytest.approx(32 / (0.05 + 0.32), rel=1e-6)
    # more replicas across nodes pay the exchange
    assert float(m.throughput(2, 8, 32, 0)) < 8 * float(m.throughput(1, 1, 32, 0))
    # the choice never leaves the per-replica range, and a noisier gradient picks a larger batch
    _, atomic, accum = m.optimize(1, 4, 1024, (8, 64))
    assert 8 <= atomic <= 64
    noisy = GoodputModel(m.perf, GradParams(sqr=1.0, var=400.0), 32)
    _, n_atomic, n_accum = noisy.optimize(1, 4, 1024, (8, 64))
    assert n_atomic * (n_accum + 1) > atomic * (accum + 1)
