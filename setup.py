"""Build the optional compiled kernels: QRNN pooling, CRF Viterbi and the CRF log partition (plain C, no torch
or Python headers needed).

All metadata lives in pyproject.toml. The extension is ``optional``: where no C compiler exists
the install still succeeds and seqzoo warns at run time that it uses the PyTorch reference.
"""

import sys

from setuptools import Extension, setup

# -g0 after Python's own -g: no debug info in the shipped library (1.05 MB -> 0.47 MB)
unix_flags = ["-O3", "-g0", "-std=c99", "-pthread", "-fno-math-errno", "-fno-trapping-math"]
flags = [] if sys.platform == "win32" else unix_flags

setup(
    ext_modules=[
        Extension(
            f"seqzoo.kernels._{name}",
            sources=[f"seqzoo/kernels/{name}.c"],
            depends=[f"seqzoo/kernels/{name}_body.h", "seqzoo/kernels/parallel.h"],
            extra_compile_args=flags,
            extra_link_args=[] if sys.platform == "win32" else ["-pthread", "-lm"],
            optional=True,
        )
        for name in ("qrnn_pool", "crf_viterbi", "crf_forward")
    ]
)
