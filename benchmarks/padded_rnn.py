"""Training-step time of seqzoo's LSTM/GRU on a padded batch: its unpacked CPU path against torch's
packed sequence (what the encoders ran before), side by side in one process.

torch's packed RNN backward is several times slower than the unpacked one on CPU
(pytorch#149194), so seqzoo runs a padded batch unpacked there (``seqzoo.encoders.rnn``). Lengths are
drawn uniformly from [T/2, T] with one row of full length; each repeat times forward + backward of
the sum of the outputs, both paths alternating, and the median is reported. One JSON line per
configuration::

    python benchmarks/padded_rnn.py --shape 32x200x256 --configs lstm:1,lstm:2:bi,lstm:4,gru:2:bi
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from seqzoo import build_encoder
from seqzoo.encoders.base import Encoder


def _fwd_bwd(encoder: Encoder, x: torch.Tensor, mask: torch.Tensor, packed: bool) -> float:
    """Seconds for forward + backward of the outputs' sum: seqzoo's path or torch's packed one."""
    start = time.perf_counter()
    if packed:
        sequence = pack_padded_sequence(x, mask.sum(1), batch_first=True, enforce_sorted=False)
        out = pad_packed_sequence(encoder.rnn(sequence)[0], batch_first=True, total_length=x.shape[1])[0]
    else:
        out = encoder(x, mask)[0]
    out.sum().backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="32x200x256", help="BxTxH (input size = hidden size)")
    parser.add_argument("--configs", default="lstm:1,lstm:2:bi,lstm:4,gru:1,gru:2:bi", help="name:layers[:bi],...")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batch, time_steps, hidden = (int(v) for v in args.shape.split("x"))
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(time_steps // 2, time_steps + 1, (batch,), generator=generator)
    lengths[0] = time_steps
    mask = torch.arange(time_steps) < lengths.unsqueeze(1)
    x = torch.randn(batch, time_steps, hidden, generator=generator, requires_grad=True)
    for config in args.configs.split(","):
        name, layers, *bi = config.split(":")
        encoder = build_encoder(name, hidden, hidden_size=hidden, num_layers=int(layers), bidirectional=bool(bi))

        _fwd_bwd(encoder, x, mask, False), _fwd_bwd(encoder, x, mask, True)  # warm-up
        times: dict[str, list[float]] = {"unpacked": [], "packed": []}
        for _ in range(args.repeats):
            times["unpacked"].append(_fwd_bwd(encoder, x, mask, False))
            times["packed"].append(_fwd_bwd(encoder, x, mask, True))
        medians = {k: statistics.median(v) for k, v in times.items()}
        row = {"encoder": name, "layers": int(layers), "bidirectional": bool(bi), "batch": batch}
        row |= {"seq_len": time_steps, "hidden": hidden, "threads": args.threads}
        row |= {f"{k}_fwd_bwd_s": round(v, 4) for k, v in medians.items()}
        row["packed_over_unpacked"] = round(medians["packed"] / medians["unpacked"], 2)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
