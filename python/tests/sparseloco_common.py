"""The toy model, data and inner loop shared by the SparseLoCo worker and the test's reference.

Only the setup is shared; the outer rule under test is implemented twice: by lbcc.torch.SparseLoCo
(through LBCC) and by the test's pure-PyTorch reference.
"""

import torch
from torch import nn

RANKS = 4
INNER_STEPS = 4
OUTER_STEPS = 3
INNER_LR = 1e-2
# Covers the chunking rule: [128, 32] -> 64 x 32 chunks; [67, 128] (67 is a prime above 64) ->
# 1 x 64 chunks; biases of 128 (rows of 64), 67 (rows of 67).
SIZES = (32, 128, 67)


def build_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(SIZES[0], SIZES[1]), nn.Tanh(), nn.Linear(SIZES[1], SIZES[2]))


def batch(seed, rank, outer, inner):
    g = torch.Generator().manual_seed(seed * 100003 + rank * 1009 + outer * 101 + inner)
    x = torch.randn(64, SIZES[0], generator=g)
    w = torch.linspace(-1, 1, SIZES[0] * SIZES[2]).view(SIZES[0], SIZES[2])
    y = torch.sin(x @ w) + 0.1 * torch.randn(64, SIZES[2], generator=g)
    return x, y


def inner_step(model, optimizer, seed, rank, outer, inner):
    x, y = batch(seed, rank, outer, inner)
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss
