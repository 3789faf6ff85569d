"""
The studies' variants: each a topology of residuals.py with one thing changed,
named `<topology>.<change>` and trained like any topology:

    python train.py --residual=hc.mix_diagonal

Read residuals.py first; each entry here is a few lines on top of one of its
classes, overriding the one method (or class attribute) that it changes. The
studies that train them, and what they found, are in lab/README.md. Each
variant starts as its topology does (the residual network, but for gated_ihc's
0.9 and the anchor's unequal gates; tests.py checks each, and that each
variant's change acts).

VARIANTS, at the end, names them; importing this file registers them in
residuals.RESIDUALS, the table --residual takes (model.py imports it).
"""
import torch
import torch.nn as nn

from residuals import (RESIDUALS, GatedIHC, HyperConnection, IdentityHC, NormGatedIHC, Residual,
                       float32_or_wider, read_weights_init, rms_projection, stretch)

# -----------------------------------------------------------------------------
# The residual given the tools its rivals have (the depth48_tools study): learned
# scales on its skip and its branch, as hc on one stream learns them, and the
# embedding fed to every sublayer, as the strongest small-GPT baselines do
# (modded-nanogpt, nanochat). Every scale starts where the residual network is.


class ResidualScaled(Residual):
    """residual.scaled: x' = a x + b F(x), a and b learned scalars per sublayer, from 1
    (the LayerScale / SkipInit / DeepNorm family; hc.one_stream_static without its
    read scale)."""
    scales = ("skip_scale", "branch_scale")

    def __init__(self, config, sublayer_index, ops):
        super().__init__(config, sublayer_index, ops)
        self.skip_scale, self.branch_scale = nn.Parameter(torch.ones(())), nn.Parameter(torch.ones(()))

    def forward(self, h, sublayer, x0):  # h (B,T,1,C)
        return self.skip_scale * h + self.branch_scale * sublayer(h.squeeze(-2)).unsqueeze(-2)

    def mix_matrix(self, h):
        return self.skip_scale.expand(*h.shape[:2], 1, 1)  # (B,T,1,1): the skip path's gain


class ResidualX0(ResidualScaled):
    """residual.x0: x' = a x + b F(x) + l x0, x0 the token embedding and l a learned
    scalar per sublayer from 0 (modded-nanogpt's and nanochat's x0 lambdas)."""
    scales = ResidualScaled.scales + ("x0_scale",)

    def __init__(self, config, sublayer_index, ops):
        super().__init__(config, sublayer_index, ops)
        self.x0_scale = nn.Parameter(torch.zeros(()))

    def forward(self, h, sublayer, x0):  # x0 (B,T,C)
        return super().forward(h, sublayer, x0) + self.x0_scale * x0.unsqueeze(-2)


# -----------------------------------------------------------------------------
# hc's mixing, taken apart (the hc_ablation and hc_sign_gain studies). Read and
# write stay hc's; only MIX = A_r^T changes. A_r = I at step 0, so each is still
# the residual network there.


class HCMixStatic(HyperConnection):
    """hc.mix_static: A_r = A_static, the same mixing for every token (no tanh part)."""

    def __init__(self, config, sublayer_index, ops):
        super().__init__(config, sublayer_index, ops)
        self.groups[2] = 0  # s_res scales nothing


class HCMixDiagonal(HyperConnection):
    """hc.mix_diagonal: only A_r's diagonal, a signed, unbounded forget gate per stream."""

    def mix(self, A_r):
        return A_r.diagonal(dim1=-2, dim2=-1)  # (B,T,n), stream_write's diagonal form


class HCMixIdentity(HyperConnection):
    """hc.mix_identity: no mixing at all, MIX = I: hc's read and write on ihc."""

    def mix(self, A_r):
        return None


