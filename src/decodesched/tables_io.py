"""The events and requests tables on disk: CSV or Parquet (by extension), written in chunks straight
from the kernels' arrays, and read back exactly.

Writing formats a chunk of rows at a time with NumPy (no Python loop over rows: see
`format_csv_rows`), so memory stays bounded by the chunk.  A ``.parquet`` / ``.pq`` path writes
Parquet (one row group per `PARQUET_CHUNK_ROWS` rows, Arrow arrays over the chunk's NumPy buffers:
see `_write_parquet`; needs the ``data`` extra, pyarrow); a ``.csv`` path or ``-`` (standard output)
writes CSV, and any other name is refused (`table_format`): ``out.json`` or ``out.csv.gz`` would
otherwise hold plain CSV under a name that promises something else.  `read_table` reads either back into the same NumPy columns: nullable columns
come back as masked arrays.

CSV spelling (docs/files.md): integers in decimal, booleans ``true``/``false``, an empty field for a
missing value, integral floats as integers and other floats in their shortest exact form.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._io import atomic_writer, extension_said, input_file, not_text, read_parquet_table
from .errors import UserError
from .kernels import enums as E
from .metrics import STATUS_WORDS
from .trace import (_FALSE, _TRUE, INT64_MAX, INT64_MIN, _few, next_header, parse_decimal, plain_value,
                    separator_hint, show)

CHUNK_ROWS = 1 << 15  # CSV rows per chunk: its byte matrix (about 3 MB) stays in the CPU caches
PARQUET_CHUNK_ROWS = 1 << 17  # rows per Parquet row group: 1 MB columns, reused by malloc (1 << 20: 0.3 s of page faults)
PARQUET_SUFFIXES = (".parquet", ".pq")
CSV_SUFFIXES = (".csv",)

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


# The words a "str" column may hold (the readers refuse any other: a damaged or hand-made file).
WORDS = {"phase": E.PHASE_NAMES, "action": E.ACTION_NAMES, "status": STATUS_WORDS}


def is_parquet(path) -> bool:
    return str(path) != "-" and Path(path).suffix.lower() in PARQUET_SUFFIXES


def table_format(path) -> str:
    """``"csv"`` or ``"parquet"``: the format an events or requests table is written in, by the
    extension of `path` (any case; ``-`` is CSV on standard output).  Any other name is a
    `UserError`, raised before anything is written."""
    if str(path) == "-":
        return "csv"
    suffix = Path(path).suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    if suffix in CSV_SUFFIXES:
        return "csv"
    raise UserError(f"{path}: a table is written as .csv or .parquet (.pq), or - for standard output; "
                    f"got {extension_said(path)}")


def check_table_output(path) -> str:
    """`table_format(path)`, and for Parquet that pyarrow is there to write it: for a command to call before
    its work, so that a missing extra is said at once, not after a long replay."""
    fmt = table_format(path)
    if fmt == "parquet":
        _parquet_modules(path)
    return fmt


def _parquet_modules(path):
    """``(pyarrow, pyarrow.parquet)``, or a `UserError` naming `path` and the extra that installs them."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"{path}: writing Parquet needs pyarrow: pip install 'decodesched[data]'") from None
    return pa, pq


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
        Col("str", (action != E.ACTION_PREFILL_TO_DECODE).astype(np.int64), vocab=WORDS["phase"]),
        Col("str", action, vocab=WORDS["action"]),
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
_COMMA, _NL, _MINUS, _ZERO = ord(","), ord("\n"), ord("-"), ord("0")
_BILLION, _LIMB_FITS = np.uint64(10**9), np.uint64(2**32)


def _magnitudes(v: np.ndarray):
    """(magnitude as uint64, negative mask or None) of int64 values (INT64_MIN included)."""
    v = v.astype(np.int64, copy=False)
    mag = v.astype(np.uint64)  # two's complement: -x as uint64 is 2**64 - x
    neg = v < 0
    if not neg.any():
        return mag, None
    mag[neg] = (~mag[neg]) + np.uint64(1)
    return mag, neg


def _digits(mag: np.ndarray) -> np.ndarray:
    """Number of decimal digits of each uint64 (1 for 0)."""
    nd = np.ones(mag.shape, dtype=np.int64)
    top = mag.max() if mag.size else 0
    for p in _POW10[1:]:
        if p > top:
            break
        nd += mag >= p
    return nd


