"""Real request traces (Azure LLM inference 2023, Mooncake) converted to the canonical trace.

Two steps, both pure functions:

1. ``read_azure(path)`` / ``read_mooncake(path)`` return a `RawTrace`: per request, in file order,
   the arrival in seconds after the first request, the prompt tokens, the output tokens and (Mooncake
   only) the cache-hit flag.
2. ``to_trace(raw, load=... | steps_per_second=..., ...)`` turns it into a validated `Trace`.

The conversion rules (also printed by ``decodesched trace convert --help``):

- **Time scale.** ``arrival_step = floor(arrival_seconds * steps_per_second)``.  Give either
  ``steps_per_second`` directly, or a target offered load ``load``; then
  ``steps_per_second = work_steps / (load * span_seconds)``, where
  ``work_steps = sum(1 + max_new_tokens)`` (one prefill step plus one step per token: all the steps
  the trace needs) and ``span_seconds`` is the time from the first to the last arrival.  The offered
  load is "work steps per step of wall time": at load 1.0 the one-request-per-step server is exactly
  busy on average; above 1.0 a backlog must build up.  (Flooring arrivals makes the realised span, and
  so the realised load, differ from the target by less than one step.  The product is exact for the times
  and the scale as written, in decimal: 3 ms at 1000 steps per second is step 3, though 0.003 * 1000 is
  2.9999999999999996 in floating point, and a request 1 ns before a step's edge stays before it.)
- **Lengths.** ``prompt_len = input tokens`` (at least 1); ``max_new_tokens = output tokens`` (an
  output of 0 tokens, which a request cannot have in the model, counts as 1);
  ``required_blocks = ceil((prompt_len + max_new_tokens) / block_size)`` (``block_size`` 16 by default).
- **cache_hit.** Azure: false (the trace has no prefix information).  Mooncake: a request hits when
  its first ``cache_min_blocks`` prompt blocks (``hash_ids``, 512 tokens each) were all seen in earlier
  requests, earlier by arrival: timestamp, then line (``cache_min_blocks=1`` is SPEC's "first block seen
  before").  The default is
  ``DEFAULT_CACHE_MIN_BLOCKS = 2``: in the Mooncake conversation trace every request shares block 0
  (a common system prompt), so with 1 all but the first request hit (99.99%), which says nothing.
  Measured on ``mooncake_conversation.jsonl``: K=1 99.99%, K=2 38.7%, K=3 34.1%, K=4 31.3%, K=8 24.7%
  of requests hit; 2 is the smallest K past the shared system prompt, and its 38.7% is close to the
  trace's 36.6% of prompt blocks that repeat an earlier block.
- **Seeded rules** (a ``numpy.random.Generator`` from ``seed``, drawn in this order, so the same seed
  and options give the same trace):
  - ``priority``: drawn per request from ``priority_classes`` with ``priority_weights``
    (default classes 0, 1, 2 with weights 0.6, 0.3, 0.1; larger runs first);
  - a deadline for a random ``deadline_fraction`` of requests (default 0.5):
    ``deadline_step = arrival_step + ceil(slo_factor * (1 + max_new_tokens))`` (default slo_factor 20),
    i.e. a budget of ``slo_factor`` times the request's own work steps;
  - ``preemptible``: true except for the classes in ``protected_classes`` (default: the top class).
- ``request_id`` is the row order in the source file (0, 1, ...); the trace keeps its time scale
  (`Trace.steps_per_second`).

`write_trace` writes the CSV atomically and a sidecar ``<out>.meta.json`` beside it with
``steps_per_second``, the source file, its format, the options and the seed, so seconds can be
reported later (`load_trace` reads ``steps_per_second`` from it; `read_meta` reads all of it).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import warnings
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import Sequence

import numpy as np

from ._io import binary_input, input_file, meta_path, not_text
from .errors import OutputError, UserError
from .model import is_integer
from .trace import (MAX_LENGTH, MAX_STEP, TRACE_COLUMNS, Trace, TraceError, _DuplicateKey, _next_record, _unique_keys,
                    excel_separator, load_trace, next_header, parse_decimal, plain_value, positive_float, separator_hint,
                    show)

FORMATS = ("azure", "mooncake")
DEFAULT_PRIORITY_CLASSES = (0, 1, 2)
DEFAULT_PRIORITY_WEIGHTS = (0.6, 0.3, 0.1)
DEFAULT_DEADLINE_FRACTION = 0.5
DEFAULT_SLO_FACTOR = 20.0
DEFAULT_BLOCK_SIZE = 16
DEFAULT_CACHE_MIN_BLOCKS = 2  # see the module docstring: 1 makes 99.99% of Mooncake requests hits
BUNDLED_TRACE = "azure_llm_2023_conv.csv"


@dataclass(frozen=True)
class RawTrace:
    """A real trace as read from its file, in file order (arrays of equal length)."""

    arrival_seconds: np.ndarray  # float64, seconds after the earliest request (>= 0)
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    cache_hit: np.ndarray | None  # bool, or None when the source has no prefix information
    source: str = ""
    format: str = ""

    def __len__(self) -> int:
        return int(self.arrival_seconds.shape[0])

    def head(self, n: int) -> "RawTrace":
        """The first `n` requests to arrive (by time, then file line), kept in file order, times relative to
        the earliest of them.  By arrival, not by line: a cache hit needs an earlier arrival, so every hit
        kept is a hit on a kept request (for a file sorted by time, the first `n` lines)."""
        keep = np.sort(np.argsort(self.arrival_seconds, kind="stable")[:n])
        arr = self.arrival_seconds[keep]
        arr = arr - arr.min() if arr.size else arr
        hit = None if self.cache_hit is None else self.cache_hit[keep]
        return RawTrace(arr, self.prompt_tokens[keep], self.output_tokens[keep], hit, self.source, self.format)


def bundled_trace_path() -> Path:
    """Path of the shipped Azure LLM inference 2023 conversation trace (CC-BY-4.0, see data/README.md)."""
    ref = resources.files("decodesched").joinpath("data", BUNDLED_TRACE)
    path = Path(str(ref))
    if not path.is_file():  # pragma: no cover - a broken installation
        raise UserError(f"the bundled trace {BUNDLED_TRACE} is missing from the installation ({path})")
    return path


def detect_format(path: str | os.PathLike) -> str:
    """'azure' or 'mooncake', from the extension, else from the first bytes of the file."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "mooncake"
    _check_file(path)
    if not path.is_file():  # a pipe, `<(command)`: the bytes read here to tell its format would be gone for good
        raise UserError(f"{path}: cannot tell a pipe's trace format without using up its start; "
                        f"give --format azure|mooncake")
    with open(path, "rb") as fh:
        start = fh.read(4096)
    binary = binary_input(path)  # (gzip: "decompress it first", not "give --format")
    if binary:
        raise UserError(binary)
    start = start.removeprefix(b"\xef\xbb\xbf").lstrip()  # a UTF-8 BOM (spreadsheets write one)
    if not start:
        raise UserError(f"{path}: empty file (expected an Azure CSV with a TIMESTAMP header or Mooncake JSON lines)")
    if start.startswith((b"{", b"[")):  # (a JSON array is refused by read_mooncake, with its fix)
        return "mooncake"
    lines = [line.decode("utf-8", "replace") for line in start.splitlines() if line.strip()]  # (a lone CR ends one)
    header = next(csv.reader(lines[:1]))
    first = lines[1] if excel_separator(header, path, UserError) and len(lines) > 1 else lines[0]  # (Excel's `sep=,`)
    header = [c.strip() for c in next(csv.reader([first]), [])]
    if first.lstrip().upper().startswith("TIMESTAMP") or "TIMESTAMP" in header:
        return "azure"  # (Azure 2024 and files saved by other tools: other columns, another order)
    if set(TRACE_COLUMNS) <= set(header):
        raise UserError(f"{path}: already a canonical trace, nothing to convert: simulate, sweep and trace inspect "
                        "read it as it is")
    raise UserError(f"{path}: cannot tell the trace format (expected an Azure CSV with a TIMESTAMP header "
                    f"or Mooncake JSON lines); give --format azure|mooncake")


