"""The events and requests tables on disk: CSV or Parquet (by extension), written in chunks straight
from the kernels' arrays, and read back exactly.

Writing formats a chunk of rows at a time with NumPy (digits scattered into one byte buffer, no
Python loop over rows), so memory stays bounded by the chunk and the speed is close to the disk's.
A ``.parquet`` / ``.pq`` path writes Parquet (one row group per chunk; needs the ``data`` extra,
pyarrow); anything else, ``-`` (standard output) included, writes CSV.  `read_table` reads either
back into the same NumPy columns: nullable columns come back as masked arrays.

CSV spelling (docs/files.md): integers in decimal, booleans ``true``/``false``, an empty field for a
missing value, integral floats as integers and other floats in their shortest exact form.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._io import atomic_writer
from .errors import UserError
from .kernels import enums as E

CHUNK_ROWS = 1 << 16  # rows per chunk: its buffers stay in the CPU caches
PARQUET_SUFFIXES = (".parquet", ".pq")

# Column kinds: int, int? (nullable), bool, bool?, float? (NaN = missing), str.
EVENT_SCHEMA = (
    ("step", "int"), ("request_id", "int"), ("phase", "str"), ("action", "str"), ("prompt_len", "int"),
    ("generated_len", "int"), ("max_new_tokens", "int"), ("wait_steps", "int"), ("free_kv_blocks", "int"),
    ("preempted_request_id", "int?"), ("deadline_missed", "bool"),
)
REQUEST_SCHEMA = (
    ("request_id", "int"), ("arrival_step", "int"), ("prompt_len", "int"), ("max_new_tokens", "int"),
    ("priority", "int"), ("cache_hit", "bool"), ("required_blocks", "int"), ("deadline_step", "int?"),
    ("preemptible", "bool"), ("first_step", "int?"), ("first_token_step", "int?"), ("finish_step", "int?"),
    ("wait_steps", "int"), ("preemptions", "int"), ("status", "str"), ("queue_wait", "float?"),
    ("ttft", "float?"), ("tpot", "float?"), ("e2e", "float?"), ("deadline_met", "bool?"),
)


def is_parquet(path) -> bool:
    return str(path) != "-" and Path(path).suffix.lower() in PARQUET_SUFFIXES


# -- columns of one chunk ------------------------------------------------------------------------

@dataclass
class Col:
    """One column of a chunk: `values` (int64, bool, float64 or a str array of codes into `vocab`)
    and `missing` (a bool mask, or None)."""

    kind: str
    values: np.ndarray
    missing: np.ndarray | None = None
    vocab: tuple[str, ...] | None = None  # for kind "str": values are codes into vocab


def _event_chunk(event_log: np.ndarray, trace, lo: int, hi: int) -> list[Col]:
    ev = event_log[lo:hi]
    rows = ev[:, E.EV_ROW]
    victim = ev[:, E.EV_VICTIM_ROW]
    action = ev[:, E.EV_ACTION]
    none = victim == E.NO_ROW
    return [
        Col("int", ev[:, E.EV_STEP]),
        Col("int", trace.request_id[rows]),
        Col("str", (action != E.ACTION_PREFILL_TO_DECODE).astype(np.int64), vocab=("prefill", "decode")),
        Col("str", action, vocab=tuple(E.ACTION_NAMES)),
        Col("int", trace.prompt_len[rows]),
        Col("int", ev[:, E.EV_GENERATED]),
        Col("int", trace.max_new_tokens[rows]),
        Col("int", ev[:, E.EV_WAIT]),
        Col("int", ev[:, E.EV_FREE]),
        Col("int?", trace.request_id[np.where(none, 0, victim)], none),
        Col("bool", ev[:, E.EV_MISSED].astype(bool)),
    ]


def _request_chunk(req: dict, lo: int, hi: int) -> list[Col]:
    cols = []
    for name, kind in REQUEST_SCHEMA:
        v = req[name][lo:hi]
        if name == "deadline_step":
            missing = ~req["has_deadline"][lo:hi]
            if v.dtype == object:
                v = v.copy()
                v[missing] = 0
            cols.append(Col(kind, v.astype(np.int64), missing))
        elif name in ("first_step", "first_token_step", "finish_step"):
            cols.append(Col(kind, v, v < 0))
        elif name == "deadline_met":
            cols.append(Col(kind, v.astype(bool), ~req["has_deadline"][lo:hi]))
        elif kind == "str":
            vocab, codes = np.unique(v.astype(str), return_inverse=True)
            cols.append(Col(kind, codes.astype(np.int64), vocab=tuple(vocab.tolist())))
        elif kind == "float?":
            v = v.astype(np.float64)
            cols.append(Col(kind, v, np.isnan(v)))
        else:
            cols.append(Col(kind, v))
    return cols


# -- CSV formatting ------------------------------------------------------------------------------

_POW10 = np.array([10**i for i in range(20)], dtype=np.uint64)
_COMMA, _NL, _MINUS = ord(","), ord("\n"), ord("-")


def _int_parts(v: np.ndarray):
    """(negative, magnitude as uint64, number of digits) of int64 values (INT64_MIN included)."""
    v = v.astype(np.int64, copy=False)
    neg = v < 0
    mag = v.astype(np.uint64)  # two's complement: -x as uint64 is 2**64 - x
    mag[neg] = (~mag[neg]) + np.uint64(1)
    nd = np.ones(v.shape, dtype=np.int64)
    if v.size:
        top = mag.max()
        for p in _POW10[1:]:
            if p > top:
                break
            nd += mag >= p
    return neg, mag, nd


_TWO_DIGITS = np.array([[ord(a), ord(b)] for a in "0123456789" for b in "0123456789"], dtype=np.uint8)


def _scatter_int(out: np.ndarray, pos: np.ndarray, neg, mag, nd) -> None:
    """Write decimal digits of `mag` (with '-' where `neg`) starting at `pos`, two digits a pass."""
    out[pos[neg]] = _MINUS
    end = pos + neg + nd
    r = mag
    hundred = np.uint64(100)
    while r.size:
        q = r // hundred
        pair = _TWO_DIGITS[r - q * hundred]
        out[end - 1] = pair[:, 1]
        two = r >= 10
        if two.all():
            out[end - 2] = pair[:, 0]
        else:
            out[end[two] - 2] = pair[two, 0]
        end = end - 2
        keep = q > 0
        if keep.all():
            r = q
        else:
            r, end = q[keep], end[keep]


class _Formatted:
    """A column of a chunk ready to be scattered: its field lengths and a writer."""

    def __init__(self, col: Col):
        n = col.values.shape[0]
        missing = col.missing if col.missing is not None else np.zeros(n, dtype=bool)
        self.parts = []  # (row indices or None, kind, payload)
        if col.kind in ("int", "int?"):
            keep = np.flatnonzero(~missing)
            neg, mag, nd = _int_parts(col.values[keep])
            self.lengths = np.zeros(n, dtype=np.int64)
            self.lengths[keep] = nd + neg
            self.parts.append((keep, "int", (neg, mag, nd)))
        elif col.kind in ("bool", "bool?"):
            codes = np.where(missing, 2, col.values.astype(np.int64))
            self._vocab(codes, (b"false", b"true", b""))
        elif col.kind == "str":
            self._vocab(col.values, tuple(s.encode() for s in col.vocab))
        elif col.kind == "float?":
            v = col.values
            integral = ~missing & (np.floor(v) == v) & (np.abs(v) < 2.0**63)
            frac = np.flatnonzero(~missing & ~integral)
            ints = np.flatnonzero(integral)
            neg, mag, nd = _int_parts(v[ints].astype(np.int64))
            self.lengths = np.zeros(n, dtype=np.int64)
            self.lengths[ints] = nd + neg
            self.parts.append((ints, "int", (neg, mag, nd)))
            if frac.size:
                text = v[frac].astype(str)  # NumPy's shortest round-trip repr
                raw = np.char.encode(text, "ascii")
                width = raw.dtype.itemsize
                mat = np.frombuffer(raw.tobytes(), dtype=np.uint8).reshape(frac.size, width)
                lens = np.char.str_len(raw).astype(np.int64)
                self.lengths[frac] = lens
                self.parts.append((frac, "bytes", (mat, lens)))
        else:  # pragma: no cover - the schemas above use only these kinds
            raise ValueError(col.kind)

    def _vocab(self, codes: np.ndarray, words: tuple[bytes, ...]) -> None:
        lens = np.array([len(w) for w in words], dtype=np.int64)
        self.lengths = lens[codes]
        self.parts.append((None, "vocab", (codes, words)))

    def scatter(self, out: np.ndarray, pos: np.ndarray) -> None:
        for rows, kind, payload in self.parts:
            if kind == "int":
                _scatter_int(out, pos[rows], *payload)
            elif kind == "vocab":
                codes, words = payload
                for code, word in enumerate(words):
                    if not word:
                        continue
                    at = pos[codes == code]
                    for t, byte in enumerate(word):
                        out[at + t] = byte
            else:
                mat, lens = payload
                at = pos[rows]
                for t in range(mat.shape[1]):
                    sel = lens > t
                    out[at[sel] + t] = mat[sel, t]


def format_csv_rows(cols: list[Col]) -> np.ndarray:
    """The CSV lines of one chunk as a uint8 buffer (no header)."""
    fmt = [_Formatted(c) for c in cols]
    row_len = sum(f.lengths for f in fmt) + len(fmt)  # k - 1 commas and a newline
    ends = np.cumsum(row_len, dtype=np.int64)
    out = np.full(int(ends[-1]) if ends.size else 0, _COMMA, dtype=np.uint8)
    if not ends.size:
        return out
    out[ends - 1] = _NL
    pos = ends - row_len
    for f in fmt:
        f.scatter(out, pos)
        pos += f.lengths + 1
    return out


# -- writers -------------------------------------------------------------------------------------

def _arrow_column(col: Col):
    import pyarrow as pa

    if col.kind == "str":
        words = pa.array(list(col.vocab), type=pa.string())
        return words.take(pa.array(col.values, type=pa.int64()))
    mask = col.missing if col.missing is not None and col.missing.any() else None
    typ = {"int": pa.int64(), "int?": pa.int64(), "bool": pa.bool_(), "bool?": pa.bool_(),
           "float?": pa.float64()}[col.kind]
    return pa.array(col.values, type=typ, mask=mask)


def _write(path, schema, n_rows: int, chunk) -> None:
    names = [name for name, _ in schema]
    if is_parquet(path):
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise UserError(f"{path}: writing Parquet needs pyarrow: pip install 'decodesched[data]'") from None
        typ = {"int": pa.int64(), "int?": pa.int64(), "bool": pa.bool_(), "bool?": pa.bool_(),
               "float?": pa.float64(), "str": pa.string()}
        arrow_schema = pa.schema([pa.field(n, typ[k], nullable=k.endswith("?")) for n, k in schema])
        with atomic_writer(path, "wb") as fh:
            with pq.ParquetWriter(fh, arrow_schema) as writer:
                for lo in range(0, max(n_rows, 1), CHUNK_ROWS):
                    hi = min(lo + CHUNK_ROWS, n_rows)
                    arrays = [_arrow_column(c) for c in chunk(lo, hi)]
                    writer.write_table(pa.Table.from_arrays(arrays, schema=arrow_schema))
        return
    with atomic_writer(path, "wb") as fh:
        fh.write((",".join(names) + "\n").encode())
        for lo in range(0, n_rows, CHUNK_ROWS):
            fh.write(memoryview(format_csv_rows(chunk(lo, min(lo + CHUNK_ROWS, n_rows)))))


def write_events(path, event_log: np.ndarray, trace) -> None:
    """The events table (docs/files.md) of a kernel's (n, EV_NCOLS) log, CSV or Parquet by extension."""
    _write(path, EVENT_SCHEMA, int(event_log.shape[0]), lambda lo, hi: _event_chunk(event_log, trace, lo, hi))


