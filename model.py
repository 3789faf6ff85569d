"""
A GPT whose residual connections are pluggable (residuals.py).

nanoGPT's model (karpathy/nanoGPT, model.py) with one change: each Block's two
sublayers (attention, MLP; each with its own pre-norm inside) are wrapped by a
residual topology instead of `x + F(x)`. The residual state h is (B, T, n, C):
n streams of width C. They start as n copies of the token + position embedding
and are averaged before the final norm (the HC paper sums them; the average keeps
the step-0 network exactly the plain residual one, because LayerNorm's eps is not
scale-invariant). With residual="residual", n = 1 and this is nanoGPT's GPT.

    python -c "from model import GPT, GPTConfig; print(GPT(GPTConfig()))"
"""
import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import residuals
from residuals import TOPOLOGIES


@dataclass
class GPTConfig:
    """Checkpoints keep these as model_args. Those saved before the gate options
    existed (no "gate" key) were trained with the clip gate: OLD_CHECKPOINT_GATE."""
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # bias in Linears and LayerNorms, as GPT-2
    residual: str = "residual"  # topology name, a key of residuals.TOPOLOGIES
    n_streams: int = 1  # n, the number of residual streams
    alpha_init: float = 0.01  # initial a_* (mHC) and s (HC) coefficient scales
    sinkhorn_iters: int = 20  # mhc
    gate_c_max: float = 2.0  # norm_gated_ihc: cap of the norm correction c(g)
    gate_anchor: bool = False  # gated_ihc, norm_gated_ihc: keep stream 0's gate at 1
    gate: str = "stretched_sigmoid"  # gated topologies: how logits become gates, a key of residuals.GATES
    gate_init: float = 0.0  # gated topologies: every gate's value at step 0, in (0, 1]; 0: the gate's own init
    gate_deviations: bool = False  # gated_ihc, norm_gated_ihc: gate only the deviations from the stream mean
    # hc's choices, one at a time (residuals.py; the ablation in results/README.md)
    hc_mix: str = "dynamic"  # hc: what mixes the streams, one of HC_MIXES
    hc_bounded: bool = False  # hc: MIX scaled down per token to a largest absolute row sum of at most 1
    hc_nonnegative: bool = False  # hc: A_r's entries clamped at 0: streams are added, never subtracted
    coefficients_from: str = "state"  # mhc, mhc_lite, the iHC family: state (mHC) or stream (each stream's own, hc)
    read_write: str = "bounded"  # mhc, mhc_lite, the iHC family: bounded (sigmoid, mHC) or signed (bias + a tanh, hc)
    read_init: str = "spread"  # mhc, mhc_lite, the iHC family: spread (0.73 on one stream) or one_hot (hc; needs signed)
    kernels: str = "fused"  # implementation of the stream ops: reference, fused or triton (see stream_ops)


HC_MIXES = ("dynamic", "static", "diagonal", "identity")
STREAM_CHOICES = dict(coefficients_from=("state", "stream"), read_write=("bounded", "signed"),
                      read_init=("spread", "one_hot"))
OLD_CHECKPOINT_GATE = dict(gate="clip")  # under model_args when a checkpoint has no "gate"


