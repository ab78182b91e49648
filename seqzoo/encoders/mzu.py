"""Multi-Zone Unit (MZU) recurrent encoders.

Fandong Meng, Jinchao Zhang, Yang Liu, Jie Zhou. "Multi-Zone Unit for Recurrent Neural
Networks". AAAI 2020. Specification: ``MODELS.md`` section 4; equation numbers below are the
paper's. Importing this module registers the encoder ``"mzu"``.

Notation: ``B`` batch, ``T`` time, ``d_x`` input size, ``H = d_h`` hidden size, ``N`` zones of
size ``d_z = H / N``, ``J`` output zones of size ``d_o``, ``d_f`` the FFN filter size.

Choices the paper leaves open (MODELS.md 4.2 / 4.8, tagged [I] there):

* **Layer norm** is applied to each M-function's output, before the tanh / sigmoid
  (``h̃ = tanh(LN(M_h(x, h)))``, ``g = σ(LN(M_g(x, h)))``); the REGULAR ablations get the same LN.
* **Candidate dropout**: dropout on ``h̃`` before the gated interpolation (eq. 1), at every depth.
* **sat**: per-zone Q / K / V maps (``N`` separate ``d_z × d_z`` matrices each, MODELS.md 4.2).
* **gcn**: ``Ã = cos(Z, Z) + I`` (footnote 1: self-connections added after the cosines);
  the degree is taken from ``|Ã|`` (``D̃_ii = Σ_j |Ã_ij| ≥ 1``), which equals the paper's row sum
  whenever all cosines are ≥ 0 and keeps ``D̃^{-1/2}`` finite when some are negative; σ = ReLU
  by default (``gcn_activation="sigmoid"`` is the alternative). A zero zone has cosine 0 with
  every zone (also in D_zone).
* **cap**: the routing is differentiated through all ``T`` iterations; squash uses
  ``s / sqrt(‖s‖² + ε)`` with ε = 1e-8.
* **Deep transition sharing** (``share_transition=True``, the paper's PTB setting): the MZU cell
  and all its t-MZU cells use the *same* M_h / M_g (and LN); a t-MZU applies them to
  ``[0; h]``, i.e. only the hidden-state columns of zone generation. With the paper's default
  depth L = 1 this is the only sharing "across depths" there can be. A shared MZU+DT is
  therefore the shallow MZU reading L zero vectors after each input (tested): it adds no
  parameters and multiplies the recurrent steps by L + 1.
* **Disagreement** (eqs. 18–19): for every M-function application (M_h and M_g at every depth,
  every layer and direction) D_zone is computed at each real token; ``D`` is their sum over
  M-functions, averaged over the real tokens of the batch, and ``auxiliary_loss() = −λ·D``.
  The per-token average matches a task loss that is a per-token mean.
  Caution: D_zone is largest (0) when the unit zones sum to zero. With capsule routing, whose
  transform is shared by all input zones, that cancels what the first (uniform) routing
  iteration sees; at 2 zones and λ = 1 a brown_char capMZU stopped learning, and at 4 zones
  λ = 1 cost 0.10–0.14 test BPC after 700 steps (docs/results.md).

Fast formulation (CPU): zone generation is linear in ``[x; h]``, so the input half of M_h and
M_g's zone generation (and of any REGULAR map) is one matmul over all ``T`` steps before the
time loop; inside the loop the hidden half of both functions is one matmul with their
concatenated (separate) weights, and the rest of M_h and M_g (composition, FFN, output map, LN)
runs as one batch of two (:class:`StackedHeads`), which halves the number of small operations
per step. :meth:`MZUCell.reference` is the unfused transcription, one M-function after the
other, that the fast path is tested against.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqzoo.encoders.base import State, check_rate, register_encoder
from seqzoo.encoders.recurrent import RecurrentCellEncoder, StepFn

__all__ = [
    "MZU",
    "MFunction",
    "MZUCell",
    "MZUTransition",
    "RegularTransform",
    "StackedHeads",
    "capsule_routing",
    "graph_conv_zones",
    "self_attention_zones",
    "squash",
    "zone_disagreement",
]

COMPOSITIONS = ("sat", "gcn", "cap")
_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": torch.relu, "sigmoid": torch.sigmoid}
_NORM_EPS = 1e-12  # for unit vectors in cosines (F.normalize)


def zone_disagreement(zones: Tensor) -> Tensor:
    """D_zone (eq. 18) of zones (..., N, d_z) -> (...): ``−(1/N²) Σ_i Σ_j cos(z_i, z_j)``.

    Computed as ``−‖Σ_i z_i/‖z_i‖‖² / N²``, which is the same double sum.
    """
    n = zones.shape[-2]
    unit = F.normalize(zones, dim=-1, eps=_NORM_EPS)
    return -unit.sum(-2).pow(2).sum(-1) / n**2


def _stacked(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """Let a composition over (S, B, N, d_z) zones and S stacked weights also take one unstacked function."""

    @functools.wraps(fn)
    def composition(zones: Tensor, weight: Tensor, *args: object) -> Tensor:
        if zones.dim() == 4:
            return fn(zones, weight, *args)
        return fn(zones.unsqueeze(0), weight.unsqueeze(0), *args).squeeze(0)

    return composition


@_stacked
def self_attention_zones(zones: Tensor, qkv: Tensor) -> Tensor:
    """satMZU composition (eq. 6): (B, N, d_z) -> (B, N, d_z).

    ``qkv`` (N, d_z, 3·d_z) holds each zone's own ``[W_Q | W_K | W_V]``. Like the other
    compositions, it also runs S functions at once: zones (S, B, N, d_z), ``qkv`` (S, N, d_z, 3·d_z).
    """
    q, k, v = torch.einsum("sbnd,snde->sbne", zones, qkv).chunk(3, dim=-1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(zones.shape[-1])  # (S, B, N, N)
    return torch.softmax(scores, dim=-1) @ v


@_stacked
def graph_conv_zones(zones: Tensor, weight: Tensor, activation: Callable[[Tensor], Tensor] = torch.relu) -> Tensor:
    """gcMZU composition (eqs. 7–9): (B, N, d_z) -> (B, N, d_g), ``weight`` W_g as (d_g, d_z).

    ``Ã = cos(Z, Z) + I`` and ``D̃_ii = Σ_j |Ã_ij|`` (see the module docstring). Stacked: zones
    (S, B, N, d_z), ``weight`` (S, d_g, d_z).
    """
    unit = F.normalize(zones, dim=-1, eps=_NORM_EPS)
    eye = torch.eye(zones.shape[-2], dtype=zones.dtype, device=zones.device)
    adjacency = unit @ unit.transpose(-1, -2) + eye  # eqs. 7-8 plus self-connections (S, B, N, N)
    inv_sqrt_degree = adjacency.abs().sum(-1).rsqrt()  # (S, B, N)
    normalized = inv_sqrt_degree.unsqueeze(-1) * adjacency * inv_sqrt_degree.unsqueeze(-2)
    projected = torch.bmm(zones.flatten(1, 2), weight.transpose(1, 2)).view(*zones.shape[:-1], -1)  # Z W_g
    return activation(normalized @ projected)  # eq. 9


def squash(s: Tensor, eps: float = 1e-8) -> Tensor:
    """Capsule squash (eq. 13) over the last dimension: ``‖s‖²/(1+‖s‖²) · s/‖s‖``."""
    squared = s.pow(2).sum(-1, keepdim=True)
    return s * (squared / ((1 + squared) * torch.sqrt(squared + eps)))


@_stacked
def capsule_routing(zones: Tensor, weight: Tensor, capsules: int, iterations: int) -> Tensor:
    """capMZU composition (eqs. 10–14): (B, N, d_z) -> (B, J, d_o) by dynamic routing.

    ``weight`` (J·d_o, d_z) stacks the J transforms ``W^c_j`` (d_o, d_z). Each is shared by all
    input capsules (footnote 2), so the predictions ``ẑ_{j|i} = W^c_j z_i`` (eq. 10) need not be
    formed: the routing runs in zone space, with ``s_j = W^c_j (Σ_i c_ij z_i)`` (eq. 12) and
    ``ẑ_{j|i} · o_j = z_i · (W^c_jᵀ o_j)`` (eq. 14). Same values up to rounding. It does 2T − 1
    products with W^c instead of N, but never writes and reads a (B, J, N, d_o) tensor of
    predictions at each iteration, and that is faster on a CPU
    (``benchmarks/capsule_routing_layouts.py``: 1.1–1.4x per call, forward + backward).
    Stacked: zones (S, B, N, d_z), ``weight`` (S, J·d_o, d_z) -> (S, B, J, d_o).
    """
    stack, batch = zones.shape[:2]
    per_capsule = weight.unflatten(1, (capsules, -1)).flatten(0, 1)  # W^c as (S·J, d_o, d_z)

    def transform(mixed: Tensor, weights: Tensor) -> Tensor:  # (S, B, J, ·) per capsule j -> (S, B, J, ·)
        out = torch.bmm(mixed.transpose(1, 2).flatten(0, 1), weights)  # (S·J, B, ·)
        return out.view(stack, capsules, batch, -1).transpose(1, 2)

    # first iteration: b_ij = 0, so c_ij = 1/J and s_j = W^c_j Σ_i z_i / J
    first = torch.bmm(zones.sum(2) / capsules, weight.transpose(1, 2))  # (S, B, J·d_o)
    out = squash(first.view(stack, batch, capsules, -1))  # o_j (S, B, J, d_o)
    logits = None
    for _ in range(iterations - 1):
        back = transform(out, per_capsule)  # W^c_jᵀ o_j (S, B, J, d_z)
        agreement = (back.unsqueeze(3) * zones.unsqueeze(2)).sum(-1)  # ẑ_{j|i} · o_j (S, B, J, N), eq. 14
        logits = agreement if logits is None else logits + agreement
        mixed = torch.softmax(logits, dim=2) @ zones  # Σ_i c_ij z_i (S, B, J, d_z), eqs. 11-12
        out = squash(transform(mixed, per_capsule.transpose(1, 2)))  # eqs. 12-13
    return out


class MFunction(nn.Module):
    """Multi-zone transformation function M(x, h) -> R^H (Figure 1), layer-normalised if asked.

    ``generate``: zone generation (eq. 4), one bias-free ``Linear(d_x + H, N·d_z)`` on ``[x; h]``
    (``input_size`` may be 0 for a t-MZU that never sees an input).
    :meth:`head`: composition (sat / gcn / cap) -> position-wise FFN shared across the J output
    zones (eq. 5) -> concatenation -> ``Linear(J·d_o, H)`` -> LN.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        composition: str = "sat",
        num_zones: int = 4,
        filter_size: int | None = None,
        capsules: int = 2,
        routing_iters: int = 3,
        layer_norm: bool = True,
        gcn_activation: str = "relu",
    ) -> None:
        super().__init__()
        if composition not in COMPOSITIONS:
            raise ValueError(f"composition must be one of {COMPOSITIONS}, got {composition!r}")
        if num_zones < 1:
            raise ValueError(f"num_zones must be >= 1, got {num_zones}")
        if hidden_size % num_zones:
            raise ValueError(f"hidden_size {hidden_size} must be divisible by num_zones {num_zones}")
        if composition == "cap" and (capsules < 1 or hidden_size % capsules or routing_iters < 1):
            raise ValueError(f"cap needs capsules dividing hidden_size {hidden_size} and routing_iters >= 1")
        if gcn_activation not in _ACTIVATIONS:
            raise ValueError(f"gcn_activation must be one of {sorted(_ACTIVATIONS)}, got {gcn_activation!r}")
        self.composition = composition
        self.num_zones = num_zones
        self.zone_size = zone = hidden_size // num_zones
        self.generate = nn.Linear(input_size + hidden_size, hidden_size, bias=False)  # eq. 4
        out_zones, out_size = num_zones, zone
        if composition == "sat":
            self.qkv = nn.Parameter(torch.empty(num_zones, zone, 3 * zone).uniform_(-1, 1) / math.sqrt(zone))
        elif composition == "gcn":
            self.graph_weight = nn.Linear(zone, zone, bias=False)  # W_g, d_g = d_z
            self.activation = _ACTIVATIONS[gcn_activation]
        else:
            out_zones, out_size = capsules, hidden_size // capsules
            self.capsule_weight = nn.Linear(zone, capsules * out_size, bias=False)  # W^c (J, d_z, d_o)
            self.routing_iters = routing_iters
        self.out_zones = out_zones
        if filter_size is not None and filter_size < 1:
            raise ValueError(f"filter_size must be >= 1 (None: hidden_size), got {filter_size}")
        filter_size = hidden_size if filter_size is None else filter_size
        self.ffn = nn.Sequential(nn.Linear(out_size, filter_size), nn.ReLU(), nn.Linear(filter_size, out_size))
        self.out = nn.Linear(out_zones * out_size, hidden_size)
        # The biases start at zero, as the GRU baselines' do. With torch's random ones the constant
        # path through the three stacked linears dominated: at initialisation two different inputs
        # gave M outputs with cosine 0.98 after LN (0.35 with zero biases), and the capMZU+DT
        # learnt more slowly (docs/results.md, "Character LM: Brown (MZU)").
        for linear in (self.ffn[0], self.ffn[2], self.out):
            nn.init.zeros_(linear.bias)
        self.norm = nn.LayerNorm(hidden_size, eps=1e-6) if layer_norm else nn.Identity()

    def composition_weight(self) -> Tensor:
        """The composition's weight: ``qkv`` (sat), W_g (gcn) or W^c (cap)."""
        if self.composition == "sat":
            return self.qkv
        return (self.graph_weight if self.composition == "gcn" else self.capsule_weight).weight

    def compose(self, zones: Tensor, weight: Tensor | None = None) -> Tensor:
        """Zone composition, (B, N, d_z) -> (B, J, d_o), with this function's weight.

        Or S functions' at once (:class:`StackedHeads`): zones (S, B, N, d_z) and their stacked weights.
        """
        weight = self.composition_weight() if weight is None else weight
        if self.composition == "sat":
            return self_attention_zones(zones, weight)
        if self.composition == "gcn":
            return graph_conv_zones(zones, weight, self.activation)
        return capsule_routing(zones, weight, self.out_zones, self.routing_iters)

    def extra_repr(self) -> str:
        routing = (
            f", capsules={self.out_zones}, routing_iters={self.routing_iters}" if self.composition == "cap" else ""
        )
        return f"composition={self.composition!r}, num_zones={self.num_zones}{routing}"

    def head(self, zones: Tensor) -> Tensor:
        """Everything after zone generation: (B, N·d_z) flat zones -> (B, H)."""
        composed = self.compose(zones.unflatten(-1, (self.num_zones, self.zone_size)))
        return self.norm(self.out(self.ffn(composed).flatten(-2)))

    def forward(self, u: Tensor) -> Tensor:
        """M([x; h]): (B, d_x + H) -> (B, H)."""
        return self.head(self.generate(u))


