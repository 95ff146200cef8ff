"""Times what a cold start-up pays for the CUDA libraries (gpu-check.sh stage `libload`).

Run once per mode right after the page cache was dropped: `dlopen` of the driver, NVRTC and
cuBLASLt, then the driver's initialisation and the primary context of GPU 0, each timed inside
this process (Python's own start-up is not counted). Prints one line of milliseconds.
Usage: libload-probe.py MODE
"""

import ctypes
import sys
import time

LIBS = ["libcuda.so.1", "libnvrtc.so.13", "libcublasLt.so.13"]


def main():
    mode = sys.argv[1]
    took = {}
    handles = {}
    for name in LIBS:
        started = time.perf_counter()
        handles[name] = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        took[name] = (time.perf_counter() - started) * 1e3
    cuda = handles["libcuda.so.1"]
    started = time.perf_counter()
    assert cuda.cuInit(0) == 0
    took["cuInit"] = (time.perf_counter() - started) * 1e3
    ctx = ctypes.c_void_p()
    started = time.perf_counter()
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    assert cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
    took["context"] = (time.perf_counter() - started) * 1e3
    handle = ctypes.c_void_p()
    started = time.perf_counter()
    assert handles["libcublasLt.so.13"].cublasLtCreate(ctypes.byref(handle)) == 0
    took["cublasLtCreate"] = (time.perf_counter() - started) * 1e3
    parts = " ".join(f"{k}={v:.0f}" for k, v in took.items())
    print(f"libload {mode}: total {sum(took.values()):.0f} ms: {parts}")


if __name__ == "__main__":
    main()
