"""seqzoo: advanced sequence encoders (QRNN, MZU; S-LSTM and Meta-LSTM on the roadmap) and their baselines."""

from seqzoo.base import Encoder, available_encoders, build_encoder, detach_state, register_encoder
from seqzoo.baselines import GRU, LSTM, TransformerEncoder
from seqzoo.dtgru import DeepTransitionGRU, LayerNormGRU
from seqzoo.mzu import MZU
from seqzoo.poolers import build_pooler
from seqzoo.qrnn import QRNN
from seqzoo.stacking import DenseGRU, DenseLSTM, DenseStack

__version__ = "0.1.0"

__all__ = [
    "GRU",
    "LSTM",
    "MZU",
    "QRNN",
    "DeepTransitionGRU",
    "DenseGRU",
    "DenseLSTM",
    "DenseStack",
    "Encoder",
    "LayerNormGRU",
    "TransformerEncoder",
    "available_encoders",
    "build_encoder",
    "build_pooler",
    "detach_state",
    "register_encoder",
]
