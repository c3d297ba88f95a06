"""LBCC's SparseLoCo-compatible mode against an independent re-statement of templar's rules
(tplr-ai/templar: compress.py's chunking, _clamp_topk and _quantize_values, neurons.py's outer
step), written here from their description in shared/reference/sparseloco.md with torch's own
primitives (topk, scatter_reduce "mean", norm, median), fp32 as templar runs them.

What is compared, per shape (1-D, 2-D full, 2-D ragged 100x30 / 67x128 / 96x4096, 3-D), over
several error-feedback steps and 4 replicas:
  - selections: equal as sets per chunk (random data: no ties; LBCC breaks ties to the lower
    position, torch.topk leaves them unspecified);
  - 2-bit codes: equal, except for a value within the summation bound of a bin edge;
  - reconstructions, EF buffers and the clipped mean-over-selectors: within the fp32 summation
    bound stated below.

The bound. torch reduces in fp32 in its own order, LBCC sums in double (value_coding.h), so a
sum of n terms may differ by at most gamma_n * sum|terms| with gamma_n = n * u / (1 - n * u),
u = 2^-24 (the recursive-summation bound, valid for any order). Every quantity compared here is
at most two such sums deep (shift, then a bin's mean of centred values; a norm, then a mean over
<= 4 replicas), so we allow |lbcc - ref| <= 4 * gamma_n * max|v| + 4 * u * |ref|, with n the
number of values the tensor selects and v those values.
"""

import math
import struct

import numpy as np
import pytest
import torch

import lbcc
from conftest import run_ranks

# torch 1.13 calls scatter_reduce a beta API; the rule it implements is templar's.
pytestmark = pytest.mark.filterwarnings("ignore:scatter_reduce")

U = 2.0 ** -24
TOP_K = 64
BETA = 0.95
LR = 1.0


# --- The re-statement ---------------------------------------------------------------------


def edge(n, target=64):
    """The largest divisor of n that is <= target (n itself when n <= target)."""
    if n <= target:
        return n
    return max(d for d in range(1, target + 1) if n % d == 0)