def _structure(m: MFunction) -> tuple[object, ...]:
    """What :class:`StackedHeads` takes from its first function for all (weight shapes aside)."""
    norm_eps = m.norm.eps if isinstance(m.norm, nn.LayerNorm) else None
    options = (getattr(m, "activation", None), getattr(m, "routing_iters", None))
    return (m.composition, m.num_zones, m.zone_size, m.out_zones, *options, norm_eps)


class StackedHeads:
    """The heads (:meth:`MFunction.head`) of S same-shaped M-functions as one batch of products.

    The fast path runs M_h and M_g side by side: one composition, FFN, output map and LN call for
    both instead of one each, which halves the small per-step operations of the MZU. Built once
    per forward pass (the weights are stacked once, not at every step). ``__call__`` maps zones
    (S, B, N·d_z) to (S, B, H); slice s equals ``functions[s].head(zones[s])``.
    """

    def __init__(self, functions: list[MFunction]) -> None:
        first = functions[0]
        structures = [_structure(m) for m in functions]
        if len(set(structures)) > 1:
            raise ValueError(f"StackedHeads needs M-functions of one structure, got {structures}")
        self.first = first

        def stack(get: Callable[[MFunction], Tensor]) -> Tensor:
            return torch.stack([get(m) for m in functions])

        self.compose_weight = stack(MFunction.composition_weight)
        self.ffn_in = stack(lambda m: m.ffn[0].weight.t()), stack(lambda m: m.ffn[0].bias).unsqueeze(1)
        self.ffn_out = stack(lambda m: m.ffn[2].weight.t()), stack(lambda m: m.ffn[2].bias).unsqueeze(1)
        self.out = stack(lambda m: m.out.weight.t()), stack(lambda m: m.out.bias).unsqueeze(1)
        self.norm = None
        if isinstance(first.norm, nn.LayerNorm):
            self.norm = stack(lambda m: m.norm.weight).unsqueeze(1), stack(lambda m: m.norm.bias).unsqueeze(1)

    def __call__(self, zones: Tensor) -> Tensor:
        m = self.first
        stack, batch = zones.shape[:2]
        zones = zones.unflatten(-1, (m.num_zones, m.zone_size))  # (S, B, N, d_z)
        composed = m.compose(zones, self.compose_weight)  # (S, B, J, d_o)
        hidden = torch.relu(torch.baddbmm(self.ffn_in[1], composed.flatten(1, 2), self.ffn_in[0]))  # eq. 5
        zone_out = torch.baddbmm(self.ffn_out[1], hidden, self.ffn_out[0])  # (S, B·J, d_o)
        out = torch.baddbmm(self.out[1], zone_out.view(stack, batch, -1), self.out[0])  # (S, B, H)
        if self.norm is None:
            return out
        return torch.addcmul(self.norm[1], F.layer_norm(out, out.shape[-1:], eps=m.norm.eps), self.norm[0])


