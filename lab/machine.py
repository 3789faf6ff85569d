"""
The processor a measurement ran on, for the records the studies write: runs differ in
their last bits between CPUs (AVX-512 or not), so each run and each call names its own.

A study longer than one machine's life can still keep one arithmetic: torch picks its
code paths by CPU in two places, its own vector kernels (ATen) and oneDNN, which runs its
float32 matmuls. Pinned to AVX2, which every x86 CPU of the last decade has, two CPUs
run the same instructions in the same order. Measured: the 48 x 64 residual of
depth48_tools, seed 1342, on an AMD EPYC (family 26, model 2, AVX-512), pinned, gave the
gradient norms its record from an AMD EPYC (family 25, model 1, no AVX-512) holds, bit
for bit, at iterations 10, 20 and 30; unpinned, or with only one of the two pinned, they
differ in the 6th or 7th digit from iteration 10. compare.py does not take that on trust:
a machine new to such a study first retrains the start of its recorded runs.
"""
import platform

AVX2_ARITHMETIC = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}  # environment of a run


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