def _limbs(mag: np.ndarray) -> list[np.ndarray]:
    """`mag` (uint64) in base 10**9, least significant limb first, each limb uint32 (NumPy
    divides uint32 by a constant about 12x faster than uint64); at least one limb."""
    limbs = []
    while mag.size and mag.max() >= _LIMB_FITS:
        q = mag // _BILLION
        limbs.append((mag - q * _BILLION).astype(np.uint32))
        mag = q
    limbs.append(mag.astype(np.uint32))
    return limbs


def _write_int(mat: np.ndarray, end: int, mag: np.ndarray, neg) -> None:
    """Right-align the decimal digits of `mag` (and '-' where `neg`) in columns before `end`."""
    width = int(_digits(mag.max(keepdims=True))[0]) if mag.size else 1
    limbs = _limbs(mag)
    above = [None] * len(limbs)  # above[k]: whether a more significant limb than k is nonzero
    for k in range(len(limbs) - 2, -1, -1):
        above[k] = limbs[k + 1] != 0 if above[k + 1] is None else above[k + 1] | (limbs[k + 1] != 0)
    ten = np.uint32(10)
    for j in range(width):
        k = min(j // 9, len(limbs) - 1)  # the last limb (< 2**32) may hold a tenth digit
        r = limbs[k]
        q = r // ten
        digit = r - q * ten + _ZERO
        if j:  # no leading zeros: a zero byte is padding, dropped at the end
            digit *= r > 0 if above[k] is None else (r > 0) | above[k]
        mat[:, end - 1 - j] = digit
        limbs[k] = q
    if neg is not None:
        rows = np.flatnonzero(neg)
        mat[rows, end - 1 - _digits(mag[rows])] = _MINUS


class _Field:
    """How one column of a chunk fills its fixed-width slot of the row matrix (zero bytes = padding)."""

    def __init__(self, col: Col):
        n = col.values.shape[0]
        self.col = col
        self.missing = col.missing if col.missing is not None and col.missing.any() else None
        if col.kind in ("int", "int?"):
            self.mag, self.neg = _magnitudes(np.where(self.missing, 0, col.values) if self.missing is not None
                                             else col.values)
            self.width = self._int_width()
        elif col.kind in ("bool", "bool?", "str"):
            words = [s.encode() for s in col.vocab] if col.kind == "str" else [b"false", b"true", b""]
            self.codes = col.values.astype(np.int64, copy=False) if col.kind == "str" else \
                np.where(self.missing, 2, col.values.astype(np.int64)) if self.missing is not None else \
                col.values.astype(np.int64)
            self.width = max(1, *(len(w) for w in words))
            self.table = np.zeros((len(words), self.width), dtype=np.uint8)
            for i, w in enumerate(words):
                self.table[i, : len(w)] = np.frombuffer(w, dtype=np.uint8)
        elif col.kind == "float?":
            v = col.values
            ok = ~np.isnan(v)
            integral = ok & (np.floor(v) == v) & (np.abs(v) < 2.0**63)
            self.frac = np.flatnonzero(ok & ~integral)
            self.blank = ~integral  # zeroed before the non-integral text goes in
            self.mag, self.neg = _magnitudes(np.where(integral, v, 0).astype(np.int64))
            self.width = self._int_width()
            if self.frac.size:
                raw = np.char.encode(v[self.frac].astype(str), "ascii")  # NumPy's shortest round-trip text
                self.text = np.frombuffer(raw.tobytes(), dtype=np.uint8).reshape(self.frac.size, raw.dtype.itemsize)
                self.width = max(self.width, self.text.shape[1])
        else:  # pragma: no cover - the schemas above use only these kinds
            raise ValueError(col.kind)
        self.n = n

    def _int_width(self) -> int:
        width = int(_digits(self.mag.max(keepdims=True))[0]) if self.mag.size else 1
        return width + (self.neg is not None)

    def fill(self, mat: np.ndarray, start: int) -> None:
        end = start + self.width
        kind = self.col.kind
        if kind in ("bool", "bool?", "str"):
            mat[:, start:end] = self.table[self.codes]
            return
        _write_int(mat, end, self.mag, self.neg)
        if kind == "float?":
            mat[self.blank, start:end] = 0
            if self.frac.size:
                mat[self.frac, start:start + self.text.shape[1]] = self.text
        elif self.missing is not None:
            mat[self.missing, start:end] = 0


def format_csv_rows(cols: list[Col]) -> np.ndarray:
    """The CSV lines of one chunk as a uint8 buffer (no header).

    Each row is first laid out in fixed-width slots of a (rows, width) byte matrix, one NumPy
    operation per column and digit position, with zero bytes as padding; dropping the zeros then
    leaves the CSV text (no field contains a zero byte)."""
    fields = [_Field(c) for c in cols]
    n = cols[0].values.shape[0] if cols else 0
    width = sum(f.width + 1 for f in fields)
    mat = np.zeros((n, width), dtype=np.uint8)
    start = 0
    for f in fields:
        f.fill(mat, start)
        start += f.width
        mat[:, start] = _COMMA
        start += 1
    if n:
        mat[:, -1] = _NL
    flat = mat.reshape(-1)
    return flat[flat != 0]


# -- writers -------------------------------------------------------------------------------------

def _arrow_column(pa, col: Col):
    """One chunk column as an Arrow array over the NumPy buffers (no copy for a contiguous int64 or
    float64 column).  Built from buffers, not with ``pa.array`` (whose first call imports pandas) or
    Arrow compute (whose first call loads its kernels): together 0.4 s of a one-off command."""
    n = col.values.shape[0]
    missing = col.missing if col.missing is not None and col.missing.any() else None
    validity = None if missing is None else pa.py_buffer(np.packbits(~missing, bitorder="little"))
    nulls = 0 if missing is None else int(np.count_nonzero(missing))
    if col.kind == "str":  # dictionary-encoded: the codes index the vocabulary, no string per row
        words = [w.encode() for w in col.vocab]
        offsets = np.zeros(len(words) + 1, dtype=np.int32)
        np.cumsum([len(w) for w in words], out=offsets[1:])
        vocab = pa.Array.from_buffers(pa.string(), len(words), [None, pa.py_buffer(offsets),
                                                                 pa.py_buffer(b"".join(words))])
        codes = pa.py_buffer(col.values.astype(np.int32))
        return pa.DictionaryArray.from_buffers(_dict_type(pa), n, [None, codes], vocab)
    if col.kind in ("bool", "bool?"):
        bits = np.packbits(col.values.astype(bool, copy=False), bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), n, [validity, pa.py_buffer(bits)], null_count=nulls)
    dtype, typ = (np.float64, pa.float64()) if col.kind == "float?" else (np.int64, pa.int64())
    values = np.ascontiguousarray(col.values, dtype=dtype)
    return pa.Array.from_buffers(typ, n, [validity, pa.py_buffer(values)], null_count=nulls)


