"""``python -m seqzoo``: the ``seqzoo`` command, as torchrun starts it (``torchrun ... -m seqzoo train CONFIG``)."""

import sys

from seqzoo.cli import main

if __name__ == "__main__":
    sys.exit(main())
