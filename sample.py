"""
Sample text from a trained model.

    python sample.py --out_dir=out-norm_gated_ihc
    python sample.py --out_dir=out-mhc --start="ROMEO:" --num_samples=3 --temperature=0.8
    python sample.py --out_dir=out-mhc --start=FILE:prompt.txt

Rebuilds the model from the checkpoint's model_args and decodes with the
dataset's meta.pkl (characters) or the bundled GPT-2 tokenizer.
"""
import os
import pickle

import torch

from configurator import check_settings, choose_device, configure, fail, load_checkpoint
from model import GPT, KERNELS, GPTConfig
from prepare import DATA_DIR, gpt2_tokenizer

# -----------------------------------------------------------------------------
out_dir = "out-residual"  # the folder holding ckpt.pt
start = "\n"  # the prompt, or FILE:path to read it from a file
num_samples = 2
max_new_tokens = 500
temperature = 0.8  # 1.0 = the model's distribution, < 1.0 sharper, > 1.0 more random
top_k = 200  # keep only the top_k most likely tokens (0: all)
seed = 1337
device = "auto"  # auto, cpu, cuda, cuda:N or mps
dtype = "auto"  # auto (bfloat16 on GPUs that have it, else float32), float32, bfloat16 or float16
kernels = "fused"  # the stream ops (model.stream_ops): reference, fused or triton
# Every setting's allowed values, an interval or a tuple of choices (configurator.check_settings)
ALLOWED = dict(num_samples="[1, inf)", max_new_tokens="[1, inf)", temperature="(0, inf)",
               top_k="[0, inf)", seed="[0, 2**32)", kernels=KERNELS)  # seeds as train.py's
# -----------------------------------------------------------------------------
configure(globals())
check_settings(globals(), ALLOWED)
device, device_type, dtype, ctx = choose_device(device, dtype)

ckpt_path = os.path.join(out_dir, "ckpt.pt")
checkpoint = load_checkpoint(ckpt_path, f"no checkpoint at {ckpt_path}; train one with "
                                         f"python train.py --out_dir={out_dir}")
try:
    model = GPT(GPTConfig(**{**checkpoint["model_args"], "kernels": kernels}))
    model.load_state_dict(checkpoint["model"])
except (ValueError, RuntimeError) as e:  # settings or weights this model.py does not have
    fail(f"checkpoint {ckpt_path} does not fit this model.py ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
model.eval().to(device)

dataset = checkpoint["config"]["dataset"]
meta_path = os.path.join(DATA_DIR, dataset, "meta.pkl")
if not os.path.exists(meta_path):
    fail(f"no tokenizer for dataset '{dataset}': {meta_path} is missing (python prepare.py --dataset={dataset})")
with open(meta_path, "rb") as f:
    meta = pickle.load(f)
if meta["tokenizer"] == "char":
    stoi, itos = meta["stoi"], meta["itos"]

    def encode(text):
        unknown = sorted(set(text) - set(stoi))
        if unknown:
            fail(f"the prompt has characters outside the {len(stoi)}-character vocabulary of '{dataset}': "
                 f"{''.join(unknown)!r}")
        return [stoi[c] for c in text]

    def decode(ids):
        return "".join(itos[i] for i in ids)
else:
    enc = gpt2_tokenizer()
    encode, decode = (lambda s: enc.encode(s, allowed_special={"<|endoftext|>"})), enc.decode

if start.startswith("FILE:"):
    try:
        with open(start[5:], encoding="utf-8") as f:
            start = f.read()
    except OSError as e:
        fail(f"cannot read prompt file '{start[5:]}': {e.strerror}")
start_ids = encode(start)
if not start_ids:
    fail("the prompt is empty; give --start with at least one character")
x = torch.tensor(start_ids, dtype=torch.long, device=device)[None, ...]
generator = torch.Generator(device=device).manual_seed(seed)
with torch.no_grad(), ctx:
    for _ in range(num_samples):
        y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k or None, generator=generator)
        print(decode(y[0].tolist()))
        print("---------------")
