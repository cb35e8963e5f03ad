"""Trace files: read and write requests as CSV or JSON Lines, validating every field.

CSV has a header row naming `prompt_len` and `output_len` (required), `arrival_time`, `steps`
(block step counts separated by `;` or spaces) and `max_tokens` (what the client asked for at most:
the request's mask buffer is it rounded up to whole blocks; at least `output_len`), all optional.
JSON Lines has one object per line with the same keys (`steps` a list). Rows are requests in arrival
order: arrival times, if given, are non-negative, non-decreasing, and given on every row or on none.
Every problem raises `TraceError` with one line naming the file and the line.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sangam.workload import TraceRow, check_steps

REQUIRED = ("prompt_len", "output_len")
OPTIONAL = ("arrival_time", "steps", "max_tokens")
COLUMNS = ("arrival_time", "prompt_len", "output_len", "steps", "max_tokens")
CSV_SUFFIXES = (".csv",)
JSONL_SUFFIXES = (".jsonl", ".json")
MAX_ARRIVAL_S = 1e9  # 31 years: a later arrival time is a unit or a typo


class TraceError(ValueError):
    """A trace file that cannot be read; the message is one line naming the file and the line."""


# A record before validation: its line number, and field name -> raw value (a CSV string or a JSON value).
_Record = tuple[int, dict[str, Any]]


def read_trace(path: Path | str) -> list[TraceRow]:
    """The requests of a .csv or .jsonl/.json trace file, in file order."""
    path = Path(path)
    records = _read_records(path)
    text = path.suffix.lower() in CSV_SUFFIXES  # CSV fields are strings; JSON ones are typed
    rows: list[TraceRow] = []
    timed: tuple[int, bool] | None = None  # first data line, and whether it has an arrival time
    for line, fields in records:
        try:
            row = _to_row(fields, text)
        except ValueError as err:
            raise TraceError(f"{path} line {line}: {err}") from None
        has_time = row.arrival_time is not None
        if timed is None:
            timed = (line, has_time)
        elif has_time != timed[1]:
            which = "has" if has_time else "has no"
            other = "has none" if has_time else "has one"
            raise TraceError(
                f"{path} line {line}: row {which} arrival_time but line {timed[0]} {other} "
                "(give it on every row or on none)"
            )
        previous = rows[-1].arrival_time if rows else None
        if row.arrival_time is not None and previous is not None and row.arrival_time < previous:
            raise TraceError(
                f"{path} line {line}: arrival_time {row.arrival_time!r} is earlier than the previous "
                f"row's {previous!r} (rows must be in arrival order)"
            )
        rows.append(row)
    if not rows:
        raise TraceError(f"{path} line 1: no requests in the file")
    return rows


def write_trace(path: Path | str, rows: Sequence[TraceRow]) -> None:
    """Write `rows` as `read_trace` reads them back: JSON lines for a .jsonl/.json path (keys left out where
    unknown), else CSV: arrival_time (empty when unknown), prompt_len, output_len, and steps and
    max_tokens if any row has them."""
    path = Path(path)
    if path.suffix.lower() in JSONL_SUFFIXES:
        with path.open("w", encoding="utf-8") as f:
            for r in rows:
                fields = {
                    "arrival_time": r.arrival_time,
                    "prompt_len": r.prompt_len,
                    "output_len": r.output_len,
                    "steps": list(r.steps) if r.steps is not None else None,
                    "max_tokens": r.max_tokens,
                }
                f.write(json.dumps({k: v for k, v in fields.items() if v is not None}) + "\n")
        return
    with_steps = any(r.steps is not None for r in rows)
    with_max = any(r.max_tokens is not None for r in rows)
    header = ["arrival_time", "prompt_len", "output_len"] + (["steps"] if with_steps else [])
    header += ["max_tokens"] if with_max else []
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        for r in rows:
            arrival = "" if r.arrival_time is None else repr(float(r.arrival_time))
            cells = [arrival, str(r.prompt_len), str(r.output_len)]
            if with_steps:
                cells.append("" if r.steps is None else ";".join(map(str, r.steps)))
            if with_max:
                cells.append("" if r.max_tokens is None else str(r.max_tokens))
            writer.writerow(cells)


def read_steps(path: Path | str) -> list[int]:
    """Observed per-block forward counts, for an empirical progress model.

    A .csv or .jsonl/.json trace gives the `steps` of all its rows; any other file is read as
    integers in [1, 32] separated by commas, semicolons or whitespace.
    """
    path = Path(path)
    if path.suffix.lower() in CSV_SUFFIXES + JSONL_SUFFIXES:
        samples = [d for row in read_trace(path) for d in row.steps or ()]
        if not samples:
            raise TraceError(f"{path} line 1: no row has steps")
        return samples
    samples = []
    for line, content in enumerate(_read_text(path).splitlines(), start=1):
        for token in re.split(r"[\s,;]+", content.strip()):
            if not token:
                continue
            d = _parse_int(token, text=True)
            if d is None or not 1 <= d <= 32:
                raise TraceError(f"{path} line {line}: steps must be integers in [1, 32], got {token!r}")
            samples.append(d)
    if not samples:
        raise TraceError(f"{path} line 1: file is empty, expected step counts")
    return samples


# --- parsing -----------------------------------------------------------------------------------


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")  # tolerate a spreadsheet's byte-order mark
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file") from None
    except UnicodeDecodeError as err:
        raise TraceError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise TraceError(f"{path}: cannot read ({err.strerror or err})") from None


def _read_records(path: Path) -> list[_Record]:
    suffix = path.suffix.lower()
    if suffix not in CSV_SUFFIXES + JSONL_SUFFIXES:
        known = ", ".join(CSV_SUFFIXES + JSONL_SUFFIXES)
        kind = repr(suffix) if suffix else "(no extension)"
        raise TraceError(f"{path}: unknown trace format {kind} (known: {known})")
    text = _read_text(path)
    if not text.strip():
        raise TraceError(f"{path} line 1: file is empty")
    if suffix in CSV_SUFFIXES:
        return list(_csv_records(path, text))
    return list(_jsonl_records(path, text))


def _csv_records(path: Path, text: str) -> Iterator[_Record]:
    header: list[str] | None = None
    for line, cells in _csv_lines(path, text):
        if not any(c.strip() for c in cells):
            continue  # blank line
        if header is None:
            header = [c.strip() for c in cells]
            _check_columns(path, line, header)
            continue
        if len(cells) != len(header):
            raise TraceError(f"{path} line {line}: expected {len(header)} fields, got {len(cells)}")
        yield line, {name: cell.strip() for name, cell in zip(header, cells, strict=True)}


def _csv_lines(path: Path, text: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) of each CSV row; what the csv module cannot parse (a field over its size
    limit) is a TraceError."""
    reader = csv.reader(text.splitlines())
    try:
        for cells in reader:
            yield reader.line_num, cells
    except csv.Error as err:
        raise TraceError(f"{path} line {reader.line_num}: bad CSV: {err}") from None


