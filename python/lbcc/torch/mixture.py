"""Learned mixtures of subspaces for K and V (issue 46 item 2; docs/context_parallel.md).

The context-parallel paper constrains the K/V blocks that travel around the ring to learned
mixtures of low-dimensional subspaces, so only coefficients and a component selector cross the
link. Its selection rule and parameterization are not public (../shared/reference/subspace.md);
this is the generic design that reference suggests, made trainable:

  K = route(X A) U^T     per block of `block` tokens:
    X A        [tokens, M*k]: the coefficients every component would use (A = W_k's
               reparameterization onto M components of rank k: W_k^(m) = A_m U_m^T);
    route      keeps, per block, the component whose coefficients carry the most energy
               (||c_m||^2 = ||U_m c_m||^2, U_m orthonormal) - the subspace codec's own rule, so
               the codec picks the same component and carries K exactly (f32 coefficients;
               bf16 rounds them once);
    U          [d, M*k]: the M bases, each orthonormal, learned.

Both A and U are parameters. The selection is piecewise constant (no gradient through the
choice: a straight-through-free hard routing, like a top-1 mixture); gradients reach A_m and
U_m of the chosen component through K = c_m U_m^T.

Versioned bases. After an optimizer step U_m is no longer orthonormal: refresh_basis_()
re-orthonormalizes each component (Householder QR in float64, R's diagonal made positive, so
identical weights give identical bits), writes it back into the parameter and makes the next
lbcc.SubspaceBasis with version + 1. A ring encodes with the basis of the moment its forward
runs and keeps it for its backward (RingAttention makes one ring per forward), and every
payload names its basis (hash, version): a block is always decoded with the basis it was
encoded with, and ranks on different bases fail the pass on every rank (the basis id is part
of the ring's signature).

Synchronisation across data-parallel replicas: U is an ordinary (small) parameter, so its
update travels with every other parameter's, in whatever compressed form the data-parallel
exchange uses (SparseLoCo's top-k pseudo-gradients); replicas holding identical U bits after
the exchange (SparseLoCo guarantees that) compute the identical refreshed basis, so no basis is
shipped densely. lbcc.torch.check_basis(comm, basis) verifies that they agree.
"""

import numpy as np
import torch
from torch import nn

import lbcc

__all__ = ["MixtureProjection", "MixtureKV", "orthonormalize_components"]


def orthonormalize_components(u, components):
    """Each [d, k] component of u [d, M*k] replaced by the Q of its QR decomposition (float64,
    R's diagonal positive), as float32."""
    d, mk = u.shape
    k = mk // components
    out = torch.empty(d, mk, dtype=torch.float64)
    for m in range(components):
        q, r = torch.linalg.qr(u[:, m * k:(m + 1) * k].detach().to(torch.float64))
        signs = torch.sign(torch.diagonal(r))
        signs[signs == 0] = 1
        out[:, m * k:(m + 1) * k] = q * signs
    return out.to(torch.float32)


class MixtureProjection(nn.Module):
    """y = route(x A) U^T: a projection [.., d_in] -> [.., d_out] whose output lies, per block
    of `block` consecutive tokens (dim -2), in one of `components` learned subspaces of rank k.
    x: [B, T, d_in] with T a multiple of `block`."""

    def __init__(self, d_in, d_out, rank, components, block, seed=0, version=0):
        super().__init__()
        if rank * components > d_out:
            raise ValueError(f"rank * components = {rank * components} > d_out = {d_out}: the "
                             "components would overlap and the codec could pick another one")
        self.rank, self.components, self.block = rank, components, block
        seeded = lbcc.SubspaceBasis.from_seed(model_dim=d_out, rank=rank,
                                              components=components, seed=seed)
        u = torch.from_numpy(np.array(seeded.u, dtype=np.float32))
        # Components orthogonal to each other too (one QR over all M*k columns): the codec's
        # energy rule then has a unique maximum for an output inside one component.
        q, r = torch.linalg.qr(u.to(torch.float64))
        self.u = nn.Parameter((q * torch.sign(torch.diagonal(r))).to(torch.float32))
        g = torch.Generator().manual_seed(seed + 1)
        self.a = nn.Parameter(torch.randn(d_in, rank * components, generator=g) / d_in ** 0.5)
        self.version = version
        self._basis = None

    def basis(self):
        """The lbcc.SubspaceBasis of the current U and version (made once per version)."""
        if self._basis is None or self._basis.version != self.version:
            self._basis = lbcc.SubspaceBasis.from_matrices(
                self.u.detach().contiguous(), components=self.components, version=self.version)
        return self._basis

    @torch.no_grad()
    def refresh_basis_(self):
        """Re-orthonormalizes U after an optimizer step and moves to the next basis version."""
        self.u.copy_(orthonormalize_components(self.u, self.components))
        self.version += 1
        self._basis = None
        return self.basis()

    def selectors(self, coef):
        """Per block, the component with the most coefficient energy: [B, T // block]."""
        b, t, _ = coef.shape
        energy = coef.detach().reshape(b, t // self.block, self.block, self.components,
                                       self.rank).square().sum(dim=(2, 4))
        return energy.argmax(dim=-1)

    def forward(self, x):
        b, t, _ = x.shape
        if t % self.block != 0:
            raise ValueError(f"tokens {t} is not a multiple of the mixture block {self.block}")
        coef = x @ self.a  # [B, T, M*k]
        sel = self.selectors(coef)  # [B, T/block]
        c = coef.reshape(b, t // self.block, self.block, self.components, self.rank)
        idx = sel.reshape(b, t // self.block, 1, 1, 1).expand(-1, -1, self.block, 1, self.rank)
        chosen = c.gather(3, idx).squeeze(3)  # [B, T/block, block, k]
        u = self.u.reshape(-1, self.components, self.rank)  # [d, M, k]
        u_sel = u.permute(1, 0, 2)[sel]  # [B, T/block, d, k]
        y = chosen @ u_sel.transpose(-1, -2)  # [B, T/block, block, d]
        return y.reshape(b, t, -1)


class MixtureKV(nn.Module):
    """K and V projections onto learned mixtures of subspaces, for RingAttention:

        kv = MixtureKV(d_model, heads * head_dim, rank=8, components=4, block=16)
        k, v = kv(x)                                   # [B, T, heads * head_dim] each
        out = ring(q, k.view(...), v.view(...), codec=kv.codecs())
        ... optimizer.step(); kv.refresh_basis_()      # next basis version, same on every rank
    """

    def __init__(self, d_model, d_kv, rank, components, block, seed=0):
        super().__init__()
        self.block = block
        self.k = MixtureProjection(d_model, d_kv, rank, components, block, seed=seed)
        self.v = MixtureProjection(d_model, d_kv, rank, components, block, seed=seed + 100)

    def forward(self, x):
        return self.k(x), self.v(x)

    def codecs(self):
        """(K's basis, V's basis) for RingAttention(codec=...) at their current versions."""
        return self.k.basis(), self.v.basis()

    def refresh_basis_(self):
        return self.k.refresh_basis_(), self.v.refresh_basis_()

    def compression(self, coefficient_bytes=2):
        """Fraction of K/V bytes the ring saves against bf16 (selectors and headers aside)."""
        d = self.k.u.shape[0]
        return 1.0 - (self.k.rank * coefficient_bytes) / (2.0 * d)
