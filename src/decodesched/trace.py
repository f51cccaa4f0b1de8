"""Traces: a validated structure of arrays, read from the canonical CSV, Parquet or in-memory columns.

Validation happens here, before anything runs, and every message names the row and the column.
The value limits keep all int64 arithmetic of the kernels exact (the Python model has unbounded
integers; the kernels must never overflow where it would not).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import math
import operator
import os
import re
import sys
from collections import Counter
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ._io import input_file, meta_path, not_text, read_parquet_table
from .errors import UserError
from .kernels.fields import FILE_COLUMNS, TRACE_FIELDS
from .model import is_integer

# The trace columns, derived from the one definition of the kernels' trace arrays (kernels/fields.py).
TRACE_COLUMNS = FILE_COLUMNS
INT_COLUMNS = tuple(n for n, dtype, in_file in TRACE_FIELDS if in_file and dtype == "int64" and n != "deadline_step")
BOOL_COLUMNS = tuple(n for n, dtype, in_file in TRACE_FIELDS if in_file and dtype == "bool")
HTML_ROWS = 10  # the rows a notebook shows of a longer trace: its first and last five
_WANT = {c: "true/false values" if c in BOOL_COLUMNS else "integers" for c in TRACE_COLUMNS}  # for messages

# Magnitude limits that keep every kernel sum, difference and key in int64 (see module docstring).
MAX_LENGTH = 2**40  # prompt_len, max_new_tokens, required_blocks
MAX_STEP = 2**53  # arrival_step, deadline_step, |priority|
MAX_TOTAL = 2**61  # last arrival + all work steps; capacity + all blocks
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# The accepted spellings (docs/files.md): booleans true/false in any letter case, or 1/0; integers
# as ASCII decimal digits with an optional leading '-' (no '+', '_', spaces inside, or other scripts'
# digits); spaces around a field are ignored.  Longer digit strings than any int64 are refused early.
_TRUE = {"true", "1"}
_FALSE = {"false", "0"}
_INT_RE = re.compile(r"-?[0-9]+", re.ASCII)
MAX_INT_DIGITS = 19
MAX_FIELD = 4096  # characters of one CSV field; no valid trace field comes near it


def parse_decimal(text: str) -> int:
    """A strict decimal integer (see the spelling rules above); ValueError otherwise."""
    s = text.strip()
    if not _INT_RE.fullmatch(s):
        raise ValueError("not a decimal integer")
    if len(s.lstrip("-").lstrip("0")) > MAX_INT_DIGITS:
        raise ValueError("too many digits")
    return int(s)


def show(value, limit: int = 40) -> str:
    """`repr(value)`, shortened to about `limit` characters for error messages."""
    try:
        text = repr(value)
    except ValueError:  # an int beyond Python's digit limit for str()
        return f"an integer of {int(value).bit_length()} bits"
    text = re.sub(r"\s*\n\s*", " ", text)  # (a pandas Series' or a 2-D array's repr is many lines; a message one)
    return text if len(text) <= limit else text[: limit - 12] + "\u2026" + text[-10:] + f" ({len(text)} chars)"


def plain_value(value):
    """A NumPy scalar as the Python value it holds, for messages (``2000.0``, not ``np.float64(2000.0)``); a NumPy
    time stays itself (``np.timedelta64(4)``'s value, 4, would read as the integer it is not)."""
    return value.item() if isinstance(value, np.generic) and not isinstance(value, (np.timedelta64, np.datetime64)) \
        else value


class TraceError(UserError):
    """A trace that cannot be replayed; the message names the row and column."""


@dataclass(frozen=True, eq=False)  # (its own __eq__; unhashable, as its columns: "unhashable type: 'Trace'")
class Trace:
    """A request trace as int64/bool NumPy columns, one entry per request, in trace row order.

    ``deadline_step`` holds 0 where ``has_deadline`` is False.  ``steps_per_second`` is the time
    scale when the trace came from real timestamps (None otherwise), used to report seconds.
    """

    request_id: np.ndarray
    arrival_step: np.ndarray
    prompt_len: np.ndarray
    max_new_tokens: np.ndarray
    priority: np.ndarray
    cache_hit: np.ndarray
    required_blocks: np.ndarray
    deadline_step: np.ndarray
    has_deadline: np.ndarray
    preemptible: np.ndarray
    steps_per_second: float | None = None
    name: str = "trace"
    source: Path | None = field(default=None, repr=False, compare=False)  # the file it was read from
    # Private, set here only, never copied by `dataclasses.replace` (init=False): the cached arrival
    # order, and whether `load_trace` checked these columns (a Trace built any other way is checked
    # again when it is loaded: `load_trace(Trace)`, which every replay calls).
    _order: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)
    _checked: bool = field(default=False, init=False, repr=False, compare=False)

    def __eq__(self, other) -> bool:
        """The same columns, time scale and name (the file a trace was read from is not compared); the
        generated comparison asked NumPy for the truth of a whole column and raised ValueError."""
        if not isinstance(other, Trace):
            return NotImplemented
        return (self.steps_per_second == other.steps_per_second and self.name == other.name
                and all(np.array_equal(getattr(self, n), getattr(other, n)) for n in ARRAY_FIELDS))

    def __len__(self) -> int:
        return len(self.request_id)  # (a Trace built by hand may hold lists until `load_trace` checks it)

    def _describe(self) -> str:
        """Name, size, arrivals, deadlines, time scale and file, from the columns as they are (never raises)."""
        if not self._checked:  # (built by hand: its columns may be anything until `load_trace` checks them)
            return f"{show(self.name)}, not checked yet (load_trace(trace) checks it)"
        n = len(self)
        parts = [f"{self.name!r}", f"{n:,} request{'s' if n != 1 else ''}"]
        if n:
            parts.append(f"arrivals at steps {int(self.arrival_step.min()):,} to {int(self.arrival_step.max()):,}")
            parts.append(f"{int(np.count_nonzero(self.has_deadline)):,} with a deadline")
        if self.steps_per_second:
            parts.append(f"{float(self.steps_per_second):g} steps/s")
        if self.source is not None:
            parts.append(f"from {self.source}")
        return ", ".join(parts)

    def __repr__(self) -> str:
        """One line; the generated repr printed every column (pages in a notebook)."""
        return f"<Trace {self._describe()}>"

    def _repr_html_(self) -> str:
        """Jupyter's display: the first and last `HTML_ROWS` // 2 rows of `columns()` (None: no deadline)."""
        from .metrics import html_table

        caption = f"Trace {self._describe()}"
        if not self._checked:
            return html_table(["trace"], [["not checked yet: load_trace(trace) checks it"]], caption)
        n, half = len(self), HTML_ROWS // 2
        shown = range(n) if n <= HTML_ROWS else [*range(half), *range(n - half, n)]
        cols = self.columns()
        rows = []
        for i in shown:
            rows.append([i, *(plain_value(cols[c][i]) for c in TRACE_COLUMNS)])
            if len(shown) < n and i == half - 1:
                rows.append(["..."] * (len(TRACE_COLUMNS) + 1))
        return html_table(["", *TRACE_COLUMNS], rows, caption)

    def __setstate__(self, state: dict) -> None:
        """Unpickled (a Dask worker's copy), a checked trace is read-only again (`_checked`), as views of writable
        arrays: pickled read-only, its columns come back as views of read-only buffers (protocol 5), which every
        replay would copy (`writable_base`); they are copied once, here."""
        self.__dict__.update(state)
        if self._checked:
            for name in ARRAY_FIELDS:
                object.__setattr__(self, name, writable_base(getattr(self, name)))
            if self._order is not None:
                object.__setattr__(self, "_order", _read_only(writable_base(self._order)))
            _checked(self)

    @property
    def arrival_order(self) -> np.ndarray:
        """Row indices in enqueue order: by (arrival_step, row)."""
        if self._order is None:
            order = np.argsort(self.arrival_step, kind="stable").astype(np.int64)
            object.__setattr__(self, "_order", _read_only(order))
        return self._order

    @property
    def work_steps(self) -> int:
        """Steps needed to finish everything: one prefill plus one per token, per request."""
        return int(len(self) + self.max_new_tokens.sum())

    def _out_of_range(self, row) -> IndexError:
        n = len(self)
        return IndexError(f"row {int(row)} is out of range: the trace has {n} row{'s' if n != 1 else ''} (indices 0 "
                          f"to {n - 1}, or -{n} to -1)")

    def deadline_or_none(self, row: int) -> int | None:
        """Row `row`'s deadline step, None where it has none; a row out of range is an IndexError naming the trace's
        size (NumPy's named no trace), as `subset`'s."""
        if is_integer(row) and not -len(self) <= row < len(self):
            raise self._out_of_range(row)
        return int(self.deadline_step[row]) if self.has_deadline[row] else None

    def rows(self):
        """The trace as a list of dicts (the model's input); `deadline_step` is None where absent."""
        if not self._checked:  # (a Trace built by hand is checked first, as a replay checks it)
            return load_trace(self).rows()
        out = []
        for i in range(len(self)):
            out.append(
                {
                    "request_id": int(self.request_id[i]),
                    "arrival_step": int(self.arrival_step[i]),
                    "prompt_len": int(self.prompt_len[i]),
                    "max_new_tokens": int(self.max_new_tokens[i]),
                    "priority": int(self.priority[i]),
                    "cache_hit": bool(self.cache_hit[i]),
                    "required_blocks": int(self.required_blocks[i]),
                    "deadline_step": self.deadline_or_none(i),
                    "preemptible": bool(self.preemptible[i]),
                }
            )
        return out

    def columns(self) -> dict[str, np.ndarray]:
        """The canonical columns; `deadline_step` as an object array with None where absent."""
        if not self._checked:
            return load_trace(self).columns()
        deadline = np.where(self.has_deadline, self.deadline_step, 0).astype(object)
        deadline[~self.has_deadline] = None
        return {
            "request_id": self.request_id,
            "arrival_step": self.arrival_step,
            "prompt_len": self.prompt_len,
            "max_new_tokens": self.max_new_tokens,
            "priority": self.priority,
            "cache_hit": self.cache_hit,
            "required_blocks": self.required_blocks,
            "deadline_step": deadline,
            "preemptible": self.preemptible,
        }

    def subset(self, rows) -> "Trace":
        """A new trace with the given rows, in the given order: integer row indices (negative ones count
        from the end), a slice, or a boolean mask as long as the trace (the rows where it is True), as in NumPy.  A row
        out of range, or a selection of another kind, is one IndexError naming it and the trace's size."""
        if not self._checked:  # (built by hand: columns of one length, or the subset would hide the others' rows)
            _check_lengths({name: getattr(self, name) for name in ARRAY_FIELDS}, "<Trace>")
        try:  # (a slice of odd bounds, or a step of 0, raised NumPy's TypeError or ValueError)
            rows = np.arange(len(self))[rows] if isinstance(rows, slice) else np.asarray(rows)
        except (TypeError, ValueError) as exc:
            raise IndexError(f"rows must be row indices, a slice or a boolean mask; got {show(rows)} ({exc})") from None
        if rows.ndim != 1:
            raise IndexError(f"rows must be a 1-D sequence of row indices or a boolean mask; got {show(rows.tolist())}")
        if rows.dtype == np.bool_:  # (as int64 a mask would pick rows 0 and 1, silently)
            if rows.shape != (len(self),):
                raise IndexError(f"a boolean mask needs one entry per row ({len(self)}); got shape {rows.shape}")
            rows = np.flatnonzero(rows)
        elif rows.size and (rows.dtype.kind not in "iu" or (rows.dtype.kind == "u" and rows.max() > INT64_MAX)):
            raise IndexError(f"rows must be integer row indices or a boolean mask; got {show(rows.tolist())}")
        rows = rows.astype(np.int64)
        bad = np.flatnonzero((rows < -len(self)) | (rows >= len(self)))
        if bad.size:  # (NumPy's "index 10 is out of bounds for axis 0 with size 4" named no trace)
            raise self._out_of_range(rows[bad[0]])
        kw = {name: np.asarray(getattr(self, name))[rows] for name in ARRAY_FIELDS}
        out = Trace(**kw, steps_per_second=self.steps_per_second, name=self.name, source=self.source)
        rows = np.arange(len(self))[rows]  # (negative indices counted from the end, as NumPy does)
        if self._checked and len(rows) and len(np.unique(rows)) == len(rows):  # rows of a valid trace, once each
            _checked(out)
        return out

    def to_csv(self, path: str | os.PathLike) -> None:
        """Write the canonical trace CSV atomically (a temporary file renamed into place); a trace built by
        hand is checked first, so that no file is written that `load_trace` would refuse (nor one named ``.parquet`` or
        ``.pq``, which it reads as Parquet: `decodesched.frames.to_parquet` writes those).  The time scale goes
        beside it, into the ``<path>.meta.json`` sidecar that `load_trace` reads, written together with the CSV; a
        trace without one removes a sidecar an earlier trace left there (it would lend this one its time scale).
        ``-`` writes the CSV alone to standard output: no file, so no sidecar (a ``-.meta.json`` is left alone)."""
        import json

        from ._io import STDOUT, atomic_writer, extension_said, output_group, path_argument
        from .tables_io import is_parquet

        target = path_argument(path)
        if is_parquet(target):
            raise UserError(f"{path}: a CSV trace named {extension_said(path)}, which load_trace would read as "
                            "Parquet; name it .csv, or write Parquet with decodesched.frames.to_parquet")
        if not self._checked:
            return load_trace(self).to_csv(path)
        if str(target) == STDOUT:
            return self._write_csv(target)
        side = meta_path(target)
        with output_group():
            if self.steps_per_second is not None:
                with atomic_writer(side) as fh:
                    body = {"name": self.name, "requests": len(self), "steps_per_second": self.steps_per_second}
                    json.dump(body, fh, indent=2, sort_keys=True)
                    fh.write("\n")
            self._write_csv(target)
        if self.steps_per_second is None and side.is_file():
            try:
                side.unlink()
            except OSError as exc:
                raise UserError(f"{side}: cannot remove the time scale of the trace written before ({exc.strerror})")

    def _write_csv(self, target: Path) -> None:
        """`to_csv` without the sidecar (for `decodesched.convert.write_trace`, which writes a fuller one);
        `target` as `_io.path_argument` gives it, of a checked trace."""
        from ._io import atomic_writer

        with atomic_writer(target) as fh:
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(TRACE_COLUMNS)
            for i in range(len(self)):
                w.writerow(
                    [
                        int(self.request_id[i]),
                        int(self.arrival_step[i]),
                        int(self.prompt_len[i]),
                        int(self.max_new_tokens[i]),
                        int(self.priority[i]),
                        "true" if self.cache_hit[i] else "false",
                        int(self.required_blocks[i]),
                        int(self.deadline_step[i]) if self.has_deadline[i] else "",
                        "true" if self.preemptible[i] else "false",
                    ]
                )


