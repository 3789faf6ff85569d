"""
The counterexample, learned: seed 000's reset-and-reuse (its section 4) as a
training experiment, with the real topology classes of residuals.py.

The target y = x1 + x2 + phi(phi(x1 - x2)), phi(t) = t^2 sigmoid(t), is computed
exactly by a two-layer, two-stream stream net whose first mixer J = e e^T / 2
erases the zero-sum direction q = (1, -1) and whose first block writes phi(x1 - x2)
into the freed direction for the second block to read (theory.counterexample_mhc).
A pure iHC of the same shape cannot compute it exactly (the seed's proof). Here
the same shape is built from residuals.py's classes, trained, and asked: does
training find the reset, and does it reach the loss the construction has?

The network, per topology (ihc, gated_ihc, norm_gated_ihc, mhc, hc; n = 2 streams
of width C = 1, in float64):

    h_0 = E x                         E (2, 2), learned, starts at I (theory's embed)
    h_1 = Topology_0(h_0, G_1)        G_l: a scalar no-bias SwiGLU of width `width`,
    h_2 = Topology_1(h_1, G_2)             theory.swiglu, weights 0.5 N(0, 1) as theory.fit_pure_ihc
    o   = c . h_2                     c (2,), learned, starts at (1, 1) (the seed's stream sum)

each Topology at its own init (GPTConfig's defaults, as train.py builds it). The
embedding is learned because every class but hc reads and writes with positive
weights (sigmoid pre, 2 sigmoid post): with E = I they could not read x1 - x2 at all.

The construction wired into the classes (`construction`): hc has signed static
reads, writes and mixers, so seed 000's construction is its parameters exactly
(loss 0 up to rounding). gated_ihc and norm_gated_ihc reset a stream exactly (the
gate's clip reaches 0), but their positive reads see every stream: the second block
reads the stream that carries x1 + x2 with weight sigmoid(-K), so the construction
has loss O(sigmoid(-K)^2): 0 only as K -> inf, an infimum. With static positive
reads no wiring whose second block reads phi(x1 - x2) alone is exact at n = 2: the
x1 + x2 that survives layer 0 would have to cancel in that read, which takes both
streams alive, so no reset; and mhc's only rank-deficient 2 x 2 mixer is J, whose
mean survives every positive read. So no construction is wired for mhc; mhc and
ihc are compared with theory's (loss 0). On a bounded box no class has a positive
floor, though: ihc, which cannot reset, comes within O(1/t) of the target by writing
phi(x1 - x2) at scale t and reading it back at 1/t, where the raw x1 - x2 it cannot
erase weighs 1/t (`ihc_without_reset`). What the reset buys is the target at finite
weights (hc), or within sigmoid(-K) at a finite logit (the gates), not a lower floor.

Data: per seed s, `points` training and `test_points` test inputs x uniform in
[-lim, lim]^2 (torch.Generator seeded s and s + 10^6), the network's random
weights from seed s: every topology sees the same data and the same draws. Adam
(no weight decay), full batch, `steps` steps, cosine decay to 0. Each topology's
rate is the one of `rates` with the lowest final test MSE on `tuning_seed`; a best
rate at an end of the grid adds the next rate beyond it (up to `extend` times).
Then seeds 1..`seeds` at that rate. Reported: the final test MSE, paired over seeds
against the construction's (stats.paired), and at layer 0 the carry map
M(x) = MIX_0(h_0(x)) E: its sigma_min / sigma_max (0: a direction of x is reset)
and |cos| between its most-erased direction and q (1: the zero-sum direction,
as in the construction), medians over the test points, and for the gated
topologies how many points have a layer-0 gate (or both) exactly 0.

    python -m lab.counterexample                       # the study (minutes, one core)
    python -m lab.counterexample --steps=200 --seeds=2 --rates=0.03 --out_dir=/tmp/cx   # a quick look

Writes <out_dir>/results.md (the tables, the command, the machine) and
<out_dir>/counterexample.png (loss curves, layer-0 gates, reset and alignment).
"""
import math
import os
import shlex
import statistics
import sys
import time

import matplotlib
import torch
import torch.nn as nn

import theory
from configurator import check_settings, configure, fail
from model import GPTConfig, stream_ops
from residuals import TOPOLOGIES
from lab.machine import cpu_name
from lab.stats import grid_table, paired, paired_cell

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DT = torch.float64
Q_DIRECTION = torch.tensor([1.0, -1.0], dtype=DT) / math.sqrt(2)  # q / |q|, the zero-sum direction

