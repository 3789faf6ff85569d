"""
nanoGPT's "poor man's configurator", as functions. A script keeps its settings as module-level globals, then calls

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
import math
import re
import sys
import traceback
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


def config_file(path, config):
    """The settings the Python file at path assigns, each of config's keys and types. Its
    imports and _helpers are not settings. A file that does not run is one line with its line."""
    try:
        source = open(path).read()
    except OSError as e:
        fail(f"cannot read config file '{path}': {e.strerror}")
    keys, assigned = config_keys(config), {}
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
    keys = config_keys(config)
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