def _check_file(path: Path) -> None:
    input_file(path, "trace file")
    if path.suffix.lower() in (".parquet", ".pq"):
        raise UserError(f"{path}: a Parquet file; trace convert reads an Azure CSV or Mooncake JSON lines (a "
                        "canonical trace in Parquet needs no converting: simulate and trace inspect read it)")


def read_raw(path: str | os.PathLike, fmt: str | None = None) -> RawTrace:
    """Read a real trace in the given format (detected when None)."""
    fmt = fmt or detect_format(path)
    if fmt == "azure":
        return read_azure(path)
    if fmt == "mooncake":
        return read_mooncake(path)
    raise UserError(f"unknown trace format {fmt!r}; expected one of {', '.join(FORMATS)}")


def read_azure(path: str | os.PathLike) -> RawTrace:
    """Read an Azure LLM inference 2023 CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    TIMESTAMP is a wall-clock time such as ``2023-11-16 18:15:46.6805900`` (any number of fractional
    digits, nanosecond precision kept over 48 days, float64 seconds after; a zone, ``Z``, ``+05:00`` or `` UTC``,
    on every time or on none); arrivals are seconds after the earliest one.  A token count may be written as a whole
    decimal (``12.0``).  Read by the CSV rules of docs/files.md (quoted fields, CRLF line ends).
    """
    path = Path(path)
    _check_file(path)
    stamps: list[str] = []
    prompts: list[int] = []
    outputs: list[int] = []
    lines: list[int] = []  # each request's line, for the messages
    want = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:  # (the CSV rules of docs/files.md: quotes, CRLF)
            reader = csv.reader(fh)
            header = next_header(reader, path)
            if header is None:
                raise UserError(f"{path}: empty file (expected the header {','.join(want)})")
            cols = [c.strip() for c in header]
            missing = [c for c in want if c not in cols]
            if missing:
                raise UserError(f"{path}: not an Azure LLM trace: missing column(s) {', '.join(missing)}"
                                + (separator_hint(cols, "an Azure CSV") or f" (header {show(','.join(cols), 80)})"))
            dup = [c for c in want if cols.count(c) > 1]  # (which one holds the data?)
            if dup:
                raise UserError(f"{path}: duplicate column(s) {', '.join(dup)}")
            it, ic, ig = (cols.index(c) for c in want)
            while (rec := _next_record(reader, path)) is not None:
                lineno = reader.line_num
                if len(rec) != len(cols):
                    raise UserError(f"{path}: line {lineno}: {len(rec)} fields, expected {len(cols)}")
                if rec[it].strip() == want[0] and [c.strip() for c in rec] == cols:  # (not a TIMESTAMP, a header)
                    raise UserError(f"{path}: line {lineno} repeats the header (two traces joined whole?); remove it")
                stamps.append(rec[it].strip())
                prompts.append(_int_field(rec[ic], path, lineno, "ContextTokens"))
                outputs.append(_int_field(rec[ig], path, lineno, "GeneratedTokens"))
                lines.append(lineno)
    except UnicodeDecodeError as exc:
        raise UserError(not_text(path, exc)) from None
    if not stamps:
        raise UserError(f"{path}: no requests (only a header)")
    seconds = _parse_timestamps(stamps, path, lines)
    return RawTrace(seconds, np.asarray(prompts, np.int64), np.asarray(outputs, np.int64), None, str(path), "azure")


