"""
The studies compare.py runs, as presets: each fixes train.py's arguments for every
run, its variants (a label and the variant's own train.py arguments), its seeds,
and how its rates are chosen and its results read. Plain data: the tests check
every label here against the model it trains.

A label is the variant's name (variants.py), with the setting it changes where it
changes one (with_setting: name+key=value), so a label always names the model that
ran; it names run directories and files, so letters, digits and _ . + = only.
"""
import os
from typing import NamedTuple

from lab.flops import flop_matched_iters
from residuals import TOPOLOGIES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the tutorial: train.py, config/


class Preset(NamedTuple):
    args: list  # train.py's arguments for every run
    variants: dict  # label -> the variant's own train.py arguments, in the table's order
    seeds: str = "1337,1338,1339"
    baselines: tuple = ("residual", "ihc")  # a paired column for each that is among the chosen variants
    learning_rates: tuple = ()  # a grid: each variant at its best rate on tuning_seed; (): all at `rate`
    rate: float = 1e-3  # without a grid, every variant's learning rate: nanoGPT's, that of the one-rate studies
    tuning_seed: int = 1336  # chooses the rates; never one of the comparison's seeds
    rates_from: dict = {}  # label -> the variant whose chosen rate it trains at, untuned (where the budget forces it)
    reuse: tuple = ()  # committed studies (results/<name>) whose runs with this preset's arguments are taken, not trained
    contrasts: tuple = ()  # pre-registered (variant, baseline) pairs, tested together: Holm-adjusted p's
    lead: tuple = ()  # (base, leader): for each contrast's variant, the share of leader's lead over base it keeps
    recorded_as: dict = {}  # label -> the label its committed runs were recorded under, before a relabelling
    scale_lr_mults: tuple = ()  # a grid of --scale_lr_mult: each variant with scales tuned over it, at its rate
    one_cpu: bool = False  # every run with one CPU's arithmetic: another CPU joins only by reproducing its runs


def topologies(*names):
    """One variant per topology (or study variant), labelled with its name."""
    return {name: [f"--residual={name}"] for name in names}


def with_setting(name, key, value, *measuring):
    """A variant trained with one more train.py setting, labelled `name+key=value`;
    `measuring`: arguments that change what is recorded, not what is trained (the
    evaluation interval of a longer run, which keeps its number of evaluations)."""
    return {f"{name}+{key}={value}": [f"--residual={name}", f"--{key}={value}", *measuring]}


DEPTH_MODEL = ["--device=cpu", "--n_layer=12", "--n_embd=64", "--n_head=4"]  # the depth studies' model, 12 x 64
DEPTH_STUDY = DEPTH_MODEL + ["--max_iters=1000"]
SWEEP_MODEL = ["--device=cpu", "--n_embd=64", "--n_head=4", "--max_iters=1000"]  # then --n_layer, the depth
SWEEP = topologies("residual", "hc", "mhc", "ihc", "norm_gated_ihc")


def tools_study(n_layer):
    """#49's study at a depth: the residual given the field's tools against hc and the gate (depth48_tools)."""
    return Preset(SWEEP_MODEL + [f"--n_layer={n_layer}"], seeds="1342,1343,1344,1345,1346",
                  learning_rates=(2e-3, 4e-3, 8e-3), scale_lr_mults=(1, 4, 16), one_cpu=True,
                  baselines=("residual", "residual.x0"),
                  variants=topologies("residual", "residual.scaled", "residual.x0", "hc", "norm_gated_ihc",
                                      "norm_gated_ihc.bounded"),
                  contrasts=(("hc", "residual.x0"), ("norm_gated_ihc", "residual.x0"),
                             ("residual.scaled", "residual"), ("residual.x0", "residual"),
                             ("norm_gated_ihc.bounded", "norm_gated_ihc"),
                             ("norm_gated_ihc.bounded", "residual")),
                  lead=("residual", "norm_gated_ihc"))