def bounded(mix):
    """MIX divided, per token, by max(1, its largest absolute row sum): no sublayer
    amplifies the state, so the composite forward gain stays <= 1, as mHC's does.
    mix (B,T,n,n), or (B,T,n) diagonal."""
    row_sums = mix.abs() if mix.dim() == 3 else mix.abs().sum(-1)  # (B,T,n)
    largest = row_sums.amax(-1, keepdim=True).clamp(min=1.0)  # (B,T,1)
    return mix / (largest if mix.dim() == 3 else largest.unsqueeze(-1))


class HCBounded(HyperConnection):
    """hc.bounded: MIX = A_r^T scaled down where it would amplify (bounded above),
    still signed and dynamic."""

    def mix(self, A_r):
        return bounded(super().mix(A_r))


class HCMixDiagonalBounded(HCMixDiagonal):
    """hc.mix_diagonal_bounded: the diagonal gate kept in [-1, 1]."""

    def mix(self, A_r):
        return bounded(super().mix(A_r))


class HCNonnegative(HyperConnection):
    """hc.nonnegative: A_r clamped at 0: no stream is subtracted from another or
    flipped, while the gain stays free. A zero entry (A_r = I off the diagonal)
    still gets its gradient: torch's clamp passes it at the bound."""

    def mix(self, A_r):
        return super().mix(A_r.clamp(min=0))


class HCNonnegativeBounded(HCNonnegative):
    """hc.nonnegative_bounded: clamped at 0, then bounded: row sums <= 1, as mHC's."""

    def mix(self, A_r):
        return bounded(super().mix(A_r))


# -----------------------------------------------------------------------------
# hc on one stream (the 48-layer decomposition study): with nothing to mix, what
# is left of hc is a learned scale on the skip and on the branch of each
# sublayer. Step 0: every scale is 1, the residual network.


class HCOneStream(HyperConnection):
    """hc.one_stream: hc at n = 1, x' = a(x) x + b(x) F(c(x) x), where a, b and c
    are hc's A_r, post and pre: a static 1 plus s tanh(RMSNorm(x) @ W), per token."""
    n_streams_allowed = (1, 1)
    default_n_streams = 1


class HCOneStreamStatic(HCOneStream):
    """hc.one_stream_static: x' = a x + b F(c x) with a, b, c learned scalars per
    sublayer and no token-dependent part (the LayerScale / SkipInit / DeepNorm
    family: a scale on the skip and one on the branch; c is kept from hc, though
    the sublayer's pre-norm makes F(c x) = F(x) for c > 0 but for LayerNorm's eps)."""

    def __init__(self, config, sublayer_index, ops):
        super().__init__(config, sublayer_index, ops)
        self.groups.zero_()  # s_pre, s_post, s_res scale nothing: W gets no gradient and stays 0


# -----------------------------------------------------------------------------
# hc's read and write given to ihc, one choice at a time (the hc_ablation study).
# The fast paths fuse only mHC's coefficients with the read; here the
# coefficients are computed in plain PyTorch and only the read is fast.


class HCStyleIHC(IdentityHC):
    """ihc with its coefficients computed by `coefficients` (which a variant
    overrides) rather than by the fused dynamic_read."""

    def forward(self, h, sublayer, x0):
        pre, post, res = self.coefficients(h)
        y = sublayer(self.ops.stream_read(h, pre))  # read, compute
        return self.ops.stream_write(h, self.mix(res), post, y)  # mix and write


class IHCStream(HCStyleIHC):
    """ihc.stream: stream i's pre_i and post_i from its own normalized state h_i by
    one shared W (C, 2), as hc (Eqs. 10-13), instead of from the whole state."""

    def __init__(self, config, sublayer_index, ops):
        super().__init__(config, sublayer_index, ops)
        self.proj = torch.nn.Parameter(torch.zeros(config.n_embd, 2))  # W, weight-decayed

    def coefficients(self, h):
        with torch.autocast(h.device.type, enabled=False):
            z = rms_projection(float32_or_wider(h), self.proj)  # (B,T,n,2)
            z = (self.alpha @ self.groups) * torch.cat([z[..., 0], z[..., 1]], -1) + self.bias  # (B,T,2n)
        pre, post = z.chunk(2, -1)
        return pre.sigmoid(), 2 * post.sigmoid(), z[..., :0]


