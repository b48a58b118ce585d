"""The rows of a ``text/csv`` body read into one tensor, by one rule for every numeric type, a slice at a time.

A value is a plain decimal number, spaces around it allowed: an integer type's without a fraction or an
exponent (an unsigned one's without a sign but ``+``), a floating-point type's with them, and within the
type's range (``1e39`` is no FP32, ``300`` no INT8). Nothing else is a number, though Python's ``float()``
and ``int()``, which read the values, take more: no quotes around it (a CSV writer quotes text, not
numbers), no digit separators (``1_000``), no ``nan`` or ``inf`` (the JSON path refuses NaN too), no NUL,
no more than :data:`VALUE_CHARS` characters. Each row holds as many values as the input takes (or as the
first row, for an input of any width), counted before the row is split: a row of millions of values that
cannot be right costs no more than its count. A UTF-8 byte-order mark before the first row is skipped
(Excel's "CSV UTF-8" export begins with one).

The body is read a window of rows at a time (a row longer than a window, a window of its values at a time),
the event loop served between them, straight into the tensor; what a row that fails is, is found again
in its words only then. A body whose tensor cannot fit in the memory free is refused with 413 before.
"""

from __future__ import annotations

import asyncio
import codecs
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
from numpy.typing import NDArray

from smtriton import dtypes
from smtriton.serve.dataplane.records.record_answers import check_room
from smtriton.serve.errors import BadRequest
from smtriton.serve.triton.client import RequestBody

VALUE_CHARS = 100  # the longest value read: no plain number is longer
_WINDOW = 64 << 10  # bytes of rows read in one step (a few milliseconds)
_ROOM_CHECK_FROM = 64 << 20  # tensors this large are compared with the memory free first
_SPACE = rb"[ \t]*"
_NOT_SPACE = re.compile(rb"\S")
_NUMBERS = {
    "f": rb"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?",
    "i": rb"[+-]?[0-9]+",
    "u": rb"\+?[0-9]+",
}
_VALUE = {kind: re.compile(_SPACE + number + _SPACE) for kind, number in _NUMBERS.items()}
_VALUES = {kind: re.compile(rb"%s%s%s(?:,%s%s%s)*" % ((_SPACE, n, _SPACE) * 2)) for kind, n in _NUMBERS.items()}
EMPTY_ROW = "the line is empty: each line of the body is one row"


@dataclass(frozen=True)
class CsvInput:
    """The one input a CSV row goes to: its name, Triton data type, the values a row has (None: any
    number, the same for every row of a body) and the rows one Triton request may carry."""

    name: str
    datatype: str
    width: int | None
    max_batch_size: int


class _OutOfRange(ValueError):
    def __init__(self, at: int) -> None:
        super().__init__(at)
        self.at = at  # the first value out of range, by its place in the values read


async def read(body: RequestBody, to: CsvInput) -> NDArray[Any]:
    """The rows of a CSV body as one array of ``to``'s numpy type, shape ``[rows, n]`` (the module
    docstring); 400 naming the line of the first row that is not ``n`` values."""
    return await _Reading(body, to).rows()