def _dict_type(pa):
    return pa.dictionary(pa.int32(), pa.string())


def _write_parquet(path, schema, n_rows: int, chunk) -> None:
    """Row groups of `PARQUET_CHUNK_ROWS` rows.  Strings go in as dictionary arrays (written as
    dictionary pages directly, no hashing) and integers DELTA_BINARY_PACKED (fast, and 5x smaller
    than dictionary-encoded for event logs).  No Arrow schema is stored, so every reader sees the
    plain Parquet schema: int64, boolean and UTF-8 string columns, nullable where documented."""
    pa, pq = _parquet_modules(path)
    typ = {"int": pa.int64(), "int?": pa.int64(), "bool": pa.bool_(), "bool?": pa.bool_(),
           "float?": pa.float64(), "str": _dict_type(pa)}
    arrow_schema = pa.schema([pa.field(n, typ[k], nullable=k.endswith("?")) for n, k in schema])
    options = {"use_dictionary": [n for n, k in schema if k == "str"], "store_schema": False,
               "column_encoding": {n: "DELTA_BINARY_PACKED" for n, k in schema if k.startswith("int")}}
    with atomic_writer(path, "wb") as fh:
        with pq.ParquetWriter(fh, arrow_schema, **options) as writer:
            for lo in range(0, max(n_rows, 1), PARQUET_CHUNK_ROWS):
                arrays = [_arrow_column(pa, c) for c in chunk(lo, min(lo + PARQUET_CHUNK_ROWS, n_rows))]
                writer.write_table(pa.Table.from_arrays(arrays, schema=arrow_schema))