_WHOLE_DECIMAL = re.compile(r"\s*(-?[0-9]+)\.0*\s*")  # 12.0: how pandas writes a float column's whole numbers


def _int_field(text: str, path: Path, lineno: int, col: str) -> int:
    """A token count: a decimal integer, or one written as a whole decimal (``12.0``, as a float column saved by
    pandas has it); UserError naming the line and column for anything else (``12.5``, ``1e3``, a word)."""
    whole = _WHOLE_DECIMAL.fullmatch(text)
    try:
        v = parse_decimal(whole.group(1) if whole else text)
    except ValueError as exc:
        if str(exc) == "too many digits":
            raise UserError(f"{path}: line {lineno}, column {col}: token count {show(text.strip())} is too large") from None
        raise UserError(f"{path}: line {lineno}, column {col}: expected a whole number of tokens, "
                        f"got {show(text.strip())}") from None
    if v < 0:
        raise UserError(f"{path}: line {lineno}, column {col}: negative token count {v}")
    if v > 2**40:
        raise UserError(f"{path}: line {lineno}, column {col}: token count {v} is too large")
    return v


MAX_SPAN_SECONDS = 9 * 10**9  # an Azure trace's span, first to last time: nanoseconds in int64 (285 years)
_ZONE = re.compile(r"T[0-9][0-9:.]*(Z|[+-][0-9][0-9](:?[0-9][0-9])?)$")  # a time zone after the time of day
# A time starts with its whole calendar date: NumPy reads a bare number as a year (seconds 0, 1, 2 as the years 0, 1,
# 2: a year apart) and `2023-11` as its first day, silently.
_DATE = re.compile(r"[-+]?[0-9]{4,}-[0-9]{2}-[0-9]{2}(?![0-9])")
_LEAP_SECOND = re.compile(r"T[0-9]{2}:[0-9]{2}:60")
_UTC_WORD = re.compile(r"\s*(UTC|GMT)$", re.IGNORECASE)  # `18:15:46.680590 UTC` (as SQL exports write it): Z