class RegularTransform(nn.Module):
    """REGULAR-GATE / REGULAR-TRANS ablation: ``Linear(d_x + H, H)`` on ``[x; h]`` (+ the same LN)."""

    def __init__(self, input_size: int, hidden_size: int, layer_norm: bool = True) -> None:
        super().__init__()
        self.generate = nn.Linear(input_size + hidden_size, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=1e-6) if layer_norm else nn.Identity()

    def head(self, pre: Tensor) -> Tensor:
        return self.norm(pre)

    def forward(self, u: Tensor) -> Tensor:
        return self.head(self.generate(u))


class MZUTransition(nn.Module):
    """One MZU cell (eqs. 1–3), or a t-MZU cell (eqs. 15–17) when fed ``x = 0``.

    ``candidate`` is M_h (or the REGULAR-TRANS linear map), ``gate`` is M_g (or REGULAR-GATE).
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        dropout: float = 0.0,
        regular_gate: bool = False,
        regular_trans: bool = False,
        layer_norm: bool = True,
        **m_kwargs: object,
    ) -> None:
        super().__init__()
        self.input_size = input_size

        def transform(regular: bool) -> nn.Module:
            if regular:
                return RegularTransform(input_size, hidden_size, layer_norm)
            return MFunction(input_size, hidden_size, layer_norm=layer_norm, **m_kwargs)

        self.candidate = transform(regular_trans)
        self.gate = transform(regular_gate)
        self.dropout = nn.Dropout(check_rate("dropout", dropout))

    def fused_weights(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """Zone generation of M_h and M_g side by side: x part (2H, d_x), h part (2H, H), bias (2H) or None.

        Each part is concatenated on its own, so both are contiguous: the h part then has the same
        strides in every layer, and a compiled step (``compile_step``) serves all layers with one graph.
        """
        weights = [m.generate.weight for m in (self.candidate, self.gate)]
        w_x = torch.cat([w[:, : self.input_size] for w in weights])
        w_h = torch.cat([w[:, self.input_size :] for w in weights])
        biases = [m.generate.bias for m in (self.candidate, self.gate)]
        bias = None
        if any(b is not None for b in biases):
            bias = torch.cat([b if b is not None else w_h.new_zeros(w_h.shape[0] // 2) for b in biases])
        return w_x, w_h, bias

    def zones(self, u: Tensor) -> Tensor:
        """Unfused zone generation: M_h and M_g each from ``u = [x; h]`` -> ``[zones of M_h | zones of M_g]``."""
        return torch.cat([self.candidate.generate(u), self.gate.generate(u)], dim=-1)

    def stacked_heads(self) -> StackedHeads | None:
        """M_h's and M_g's heads as one :class:`StackedHeads`, or None when either is ablated."""
        if isinstance(self.candidate, MFunction) and isinstance(self.gate, MFunction):
            return StackedHeads([self.candidate, self.gate])
        return None

    def activations(self, pre: Tensor, heads: StackedHeads | None = None) -> tuple[Tensor, Tensor]:
        """Candidate ``h̃`` (after dropout) and gate ``g``, both (B, H), from ``pre`` as in :meth:`step`.

        ``heads`` (from :meth:`stacked_heads`) runs both heads at once; without it, one by one.
        """
        if heads is None:
            zones_h, zones_g = pre.chunk(2, dim=-1)
            pre_h, pre_g = self.candidate.head(zones_h), self.gate.head(zones_g)
        else:
            pre_h, pre_g = heads(pre.unflatten(-1, (2, -1)).transpose(0, 1)).unbind(0)
        return self.dropout(torch.tanh(pre_h)), torch.sigmoid(pre_g)  # eqs. 2-3 / 16-17

    def step(
        self, pre: Tensor, h: Tensor, track_disagreement: bool, heads: StackedHeads | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """New state from ``pre = [zones of M_h | zones of M_g]`` (B, 2H) and ``h`` (B, H).

        Returns ``h_t`` (B, H) and D_zone summed over this cell's M-functions (B,) when tracked.
        """
        candidate, gate = self.activations(pre, heads)
        h_new = torch.lerp(h, candidate, gate)  # (1 - g) ⊙ h + g ⊙ h̃, eq. 1 / 15
        if not track_disagreement:
            return h_new, None
        zones_h, zones_g = pre.chunk(2, dim=-1)
        terms = [
            zone_disagreement(zones.unflatten(-1, (m.num_zones, m.zone_size)))
            for zones, m in ((zones_h, self.candidate), (zones_g, self.gate))
            if isinstance(m, MFunction)
        ]
        return h_new, (sum(terms[1:], terms[0]) if terms else None)

    def reference(self, u: Tensor, h: Tensor, track_disagreement: bool = True) -> tuple[Tensor, Tensor | None]:
        """Unfused transcription: M_h and M_g each generate their zones from ``u = [x; h]``."""
        return self.step(self.zones(u), h, track_disagreement)


class MZUCell(nn.Module):
    """One time step of MZU (+DT): an MZU cell then ``transition_depth`` t-MZU cells.

    ``x`` (B, d_x), ``h`` (B, H) -> ``h_t`` (B, H); the last t-MZU's output is the carried state.
    """

    # Under autocast the step's dozens of small ops lose more to casts than bfloat16 saves
    # (capMZU+DT on brown_char, CPU: 1.17-1.3x slower per training step than float32), so the
    # time loop runs in float32 (seqzoo.encoders.recurrent; docs/results.md).
    float32_recurrence = True

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        transition_depth: int = 0,
        share_transition: bool = False,
        **transition_kwargs: object,
    ) -> None:
        super().__init__()
        if transition_depth < 0:
            raise ValueError(f"transition_depth must be >= 0, got {transition_depth}")
        self.hidden_size = hidden_size
        self.transition_depth = transition_depth
        self.share_transition = share_transition
        self.track_disagreement = False
        own_depths = 0 if share_transition else transition_depth
        self.transitions = nn.ModuleList(
            [MZUTransition(input_size, hidden_size, **transition_kwargs)]
            + [MZUTransition(0, hidden_size, **transition_kwargs) for _ in range(own_depths)]
        )

    def extra_repr(self) -> str:
        return f"transition_depth={self.transition_depth}, share_transition={self.share_transition}"

    def _index(self, depth: int) -> int:
        return 0 if self.share_transition else depth

    def reference(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor | None]:
        """One step exactly as eqs. 1–3 and 15–17 read (t-MZUs get a zero input); D_zone (B,) or None."""
        total = None
        for depth in range(self.transition_depth + 1):
            cell = self.transitions[self._index(depth)]
            inp = x if depth == 0 else x.new_zeros(x.shape[0], cell.input_size)
            h, aux = cell.reference(torch.cat([inp, h], dim=-1), h, self.track_disagreement)
            total = aux if total is None else total + aux
        return h, total

    def trace(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """Run ``x`` (T, B, d_x) from ``h`` (B, H) and keep the internals, for analysis (Figure 3).

        Returns the candidate ``h̃`` of every depth (T, L + 1, B, H) (depth 0: the MZU cell that
        reads ``x_t``; then the t-MZUs) and the state after each step (T, B, H). Unfused and
        without disagreement; equal to the encoder's outputs.
        """
        candidates, states = [], []
        for x_t in x:
            per_depth = []
            for depth in range(self.transition_depth + 1):
                cell = self.transitions[self._index(depth)]
                inp = x_t if depth == 0 else x_t.new_zeros(x_t.shape[0], cell.input_size)
                candidate, gate = cell.activations(cell.zones(torch.cat([inp, h], dim=-1)))
                h = torch.lerp(h, candidate, gate)
                per_depth.append(candidate)
            candidates.append(torch.stack(per_depth))
            states.append(h)
        return torch.stack(candidates), torch.stack(states)

    def prepare(self, x: Tensor) -> tuple[Tensor, StepFn]:
        """Hoist the input half of depth 0's zone generation for all steps: x (T, B, d_x) -> (T, B, 2H)."""
        weights = [cell.fused_weights() for cell in self.transitions]
        w_x, _, bias = weights[0]
        h_parts = [w_h.t() for _, w_h, _ in weights]
        heads = [cell.stacked_heads() for cell in self.transitions]

        def step(x_part: Tensor, h: Tensor) -> tuple[Tensor, Tensor | None]:
            total = None
            for depth in range(self.transition_depth + 1):
                k = self._index(depth)
                pre_bias = x_part if depth == 0 else weights[k][2]
                pre = h @ h_parts[k] if pre_bias is None else torch.addmm(pre_bias, h, h_parts[k])
                h, aux = self.transitions[k].step(pre, h, self.track_disagreement, heads[k])
                total = aux if total is None else total + aux
            return h, total

        return F.linear(x, w_x, bias), step