class _Reading:
    def __init__(self, body: RequestBody, to: CsvInput) -> None:
        self.body, self.to = body, to
        self.numpy_type = dtypes.numpy_dtype(to.datatype)
        self.kind = self.numpy_type.kind
        self.values_pattern = _VALUES[self.kind]
        self.total = self.width = 0
        self.values: NDArray[Any] | None = None

    async def rows(self) -> NDArray[Any]:
        body = self.body
        start = len(codecs.BOM_UTF8) if body.startswith(codecs.BOM_UTF8) else 0
        end = _rows_end(body, start)
        if end <= start:
            raise BadRequest("the text/csv body holds no rows: send one row of numbers a line")
        self.total = body.count(b"\n", start, end) + 1
        first = body.find(b"\n", start, end)
        self.width = self.to.width or body.count(b",", start, end if first < 0 else first) + 1
        # A value takes two bytes at the least (its digit, a comma or line break): rows that claim more
        # values than the body holds fail at a row too short, found by reading them without the tensor.
        if 2 * self.total * self.width <= end - start + 1:
            size = self.total * self.width * self.numpy_type.itemsize
            if size >= _ROOM_CHECK_FROM:
                check_room(f"{self.total} rows of {self.width} values", 2 * size + 2 * len(body))
            self.values = np.empty((self.total, self.width), self.numpy_type)
        row, at = 0, start
        while at < end:
            stop = self._window_end(at, end)
            row = await self._long_row(at, stop, row) if stop - at > _WINDOW else self._window(at, stop, row)
            at = stop + 1
            await asyncio.sleep(0)
        assert self.values is not None and row == self.total
        return self.values

    def _window_end(self, at: int, end: int) -> int:
        """Where the rows read in one step from ``at`` end: at a line break, or ``end``."""
        if at + _WINDOW >= end:
            return end
        stop = self.body.rfind(b"\n", at, at + _WINDOW)
        if stop < 0:  # one row longer than a window
            stop = self.body.find(b"\n", at + _WINDOW, end)
        return end if stop < 0 else stop

    def _window(self, at: int, stop: int, row: int) -> int:
        """The rows of ``body[at:stop]`` (whole lines) read into the tensor from ``row``: the next row."""
        text = bytes(self.body[at:stop])
        first = row
        for line in text.split(b"\n"):
            line = line[:-1] if line.endswith(b"\r") else line
            count = line.count(b",") + 1  # counted before the row is split
            if count != self.width or not self.values_pattern.fullmatch(line):
                self._refuse(line, row + 1, count)
            row += 1
        fields = text.translate(None, b" \t\r").replace(b"\n", b",").split(b",")
        numbers = self._numbers(fields, lambda at: first + at // self.width)
        if self.values is not None:
            self.values[first:row] = numbers.reshape(row - first, self.width)
        return row

    async def _long_row(self, at: int, stop: int, row: int) -> int:
        """One row longer than a window: its width counted first, then read a window of values at a time."""
        body = self.body
        if body[stop - 1] == 13:  # \r\n
            stop -= 1
        count = body.count(b",", at, stop) + 1
        if count != self.width:
            self._refuse(b"" if _NOT_SPACE.search(body, at, stop) is None else b"?", row + 1, count)
        column = 0
        while at <= stop:
            cut = stop if at + _WINDOW >= stop else body.rfind(b",", at, at + _WINDOW)
            if cut < at:  # no comma in a whole window: a value far past any number's length
                self._not_a_value(bytes(body[at : at + VALUE_CHARS + 1]), row + 1)
            piece = bytes(body[at:cut])
            if not self.values_pattern.fullmatch(piece):
                self._refuse(piece, row + 1, count)
            numbers = self._numbers(piece.translate(None, b" \t").split(b","), lambda _: row)
            if self.values is not None:
                self.values[row, column : column + len(numbers)] = numbers
            column += len(numbers)
            at = cut + 1
            await asyncio.sleep(0)
        return row + 1

    def _numbers(self, fields: list[bytes], row_of: Callable[[int], int]) -> NDArray[Any]:
        """Valid ``fields`` (their spaces taken out) as numbers; a value too long or out of its type's range
        refused naming its line (``row_of``: the row of a field, by its place)."""
        if fields and max(map(len, fields)) > VALUE_CHARS:
            at = next(i for i, field in enumerate(fields) if len(field) > VALUE_CHARS)
            self._not_a_value(fields[at], row_of(at) + 1)
        text = np.array(fields, dtype=bytes)
        try:
            return _numbers(text, self.numpy_type)
        except _OutOfRange as exc:
            raise BadRequest(
                f"line {row_of(exc.at) + 1} of {self.total}: {_said(fields[exc.at])} is out of "
                f"{self.to.datatype}'s range (model input '{self.to.name}')"
            ) from None

    def _refuse(self, line: bytes, number: int, count: int) -> NoReturn:
        """400 for the row on line ``number``: empty, of the wrong width, or its first value that is none."""
        where = f"line {number} of {self.total}"
        if count == 1 and not line.strip():
            raise BadRequest(f"{where}: {EMPTY_ROW}")
        if count != self.width:
            to = self.to
            takes = f"model input '{to.name}' takes {to.width}" if to.width else f"line 1 has {self.width}"
            raise BadRequest(f"{where} has {count} values: {takes}")
        value = _VALUE[self.kind]
        self._not_a_value(next((field for field in line.split(b",") if not value.fullmatch(field)), line), number)

    def _not_a_value(self, field: bytes, number: int) -> NoReturn:
        plain = "integers" if self.kind in "iu" else "numbers"
        hint = ""
        if b'"' in field or b"'" in field:
            hint = ", unquoted"
        elif b"_" in field:
            hint = ", without digit separators"
        elif len(field) > VALUE_CHARS:
            hint = f", of at most {VALUE_CHARS} characters"
        raise BadRequest(
            f"line {number} of {self.total}: {_said(field.strip())} is not a value of {self.to.datatype} "
            f"(model input '{self.to.name}'): write plain decimal {plain}{hint}"
        )


def _said(field: bytes) -> str:
    text = field.decode("utf-8", "replace")
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _rows_end(body: RequestBody, start: int) -> int:
    """Where the body's last row ends: the blank lines that end a body are no rows."""
    at = len(body)
    while at > start:
        begin = max(start, at - _WINDOW)
        kept = len(bytes(body[begin:at]).rstrip())
        if kept:
            return begin + kept
        at = begin
    return start


def _numbers(text: NDArray[Any], numpy_type: np.dtype[Any]) -> NDArray[Any]:
    """Valid values' text as numbers of ``numpy_type``; :class:`_OutOfRange` for the first out of its range
    (a float that overflows to infinity, an integer past the type's bounds) rather than wrapped."""
    if numpy_type.kind == "f":
        with np.errstate(over="ignore"):
            numbers = text.astype(numpy_type)
        bad = np.flatnonzero(~np.isfinite(numbers))
        if bad.size:
            raise _OutOfRange(int(bad[0]))
        return numbers
    wide_type = np.uint64 if numpy_type.kind == "u" else np.int64
    try:
        wide = text.astype(wide_type)
    except (OverflowError, ValueError):  # past 64 bits: which one, a value at a time
        raise _OutOfRange(next(i for i, v in enumerate(text) if not _fits_64(v, wide_type))) from None
    info = np.iinfo(numpy_type)
    bad = np.flatnonzero((wide < info.min) | (wide > info.max)) if wide.size else np.empty(0, np.intp)
    if bad.size:
        raise _OutOfRange(int(bad[0]))
    return wide.astype(numpy_type)


def _fits_64(value: bytes, wide_type: type[np.integer[Any]]) -> bool:
    info = np.iinfo(wide_type)
    return bool(info.min <= int(value) <= info.max)
