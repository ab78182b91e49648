"""The encoder contract every seqzoo encoder follows, and the registry that builds them.

Contract (README "The encoder contract", MODELS.md "Decisions" 6)::

    outputs, final_state = encoder(x, mask=None, state=None)
    x        (B, T, input_size) float
    mask     (B, T) bool, True = real token, right-padded (each row is a prefix of Trues);
             None (``encoder(x)``, as with ``nn.LSTM``) means every position is real
    state    encoder-specific carried state (a tensor, a tuple of tensors or None); None = zeros
    outputs  (B, T, output_size); positions where mask is False are exactly zero
    final_state  the state after the last *real* token of each row, in the same format as
             ``state``: feeding it back with the next chunk continues the sequence
             (truncated BPTT; call :func:`detach_state` between chunks)

Pad positions never touch the state, so a padded row gives the same outputs as the row
alone, and no row's outputs depend on the other rows in the batch.

Encoders that compute a regulariser during ``forward`` (e.g. the MZU's disagreement term)
return it from :meth:`Encoder.auxiliary_loss`; trainers add it to the task loss.
"""

from __future__ import annotations

import collections.abc
import contextlib
import inspect
import numbers
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from seqzoo._warn import warn_user

State = Any  # Tensor | tuple[State, ...] | list[State] | None

__all__ = [
    "Encoder",
    "State",
    "available_encoders",
    "build_encoder",
    "check_arguments",
    "check_layer_dropout",
    "check_mask",
    "check_padding_mask",
    "check_rate",
    "check_state_dtype",
    "describe_state",
    "detach_state",
    "lengths_from_mask",
    "module_mode",
    "register_encoder",
    "reverse_padded",
    "takes_all_real_shortcut",
    "zero_padding",
]


