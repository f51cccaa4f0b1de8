"""A researcher's sweep over days, with policies of their own: a resumed sweep never reuses rows of code edited
since, and a replay never runs code other than the model's (tests/test_api_stop62.py)."""

from __future__ import annotations

import importlib
import sys

import pytest

import decodesched
from decodesched import checkpoint, model
from decodesched.batch import Scenario
from decodesched.errors import UserError
from decodesched.policy import resolve_policy

# Requests of three priorities that all fit, one at a time, in 1 KV block and are never preempted: the order of
# the steps is the key's.
ROWS = {"request_id": [1, 2, 3, 4], "arrival_step": [0, 0, 0, 1], "prompt_len": [5, 2, 9, 4],
        "max_new_tokens": [3, 3, 2, 2], "priority": [0, 1, 2, 1], "cache_hit": [False] * 4,
        "required_blocks": [1] * 4, "deadline_step": [None] * 4, "preemptible": [False] * 4}

POLICY_FILE = '''
import numba
import {pkg}.sub
from decodesched import Policy


@numba.njit
def key(r, clock):
    return ({pkg}.sub.BOOST * r.priority, r.prompt_len)


@numba.njit
def priority(r, clock):
    return r.priority


MINE = Policy("mine", key=key, effective_priority=priority)
'''


def _load(folder, pkg: str, boost: int):
    """`folder`/pol.py:MINE, whose key reads `pkg`.sub.BOOST (a constant of a submodule), imported afresh as a new
    process would import it."""
    (folder / pkg).mkdir(parents=True, exist_ok=True)
    (folder / pkg / "__init__.py").write_text("")
    (folder / pkg / "sub.py").write_text(f"BOOST = {boost}\n")
    (folder / "pol.py").write_text(POLICY_FILE.format(pkg=pkg))
    for name in [n for n in sys.modules if n == pkg or n.startswith(pkg + ".")
                 or (getattr(sys.modules[n], "__file__", None) or "") == str(folder / "pol.py")]:
        del sys.modules[name]
    importlib.invalidate_caches()
    sys.path.insert(0, str(folder))
    try:
        return resolve_policy(f"{folder / 'pol.py'}:MINE")
    finally:
        sys.path.remove(str(folder))


def _events(result) -> list[dict]:
    return [{**e, "step": int(s)} for e, s in zip(result.timeline(), result.events["step"])]


def test_a_sweep_resumed_after_a_constant_of_a_submodule_was_edited_is_not_resumed_from(tmp_path):
    """`pkg.sub.BOOST` read by a policy is frozen by Numba as a global is; editing it between two runs of one sweep
    left `Policy.fingerprint` (the checkpoint's key) unchanged, so the rerun took every row of the old code from
    the checkpoint: a table of a policy that no longer exists.  Before, one level (`helpers.BOOST`) was followed."""
    trace = decodesched.load_trace(ROWS)
    where = tmp_path / "partial.jsonl"
    old = _load(tmp_path, "pkg62a", 1)
    checkpoint.run_local([trace], [Scenario(0, old, 1)], checkpoint_path=where, keep_checkpoint=True)
    assert where.exists()
    new = _load(tmp_path, "pkg62a", -1)
    assert checkpoint.read_checkpoint(where, checkpoint.sweep_key([trace], [Scenario(0, new, 1)]), 1) == {}
    assert checkpoint.read_checkpoint(where, checkpoint.sweep_key([trace], [Scenario(0, old, 1)]), 1)  # (old: yes)


HELPERS = '''
import numba

BOOST = {boost}


@numba.njit
def boost(r):
    return r.priority * BOOST
'''


@pytest.fixture
def helpers(tmp_path, monkeypatch):
    """A module `helpers62` of tmp_path, imported; edit(boost) rewrites it and reloads it, as a notebook user does
    after editing the file."""
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "helpers62.py"
    path.write_text(HELPERS.format(boost=3))
    sys.modules.pop("helpers62", None)
    module = importlib.import_module("helpers62")

    def edit(boost):
        path.write_text(HELPERS.format(boost=boost))  # (of another size when edited: Python reads it again)
        importlib.invalidate_caches()
        importlib.reload(module)

    yield module, edit
    sys.modules.pop("helpers62", None)


