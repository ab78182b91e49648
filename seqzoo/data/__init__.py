"""The data layer: readers for standard formats, vocabularies, embeddings and batching.

Every reader accepts plain or ``.gz`` files, decodes UTF-8 strictly (XML: the encoding it
declares) and reports malformed input as one :class:`DataError` naming the file and line.
"""

from seqzoo.data.batching import bucket_batches, pad_batch
from seqzoo.data.classification import (
    ClassificationData,
    LabeledText,
    LabelSet,
    bundled_corpus_dir,
    find_split,
    holdout_split,
    kfold_splits,
    read_labeled,
)
from seqzoo.data.conll import TaggedSentence, read_conll
from seqzoo.data.embeddings import EmbeddingStats, load_vectors
from seqzoo.data.errors import DataError
from seqzoo.data.io import atomic_write_bytes, atomic_write_text, open_text, read_json, read_text, write_json
from seqzoo.data.lm import EOS, batchify, build_lm_vocab, read_lm_tokens, tbptt_batches
from seqzoo.data.text import Tokenizer, Vocab

__all__ = [
    "EOS",
    "ClassificationData",
    "DataError",
    "EmbeddingStats",
    "LabelSet",
    "LabeledText",
    "TaggedSentence",
    "Tokenizer",
    "Vocab",
    "atomic_write_bytes",
    "atomic_write_text",
    "batchify",
    "bucket_batches",
    "build_lm_vocab",
    "bundled_corpus_dir",
    "find_split",
    "holdout_split",
    "kfold_splits",
    "load_vectors",
    "open_text",
    "pad_batch",
    "read_conll",
    "read_json",
    "read_labeled",
    "read_lm_tokens",
    "read_text",
    "tbptt_batches",
    "write_json",
]
