#!/usr/bin/env python3
"""Print the host's TSC frequency in kHz (x86-64 only), or nothing.

Under QEMU TCG the guest's RDTSC returns the host's TSC, but the guest
kernel calibrates it against the emulated PIT/HPET, which goes wrong when
the host is busy (seen: "Detected 179.109 MHz processor" on a 2.6 GHz host,
making guest time and perftest's latencies ~15x too large). lab.sh passes
this value as tsc_early_khz= so the guest skips that calibration.
"""
import ctypes
import mmap
import platform
import sys
import time

# rdtsc; shl rdx, 32; or rax, rdx; ret
RDTSC_CODE = bytes([0x0F, 0x31, 0x48, 0xC1, 0xE2, 0x20, 0x48, 0x09, 0xD0, 0xC3])


def rdtsc_function():
    buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(RDTSC_CODE)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    fn = ctypes.CFUNCTYPE(ctypes.c_uint64)(addr)
    fn._keepalive = buf  # the code page must outlive the function object
    return fn


def measure_khz(rdtsc, window_s=0.05):
    # Bracket each clock read between two TSC reads and keep the tightest
    # bracket at both ends, so a preemption cannot skew the ratio much.
    def sample():
        best = None
        for _ in range(20):
            a = rdtsc()
            t = time.perf_counter_ns()
            b = rdtsc()
            if best is None or b - a < best[0]:
                best = (b - a, (a + b) // 2, t)
        return best[1], best[2]

    c0, t0 = sample()
    time.sleep(window_s)
    c1, t1 = sample()
    return (c1 - c0) * 1_000_000 / (t1 - t0)


def main():
    if platform.machine() not in ("x86_64", "AMD64"):
        return 0
    try:
        rdtsc = rdtsc_function()
        # Median of a few windows: robust against one preempted sample.
        vals = sorted(measure_khz(rdtsc) for _ in range(5))
    except (OSError, ValueError, AttributeError):
        return 0  # e.g. W^X policy refusing executable memory: no hint
    khz = vals[len(vals) // 2]
    if 100_000 < khz < 10_000_000:
        print(int(round(khz)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
