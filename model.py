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
import variants  # noqa: F401  (it registers the study variants in RESIDUALS)
from residuals import RESIDUALS


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
        Topology = config.topology
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)
        self.attn_topology = Topology(config, 2 * layer, ops)  # sublayer index k = 2 * layer
        self.mlp_topology = Topology(config, 2 * layer + 1, ops)

    def attn_sublayer(self, x):  # x (B,T,C): the read of the state, computed in the weights' dtype
        return self.attn(self.ln_1(x.to(self.ln_1.weight.dtype)))

    def mlp_sublayer(self, x):
        return self.mlp(self.ln_2(x.to(self.ln_2.weight.dtype)))

    def forward(self, h, x0):  # h (B,T,n,C) in the state's dtype, x0 (B,T,C) the embedding
        # Each new state is stored in the state's dtype: a bf16 state (state_dtype) computed in
        # float32 is rounded once here; a float32 state is left as it is.
        h = self.attn_topology(h, self.attn_sublayer, x0).to(h.dtype)
        return self.mlp_topology(h, self.mlp_sublayer, x0).to(h.dtype)


@dataclass
class GPTConfig:
    """nanoGPT's model, and the residual topology; checkpoints keep these as model_args.
    Made, it has resolved its defaults and checked itself (a ValueError in one line)."""
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # bias in Linears and LayerNorms, as GPT-2
    residual: str = "residual"  # a topology (residuals.py) or a study variant (variants.py): a key of RESIDUALS
    n_streams: int = 0  # n, the number of residual streams; 0: the topology's default_n_streams
    alpha_init: float = 0.01  # initial a_* (mHC) and s (HC) coefficient scales
    sinkhorn_iters: int = 20  # mhc
    kernels: str = "fused"  # implementation of the stream ops: one of KERNELS (see stream_ops)
    state_dtype: str = "float32"  # the residual state's storage, one of STATE_DTYPES; its arithmetic stays float32

    @property
    def topology(self):
        """The class that --residual names."""
        return RESIDUALS[self.residual]

    def __post_init__(self):
        """A setting the topology does not read (alpha_init for residual, sinkhorn_iters
        but for mhc) is an error when set, never silently ignored."""
        if self.residual not in RESIDUALS:
            raise ValueError(f"unknown residual '{self.residual}'; choose one of: {', '.join(RESIDUALS)}")
        self.n_streams = self.n_streams or self.topology.default_n_streams
        lo, hi = self.topology.n_streams_allowed
        if not lo <= self.n_streams <= hi:
            allowed = f"exactly {lo}" if lo == hi else f"from {lo} to {hi}"
            raise ValueError(f"residual '{self.residual}' needs n_streams {allowed}, got {self.n_streams}")
        unused = [key for key in ("alpha_init", "sinkhorn_iters")
                  if getattr(self, key) != self.__dataclass_fields__[key].default and key not in self.topology.settings]
        if unused:
            raise ValueError(f"{', '.join(unused)}: '{self.residual}' does not use it; it applies to "
                             + ", ".join(name for name, T in RESIDUALS.items() if unused[0] in T.settings))
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        if self.kernels not in KERNELS:
            raise ValueError(f"unknown kernels '{self.kernels}'; choose one of: {', '.join(KERNELS)}")
        if self.state_dtype not in STATE_DTYPES:
            raise ValueError(f"unknown state_dtype '{self.state_dtype}'; choose one of: {', '.join(STATE_DTYPES)}")


