"""Poolers with the encoder's global state: padding invariance of each, the DA-GRN eq. 15 pooler, its errors."""

import pytest
import torch

from seqzoo.encoders.base import Encoder, build_encoder, zero_padding
from seqzoo.heads.poolers import POOLERS, build_pooler

pytestmark = pytest.mark.usefixtures("single_thread")


class _GlobalNodeEncoder(Encoder):
    """A stand-in for an encoder with a global node: outputs tanh(x W), state (outputs' last row, g),
    g = the mean of the real inputs times a second matrix."""

    global_size = 3

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__(input_size, hidden_size)
        self.out = torch.nn.Linear(input_size, hidden_size)
        self.node = torch.nn.Linear(input_size, self.global_size)

    def forward(self, x, mask=None, state=None):
        mask = self.check_input(x, mask)
        outputs = zero_padding(torch.tanh(self.out(x)), mask)  # (B, T, H)
        weights = mask.unsqueeze(-1).to(x.dtype)
        g = self.node((x * weights).sum(1) / weights.sum(1))  # (B, G)
        return outputs, (outputs[:, -1], g)

    def global_state(self, state):
        return state[1]


def _outputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    out = torch.randn(2, 5, 6)
    mask = torch.tensor([[True] * 3 + [False] * 2, [True] * 5])
    return out, mask, torch.randn(2, 4)


def _build(name: str):
    return build_pooler(name, 6, bidirectional=True, global_size=4)


@pytest.mark.parametrize("name", POOLERS)
def test_every_pooler_ignores_padding(name):
    pool = _build(name)
    out, mask, final = _outputs()
    noisy = out.clone()
    noisy[0, 3:] = float("nan")
    pooled = pool(out, mask, final)
    assert pooled.shape == (2, pool.output_size)
    torch.testing.assert_close(pool(noisy, mask, final), pooled, rtol=0, atol=0)
    alone = pool(out[:1, :3], mask[:1, :3], final[:1])  # the first row alone, without its pads
    rounding = 8 * torch.finfo(out.dtype).eps * out.abs().max()  # a sum's order may differ with the length
    torch.testing.assert_close(alone, pooled[:1], rtol=0, atol=float(rounding))


@pytest.mark.parametrize("name", [n for n in POOLERS if n != "meanmaxglobal"])
def test_poolers_without_a_global_part_ignore_final(name):
    pool = _build(name)
    out, mask, final = _outputs()
    torch.testing.assert_close(pool(out, mask, final), pool(out, mask), rtol=0, atol=0)


def test_meanmaxglobal_is_relu_of_mean_max_and_the_encoders_global_state():
    torch.manual_seed(0)
    encoder = _GlobalNodeEncoder(4, 6).double()
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    mask = torch.tensor([[True] * 3 + [False] * 2, [True] * 5])
    outputs, state = encoder(x, mask)
    pool = build_pooler("meanmaxglobal", encoder.output_size, global_size=encoder.global_size)
    assert pool.output_size == 6 + 6 + 3
    pooled = pool(outputs, mask, encoder.global_state(state))
    for row, length in enumerate((3, 5)):
        real = outputs[row, :length]  # (length, H)
        g = encoder.node(x[row, :length].mean(0))
        expected = torch.relu(torch.cat([real.mean(0), real.amax(0), g]))
        torch.testing.assert_close(pooled[row], expected, rtol=0, atol=1e-12)
    assert pooled.ge(0).all() and pooled.eq(0).any()  # the ReLU cuts the negative features


def test_meanmaxglobal_needs_an_encoder_with_a_global_state():
    encoder = build_encoder("lstm", 4, hidden_size=3)
    assert encoder.global_size is None and encoder.global_state(encoder(torch.randn(1, 2, 4))[1]) is None
    with pytest.raises(ValueError, match=r"meanmaxglobal.*global state.*keeps none \(its global_size is None\)"):
        build_pooler("meanmaxglobal", encoder.output_size, global_size=encoder.global_size)
    pool = build_pooler("meanmaxglobal", 6, global_size=4)
    out, mask, final = _outputs()
    with pytest.raises(ValueError, match=r"needs the encoder's global state as final, shape \(2, 4\).*got None"):
        pool(out, mask)
    with pytest.raises(ValueError, match=r"shape \(2, 4\).*got \(2, 3\)"):
        pool(out, mask, final[:, :3])
    with pytest.raises(ValueError, match=r"unknown pooler 'sum'; choose one of .*meanmaxglobal"):
        build_pooler("sum", 6)