ARRAY_FIELDS = tuple(n for n, _, _ in TRACE_FIELDS if n != "order")  # the Trace fields that are arrays


def load_trace(source: Any, *, steps_per_second: float | None = None, name: str | None = None) -> Trace:
    """Read and validate a trace.

    `source` is a path to a canonical trace CSV (or ``.parquet``), a mapping of column name to
    sequence (``deadline_step`` may hold None, NaN or pandas NA for none, or be a masked array), a pandas
    DataFrame, a pyarrow Table or RecordBatch (`decodesched.frames.to_arrow`'s: its time scale and name are read
    from the schema metadata; a Parquet file's time scale too, its name is the file's), a list of row dicts, or a
    `Trace` (returned unchanged when `load_trace` made it; one made otherwise, by its constructor or
    `dataclasses.replace`, is checked as a mapping of its columns would be, and a checked copy returned; a `name` or
    `steps_per_second` given replaces the trace's own, in a copy).  Raises `TraceError` naming the row and column.
    NumPy integer and boolean columns, and Parquet or Arrow ones without nulls, are checked column-wise (a million
    rows in well under a second); other values one by one.

    >>> t = load_trace({"request_id": [1, 2], "arrival_step": [0, 3], "prompt_len": [4, 2],
    ...                 "max_new_tokens": [2, 1], "priority": [0, 5], "cache_hit": [False, True],
    ...                 "required_blocks": [1, 1], "deadline_step": [None, 9], "preemptible": [True, True]})
    >>> len(t), t.has_deadline.tolist()
    (2, [False, True])
    """
    if name is not None:
        _trace_name(name, "load_trace")
    if isinstance(source, Trace):
        trace = source if source._checked else _recheck(source)
        given = {k: v for k, v in (("name", name), ("steps_per_second", steps_per_second)) if v is not None}
        if not given:
            return trace
        if "steps_per_second" in given:
            given["steps_per_second"] = _time_scale(steps_per_second, "load_trace")
        return _checked(dataclasses.replace(trace, **given))  # (the columns, checked, are shared)
    if isinstance(source, (str, os.PathLike)):
        try:
            path = input_file(source, "trace file")
        except UserError as exc:
            raise TraceError(str(exc)) from None
        # (its file name's bytes that are not UTF-8 as \xNN: the name goes into tables and plots)
        label = name or os.fsencode(path.stem).decode("utf-8", "backslashreplace")
        if steps_per_second is None:
            steps_per_second = _sidecar_time_scale(path)
        if path.suffix.lower() in (".parquet", ".pq"):
            cols, stored = _arrow_columns(read_parquet_table(path, TraceError), str(path))
            trace = _from_columns(cols, str(path), steps_per_second or stored, label)
        else:
            trace = _from_csv(path, steps_per_second, label)
        return _checked(dataclasses.replace(trace, source=path))
    if isinstance(source, list):
        if not source:
            raise TraceError("<rows>: the trace is empty (no requests)")
        for i, r in enumerate(source):
            if not isinstance(r, Mapping):
                raise TraceError(f"<rows>: row {i + 1}: expected a mapping of column values, got {show(r)}")
        keys = list(source[0].keys())
        for i, r in enumerate(source):
            if set(r.keys()) != set(keys):
                raise TraceError(f"<rows>: row {i + 1}: columns differ from row 1")
        cols = {k: [r.get(k) for r in source] for k in keys}
        return _from_columns(cols, "<rows>", steps_per_second, name or "trace")
    if _is_arrow(source, "Table", "RecordBatch"):  # (`decodesched.frames.to_arrow` keeps the time scale and name)
        cols, stored = _arrow_columns(source, "<arrow>")
        return _from_columns(cols, "<arrow>", steps_per_second or stored, name or _arrow_name(source) or "trace")
    if hasattr(source, "to_dict") and hasattr(source, "columns"):  # a pandas DataFrame
        attrs = getattr(source, "attrs", None) or {}  # (`frames.trace_frame` keeps the time scale and name there)
        return _from_columns(_frame_columns(source), "<dataframe>", steps_per_second or attrs.get("steps_per_second"),
                             name or attrs.get("name") or "trace")
    if isinstance(source, Mapping):
        return _from_columns(dict(source), "<arrays>", steps_per_second, name or "trace")
    from .convert import RawTrace  # (here: convert imports this module)

    if isinstance(source, RawTrace):  # (`convert.read_azure` / `read_mooncake`: no steps nor classes yet)
        raise TraceError("a RawTrace is a real trace as read, in seconds: convert it first, "
                         "decodesched.convert.to_trace(raw, load=...) (or steps_per_second=...)")
    raise TraceError(f"cannot read a trace from {type(source).__name__}; give a path, a mapping of columns or a Trace")