KERNELS = ("reference", "fused", "triton")
# float32: the state in the model's own dtype; bfloat16: stored in bf16 (half the bytes of
# the n-times-wider state that every stream op moves), computed in float32 between stores.
STATE_DTYPES = ("float32", "bfloat16")


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
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
        """Token + position embedding x0 (B,T,C) from idx (B,T)."""
        B, T = idx.size()
        assert T <= self.config.block_size, f"sequence of {T} tokens is longer than block_size {self.config.block_size}"
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        return self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))

    def streams(self, x0):
        """The residual state at the first Block: n equal copies of x0, (B,T,n,C), in the state's dtype.
        Copied, not an expand()ed view: then every Block gets a state of one layout, and
        torch.compile makes one graph for them all (a view would need its own, the first Block's)."""
        dtype = torch.bfloat16 if self.config.state_dtype == "bfloat16" else x0.dtype
        return x0.to(dtype).unsqueeze(2).expand(*x0.shape[:2], self.config.n_streams, x0.size(-1)).contiguous()

    def residual_state(self, idx):
        """The residual state after the last Block: (B,T,n,C)."""
        x0 = self.embed(idx)
        h = self.streams(x0)
        for block in self.transformer.h:
            h = block(h, x0)
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
        holds (where the gate before its clip leaves [0, 1]: updates there change nothing).
        """
        states = []  # (topology, the state h the forward gave it), in the order the forward runs them
        hooks = [t.register_forward_pre_hook(lambda t, args: states.append((t, args[0]))) for t in self.topologies()]
        try:
            with torch.compiler.set_stance("force_eager"):  # compiled Blocks would recompile for the hooks
                self.residual_state(idx)
        finally:
            for hook in hooks:
                hook.remove()
        n = self.config.n_streams
        product = torch.eye(n, device=idx.device).expand(*idx.shape, n, n)  # (B,T,n,n)
        gate_mean, gate_resets, gate_clipped = [], [], []
        for topology, h in states:
            mix = topology.mix_matrix(h)
            if mix is not None:  # in float32 under bf16 autocast too: a gain, and svdvals has no CUDA bf16
                with torch.autocast(idx.device.type, enabled=False):
                    product = mix.float() @ product
            if topology.gates:
                logits = topology.coefficients(h)[2]  # (B,T,K)
                g = topology.gate(logits)  # (B,T,n), or (B,T,1) for mean_gated_ihc
                gate_mean.append(g.mean().item())
                gate_resets.append((g < 0.01).float().mean().item())
                f = topology.unclipped(logits)  # the clip holds where f leaves [0, 1]
                gate_clipped.append(((f < 0) | (f > 1)).float().mean().item())
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
        x = self.transformer.ln_f(self.residual_state(idx).mean(2, dtype=self.lm_head.weight.dtype))  # (B,T,C)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])  # inference: only the last position
            loss = None
        return logits, loss

    def compile_blocks(self, **options):
        """torch.compile each Block in place (regional compilation, --compile=True). Every
        Block runs the same code, so its compiled graph is made once and reused for every
        layer, their weights its inputs; compiling the whole model instead traces all
        layers into one graph, minutes at 48 layers. The embedding, head and loss stay
        eager, and the state dict's names do not change. options: torch.compile's."""
        for block in self.transformer.h:
            block.compile(**options)

    def topologies(self):
        """Every sublayer's topology, in the order the forward runs them."""
        return [topology for block in self.transformer.h for topology in (block.attn_topology, block.mlp_topology)]

    def topology_parameters(self, kind):
        """The parameters every sublayer's topology names as its `kind`: "gates" (the gate
        logits' parameters) or "scales" (a gate's logits, a skip or branch scale, hc's
        statics); [] if none."""
        return [getattr(topology, name) for topology in self.topologies() for name in getattr(topology, kind)]

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type, scale_lr_mult=1.0):
        """AdamW; decayed: the projection matrices (Linear weights, embeddings, the
        topologies' W). Not decayed: biases, norms, and the topologies' static
        parameters (biases b_*, scales a_* / s, HC's static pre / post / A_r). The
        topologies' scales (topology_parameters) get groups of their own whose rate is
        scale_lr_mult times the rest's: each group's lr_mult, which train.py
        multiplies its scheduled rate by."""
        params = {name: p for name, p in self.named_parameters() if p.requires_grad}
        decayed = lambda name, p: p.dim() >= 2 and "_static" not in name
        scale_ids = {id(p) for p in self.topology_parameters("scales")}
        groups = [{"params": [p for name, p in params.items() if decayed(name, p) == decay
                              and (id(p) in scale_ids) == scaled],
                   "weight_decay": weight_decay if decay else 0.0, "lr_mult": scale_lr_mult if scaled else 1.0}
                  for scaled in (False, True) for decay in (True, False)]
        groups = [group for group in groups if group["params"]]
        ids = [id(p) for group in groups for p in group["params"]]
        assert len(ids) == len(set(ids)) == len(params), "every parameter must be in exactly one optimizer group"
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
    if name == "reference":
        return residuals
    raise ValueError(f"unknown kernels '{name}'; choose one of: {', '.join(KERNELS)}")
