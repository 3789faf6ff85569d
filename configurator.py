"""
What the scripts share: reading and checking their settings (nanoGPT's "poor man's
configurator", as functions), the device, and train.py's checkpoints (sample.py loads
them), its out_dir and its signals.

A script keeps its settings as module-level globals, then calls

    user_set = configure(globals())     # the keys set, so a script can tell a choice from a default
    check_settings(globals(), ALLOWED)  # ALLOWED = dict(n_layer="[1, inf)", init_from=("scratch", "resume"))

configure applies, in order, every argument of the command line

    python train.py config/train_shakespeare_char.py --batch_size=32 --compile=False

a file name (no leading --) is a Python file of plain assignments, run as code;
--key=value is parsed as a Python literal (else a plain string) and must have
the type of the default (an int is accepted for a float; a text setting takes
the text as typed). check_settings holds a numeric setting to its interval and a
text setting to its choices. An interval is written as in mathematics, "[0, 1)":
a bracket includes its end, a parenthesis leaves it out, and an end is a number
(2**32 too), inf, or the name of another setting ("[0, learning_rate]"). A
mistake is one line naming the setting and what is allowed, exit status 2.
"""
import json
import math
import os
import re
import signal
import sys
import traceback
from ast import literal_eval
from contextlib import nullcontext

import torch

from model import GPTConfig

if os.name == "nt":  # the lock on train.py's out_dir
    import msvcrt
else:
    import fcntl


def fail(message):
    """One-line error to stderr, exit status 2 (the usual code for a usage error)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def setting_keys(config):
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


def config_file(path, config):
    """The settings the Python file at path assigns, each of config's keys and types. Its
    imports and _helpers are not settings. A file that does not run is one line with its line."""
    try:
        source = open(path).read()
    except OSError as e:
        fail(f"cannot read config file '{path}': {e.strerror}")
    keys, assigned = setting_keys(config), {}
    try:
        exec(compile(source, path, "exec"), {}, assigned)
    except SyntaxError as e:
        fail(f"config file '{path}' line {e.lineno}: {e.msg}")
    except Exception as e:  # a mistake in the file's own code, e.g. a name it never defined
        line = [frame.lineno for frame in traceback.extract_tb(e.__traceback__) if frame.filename == path][-1]
        fail(f"config file '{path}' line {line}: {type(e).__name__}: {e}")
    settings = {}
    for key, value in assigned.items():
        if key.startswith("_") or not isinstance(value, (int, float, bool, str)):
            continue  # an import or a helper of the config file, not a setting
        if key not in keys:
            fail(f"config file '{path}' sets unknown key '{key}'; valid keys: {', '.join(keys)}")
        settings[key] = parse_value(key, repr(value), config[key])
    return settings


def configure(config, argv=None):
    """Apply the command line's config files and --key=value settings to config; the keys set."""
    keys = setting_keys(config)
    overridden = set()
    for arg in sys.argv[1:] if argv is None else argv:
        if not arg.startswith("--"):
            settings = config_file(arg, config)
            config.update(settings)
            overridden.update(settings)
            continue
        key, eq, text = arg[2:].partition("=")
        if not eq:
            fail(f"argument '{arg}' is not of the form --key=value")
        if key not in keys:
            fail(f"unknown key '{key}'; valid keys: {', '.join(keys)}")
        config[key] = parse_value(key, text, config[key])
        overridden.add(key)
    return overridden


INTERVAL = re.compile(r"([\[(])([^,]+),([^,]+)([\])])")  # [low, high), ends without spaces


def interval(key, rule):
    """'[0, 1)' -> ('[', '0', '1', ')')."""
    match = INTERVAL.fullmatch(rule.replace(" ", ""))
    if match is None:
        raise ValueError(f"{key}: {rule!r} is not an interval such as '[0, 1)'")
    return match.groups()


def end_value(text, config):
    """An interval's end: another setting's value, inf, a number or a power of one."""
    if text in config:
        return config[text]
    if text in ("inf", "-inf"):
        return float(text)
    base, power = text.split("**") if "**" in text else (text, "1")
    return literal_eval(base) ** literal_eval(power)


def in_words(key, rule):
    """'[0, 1)' for dropout -> '0 <= dropout < 1'; '[1, inf)' -> 'dropout >= 1'."""
    opening, low, high, closing = interval(key, rule)
    below = f"{'<' if closing == ')' else '<='} {high}"
    if high == "inf":
        return f"{key} {'>' if opening == '(' else '>='} {low}"
    return f"{key} {below}" if low == "-inf" else f"{low} {'<' if opening == '(' else '<='} {key} {below}"


def check_settings(config, allowed):
    """Every setting in allowed within its interval (a float also finite) or among its
    choices (a tuple of them); the first one outside is a one-line error."""
    for key, rule in allowed.items():
        value = config[key]
        if not isinstance(rule, str):
            if value not in rule:
                fail(f"unknown {key} '{value}'; choose one of: {', '.join(rule)}")
            continue
        opening, low, high, closing = interval(key, rule)
        named = in_words(key, rule)
        if isinstance(value, float) and not math.isfinite(value):
            fail(f"--{key}={value}: must be a finite number, {named}")
        lo, hi = end_value(low, config), end_value(high, config)
        if not ((lo < value if opening == "(" else lo <= value) and (value < hi if closing == ")" else value <= hi)):
            others = "".join(f" ({end} = {config[end]})" for end in (low, high) if end in config)
            fail(f"--{key}={value}: must be {named}{others}")


