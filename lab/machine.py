"""
The processor a measurement ran on, for the records the studies write: runs differ in
their last bits between CPUs (AVX-512 or not), so each run and each call names its own.
"""
import platform


def cpu_name():
    """Linux's /proc/cpuinfo: the model name, family and model numbers, and whether it has
    AVX-512; else platform's answer."""
    try:
        with open("/proc/cpuinfo") as f:
            info = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line)
        info = {key.strip(): value.strip() for key, value in info.items()}
        avx512 = ", AVX-512" if "avx512f" in info.get("flags", "").split() else ""
        return f"{info['model name']} (family {info['cpu family']}, model {info['model']}{avx512})"
    except (OSError, KeyError):
        return platform.processor() or platform.machine()
