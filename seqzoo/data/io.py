"""File primitives shared by every reader and writer of seqzoo.

Reading: :func:`open_text` yields the lines of a UTF-8 text file, transparently gunzipping
files whose name ends in ``.gz`` and dropping a byte-order mark at its start, and knows the
current line number so that every reader reports malformed input the same way
(:meth:`LineReader.error`).

Writing: :func:`atomic_write_text` / :func:`atomic_write_bytes` / :func:`write_json` write to a
temporary file in the destination directory, fsync it and ``os.replace`` it over the target,
so a crash or an exception never leaves a half-written file: the old file stays intact.
"""

from __future__ import annotations

import codecs
import collections
import gzip
import json
import os
import stat
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from seqzoo.data.errors import DataError

__all__ = [
    "LineReader",
    "atomic_write_bytes",
    "atomic_write_text",
    "find_file",
    "open_text",
    "read_bytes",
    "read_json",
    "read_text",
    "require_file",
    "require_regular",
    "unset_variable_hint",
    "write_json",
]

PathLike = str | os.PathLike[str]

# Raised by gzip for a corrupt or truncated stream.
_GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)
# What a file's first two bytes say when it does not decode as UTF-8.
_ENCODING_HINTS = {
    codecs.BOM_UTF16_LE: ": a UTF-16 file? save it as UTF-8",
    codecs.BOM_UTF16_BE: ": a UTF-16 file? save it as UTF-8",
    b"\x1f\x8b": ": gzip data; name the file *.gz",
}


class LineReader:
    """Iterator over the decoded lines of a text file; use via :func:`open_text`.

    Each item is one line *with* its terminator, so character-level readers see every
    character. ``"\n"``, ``"\r\n"`` and a lone ``"\r"`` (old Mac files) all end a line and
    all come out as ``"\n"``; the last line may lack one. :attr:`line` is the 1-based number of
    the line last yielded (0 before the first), and :meth:`error` builds a :class:`DataError`
    pointing at it. A UTF-8 byte-order mark at the start of the file is not part of the text;
    one at the start of a later line (files joined with ``cat``), a NUL character (UTF-16 text)
    and invalid UTF-8 are errors. A file that cannot be opened is a :class:`DataError` too.
    """

    def __init__(self, path: PathLike, stream: IO[bytes] | None = None) -> None:
        self.path = Path(path)
        self.line = 0
        self._pending: collections.deque[str] = collections.deque()  # a raw line's lines (lone "\r"s split one)
        self._owned = stream is None  # a stream that was given (standard input) stays open
        self._raw: IO[bytes] = stream if stream is not None else _open_binary(self.path)

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        while not self._pending:  # (a first line of only a byte-order mark holds no line)
            self._pending.extend(self._split(self._read()))
        self.line += 1
        text = self._pending.popleft()
        if "\x00" in text:
            raise self.error(f"NUL character at column {text.index(chr(0)) + 1} (UTF-16 text? save the file as UTF-8)")
        if text.startswith("\ufeff"):
            raise self.error("byte-order mark inside the file (files joined with cat?): remove it")
        return text

    def _read(self) -> str:
        """The next raw line (up to ``"\n"``) decoded; StopIteration at the end of the file."""
        try:
            raw = self._raw.readline()
        except _GZIP_ERRORS as err:  # lines 1..self.line decompressed fine
            after = f" after line {self.line}" if self.line else ""
            raise DataError(f"corrupt or truncated gzip data{after} ({err})", self.path) from None
        except OSError as err:  # e.g. a directory
            raise DataError(f"cannot read: {err.strerror}", self.path) from None
        if not raw:
            raise StopIteration
        if self.line == 0 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8) :]
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as err:
            hint = _ENCODING_HINTS.get(raw[:2], "") if self.line == 0 else ""
            raise DataError(
                f"invalid UTF-8 at byte {err.start + 1} of the line ({err.reason}){hint}", self.path, self.line + 1
            ) from None

    @staticmethod
    def _split(text: str) -> list[str]:
        """A raw line's lines, each ending in ``"\n"`` (but perhaps the file's last)."""
        pieces = text.replace("\r\n", "\n").split("\r")
        lines = [piece + "\n" for piece in pieces[:-1]]
        return [*lines, pieces[-1]] if pieces[-1] else lines

    def error(self, message: str) -> DataError:
        """A :class:`DataError` for the current line (or for the whole file before the first line)."""
        return DataError(message, self.path, self.line or None)

    def close(self) -> None:
        if self._owned:
            self._raw.close()

    def __enter__(self) -> LineReader:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def find_file(directory: PathLike, name: str) -> Path | None:
    """``directory/name`` or ``directory/name.gz``, whichever exists (None if neither; both is an error)."""
    plain = Path(directory) / name
    gz = plain.with_name(name + ".gz")
    for path in (plain, gz):  # a directory, FIFO or device there is a mistake, not an absent split
        if path.exists() and not path.is_file():
            raise DataError(f"exists but is {_kind(path)}, not a regular file", path)
    if plain.is_file() and gz.is_file():
        raise DataError(f"both {plain.name} and {gz.name} exist; remove one", directory)
    return plain if plain.is_file() else gz if gz.is_file() else None