class IHCSigned(HCStyleIHC):
    """ihc.signed: hc's pre and post, bias + a tanh(.), of any sign and unbounded,
    instead of sigmoid and 2 sigmoid; their biases start at the coefficients
    themselves (sum(pre) = 1, post = 1), as hc's statics."""

    def __init__(self, config, sublayer_index, ops):
        super().__init__(config, sublayer_index, ops)
        with torch.no_grad():
            self.bias.copy_(torch.cat([self.read_init(sublayer_index), torch.ones(self.n)]))

    def read_init(self, sublayer_index):
        return read_weights_init(self.n, sublayer_index)

    def coefficients(self, h):
        B, T, n, C = h.shape
        with torch.autocast(h.device.type, enabled=False):
            z = rms_projection(float32_or_wider(h).reshape(B, T, n * C), self.proj).tanh()  # (B,T,2n)
            z = (self.alpha @ self.groups) * z + self.bias
        pre, post = z.chunk(2, -1)
        return pre, post, z[..., :0]


class IHCSignedOneHot(IHCSigned):
    """ihc.signed_one_hot: signed, and reading stream k mod n alone at step 0 (hc's
    e_{k mod n}, which a sigmoid cannot reach)."""

    def read_init(self, sublayer_index):
        return torch.eye(self.n)[sublayer_index % self.n]


# -----------------------------------------------------------------------------
# The source's other gate forms (seed 000 s.13) and two gate options, on
# norm_gated_ihc (the gates study). Each form is a mixin that replaces the
# gate's three methods; the study ran the forms from g = 1, the clip's edge.


class ClipGate:
    """g = clip(u, 0, 1) forward; backward as if g = u (straight-through), so a
    logit pushed past a bound still gets its gradient and can come back."""
    gate_init = 1.0

    def gate(self, u):
        return u + (u.clamp(0.0, 1.0) - u).detach()

    @staticmethod
    def gate_logit(g):
        return g

    @staticmethod
    def unclipped(u):
        return u


class HardSigmoidGate(ClipGate):
    """The clip's forward with its true gradient: 0 where it holds, so a logit past
    a bound stops moving."""

    def gate(self, u):
        return u.clamp(0.0, 1.0)


class BinaryGate(ClipGate):
    """g = 1 if u > 1/2 else 0 forward, straight-through backward: every gate is a
    hard keep-or-reset decision."""

    def gate(self, u):
        return u + ((u > 0.5).to(u.dtype) - u).detach()


class HardConcreteGate:
    """Hard concrete (Louizos et al. 2018, the l0 gate): in training a noisy gate,
    g = clip(stretch((u + logit(U)) / beta), 0, 1), U ~ Uniform(0, 1), beta = 2/3,
    whose samples land at exact 0 and 1 with probabilities set by u; at evaluation
    the stretched sigmoid's clip(stretch(u), 0, 1). No l0 penalty: exactness, not
    sparsity, is the point here."""
    gate_init = 1.0  # at evaluation; training samples are < 1 about a third of the time there

    def gate(self, u):
        if not self.training:
            return super().gate(u)
        noise = torch.rand_like(u).clamp(1e-6, 1 - 1e-6)  # U, kept off 0 and 1 where logit is infinite
        return stretch((u + torch.logit(noise)) / (2 / 3)).clamp(0.0, 1.0)


class GatedIHCClip(ClipGate, GatedIHC):
    """gated_ihc.clip: the straight-through clip gate, from g = 1."""


class NormGatedIHCClip(ClipGate, NormGatedIHC):
    """norm_gated_ihc.clip: the straight-through clip gate, from g = 1."""


class NormGatedIHCHardSigmoid(HardSigmoidGate, NormGatedIHC):
    """norm_gated_ihc.hard_sigmoid: the clip's forward with its true gradient, from g = 1."""