def _checked(trace: Trace) -> Trace:
    """Marks a trace whose columns `load_trace` checked, and makes its arrays read-only. Every replay trusts a
    checked trace, so a column edited in place would reach the kernels unchecked (a negative required_blocks
    crashed the fast kernel; a moved arrival left the cached order stale): it raises NumPy's "assignment
    destination is read-only" instead. `dataclasses.replace(trace, column=...)` or `load_trace(columns)` make a
    changed trace, checked again."""
    for name in ARRAY_FIELDS:
        object.__setattr__(trace, name, _read_only(getattr(trace, name)))
    object.__setattr__(trace, "_checked", True)
    return trace


def writable_base(a: np.ndarray) -> np.ndarray:
    """A checked trace's read-only column as the kernels take it: the writable array it views (Numba types a
    read-only array apart, and would compile and cache every kernel a second time), else a copy. The kernels
    only read it."""
    if a.flags.writeable:
        return a
    base = a.base
    if (isinstance(base, np.ndarray) and base.flags.writeable and base.dtype == a.dtype and base.shape == a.shape
            and base.strides == a.strides and base.ctypes.data == a.ctypes.data):
        return base
    return a.copy()


def _read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view of `a` (the private array stays writable, for `engine.trace_arrays`)."""
    if not a.flags.writeable:
        return a
    view = a.view()
    view.flags.writeable = False
    return view


def _recheck(trace: Trace) -> Trace:
    """A `Trace` that `load_trace` did not make, checked as its columns would be in a mapping."""
    cols = {name: _column(name, getattr(trace, name), "<Trace>") for name in TRACE_COLUMNS}
    _check_lengths({**cols, "has_deadline": trace.has_deadline}, "<Trace>")
    has, deadline = _cells(trace.has_deadline), _cells(cols["deadline_step"])
    if has.dtype != np.bool_:
        raise TraceError("<Trace>: has_deadline must be a boolean array as long as deadline_step, got "
                         f"{has.dtype.name} values")
    # None or NaN is no deadline (as in a mapping of columns), 0 is none where has_deadline is False
    if deadline.dtype.kind in "iufb":
        missing = np.isnan(deadline) if deadline.dtype.kind == "f" else np.zeros(len(deadline), bool)
        given = ~missing & (deadline != 0)
    else:  # (cells of any kind, one by one)
        missing = np.fromiter(map(_is_missing, deadline), bool, len(deadline))
        given = ~missing & np.fromiter((not (isinstance(x, (int, float, np.integer, np.floating))
                                             and not isinstance(x, (bool, np.bool_)) and x == 0)
                                        for x in deadline), bool, len(deadline))
    stray = np.flatnonzero(~has & given)  # (`dataclasses.replace(trace, deadline_step=...)` alone)
    if stray.size:
        i = int(stray[0])
        raise TraceError(f"<Trace>: row {i + 1}, column deadline_step: {show(plain_value(deadline[i]))} on a row "
                         "whose has_deadline is False, so it would be ignored; replace has_deadline as well "
                         "(np.ones(len(trace), bool): a deadline on every row)")
    gone = np.flatnonzero(has & missing)
    if gone.size:  # (else the mask below would hide it: no deadline, silently)
        raise TraceError(f"<Trace>: row {int(gone[0]) + 1}, column deadline_step: missing value on a row whose "
                         "has_deadline is True")
    cols["deadline_step"] = np.ma.MaskedArray(deadline, mask=~has)
    out = _from_columns(cols, "<Trace>", trace.steps_per_second, trace.name)
    return _checked(dataclasses.replace(out, source=trace.source))


def _cells(column) -> np.ndarray:
    """A 1-D column as a NumPy array; one whose cells NumPy cannot stack (a list among numbers) as an object
    array of them, for the checks to name."""
    try:
        return np.asarray(column)
    except ValueError:
        out = np.empty(len(column), dtype=object)
        for i, x in enumerate(column):
            out[i] = x
        return out


def _sidecar_time_scale(path: Path) -> float | None:
    """``steps_per_second`` from ``<trace>.meta.json`` (written by ``decodesched trace convert``), if any."""
    import json

    meta = meta_path(path)
    if not meta.is_file():
        return None
    try:
        data = json.loads(meta.read_text(encoding="utf-8"), object_pairs_hook=_unique_keys)
    except RecursionError:  # (JSON nested thousands deep)
        raise TraceError(f"{meta}: unreadable trace metadata (nested too deep)") from None
    except (ValueError, OSError) as exc:
        raise TraceError(f"{meta}: unreadable trace metadata ({exc})") from None
    if not isinstance(data, dict) or "steps_per_second" not in data:
        raise TraceError(f"{meta}: trace metadata without steps_per_second (a JSON object, as trace convert "
                         f"writes it); fix or remove the file")
    return _time_scale(data["steps_per_second"], str(meta))


class _DuplicateKey(ValueError):
    """A JSON object with a key given twice."""


def _unique_keys(pairs: list) -> dict:
    """A JSON object's `pairs` as a dict; `_DuplicateKey` for a key given twice (json keeps the last, silently)."""
    rec = dict(pairs)
    if len(rec) != len(pairs):
        seen: set = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _DuplicateKey(f"field {show(key)} given twice; keep one")
    return rec