def chunk_positions(shape, chunk_1d="templar"):
    """[chunks, chunk_len] int64: the flat tensor position of each chunk entry, chunk after chunk
    (row-major over the chunk grid), row-major within a chunk. templar's rearranges:
    1-D "(x w) -> x w", 2-D "(y h) (x w) -> y x (h w)". A rank > 2 tensor folds its leading
    dimensions into rows (LBCC's documented extension; templar has no 3-D rule)."""
    n = int(np.prod(shape))
    pos = torch.arange(n, dtype=torch.int64)
    if len(shape) == 1:
        w = edge(n, 4096 if chunk_1d == "flat4096" else 64)
        return pos.reshape(n // w, w)
    rows, cols = n // shape[-1], shape[-1]
    h, w = edge(rows), edge(cols)
    return pos.reshape(rows // h, h, cols // w, w).permute(0, 2, 1, 3).reshape(-1, h * w)


def clamp_topk(chunk_len, topk):
    """templar's _clamp_topk, then LBCC's cap for a 1-element chunk (templar cannot select)."""
    k = min(topk, chunk_len)
    k = max(k, 2)
    k = k - k % 2
    return min(k, chunk_len)


def quantize(val, bins=4, range_sigmas=6):
    """templar's _quantize_values over all selected values of a tensor (fp32 torch)."""
    shift = val.mean()
    centered = val - shift
    std = centered.norm() / math.sqrt(centered.numel() - 1)
    scale = range_sigmas * std / bins
    if scale == 0 or torch.isnan(scale) or torch.isinf(scale):
        scale = torch.tensor(1.0)
    q = (centered / scale + bins // 2).round().clamp(0, bins - 1).long()
    sums = torch.zeros(bins).scatter_add_(0, q, centered)
    counts = torch.zeros(bins).scatter_add_(0, q, torch.ones_like(centered))
    lookup = torch.where(counts > 0, sums / counts, torch.zeros_like(sums))
    return q, lookup, shift, centered / scale + bins // 2


def compress(e_prime, shape, chunk_1d):
    """Chunked top-k of |e'| (torch.topk per chunk), then the quantizer: (chunk positions,
    selected local indices [chunks, k], codes, v_hat [chunks, k], pre-rounding code values)."""
    pos = chunk_positions(shape, chunk_1d)
    chunks = e_prime.reshape(-1)[pos]
    k = clamp_topk(pos.shape[1], TOP_K)
    idx = torch.topk(chunks.abs(), k=k, dim=-1, largest=True, sorted=False).indices
    val = torch.gather(chunks, -1, idx)
    q, lookup, shift, raw = quantize(val.reshape(-1))
    v_hat = (lookup[q] + shift).reshape(val.shape)
    return pos, idx, q.reshape(val.shape), v_hat, raw.reshape(val.shape)


def clipped_mean(shape, pos, replicas):
    """templar's outer step: per replica (idx [chunks, k], v_hat), scale by
    min(1, median(norms) / (norm + 1e-8)) (torch's lower median), then the mean over the
    replicas that selected each coordinate (scatter_reduce "mean", include_self=False)."""
    norms = torch.stack([torch.norm(v, p=2) for _, v in replicas])
    median = torch.median(norms)
    chunks = torch.zeros(pos.shape)
    idx = torch.cat([i for i, _ in replicas], dim=-1)
    vals = torch.cat([v * torch.clamp(median / (norms[r] + 1e-8), max=1)
                      for r, (_, v) in enumerate(replicas)], dim=-1)
    chunks.scatter_reduce_(-1, idx, vals, reduce="mean", include_self=False)
    out = torch.zeros(int(np.prod(shape)))
    out[pos.reshape(-1)] = chunks.reshape(-1)
    return out.reshape(shape)


# --- Reading LBCC's payload (codecs/payload.h, codecs/topk_ef.h) ---------------------------


def parse_topk(payload):
    """version, k, local indices [count], 2-bit codes [count], shift, lookup[4] of a TopK-EF
    payload with packed12 indices and 2-bit bin-mean values."""
    assert payload[:4] == b"LBCC"
    version, codec = payload[5], struct.unpack_from("<H", payload, 6)[0]
    rank = payload[9]
    params_bytes, body_bytes = struct.unpack_from("<IQ", payload, 12)
    p = 24 + 8 * rank
    k, values, indices, _, _, index_bytes = struct.unpack_from("<IBBBBQ", payload, p)
    assert codec == 1 and values == 4 and indices == 1, (codec, values, indices)
    vp = p + 16 + (1 if version == 2 else 0)
    shift = struct.unpack_from("<f", payload, vp)[0]
    lookup = struct.unpack_from("<4f", payload, vp + 4)
    body = np.frombuffer(payload, np.uint8, body_bytes, 24 + 8 * rank + params_bytes)
    count = len(body[index_bytes:]) * 4
    ix = body[:index_bytes].astype(np.uint32)
    n_idx = index_bytes * 8 // 12
    local = np.empty(n_idx, np.int64)
    words = ix[0:(n_idx // 2) * 3:3] | (ix[1:(n_idx // 2) * 3:3] << 8) | (ix[2:(n_idx // 2) * 3:3] << 16)
    local[0:(n_idx // 2) * 2:2] = words & 0xFFF
    local[1:(n_idx // 2) * 2:2] = words >> 12
    if n_idx % 2:
        local[-1] = ix[-2] | ((ix[-1] & 0xF) << 8)
    vb = body[index_bytes:]
    codes = np.stack([(vb >> s) & 3 for s in (0, 2, 4, 6)], axis=1).reshape(-1)
    return version, k, local, codes, np.float32(shift), np.array(lookup, np.float32)


def bound(values, ref):
    n = values.numel()
    gamma = n * U / (1 - n * U)
    return 4 * gamma * float(values.abs().max()) + 4 * U * ref.abs()


# --- The tests ------------------------------------------------------------------------------

SHAPES = [
    ((130,), "templar"),       # 1-D: rows of edge(130) = 26, k = 26: the whole tensor
    ((3000,), "templar"),      # 1-D: rows of 60
    ((12288,), "flat4096"),    # 1-D: 4096-element chunks (payload version 2)
    ((128, 256), "templar"),   # 2-D full 64x64 chunks
    ((100, 30), "templar"),    # 2-D ragged: 50x30 chunks, 64 values each
    ((67, 128), "templar"),    # 2-D ragged: 67 is prime: 1x64 chunks, taken whole
    ((96, 4096), "templar"),   # 2-D ragged: 48x64 chunks
    ((4, 96, 40), "templar"),  # 3-D: [384, 40] -> 64x40 chunks
]


def gaussian(shape, seed, sigma=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * sigma


@pytest.mark.parametrize("shape,chunk_1d", SHAPES, ids=[str(s) for s, _ in SHAPES])
def test_encode_matches_templar_over_ef_steps(shape, chunk_1d):
    codec = lbcc.TopKEfCodec(top_k=TOP_K, beta=BETA, lr=LR, indices="packed12",
                             k_rule="per_chunk", chunk_1d=chunk_1d)
    state = lbcc.TopKEfState()
    ref_e = torch.zeros(shape)  # the re-statement's own EF buffer, evolved independently
    for step in range(4):
        delta = gaussian(shape, 100 + step, 0.01)
        e = torch.from_numpy(state.error) if state.initialized else torch.zeros(shape)
        e_prime = e * BETA + delta * LR  # templar: mul_(decay), add_(grad, alpha=lr)
        payload = codec.encode(delta, state)
        version, k, local, codes, shift, lookup = parse_topk(payload)
        assert version == (2 if chunk_1d == "flat4096" else 1)
        pos, idx, q, v_hat, raw = compress(e_prime, shape, chunk_1d)
        assert k == idx.shape[1] == clamp_topk(pos.shape[1], TOP_K)
        chunks = pos.shape[0]
        local = torch.from_numpy(local.reshape(chunks, k))
        codes = torch.from_numpy(codes[: chunks * k].astype(np.int64).reshape(chunks, k))
        # Same selection per chunk (as sets), same codes at the same positions.
        ref_sorted, order = torch.sort(idx, dim=-1)
        assert torch.equal(local, ref_sorted), f"step {step}: selections differ"
        ref_codes = torch.gather(q, -1, order)
        near_edge = (torch.gather(raw, -1, order).frac() - 0.5).abs() < 1e-3
        assert torch.equal(codes[~near_edge], ref_codes[~near_edge]), f"step {step}: codes"
        # Reconstructions and the EF buffer, within the bound.
        lbcc_v = torch.from_numpy(lookup)[codes] + float(shift)
        ref_v = torch.gather(v_hat, -1, order)
        same = ~near_edge
        assert ((lbcc_v - ref_v).abs()[same] <= bound(ref_v, ref_v)[same]).all()
        ref_e_new = e_prime.clone().reshape(-1)
        ref_e_new[pos.gather(-1, idx).reshape(-1)] -= v_hat.reshape(-1)  # templar: sub_(transmit)
        lbcc_e_new = torch.from_numpy(state.error).reshape(-1)
        assert ((lbcc_e_new - ref_e_new).abs() <= bound(ref_v, ref_e_new)).all()
        # The independent evolution stays within the bound of LBCC's buffer too.
        ref_e_prime = ref_e * BETA + delta * LR
        _, ridx, _, rv, _ = compress(ref_e_prime, shape, chunk_1d)
        ref_e = ref_e_prime.clone().reshape(-1)
        ref_e[pos.gather(-1, ridx).reshape(-1)] -= rv.reshape(-1)
        ref_e = ref_e.reshape(shape)
        assert ((lbcc_e_new - ref_e.reshape(-1)).abs() <= 4 * bound(rv, ref_e.reshape(-1))).all()


def replica_payloads(codec, shape, steps, replicas=4):
    """Every replica's payload of each step (an outlier at replica 3: 30x larger deltas)."""
    states = [lbcc.TopKEfState() for _ in range(replicas)]
    out = []
    for step in range(steps):
        out.append([codec.encode(gaussian(shape, 1000 * r + step, 0.01 * (30 if r == 3 else 1)),
                                 states[r]) for r in range(replicas)])
    return out


@pytest.mark.parametrize("shape,chunk_1d", SHAPES, ids=[str(s) for s, _ in SHAPES])
def test_clipped_mean_over_selectors_matches_templar(shape, chunk_1d):
    codec = lbcc.TopKEfCodec(top_k=TOP_K, indices="packed12", k_rule="per_chunk",
                             chunk_1d=chunk_1d)
    pos = chunk_positions(shape, chunk_1d)
    for step, payloads in enumerate(replica_payloads(codec, shape, steps=3)):
        replicas = []
        for p in payloads:
            _, k, local, codes, shift, lookup = parse_topk(p)
            v = torch.from_numpy(lookup)[torch.from_numpy(codes.astype(np.int64))] + float(shift)
            replicas.append((torch.from_numpy(local.reshape(pos.shape[0], k)),
                             v[: pos.shape[0] * k].reshape(pos.shape[0], k)))
        ref = clipped_mean(shape, pos, replicas)
        out = np.full(shape, 7.0, np.float32)
        lbcc.decode(payloads, out, aggregation="sparseloco", clip_to_median_norm=True)
        all_v = torch.cat([v.reshape(-1) for _, v in replicas])
        assert (torch.from_numpy(out) - ref).abs().le(bound(all_v, ref)).all(), f"step {step}"
        # The outlier was clipped: without the clip the mean is larger somewhere.
        plain = np.zeros(shape, np.float32)
        lbcc.decode(payloads, plain, aggregation="sparseloco")
        assert np.abs(plain).max() > np.abs(out).max()


def test_sparse_all_reduce_clips_identically_on_every_rank():
    shapes = [(100, 30), (130,), (96, 64)]
    codec = lbcc.TopKEfCodec(top_k=TOP_K, k_rule="per_chunk", chunk_1d="templar")
    deltas = [[gaussian(s, 10 * r + i, 0.01 * (30 if r == 3 else 1)) for i, s in enumerate(shapes)]
              for r in range(4)]

    def body(rank, comm):
        states = [codec.new_state() for _ in shapes]
        outs = []
        for _ in range(2):
            out = [torch.empty(s) for s in shapes]
            comm.sparse_all_reduce(deltas[rank], out, codec, states, clip_to_median_norm=True)
            outs.append(out)
        return outs

    results = run_ranks(4, body)
    states = [[codec.new_state() for _ in shapes] for _ in range(4)]
    for step in range(2):
        for i, s in enumerate(shapes):
            payloads = [codec.encode(deltas[r][i], states[r][i]) for r in range(4)]
            expected = torch.empty(s)
            lbcc.decode(payloads, expected, aggregation="sparseloco", clip_to_median_norm=True)
            for r in range(4):
                assert torch.equal(results[r][step][i], expected)


def test_k_rule_and_chunk_1d_names():
    c = lbcc.TopKEfCodec(k_rule="per_chunk", chunk_1d="flat4096")
    assert (c.k_rule, c.chunk_1d) == ("per_chunk", "flat4096")
    d = lbcc.TopKEfCodec()
    assert (d.k_rule, d.chunk_1d) == ("proportional", "lbcc")
    with pytest.raises(lbcc.Error, match="k_rule"):
        lbcc.TopKEfCodec(k_rule="even")
    with pytest.raises(lbcc.Error, match="chunk_1d"):
        lbcc.TopKEfCodec(chunk_1d="flat")
    with pytest.raises(lbcc.Error, match="whole number"):
        lbcc.TopKEfCodec(top_k=63.5, k_rule="per_chunk")
    # The proportional rule takes 1 value per 64-element row; templar's takes the row whole.
    x = gaussian((64,), 1)
    assert lbcc.inspect(d.encode(x, lbcc.TopKEfState()))["selected"] == 1
    t = lbcc.TopKEfCodec(k_rule="per_chunk", chunk_1d="templar")
    assert lbcc.inspect(t.encode(x, lbcc.TopKEfState()))["selected"] == 64


def test_huge_deltas_are_refused_not_decoded_to_inf():
    codec = lbcc.TopKEfCodec()
    x = np.zeros(4096, np.float32)
    x[7] = 3e38
    state = lbcc.TopKEfState()
    with pytest.raises(lbcc.Error, match="exceeds 2\\^100"):
        codec.encode(x, state)
    assert not state.has_pending