class NormGatedIHCBinary(BinaryGate, NormGatedIHC):
    """norm_gated_ihc.binary: every gate 0 or 1, straight-through, from g = 1."""


class NormGatedIHCHardConcrete(HardConcreteGate, NormGatedIHC):
    """norm_gated_ihc.hard_concrete: the noisy l0 gate, from g = 1 at evaluation."""


class NormGatedIHCInit1(NormGatedIHC):
    """norm_gated_ihc.init1: its own gate from g = 1, on the clip's edge."""
    gate_init = 1.0


class NormGatedIHCClipInit09(NormGatedIHCClip):
    """norm_gated_ihc.clip_init0.9: the clip gate from g = 0.9, inside the clip."""
    gate_init = 0.9


class NormGatedIHCClipDeviations(NormGatedIHCClip):
    """norm_gated_ihc.clip_deviations: the clip gate on the streams' deviations from
    their mean only, MIX = J + (I - J) D (I - J), D = c(g) diag(g), J = ones/n: the
    mean, the common mode the LM head reads, is kept."""

    def mix(self, res):
        d = super().mix(res)  # (B,T,n)
        I_minus_J = torch.eye(self.n, dtype=d.dtype, device=d.device) - 1.0 / self.n
        with torch.autocast(d.device.type, enabled=False):  # in bf16 the mean is kept only to ~1e-3
            return 1.0 / self.n + (I_minus_J * d.unsqueeze(-2)) @ I_minus_J  # (I - J) D: columns scaled; (B,T,n,n)


class NormGatedIHCBounded(NormGatedIHC):
    """norm_gated_ihc.bounded: c(g) diag(g) divided by max(1, max_i c(g) g_i): no
    stream is amplified (the composite gain stays <= 1), while a gate still reaches 0
    and resets its stream: the gate's resets without its amplification."""

    def mix(self, res):
        return bounded(super().mix(res))


class NormGatedIHCAnchor(NormGatedIHC):
    """norm_gated_ihc.anchor: stream 0's gate always 1, so one stream is never reset.
    Its gates are then unequal at step 0 (1 and 0.9): it starts near, not at, the
    residual network."""

    def gate(self, u):
        g = super().gate(u)
        return torch.cat([torch.ones_like(g[..., :1]), g[..., 1:]], -1)


VARIANTS = {
    "residual.scaled": ResidualScaled,
    "residual.x0": ResidualX0,
    "hc.mix_static": HCMixStatic,
    "hc.mix_diagonal": HCMixDiagonal,
    "hc.mix_identity": HCMixIdentity,
    "hc.bounded": HCBounded,
    "hc.mix_diagonal_bounded": HCMixDiagonalBounded,
    "hc.nonnegative": HCNonnegative,
    "hc.nonnegative_bounded": HCNonnegativeBounded,
    "hc.one_stream": HCOneStream,
    "hc.one_stream_static": HCOneStreamStatic,
    "ihc.stream": IHCStream,
    "ihc.signed": IHCSigned,
    "ihc.signed_one_hot": IHCSignedOneHot,
    "gated_ihc.clip": GatedIHCClip,
    "norm_gated_ihc.clip": NormGatedIHCClip,
    "norm_gated_ihc.hard_sigmoid": NormGatedIHCHardSigmoid,
    "norm_gated_ihc.binary": NormGatedIHCBinary,
    "norm_gated_ihc.hard_concrete": NormGatedIHCHardConcrete,
    "norm_gated_ihc.init1": NormGatedIHCInit1,
    "norm_gated_ihc.clip_init0.9": NormGatedIHCClipInit09,
    "norm_gated_ihc.clip_deviations": NormGatedIHCClipDeviations,
    "norm_gated_ihc.anchor": NormGatedIHCAnchor,
    "norm_gated_ihc.bounded": NormGatedIHCBounded,
}
RESIDUALS.update(VARIANTS)
