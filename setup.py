"""Build the optional compiled QRNN pooling kernel (plain C, no torch or Python headers needed).

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
            "seqzoo.kernels._qrnn_pool",
            sources=["seqzoo/kernels/qrnn_pool.c"],
            depends=["seqzoo/kernels/qrnn_pool_body.h"],
            extra_compile_args=flags,
            extra_link_args=[] if sys.platform == "win32" else ["-pthread"],
            optional=True,
        )
    ]
)
