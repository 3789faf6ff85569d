"""
Turn text into the token files train.py reads: data/<dataset>/{train,val}.bin
(uint16, first 90% / last 10%, as nanoGPT) and meta.pkl (the tokenizer).

    python prepare.py                              # shakespeare_char: 65 characters
    python prepare.py --dataset=shakespeare        # Tiny Shakespeare, GPT-2 BPE
    python prepare.py --input=my.txt --tokenizer=gpt2 --dataset=mine

Everything is offline: the text and the GPT-2 BPE files are bundled in data/.
train.py runs this on first use when the .bin files are missing (open_dataset).
"""
import os
import pickle
import tempfile

import numpy as np
import torch

from configurator import configure, fail

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
SHAKESPEARE = os.path.join(DATA_DIR, "shakespeare", "input.txt")
# the bundled datasets: name -> (text file, tokenizer)
DATASETS = {"shakespeare_char": (SHAKESPEARE, "char"), "shakespeare": (SHAKESPEARE, "gpt2")}
TOKENIZERS = ("char", "gpt2")


def gpt2_tokenizer():
    """tiktoken's GPT-2 encoding built from the bundled data/gpt2 files, no download."""
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=os.path.join(DATA_DIR, "gpt2", "vocab.bpe"),
        encoder_json_file=os.path.join(DATA_DIR, "gpt2", "encoder.json"))
    return tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)


def tokenizer_for(text, name):
    """-> (encode function, meta dict for meta.pkl)"""
    if name == "char":
        chars = sorted(set(text))
        stoi = {ch: i for i, ch in enumerate(chars)}
        meta = {"tokenizer": "char", "vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}
        return (lambda s: [stoi[c] for c in s]), meta
    return gpt2_tokenizer().encode_ordinary, {"tokenizer": "gpt2", "vocab_size": 50257}


def write_atomically(path, write):
    """write(file) into a temporary file unique to this call, then rename it to path:
    a reader never sees a half-written file, and two processes preparing the same
    dataset at once (DDP processes on a fresh clone, or two test runs) each write
    their own temporary file; both hold the same bytes, so whichever rename lands
    last leaves the same file."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def prepare(dataset, input_file, tokenizer):
    """Write data/<dataset>/train.bin, val.bin, meta.pkl; return (n_train, n_val) tokens."""
    with open(input_file, encoding="utf-8") as f:
        text = f.read()
    encode, meta = tokenizer_for(text, tokenizer)
    split = int(0.9 * len(text))  # nanoGPT splits the text, then encodes each part
    out = os.path.join(DATA_DIR, dataset)
    os.makedirs(out, exist_ok=True)
    counts = []
    for name, part in (("train.bin", text[:split]), ("val.bin", text[split:])):
        ids = np.array(encode(part), dtype=np.uint16)  # every vocabulary here is < 2**16
        write_atomically(os.path.join(out, name), ids.tofile)
        counts.append(len(ids))
    write_atomically(os.path.join(out, "meta.pkl"), lambda f: pickle.dump(meta, f))
    print(f"{dataset}: {len(text):,} characters -> {counts[0]:,} train and {counts[1]:,} val tokens "
          f"({tokenizer}, vocab {meta['vocab_size']:,}) in {out}")
    return tuple(counts)


def prepare_dataset(dataset):
    """Prepare one of the bundled datasets (train.py calls this on first use)."""
    input_file, tokenizer = DATASETS[dataset]
    return prepare(dataset, input_file, tokenizer)


def open_dataset(dataset, block_size):
    """data/<dataset> and its vocabulary size; a bundled dataset is tokenized on first use (by
    every DDP process at once, if so: write_atomically). A dataset with no files that is not
    bundled, or a validation split not longer than block_size, is a one-line error."""
    data_dir = os.path.join(DATA_DIR, dataset)
    if not os.path.exists(os.path.join(data_dir, "meta.pkl")):  # written last: the others are complete
        if dataset not in DATASETS:
            fail(f"no data for dataset '{dataset}' in {data_dir}: choose one of {', '.join(DATASETS)} "
                 f"or make it with python prepare.py --input=FILE --dataset={dataset}")
        prepare_dataset(dataset)
    n_val = len(np.memmap(os.path.join(data_dir, "val.bin"), dtype=np.uint16, mode="r"))
    if block_size >= n_val:
        fail(f"block_size {block_size} is not shorter than the validation split ({n_val} tokens)")
    with open(os.path.join(data_dir, "meta.pkl"), "rb") as f:
        return data_dir, pickle.load(f)["vocab_size"]


def get_batch(data, batch_size, block_size, generator, rows=slice(None)):
    """batch_size windows of block_size tokens at random offsets of data (a token
    array, e.g. a np.memmap of train.bin): inputs x and targets y, the next token
    at each position, both (B, T) int64. rows keeps a slice of the drawn batch (a
    DDP rank's share), so every rank draws the same offsets."""
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)[rows]
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
    return x, y


def consecutive_batches(data, block_size, batch_size, rank=0, world_size=1):
    """Every token of data but the first as a target once: consecutive windows of block_size
    and their next tokens, batch_size windows at a time (the last batch shorter), x and y int64
    (B, T); rank and world_size: a DDP process's share of the batches."""
    tokens = torch.from_numpy(data[:(len(data) - 1) // block_size * block_size + 1].astype(np.int64))
    step = batch_size * block_size  # the tokens of one batch
    for start in range(rank * step, len(tokens) - 1, world_size * step):
        chunk = tokens[start:min(start + step, len(tokens) - 1) + 1]
        yield chunk[:-1].view(-1, block_size), chunk[1:].view(-1, block_size)


if __name__ == "__main__":
    dataset = "shakespeare_char"  # a bundled dataset, or the name of the folder to write for --input
    input = ""  # any UTF-8 text file to tokenize instead of a bundled dataset
    tokenizer = "char"  # for --input: char or gpt2
    configure(globals())
    if input:
        if not os.path.isfile(input):
            fail(f"input file '{input}' not found")
        if tokenizer not in TOKENIZERS:
            fail(f"unknown tokenizer '{tokenizer}'; choose one of: {', '.join(TOKENIZERS)}")
        if dataset in DATASETS:
            dataset = os.path.splitext(os.path.basename(input))[0]
        prepare(dataset, input, tokenizer)
    elif dataset in DATASETS:
        prepare_dataset(dataset)
    else:
        fail(f"unknown dataset '{dataset}'; choose one of: {', '.join(DATASETS)} (or give --input=FILE)")