def _check_columns(path: Path, line: int, header: list[str]) -> None:
    for name in header:
        if name not in COLUMNS:
            raise TraceError(f"{path} line {line}: unknown column {name!r} (known: {', '.join(COLUMNS)})")
        if header.count(name) > 1:
            raise TraceError(f"{path} line {line}: column {name!r} appears twice")
    for name in REQUIRED:
        if name not in header:
            raise TraceError(f"{path} line {line}: missing required column {name!r}")


def _jsonl_records(path: Path, text: str) -> Iterator[_Record]:
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw, object_pairs_hook=_no_repeats)
        except json.JSONDecodeError as err:
            raise TraceError(f"{path} line {line}: bad JSON: {err.msg} (column {err.colno})") from None
        except (ValueError, RecursionError) as err:  # an integer of thousands of digits, deep nesting
            raise TraceError(f"{path} line {line}: bad JSON: {err}") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{path} line {line}: expected a JSON object, got {type(obj).__name__}")
        for name in obj:
            if name not in COLUMNS:
                raise TraceError(f"{path} line {line}: unknown key {name!r} (known: {', '.join(COLUMNS)})")
        for name in REQUIRED:
            if name not in obj:
                raise TraceError(f"{path} line {line}: missing required key {name!r}")
        yield line, obj


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different (as a CSV file's columns must be); ValueError else."""
    obj = dict(pairs)
    if len(obj) < len(pairs):
        repeated = next(key for key in obj if sum(k == key for k, _ in pairs) > 1)
        raise ValueError(f"key {repeated!r} given twice")
    return obj


def _to_row(fields: dict[str, Any], text: bool) -> TraceRow:
    """A validated row from CSV strings (`text`) or JSON values; ValueError says what is wrong."""
    prompt = _length("prompt_len", fields["prompt_len"], text)
    output = _length("output_len", fields["output_len"], text)
    arrival = _arrival(fields.get("arrival_time"), text)
    steps = _steps(fields.get("steps"), text)
    if steps is not None:
        check_steps(steps, output)
    given = fields.get("max_tokens")
    max_tokens = None if given is None or (text and given == "") else _length("max_tokens", given, text)
    return TraceRow(prompt, output, arrival, steps, max_tokens)


def _parse_int(value: Any, text: bool) -> int | None:
    """`value` as an int: decimal digits in CSV (`text`), a JSON integer otherwise; None if it is not."""
    if text:
        return int(value) if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _length(name: str, value: Any, text: bool) -> int:
    n = _parse_int(value, text)
    if n is None or n < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return n


def _arrival(value: Any, text: bool) -> float | None:
    if value is None or (text and value == ""):
        return None
    t: float | None = None
    if text:
        try:
            t = float(value)
        except ValueError:
            t = None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        t = float(value)
    if t is None or not math.isfinite(t):
        raise ValueError(f"arrival_time must be a number of seconds, got {value!r}")
    if not 0 <= t <= MAX_ARRIVAL_S:  # 1e300 s once made every rate infinite, and summary.json not JSON
        raise ValueError(f"arrival_time must be in [0, {MAX_ARRIVAL_S:g}] seconds, got {value!r}")
    return t


def _steps(value: Any, text: bool) -> tuple[int, ...] | None:
    if value is None or (text and value == ""):
        return None
    if text:
        items: list[Any] = [s for s in re.split(r"[\s;]+", value) if s]
    elif isinstance(value, list):
        items = value
    else:
        raise ValueError(f"steps must be a list of integers, got {value!r}")
    steps = []
    for item in items:
        d = _parse_int(item, text)
        if d is None:
            raise ValueError(f"steps must be integers in [1, 32], got {item!r}")
        steps.append(d)
    return tuple(steps)