DECOMP_MATCHED = flop_matched_iters(1000, n_layer=48, n_embd=64, block_size=64, vocab_size=65, n_streams=4)  # 1119
GATE_LR48 = Preset(SWEEP_MODEL + ["--n_layer=48"], learning_rates=(2e-3, 4e-3, 8e-3), baselines=("residual", "ihc"),
                   reuse=("depth48",), rates_from={"norm_gated_ihc": "ihc"},
                   variants={**topologies("residual", "ihc", "norm_gated_ihc"),
                             **with_setting("norm_gated_ihc", "gate_lr_mult", 16)},
                   contrasts=tuple(("norm_gated_ihc+gate_lr_mult=16", base)
                                   for base in ("ihc", "residual", "norm_gated_ihc")))
PRESETS = dict(
    cpu=Preset(["--device=cpu"], topologies(*TOPOLOGIES)),
    gpu=Preset([os.path.join(ROOT, "config", "train_shakespeare_char.py"), "--device=cuda"], topologies(*TOPOLOGIES)),
    # norm_gated_ihc's gate options beside the topologies they sit between; train.py's CPU model
    gates=Preset(["--device=cpu"], baselines=("residual", "ihc", "norm_gated_ihc.clip"), variants={
        **topologies("residual", "ihc",
                     "gated_ihc.clip",  # norm_gated_ihc.clip with c_max = 1: no amplification
                     "norm_gated_ihc.clip",  # the baseline of the gate options below
                     "norm_gated_ihc.hard_sigmoid",  # the clip's forward, its true gradient
                     "norm_gated_ihc.init1",  # norm_gated_ihc's own (stretched sigmoid) gate, from 1
                     "norm_gated_ihc.binary", "norm_gated_ihc.hard_concrete",
                     "norm_gated_ihc.clip_init0.9"),  # inside the clip, not on its edge
        **with_setting("norm_gated_ihc.clip", "alpha_init", 0),  # no dynamic part
        **topologies("norm_gated_ihc.clip_deviations")},
        # the study ran before labels were the variants' names
        recorded_as={"gated_ihc.clip": "gated_ihc", "norm_gated_ihc.clip": "norm_gated_ihc",
                     "norm_gated_ihc.init1": "norm_gated_ihc.stretched_sigmoid",
                     "norm_gated_ihc.clip_init0.9": "norm_gated_ihc.init0.9",
                     "norm_gated_ihc.clip+alpha_init=0": "norm_gated_ihc.static",
                     "norm_gated_ihc.clip_deviations": "norm_gated_ihc.deviations"}),
    # three times the CPU model's depth at half its width (12 x 64, about as many weights as 4 x 128),
    # half its iterations; norm_gated_ihc with its own gate and with the clip gate
    depth=Preset(DEPTH_STUDY, topologies("residual", "hc", "mhc", "mhc_lite", "ihc", "mean_gated_ihc", "norm_gated_ihc",
                                         "norm_gated_ihc.clip")),
    # why hc wins at depth: its mixing taken away part by part, and its read and write given to ihc one
    # choice at a time (variants.py; hc.mix_identity is ihc with all three choices at once)
    hc_ablation=Preset(DEPTH_STUDY, baselines=("hc", "ihc"), variants=topologies(
        "hc", "hc.mix_static", "hc.mix_diagonal", "hc.mix_identity", "hc.bounded", "hc.mix_diagonal_bounded",
        "ihc", "ihc.stream", "ihc.signed", "ihc.signed_one_hot")),
    # which property of hc's mixing wins: its signs and its gain, two by two, paired against hc and against
    # mhc, whose mixing is both non-negative and bounded (doubly stochastic)
    hc_sign_gain=Preset(DEPTH_STUDY, baselines=("hc", "mhc"), variants=topologies(
        "hc", "hc.nonnegative", "hc.bounded", "hc.nonnegative_bounded", "mhc")),
    # the depth model trained three times as long: does the ranking hold, does hc's gain grow into instability?
    depth_long=Preset(DEPTH_MODEL + ["--max_iters=3000"], baselines=("hc", "ihc"),
                      variants=topologies("residual", "ihc", "hc", "hc.mix_diagonal")),
    # the depth study's conclusions rechecked with every variant at its own best learning rate (chosen on seed
    # 1336 from the grid, which grows where a best rate lands on its end)
    depth_tuned=Preset(DEPTH_STUDY, baselines=("residual", "ihc", "hc"), learning_rates=(2e-3, 4e-3, 8e-3),
                       variants=topologies("residual", "hc", "mhc", "ihc", "norm_gated_ihc", "hc.bounded",
                                           "hc.mix_identity")),
    # train.py's CPU model (the quick start's) with every topology at its own best rate
    cpu_tuned=Preset(["--device=cpu"], topologies(*TOPOLOGIES), learning_rates=(2e-3, 4e-3, 8e-3)),
    # the depth sweep (depth_sweep.py draws it across depth): width 64, 1000 iterations, 6 to 48 layers (12 is
    # depth_tuned), each topology at its own best rate for that depth; at 48 layers the budget tunes residual,
    # hc and ihc, and mhc and norm_gated_ihc train at ihc's rate
    depth6=Preset(SWEEP_MODEL + ["--n_layer=6"], learning_rates=(4e-3, 8e-3, 1.6e-2), variants=SWEEP),
    depth24=Preset(SWEEP_MODEL + ["--n_layer=24"], learning_rates=(2e-3, 4e-3, 8e-3), variants=SWEEP),
    depth48=Preset(SWEEP_MODEL + ["--n_layer=48"], learning_rates=(1e-3, 2e-3, 4e-3), variants=SWEEP,
                   rates_from={"mhc": "ihc", "norm_gated_ihc": "ihc"}),
    # depth48's residual and hc for twice the iterations: does hc's lead at 48 layers last? Both at 4e-3,
    # the rate each chose at 1000 iterations (the budget could not tune at this length)
    depth48_long=Preset(["--device=cpu", "--n_embd=64", "--n_head=4", "--n_layer=48", "--max_iters=2000"],
                        topologies("hc", "residual"), baselines=("residual",), rate=4e-3),
    # Is the gate's reset-and-reuse reached when its logits may move (#38)? 12 x 64 as depth_tuned, five seeds:
    # norm_gated_ihc with its gate logits' rate 1, 4 and 16 times the rest's, and for 3000 iterations beside
    # ihc for as long (each keeps five evaluations); depth_tuned's residual and ihc runs where identical
    gate_lr=Preset(DEPTH_STUDY, seeds="1337,1338,1339,1340,1341", learning_rates=(2e-3, 4e-3, 8e-3),
                   baselines=("residual", "ihc"), reuse=("depth_tuned",), variants={
                       **topologies("residual", "ihc"),
                       **{label: args for mult in (1, 4, 16)
                          for label, args in with_setting("norm_gated_ihc", "gate_lr_mult", mult).items()},
                       **with_setting("norm_gated_ihc", "max_iters", 3000, "--eval_interval=750"),
                       **with_setting("ihc", "max_iters", 3000, "--eval_interval=750")},
                   contrasts=tuple((f"norm_gated_ihc+gate_lr_mult={mult}", base) for base in ("ihc", "residual")
                                   for mult in (1, 4, 16))
                   + tuple((f"norm_gated_ihc+gate_lr_mult={mult}", "norm_gated_ihc+gate_lr_mult=1") for mult in (4, 16))
                   + (("norm_gated_ihc+max_iters=3000", "ihc+max_iters=3000"),)),
    # gate_lr's multiplier that reset the most gates, at 48 layers (#38): beside depth48's residual, ihc and
    # norm_gated_ihc (at ihc's rate, untuned, as depth48 trained it), all three taken from depth48
    gate_lr48=GATE_LR48,
    # gate_lr48 on five seeds: its seeds 1337-1339 taken from it (and depth48), the residual at 1340 and
    # 1341 from depth48_decomp, the rest of 1340 and 1341 new: the replication its three-seed finding
    # needs, the same contrasts
    gate_lr48_5seeds=GATE_LR48._replace(seeds="1337,1338,1339,1340,1341",
                                        reuse=("depth48", "gate_lr48", "depth48_decomp")),
    # What hc's lead at 48 layers is made of (#37), at depth48's model, five seeds: hc's mixing made diagonal
    # or bounded, hc on one stream (its scales alone, token-dependent or static), and the residual for the
    # iterations hc's FLOPs per step buy (flops.py: 1119 for 1000); depth48's runs where identical. The grid
    # is centred where every variant tuned at 48 layers chose (4e-3) and grows at an end as always
    depth48_decomp=Preset(SWEEP_MODEL + ["--n_layer=48"], seeds="1337,1338,1339,1340,1341",
                          learning_rates=(2e-3, 4e-3, 8e-3), baselines=("residual", "hc"), reuse=("depth48",),
                          variants={**topologies("residual", "hc", "hc.mix_diagonal", "hc.bounded", "hc.one_stream",
                                                 "hc.one_stream_static"),
                                    **with_setting("residual", "max_iters", DECOMP_MATCHED,
                                                   f"--eval_interval={-(-DECOMP_MATCHED // 4)}")},
                          contrasts=(("hc", "residual"),) + tuple(
                              (arm, base) for arm in ("hc.mix_diagonal", "hc.bounded", "hc.one_stream",
                                                      "hc.one_stream_static", f"residual+max_iters={DECOMP_MATCHED}")
                              for base in ("residual", "hc")),
                          lead=("residual", "hc")),
    # depth48_decomp's two further arms (#37, "if the budget allows"), pre-registered apart from its eleven
    # contrasts so that its committed tests stand as they were: hc's read and write with no mixing at all
    # (MIX = I), and hc on two streams; its residual and hc taken from it
    depth48_streams=Preset(SWEEP_MODEL + ["--n_layer=48"], seeds="1337,1338,1339,1340,1341",
                           learning_rates=(2e-3, 4e-3, 8e-3), baselines=("residual", "hc"),
                           reuse=("depth48", "depth48_decomp"),
                           variants={**topologies("residual", "hc", "hc.mix_identity"),
                                     **with_setting("hc", "n_streams", 2)},
                           contrasts=tuple((arm, base) for arm in ("hc.mix_identity", "hc+n_streams=2")
                                           for base in ("residual", "hc")),
                           lead=("residual", "hc")),
    # Does any topology beat a residual given the same tools (#49)? depth48's model, five seeds no study has
    # used, every run with one CPU's arithmetic and nothing reused: the residual with learned skip and branch
    # scales, and with the embedding fed to every sublayer too (residual.x0, which holds both others: the
    # best-equipped, named before any run); hc and the gate against it; the gate with its amplification taken
    # away. Every variant tuned on seed 1336, its rate and then its scales' multiplier; the final loss over the
    # whole validation split; the share of the gate's lead over the residual that each arm gets
    depth48_tools=tools_study(48),
    # the same at 12 layers (#49's moonshot: a topology that beats the best-equipped residual at every depth),
    # on the same seeds, new at this depth, with its own tuning on seed 1336
    depth12_tools=tools_study(12),
    # what storing the residual state in bf16 (--state_dtype=bfloat16, half the bytes the stream ops move on
    # a GPU) costs in loss: train.py's CPU model at its default rate, the residual and the headline topology
    # each against itself with a float32 state, on two seeds (issue 48: a cost, not a tuned comparison)
    state_dtype=Preset(["--device=cpu"], rate=4e-3, seeds="1337,1338", baselines=("residual", "norm_gated_ihc"),
                       one_cpu=True,
                       variants={**topologies("residual"), **with_setting("residual", "state_dtype", "bfloat16"),
                                 **topologies("norm_gated_ihc"),
                                 **with_setting("norm_gated_ihc", "state_dtype", "bfloat16")},
                       contrasts=(("residual+state_dtype=bfloat16", "residual"),
                                  ("norm_gated_ihc+state_dtype=bfloat16", "norm_gated_ihc"))),
)
