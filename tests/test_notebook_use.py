"""The result classes as a researcher meets them in Jupyter: a short readable repr, an HTML table where a table is
the natural display, no metrics computed just to show a large result, results that pickle and copy, and a
notebook run headless (nbconvert's client) with no stderr text in any cell."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import decodesched
from decodesched import batch as batch_module, engine, metrics
from decodesched.batch import grid, simulate_batch

# A few hundred requests that queue up (a backlog, preemptions, some deadlines); the notebook below builds the same.
TRACE_CODE = """\
N = 300
RNG = np.random.default_rng(5)
TRACE = {
    "request_id": np.arange(N),
    "arrival_step": (ARRIVAL := np.sort(RNG.integers(0, 2000, N))),
    "prompt_len": RNG.integers(1, 40, N),
    "max_new_tokens": RNG.integers(1, 20, N),
    "priority": RNG.integers(0, 3, N),
    "cache_hit": RNG.random(N) < 0.2,
    "required_blocks": RNG.integers(1, 30, N),
    "deadline_step": [int(a + d) if i % 2 else None
                      for i, (a, d) in enumerate(zip(ARRIVAL, RNG.integers(50, 2000, N)))],
    "preemptible": RNG.random(N) < 0.8,
}"""
_NAMES = {"np": np}
exec(TRACE_CODE, _NAMES)
TRACE = _NAMES["TRACE"]


@pytest.fixture(scope="module")
def result():
    trace = decodesched.load_trace(TRACE)
    return decodesched.simulate(trace, "aging", free_kv_blocks=60, engine="scan")


@pytest.fixture(scope="module")
def batch():
    scenarios = grid([TRACE], ["fixed_priority", "aging", "deadline", "fcfs"], [40, 60, 80, 100, 120, 140, 160],
                     [2, 8])
    return simulate_batch([TRACE], scenarios, engine="scan")


def test_a_result_repr_is_one_short_line(result):
    """The generated dataclass repr printed every trace column and the raw event log (1,961 characters on 16
    lines for the Azure trace in a notebook, 5,600 for a batch of 20)."""
    text = repr(result)
    assert "\n" not in text and len(text) < 200 and "array(" not in text, text
    assert text.startswith("<SimulationResult: aging on 'trace' (300 requests), free_kv_blocks=60,"), text
    assert str(result) == text


def test_a_result_shows_its_metrics_as_an_html_table(result):
    html = result._repr_html_()
    assert html.startswith("<table>") and "<caption>SimulationResult: aging on &#x27;trace&#x27;" in html
    for label, value in metrics.summary_rows(result.metrics):
        assert f"<tr><td>{label}</td><td>{value}</td></tr>" in html


def test_a_large_result_is_shown_without_computing_its_metrics(monkeypatch):
    monkeypatch.setattr(engine, "HTML_METRICS_MAX_REQUESTS", 100)
    r = decodesched.simulate(TRACE, "fcfs", free_kv_blocks=60, engine="scan")
    assert "result.metrics computes them" in r._repr_html_()
    assert "metrics" not in r.__dict__ and "requests" not in r.__dict__
    r.metrics  # once computed, the table is shown
    assert "ttft P99" in r._repr_html_()


def test_a_batch_repr_is_one_short_line(batch):
    text = repr(batch)
    assert "\n" not in text and len(text) < 300 and "array(" not in text and "Scenario(" not in text, text
    assert text.startswith(f"<BatchResult: {len(batch)} scenarios on 1 trace (trace), policies fixed_priority, "
                           "aging, deadline, fcfs; cpu,"), text


def test_a_batch_shows_a_table_of_its_scenarios_without_computing_metrics(batch):
    html = batch._repr_html_()
    assert len(batch) > batch_module.HTML_ROWS and batch._metrics == {}
    assert html.count("<tr>") == 1 + batch_module.HTML_ROWS + 1  # header, the first and last ten, and a row of "..."
    first = batch.scenarios[0]
    assert (f"<tr><td>0</td><td>trace</td><td>0</td><td>fixed_priority</td><td>{first.free_kv_blocks}</td><td></td>"
            f"<td>{batch.result(0).n_events}</td>") in html
    assert f"<tr><td>{len(batch) - 1}</td>" in html and "<td>...</td>" in html
    assert "batch.to_pandas() for the metrics" in html and batch._metrics == {}


def test_results_pickle_and_copy_with_their_displays(result, batch):
    for obj in (result, batch, batch.result(3)):
        for again in (pickle.loads(pickle.dumps(obj)), copy.deepcopy(obj), copy.copy(obj)):
            assert repr(again) == repr(obj) and again._repr_html_() == obj._repr_html_()
    assert pickle.loads(pickle.dumps(batch)).rows() == batch.rows()


NOTEBOOK_CELLS = [
    "import decodesched\nimport numpy as np\nfrom decodesched.batch import grid, simulate_batch\n" + TRACE_CODE,
    "r = decodesched.simulate(TRACE, 'deadline', free_kv_blocks=60, engine='scan')\nr",
    "r.metrics['ttft']['p99'] >= 0",
    "batch = simulate_batch([TRACE], grid([TRACE], ['aging', 'fcfs'], [60, 80], [2, 8]), engine='scan', "
    "progress=None)\nbatch",
    "batch.result(0)",
    "df = batch.to_pandas(); len(df)",
    "r.to_pandas().head()",
]


def test_a_notebook_displays_results_readably_with_nothing_on_stderr(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("pandas")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in NOTEBOOK_CELLS]
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "stream" and o.name == "stderr"], outputs
    shown = {c.source.splitlines()[-1]: c.outputs[0].data for c in nb.cells[1:] if c.outputs}
    for name in ("r", "batch", "batch.result(0)"):
        assert "text/html" in shown[name] and "<table>" in shown[name]["text/html"], shown[name]
        assert shown[name]["text/plain"].count("\n") == 0 and len(shown[name]["text/plain"]) < 300, shown[name]
    assert shown["df = batch.to_pandas(); len(df)"]["text/plain"] == "6"


def test_a_batch_over_many_traces_names_a_few_in_its_repr():
    traces = [decodesched.load_trace({**TRACE, "priority": np.full(len(TRACE["priority"]), p)}) for p in range(6)]
    batch = simulate_batch(traces, grid(traces, ["fcfs"], [60], None), engine="scan")
    text = repr(batch)
    assert "\n" not in text and len(text) < 200 and text.count(", ...,") == 1, text
    assert text.startswith("<BatchResult: 6 scenarios on 6 traces ("), text