def write_requests(path, req: dict) -> None:
    """The requests table (docs/files.md) of a `metrics.request_table`, CSV or Parquet by extension."""
    n = int(req["request_id"].shape[0])
    _write(path, REQUEST_SCHEMA, n, lambda lo, hi: _request_chunk(req, lo, hi))


# -- readers -------------------------------------------------------------------------------------

def read_table(path) -> dict[str, np.ndarray]:
    """An events or requests file (CSV or Parquet) as columns: int64, bool, float64 or str arrays;
    nullable int and bool columns as `numpy.ma.MaskedArray`, missing floats as NaN."""
    path = Path(path)
    if is_parquet(path):
        return _read_parquet(path)
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise UserError(f"{path}: empty file")
        schema = _schema_of(header, path)
        raw = [[] for _ in header]
        for rec in reader:
            if len(rec) != len(header):
                raise UserError(f"{path}: line {reader.line_num}: {len(rec)} fields, expected {len(header)}")
            for store, x in zip(raw, rec):
                store.append(x)
    return {name: _parse_column(values, kind) for (name, kind), values in zip(schema, raw)}


def _schema_of(header: list[str], path) -> tuple:
    for schema in (EVENT_SCHEMA, REQUEST_SCHEMA):
        if header == [n for n, _ in schema]:
            return schema
    raise UserError(f"{path}: not an events or requests table (header {','.join(header)[:120]})")