def positive_float(value) -> float | None:
    """`value` as a float when it is a positive finite number (a Python or NumPy int or float; a bool is
    none), else None."""
    number = is_integer(value) or isinstance(value, (float, np.floating))
    try:
        scale = float(value) if number else math.nan
    except OverflowError:  # (an integer of hundreds of digits)
        return None
    return scale if scale > 0 and math.isfinite(scale) else None


def _time_scale(value, where: str) -> float:
    """A time scale (``steps_per_second``) as a float; a TraceError unless it is a positive finite number."""
    scale = positive_float(value)
    if scale is None:
        raise TraceError(f"{where}: steps_per_second must be a positive number, got {show(plain_value(value))}")
    return scale


def _trace_name(name, where: str) -> str:
    """A trace's name (its label in tables and plots): a string, None for the default ``"trace"``."""
    if name is None:
        return "trace"
    if not isinstance(name, str):
        raise TraceError(f"{where}: the trace name must be a string, got {show(name)}")
    return str(name)  # (a NumPy string as the plain one it holds)


# Schema metadata keys of an Arrow table's or a Parquet file's trace (`decodesched.frames.to_arrow` writes them).
STEPS_PER_SECOND_KEY = b"decodesched.steps_per_second"
NAME_KEY = b"decodesched.name"


def _arrow_name(table) -> str | None:
    """The trace name `decodesched.frames.to_arrow` stores in an Arrow table's schema metadata (None: none)."""
    stored = (table.schema.metadata or {}).get(NAME_KEY)
    return None if stored is None else stored.decode("utf-8", "backslashreplace")


