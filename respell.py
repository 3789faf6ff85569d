"""
The studies' records in today's spelling. Until the study variants became
names (variants.py), a variant was spelled as settings of its topology:

    --residual=hc --hc_mix=diagonal        is now   --residual=hc.mix_diagonal

Each committed results/<study>/run.json keeps every run's arguments as the run
had them; this script writes beside them, under "respelled", the arguments that
train the same model today (tests.py checks, with fingerprints the old code made,
that each old spelling and its new one build the same model: same parameters at
the same seed, same logits and gradients). compare.py reads "respelled" where it
is, so every committed study still redraws, and its preset trains the same
models it trained.

A run with no --learning_rate trained at train.py's default of its day, 1e-3
with min_lr 1e-4 (nanoGPT's, the default of every commit until the CPU model's
became 4e-3). Today compare.py gives every run its rate, so those runs are
respelled with --learning_rate=0.001 --min_lr=0.0001 where compare.py puts a rate.

    python respell.py                     # every results/*/run.json
    python respell.py results/depth_tuned # one study

Running it again changes nothing.
"""
import glob
import json
import os
import sys

# The settings a variant was spelled with; --alpha_init stays a setting of its own.
OLD_SETTINGS = ("residual", "gate", "gate_init", "gate_anchor", "gate_deviations", "hc_mix", "hc_bounded",
                "hc_nonnegative", "coefficients_from", "read_write", "read_init")
SPELLINGS = {  # the old settings, in the order the runs had them -> today's --residual
    "--residual=hc --hc_mix=static": "hc.mix_static",
    "--residual=hc --hc_mix=diagonal": "hc.mix_diagonal",
    "--residual=hc --hc_mix=identity": "hc.mix_identity",
    "--residual=hc --hc_bounded=True": "hc.bounded",
    "--residual=hc --hc_mix=diagonal --hc_bounded=True": "hc.mix_diagonal_bounded",
    "--residual=hc --hc_nonnegative=True": "hc.nonnegative",
    "--residual=hc --hc_nonnegative=True --hc_bounded=True": "hc.nonnegative_bounded",
    "--residual=ihc --coefficients_from=stream": "ihc.stream",
    "--residual=ihc --read_write=signed": "ihc.signed",
    "--residual=ihc --read_write=signed --read_init=one_hot": "ihc.signed_one_hot",
    "--residual=gated_ihc --gate=clip": "gated_ihc.clip",
    "--residual=norm_gated_ihc --gate=clip": "norm_gated_ihc.clip",
    "--residual=norm_gated_ihc --gate=hard_sigmoid --gate_init=1": "norm_gated_ihc.hard_sigmoid",
    "--residual=norm_gated_ihc --gate=stretched_sigmoid --gate_init=1": "norm_gated_ihc.init1",
    "--residual=norm_gated_ihc --gate=binary": "norm_gated_ihc.binary",
    "--residual=norm_gated_ihc --gate=hard_concrete --gate_init=1": "norm_gated_ihc.hard_concrete",
    "--residual=norm_gated_ihc --gate=clip --gate_init=0.9": "norm_gated_ihc.clip_init0.9",
    "--residual=norm_gated_ihc --gate=clip --gate_deviations=True": "norm_gated_ihc.clip_deviations",
    "--residual=norm_gated_ihc --gate_anchor=True": "norm_gated_ihc.anchor",
    "--residual=norm_gated_ihc --gate=stretched_sigmoid": "norm_gated_ihc",  # the default gate, named
    "--residual=mean_gated_ihc --gate=stretched_sigmoid": "mean_gated_ihc",
}


def respell(arguments):
    """One run's train.py arguments in today's spelling: its old variant settings
    replaced by one --residual=<name> where --residual was; the rest as they were."""
    old = [arg for arg in arguments if arg.startswith("--") and arg[2:].split("=", 1)[0] in OLD_SETTINGS]
    spelled = " ".join(old)
    if len(old) <= 1:  # --residual=<topology> alone is spelled as it was
        return list(arguments)
    if spelled not in SPELLINGS:
        raise ValueError(f"no spelling of today for {spelled}")
    first = arguments.index(old[0])
    rest = [arg for arg in arguments if arg not in old]
    return rest[:first] + [f"--residual={SPELLINGS[spelled]}"] + rest[first:]


def with_rate(arguments):
    """One run's arguments with the rate it trained at given, where it was train.py's
    default of the day (1e-3, min_lr 1e-4): before --seed, where compare.py puts it."""
    if any(arg.startswith("--learning_rate=") for arg in arguments):
        return list(arguments)
    seed = next(i for i, arg in enumerate(arguments) if arg.startswith("--seed="))
    return arguments[:seed] + ["--learning_rate=0.001", "--min_lr=0.0001"] + arguments[seed:]


def spelled_today(arguments):
    """The arguments that train, today, the model a run with these arguments trained."""
    return with_rate(respell(arguments))


def respell_study(path):
    """Write "respelled" into one study's run.json: {run: today's arguments} for every
    run whose spelling changed. Returns how many runs that is."""
    with open(path) as f:
        info = json.load(f)
    respelled = {name: spelled_today(args) for name, args in info["runs"].items() if spelled_today(args) != args}
    if respelled:
        info["respelled"] = respelled
        with open(path + ".tmp", "w") as f:
            json.dump(info, f, indent=1)
        os.replace(path + ".tmp", path)
    return len(respelled)


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    folders = sys.argv[1:] or sorted(glob.glob(os.path.join(here, "results", "*", "")))
    for folder in folders:
        path = os.path.join(folder, "run.json")
        if not os.path.exists(path):
            print(f"error: no run.json in {folder}", file=sys.stderr)
            sys.exit(2)
        print(f"{path}: {respell_study(path)} run(s) respelled")