class Encoder(nn.Module):
    """Base class of all seqzoo encoders (see the module docstring for the contract)."""

    #: True when output t depends only on x[:t+1]; such encoders support stateful chunked use.
    causal: bool = True
    #: True when ``final_state`` can be fed back to continue the sequence chunk by chunk.
    stateful: bool = True
    #: Attributes that ``repr`` shows after the sizes (each encoder names its own hyperparameters).
    repr_fields: tuple[str, ...] = ()
    #: Size G of :meth:`global_state`'s vector; None where the encoder keeps no global state.
    global_size: int | None = None

    def __init__(self, input_size: int, hidden_size: int, *, bidirectional: bool = False) -> None:
        super().__init__()
        if input_size <= 0 or hidden_size <= 0:
            raise ValueError(f"input_size and hidden_size must be positive, got {input_size}, {hidden_size}")
        self.input_size = int(input_size)
        self.hidden_size = int(hidden_size)
        self._bidirectional = bool(bidirectional)
        if bidirectional:  # the backward direction reads the chunk's future: no chunk-by-chunk continuation
            self.causal = False
            self.stateful = False

    @property
    def bidirectional(self) -> bool:
        return self._bidirectional

    @property
    def output_size(self) -> int:
        return self.hidden_size * (2 if self._bidirectional else 1)

    def forward(self, x: Tensor, mask: Tensor | None = None, state: State = None) -> tuple[Tensor, State]:
        raise NotImplementedError

    def extra_repr(self) -> str:
        fields = [f"{name}={getattr(self, name)!r}" for name in (*self.repr_fields, "bidirectional")]
        return ", ".join([f"{self.input_size}, {self.hidden_size}", *fields])

    def check_input(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """Validate ``x`` (B, T, input_size) and ``mask`` (see :func:`check_mask`); returns the mask."""
        mask = check_mask(x, mask)
        name = type(self).__name__
        if x.shape[-1] != self.input_size:
            raise ValueError(f"{name} expects {self.input_size} input features, got input of shape {tuple(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"{name} input must be floating point (embed token ids first), got {x.dtype}")
        weight = next(self.parameters(), None)
        if weight is not None and x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
            raise TypeError(
                f"{name} input is {x.dtype} but its weights are {weight.dtype}: "
                f"convert the input (x.to({weight.dtype})) or the encoder (encoder.to({x.dtype}))"
            )
        return mask

    def auxiliary_loss(self) -> Tensor | None:
        """Regulariser from the last forward pass, to be *added* to the loss (None if none)."""
        return None

    def global_state(self, state: State) -> Tensor | None:
        """A (B, G) vector summarising the sequence that the encoder keeps besides its outputs, e.g. the
        S-LSTM's global node g, read from the ``final_state`` that ``forward`` returned; None where it
        keeps none (G is :attr:`global_size`). Poolers such as ``"meanmaxglobal"`` take it as ``final``."""
        return None


def check_mask(x: Tensor, mask: Tensor | None) -> Tensor:
    """Validate ``mask`` against ``x`` (B, T, D) and return it; None becomes all-True."""
    if x.dim() != 3:
        raise ValueError(f"input must be (batch, time, features), got shape {tuple(x.shape)}")
    batch, time = x.shape[:2]
    if batch == 0 or time == 0:
        raise ValueError(f"input is empty: shape {tuple(x.shape)}")
    if mask is None:
        return torch.ones(batch, time, dtype=torch.bool, device=x.device)
    if isinstance(mask, Tensor) and mask.device != x.device:
        raise ValueError(f"mask is on {mask.device} but the input on {x.device}: move it (mask.to(x.device))")
    return check_padding_mask(mask, (batch, time))


def takes_all_real_shortcut(mask: Tensor) -> bool:
    """Whether an encoder may skip its padding logic: every position is real, and neither
    ``torch.jit.trace`` nor ``torch.compile`` is recording (a trace or a graph must hold the general
    path, right for every mask; reading the mask's values would break a compiled graph in two)."""
    return not (torch.jit.is_tracing() or torch.compiler.is_compiling()) and bool(mask.all())


def zero_padding(x: Tensor, mask: Tensor, all_real: bool | None = None) -> Tensor:
    """``x`` (B, T, D) with 0 at its pad positions (``mask`` False). A pad may hold anything, NaN or
    inf included, which a product with the mask would keep (0 × NaN is NaN): in the outputs of a
    window or an attention that reads pads, and in the weights' gradients (Xᵀ·dG sums over every
    position). ``x`` itself when every position is real: ``all_real``, the caller's
    :func:`takes_all_real_shortcut` when it has read it, or else read here on the CPU; on a GPU
    always the fill, which costs less than the device sync that reading the mask would."""
    if all_real is None:
        all_real = x.device.type == "cpu" and takes_all_real_shortcut(mask)
    return x if all_real else x.masked_fill(~mask.unsqueeze(-1), 0.0)


def check_padding_mask(mask: Tensor, shape: tuple[int, int]) -> Tensor:
    """``mask`` if it is a right-padded bool (B, T) tensor of ``shape`` (True = real token), else an error."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a bool tensor (True = real token), got {got}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match input (batch, time) = {tuple(shape)}")
    if shape[1] > 1:
        message = "mask must be right-padded: each row a run of True followed by False"
        starts_again = (mask[:, 1:] & ~mask[:, :-1]).any()
        if torch.compiler.is_compiling():  # checked inside the graph (a RuntimeError), not by a graph break
            torch._assert_async(~starts_again, message)
        elif bool(starts_again):
            raise ValueError(message)
    return mask


def check_rate(name: str, value: float) -> float:
    """``value`` if it is a rate in [0, 1) (dropout, zoneout: 1 would drop everything), else a ValueError."""
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")
    return value


def check_layer_dropout(dropout: float, num_layers: int) -> float:
    """``dropout`` between the layers of a stack, checked; with one layer it has no effect, which
    warns as ``torch.nn.LSTM`` does."""
    if check_rate("dropout", dropout) > 0 and num_layers == 1:
        warn_user(f"dropout={dropout} has no effect with num_layers=1: it applies between layers")
    return dropout


def lengths_from_mask(mask: Tensor) -> Tensor:
    """Number of real tokens per row, (B,) int64."""
    return mask.sum(dim=1)


def reverse_padded(x: Tensor, lengths: Tensor, *, time_dim: int) -> Tensor:
    """Each sequence's first ``lengths[b]`` steps in reverse order, pads left in place.

    ``time_dim`` 1: batch-first x (B, T, ...); 0: time-major x (T, B, ...). The map is its own
    inverse, so it also brings a reverse direction's outputs back in order.
    """
    if time_dim not in (0, 1):
        raise ValueError(f"time_dim must be 0 (time-major) or 1 (batch-first), got {time_dim}")
    time = torch.arange(x.shape[time_dim], device=x.device)
    if time_dim == 1:
        time, ends = time.unsqueeze(0), lengths.unsqueeze(1)  # broadcast to (B, T)
    else:
        time, ends = time.unsqueeze(1), lengths.unsqueeze(0)  # broadcast to (T, B)
    index = torch.where(time < ends, ends - 1 - time, time)
    return x.gather(time_dim, index.view(*index.shape, *([1] * (x.dim() - 2))).expand_as(x))


def describe_state(state: object) -> str:
    """A state's shapes as given, for error messages: ``(1, 3, 6)``, ``((1, 3, 6), (1, 3, 6))``, or
    ``[(1, 3, 6), (1, 3, 6)]`` for a list."""
    if isinstance(state, Tensor):
        return str(tuple(state.shape))
    if isinstance(state, tuple):
        return "(" + ", ".join(describe_state(s) for s in state) + ")"
    if isinstance(state, list):
        return "[" + ", ".join(describe_state(s) for s in state) + "]"
    return type(state).__name__


def check_state_dtype(tensors: Iterable[Tensor | None], weight: Tensor, device_type: str) -> None:
    """A carried state's tensors must be in the encoder's weight dtype, else a TypeError naming
    both; under autocast, where an encoder may return its state in the lower precision, any."""
    if torch.is_autocast_enabled(device_type):
        return
    for tensor in tensors:
        if tensor is not None and tensor.dtype != weight.dtype:
            raise TypeError(f"state is {tensor.dtype} but the encoder's weights are {weight.dtype}")


@contextlib.contextmanager
def module_mode(module: nn.Module, *, training: bool) -> Iterator[nn.Module]:
    """``module`` in training (or eval) mode inside the block, and back in the mode it had after it,
    also when the block raises: ``with module_mode(model, training=False): ...`` to evaluate. Like
    ``Module.train``, it sets the mode of every submodule to the module's own (a submodule kept in
    another mode is not restored to it)."""
    was_training = module.training
    module.train(training)
    try:
        yield module
    finally:
        module.train(was_training)


def detach_state(state: State) -> State:
    """Detach every tensor in a (nested) state, for truncated back-propagation through time."""
    if state is None:
        return None
    if isinstance(state, Tensor):
        return state.detach()
    if isinstance(state, (tuple, list)):
        return type(state)(detach_state(s) for s in state)
    if isinstance(state, dict):
        return {k: detach_state(v) for k, v in state.items()}
    raise TypeError(f"cannot detach state of type {type(state).__name__}")


_REGISTRY: dict[str, type[Encoder]] = {}


def register_encoder(name: str) -> Callable[[type[Encoder]], type[Encoder]]:
    """Class decorator: make an encoder buildable by ``name`` from configs."""

    def decorate(cls: type[Encoder]) -> type[Encoder]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"encoder name {name!r} is already registered to {_REGISTRY[name].__name__}")
        _REGISTRY[name] = cls
        return cls

    return decorate


def available_encoders() -> list[str]:
    return sorted(_REGISTRY)


def check_arguments(target: Callable[..., Any], what: str, *args: Any, **kwargs: Any) -> None:
    """A ``ValueError`` naming ``what`` unless ``target`` takes these arguments (none unknown or missing)."""
    signature = inspect.signature(target)
    params = signature.parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = [key for key in kwargs if key not in params]
        if unknown:
            takes = ", ".join(p for p in params if p not in ("self", "input_size"))
            raise ValueError(f"{what} takes no argument {', '.join(unknown)} (it takes {takes})")
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as err:
        raise ValueError(f"{what}: {err}") from None
    try:
        hints = typing.get_type_hints(target.__init__ if inspect.isclass(target) else target)
    except Exception:  # an annotation that does not resolve: leave the types to the target
        hints = {}
    for key, value in bound.arguments.items():
        if key in hints and not _has_type(value, hints[key]):
            raise ValueError(f"{what}: {key} must be {_type_name(hints[key])}, got {value!r}")


def _has_type(value: Any, hint: Any) -> bool:
    """Whether ``value`` fits the annotation ``hint`` (scalars, None, unions, sequences, Literal);
    other annotations (tensors, modules, callables) are not checked."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:  # bool is an int to Python, not to a config
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_has_type(value, arg) for arg in args)
    if origin is typing.Literal:
        return value in args
    if origin in (list, tuple, collections.abc.Sequence):
        element = args[0] if args else Any
        return isinstance(value, (list, tuple)) and all(_has_type(v, element) for v in value)
    return True


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in typing.get_args(hint))
    if typing.get_origin(hint) in (list, tuple, collections.abc.Sequence):
        return f"a list of {_type_name(typing.get_args(hint)[0])}"
    return "None" if hint is type(None) else getattr(hint, "__name__", str(hint))


def build_encoder(name: str, /, input_size: int, **kwargs: Any) -> Encoder:
    """Build a registered encoder, e.g. ``build_encoder("lstm", 50, hidden_size=128, bidirectional=True)``.

    An unknown name or argument is a ``ValueError`` that names it, raised before anything is built.
    """
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown encoder {name!r}; available: {', '.join(available_encoders())} (an encoder of your own "
            "is registered when its module is imported; on the command line: seqzoo --import MODULE ...)"
        )
    check_arguments(_REGISTRY[name], f"encoder {name!r}", input_size=input_size, **kwargs)
    return _REGISTRY[name](input_size=input_size, **kwargs)