# -----------------------------------------------------------------------------
topologies = "ihc,gated_ihc,norm_gated_ihc,mhc,hc"  # residuals.py names, comma-separated
seeds = 5  # comparison seeds 1..seeds
tuning_seed = 0  # the held-out seed the learning rates are chosen on
rates = "0.003,0.01,0.03,0.1"  # the learning-rate grid
extend = 2  # how many times a grid may grow past an end
steps = 1500  # Adam steps, full batch
points = 512  # training inputs per seed
test_points = 4096  # test inputs per seed
lim = 2.0  # x uniform in [-lim, lim]^2, as theory.fit_pure_ihc
width = 4  # hidden width of each scalar SwiGLU sublayer, as theory.fit_pure_ihc
log_every = 25  # steps between the curves' points
probe_points = 256  # test inputs the curves' reset measures are taken on
read_logit = 30.0  # K: the gated constructions read the x1 + x2 stream with weight sigmoid(-K)
out_dir = "lab/results/counterexample"  # relative to the repository root
RANGES = dict(seeds="[1, inf)", tuning_seed="[0, inf)", extend="[0, inf)", steps="[1, inf)", points="[1, inf)",
              test_points="[2, inf)", lim="(0, inf)", width="[1, inf)", log_every="[1, inf)",
              probe_points="[1, test_points]", read_logit="(0, inf)")
# -----------------------------------------------------------------------------


class CounterexampleNet(nn.Module):
    """x (B, 2) -> o (B,): E, two topology-wrapped scalar SwiGLU sublayers, the head c."""

    def __init__(self, residual, width, gen):
        super().__init__()
        config = GPTConfig(n_layer=1, n_head=1, n_embd=1, residual=residual, n_streams=2)
        self.embed = nn.Parameter(torch.eye(2, dtype=DT))  # E
        self.head = nn.Parameter(torch.ones(2, dtype=DT))  # c
        shapes = [(width, 1), (width, 1), (1, width)]  # W_gate, W_up, W_down (theory.swiglu)
        self.blocks = nn.ParameterList([nn.Parameter(0.5 * torch.randn(*s, generator=gen, dtype=DT))
                                        for _ in range(2) for s in shapes])
        ops = stream_ops(config.kernels)  # fused.py: residuals.py's maths, fast on a CPU
        self.topologies = nn.ModuleList(config.topology(config, i, ops) for i in range(2)).to(DT)

    def block(self, l):
        return theory.swiglu(*self.blocks[3 * l:3 * l + 3])

    def state0(self, x):
        return (x @ self.embed.T)[:, None, :, None]  # h_0 = E x, (B,T=1,n=2,C=1)

    def forward(self, x):
        h = self.state0(x)
        for l, topology in enumerate(self.topologies):
            h = topology(h, self.block(l), None)  # no topology here reads the embedding x0
        return h[:, 0, :, 0] @ self.head  # (B,2) @ (2,)

    def carry(self, x):
        """M(x) = MIX_0(h_0(x)) E (B, 2, 2): what layer 0's residual path keeps of x."""
        mix = self.topologies[0].mix_matrix(self.state0(x))  # (B,1,2,2), or None for the identity
        return self.embed.expand(len(x), 2, 2) if mix is None else mix[:, 0] @ self.embed

    def gates0(self, x):
        """Layer 0's gates g (B, 2) for the gated topologies, else None."""
        topology = self.topologies[0]
        if not topology.gates:
            return None
        return topology.gate(topology.coefficients(self.state0(x))[2])[:, 0]


def data(seed, count, offset=0):
    """count inputs x uniform in [-lim, lim]^2 and their targets, from seed + offset."""
    gen = torch.Generator().manual_seed(seed + offset)
    x = (2 * torch.rand(count, 2, generator=gen, dtype=DT) - 1) * lim
    return x, theory.counterexample_target(x[:, :, None])


def split(seed):
    """(x, y) for training and for testing at one seed: disjoint draws."""
    return data(seed, points), data(seed, test_points, offset=10 ** 6)


def mse(net, x, y):
    return (net(x) - y).square().mean()


