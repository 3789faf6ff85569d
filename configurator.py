"""
nanoGPT's "poor man's configurator", as a function.

A script keeps its config as module-level globals, then calls

    overridden = configure(globals())

which applies, in order, every argument of the command line:

    python train.py config/train_shakespeare_char.py --batch_size=32 --compile=False

- a file name (no leading --): a Python file of plain assignments, run as code;
- --key=value: the value is parsed as a Python literal (falling back to a plain
  string) and must have the type of the default (an int is accepted for a float,
  and a text setting takes any text as typed).

A mistake (unknown key, wrong type, missing file) prints one line naming the
problem and what is allowed, and exits with status 2: never a traceback.
Returns the set of keys that were set, so a script can tell a user's choice
from a default. Then

    check_ranges(globals(), RANGES)

holds every numeric setting to its range, a table beside the settings, before
any work: a size of 0 is the same one-line error, not a traceback later or a
model that trains silently wrong.
"""
import math
import re
import sys
from ast import literal_eval
from typing import NamedTuple


def fail(message):
    """One-line error to stderr, exit status 2 (the usual code for a usage error)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def config_keys(config):
    """The settings: lower-case globals holding an int, float, bool or str
    (UPPER_CASE names are constants, _names are private)."""
    return [k for k, v in config.items()
            if not k.startswith("_") and not k.isupper() and isinstance(v, (int, float, bool, str))]


def parse_value(key, text, default):
    try:
        value = literal_eval(text)
    except (ValueError, SyntaxError):
        value = text  # a bare word, e.g. --device=cpu
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(default, str) and not isinstance(value, str):
        value = text  # a text setting takes the text as typed: --seeds=1,2 or --out_dir=2024
    if type(value) is not type(default):
        fail(f"--{key}={text}: expected a value of type {type(default).__name__} (default {default!r})")
    return value


def configure(config, argv=None):
    keys = config_keys(config)
    overridden = set()
    for arg in sys.argv[1:] if argv is None else argv:
        if not arg.startswith("--"):
            try:
                source = open(arg).read()
            except OSError as e:
                fail(f"cannot read config file '{arg}': {e.strerror}")
            settings = {}
            exec(compile(source, arg, "exec"), {}, settings)
            for key, value in settings.items():
                if key.startswith("_") or not isinstance(value, (int, float, bool, str)):
                    continue  # an import or a helper of the config file, not a setting
                if key not in keys:
                    fail(f"config file '{arg}' sets unknown key '{key}'; valid keys: {', '.join(keys)}")
                config[key] = parse_value(key, repr(value), config[key])
                overridden.add(key)
            continue
        key, eq, text = arg[2:].partition("=")
        if not eq:
            fail(f"argument '{arg}' is not of the form --key=value")
        if key not in keys:
            fail(f"unknown key '{key}'; valid keys: {', '.join(keys)}")
        config[key] = parse_value(key, text, config[key])
        overridden.add(key)
    return overridden


class Range(NamedTuple):
    """The values a numeric setting may take: an interval, and perhaps one value
    outside it that means something of its own (0: the default, or off)."""
    low: float
    high: float
    low_open: bool
    high_open: bool
    special: float  # None: no such value

    def holds(self, value):  # False for nan
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return (above and below) or value == self.special


def parse_range(text, config):
    """A range as mathematics writes intervals: "[1, inf)", "(0, 1]", "[0,
    learning_rate]" (a bound may name another setting), then perhaps "or V": "[1,
    inf) or 0"."""
    match = re.fullmatch(r"([\[(])(\S+), (\S+)([\])])(?: or (\S+))?", text)
    if not match:
        raise ValueError(f"not a range: {text!r}; write e.g. [1, inf), (0, 1], [0, learning_rate] or [1, inf) or 0")
    left, low, high, right, special = match.groups()
    bound = lambda b: math.inf if b == "inf" else config[b] if b in config else literal_eval(b)
    return Range(bound(low), bound(high), left == "(", right == ")", None if special is None else literal_eval(special))


def describe_range(text, config):
    """'at least 1', 'greater than 0', 'in [0, learning_rate] (learning_rate = 0.001)', '..., or 0'"""
    interval, _, special = text.partition(" or ")
    low, high = interval[1:-1].split(", ")
    words = f"{'greater than' if interval[0] == '(' else 'at least'} {low}" if high == "inf" else f"in {interval}"
    words += "".join(f" ({b} = {config[b]})" for b in (low, high) if b in config)
    return words + (f", or {special}" if special else "")


def check_ranges(config, ranges):
    """Every setting in ranges (setting -> range, as parse_range reads it) within its
    range; the first one outside is a one-line error naming it and what is allowed."""
    for key, text in ranges.items():
        if not parse_range(text, config).holds(config[key]):
            fail(f"--{key}={config[key]}: must be {describe_range(text, config)}")


def choose_device(device, dtype, local_rank=0):
    """The device and precision settings train.py and sample.py share. device:
    auto (a CUDA GPU, then Apple's MPS, then the CPU), cpu, cuda, cuda:N or mps;
    dtype: auto (bfloat16 on GPUs that have it, else float32), float32, bfloat16
    or float16. Returns (device, device_type, dtype, autocast context); a device
    that is not there, or a name not in the lists, is a one-line error."""
    from contextlib import nullcontext

    import torch
    if device == "auto":
        device = (f"cuda:{local_rank}" if torch.cuda.is_available() else
                  "mps" if torch.backends.mps.is_available() else "cpu")
    elif device == "cuda":  # torch.cuda.set_device needs an index: torchrun's rank, as auto picks
        device = f"cuda:{local_rank}"
    if device.startswith("cuda:"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            fail(f"device '{device}' asked for, but torch sees no CUDA GPU; use --device=cpu or auto")
        index = device[len("cuda:"):]
        if not index.isdigit() or int(index) >= count:
            fail(f"device '{device}': torch sees {count} CUDA GPU(s); use cuda, auto or cuda:0 to cuda:{count - 1}")
    elif device == "mps" and not torch.backends.mps.is_available():
        fail("device 'mps' asked for, but this torch has no MPS backend; use --device=cpu or auto")
    elif device != "cpu" and device != "mps":
        fail(f"unknown device '{device}'; choose auto, cpu, cuda, cuda:N or mps")
    device_type = device.split(":")[0]
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        dtype = "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    elif dtype not in dtypes:
        fail(f"unknown dtype '{dtype}'; choose one of: auto, {', '.join(dtypes)}")
    autocast = nullcontext() if dtype == "float32" else torch.autocast(device_type=device_type, dtype=dtypes[dtype])
    return device, device_type, dtype, autocast