def _reloaded_policy(helpers, read: str):
    import numba

    scope = {"__name__": "__main__", "numba": numba, "h": helpers[0]}  # (a notebook's: the module imported as h)
    exec(f"@numba.njit\ndef key(r, clock):\n    return (-({read}), r.prompt_len)\n"
         "@numba.njit\ndef priority(r, clock):\n    return r.priority\n", scope)
    return decodesched.Policy("reloaded", key=scope["key"], effective_priority=scope["priority"])


@pytest.mark.parametrize("read, name", [("h.boost(r)", "h.boost"), ("h.BOOST * r.priority", "h.BOOST")])
def test_a_helper_module_reloaded_after_the_policy_compiled_is_one_line_not_a_stale_replay(helpers, read, name):
    """In a notebook: a policy reads `h.boost(r)` or `h.BOOST` of a module the user then edits and reloads
    (`importlib.reload`).  Numba keeps the old helper and value; the model reads the new.  Before, the replay
    silently ran the old code (its events differed from the model's); now it is one `UserError` naming the
    attribute, as for a global of the notebook itself."""
    policy = _reloaded_policy(helpers, read)
    helpers[1](-3)
    with pytest.raises(UserError, match=rf"policy 'reloaded': key: key was compiled with an earlier '{name}'"):
        decodesched.simulate(ROWS, policy, free_kv_blocks=1)


def test_a_helper_module_reloaded_unchanged_replays_as_the_model(helpers):
    """A reload that changes nothing (the same file run again) is no reason to refuse the policy."""
    policy = _reloaded_policy(helpers, "h.boost(r) + h.BOOST")
    helpers[1](3)
    result = decodesched.simulate(ROWS, policy, free_kv_blocks=1)
    assert _events(result) == model.replay(ROWS, policy=policy, free_kv_blocks=1).events


# A sweep of ten policies of long names over two traces and two capacities: at the smaller one every policy but
# fcfs has censored latencies (requests that never finished).
SWEEP_COLUMNS = ["trace", "replicate", "policy", "kv_blocks", "aging_interval", "offered_load", "requests",
                 "finished", "unfinished", "ttft_p50", "ttft_p99", "queue_wait_p99", "e2e_p99", "slo_attainment",
                 "starvation", "fairness_jain", "preemptions"]
TEN = ["fcfs"] + [f"shortest_remaining_variant_{i}" for i in range(9)]


def _ten_policy_sweep(path) -> None:
    import csv

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(SWEEP_COLUMNS)
        for t, load in enumerate((0.5, 1.0)):
            for k, policy in enumerate(TEN):
                for kv in (60, 120):
                    late = "inf" if kv == 60 and policy != "fcfs" else 30 + k + t
                    w.writerow([f"gone{t}", 0, policy, kv, "", load, 20, 19, 1, 3 + k, late, late, late, 0.9,
                                40 + k, 0.8, 2])


def test_a_report_of_ten_policies_keeps_its_legend_and_notes_off_the_panels(tmp_path, monkeypatch):
    """Before: the legend of the sweep figures stood inside the first panel (ten entries covered its lines and its
    censored note), and the note naming the policies with censored points ran on one line across the panels beside
    it.  After: the legend stands below the panels, the note wraps inside its panel."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from decodesched import report

    figures = []
    save = report._save

    def keep(fig, out, plot):
        figures.append((plot, fig))
        return save(fig, out, plot)

    monkeypatch.setattr(report, "_save", keep)
    _ten_policy_sweep(tmp_path / "s.csv")
    report.build_report(tmp_path / "r", results=tmp_path / "s.csv")
    assert {plot.name for plot, _ in figures} >= {"latency_vs_load", "ttft_vs_capacity"}
    notes = 0
    for plot, fig in figures:
        renderer = FigureCanvasAgg(fig).get_renderer()
        panels = [ax.get_window_extent(renderer) for ax in fig.axes]
        assert sorted(plot.legend) == sorted(TEN), plot.legend
        for legend in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]:
            box = legend.get_window_extent(renderer)
            assert not any(box.overlaps(panel) for panel in panels), plot.name
            assert 0 <= box.x0 and box.x1 <= fig.bbox.width and 0 <= box.y0, plot.name
        for ax, panel in zip(fig.axes, panels):
            for text in ax.texts:
                if "inf (censored)" in text.get_text():
                    notes += 1
                    assert "shortest_remaining_variant_8" in text.get_text()
                    assert text.get_window_extent(renderer).x1 <= panel.x1, (plot.name, text.get_text())
    assert notes
