"""Results as pandas DataFrames and Arrow tables / Parquet files (optional extras).

pandas and pyarrow are not needed by the simulator itself; install them with
``pip install 'decodesched[data]'``.  Without them these functions raise `UserError` saying so.

- `requests_frame(result)`: one row per request (the requests CSV columns of SPEC section 4, plus
  ``has_deadline``, ``generated_len`` and ``unservable``); steps that never happened and
  ``deadline_step`` without a deadline are ``<NA>`` (nullable ``Int64``), latencies NaN, and
  ``deadline_met`` without a deadline is ``<NA>`` (nullable ``boolean``), as in the requests file.
- `events_frame(result)`: the event log (SPEC section 4 columns); ``preempted_request_id`` is ``<NA>``
  when the step preempted no one.
- `trace_frame(trace)`: a trace's canonical columns, with its ``steps_per_second`` and ``name`` in the
  frame's ``attrs``, which `decodesched.load_trace` of the frame (or of a frame made from it) takes
  back; written with `to_parquet`, `load_trace` reads its ``steps_per_second`` from the Parquet metadata.
- `metrics_frame(rows_or_batch)`: a sweep's per-scenario rows (``BatchResult.rows()`` or a list of
  dicts) as one frame, columns in `decodesched.batch.row_columns` order (per-class ``<metric>_class<P>``,
  seconds ``<metric>_s``, ``offered_load``, ``steps_per_second``; a censored statistic is ``inf``).
- `to_arrow(obj)` / `to_parquet(obj, path)`: any of the above (a `SimulationResult` gives its requests
  table unless ``table="events"``) as a ``pyarrow.Table`` / a Parquet file written atomically.

>>> import decodesched
>>> r = decodesched.simulate({"request_id": [1, 2], "arrival_step": [0, 0], "prompt_len": [3, 3],
...                           "max_new_tokens": [2, 1], "priority": [0, 1], "cache_hit": [False, False],
...                           "required_blocks": [1, 1], "deadline_step": [None, 9],
...                           "preemptible": [True, True]}, free_kv_blocks=4)
>>> requests_frame(r)[["request_id", "deadline_step", "ttft"]].to_string(index=False)
' request_id  deadline_step  ttft\\n          1           <NA>   4.0\\n          2              9   3.0'
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

from ._io import atomic_writer, check_outputs, extension_said, path_argument
from .errors import UserError
from .tables_io import is_parquet
from .trace import NAME_KEY, STEPS_PER_SECOND_KEY, Trace, show

INSTALL_HINT = "pip install 'decodesched[data]'"

_STEP_COLUMNS = ("first_step", "first_token_step", "finish_step")


def _pandas():
    try:
        import pandas as pd
    except ImportError:
        raise UserError(f"pandas is not installed; {INSTALL_HINT}") from None
    return pd


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"pyarrow is not installed; {INSTALL_HINT}") from None
    return pa, pq


def requests_frame(result) -> "Any":
    """The per-request table of a `SimulationResult` as a pandas DataFrame (see module docstring)."""
    pd = _pandas()
    req = result.requests
    data = {}
    for name, values in req.items():
        values = np.asarray(values)
        if name in _STEP_COLUMNS:
            data[name] = pd.array(np.where(values >= 0, values, 0), dtype="Int64")
            data[name][values < 0] = pd.NA
        elif name == "deadline_step":
            data[name] = pd.array([None if v is None else int(v) for v in values.tolist()], dtype="Int64")
        elif name == "deadline_met":  # (no deadline: not met, not missed; `result.requests` has False there)
            data[name] = pd.array(values, dtype="boolean")
            data[name][~np.asarray(req["has_deadline"])] = pd.NA
        else:
            data[name] = values
    return pd.DataFrame(data)


def events_frame(result) -> "Any":
    """The event log of a `SimulationResult` (recorded with ``record_events=True``) as a DataFrame."""
    pd = _pandas()
    from .engine import EVENT_COLUMNS

    ev = result.events
    data = {name: np.asarray(ev[name]) for name in EVENT_COLUMNS}
    victim = pd.array(np.asarray(ev["preempted_request_id"]), dtype="Int64")
    victim[~np.asarray(ev["has_victim"])] = pd.NA
    data["preempted_request_id"] = victim
    return pd.DataFrame(data)


def trace_frame(trace) -> "Any":
    """A `Trace` (or anything `load_trace` reads) as a DataFrame of the canonical columns."""
    pd = _pandas()
    from .trace import load_trace

    trace = load_trace(trace)
    cols = trace.columns()
    data = dict(cols)
    data["deadline_step"] = pd.array([None if v is None else int(v) for v in cols["deadline_step"].tolist()],
                                     dtype="Int64")
    frame = pd.DataFrame(data)
    frame.attrs.update(name=trace.name, **({"steps_per_second": trace.steps_per_second}
                                           if trace.steps_per_second else {}))
    return frame


def metrics_frame(rows) -> "Any":
    """Per-scenario sweep rows (a `BatchResult`, anything with ``.rows()``, or a list of dicts)."""
    pd = _pandas()
    from .batch import row_columns

    if hasattr(rows, "rows") and callable(rows.rows):
        rows = rows.rows()
    if isinstance(rows, (str, bytes, Mapping)) or not hasattr(rows, "__iter__"):
        raise UserError(f"expected a Trace, a SimulationResult, a batch result or a list of row dicts, "
                        f"got {type(rows).__name__}")
    rows = list(rows)
    if not all(isinstance(r, Mapping) for r in rows):
        raise UserError("expected metrics rows as dicts (a batch result's rows())")
    return pd.DataFrame(rows, columns=row_columns(rows) if rows else None)


def to_frame(obj, table: str | None = None) -> "Any":
    """Any result as a DataFrame: a `Trace`, a `SimulationResult` (``table`` "requests" or "events"), a batch
    result or rows (metrics), or a DataFrame (returned as is)."""
    pd = _pandas()
    if isinstance(obj, pd.DataFrame):
        return obj
    from .engine import SimulationResult
    from .trace import Trace

    if isinstance(obj, Trace):
        return trace_frame(obj)
    if isinstance(obj, SimulationResult):
        table = "requests" if table is None else table
        if isinstance(table, str) and table == "requests":
            return requests_frame(obj)
        if isinstance(table, str) and table == "events":
            return events_frame(obj)
        raise UserError(f"unknown table {show(table)}; choose requests or events")
    if table is not None and not (isinstance(table, str) and table == "metrics"):
        raise UserError(f"a batch result has only the metrics table, not {show(table)}")
    return metrics_frame(obj)


def to_arrow(obj, table: str | None = None) -> "Any":
    """`to_frame(obj, table)` as a ``pyarrow.Table``.  A trace's (or a result's trace's) name and time scale,
    when it has one, travel in the schema metadata under ``decodesched.name`` and ``decodesched.steps_per_second``,
    which `decodesched.load_trace` of the table reads back."""
    pa, _ = _pyarrow()
    arrow = pa.Table.from_pandas(to_frame(obj, table), preserve_index=False)
    trace = getattr(obj, "trace", obj)
    if isinstance(trace, Trace):
        sps = trace.steps_per_second
        arrow = arrow.replace_schema_metadata({**(arrow.schema.metadata or {}), NAME_KEY: trace.name.encode(),
                                               **({STEPS_PER_SECOND_KEY: repr(float(sps))} if sps else {})})
    return arrow


def to_parquet(obj, path: str | os.PathLike, table: str | None = None) -> None:
    """Write `to_frame(obj, table)` as Parquet; the file appears whole or not at all.

    A `Trace` written this way (``to_parquet(trace, "t.parquet")``) is read back by
    `decodesched.load_trace`, time scale included.  A result's or a batch's table never replaces a file
    one of its traces was read from, nor such a file's sidecar (`UserError`, before any work).
    """
    batch = getattr(obj, "traces", None)  # (a BatchResult's list; a frame's attribute may be a column)
    traces = [getattr(obj, "trace", None), *(batch if isinstance(batch, list) else ())]
    check_outputs([path_argument(path)], inputs=[getattr(t, "source", None) for t in traces])  # (first: '' is named)
    if not is_parquet(path):  # (a name that the readers would take for CSV)
        raise UserError(f"{path}: a Parquet file is named .parquet or .pq; got {extension_said(path)}")
    _, pq = _pyarrow()
    arrow = to_arrow(obj, table)
    with atomic_writer(path, "wb") as fh:
        pq.write_table(arrow, fh)


__all__ = ["events_frame", "metrics_frame", "requests_frame", "to_arrow", "trace_frame", "to_frame", "to_parquet"]