@register_encoder("mzu")
class MZU(RecurrentCellEncoder):
    """Multi-Zone Unit encoder (optionally deep-transition, stacked, bidirectional).

    Args follow ``torch.nn.GRU`` where they overlap; ``dropout`` is the candidate dropout.
    ``composition`` sat / gcn / cap, ``num_zones`` N, ``filter_size`` d_f (default H),
    ``capsules`` J and ``routing_iters`` T (cap only), ``transition_depth`` L (0 = plain MZU,
    L >= 1 = MZU+DT), ``share_transition`` (one M_h / M_g for all depths), ``layer_norm``,
    ``disagreement`` λ of eq. 19 (default 1.0 as in MODELS.md 4.4; 0 = off; negative allowed), ``regular_gate`` /
    ``regular_trans`` (ablations), ``gcn_activation`` (σ of eq. 9), ``compile_step`` (the time
    loop's step through ``torch.compile``, :mod:`seqzoo.encoders.recurrent`).

    State: ``h`` (num_layers * directions, B, H). :meth:`auxiliary_loss` returns ``−λ·D``
    (module docstring) from the last forward pass, None when λ = 0 or every M is ablated.
    """

    repr_fields = ("num_layers", "disagreement")

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        dropout: float = 0.0,
        bidirectional: bool = False,
        composition: str = "sat",
        num_zones: int = 4,
        filter_size: int | None = None,
        capsules: int = 2,
        routing_iters: int = 3,
        transition_depth: int = 0,
        share_transition: bool = False,
        layer_norm: bool = True,
        disagreement: float = 1.0,
        regular_gate: bool = False,
        regular_trans: bool = False,
        gcn_activation: str = "relu",
        compile_step: bool = False,
    ) -> None:
        def make_cell(size: int) -> MZUCell:
            return MZUCell(
                size,
                hidden_size,
                transition_depth=transition_depth,
                share_transition=share_transition,
                dropout=dropout,
                regular_gate=regular_gate,
                regular_trans=regular_trans,
                layer_norm=layer_norm,
                composition=composition,
                num_zones=num_zones,
                filter_size=filter_size,
                capsules=capsules,
                routing_iters=routing_iters,
                gcn_activation=gcn_activation,
            )

        if not math.isfinite(disagreement):
            raise ValueError(f"disagreement (λ) must be a finite number, got {disagreement}")
        super().__init__(input_size, hidden_size, make_cell, num_layers, bidirectional, compile_step)
        self.disagreement = float(disagreement)

    def forward(self, x: Tensor, mask: Tensor | None = None, state: State = None) -> tuple[Tensor, State]:
        for cell in self.cells:
            cell.track_disagreement = self.disagreement != 0
        return super().forward(x, mask, state)

    def auxiliary_loss(self) -> Tensor | None:
        """``−λ·D`` with D the per-token average of D_zone summed over M-functions (eq. 19)."""
        if self.aux_per_token is None:
            return None
        return -self.disagreement * self.aux_per_token
