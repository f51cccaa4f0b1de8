"""Stop 56, a researcher with policies of their own (Python API and a notebook): what they see of a trace, how two
results compare, a generator of traces given to `grid`, a sweep's progress bar in Jupyter, and the aging interval
given to a policy that cannot use it."""

import numba
import numpy as np
import pytest

import decodesched
from decodesched import Policy, grid, load_trace, simulate, simulate_batch
from decodesched.errors import UserError
from test_research_walk import ROWS  # (the small trace with every field: one definition)


@numba.njit
def _key(r, clock):
    return (r.max_new_tokens - r.generated_len,)


@numba.njit
def _priority(r, clock):
    return -(r.max_new_tokens - r.generated_len)


SJF = Policy("sjf56", key=_key, effective_priority=_priority)


def _long_trace(n=30):
    return load_trace({**{c: [v[i % 4] for i in range(n)] for c, v in ROWS.items()},
                       "request_id": list(range(n)), "arrival_step": list(range(n)),
                       "deadline_step": [i + 50 if i % 2 else None for i in range(n)]}, name="long")


def test_a_trace_shows_as_one_line_and_a_bounded_table():
    trace = _long_trace()
    text = repr(trace)
    assert text.count("\n") == 0 and len(text) < 200, text  # (before: every column, over 40 lines)
    assert text.startswith("<Trace 'long', 30 requests") and "with a deadline" in text, text
    html = trace._repr_html_()
    assert html.count("<tr>") == 1 + 10 + 1 and "<td>...</td>" in html, html  # header, first/last five, the gap
    assert "<th>request_id</th>" in html and "<td>29</td>" in html
    small = load_trace(ROWS)
    assert small._repr_html_().count("<tr>") == 1 + 4
    assert repr(small.subset([0, 2])).startswith("<Trace 'trace', 2 requests")
    by_hand = decodesched.Trace(**{name: 7 for name in decodesched.trace.ARRAY_FIELDS})  # (no column has a length)
    assert "not checked yet" in repr(by_hand) and "not checked yet" in by_hand._repr_html_()
    with pytest.raises(TypeError, match="unhashable type: 'Trace'"):  # (before: "...: 'numpy.ndarray'")
        {trace: 1}


def test_two_results_compare_by_what_was_replayed_and_what_came_out():
    a = simulate(ROWS, "aging", 4)
    assert a == simulate(ROWS, "aging", 4)  # (before: ValueError, the truth value of an array)
    assert a != simulate(ROWS, "aging", 5)
    assert a != simulate(ROWS, "aging", 4, aging_interval=2)
    assert a != simulate(ROWS, "aging", 4, record_events=False)
    assert a != simulate(ROWS, "fcfs", 4) and a != "aging"
    # the interval counts only for aging (as a batch's rows say): a grid's fcfs runs at its first interval
    assert simulate(ROWS, "fcfs", 4, aging_interval=2) == simulate(ROWS, "fcfs", 4)
    assert simulate(ROWS, SJF, 4, aging_interval=2) == simulate(ROWS, SJF, 4)
    assert simulate(ROWS, "aging", 4, record_events=False) == simulate(ROWS, "aging", 4, record_events=False)
    with pytest.raises(TypeError):
        hash(a)
    batch = simulate_batch([ROWS], grid(1, ["aging", SJF, "fcfs"], [4], [4, 2]), record_events=True)
    assert [batch.result(i) for i in range(4)] == [a, simulate(ROWS, "aging", 4, aging_interval=2),
                                                   simulate(ROWS, SJF, 4), simulate(ROWS, "fcfs", 4)]


def test_two_batches_compare_by_their_scenarios_results_not_how_they_ran():
    scenarios = grid(1, ["aging", SJF, "fcfs"], [4, 5], [4, 2])
    one = simulate_batch([ROWS], scenarios, threads=1)
    assert one == simulate_batch([ROWS], scenarios)  # (before: ValueError, the truth value of an array)
    assert one != simulate_batch([ROWS], grid(1, ["aging", SJF, "fcfs"], [4, 6], [4, 2]))
    assert one != simulate_batch([ROWS], scenarios, record_events=True) and one != one.result(0)
    renamed = load_trace(ROWS, name="other")
    assert one != simulate_batch([renamed], scenarios)
    with pytest.raises(TypeError):
        hash(one)