def _parse_timestamps(stamps: list[str], path: Path, lines: list[int]) -> np.ndarray:
    """Seconds after the earliest of `stamps`; `lines` are their lines in `path`, for the messages.  Times with
    a zone (``Z``, ``+05:00``, `` UTC``) are read as UTC; a mix of times with and without one is refused (NumPy
    would read the others as UTC too, hours off, and warn)."""
    iso = [_UTC_WORD.sub("Z", s.replace(" ", "T", 1)) for s in stamps]
    word = next((i for i, s in enumerate(iso) if not _DATE.match(s)), None)
    if word is not None:  # (NumPy reads "now" and "today" as the clock's time: a trace that changes every run)
        raise UserError(f"{path}: line {lines[word]}, column TIMESTAMP: not a date and time: {show(stamps[word])} "
                        "(expected a date, then a time of day, such as 2023-11-16 18:15:46.68)")
    zoned = [_ZONE.search(s) is not None for s in iso]
    if any(zoned) and not all(zoned):
        i = zoned.index(not zoned[0])
        raise UserError(f"{path}: line {lines[i]}, column TIMESTAMP: {show(stamps[i])} has "
                        f"{'a' if zoned[i] else 'no'} time zone, line {lines[0]}'s {show(stamps[0])} "
                        f"{'has one' if zoned[0] else 'none'}; give every time with a zone or none")

    def parse(values, unit):
        with warnings.catch_warnings():  # ("no explicit representation of timezones": read as UTC, above)
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            return np.array(values, dtype=f"datetime64[{unit}]")

    try:
        t = parse(iso, "ns")
    except ValueError:
        for i, s in enumerate(iso):  # find the first bad one, to name it
            try:
                parse(s, "ns")
            except ValueError:
                leap = " (a leap second: the times here are counted without them)" if _LEAP_SECOND.search(s) else ""
                raise UserError(f"{path}: line {lines[i]}, column TIMESTAMP: not a date and time: "
                                f"{show(stamps[i])}{leap}") from None
        raise UserError(f"{path}: unreadable TIMESTAMP column") from None  # pragma: no cover
    # Nanoseconds since 1970 wrap past int64 outside the years 1678-2262 (NumPy does not say so), but their
    # differences stay exact while the span fits in int64 (292 years): the span is checked in whole seconds,
    # which do not wrap (read again only where a year is outside, the zones make it slow), and the times are
    # taken relative to one within a second of the earliest.
    ns = t.astype(np.int64)
    sec = ns // 10**9 if all("1678" <= s[:4] <= "2261" and s[4:5] == "-" for s in iso) else \
        parse(iso, "s").astype(np.int64)
    first, last = int(sec.argmin()), int(sec.argmax())
    if int(sec[last]) - int(sec[first]) > MAX_SPAN_SECONDS:
        raise UserError(f"{path}: line {lines[last]}, column TIMESTAMP: {show(stamps[last])} is more than 285 years "
                        f"after line {lines[first]}'s {show(stamps[first])}; correct the times")
    ns = ns - ns[first]  # (wraps back to the exact difference)
    return (ns - ns.min()).astype(np.float64) / 1e9


MAX_EXACT_MS = 2**53  # a Mooncake timestamp's milliseconds are exact in a float64 up to here


def read_mooncake(path: str | os.PathLike, cache_min_blocks: int = DEFAULT_CACHE_MIN_BLOCKS) -> RawTrace:
    """Read a Mooncake trace (JSON lines: ``timestamp`` in ms, ``input_length``, ``output_length``,
    ``hash_ids``).  A request is a cache hit when its first `cache_min_blocks` hash_ids were all
    seen in earlier requests (1 = SPEC's "first block seen before"; the default 2 skips the system prompt
    that every request of the conversation trace shares, see the module docstring); a request with
    fewer blocks than that, or none, is a miss.  "Earlier" is by arrival (timestamp, then line for equal
    timestamps), not by line alone: in a file whose timestamps are not sorted, the request that arrives
    first cannot hit on a prefix that only arrives later.  The rows stay in file order.  The file is read line by
    line, keeping each block id once (with the request that brought it first), not every line's list.
    """
    path = Path(path)
    _check_file(path)
    if cache_min_blocks < 1:
        raise UserError(f"cache_min_blocks must be >= 1, got {cache_min_blocks}")
    ms: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    heads: list[list | None] = []  # per request, its first cache_min_blocks hash_ids (None: fewer, a miss)
    hits: list[bool] = []  # per request, its head seen on earlier lines: its hit while the lines arrive in order
    first: dict = {}  # each block id seen: the request that brought it first by arrival (streamed: bounded memory)
    latest = -math.inf  # the latest timestamp so far
    in_order = True  # every line so far arrives after the lines before it
    decoder = json.JSONDecoder(object_pairs_hook=_unique_keys, parse_float=_json_float)
    try:
        with open(path, encoding="utf-8-sig") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                if not ms and line.lstrip().startswith("["):
                    raise UserError(f"{path}: line {lineno}: a JSON array; the reader takes JSON lines, one object a "
                                    f"line: convert it first (jq -c '.[]' {path.name} > {path.stem}.lines.jsonl)")
                try:
                    rec = decoder.decode(line)
                except _DuplicateKey as exc:
                    raise UserError(f"{path}: line {lineno}: {exc}") from None
                except json.JSONDecodeError as exc:
                    raise UserError(f"{path}: line {lineno}: not JSON ({exc.msg})") from None
                except (ValueError, RecursionError):  # e.g. an integer of more than 4,300 digits
                    raise UserError(f"{path}: line {lineno}: not JSON this reader accepts (a number too long, "
                                    "or nesting too deep)") from None
                if not isinstance(rec, dict):
                    raise UserError(f"{path}: line {lineno}: expected a JSON object")
                for key in ("timestamp", "input_length", "output_length"):
                    if key not in rec:
                        raise UserError(f"{path}: line {lineno}: missing field {key!r}")
                ts = rec["timestamp"]
                if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not _finite(ts):
                    raise UserError(f"{path}: line {lineno}, field timestamp: expected milliseconds, got {show(ts)}")
                if abs(ts) > MAX_EXACT_MS:  # (nanoseconds since 1970, say: rounded to 256 ms, silently)
                    raise UserError(f"{path}: line {lineno}, field timestamp: {show(ts)} is beyond 2**53 "
                                    "milliseconds, where times are not exact; give milliseconds from the start")
                ts = float(ts)
                prompts.append(_json_int(rec["input_length"], path, lineno, "input_length"))
                outputs.append(_json_int(rec["output_length"], path, lineno, "output_length"))
                blocks = rec.get("hash_ids")
                blocks = [] if blocks is None else _block_ids(blocks, path, lineno)
                head = blocks[:cache_min_blocks] if len(blocks) >= cache_min_blocks else None
                heads.append(head)
                hits.append(head is not None and all(b in first for b in head))
                ms.append(ts)
                in_order = in_order and ts >= latest
                _first_arrivals(first, blocks, len(ms) - 1, ms, ts < latest)
                latest = max(latest, ts)
    except UnicodeDecodeError as exc:
        raise UserError(not_text(path, exc)) from None
    if not ms:
        raise UserError(f"{path}: no requests (empty file)")
    if not in_order:  # (a line arrived before an earlier one: a block it was first to bring may be on a later line)
        hits = [head is not None and all(_arrives_before(first[b], i, ms) for b in head)
                for i, head in enumerate(heads)]
    return RawTrace(_seconds_after_first(np.asarray(ms, np.float64)), np.asarray(prompts, np.int64),
                    np.asarray(outputs, np.int64), np.asarray(hits, np.bool_), str(path), "mooncake")


