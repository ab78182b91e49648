"""Benchmarks run as ``seqzoo bench <name>``: each module here has ``main(argv) -> int``."""