def require_file(directory: PathLike, name: str) -> Path:
    """:func:`find_file`, or a :class:`DataError` naming the missing file."""
    path = find_file(directory, name)
    if path is None:
        raise DataError(f"no {name} or {name}.gz{unset_variable_hint(directory)}", directory)
    return path


def _kind(path: Path) -> str:
    """What ``path`` (which exists) is, in words: "a directory", "a FIFO", "a device", ..."""
    mode = path.stat().st_mode
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a regular file"


def require_regular(path: PathLike) -> Path:
    """``path``, unless it exists as something other than a regular file (or a link to one): then a
    :class:`DataError` naming it, before anything reads it (a device may never end, a FIFO block).
    A missing file passes, for its reader to report."""
    path = Path(path)
    if path.exists() and not path.is_file():
        raise DataError(f"is {_kind(path)}, not a regular file", path)
    return path


def unset_variable_hint(path: PathLike) -> str:
    """A note for a path that still holds ``$NAME`` (an environment variable that was not set), else ""."""
    return " (an environment variable in the data directory is not set)" if "$" in str(path) else ""


def open_text(path: PathLike, stream: IO[bytes] | None = None) -> LineReader:
    """Open a UTF-8 text file (gzip-compressed when the name ends in ``.gz``) for line iteration;
    or read ``stream`` (e.g. ``sys.stdin.buffer``) the same way, calling it ``path`` in errors.

    Decoding is strict: invalid UTF-8 raises :class:`DataError` naming the file and line, and
    so does a file that cannot be opened (missing, a directory, no permission). Use as a
    context manager::

        with open_text(path) as lines:
            for line in lines:
                if "\\t" not in line:
                    raise lines.error("missing tab")
    """
    return LineReader(path, stream)


def read_text(path: PathLike) -> str:
    """The whole decoded content of a text file (``.gz`` aware, strict UTF-8, newlines kept)."""
    with open_text(path) as lines:
        return "".join(lines)


def read_bytes(path: PathLike) -> bytes:
    """The undecoded content of a file (``.gz`` aware), for formats that declare their own encoding
    (XML); a file that cannot be opened or decompressed is a :class:`DataError`."""
    path = require_regular(path)  # read whole: a device would never end
    with _open_binary(path) as raw:
        try:
            return raw.read()
        except _GZIP_ERRORS as err:
            raise DataError(f"corrupt or truncated gzip data ({err})", path) from None
        except OSError as err:  # e.g. a directory
            raise DataError(f"cannot read: {err.strerror}", path) from None


def _open_binary(path: Path) -> IO[bytes]:
    try:
        return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")
    except OSError as err:
        raise DataError(f"cannot read: {err.strerror}{unset_variable_hint(path)}", path) from None


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Replace ``path`` by ``data`` atomically (temporary file in the same directory, fsync, rename).

    A new file gets mode 0o644; an existing file keeps its mode. A symbolic link is written
    through: its target gets the data and the link stays.
    """
    path = Path(os.path.realpath(path))
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: PathLike, text: str) -> None:
    """Replace ``path`` by ``text`` encoded as UTF-8, atomically (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: PathLike, obj: Any) -> None:
    """Write ``obj`` as indented UTF-8 JSON (gzip-compressed where the name ends in ``.gz``, as
    :func:`read_json` reads it), atomically; serialisation errors leave ``path`` untouched."""
    data = (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    atomic_write_bytes(path, gzip.compress(data, mtime=0) if Path(path).name.endswith(".gz") else data)


def read_json(path: PathLike) -> Any:
    """Parse a JSON file (``.gz`` aware); malformed JSON raises :class:`DataError` with its line, and so
    does a path that is no regular file (:func:`require_regular`)."""
    try:
        return json.loads(read_text(require_regular(path)))
    except json.JSONDecodeError as err:
        raise DataError(f"invalid JSON: {err.msg} (column {err.colno})", path, err.lineno) from None
    except RecursionError:
        raise DataError("invalid JSON: nested too deeply", path) from None


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened (Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
