"""seqzoo: advanced sequence encoders (QRNN, MZU; S-LSTM and Meta-LSTM on the roadmap) and their baselines."""

from typing import Any

from seqzoo.encoders.base import Encoder, available_encoders, build_encoder, detach_state, register_encoder
from seqzoo.encoders.dagrn import DAGRN
from seqzoo.encoders.dense import DenseGRU, DenseLSTM, DenseStack
from seqzoo.encoders.dtgru import DeepTransitionGRU, LayerNormGRU
from seqzoo.encoders.hyper_lstm import HyperLSTM
from seqzoo.encoders.meta_lstm import MetaLSTM
from seqzoo.encoders.mzu import MZU
from seqzoo.encoders.qrnn import QRNN
from seqzoo.encoders.rnn import GRU, LSTM, TransformerEncoder
from seqzoo.encoders.slstm import SLSTM
from seqzoo.heads.poolers import build_pooler

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """``seqzoo.load`` (:func:`seqzoo.api.load`), imported on first use: it brings in the training
    stack (the runner, plotting), which using the encoders alone does not need."""
    if name == "load":
        from seqzoo.api import load

        return load
    raise AttributeError(f"module 'seqzoo' has no attribute {name!r}")


__all__ = [
    "DAGRN",
    "GRU",
    "LSTM",
    "MZU",
    "QRNN",
    "SLSTM",
    "DeepTransitionGRU",
    "DenseGRU",
    "DenseLSTM",
    "DenseStack",
    "Encoder",
    "HyperLSTM",
    "LayerNormGRU",
    "MetaLSTM",
    "TransformerEncoder",
    "available_encoders",
    "build_encoder",
    "build_pooler",
    "detach_state",
    "load",
    "register_encoder",
]