def load_checkpoint(path):
    """train.py's checkpoint at path, its model_args completed for checkpoints older
    than the gate options. Any damage (truncated, corrupted, not ours) is a ValueError
    with a one-line message naming the file."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        checkpoint["model_args"] = {**OLD_CHECKPOINT_GATE, **checkpoint["model_args"]}
        return checkpoint
    except Exception as e:
        raise ValueError(f"cannot load checkpoint {path} ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                         f"it is truncated, corrupted or not from this train.py") from e


def check_config(config):
    """Raise ValueError with a one-line message for a config the model cannot build."""
    if config.residual not in TOPOLOGIES:
        raise ValueError(f"unknown residual '{config.residual}'; choose one of: {', '.join(TOPOLOGIES)}")
    lo, hi = TOPOLOGIES[config.residual].n_streams_allowed
    if not lo <= config.n_streams <= hi:
        allowed = f"exactly {lo}" if lo == hi else f"from {lo} to {hi}"
        raise ValueError(f"residual '{config.residual}' needs n_streams {allowed}, got {config.n_streams}")
    if config.n_embd % config.n_head:
        raise ValueError(f"n_embd ({config.n_embd}) must be a multiple of n_head ({config.n_head})")
    if config.kernels not in KERNELS:
        raise ValueError(f"unknown kernels '{config.kernels}'; choose one of: {', '.join(KERNELS)}")
    check_gate_config(config)
    check_hc_choices(config)


def check_gate_config(config):
    """The gate settings: each one only where it means something, never ignored."""
    if config.gate not in residuals.GATES:
        raise ValueError(f"unknown gate '{config.gate}'; choose one of: {', '.join(residuals.GATES)}")
    if not (0 < config.gate_init <= 1 or config.gate_init == 0):
        raise ValueError(f"gate_init must be in (0, 1], or 0 for the gate's own init, got {config.gate_init}")
    if config.gate == "binary" and config.gate_init not in (0, 1):
        raise ValueError(f"the binary gate is 0 or 1: gate_init must be 1, got {config.gate_init}")
    topology = TOPOLOGIES[config.residual]
    changed = [key for key in ("gate", "gate_init", "gate_anchor", "gate_deviations")
               if getattr(config, key) != getattr(GPTConfig, key)]  # set away from its default
    if changed and not issubclass(topology, residuals.GatedIHC):
        raise ValueError(f"{', '.join(changed)}: gate settings apply to gated_ihc, norm_gated_ihc and "
                         f"mean_gated_ihc only, not to '{config.residual}'")
    mean_only = [key for key in ("gate_anchor", "gate_deviations") if key in changed]
    if mean_only and issubclass(topology, residuals.MeanGatedIHC):
        raise ValueError(f"{', '.join(mean_only)}: mean_gated_ihc has one gate for all streams and gates only "
                         f"the deviations already; use gated_ihc or norm_gated_ihc")


def check_hc_choices(config):
    """hc_mix on hc only; hc's read and write choices on the mHC skeleton only; each
    a known value, and never one that would be ignored."""
    topology = TOPOLOGIES[config.residual]
    if config.hc_mix not in HC_MIXES:
        raise ValueError(f"unknown hc_mix '{config.hc_mix}'; choose one of: {', '.join(HC_MIXES)}")
    for key in ("hc_mix", "hc_bounded", "hc_nonnegative"):
        if getattr(config, key) != getattr(GPTConfig, key) and topology is not residuals.HyperConnection:
            raise ValueError(f"{key} applies to hc only, not to '{config.residual}'")
    for key in ("hc_bounded", "hc_nonnegative"):
        if getattr(config, key) and config.hc_mix == "identity":
            raise ValueError(f"{key} changes hc's mixing; with hc_mix=identity there is none")
    for key, allowed in STREAM_CHOICES.items():
        value = getattr(config, key)
        if value not in allowed:
            raise ValueError(f"unknown {key} '{value}'; choose one of: {', '.join(allowed)}")
        if value != getattr(GPTConfig, key) and not issubclass(topology, residuals.DynamicStreams):
            raise ValueError(f"{key} applies to mhc, mhc_lite and the iHC family only, not to '{config.residual}'")
    if config.read_init == "one_hot" and config.read_write != "signed":
        raise ValueError("read_init=one_hot needs read_write=signed: a sigmoid never reaches 0 or 1")
    if config.coefficients_from == "stream" and issubclass(topology, residuals.MeanGatedIHC):
        raise ValueError("coefficients_from=stream gives each stream its own MIX logits; mean_gated_ihc has one "
                         "gate for all streams")


KERNELS = ("reference", "fused", "triton")


def stream_ops(name):
    """The one switch: the module whose stream_read, stream_write, sinkhorn,
    rms_projection and dynamic_read every topology calls. reference: residuals.py,
    plain PyTorch that autograd differentiates (the maths); fused: fused.py, the
    same ops with hand-written backwards (fast on a CPU); triton: kernels.py, GPU
    kernels (or Triton's CPU interpreter with TRITON_INTERPRET=1)."""
    if name == "triton":
        try:
            import kernels  # imported only when asked for: it needs triton
        except ModuleNotFoundError as e:
            if e.name != "triton":
                raise
            raise RuntimeError("triton is not installed (it has wheels for Linux only); use kernels='fused'") from None
        kernels.check_triton_available()  # RuntimeError with the reason, never a silent fallback
        return kernels
    if name == "fused":
        import fused
        return fused
    return residuals


class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.dropout = config.n_head, config.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):

    def __init__(self, config, layer, ops):
        super().__init__()
        Topology = TOPOLOGIES[config.residual]
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)
        self.attn_topology = Topology(config, 2 * layer, ops)  # sublayer index k = 2 * layer
        self.mlp_topology = Topology(config, 2 * layer + 1, ops)

    def attn_sublayer(self, x):
        return self.attn(self.ln_1(x))

    def mlp_sublayer(self, x):
        return self.mlp(self.ln_2(x))

    def forward(self, h):  # h (B,T,n,C)
        h = self.attn_topology(h, self.attn_sublayer)
        return self.mlp_topology(h, self.mlp_sublayer)


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        check_config(config)
        self.config = config
        ops = stream_ops(config.kernels)
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, layer, ops) for layer in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying (https://paperswithcode.com/method/weight-tying)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # scaled init of the residual projections, as GPT-2
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        """Linear and Embedding weights ~ N(0, 0.02), Linear biases 0, LayerNorm 1 / 0 (nanoGPT).
        The topologies' own parameters are initialized in residuals.py."""
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def embed(self, idx):
        """Token + position embedding, as n equal streams: (B,T) -> (B,T,n,C)."""
        B, T = idx.size()
        assert T <= self.config.block_size, f"sequence of {T} tokens is longer than block_size {self.config.block_size}"
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # (B,T,C)
        return x.unsqueeze(2).expand(B, T, self.config.n_streams, x.size(-1))

    def residual_state(self, idx):
        """The residual state after the last Block: (B,T,n,C)."""
        h = self.embed(idx)
        for block in self.transformer.h:
            h = block(h)
        return h

    @torch.no_grad()
    def diagnostics(self, idx):
        """What the topology does to the residual path, on one batch.

        Composite gain (mHC paper, Figs. 3 and 7): P = MIX_{2L-1} ... MIX_1 MIX_0,
        the product of every sublayer's MIX per token. Forward gain: the largest
        absolute row sum of P; backward gain: the largest absolute column sum; max
        over the batch's tokens. 1 for the residual and for products of doubly
        stochastic matrices; hc can grow; gates below 1 shrink it. The maximum
        hides decay, so also: the gain of the mean direction, |P 1| / |1| (the
        streams' common mode, which the LM head reads), averaged over tokens; and
        P's effective rank, exp(entropy of its normalized singular values), n for
        an invertible P with equal singular values, 1 after a collapse to rank 1.
        Gated topologies also report, per sublayer, the mean gate, the fraction of
        gates below 0.01 (resets) and the fraction of gate logits the gate's clip
        holds (GatedIHC.gate_held: their updates do not change the forward pass).
        """
        h = self.embed(idx)
        n = h.size(2)
        product = torch.eye(n, device=idx.device).expand(*h.shape[:2], n, n)  # (B,T,n,n)
        gate_mean, gate_resets, gate_clipped = [], [], []
        for block in self.transformer.h:
            for topology, sublayer in ((block.attn_topology, block.attn_sublayer),
                                       (block.mlp_topology, block.mlp_sublayer)):
                mix = topology.mix_matrix(h)
                if mix is not None:
                    product = mix.float() @ product
                if isinstance(topology, residuals.GatedIHC):
                    logits = topology.coefficients(h)[2]  # (B,T,K)
                    g = topology.gate(logits)  # (B,T,n), or (B,T,1) for mean_gated_ihc
                    gate_mean.append(g.mean().item())
                    gate_resets.append((g < 0.01).float().mean().item())
                    gate_clipped.append(topology.gate_held(logits).float().mean().item())
                h = topology(h, sublayer)
        singular = torch.linalg.svdvals(product)  # (B,T,n)
        total = singular.sum(-1, keepdim=True)
        rank = torch.special.entr(singular / total.clamp_min(1e-30)).sum(-1).exp()  # 1 to n; 0 for P = 0
        rank = torch.where(total.squeeze(-1) > 0, rank, 0.0)
        report = dict(gain_forward=product.abs().sum(-1).max().item(), gain_backward=product.abs().sum(-2).max().item(),
                      gain_mean_direction=(product.sum(-1).norm(dim=-1) / math.sqrt(n)).mean().item(),
                      effective_rank=rank.mean().item())
        if gate_mean:
            report.update(gate_mean=gate_mean, gate_reset_fraction=gate_resets, gate_logits_clipped=gate_clipped)
        return report

    def forward(self, idx, targets=None):
        x = self.transformer.ln_f(self.residual_state(idx).mean(2))  # (B,T,C)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])  # inference: only the last position
            loss = None
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW; decayed: the projection matrices (Linear weights, embeddings, the
        topologies' W). Not decayed: biases, norms, and the topologies' static
        parameters (biases b_*, scales a_* / s, HC's static pre / post / A_r)."""
        params = {name: p for name, p in self.named_parameters() if p.requires_grad}
        decay = [p for name, p in params.items() if p.dim() >= 2 and "_static" not in name]
        no_decay = [p for name, p in params.items() if not (p.dim() >= 2 and "_static" not in name)]
        ids = [id(p) for p in decay + no_decay]
        assert len(ids) == len(set(ids)) == len(params), "every parameter must be in exactly one optimizer group"
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        use_fused = device_type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **({"fused": True} if use_fused else {}))

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        """Extend idx (B,T) by max_new_tokens sampled tokens, feeding predictions back in."""
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= self.config.block_size else idx[:, -self.config.block_size:]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("Inf")
            probs = F.softmax(logits, dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, num_samples=1, generator=generator)), dim=1)
        return idx