def reset_measures(net, x):
    """Medians over x of layer 0's sigma_min / sigma_max (0 where the carry is 0: all
    of x erased) and of |cos(most-erased direction, q)| (over the x where that direction
    is defined: sigma_min < sigma_max); the fractions of x with a layer-0 gate, and with
    both, exactly 0 (nan without gates); the median of the lower gate."""
    with torch.no_grad():
        _, sigma, Vh = torch.linalg.svd(net.carry(x))  # sigma descending; Vh's last row: the most-erased x
        ratio = torch.where(sigma[:, 0] > 0, sigma[:, 1] / sigma[:, 0], 0.0).median().item()
        cos = (Vh[:, 1] @ Q_DIRECTION).abs()
        cos = torch.where(sigma[:, 1] < sigma[:, 0], cos, math.nan).nanmedian().item()
        gates = net.gates0(x)
        if gates is None:
            return dict(ratio=ratio, cos=cos, reset=math.nan, reset_all=math.nan, low_gate=math.nan)
        reset, reset_all = ((gates == 0).any(-1).double().mean().item(), (gates == 0).all(-1).double().mean().item())
    return dict(ratio=ratio, cos=cos, reset=reset, reset_all=reset_all, low_gate=gates.min(-1).values.median().item())


# --- the construction, wired into the classes ----------------------------------


def set_block(net, l, scale_in, scale_out):
    """G_l(z) = scale_out phi(scale_in z): width-1 SwiGLU silu(a z) (a z) b, the other units 0."""
    with torch.no_grad():
        W_gate, W_up, W_down = net.blocks[3 * l:3 * l + 3]
        for W in (W_gate, W_up, W_down):
            W.zero_()
        W_gate[0, 0] = W_up[0, 0] = scale_in
        W_down[0, 0] = scale_out


def construction(residual, K=30.0):
    """A CounterexampleNet wired to compute the target: exactly for hc, up to a read of
    weight sigmoid(-K) for gated_ihc and norm_gated_ihc (see the module docstring).
    Every dynamic projection is 0, so each coefficient is its static part."""
    net = CounterexampleNet(residual, 1, torch.Generator().manual_seed(0))
    t0, t1 = net.topologies
    with torch.no_grad():
        for t in net.topologies:
            for name, p in t.named_parameters():
                if "proj" in name:
                    p.zero_()
        if residual == "hc":  # seed 000 section 4, term by term: reads q, q/2; writes q, e/2; mixers J, I
            t0.pre_static.copy_(torch.tensor([1.0, -1.0]))
            t0.post_static.copy_(torch.tensor([1.0, -1.0]))
            t0.mix_static.fill_(0.5)  # A_r = J, and MIX = A_r^T = J
            t1.pre_static.copy_(torch.tensor([0.5, -0.5]))
            t1.post_static.copy_(torch.tensor([0.5, 0.5]))
            t1.mix_static.copy_(torch.eye(2))
            set_block(net, 0, 1.0, 1.0)
            set_block(net, 1, 1.0, 1.0)  # E = I and c = (1, 1) from the init
            return net
        if not t0.gates:
            raise ValueError(f"no construction wired for '{residual}' (see the module docstring)")
        # Stream 1 carries Q = x1 - x2 (and reset at layer 0), stream 2 carries S = x1 + x2.
        t0.bias.copy_(torch.tensor([0.0, -K, 0.0, 0.0]))  # pre_0 = (1/2, sigmoid(-K)), post_0 = (1, 1)
        t0.gate_bias.copy_(torch.tensor([-5.0, 5.0]))  # g_0 = (0, 1): the clip holds both
        t1.bias.copy_(torch.tensor([0.0, -K, 0.0, math.log(3)]))  # pre_1 = pre_0, post_1 = (1, 3/2)
        t1.gate_bias.copy_(torch.tensor([5.0, 5.0]))  # g_1 = (1, 1)
        h = torch.ones(1, 1, 2, 1, dtype=DT)  # any state: the coefficients are static
        (pre0, post0, res0), (pre1, post1, res1) = (
            [c[0, 0] for c in t.coefficients(h)] for t in net.topologies)
        m0, m1 = t0.mix(res0[None, None])[0, 0], t1.mix(res1[None, None])[0, 0]  # diagonals
        assert m0[0] == 0 and m0[1] > 0, m0
        # h_0 = (Q - pre0_2 / (pre0_1 m0_2) S, S / m0_2): the first read is pre0_1 Q exactly
        a = pre0[1] / (pre0[0] * m0[1])
        net.embed.copy_(torch.stack([torch.stack([1 - a, -1 - a]), torch.stack([1 / m0[1], 1 / m0[1]])]))
        set_block(net, 0, 1 / pre0[0], 1.0)  # y_0 = phi(Q); h_1 = (post0_1 phi, S + post0_2 phi)
        read1 = pre1[0] * post0[0] + pre1[1] * post0[1]  # the second read: read1 phi(Q) + pre1_2 S
        # o = c . (m1 h_1 + post_1 y_1): S's coefficient 1, phi(Q)'s 0, y_1's kappa
        c2 = 1 / m1[1]
        c1 = -c2 * m1[1] * post0[1] / (m1[0] * post0[0])
        net.head.copy_(torch.stack([c1, c2]))
        set_block(net, 1, 1 / read1, 1 / (c1 * post1[0] + c2 * post1[1]))
    return net