def _arrow_columns(table, where: str) -> tuple[dict[str, Any], float | None]:
    """A Parquet file's or an Arrow table's (or record batch's) columns, and the time scale
    `decodesched.frames.to_arrow` / `to_parquet` store in the schema metadata."""
    _check_header(list(table.column_names), where)  # (first: a name twice would hide one column)
    stored = (table.schema.metadata or {}).get(STEPS_PER_SECOND_KEY)
    sps = None
    if stored is not None:
        try:
            sps = float(stored)
        except ValueError:
            sps = math.nan
        if not (sps > 0 and math.isfinite(sps)):
            raise TraceError(f"{where}: steps_per_second in its schema metadata must be a positive number, "
                             f"got {stored.decode(errors='replace')!r}")
    return {name: _arrow_column(name, table.column(i)) for i, name in enumerate(table.column_names)}, sps


def _is_arrow(v, *kinds: str) -> bool:
    """Whether `v` is one of pyarrow's `kinds` (pyarrow is optional: not loaded, `v` is none of them)."""
    pa = sys.modules.get("pyarrow")
    return pa is not None and isinstance(v, tuple(getattr(pa, k) for k in kinds))


def _arrow_column(name: str, col):
    """A Parquet or Arrow column (an Array or a ChunkedArray) as `_from_columns` takes it: of its column's type
    (integers, or booleans for cache_hit and preemptible) and without nulls as a NumPy array (checked column-wise
    there), deadlines with nulls as a masked array, anything else as Python values (checked one by one, with the row
    named)."""
    import pyarrow.types as pat

    if pat.is_temporal(col.type):  # (dates, times, durations: refused whole by `_column`, not cell by cell)
        return col.to_numpy(zero_copy_only=False)
    typed = pat.is_boolean(col.type) if name in BOOL_COLUMNS else pat.is_integer(col.type)
    if typed:
        if col.null_count == 0:
            return col.to_numpy(zero_copy_only=False)  # (an Array's booleans are no NumPy buffer)
        if name == "deadline_step":
            missing = col.is_null().to_numpy(zero_copy_only=False)
            return np.ma.MaskedArray(col.fill_null(0).to_numpy(zero_copy_only=False), mask=missing)
    return col.to_pylist()


def _frame_columns(frame) -> dict[str, Any]:
    """A DataFrame's columns by name, each named once (a duplicated name would hide one of them)."""
    names = [str(c) for c in frame.columns]
    for c in names:
        if names.count(c) > 1:
            times = "twice" if names.count(c) == 2 else f"{names.count(c)} times"
            raise TraceError(f"<dataframe>: column {c} appears {times}")
    if hasattr(frame, "iloc"):  # pandas: by position, so that a column is a Series whatever its name
        return {c: frame.iloc[:, j] for j, c in enumerate(names)}
    return {str(c): frame[c] for c in frame.columns}


def _from_csv(path: Path, steps_per_second: float | None, label: str) -> Trace:
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:  # -sig: a spreadsheet's BOM is accepted
            text = fh.read()  # (once: a pipe cannot be read again)
    except UnicodeDecodeError as exc:
        raise TraceError(not_text(path, exc)) from None
    cols = _plain_csv(text, path)
    if cols is None:  # (quotes, blank lines, another width, a cell not spelled as the readers take it)
        header, cells, lines = _csv_records(text, path)
        _csv_repeated_header(header, cells, lines, path)
        cols = dict(zip(header, cells))
        for h in TRACE_COLUMNS:  # (whole where every cell reads; else `_from_columns` names the first bad one)
            if (whole := _text_column(h, cols[h])) is not None:
                cols[h] = whole
    else:
        lines = range(2, len(cols[TRACE_COLUMNS[0]]) + 2)  # (one row per line after the header)
    return _from_columns(cols, str(path), steps_per_second, label, lines=lines)


def _plain_csv(text: str, path: Path) -> dict[str, np.ndarray] | None:
    """The columns of the usual CSV trace (no quotes, no blank line or row of blank cells, every row of the
    header's width, every cell spelled as the readers take it), split by `str` methods and converted by
    `_text_column` in a few calls each; None for any other text (`_csv_records` then reads it)."""
    if '"' in text:
        return None
    if "\r" in text:  # (no quotes: every CR ends a line, alone or before LF, as the csv module reads it)
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if not lines or not lines[0].replace(",", "").strip() or _SEP_LINE.fullmatch(lines[0]):
        return None  # (no header, blank lines or Excel's `sep=,` before it)
    header = [h.strip() for h in lines[0].split(",")]
    _check_header(header, str(path))
    width = len(header)
    if set(map(operator.methodcaller("count", ","), lines)) != {width - 1} or max(map(len, lines)) > MAX_FIELD:
        return None  # (a blank line, a record of another width, a field that may be too long)
    fields = ",".join(lines[1:]).split(",") if len(lines) > 1 else []
    del lines  # (a string per row: the fields hold the text now)
    cols = {}
    for i, h in enumerate(header):  # (a row of blank cells fails too: the csv module's reader skips it)
        cols[h] = _text_column(h, fields[i::width])
        if cols[h] is None:
            return None
    return cols


def _csv_records(text: str, path: Path):
    """`_plain_csv`'s answer for any CSV trace, by the `csv` module: blank lines skipped (before the header
    too); a record of another width, a field over MAX_FIELD characters or unreadable CSV a TraceError naming
    its line.  Whole where it can (`_csv_whole`: quotes and blank lines, 1 M rows in about 5 s), else record
    by record (`_csv_loop`: about 12 s)."""
    return _csv_whole(text, path) or _csv_loop(text, path)


def _csv_repeated_header(header: list[str], cells: list[list[str]], lines: list[int], path: Path) -> None:
    """A row that repeats the header (two traces joined whole, ``cat a.csv b.csv``) named as such, not as its
    first cell that is no integer."""
    for i, first in enumerate(cells[0] if cells else ()):
        if first.strip() == header[0] and all(column[i].strip() == h for h, column in zip(header, cells)):
            raise TraceError(f"{path}: row {i + 1} (line {lines[i]}) repeats the header (two traces joined whole?); "
                             "remove it")


def _csv_reader(text: str):
    r"""A `csv.reader` over `text` whose lines end in ``\n``, ``\r\n`` or a lone ``\r`` (an old Mac's), as the other
    readers' files opened with ``newline=""`` (a StringIO's default splits at ``\n`` only: a lone ``\r`` was
    "new-line character seen in unquoted field")."""
    return csv.reader(io.StringIO(text, newline=""))