def _seconds_after_first(ms: np.ndarray) -> np.ndarray:
    """Seconds after the earliest of `ms`, each the float nearest to its decimal (rounded once, so that `to_trace`
    floors the times as written: 801274465.3 ms less 0, divided in floats, is 801274.4652999999 s).  Whole
    milliseconds subtract exactly; the rows with a fraction are computed in decimal."""
    first = float(ms.min())
    seconds = (ms - first) / 1000.0
    rows = np.arange(ms.size) if not first.is_integer() else np.flatnonzero(ms != np.floor(ms))
    if rows.size:
        with localcontext(prec=60):  # (exact: a difference of two decimals of at most 17 digits, within 2**53)
            zero = Decimal(repr(first))
            seconds[rows] = [float((Decimal(repr(v)) - zero) / 1000) for v in ms[rows].tolist()]
    return seconds


def _first_arrivals(first: dict, blocks: list, i: int, ms: list, early: bool) -> None:
    """Record request `i` (at timestamp ``ms[i]``) in `first`, each block id's first request by arrival
    (timestamp, then line): the blocks not seen before, and, when `early` (``ms[i]`` is before an earlier line's
    timestamp), those whose first request so far arrives after it (an equal timestamp keeps the earlier line)."""
    for b in blocks:
        j = first.setdefault(b, i)
        if early and ms[i] < ms[j]:
            first[b] = i


def _arrives_before(j: int, i: int, ms: list) -> bool:
    """Whether request `j` arrives before request `i`: by timestamp, then by line."""
    return (ms[j], j) < (ms[i], i)


class _NotWhole(float):
    """A JSON number that is no whole number, though the float nearest to it is one (``5.0000000000000001``,
    ``1e-400``): a time, but no token count nor block id (`is_integer` is False); shown as written."""

    def __new__(cls, text: str):
        self = super().__new__(cls, text)
        self.text = text
        return self

    def is_integer(self) -> bool:
        return False

    def __repr__(self) -> str:
        return self.text


def _json_float(text: str) -> float:
    """A JSON number with a fraction or an exponent as a float; a `_NotWhole` one where rounding made it whole."""
    x = float(text)
    return _NotWhole(text) if x.is_integer() and Decimal(text) != x else x


def _block_ids(blocks, path: Path, lineno: int) -> list:
    """A line's hash_ids: a list of whole numbers or strings (a whole float is that number: 3.0 is block 3);
    UserError for anything else: true would be block 1 and NaN equal to nothing, silently."""
    if not isinstance(blocks, list):
        raise UserError(f"{path}: line {lineno}, field hash_ids: expected a list of block ids, got {show(blocks)}")
    if set(map(type, blocks)) <= {int, str}:
        return blocks
    out = []
    for b in blocks:
        if isinstance(b, float) and _finite(b) and b.is_integer():
            b = int(b)
        elif isinstance(b, bool) or not isinstance(b, (int, str)):
            raise UserError(f"{path}: line {lineno}, field hash_ids: block ids must be whole numbers or strings, "
                            f"got {show(b)}")
        out.append(b)
    return out


def _finite(x) -> bool:
    try:
        return math.isfinite(x) and abs(x) < 1e300
    except OverflowError:  # an int too large for a float
        return False