def ihc_without_reset(t):
    """ihc within O(1/t) of the target, no reset: layer 0 writes t phi(Q) along post_0, the
    head is orthogonal to post_0 (so it never shows), and layer 1 reads it back at 1/t,
    where the raw x it cannot erase weighs only 1/t. Shows that ihc's floor on a
    bounded box is 0 too, approached as a weight grows (MSE ~ 1/t^2)."""
    net = CounterexampleNet("ihc", 1, torch.Generator().manual_seed(0))
    t0, t1 = net.topologies
    with torch.no_grad():
        for topology in net.topologies:
            topology.proj.zero_()
        t1.bias[3] = math.log(3)  # post_1 = (1, 3/2), not parallel to post_0 = (1, 1)
        h = torch.ones(1, 1, 2, 1, dtype=DT)  # any state: the coefficients are static
        (pre0, post0, _), (pre1, post1, _) = ([c[0, 0] for c in t.coefficients(h)] for t in net.topologies)
        c = torch.stack([post0[1] / post0[0], -torch.ones((), dtype=DT)])  # c . post_0 = 0
        # E^T c = e (the linear part S) and E^T pre_0 = q (layer 0 reads Q)
        targets = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=DT).T  # columns e, q
        net.embed.copy_((targets @ torch.linalg.inv(torch.stack([c, pre0], 1))).T)
        net.head.copy_(c)
        set_block(net, 0, 1.0, t)  # y_0 = t phi(Q)
        set_block(net, 1, 1 / (t * (pre1 @ post0)), 1 / (c @ post1))  # reads phi(Q) + O(1/t)
    return net


def reference_loss(x, y):
    """theory.counterexample_mhc's MSE (static signed reads, exact): the loss to reach."""
    return (theory.forward(theory.counterexample_mhc(), x[:, :, None])[:, 0, 0] - y).square().mean().item()


def construction_loss(residual, x, y, K):
    """The construction's MSE in this class, or theory's where none is wired."""
    if residual == "hc" or TOPOLOGIES[residual].gates:
        with torch.no_grad():
            return mse(construction(residual, K), x, y).item()
    return reference_loss(x, y)


# --- training -----------------------------------------------------------------


def train_one(residual, seed, lr):
    """One run: Adam, full batch, cosine decay. Returns the curves and the final losses;
    a run whose loss stops being finite is cut there, its test loss infinite."""
    (x, y), (x_test, y_test) = split(seed)
    net = CounterexampleNet(residual, width, torch.Generator().manual_seed(seed))
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    curve = []
    for step in range(steps + 1):
        loss = mse(net, x, y)
        if not math.isfinite(loss.item()):
            return dict(curve=curve, train=math.inf, test=math.inf, **reset_measures(net, x_test))
        if step % log_every == 0 or step == steps:
            curve.append(dict(step=step, loss=loss.item(), **reset_measures(net, x_test[:probe_points])))
        if step == steps:
            break
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    with torch.no_grad():
        test = mse(net, x_test, y_test).item()
    return dict(curve=curve, train=curve[-1]["loss"], test=test, **reset_measures(net, x_test))


def tune(residual, grid):
    """{rate: final test MSE on the tuning seed}; the grid grows past an end that wins."""
    grid, losses = list(grid), {}
    for growth in range(extend + 1):
        for rate in grid:
            if rate not in losses:
                losses[rate] = train_one(residual, tuning_seed, rate)["test"]
                print(f"{residual}: tuning seed {tuning_seed}, lr {rate:g}: test MSE {losses[rate]:.4g}", flush=True)
        best = min(grid, key=losses.get)
        if growth == extend or best not in (grid[0], grid[-1]) or len(grid) < 2:
            return losses
        grid.insert(0, float(f"{grid[0] ** 2 / grid[1]:.3g}")) if best == grid[0] else grid.append(
            float(f"{grid[-1] ** 2 / grid[-2]:.3g}"))
    return losses


