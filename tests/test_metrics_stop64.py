"""The summary table in steps: a figure just under 100 that rounds to 100 at two decimals."""

from __future__ import annotations

import pytest

from decodesched import load_trace, simulate
from decodesched import metrics as M


def row(rid, arrival, out):
    return dict(request_id=rid, arrival_step=arrival, prompt_len=1, max_new_tokens=out, priority=0,
                cache_hit=False, required_blocks=1, deadline_step=None, preemptible=True)


@pytest.mark.parametrize("value, shown", [(99.996, "100"), (-99.996, "-100"), (99.994, "99.99"), (100.4, "100"),
                                          (12.5, "12.50"), (7.0, "7")])
def test_steps_figure_has_no_decimals_from_100_on_even_after_rounding(value, shown):
    """99.996 steps printed "100.00": two decimals that no figure of 100 steps or more has in the same table."""
    m = simulate(load_trace([row(1, 0, 2), row(2, 0, 3)]), "fcfs", 4, 4).metrics
    m["e2e"]["p50"] = value
    assert dict(M.summary_rows(m))["e2e P50 (steps)"] == shown