def choose_device(device, dtype, local_rank=0):
    """--device (auto: a CUDA GPU, then Apple's MPS, then the CPU; cuda: torchrun's
    local_rank) and --dtype (auto: bfloat16 on GPUs that have it, else float32):
    (device, device_type, dtype, ctx), ctx the autocast context. A device that is
    not there, or a name not in the lists, is a one-line error."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if device == "cuda":  # torch.cuda.set_device needs an index
        device = f"cuda:{local_rank}"
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.startswith("cuda:") and gpus == 0:
        fail(f"device '{device}' asked for, but torch sees no CUDA GPU; use --device=cpu or auto")
    if device.startswith("cuda:") and not (device[5:].isdigit() and int(device[5:]) < gpus):
        fail(f"device '{device}': torch sees {gpus} CUDA GPU(s); use cuda, auto or cuda:0 to cuda:{gpus - 1}")
    if device == "mps" and not torch.backends.mps.is_available():
        fail("device 'mps' asked for, but this torch has no MPS backend; use --device=cpu or auto")
    if device not in ("cpu", "mps") and not device.startswith("cuda:"):
        fail(f"unknown device '{device}'; choose auto, cpu, cuda, cuda:N or mps")
    device_type = device.split(":")[0]
    if dtype == "auto":
        dtype = "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if dtype not in ("float32", "bfloat16", "float16"):
        fail(f"unknown dtype '{dtype}'; choose one of: auto, float32, bfloat16, float16")
    ctx = nullcontext() if dtype == "float32" else torch.autocast(device_type, dtype=getattr(torch, dtype))
    return device, device_type, dtype, ctx


def load_checkpoint(path, missing):
    """train.py's checkpoint at path. No file there is the one-line error missing; any damage
    (truncated, corrupted, not ours) is a one-line error naming the file."""
    if not os.path.exists(path):
        fail(missing)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        fail(f"cannot load checkpoint {path} ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
             f"it is truncated, corrupted or not from this train.py")
    missing = {"model", "model_args", "config"} - set(checkpoint if isinstance(checkpoint, dict) else ())
    if missing:
        fail(f"checkpoint {path} has no {', '.join(sorted(missing))}: it is not from this train.py")
    unknown = set(checkpoint["model_args"]) - set(GPTConfig.__dataclass_fields__)
    if unknown:
        fail(f"checkpoint {path} names settings this model does not have ({', '.join(sorted(unknown))}); "
             f"it was made by another version of model.py")
    return checkpoint


def save_checkpoint(checkpoint, path):
    """torch.save to a temporary file, fsync, then rename: a kill at any moment leaves either
    the old checkpoint at path or the new one, never a truncated file."""
    with open(path + ".tmp", "wb") as f:
        torch.save(checkpoint, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def resume_settings(checkpoint, path, settings, user_set):
    """The settings (of those in settings) that a run resumed from the checkpoint at path takes
    from it: its model's (model_args) and its dataset, unless given. One given with another
    value is a one-line error naming both. The run's own settings (max_iters, the rate, ...)
    may change, and so may kernels (this machine's choice) and dropout (nanoGPT fine-tunes so)."""
    saved = dict(checkpoint["model_args"], dataset=checkpoint["config"]["dataset"])
    del saved["kernels"]
    for key, value in saved.items():
        if key in user_set and key != "dropout" and settings[key] != value:
            fail(f"--{key}={settings[key]} contradicts {path}, whose {key} is {value!r}: a resumed run "
                 f"keeps its checkpoint's model and data (leave --{key} out, or use another --out_dir)")
    return {key: value for key, value in saved.items() if key in settings and key not in user_set}


def open_metrics(path, iter_num):
    """out_dir/metrics.jsonl, opened for this run's rows after the rows a checkpoint at iter_num
    covers: its evaluations before iter_num and its progress up to it (from scratch, none). One
    JSON line per row, each written whole (line-buffered) as it comes."""
    rows = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
    metrics = open(path, "w", buffering=1)
    metrics.writelines(json.dumps(r) + "\n" for r in rows if r["iter"] + ("val_loss" in r) <= iter_num)
    return metrics


def last_checkpoint(path):
    """What a run that stops now leaves behind at path, in words."""
    return f"the last good checkpoint is {path}" if os.path.exists(path) else "no checkpoint was saved yet"


def note_signals(ckpt_path):
    """Ctrl-C and SIGTERM only note the signal, in the list returned, which train.py polls: the
    iteration under way finishes, an evaluation is abandoned (it changes no weights), then it saves
    and exits with 128 + the signal's number (the shell's "stopped by a signal"). A second signal
    exits at once, without saving (its message names what ckpt_path holds)."""
    received = []

    def on_signal(signum, frame):
        if received:  # os.write: this may interrupt a print, whose buffer is not reentrant
            again = f"{signal.Signals(signum).name} again: exited at once, without saving"
            os.write(2, f"{again} ({last_checkpoint(ckpt_path)})\n".encode())
            sys.exit(128 + signum)
        received.append(signal.Signals(signum))

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return received


def lock_out_dir(out_dir):
    """Make out_dir and hold its lock until this process ends: a second train.py on it is a
    one-line error. The OS drops the lock of a process that ends, however it ends, so a killed
    run leaves none behind. Returns the lock's open file, which must stay open."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        lock = open(os.path.join(out_dir, "train.lock"), "a+")
    except OSError as e:
        fail(f"out_dir '{out_dir}' is not writable: {e.strerror}")
    try:
        if os.name == "nt":
            lock.seek(0)  # msvcrt locks bytes from the position; every process locks byte 0
            msvcrt.locking(lock.fileno(), msvcrt.LK_NBLCK, 1)
        else:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        fail(f"out_dir '{out_dir}' is in use by a running train.py (process {lock.read().strip() or '?'}); "
             f"wait for it to end, or train in another --out_dir")
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock
