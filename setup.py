"""Build the optional compiled kernels: QRNN pooling, CRF Viterbi, the CRF log partition, the LSTM recurrence,
the S-LSTM global node's step and word cells (plain C, no torch or Python headers needed).

All metadata lives in pyproject.toml. The extension is ``optional``: where no C compiler exists
the install still succeeds and seqzoo warns at run time that it uses the PyTorch reference.
"""

import sys

from setuptools import Extension, setup

# -g0 after Python's own -g: no debug info in the shipped library (1.05 MB -> 0.47 MB)
unix_flags = ["-O3", "-g0", "-std=c99", "-pthread", "-fno-math-errno", "-fno-trapping-math"]
# DA-GRN's inference kernels multiply-add in fused instructions (-std=c99 turns the contraction off); the others
# keep their rounding
contracted = {"lstm_recurrence", "slstm_global", "slstm_word"}
shared_headers = ("parallel", "vector_math", "both_types")


def flags(name: str) -> list[str]:
    if sys.platform == "win32":
        return []
    return unix_flags + (["-ffp-contract=fast"] if name in contracted else [])


setup(
    ext_modules=[
        Extension(
            f"seqzoo.kernels._{name}",
            sources=[f"seqzoo/kernels/{name}.c"],
            depends=[f"seqzoo/kernels/{header}.h" for header in (f"{name}_body", *shared_headers)],
            extra_compile_args=flags(name),
            extra_link_args=[] if sys.platform == "win32" else ["-pthread", "-lm"],
            optional=True,
        )
        for name in ("qrnn_pool", "crf_viterbi", "crf_forward", "lstm_recurrence", "slstm_global", "slstm_word")
    ]
)
