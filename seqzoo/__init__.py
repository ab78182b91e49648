"""seqzoo: advanced sequence encoders (QRNN, MZU, S-LSTM, Meta-LSTM) and their baselines."""

from seqzoo.base import Encoder, available_encoders, build_encoder, detach_state, register_encoder
from seqzoo.baselines import GRU, LSTM, TransformerEncoder
from seqzoo.poolers import build_pooler

__version__ = "0.1.0"

__all__ = [
    "GRU",
    "LSTM",
    "Encoder",
    "TransformerEncoder",
    "available_encoders",
    "build_encoder",
    "build_pooler",
    "detach_state",
    "register_encoder",
]
