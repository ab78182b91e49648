"""Run directories: claimed when a run starts, locked while it trains.

Two trainings must never write into one directory. :func:`new_run_dir` claims ``OUTPUT_DIR/NAME``
(or ``NAME-2``, ...) by creating it, so runs started together each get their own;
:func:`run_lock` holds an advisory ``flock`` on ``RUN/.seqzoo.lock`` while a run trains (the
system drops it when the process ends, however it ends); :func:`training_pid` tells readers
that a run is still being trained; :func:`check_run_dir` stops a training whose directory was
moved or removed under it (its lock would then guard another directory).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from seqzoo.config import ConfigError

try:
    import fcntl
except ImportError:  # Windows: runs are not locked
    fcntl = None

__all__ = ["LOCK_NAME", "RunDirectoryError", "check_run_dir", "new_run_dir", "run_lock", "training_pid"]

LOCK_NAME = ".seqzoo.lock"
# the run directories this process locks: real path -> (the path it was locked by, dev and inode of its lock file)
_HELD: dict[str, tuple[str, int, int]] = {}
log = logging.getLogger("seqzoo")


class RunDirectoryError(OSError):
    """A training's run directory is no longer where the training locked it."""


def new_run_dir(output_dir: str | Path, name: str) -> Path:
    """Claim OUTPUT_DIR/NAME, or NAME-2, NAME-3, ... where taken, by creating it: one mkdir that
    fails on an existing name, so runs started at the same time (a job array) each get their own."""
    base = Path(output_dir) / name
    base.parent.mkdir(parents=True, exist_ok=True)
    candidate, n = base, 1
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            n += 1
            candidate = base.with_name(f"{base.name}-{n}")


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s lock (an advisory ``flock`` on ``run_dir/.seqzoo.lock``, which names the
    holder's pid) for the block.

    Raises :class:`ConfigError` when another process holds it (a reader's momentary shared lock,
    :func:`training_pid`, is waited out for up to a second); within one process it is reentrant
    (the CLI takes it before its checks, then :func:`seqzoo.training.runner.run` again). Where ``fcntl`` does
    not exist (Windows) runs are not locked; where the file system refuses locks (some network
    mounts) a warning says that the run is not guarded.
    """
    key = os.path.realpath(run_dir)
    if fcntl is None or key in _HELD:
        yield
        return
    with open(run_dir / LOCK_NAME, "a+", encoding="utf-8") as handle:
        if not _take_lock(handle, run_dir):
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise ConfigError(
                f"{run_dir} is in use by another seqzoo process (pid {holder}): "
                "wait for it to end, or train in another directory"
            )
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        stat = os.fstat(handle.fileno())
        _HELD[key] = (os.path.abspath(run_dir), stat.st_dev, stat.st_ino)
        try:
            yield
        finally:
            del _HELD[key]


def _take_lock(handle: IO[str], run_dir: Path) -> bool:
    """Take the exclusive lock: False when another process holds it past a second of tries; True
    when taken, or when the file system has no locks (then with a warning)."""
    for _ in range(20):
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            time.sleep(0.05)
        except OSError as err:  # e.g. ENOLCK on a network mount without a lock service
            log.warning("%s: cannot lock (%s); a second training there would not be stopped", run_dir, err.strerror)
            return True
    return False


def check_run_dir(path: Path) -> None:
    """Raise :class:`RunDirectoryError` where the locked run directory that holds ``path`` is no longer
    where this process locked it: moved or removed (its lock file gone), or replaced by another run
    (another lock file there), also through a replaced symbolic link. Nothing where this process
    locks no directory above ``path``."""
    given, real = os.path.abspath(path), os.path.realpath(path)
    for key, (locked, dev, inode) in _HELD.items():
        if any(p == root or p.startswith(root + os.sep) for p, root in ((real, key), (given, locked))):
            try:
                stat = os.stat(os.path.join(locked, LOCK_NAME))
            except FileNotFoundError:
                happened = "was moved or removed"
            else:
                if (stat.st_dev, stat.st_ino) == (dev, inode):
                    continue
                happened = "was replaced (another run is there now)"
            raise RunDirectoryError(
                f"{locked} {happened} while this process trained in it; "
                "stopped so as not to write into what is there now"
            )


def training_pid(run_dir: Path) -> str | None:
    """The pid of another process that trains in ``run_dir`` now (holds its :func:`run_lock`), else
    None. Reads the lock file only: a reader creates nothing in a run directory."""
    if fcntl is None:
        return None
    try:
        handle = open(run_dir / LOCK_NAME, encoding="utf-8")
    except OSError:  # no lock file: nothing trains there
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return handle.read().strip() or "unknown"
        except OSError:  # a file system without locks: cannot tell
            return None
        return None  # closing the file drops the shared lock