def _write(path, schema, n_rows: int, chunk) -> None:
    if table_format(path) == "parquet":
        _write_parquet(path, schema, n_rows, chunk)
        return
    names = [name for name, _ in schema]
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
    nullable int and bool columns as `numpy.ma.MaskedArray`, missing floats as NaN.  A file that is
    not such a table, or a cell that does not fit its column, is a `UserError` naming it."""
    path = input_file(path, "table file")
    if is_parquet(path):
        return _read_parquet(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:  # (with or without a byte-order mark)
            reader = csv.reader(fh)
            header = next_header(reader, path, UserError)  # (blank lines and Excel's `sep=,` skipped, as in a trace)
            if header is None:
                raise UserError(f"{path}: empty file")
            header = [h.strip() for h in header]
            schema = _schema_of(header, path)
            raw = [[] for _ in header]
            lines = []
            for rec in reader:
                if len(rec) != len(header):
                    if _blank(rec):
                        continue
                    raise UserError(f"{path}: line {reader.line_num}: {len(rec)} fields, expected {len(header)}")
                lines.append(reader.line_num)
                for store, x in zip(raw, rec):
                    store.append(x)
    except UnicodeDecodeError as exc:
        raise UserError(not_text(path, exc)) from None
    except csv.Error as exc:
        raise UserError(f"{path}: not a CSV file ({exc})") from None
    out = {}
    for name, kind in schema:  # (by name: the header may list the columns in another order)
        values = raw[header.index(name)]
        try:
            out[name] = _parse_column(values, kind)
        except ValueError:
            i = next((i for i, v in enumerate(values) if not _cell_ok(v, kind)), 0)
            what = "a NUL byte (a damaged file?)" if "\0" in values[i] else \
                f"not a {_KIND_WORDS[kind.rstrip('?')]}{' or empty' if kind.endswith('?') else ''}"
            raise UserError(f"{path}: line {lines[i]}, column {name}: {what}: {show(values[i])}") from None
    _check_words(out, path, lambda i: f"line {lines[i]}")
    return out


def _check_words(table: dict, path, where) -> None:
    """UserError naming the first cell of a word column (`WORDS`) that holds another word; `where(i)` names row i."""
    for name, words in WORDS.items():
        if name in table:
            bad = ~np.isin(table[name], words)
            if bad.any():
                i = int(np.argmax(bad))
                raise UserError(f"{path}: {where(i)}, column {name}: not one of {', '.join(words)}: "
                                f"{show(str(table[name][i]))}")


def _blank(rec: list[str]) -> bool:
    """Whether a CSV record is a blank line (no field, or spaces only)."""
    return not any(x.strip() for x in rec)


_KIND_WORDS = {"int": "whole number", "bool": "true/false", "float": "number"}
_INT_TYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_FLOAT_TYPES = ("halffloat", "float", "double")
_PARQUET_TYPES = {  # what a Parquet column of each kind may be: a type that holds its values unambiguously
    "int": ("integers", lambda t: str(t) in _INT_TYPES or str(t) in _FLOAT_TYPES),  # (uint64, floats: by value)
    "bool": ("booleans", lambda t: str(t) == "bool"),
    "float": ("numbers", lambda t: str(t) in _FLOAT_TYPES or str(t) in _INT_TYPES),
    "str": ("strings", lambda t: str(t) in ("string", "large_string")),
}
MAX_EXACT = 2**53  # a float column's whole numbers are integers exactly up to here


def _cell_ok(x: str, kind: str) -> bool:
    """Whether one CSV cell fits a column of `kind`, by the spellings of docs/files.md (what `_parse_column`
    takes, cell by cell)."""
    x = x.strip()
    if x == "":
        return kind.endswith("?") or kind == "str"
    if "\0" in x:  # (a damaged file's NUL byte: no column's value holds one)
        return False
    kind = kind.rstrip("?")
    if kind == "int":
        try:
            return INT64_MIN <= parse_decimal(x) <= INT64_MAX
        except ValueError:
            return False
    if kind == "bool":
        return x.lower() in _TRUE | _FALSE
    if kind == "float":
        try:
            float(x)
        except ValueError:
            return False
        return x.isascii() and "_" not in x
    return True


def _schema_of(header: list[str], path) -> tuple:
    """The schema whose columns `header` names, each once, in any order (the readers take the columns by name);
    else a UserError naming the columns missing and the ones unexpected, for the schema `header` is closer to."""
    for schema in (EVENT_SCHEMA, REQUEST_SCHEMA):
        if sorted(header) == sorted(n for n, _ in schema):
            return schema
    hint = separator_hint(header, "a table CSV")
    if not hint:
        schema = max((EVENT_SCHEMA, REQUEST_SCHEMA), key=lambda sch: sum(h in dict(sch) for h in set(header)))
        names = [n for n, _ in schema]
        odd = (("missing", [n for n in names if n not in header]),
               ("unexpected", [h for h in header if h not in names]),
               ("twice", sorted({h for h in header if header.count(h) > 1})))
        parts = [f"{what} {', '.join(_few(cols))}" for what, cols in odd if cols]
        hint = f" (as {'an events' if schema is EVENT_SCHEMA else 'a requests'} table: {'; '.join(parts)})"
    raise UserError(f"{path}: not an events or requests table{hint}")


def _parse_column(values: list[str], kind: str):
    """One CSV column as an array, converted whole (NumPy); ValueError when a cell does not fit
    (then `_cell_ok`, cell by cell, finds which).  NumPy alone would read Python's spellings of a
    number (``1_0`` as 10, ``+1``, digits of other scripts), so the cells are checked first; and NumPy's text
    arrays drop trailing NUL bytes (``5\\0`` would be 5), so a NUL anywhere is refused first."""
    if "\0" in "".join(values):
        raise ValueError(kind)
    a = np.char.strip(np.array(values, dtype=str))
    missing = a == ""
    if kind == "str":
        return a.astype(object).astype(str)
    if missing.any() and not kind.endswith("?"):
        raise ValueError(kind)
    if kind.startswith("bool"):
        low = np.char.lower(a)  # (the trace readers' words, in any letter case)
        out = np.isin(low, sorted(_TRUE))
        if not (out | missing | np.isin(low, sorted(_FALSE))).all():
            raise ValueError(kind)
        return np.ma.MaskedArray(out, mask=missing) if kind.endswith("?") else out
    if a.view(np.uint32).max(initial=0) > 127 or (np.char.find(a, "_") >= 0).any():  # (not ASCII; 1_000)
        raise ValueError(kind)
    try:
        if kind.startswith("int"):
            digits = np.char.lstrip(a, "-")
            signs = np.char.str_len(a) - np.char.str_len(digits)
            if not (missing | (np.char.isdigit(digits) & (signs <= 1))).all():  # (no '+', no '--1')
                raise ValueError(kind)
            out = np.where(missing, "0", a).astype(np.int64) if a.size else np.zeros(0, np.int64)
            return np.ma.MaskedArray(out, mask=missing) if kind.endswith("?") else out
        out = np.full(a.shape, np.nan)
        if (~missing).any():
            out[~missing] = a[~missing].astype(np.float64)
        return out
    except OverflowError:
        raise ValueError(kind) from None


def _read_parquet(path: Path) -> dict[str, np.ndarray]:
    table = read_parquet_table(path)
    schema = _schema_of(table.column_names, path)
    out = {}
    for name, kind in schema:
        col = table.column(name)
        if str(col.type).startswith("dictionary<"):  # (text encoded once per value: pandas' categories)
            col = col.cast(col.type.value_type)
        base = kind.rstrip("?")
        required = not kind.endswith("?")  # (a null is no word either: "None" was named as one)
        word, fits = _PARQUET_TYPES[base]
        if not fits(col.type) or (required and col.null_count):
            raise UserError(f"{path}: column {name}: expected {word}{', none missing' if required else ''}; "
                            f"got {col.type} with {col.null_count} missing")
        missing = np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        if kind == "str":
            out[name] = np.array(col.to_pylist(), dtype=str)
        elif base == "float":
            out[name] = np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)  # (nulls: NaN)
        elif base == "int":
            values, missing = _parquet_ints(col, missing, kind.endswith("?"), f"{path}: column {name}")
            out[name] = np.ma.MaskedArray(values, mask=missing) if kind.endswith("?") else values
        else:
            values = np.asarray(col.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
            out[name] = np.ma.MaskedArray(values, mask=missing) if kind.endswith("?") else values
    _check_words(out, path, lambda i: f"row {i + 1}")
    return out


def _parquet_ints(col, missing: np.ndarray, nullable: bool, where: str) -> tuple[np.ndarray, np.ndarray]:
    """An integer column's values as int64 (0 where missing) and where they are missing: from any integer type,
    uint64 only where it fits, and from a float column (as pandas writes an integer column that has a gap) only
    where each value is a whole number within +-2**53, which a float holds exactly, or NaN in a nullable column (a
    missing value); a UserError naming the first row that is not."""
    if str(col.type) in _FLOAT_TYPES:
        x = np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)
        missing = missing | (np.isnan(x) if nullable else False)
        with np.errstate(invalid="ignore"):
            bad = ~missing & ~((np.abs(x) <= MAX_EXACT) & (x == np.round(x)))
        what = f"a whole number within +-2**53 (a {col.type} column)"
    else:
        x = col.fill_null(0).to_numpy(zero_copy_only=False)
        bad = x > INT64_MAX if x.dtype == np.uint64 else np.zeros(len(x), bool)
        what = "an integer that fits in int64"
    if bad.any():
        i = int(np.argmax(bad))
        raise UserError(f"{where}, row {i + 1}: expected {what}, got {plain_value(x[i])}")
    return np.where(missing, 0, x).astype(np.int64), missing


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
           "table_format", "check_table_output", "EVENT_SCHEMA", "REQUEST_SCHEMA", "CHUNK_ROWS", "PARQUET_CHUNK_ROWS"]
