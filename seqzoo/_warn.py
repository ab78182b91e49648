"""One way for seqzoo to warn: at the user's line, not inside seqzoo or torch.

A fixed ``stacklevel`` names the wrong line whenever a wrapper sits between the user and the
warning (``nn.Module.__call__``, ``torch.compiler.disable``, an encoder stack, ``build_encoder``),
and Python's default filter then shows the warning once per *that* line, not once per user call site.
"""

from __future__ import annotations

import os
import sys
import warnings

import torch

_LIBRARY_DIRS = tuple(os.path.dirname(module.__file__) + os.sep for module in (sys.modules[__package__], torch))


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the first frame outside seqzoo and torch."""
    frame, level = sys._getframe(1), 2  # stacklevel 2 names warn_user's caller
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_LIBRARY_DIRS):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
