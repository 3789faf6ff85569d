"""
Fingerprints of every study variant as the old train.py arguments spelled it
(GPTConfig fields such as --hc_mix=diagonal), made once at the code those
studies ran (commit a47c27c): for each spelling, a small model's parameters at
seed 1337 (a sha256 of each one's bytes) and its logits once every parameter is
moved off its init, in eval mode. tests.py checks that each study variant's
spelling of today (respell.py) builds the same model. Run at a47c27c:

    python old_spelling_fixture.py    # writes tests_old_spelling.json
"""
import hashlib
import json
from ast import literal_eval

import torch

from model import GPT, GPTConfig
from residuals import TOPOLOGIES

SIZE = dict(n_layer=2, n_embd=16, n_head=2, block_size=8, vocab_size=64, dropout=0.0, kernels="reference")
OLD_SPELLINGS = [  # every variant's arguments in the committed studies' run.json, but --residual=<topology> alone
    "--residual=hc --hc_mix=static", "--residual=hc --hc_mix=diagonal", "--residual=hc --hc_mix=identity",
    "--residual=hc --hc_bounded=True", "--residual=hc --hc_mix=diagonal --hc_bounded=True",
    "--residual=hc --hc_nonnegative=True", "--residual=hc --hc_nonnegative=True --hc_bounded=True",
    "--residual=ihc --coefficients_from=stream", "--residual=ihc --read_write=signed",
    "--residual=ihc --read_write=signed --read_init=one_hot",
    "--residual=gated_ihc --gate=clip", "--residual=norm_gated_ihc --gate=clip",
    "--residual=norm_gated_ihc --gate=hard_sigmoid --gate_init=1",
    "--residual=norm_gated_ihc --gate=stretched_sigmoid --gate_init=1",
    "--residual=norm_gated_ihc --gate=binary", "--residual=norm_gated_ihc --gate=hard_concrete --gate_init=1",
    "--residual=norm_gated_ihc --gate=clip --gate_init=0.9", "--residual=norm_gated_ihc --gate=clip --alpha_init=0",
    "--residual=norm_gated_ihc --gate=clip --gate_deviations=True",
    "--residual=mean_gated_ihc --gate=stretched_sigmoid", "--residual=norm_gated_ihc --gate=stretched_sigmoid",
    "--residual=norm_gated_ihc --gate_anchor=True",
] + [f"--residual={name}" for name in TOPOLOGIES]


def parse(spelling):
    args = {}
    for arg in spelling.split():
        key, text = arg[2:].split("=", 1)
        try:
            args[key] = literal_eval(text)
        except (ValueError, SyntaxError):
            args[key] = text
    return {key: float(value) if isinstance(getattr(GPTConfig, key), float) else value  # as train.py parses
            for key, value in args.items()}


def fingerprint(model_args):
    """The parameters at seed 1337 (one sha256 over their names and bytes); then, every
    parameter moved off its init: the eval-mode logits at the last position, and in
    training mode (torch seeded, for noisy gates) the loss and its gradient, each
    parameter's projected on a fixed random direction (clip and hard_sigmoid, say,
    differ only there)."""
    torch.manual_seed(1337)
    model = GPT(GPTConfig(**SIZE, **model_args))
    digest = hashlib.sha256()
    for name, p in model.named_parameters():
        digest.update(name.encode() + p.detach().numpy().tobytes())
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.add_(0.3 * torch.randn(p.shape, generator=generator))
    idx = torch.randint(0, SIZE["vocab_size"], (2, SIZE["block_size"]), generator=generator)
    with torch.no_grad():
        logits, _ = model.eval()(idx, idx)
    torch.manual_seed(0)
    _, loss = model.train()(idx, idx)
    loss.backward()
    gradient = [(p.grad * torch.randn(p.shape, generator=generator)).sum().item()
                for _, p in sorted(model.named_parameters())]
    return dict(params=digest.hexdigest(), logits=logits[:, -1].flatten().tolist(), loss=loss.item(),
                gradient=gradient)


if __name__ == "__main__":
    table = {}
    for spelling in OLD_SPELLINGS:
        model_args = parse(spelling)
        model_args["n_streams"] = TOPOLOGIES[model_args["residual"]].default_n_streams
        table[spelling] = fingerprint(model_args)
    with open("tests_old_spelling.json", "w") as f:
        json.dump(dict(commit="a47c27c", size=SIZE, fingerprints=table), f)
    distinct = {tuple(round(v, 4) for v in t["logits"] + t["gradient"]) for t in table.values()}
    print(len(table), "spellings,", len(distinct), "distinct models")