def _json_int(v, path: Path, lineno: int, key: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v) or \
            (isinstance(v, float) and not v.is_integer()):
        raise UserError(f"{path}: line {lineno}, field {key}: expected a whole number of tokens, got {show(v)}")
    v = int(v)
    if v < 0:
        raise UserError(f"{path}: line {lineno}, field {key}: negative token count {v}")
    if v > 2**40:
        raise UserError(f"{path}: line {lineno}, field {key}: token count {v} is too large")
    return v


def work_steps_of(raw: RawTrace) -> int:
    """Steps the converted trace needs: one prefill plus one per output token (0 tokens count as 1)."""
    return int(len(raw) + np.maximum(raw.output_tokens, 1).sum())


def steps_per_second_for_load(raw: RawTrace, load: float) -> float:
    """The time scale at which `raw` offers `load` work steps per step: work / (load * span_seconds)."""
    if positive_float(load) is None:
        raise UserError(f"--load must be a positive number, got {show(plain_value(load))}")
    load = positive_float(load)
    span = float(raw.arrival_seconds.max() - raw.arrival_seconds.min())
    if span <= 0:
        raise UserError("--load needs requests spread over time, but all arrive at the same instant; "
                        "give --steps-per-second instead")
    steps_per_second = work_steps_of(raw) / (load * span)
    if not (math.isfinite(steps_per_second) and steps_per_second > 0):
        raise UserError(f"--load {load:g} is out of range for this trace (it gives {steps_per_second:g} steps per "
                        "second); give a load nearer 1")
    return steps_per_second


