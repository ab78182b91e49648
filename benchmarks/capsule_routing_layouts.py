"""Capsule routing (MZU eqs. 10–14): the library's zone-space layout against the prediction tensor.

``seqzoo.encoders.mzu.capsule_routing`` routes in zone space: since ``W^c_j`` is shared by all input
zones, ``s_j = W^c_j Σ_i c_ij z_i`` and ``ẑ_{j|i}·o_j = z_i·(W^c_jᵀ o_j)``. The textbook layout
(kept here only to measure against) forms every prediction ``ẑ_{j|i}``, a (B, J, N, d_o) tensor,
and routes over it. Both give the same values (checked below in float64). Timed: forward +
backward of one routing call, best of ``--rounds`` interleaved rounds (the machine is noisy), and
the tensor storage autograd keeps for its backward (inputs and weights included), at
the brown_char CPU config (B 64, hidden 192) and the paper's PTB config (B 256, hidden 800);
4 zones, J = 2, 3 iterations.

    python benchmarks/capsule_routing_layouts.py [--threads 2] [--rounds 9]
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from _layouts import layout_args
from torch import Tensor

from seqzoo.encoders.mzu import capsule_routing, squash

SHAPES = {"brown_char (B 64, H 192)": (64, 48, 96, 100), "PTB (B 256, H 800)": (256, 200, 400, 15)}


def prediction_tensor_routing(zones: Tensor, weight: Tensor, capsules: int, iterations: int) -> Tensor:
    """Eqs. 10–14 over the explicit predictions ``ẑ_{j|i}``, laid out (B, J, N, d_o)."""
    pred = F.linear(zones, weight).unflatten(-1, (capsules, -1)).transpose(1, 2).contiguous()
    logits = zones.new_zeros(pred.shape[:-1])
    for it in range(iterations):
        out = squash((torch.softmax(logits, dim=1).unsqueeze(2) @ pred).squeeze(2))
        if it + 1 < iterations:
            logits = logits + (pred @ out.unsqueeze(-1)).squeeze(-1)
    return out


def _microseconds(fn, zones: torch.Tensor, weight: torch.Tensor, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(zones, weight, 2, 3).sum().backward()
    return (time.perf_counter() - start) / calls * 1e6


def _saved_mib(fn, zones: Tensor, weight: Tensor) -> float:
    """MiB of distinct tensor storage autograd keeps for the backward of one call."""
    storages: dict[int, int] = {}

    def pack(tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn(zones, weight, 2, 3)
    return sum(storages.values()) / 2**20


def main() -> None:
    args = layout_args(__doc__, rounds=9)
    zones, weight = torch.randn(8, 4, 6, dtype=torch.float64), torch.randn(2 * 5, 6, dtype=torch.float64)
    gap = (capsule_routing(zones, weight, 2, 3) - prediction_tensor_routing(zones, weight, 2, 3)).abs().max()
    print(f"max |zone space - prediction tensor| (float64): {gap.item():.1e}")
    layouts = {"prediction tensor": prediction_tensor_routing, "zone space (seqzoo)": capsule_routing}
    for shape, (batch, zone, out_size, calls) in SHAPES.items():
        zones = torch.randn(batch, 4, zone, requires_grad=True)
        weight = torch.randn(2 * out_size, zone, requires_grad=True)
        best = dict.fromkeys(layouts, float("inf"))
        for _ in range(args.rounds):
            for name, fn in layouts.items():
                best[name] = min(best[name], _microseconds(fn, zones, weight, calls))
        old, new = best.values()
        print(f"{shape}: prediction tensor {old:.0f} us, zone space {new:.0f} us (x{old / new:.2f})")
        saved = [_saved_mib(fn, zones, weight) for fn in layouts.values()]
        print(f"{shape}: saved for backward {saved[0]:.2f} MiB (prediction tensor), {saved[1]:.2f} MiB (zone space)")


if __name__ == "__main__":
    main()
