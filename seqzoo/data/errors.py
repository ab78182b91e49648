"""The one exception type raised for malformed data files."""

from __future__ import annotations

from os import PathLike

__all__ = ["DataError"]


class DataError(ValueError):
    """Malformed input data, located by file and (1-based) line.

    ``str(err)`` is ``"{path}:{line}: {message}"``, ``"{path}: {message}"`` without a line,
    or just ``message`` without a path, so editors and terminals can jump to the spot.
    """

    def __init__(self, message: str, path: str | PathLike[str] | None = None, line: int | None = None) -> None:
        self.message = message
        self.path = None if path is None else str(path)
        self.line = line
        super().__init__(message, self.path, line)

    def __str__(self) -> str:
        if self.path is None:
            return self.message if self.line is None else f"line {self.line}: {self.message}"
        if self.line is None:
            return f"{self.path}: {self.message}"
        return f"{self.path}:{self.line}: {self.message}"
