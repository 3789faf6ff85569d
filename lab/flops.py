"""
Training FLOPs per token, counted from the shapes: what a step of each topology
costs in arithmetic, whatever a machine makes of it. The 48-layer decomposition
study (compare.py --preset=depth48_decomp) trains the residual for the
iterations that hc's FLOPs per step buy.

    python -m lab.flops                          # the depth sweep's 48 x 64 model
    python -m lab.flops --n_layer=12 --n_streams=2

The count, per token, forward (a multiply-add is 2 FLOPs):
  residual GPT  2 * (12 L C^2 + 2 L T C + V C): nanoGPT's count, the Linear weights
                (attention 4 C^2, MLP 8 C^2), attention's QK^T and AV over the
                block T, the LM head; plus the LayerNorms (5 C each) and the
                residual adds (C per sublayer).
  hc            per sublayer, on top: the RMSNorm of each stream (3 n C), its
                projection onto the n + 2 coefficients (2 n C (n + 2)), their tanh
                and scales (2 n (n + 2)), the read (2 n C), the mix (2 n^2 C), the
                write of post y (2 n C), less the residual's add (C); and the
                average of the n streams before the final norm (n C).
Training counts 3 times the forward (the backward, twice the forward), for
every part alike, as nanoGPT's 6 N does.
"""


def residual_forward_flops(n_layer, n_embd, block_size, vocab_size):
    """The plain residual GPT's forward FLOPs per token."""
    L, C, T, V = n_layer, n_embd, block_size, vocab_size
    matmuls = 2 * (12 * L * C * C + 2 * L * T * C + V * C)
    return matmuls + 5 * C * (2 * L + 1) + C * 2 * L  # LayerNorms (two per block, one final), residual adds


def hc_extra_forward_flops(n_layer, n_embd, n_streams):
    """What hc adds to the residual GPT's forward FLOPs per token."""
    L, C, n = n_layer, n_embd, n_streams
    per_sublayer = 3 * n * C + 2 * n * C * (n + 2) + 2 * n * (n + 2) + 2 * n * C + 2 * n * n * C + 2 * n * C - C
    return 2 * L * per_sublayer + n * C


def hc_step_ratio(n_layer, n_embd, block_size, vocab_size, n_streams):
    """hc's training FLOPs per step over the residual's (the factor 3 cancels)."""
    base = residual_forward_flops(n_layer, n_embd, block_size, vocab_size)
    return (base + hc_extra_forward_flops(n_layer, n_embd, n_streams)) / base


def flop_matched_iters(max_iters, **shape):
    """The residual's iterations that cost what hc's max_iters do."""
    return round(max_iters * hc_step_ratio(**shape))


if __name__ == "__main__":
    from configurator import check_settings, configure

    n_layer, n_embd, block_size, vocab_size, n_streams = 48, 64, 64, 65, 4  # train.py's CPU block, the characters
    max_iters = 1000
    configure(globals())
    check_settings(globals(), {k: "[1, inf)" for k in ("n_layer", "n_embd", "block_size", "vocab_size", "n_streams",
                                                          "max_iters")})
    shape = dict(n_layer=n_layer, n_embd=n_embd, block_size=block_size, vocab_size=vocab_size)
    base = 3 * residual_forward_flops(**shape)
    extra = 3 * hc_extra_forward_flops(n_layer, n_embd, n_streams)
    print(f"{n_layer} x {n_embd}, block {block_size}, vocab {vocab_size}: training FLOPs per token")
    print(f"  residual  {base / 1e6:.3f} M")
    print(f"  hc (n={n_streams})  {(base + extra) / 1e6:.3f} M  ({(base + extra) / base:.4f}x)")
    print(f"  the residual's iterations at hc's cost for {max_iters}: "
          f"{flop_matched_iters(max_iters, n_streams=n_streams, **shape)}")