def _csv_loop(text: str, path: Path):
    """`_csv_records` record by record (a file `_csv_whole` does not take), naming the first bad line."""
    reader = _csv_reader(text)
    header = next_header(reader, path)
    if header is None:
        raise TraceError(f"{path}: empty file (expected the header {','.join(TRACE_COLUMNS)})")
    header = [h.strip() for h in header]
    _check_header(header, str(path))
    records: list[list[str]] = []
    lines: list[int] = []  # each row's line, for the messages
    while (rec := _next_record(reader, path)) is not None:
        lines.append(reader.line_num)
        if len(rec) != len(header):
            raise TraceError(f"{path}: row {len(lines)} (line {reader.line_num}): {len(rec)} fields, "
                             f"expected {len(header)}")
        for h, x in zip(header, rec):
            if len(x) > MAX_FIELD:
                raise TraceError(f"{path}: line {reader.line_num}, column {h}: a field of {len(x)} characters "
                                 f"(at most {MAX_FIELD})")
        records.append(rec)
    return header, [list(column) for column in zip(*records)] or [[] for _ in header], lines


def _csv_whole(text: str, path: Path):
    """`_csv_records`'s answer in a few C-level calls, for a file whose records are one line each (quoted or
    not, blank lines anywhere), each of the header's width, with no field over MAX_FIELD characters; None
    otherwise, and the record-by-record loop reads it, naming the first bad line."""
    reader = _csv_reader(text)
    try:
        records = list(reader)
    except csv.Error:
        return None
    if reader.line_num != len(records):
        return None  # (a quoted field over several lines: lines must be counted record by record)
    kept = np.fromiter(map(bool, map(str.strip, map("".join, records))), bool, len(records))
    where = np.flatnonzero(kept)  # (blank records are skipped, as `_next_record` does)
    if len(where) and excel_separator(records[where[0]], path):
        where = where[1:]
    if not len(where):
        return None
    header = [h.strip() for h in records[where[0]]]
    _check_header(header, str(path))
    records = [records[i] for i in where[1:].tolist()] if len(where) < len(records) else records[1:]
    width = len(header)
    fields = list(itertools.chain.from_iterable(records))
    if set(map(len, records)) - {width} or max(map(len, fields), default=0) > MAX_FIELD:
        return None
    del records
    return header, [fields[i::width] for i in range(width)], (where[1:] + 1).tolist()


def _list_column(name: str, src):
    """A list, tuple or object-array column converted whole when its cells are all of one plain kind: text
    (`_text_column`), Python ints (bools for the bool columns; ints and None for deadline_step); else None, and
    `_from_columns` checks the cells one by one (a bool or a float in an integer column is refused there)."""
    if not (type(src) in (list, tuple) or (type(src) is np.ndarray and src.dtype == object and src.ndim == 1)):
        return None
    kinds = set(map(type, src))
    if kinds == {str}:
        return _text_column(name, src)
    if name in BOOL_COLUMNS:
        return np.fromiter(src, bool, len(src)) if kinds <= {bool} else None
    given = None
    if name == "deadline_step" and type(None) in kinds:
        given = np.fromiter(map(operator.is_not, src, itertools.repeat(None)), bool, len(src))
        src = list(itertools.compress(src, given))
        kinds.discard(type(None))
    if not kinds <= {int}:
        return None
    try:
        values = np.fromiter(src, np.int64, len(src))
    except OverflowError:  # (past int64: the cell-by-cell check names it)
        return None
    if given is None:
        return values
    out = np.zeros(len(given), dtype=np.int64)
    out[given] = values
    return np.ma.MaskedArray(out, mask=~given)


def _text_column(name: str, cells):
    """A file's column of text cells converted whole by C-level maps, when every cell is spelled as the
    cell-by-cell readers take it (`parse_decimal`, `_parse_bool`; deadlines may be blank); None otherwise,
    and `_from_columns` checks the cells one by one, naming the first bad one."""
    if name in BOOL_COLUMNS:
        words = {x: x.strip().lower() for x in set(cells)}
        if not set(words.values()) <= _TRUE | _FALSE:
            return None
        return np.fromiter(map({x: w in _TRUE for x, w in words.items()}.__getitem__, cells), bool, len(cells))
    if name != "deadline_step":
        return _text_ints(cells)
    given = np.fromiter(map(bool, map(str.strip, cells)), bool, len(cells))
    values = _text_ints(list(itertools.compress(cells, given)))
    if values is None:
        return None
    out = np.zeros(len(cells), dtype=np.int64)
    out[given] = values
    return np.ma.MaskedArray(out, mask=~given)


def _text_ints(cells: list[str]) -> np.ndarray | None:
    """Text cells as int64 when each is ASCII digits with an optional '-' and spaces around (`parse_decimal`'s
    spelling) and fits; None otherwise.  `int` takes more spellings ('+1', '1_0', other scripts' digits), so
    the characters are checked first, all at once."""
    joined = "".join(cells)
    if not joined.isascii() or joined.encode().translate(None, b"0123456789- "):
        return None
    try:
        return np.fromiter(map(int, cells), np.int64, len(cells))
    except (ValueError, OverflowError):  # ('1 2', '1-', '', past int64)
        return None


def next_header(reader, path, error=None) -> list[str] | None:
    """The header record of a CSV file: its first record that is not blank, after the line ``sep=,`` that Excel
    writes first (and reads) to name the separator; None for a file of blank lines."""
    header = _next_record(reader, path)
    if header is not None and excel_separator(header, path, error):
        header = _next_record(reader, path)
    return header


_SEP_LINE = re.compile(r"\s*sep=(.?)\s*", re.IGNORECASE | re.DOTALL)


def excel_separator(record: list[str], path, error=None) -> bool:
    """Whether a CSV record is Excel's separator line ``sep=,`` (to skip: the file is separated by commas); a
    line naming another separator (``sep=;``, as a spreadsheet in a locale with decimal commas saves) is an
    `error` (TraceError by default) saying so, not a header missing every column."""
    said = _SEP_LINE.fullmatch(",".join(record))
    if said is None or said.group(1) == ",":
        return said is not None
    raise (error or TraceError)(f"{path}: its first line, {show('sep=' + said.group(1))}, says the fields are "
                                f"separated by {show(said.group(1))}; a CSV here is separated by commas (save it "
                                "as 'CSV (comma delimited)')")


def _next_record(reader, path: Path) -> list[str] | None:
    """The next CSV record that is not blank (blank lines are skipped, before the header too); None at the end."""
    while True:
        try:
            rec = next(reader)
        except StopIteration:
            return None
        except csv.Error as exc:
            raise TraceError(f"{path}: line {reader.line_num}: {_csv_problem(exc)}") from None
        if any(x.strip() for x in rec):
            return rec


def _csv_problem(exc: csv.Error) -> str:
    if "field limit" in str(exc):
        return f"a field longer than {csv.field_size_limit():,} characters"
    return f"unreadable CSV ({exc})"


def _raw_kind(header: list[str]) -> str:
    """What a header that is a raw trace's (`decodesched.convert`'s formats) is, else ''."""
    first = header[0].lstrip() if header else ""
    if "TIMESTAMP" in (h.strip().upper() for h in header):  # (anywhere: Azure 2024 and other tools' column orders)
        return "an Azure LLM trace"
    if first.startswith("{"):
        return "Mooncake JSON lines"
    return ""


def _check_header(header: list[str], where: str) -> None:
    missing = [c for c in TRACE_COLUMNS if c not in header]
    extra = _few([c for c in header if c not in TRACE_COLUMNS])
    dup = _few(sorted(c for c, n in Counter(header).items() if n > 1))
    if missing:
        raw = _raw_kind(header)
        if raw:
            raise TraceError(f"{where}: {raw}, not a canonical trace: convert it first "
                             f"(decodesched trace convert SRC --out trace.csv)")
        raise TraceError(f"{where}: missing column(s) {', '.join(missing)}{_header_hint(header, extra)}")
    if extra:
        raise TraceError(f"{where}: unexpected column(s) {', '.join(extra)} (allowed: {', '.join(TRACE_COLUMNS)})")
    if dup:
        raise TraceError(f"{where}: duplicate column(s) {', '.join(dup)}")


def _header_hint(header: list[str], extra: list[str]) -> str:
    """What a header that lacks columns holds instead, for `_check_header`'s line: another separator (one column
    holding ';' or a tab), the names in upper case, or else the unexpected names found."""
    if hint := separator_hint(header):
        return hint
    odd = [c for c in header if c not in TRACE_COLUMNS]
    if any(c.strip(" \t\ufeff") in TRACE_COLUMNS for c in odd):
        return f"; found {', '.join(extra)} (a byte-order mark, or a tab, in a name)"
    if any(c.strip(" \t\ufeff").lower() in TRACE_COLUMNS for c in odd):
        return f"; found {', '.join(extra)} (the names are lower case)"
    return f"; found {', '.join(extra)}" if extra else ""


def separator_hint(header: list[str], what: str = "a trace CSV") -> str:
    """For a CSV header that is one column holding ';', a tab or '|' (another separator than commas), a hint that
    says so, to end a line that reports columns missing (`what` is the kind of file); else ''."""
    if len(header) == 1:
        sep = next((name for ch, name in ((";", "';'"), ("\t", "tabs"), ("|", "'|'")) if ch in header[0]), None)
        if sep:
            return f" (its header is one column separated by {sep}; {what} is separated by commas)"
    return ""


def _few(names: list[str], most: int = 5) -> list[str]:
    """`names` to list in a one-line message: the first `most` (each shortened), then how many in all."""
    shown = [n if 0 < len(n) <= 40 and n.isprintable() else show(n) for n in names[:most]]  # ('': a trailing comma)
    return shown + [f"... ({len(names)} in all)"] if len(names) > most else shown


def _whole_ints(src) -> bool:
    """Whether a column is a plain NumPy array of integers that all fit in int64 (then it needs no
    check value by value; booleans, floats, strings and objects do)."""
    if type(src) is not np.ndarray or src.ndim != 1 or src.dtype.kind not in "iu":
        return False
    return src.dtype.kind == "i" or src.size == 0 or int(src.max()) <= INT64_MAX


def _is_pandas(v) -> bool:
    """Whether `v` is a pandas Series, Index or array (pandas is optional: not loaded, `v` is none of them)."""
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(v, (pd.Series, pd.Index, pd.api.extensions.ExtensionArray))


def _pandas_column(name: str, v):
    """A pandas column as `_from_columns` takes it, like `_arrow_column`: of its column's type (a NumPy or
    nullable integer dtype, or boolean for cache_hit and preemptible) and without NAs as a NumPy array, deadlines
    with NAs as a masked array, dates and durations as NumPy arrays (refused whole), anything else as Python values
    with None for NA, NaN and NaT.  Rows are taken by position, never by index label."""
    s = sys.modules["pandas"].Series(v).reset_index(drop=True)
    missing = s.isna().to_numpy(dtype=bool)
    dtype = s.dtype if isinstance(s.dtype, np.dtype) else getattr(s.dtype, "numpy_dtype", None)
    kind = dtype.kind if isinstance(dtype, np.dtype) else "O"
    if (kind == "b") if name in BOOL_COLUMNS else (kind in "iu"):
        if not missing.any():
            return s.to_numpy(dtype=dtype)
        if name == "deadline_step":
            return np.ma.MaskedArray(s.to_numpy(dtype=dtype, na_value=0), mask=missing)
    if kind in "mM":
        return s.to_numpy()
    values = s.to_numpy(dtype=object, copy=True)  # a copy: pandas may hand out a read-only view
    values[missing] = None
    return values


def _column(name: str, v, where: str):
    """One column as `_from_columns` checks it (pandas ones by `_pandas_column`); TraceError for anything that
    is not a 1-D sequence of plain values."""
    if _is_pandas(v):
        v = _pandas_column(name, v)
    elif _is_arrow(v, "Array", "ChunkedArray"):
        v = _arrow_column(name, v)
    _one_dim(name, v, where)
    if isinstance(v, (Set, Mapping)) or not hasattr(v, "__getitem__"):
        raise TraceError(f"{where}, column {name}: expected a sequence of {_WANT[name]}, got {type(v).__name__}")
    if isinstance(v, np.ndarray) and v.dtype.kind in "mM":
        raise TraceError(f"{where}, column {name}: expected {_WANT[name]}, got {v.dtype.name}")
    return v


def _one_dim(name: str, v, where: str) -> None:
    """A TraceError unless column `v` is a 1-D sequence (a string or a scalar is not)."""
    if isinstance(v, (str, bytes)) or not hasattr(v, "__len__") or getattr(v, "ndim", 1) != 1:
        what = f"an array of shape {v.shape}" if hasattr(v, "shape") else show(v)
        raise TraceError(f"{where}, column {name}: expected a 1-D column of values, got {what}")


def _check_lengths(cols: dict, where: str) -> int:
    """The number of rows, when every column is 1-D and all are as long; else a TraceError naming the first
    column that is not (of another length than most columns, request_id's on a tie)."""
    for name, v in cols.items():
        _one_dim(name, v, where)
    lengths = {name: len(v) for name, v in cols.items()}
    n = Counter(lengths.values()).most_common(1)[0][0]
    odd = next((name for name, k in lengths.items() if k != n), None)
    if odd is not None:
        raise TraceError(f"{where}: columns have different lengths: {odd} has {lengths[odd]} values, the others {n}")
    return n