def _is_real(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _items(values, what: str) -> list:
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise UserError(f"{what} must be a list of numbers, got {show(values)}")
    return list(values)


def _is_whole(v) -> bool:
    """Whether `v` is an integer (or a float that is one) within +-2**53, a priority's range."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        return abs(int(v)) <= MAX_STEP
    return isinstance(v, (float, np.floating)) and math.isfinite(v) and float(v).is_integer() and abs(v) <= MAX_STEP


def _whole_numbers(values, what: str) -> list[int]:
    """`values` as a list of ints within +-2**53; UserError naming `what` otherwise."""
    out = _items(values, what)
    bad = [v for v in out if not _is_whole(v)]
    if bad:
        raise UserError(f"{what} must be whole numbers within +-2**53, got {show(bad[0])}")
    return [int(v) for v in out]


def _real_numbers(values, what: str) -> list[float]:
    """`values` as a list of floats (any that is no number, or too large for one, is refused)."""
    out = _items(values, what)
    bad = [v for v in out if not _is_real(v) or (isinstance(v, (int, np.integer)) and abs(int(v)) >= 2**1023)]
    if bad:
        raise UserError(f"{what} must be numbers, got {show(bad[0])}")
    return [float(v) for v in out]


def _checked_raw(raw) -> RawTrace:
    """`raw` with its columns as `to_trace` reads them (float64 seconds, int64 token counts, bool hits); a
    UserError naming the column for one that is not (a `RawTrace` built by hand): arrival times finite and
    >= 0, token counts whole numbers from 0 to 2**40, every column 1-D and as long as the first."""
    if not isinstance(raw, RawTrace):
        raise UserError(f"to_trace needs a RawTrace (decodesched.convert.read_azure, read_mooncake), got "
                        f"{type(raw).__name__}")
    wants = {"arrival_seconds": "finite numbers >= 0 (seconds)", "prompt_tokens": "whole numbers from 0 to 2**40",
             "output_tokens": "whole numbers from 0 to 2**40", "cache_hit": "true/false values (or be None)"}
    out = {"cache_hit": None}
    for name, want in wants.items():
        v = getattr(raw, name)
        if v is None and name == "cache_hit":
            continue
        a = np.asarray(v)
        n = len(out["arrival_seconds"]) if "arrival_seconds" in out else None
        if a.ndim != 1 or len(a) != (n if n is not None else len(a)):
            size = "a 1-D array" if n is None else f"a 1-D array of {n} values"
            raise UserError(f"RawTrace.{name}: expected {size}, got one of shape {a.shape}")
        if name == "cache_hit":
            ok = a.dtype == np.bool_
        else:
            ok = a.dtype.kind in "iuf" and bool(np.all(np.isfinite(a))) and not (a < 0).any()
            if ok and name != "arrival_seconds":
                ok = not (a > MAX_LENGTH).any() and bool(np.all(a == np.floor(a)))
        if not ok:
            raise UserError(f"RawTrace.{name} must hold {want}")
        out[name] = a.astype(np.float64 if name == "arrival_seconds" else np.bool_ if name == "cache_hit" else np.int64)
    return RawTrace(**out, source=raw.source, format=raw.format)


def _exact_rate(raw: RawTrace, load: float | None, steps_per_second: float) -> Fraction:
    """The time scale exactly as given: `steps_per_second` as written (its shortest repr), or for a `load`,
    work_steps / (load * span_seconds) itself, so that the last request arrives at work_steps / load (the float
    quotient, 185.79528982836814 steps/s for 1694 steps at 0.7 over about 13 s, puts it a hair below step 2420)."""
    if load is None:
        return Fraction(repr(steps_per_second))
    span = float(raw.arrival_seconds.max() - raw.arrival_seconds.min())
    return work_steps_of(raw) / (Fraction(repr(float(load))) * Fraction(repr(span)))


def _arrival_steps(seconds: np.ndarray, steps_per_second: float, rate: Fraction) -> np.ndarray:
    """floor(seconds * rate) as float64 (`rate`: `_exact_rate`, `steps_per_second` its float), exact for the decimals
    the seconds stand for (their shortest reprs): 0.003 s at 1000 steps/s is step 3, though 0.003 * 1000 is
    2.9999999999999996 in floating point, and a request 1 ns before a step's edge, 30 days in at a step per
    microsecond, stays before it, though the float product is within 8 ulps of the edge.  The float product is
    within 4 ulps of the exact one, so only where it is that close to a whole number can the floors differ: those
    rows are computed again in integers (those past 2 * MAX_STEP are refused by the caller whichever the floor)."""
    with np.errstate(over="ignore", invalid="ignore"):  # (a product past the float range is inf: refused by the caller)
        x = seconds * steps_per_second
        out = np.floor(x)
        near = np.flatnonzero((np.abs(x - np.round(x)) <= 8 * np.spacing(np.abs(x))) & (x <= 2 * MAX_STEP))
    if near.size:
        p, q = rate.numerator, rate.denominator
        out[near] = [float(a * p // (b * q))
                     for a, b in (Decimal(repr(v)).as_integer_ratio() for v in seconds[near].tolist())]
    return out


def to_trace(
    raw: RawTrace,
    *,
    load: float | None = None,
    steps_per_second: float | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    seed: int = 0,
    priority_classes: Sequence[int] = DEFAULT_PRIORITY_CLASSES,
    priority_weights: Sequence[float] | None = DEFAULT_PRIORITY_WEIGHTS,
    deadline_fraction: float = DEFAULT_DEADLINE_FRACTION,
    slo_factor: float = DEFAULT_SLO_FACTOR,
    protected_classes: Sequence[int] | None = None,
    name: str | None = None,
) -> Trace:
    """Convert a `RawTrace` to a validated `Trace` by the rules in the module docstring.

    Exactly one of `load` and `steps_per_second`.  `priority_weights` None means equal weights;
    `protected_classes` None means the largest class only (pass ``()`` to make every request
    preemptible).

    >>> raw = RawTrace(np.array([0.0, 1.0, 2.0]), np.array([10, 20, 5]), np.array([3, 0, 7]), None)
    >>> t = to_trace(raw, load=1.0, block_size=4)  # work 14 steps over 2 s: 7 steps per second
    >>> t.arrival_step.tolist(), t.max_new_tokens.tolist(), t.required_blocks.tolist()
    ([0, 7, 14], [3, 1, 7], [4, 6, 3])
    """
    if (load is None) == (steps_per_second is None):
        raise UserError("give exactly one of --load and --steps-per-second")
    if not is_integer(seed) or not 0 <= seed < 2**128:
        raise UserError(f"--seed must be a whole number from 0 to 2**128 - 1, got {show(seed)}")
    raw = _checked_raw(raw)
    if len(raw) == 0:
        raise UserError("the trace has no requests")
    if steps_per_second is None:
        steps_per_second = steps_per_second_for_load(raw, load)
    elif positive_float(steps_per_second) is None:
        raise UserError(f"--steps-per-second must be a positive number, got {show(plain_value(steps_per_second))}")
    steps_per_second = positive_float(steps_per_second)
    if not is_integer(block_size) or block_size < 1:
        raise UserError(f"--block-size must be a positive whole number, got {show(block_size)}")
    block_size = min(int(block_size), 2 * MAX_LENGTH)  # (from there on every request needs one block; int64 holds it)
    classes = np.asarray(_whole_numbers(priority_classes, "--priority-classes"), dtype=np.int64)
    if classes.size == 0:
        raise UserError("--priority-classes needs at least one class")
    if np.unique(classes).size != classes.size:
        raise UserError(f"--priority-classes must be distinct, got {classes.tolist()}")
    if priority_weights is None:
        weights = np.full(classes.size, 1.0 / classes.size)
    else:
        weights = np.asarray(_real_numbers(priority_weights, "--priority-weights"), dtype=np.float64)
        if weights.size != classes.size:
            raise UserError(f"--priority-weights needs one weight per class ({classes.size}), got {weights.size}")
        if not np.all(np.isfinite(weights)) or np.any(weights < 0) or weights.max() <= 0:
            raise UserError(f"--priority-weights must be non-negative with a positive sum, got {weights.tolist()}")
        weights = weights / weights.max()  # (a sum of huge weights would overflow)
        weights = weights / weights.sum()
    if not (_is_real(deadline_fraction) and 0.0 <= deadline_fraction <= 1.0):
        raise UserError(f"--deadline-fraction must be between 0 and 1, got {show(deadline_fraction)}")
    if not (_is_real(slo_factor) and 0 < slo_factor < 2.0**1023):
        raise UserError(f"--slo-factor must be a positive number, got {show(slo_factor)}")
    protected = ({int(classes.max())} if protected_classes is None
                 else set(_whole_numbers(protected_classes, "--protected-classes")))
    stray = sorted(protected - set(classes.tolist()))
    if stray:  # (a class no request is drawn into protects nothing: most likely a typo)
        raise UserError(f"--protected-classes {stray[0]} is not one of --priority-classes "
                        f"{','.join(map(str, classes.tolist()))}")

    n = len(raw)
    arrival_f = _arrival_steps(raw.arrival_seconds, steps_per_second, _exact_rate(raw, load, steps_per_second))
    last = float(arrival_f.max()) if n else 0.0
    if not last <= MAX_STEP:
        scale = f"--load {load}" if load is not None else f"--steps-per-second {steps_per_second}"
        raise UserError(f"{scale} puts the last arrival at step {last:.3g}, beyond 2**53; "
                        f"give a {'larger load' if load is not None else 'smaller time scale'}")
    arrival_step = arrival_f.astype(np.int64)
    prompt_len = np.maximum(raw.prompt_tokens.astype(np.int64), 1)
    max_new = np.maximum(raw.output_tokens.astype(np.int64), 1)
    required_blocks = -(-(prompt_len + max_new) // block_size)  # ceil division in integers

    rng = np.random.default_rng(seed)
    priority = classes[rng.choice(classes.size, size=n, p=weights)]
    has_deadline = rng.random(n) < deadline_fraction
    budget_f = np.ceil(slo_factor * (1 + max_new).astype(np.float64))
    if n and not float(budget_f.max()) <= MAX_STEP:
        raise UserError(f"--slo-factor {slo_factor} puts deadlines beyond 2**53 steps after arrival; "
                        "give a smaller factor")
    budget = budget_f.astype(np.int64)
    deadline_step = np.where(has_deadline, arrival_step + budget, 0).astype(np.int64)
    preemptible = ~np.isin(priority, np.asarray(sorted(protected), dtype=np.int64))
    cache_hit = np.zeros(n, np.bool_) if raw.cache_hit is None else raw.cache_hit.astype(np.bool_)

    deadline_col = deadline_step.astype(object)
    deadline_col[~has_deadline] = None
    return load_trace(
        {
            "request_id": np.arange(n, dtype=np.int64),
            "arrival_step": arrival_step,
            "prompt_len": prompt_len,
            "max_new_tokens": max_new,
            "priority": priority,
            "cache_hit": cache_hit,
            "required_blocks": required_blocks,
            "deadline_step": deadline_col,
            "preemptible": preemptible,
        },
        steps_per_second=float(steps_per_second),
        name=name or (Path(raw.source).stem if raw.source else "trace"),
    )


def write_trace(trace: Trace, out: str | os.PathLike, meta: dict) -> Path:
    """Write `trace` as canonical CSV and its sidecar, together (`output_group`); returns the sidecar
    path.  A failure leaves neither file (an older pair at the same path stays intact)."""
    from ._io import STDOUT, atomic_writer, output_group, path_argument

    out = Path(path_argument(out, "out"))
    if str(out) == STDOUT:  # (its sidecar would be a file named -.meta.json in the current folder)
        raise UserError("-: write_trace writes a file and its sidecar; give a .csv path (Trace.to_csv('-') writes "
                        "the CSV alone to standard output)")
    side = meta_path(out)
    body = dict(meta)
    body["steps_per_second"] = trace.steps_per_second
    body["requests"] = len(trace)
    try:
        with output_group():
            with atomic_writer(side) as fh:
                json.dump(body, fh, indent=2, sort_keys=True)
                fh.write("\n")
            load_trace(trace)._write_csv(path_argument(out))
    except OutputError:  # already one line naming the file
        raise
    except FileNotFoundError as exc:
        raise UserError(f"{out}: cannot write: {exc}") from None
    except OSError as exc:
        raise UserError(f"{out}: cannot write: {exc.strerror or exc}") from None
    return side


def read_meta(trace_path: str | os.PathLike) -> dict | None:
    """The sidecar of a converted trace, or None when there is none (or it is unreadable)."""
    side = meta_path(trace_path)
    if not side.is_file():
        return None
    try:
        meta = json.loads(side.read_text(encoding="utf-8"), object_pairs_hook=_unique_keys)
    except (OSError, ValueError, RecursionError):  # (RecursionError: JSON nested thousands deep)
        return None
    return meta if isinstance(meta, dict) else None


__all__ = [
    "RawTrace",
    "TraceError",
    "bundled_trace_path",
    "detect_format",
    "read_azure",
    "read_meta",
    "read_mooncake",
    "read_raw",
    "steps_per_second_for_load",
    "to_trace",
    "work_steps_of",
    "write_trace",
]