def test_grid_refuses_a_generator_of_traces_it_would_use_up():
    traces = (load_trace(ROWS) for _ in range(2))
    with pytest.raises(UserError, match=r"one-pass iterator \(generator\).*traces = list\(\.\.\.\)"):
        grid(traces, ["fcfs"], [4], None)
    assert len(list(traces)) == 2  # (untouched: before, grid counted it and simulate_batch then found none)
    listed = [load_trace(ROWS)] * 2
    assert len(grid(listed, ["fcfs", SJF], [4], None)) == 4 and len(grid(range(2), ["fcfs"], [4], None)) == 2


def test_an_interval_given_to_a_policy_that_cannot_use_it_is_ignored_silently(recwarn):
    """Documented rule (docs/policies.md): a user policy's functions see (r, clock) only, so the interval changes
    nothing; it is taken and recorded, as a built-in other than aging takes it, with no warning."""
    plain, given = simulate(ROWS, SJF, 4), simulate(ROWS, SJF, 4, aging_interval=8)
    assert given.aging_interval == 8 and np.array_equal(plain.event_log, given.event_log)
    assert np.array_equal(plain.request_state, given.request_state) and plain.metrics == given.metrics
    assert not recwarn.list


def test_a_progress_bar_in_jupyter_is_one_output_updated_in_place(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    cells = ["from decodesched import grid, simulate_batch\n"
             f"rows = {ROWS!r}\n"
             "batch = simulate_batch([rows] * 3, grid(3, ['fcfs', 'aging'], list(range(3, 40)), [1, 2, 4]), "
             "progress=True)\nlen(batch)"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = nb.cells[0].outputs
    # (before: one stderr output per redraw, "\rsweep [...] 0/444"; the saved notebook kept every one)
    assert not [o for o in outputs if o.output_type == "stream"], outputs
    bars = [o for o in outputs if o.output_type == "display_data"]
    assert len(bars) == 1 and bars[0].data["text/plain"].startswith("sweep [###"), outputs
    assert bars[0].data["text/plain"].split()[2] == "444/444", bars
    assert outputs[-1].data["text/plain"] == "444"


def test_a_progress_bar_outside_jupyter_is_still_drawn_on_stderr(capfd):
    simulate_batch([ROWS], grid(1, ["fcfs"], [4, 5], None), progress=True)
    out, err = capfd.readouterr()
    assert out == "" and err.startswith("\rsweep [") and "2/2" in err


@numba.njit
def _longest_key(r, clock):
    return (-(r.max_new_tokens - r.generated_len),)


def test_two_different_policies_of_one_name_in_one_batch_are_refused():
    other = Policy("sjf56", key=_longest_key, effective_priority=_priority)  # (a notebook's second SJF, edited)
    with pytest.raises(UserError, match=r"^grid: two different policies are named 'sjf56'"):
        grid(1, [SJF, "fcfs", other], [4, 5], None)  # (one grid: refused as it is made)
    scenarios = grid(1, [SJF, "fcfs"], [4, 5], None) + grid(1, [other], [4, 5], None)
    # (before: both ran, and their rows, both "sjf56", could not be told apart)
    with pytest.raises(UserError, match=r"two different policies are named 'sjf56' \(Policy\('sjf56'\) with key "
                                        r"_key at test_research_stop56.py:\d+ and .* key _longest_key at .*different"):
        simulate_batch([ROWS], scenarios)
    same = Policy("sjf56", key=_key, effective_priority=_priority)  # the same code again: one policy
    batch = simulate_batch([ROWS], grid(1, [SJF], [4], None) + grid(1, [same], [5], None))
    assert [r["policy"] for r in batch.rows()] == ["sjf56", "sjf56"]


def test_report_given_a_batch_instead_of_its_csv_says_how_to_write_it(tmp_path):
    from decodesched.report import build_report

    batch = simulate_batch([ROWS], grid(1, ["fcfs"], [4], None))
    for given in (batch, batch.rows()):
        # (before: "results must be a path (a str or a pathlib.Path), got <BatchResult ...>", no way on)
        with pytest.raises(TypeError, match=r"write_metrics_csv\(batch.rows\(\), 'sweep.csv'\)"):
            build_report(tmp_path / "out", results=given)
    assert not (tmp_path / "out").exists()
