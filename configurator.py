"""
nanoGPT's "poor man's configurator", as functions. A script keeps its settings
as module-level globals, then calls

    overridden = configure(globals())  # the keys set, so a script can tell a choice from a default
    check_ranges(globals(), RANGES)    # RANGES = dict(n_layer="x >= 1", min_lr="0 <= x <= learning_rate")

configure applies, in order, every argument of the command line

    python train.py config/train_shakespeare_char.py --batch_size=32 --compile=False

a file name (no leading --) is a Python file of plain assignments, run as code;
--key=value is parsed as a Python literal (else a plain string) and must have
the type of the default (an int is accepted for a float; a text setting takes
the text as typed). check_ranges holds every numeric setting to its range, a
comparison of x (its value) with numbers or other settings, and check_choices a
text setting to its allowed values, before any work. A mistake is one line
naming the setting and what is allowed, exit status 2.
"""
import math
import re
import sys
from ast import literal_eval


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


def check_ranges(config, ranges):
    """Every setting in ranges (setting -> a comparison of its value x) in its range,
    and a float finite; the first one outside is a one-line error."""
    for key, rule in ranges.items():
        value, named = config[key], re.sub(r"\bx\b", key, rule)
        if isinstance(value, float) and not math.isfinite(value):
            fail(f"--{key}={value}: must be a finite number, {named}")
        if not eval(rule, {**config, "x": value}):
            others = "".join(f" ({name} = {config[name]})" for name in re.findall(r"[a-z_]\w*", rule) if name in config)
            fail(f"--{key}={value}: must be {named}{others}")


def check_choices(config, choices):
    """Every setting in choices (setting -> its allowed values) one of them; the first
    that is not is a one-line error listing them."""
    for key, allowed in choices.items():
        if config[key] not in allowed:
            fail(f"unknown {key} '{config[key]}'; choose one of: {', '.join(allowed)}")
