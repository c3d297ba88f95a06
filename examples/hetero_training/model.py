"""A small GPT-style byte-level LM split into two pipeline stages, and its corpora.

Stage 0: token embedding h0 = T[y] + E[y] and the first half of the blocks; stage 1: the other
blocks, final LayerNorm and head. A full replica holds both stages in one process. Positions are
rotary (applied to queries and keys inside attention), so nothing positional is written into the
residual stream: a boundary table indexed by token id is all a subspace boundary subtracts.

T is a fixed buffer: zero for an uncompressed or lossy boundary (the lossy boundary's table is
the synced embedding itself, kept by the boundary, not by the model), the basis' table in the
constrained design, where E and every residual write of stage 0 (attention output and MLP down
projections) are re-projected onto span(U) by `project_stage0`, so h - T[y] lies in span(U) at
the boundary and the subspace codec is exact up to float rounding
(../../shared/reference/subspace.md, "Two designs").

Corpora: `fortunes` (real English: every text file of Debian's `fortunes` package, installed by
tools/setup; every tenth fortune held out) and `grammar` (a deterministic toy grammar, for smoke
tests only).
"""

import glob
import math
import os
import random

import torch
import torch.nn.functional as F
from torch import nn

import lbcc
from lbcc.torch import project_

WORDS = ("the a one every some cat dog bird fish fox owl horse mouse child farmer king queen "
         "sees likes chases finds follows eats hides near under over behind with red small "
         "big quick lazy old green happy and but then quietly slowly today river hill tree "
         "house field road stone garden").split()


def corpus(chars=200_000, seed=1234):
    """Deterministic toy English: sentences from a tiny grammar (same text on every machine)."""
    rng = random.Random(seed)
    det, noun = WORDS[:5], WORDS[5:17]
    verb, prep, adj = WORDS[17:24], WORDS[24:29], WORDS[29:36]
    place = WORDS[42:]
    out, size = [], 0
    while size < chars:
        s = [rng.choice(det)]
        if rng.random() < 0.5:
            s.append(rng.choice(adj))
        s += [rng.choice(noun), rng.choice(verb), rng.choice(det), rng.choice(noun)]
        if rng.random() < 0.6:
            s += [rng.choice(prep), "the", rng.choice(place)]
        if rng.random() < 0.3:
            s += [rng.choice(["quietly", "slowly", "today"])]
        line = " ".join(s).capitalize() + ". "
        out.append(line)
        size += len(line)
    return "".join(out)[:chars]


FORTUNES = "/usr/share/games/fortunes"
# Files of pictures rather than prose.
FORTUNES_SKIP = ("art", "ascii-art")


def fortunes(path=FORTUNES):
    """The fortunes of Debian's `fortunes` package as byte strings, in file-name order (the same
    list on every machine with the same package version)."""
    files = sorted(f for f in glob.glob(os.path.join(path, "*"))
                   if not f.endswith((".dat", ".u8")) and os.path.isfile(f) and
                   not os.path.islink(f) and os.path.basename(f) not in FORTUNES_SKIP)
    if not files:
        raise SystemExit(f"model.py: no fortunes under {path}: install Debian's `fortunes` "
                         f"package (tools/setup does)")
    out = []
    for fn in files:
        with open(fn, "rb") as f:
            out += [x.strip(b"\n") + b"\n" for x in f.read().split(b"\n%\n") if x.strip()]
    return out


class Data:
    """Random windows of a corpus (byte-level: the vocabulary is the bytes that occur); stream
    `stream` (a replica) gets its own generator.

    fortunes: every tenth fortune is held out; grammar: the last 10 % of the text."""

    def __init__(self, seq, batch, corpus_name="fortunes"):
        if corpus_name == "fortunes":
            docs = fortunes()
            train = b"".join(d for i, d in enumerate(docs) if i % 10 != 9)
            held = b"".join(d for i, d in enumerate(docs) if i % 10 == 9)
        elif corpus_name == "grammar":
            text = corpus().encode()
            split = int(len(text) * 0.9)
            train, held = text[:split], text[split:]
        else:
            raise ValueError(f"unknown corpus {corpus_name!r} (fortunes, grammar)")
        self.vocab = sorted(set(train) | set(held))
        lut = torch.zeros(256, dtype=torch.long)
        lut[torch.tensor(self.vocab)] = torch.arange(len(self.vocab))
        self.train = lut[torch.frombuffer(bytearray(train), dtype=torch.uint8).long()]
        self.held = lut[torch.frombuffer(bytearray(held), dtype=torch.uint8).long()]
        self.seq, self.batch = seq, batch

    def stream(self, replica, seed=0):
        g = torch.Generator().manual_seed(1000 + 7919 * seed + replica)
        while True:
            yield self._window(self.train, g)

    def held_out(self, batches=32):
        g = torch.Generator().manual_seed(99)
        return [self._window(self.held, g) for _ in range(batches)]

    def _window(self, ids, g):
        starts = torch.randint(0, len(ids) - self.seq - 1, (self.batch,), generator=g)
        x = torch.stack([ids[s:s + self.seq] for s in starts.tolist()])
        y = torch.stack([ids[s + 1:s + self.seq + 1] for s in starts.tolist()])
        return x, y


def rotary(x, base=10000.0):
    """Rotary position embedding of x [b, heads, t, hd] (hd even): pairs of channels rotated by
    position-dependent angles, so attention sees relative positions and nothing positional is
    added to the residual stream."""
    t, hd = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    ang = torch.arange(t, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)        # residual write
        self.fc = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)    # residual write

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        q, k = rotary(q), rotary(k)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.down(F.gelu(self.fc(self.ln2(x))))


class Stage0(nn.Module):
    def __init__(self, vocab, d, heads, layers, seq, table, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        self.register_buffer("table", table)
        self.tok = nn.Parameter(torch.randn(vocab, d, generator=g) * 0.02)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])

    def forward(self, ids):
        h = F.embedding(ids, self.table) + F.embedding(ids, self.tok)
        for blk in self.blocks:
            h = blk(h)
        return h


class Stage1(nn.Module):
    def __init__(self, vocab, d, heads, layers, seed):
        super().__init__()
        torch.manual_seed(seed + 1)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, h, targets):
        for blk in self.blocks:
            h = blk(h)
        logits = self.head(self.ln(h))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def residual_writes(stage0):
    """Stage 0's tensors that write into the residual stream besides the token embedding, as
    (tensor, model-dim side): every attention output and MLP down projection (weight and bias;
    positions are rotary and write nothing)."""
    writes = []
    for blk in stage0.blocks:
        for lin in (blk.proj, blk.down):
            writes += [(lin.weight, "rows"), (lin.bias, "rows")]
    return writes


@torch.no_grad()
def project_stage0(stage0, basis, embedding=True):
    """Every residual write of stage 0 onto span(U) (portable arithmetic: identical bits on
    replicas holding identical weights); the token embedding too unless embedding=False (the
    embedding shift handles it instead)."""
    if embedding:
        project_(stage0.tok, basis, "columns")
    for tensor, side in residual_writes(stage0):
        project_(tensor, basis, side)


def make_basis(d, k, vocab, seed=7, table=True):
    """k == d: the identity-like full basis without table (an uncompressed fp32 boundary).
    table: a seeded fixed table T (the constrained design's); without it T is zero until the
    boundary refreshes it (the lossy design: T is the synced embedding)."""
    if k >= d:
        return lbcc.SubspaceBasis.from_seed(model_dim=d, rank=d, vocab_size=vocab, seed=seed)
    return lbcc.SubspaceBasis.from_seed(model_dim=d, rank=k, vocab_size=vocab, with_table=table,
                                        table_stddev=0.05, seed=seed)