def _parse_column(values: list[str], kind: str):
    a = np.array(values, dtype=str)
    missing = a == ""
    if kind == "str":
        return a.astype(object).astype(str)
    if kind.startswith("bool"):
        out = a == "true"
        return np.ma.MaskedArray(out, mask=missing) if kind.endswith("?") else out
    if kind.startswith("int"):
        out = np.where(missing, "0", a).astype(np.int64) if a.size else np.zeros(0, np.int64)
        return np.ma.MaskedArray(out, mask=missing) if kind.endswith("?") else out
    out = np.full(a.shape, np.nan)
    if (~missing).any():
        out[~missing] = a[~missing].astype(np.float64)
    return out


def _read_parquet(path: Path) -> dict[str, np.ndarray]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"{path}: reading Parquet needs pyarrow: pip install 'decodesched[data]'") from None
    table = pq.read_table(path)
    schema = _schema_of(table.column_names, path)
    out = {}
    for name, kind in schema:
        col = table.column(name)
        missing = np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        if kind == "str":
            out[name] = np.array(col.to_pylist(), dtype=str)
        elif kind == "float?":
            out[name] = np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)
        else:
            dtype = np.int64 if kind.startswith("int") else bool
            filled = col.fill_null(0 if dtype is np.int64 else False)
            values = np.asarray(filled.to_numpy(zero_copy_only=False), dtype=dtype)
            out[name] = np.ma.MaskedArray(values, mask=missing) if kind.endswith("?") else values
    return out


def tables_equal(a: dict, b: dict) -> bool:
    """Whether two tables from `read_table` hold the same values (NaN equal to NaN, masks equal)."""
    if list(a) != list(b):
        return False
    for k in a:
        x, y = a[k], b[k]
        if np.ma.isMaskedArray(x) or np.ma.isMaskedArray(y):
            if not (np.array_equal(np.ma.getmaskarray(x), np.ma.getmaskarray(y))
                    and np.array_equal(np.ma.filled(x, 0), np.ma.filled(y, 0))):
                return False
        elif x.dtype.kind == "f":
            if not np.array_equal(x, y, equal_nan=True):
                return False
        elif not np.array_equal(x, y):
            return False
    return True


__all__ = ["write_events", "write_requests", "read_table", "tables_equal", "format_csv_rows", "is_parquet",
           "EVENT_SCHEMA", "REQUEST_SCHEMA", "CHUNK_ROWS"]