def _is_missing(x) -> bool:
    """None, a blank string, NaN of any float type, a masked NumPy value, or pandas' NA or NaT."""
    if x is None or x is np.ma.masked:
        return True
    if isinstance(x, str):
        return x.strip() == ""
    if isinstance(x, (float, np.floating)):
        return bool(np.isnan(x))
    pd = sys.modules.get("pandas")  # pandas is optional: if it is not loaded, x is none of its values
    return pd is not None and (x is pd.NA or x is pd.NaT)


def _parse_int(x, where: str, col: str) -> int:
    """One cell of an integer column as an int within int64; TraceError naming the cell otherwise."""
    if is_integer(x):
        v = int(x)
    elif isinstance(x, (float, np.floating)):
        if not (math.isfinite(x) and float(x).is_integer()):
            raise TraceError(f"{where}, column {col}: expected an integer, got {show(x)}")
        v = int(x)
    elif isinstance(x, str):
        try:
            v = parse_decimal(x)
        except ValueError as exc:
            what = "does not fit in int64" if str(exc) == "too many digits" else "expected an integer"
            raise TraceError(f"{where}, column {col}: {what}, got {show(x)}") from None
    else:
        raise TraceError(f"{where}, column {col}: expected an integer, got {show(x)}")
    if not INT64_MIN <= v <= INT64_MAX:
        raise TraceError(f"{where}, column {col}: {show(v)} does not fit in int64")
    return v


def _parse_bool(x, where: str, col: str) -> bool:
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if is_integer(x) and int(x) in (0, 1):
        return bool(x)
    if isinstance(x, str) and x.strip().lower() in _TRUE | _FALSE:
        return x.strip().lower() in _TRUE
    raise TraceError(f"{where}, column {col}: expected true/false (or 1/0), got {show(x)}")


def _from_columns(cols: dict, where: str, steps_per_second: float | None, label: str,
                  lines: list[int] | None = None) -> Trace:
    """The checked trace; `lines` holds each row's line in a file, for the messages."""
    names = [str(c) for c in cols]
    _check_header(names, where)
    cols = {c: _column(c, cols[c], where) for c in TRACE_COLUMNS}
    cols = {c: v if (whole := _list_column(c, v)) is None else whole for c, v in cols.items()}
    n = _check_lengths(cols, where)
    if n == 0:
        raise TraceError(f"{where}: the trace is empty (no requests)")

    def loc(i: int) -> str:
        return f"{where}: row {i + 1}" + (f" (line {lines[i]})" if lines is not None else "")

    ints = {c: np.empty(n, dtype=np.int64) for c in INT_COLUMNS}
    bools = {c: np.empty(n, dtype=np.bool_) for c in BOOL_COLUMNS}
    deadline = np.zeros(n, dtype=np.int64)
    has_deadline = np.zeros(n, dtype=np.bool_)
    for c in INT_COLUMNS:
        src, dst = cols[c], ints[c]
        if _whole_ints(src):
            dst[:] = src
            continue
        for i in range(n):
            if _is_missing(src[i]):
                raise TraceError(f"{loc(i)}, column {c}: missing value")
            dst[i] = _parse_int(src[i], loc(i), c)
    for c in BOOL_COLUMNS:
        src, dst = cols[c], bools[c]
        if type(src) is np.ndarray and src.ndim == 1 and src.dtype == np.bool_:
            dst[:] = src
            continue
        for i in range(n):
            if _is_missing(src[i]):
                raise TraceError(f"{loc(i)}, column {c}: missing value")
            dst[i] = _parse_bool(src[i], loc(i), c)
    src = cols["deadline_step"]
    if _whole_ints(src):
        deadline[:] = src
        has_deadline[:] = True
    elif isinstance(src, np.ma.MaskedArray) and _whole_ints(src.data):
        has_deadline[:] = ~np.ma.getmaskarray(src)
        deadline[has_deadline] = src.data[has_deadline]
    else:
        for i in range(n):
            if not _is_missing(src[i]):
                deadline[i] = _parse_int(src[i], loc(i), "deadline_step")
                has_deadline[i] = True

    arrival, prompt, new, blocks, prio = (
        ints["arrival_step"], ints["prompt_len"], ints["max_new_tokens"], ints["required_blocks"], ints["priority"]
    )
    _first_bad(arrival < 0, loc, "arrival_step", "must be >= 0", arrival)
    _first_bad(arrival > MAX_STEP, loc, "arrival_step", "must be <= 2**53", arrival)
    for c, a in (("prompt_len", prompt), ("max_new_tokens", new), ("required_blocks", blocks)):
        _first_bad(a <= 0, loc, c, "must be positive", a)
        _first_bad(a > MAX_LENGTH, loc, c, "must be <= 2**40", a)
    _first_bad((prio > MAX_STEP) | (prio < -MAX_STEP), loc, "priority", "must be within +-2**53", prio)
    _first_bad(has_deadline & (deadline <= arrival), loc, "deadline_step",
               "must be after its arrival_step", deadline, extra=arrival)
    _first_bad(has_deadline & (deadline > MAX_STEP), loc, "deadline_step", "must be <= 2**53", deadline)
    ids = ints["request_id"]
    order = np.argsort(ids, kind="stable")
    dup = np.nonzero(ids[order][1:] == ids[order][:-1])[0]
    if dup.size:
        second = int(order[dup[0] + 1])
        first = int(order[dup[0]])
        raise TraceError(
            f"{loc(max(first, second))}, column request_id: duplicate request_id {int(ids[second])} "
            f"(also in row {min(first, second) + 1})"
        )
    if float(arrival.max()) + float(n) + float(new.astype(np.float64).sum()) > MAX_TOTAL:
        raise TraceError(f"{where}: the trace's total work steps exceed 2**61 and would overflow the step clock")
    if float(blocks.astype(np.float64).sum()) > MAX_TOTAL:
        raise TraceError(f"{where}: the sum of required_blocks exceeds 2**61")
    if steps_per_second is not None:
        steps_per_second = _time_scale(steps_per_second, where)
    label = _trace_name(label, where)
    trace = Trace(
        request_id=ids,
        arrival_step=arrival,
        prompt_len=prompt,
        max_new_tokens=new,
        priority=prio,
        cache_hit=bools["cache_hit"],
        required_blocks=blocks,
        deadline_step=deadline,
        has_deadline=has_deadline,
        preemptible=bools["preemptible"],
        steps_per_second=steps_per_second,
        name=label,
    )
    return _checked(trace)


def _first_bad(mask: np.ndarray, loc, col: str, what: str, values: np.ndarray, extra: np.ndarray | None = None) -> None:
    bad = np.flatnonzero(mask)
    if bad.size:
        i = int(bad[0])
        got = f"got {int(values[i])}" + (f" (arrival_step {int(extra[i])})" if extra is not None else "")
        raise TraceError(f"{loc(i)}, column {col}: {what}; {got}")