# --- the report -----------------------------------------------------------------


def fmt(v):
    return "diverged" if v == math.inf else "n/a" if math.isnan(v) else f"{v:.3g}"


def main_table(names, chosen, runs, floors):
    lines = ["| topology | lr | test MSE, mean (sd) | log10 test MSE, mean | construction's MSE | "
             "minus the construction's, mean [95% CI], p, signs | minus ihc's | sigma_min/sigma_max | "
             "abs cos(erased, q) | points with a gate at 0 (both) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        tests = [r["test"] for r in runs[name]]
        sd = statistics.stdev(tests) if len(tests) > 1 else math.nan
        vs_floor = paired_cell(paired([t - f for t, f in zip(tests, floors[name])]), "+.3g")
        vs_ihc = ("" if name == "ihc" or "ihc" not in runs else
                  paired_cell(paired([t - b["test"] for t, b in zip(tests, runs["ihc"])]), "+.3g"))
        log10 = statistics.mean(math.log10(t) for t in tests)
        med = {k: statistics.median(r[k] for r in runs[name]) for k in ("ratio", "cos", "reset", "reset_all")}
        lines.append(f"| `{name}` | {chosen[name]:g} | {fmt(statistics.mean(tests))} ({fmt(sd)}) | {log10:.2f} | "
                     f"{fmt(statistics.mean(floors[name]))} | {vs_floor} | {vs_ihc} | {med['ratio']:.3f} | "
                     f"{med['cos']:.3f} | {fmt(med['reset'])} ({fmt(med['reset_all'])}) |")
    return "\n".join(lines)


def seed_table(names, runs):
    lines = ["| topology | " + " | ".join(f"seed {s}" for s in range(1, seeds + 1)) + " |",
             "|" + "---|" * (seeds + 1)]
    for name in names:
        lines.append(f"| `{name}` | " + " | ".join(fmt(r["test"]) for r in runs[name]) + " |")
    return "\n".join(lines)


def construction_table(x, y):
    """The construction wired into each class, on seed 1's test points, at three K."""
    Ks = (10.0, 20.0, read_logit)
    lines = ["| class | " + " | ".join(f"K = {K:g}" for K in Ks) + " |", "|---|---|---|---|"]
    for name in ("hc", "gated_ihc", "norm_gated_ihc"):
        lines.append(f"| `{name}` | " + " | ".join(fmt(construction_loss(name, x, y, K)) for K in Ks) + " |")
    lines.append("| theory.counterexample_mhc (signed reads) | " + " | ".join(
        [fmt(reference_loss(x, y))] * len(Ks)) + " |")
    ts = (1e2, 1e4, 1e6)
    lines += ["", "| ihc, no reset (`ihc_without_reset`) | " + " | ".join(f"t = {t:g}" for t in ts) + " |",
              "|---|---|---|---|"]
    with torch.no_grad():
        losses = [mse(ihc_without_reset(t), x, y).item() for t in ts]
    lines.append("| `ihc` | " + " | ".join(fmt(v) for v in losses) + " |")
    return "\n".join(lines)


def draw(names, runs, path):
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.5))
    colors = dict(zip(names, plt.cm.tab10.colors))
    keys = ("loss", "low_gate", "ratio", "cos")
    titles = ("training MSE (median over seeds; band: min to max)",
              "layer 0: the lower of the two gates (median over points)",
              "layer 0 carry: sigma_min / sigma_max (0: a reset)",
              "layer 0 carry: abs cos(most-erased direction, q)")
    for name in names:
        steps_ = [row["step"] for row in runs[name][0]["curve"]]
        for ax, key in zip(axes, keys):
            values = [[row[key] for row in r["curve"]] for r in runs[name] if len(r["curve"]) == len(steps_)]
            if not values or all(math.isnan(v) for v in values[0]):
                continue
            columns = list(zip(*values))
            ax.plot(steps_, [statistics.median(c) for c in columns], color=colors[name], label=name)
            if key == "loss":
                ax.fill_between(steps_, [min(c) for c in columns], [max(c) for c in columns],
                                color=colors[name], alpha=0.15)
    axes[0].set_yscale("log")
    for ax, title in zip(axes, titles):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
    axes[0].legend()
    fig.suptitle(f"y = x1 + x2 + phi(phi(x1 - x2)), x in [-{lim:g}, {lim:g}]^2, n = 2 streams: "
                 f"{seeds} seeds, each topology at its own rate", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def machine():
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    return (f"{cpu_name()}, {os.cpu_count()} cores (load average at the end {load}: other jobs shared them), "
            f"torch {torch.__version__}, {torch.get_num_threads()} thread")


def main():
    names = topologies.split(",")
    unknown = [name for name in names if name not in TOPOLOGIES or name == "residual"]
    if unknown:
        fail(f"--topologies: unknown or one-stream {', '.join(unknown)}; choose from "
             f"{', '.join(n for n in TOPOLOGIES if n != 'residual')}")
    try:
        grid = sorted(float(r) for r in rates.split(","))
    except ValueError:
        fail(f"--rates={rates}: expected comma-separated numbers, e.g. 0.003,0.01,0.03")
    torch.set_num_threads(1)  # ops this small only lose time to threading
    started = time.time()
    tuned, chosen, runs = {}, {}, {}
    for name in names:
        tuned[name] = tune(name, grid)
        chosen[name] = min(tuned[name], key=tuned[name].get)
        runs[name] = []
        for seed in range(1, seeds + 1):
            runs[name].append(train_one(name, seed, chosen[name]))
            r = runs[name][-1]
            print(f"{name}: seed {seed}, lr {chosen[name]:g}: test MSE {r['test']:.4g}, "
                  f"sigma ratio {r['ratio']:.3g}, cos {r['cos']:.3f}, gate at 0 {fmt(r['reset'])} "
                  f"(both {fmt(r['reset_all'])})", flush=True)
    floors = {name: [construction_loss(name, *split(seed)[1], read_logit) for seed in range(1, seeds + 1)]
              for name in names}
    minutes = (time.time() - started) / 60
    (x1, y1) = split(1)[1]
    table = main_table(names, chosen, runs, floors)
    print(table)
    folder = os.path.join(ROOT, out_dir)
    os.makedirs(folder, exist_ok=True)
    draw(names, runs, os.path.join(folder, "counterexample.png"))
    text = f"""# The counterexample, learned

Written by `lab/counterexample.py` (its docstring says what it does and why); do not edit.

    {" ".join(["python -m lab.counterexample", *map(shlex.quote, sys.argv[1:])])}

Machine: {machine()}; {minutes:.1f} minutes.

Target y = x1 + x2 + phi(phi(x1 - x2)), phi(t) = t^2 sigmoid(t); x uniform in [-{lim:g}, {lim:g}]^2,
{points} training and {test_points} test points per seed (target variance on seed 1's test points
{y1.var().item():.4g}); n = 2 streams of width 1, two sublayers (scalar no-bias SwiGLU of width {width}),
learned embedding E and head c, float64. Adam, full batch, {steps} steps, cosine decay to 0.
Rates chosen on seed {tuning_seed}; comparison seeds 1..{seeds}.

## Test MSE at each topology's chosen rate

The construction's MSE: seed 000's construction wired into that class (hc exactly;
gated_ihc and norm_gated_ihc reading the x1 + x2 stream with weight sigmoid(-{read_logit:g})),
or, where no wiring exists (ihc, mhc), theory.counterexample_mhc's. Differences are paired
over seeds: mean [95% interval, Student's t], two-sided paired t-test, per-seed signs
(-: the topology lower). The last four columns: layer 0's carry M(x) = MIX_0 E and gates,
medians over the test points, then over seeds (the docstring's reset measures).

{table}

## Per seed: test MSE

{seed_table(names, runs)}

## The learning-rate grid (test MSE on seed {tuning_seed})

{grid_table(tuned, spec=".3g", row="topology")}

## The construction wired into the classes (MSE on seed 1's test points)

K: the gated constructions' second read sees the x1 + x2 stream with weight sigmoid(-K);
hc's construction does not depend on K. Below: ihc, which cannot reset, wired to write
phi(x1 - x2) at scale t and read it back at 1/t (MSE ~ 1/t^2): its floor is 0 too.

{construction_table(x1, y1)}

![loss curves and layer-0 reset measures](counterexample.png)
"""
    with open(os.path.join(folder, "results.md"), "w") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(folder, ROOT)}/results.md and counterexample.png ({minutes:.1f} minutes)")


if __name__ == "__main__":
    configure(globals())
    check_settings(globals(), RANGES)
    main()
