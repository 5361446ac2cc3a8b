"""The CUDA compute probe, run as a child process: does this GPU really compute?

Run by :mod:`kubelet_plugin.health.probe_runner` as ``python -I -S cuda_probe.py --uuid <GPU-or-MIG-uuid>`` with
``CUDA_VISIBLE_DEVICES`` set to that UUID, so CUDA sees exactly one device. Through the CUDA driver API
(``libcuda.so.1`` via ctypes, no toolkit or compiler needed) it initialises CUDA, takes the device's
primary context, allocates device memory, copies data in, loads a tiny PTX kernel (JIT-compiled by
the driver), runs it, copies the result back, checks every element and frees everything. It prints
one JSON line: ``{"ok": true, "seconds": 0.37, "device": "NVIDIA H200"}`` or ``{"ok": false,
"error": "cuInit: CUDA_ERROR_SYSTEM_NOT_READY (802)"}``.

Why a child process: a broken GPU can hang a CUDA call forever (inside the driver, where no Python
timeout reaches); the parent kills the child at the time limit and reports it. This file imports only
``sys`` and ``time`` at start (``ctypes`` only when it talks to CUDA; no ``argparse`` or ``json``, which
load ``re``), so the child starts in about 7 ms instead of 18 (one per GPU at start-up, on the way to the
first ResourceSlice) and cannot be broken by the plugin's own imports.

``--simulate ok|wrong|hang`` stands in for the GPU on simulated NVML: ``ok`` and ``wrong`` compute
the kernel's result on the CPU (``wrong`` corrupts one element) and go through the same check;
``hang`` never returns, exactly like a stuck GPU.
"""

from __future__ import annotations

import sys
import time

N_ELEMENTS = 4096
BLOCK = 256
KERNEL = b"gpuready_probe"

# data[i] = data[i] * 3 + i, for i < n. PTX ISA 7.0 / sm_50: every driver since CUDA 11 JIT-compiles
# it for its GPU (Ampere, Hopper, Blackwell).
PTX = b"""
.version 7.0
.target sm_50
.address_size 64

.visible .entry gpuready_probe(
    .param .u64 gpuready_probe_data,
    .param .u32 gpuready_probe_n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<9>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [gpuready_probe_data];
    ld.param.u32 %r2, [gpuready_probe_n];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r1, %r3, %r4, %r5;
    setp.ge.u32 %p1, %r1, %r2;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.u32 %r6, [%rd4];
    mul.lo.s32 %r7, %r6, 3;
    add.s32 %r8, %r7, %r1;
    st.global.u32 [%rd4], %r8;
DONE:
    ret;
}
"""


class ProbeError(Exception):
    """A CUDA call failed or the result was wrong; the message says which and how."""


def inputs() -> list[int]:
    """The values copied to the GPU."""
    return [(i * 7 + 1) & 0xFFFFFFFF for i in range(N_ELEMENTS)]


def expected(values: list[int]) -> list[int]:
    """What the kernel must produce from ``values``."""
    return [(v * 3 + i) & 0xFFFFFFFF for i, v in enumerate(values)]


def verify(values: list[int], result: list[int]) -> None:
    """Raise ProbeError naming the first wrong element."""
    want = expected(values)
    for i, (w, g) in enumerate(zip(want, result, strict=True)):
        if w != g:
            raise ProbeError(f"kernel result wrong at element {i}: expected {w}, got {g}")


class _Cuda:
    def __init__(self) -> None:
        import ctypes

        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise ProbeError(f"cannot load libcuda.so.1 (is the NVIDIA driver mounted?): {exc}") from None
        c_void_p, c_int, c_uint, c_size_t = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_size_t
        u64 = ctypes.c_uint64
        pvoid = ctypes.POINTER(c_void_p)
        sigs: dict[str, list[object]] = {
            "cuInit": [c_uint],
            "cuDeviceGetCount": [ctypes.POINTER(c_int)],
            "cuDeviceGet": [ctypes.POINTER(c_int), c_int],
            "cuDeviceGetName": [ctypes.c_char_p, c_int, c_int],
            "cuDevicePrimaryCtxRetain": [pvoid, c_int],
            "cuCtxSetCurrent": [c_void_p],
            "cuMemAlloc_v2": [ctypes.POINTER(u64), c_size_t],
            "cuMemcpyHtoD_v2": [u64, c_void_p, c_size_t],
            "cuMemcpyDtoH_v2": [c_void_p, u64, c_size_t],
            "cuModuleLoadData": [pvoid, ctypes.c_char_p],
            "cuModuleGetFunction": [pvoid, c_void_p, ctypes.c_char_p],
            "cuLaunchKernel": [c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint,
                               c_void_p, pvoid, pvoid],
            "cuCtxSynchronize": [],
            "cuModuleUnload": [c_void_p],
            "cuMemFree_v2": [u64],
            "cuGetErrorName": [c_int, ctypes.POINTER(ctypes.c_char_p)],
        }
        for name, argtypes in sigs.items():
            fn = getattr(self.lib, name)
            fn.argtypes = argtypes
            fn.restype = c_int
        release = getattr(self.lib, "cuDevicePrimaryCtxRelease_v2", None) or self.lib.cuDevicePrimaryCtxRelease
        release.argtypes = [c_int]
        release.restype = c_int
        self.release = release

    def error_name(self, rc: int) -> str:
        import ctypes

        name = ctypes.c_char_p()
        if self.lib.cuGetErrorName(rc, ctypes.byref(name)) == 0 and name.value:
            return name.value.decode()
        return "CUDA_ERROR"

    def call(self, name: str, *args: object) -> None:
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            raise ProbeError(f"{name}: {self.error_name(rc)} ({rc})")


def run_cuda_probe(uuid: str) -> dict[str, object]:
    """Run the probe on the one device CUDA sees; raise ProbeError on any failure."""
    import ctypes

    start = time.monotonic()
    cuda = _Cuda()
    cuda.call("cuInit", 0)
    count = ctypes.c_int()
    cuda.call("cuDeviceGetCount", ctypes.byref(count))
    if count.value < 1:
        raise ProbeError(f"CUDA sees no device for {uuid} (CUDA_VISIBLE_DEVICES={uuid})")
    dev = ctypes.c_int()
    cuda.call("cuDeviceGet", ctypes.byref(dev), 0)
    name_buf = ctypes.create_string_buffer(256)
    cuda.call("cuDeviceGetName", name_buf, 256, dev)
    ctx = ctypes.c_void_p()
    cuda.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    dptr = ctypes.c_uint64()
    module = ctypes.c_void_p()
    try:
        cuda.call("cuCtxSetCurrent", ctx)
        values = inputs()
        nbytes = N_ELEMENTS * 4
        host = (ctypes.c_uint32 * N_ELEMENTS)(*values)
        cuda.call("cuMemAlloc_v2", ctypes.byref(dptr), nbytes)
        cuda.call("cuMemcpyHtoD_v2", dptr.value, ctypes.cast(host, ctypes.c_void_p), nbytes)
        cuda.call("cuModuleLoadData", ctypes.byref(module), PTX + b"\0")
        fn = ctypes.c_void_p()
        cuda.call("cuModuleGetFunction", ctypes.byref(fn), module, KERNEL)
        arg_data = ctypes.c_uint64(dptr.value)
        arg_n = ctypes.c_uint32(N_ELEMENTS)
        params = (ctypes.c_void_p * 2)(ctypes.addressof(arg_data), ctypes.addressof(arg_n))
        grid = (N_ELEMENTS + BLOCK - 1) // BLOCK
        cuda.call("cuLaunchKernel", fn, grid, 1, 1, BLOCK, 1, 1, 0, None, params, None)
        cuda.call("cuCtxSynchronize")
        out = (ctypes.c_uint32 * N_ELEMENTS)()
        cuda.call("cuMemcpyDtoH_v2", ctypes.cast(out, ctypes.c_void_p), dptr.value, nbytes)
        verify(values, list(out))
    finally:
        # Free what was taken even on failure; errors here must not hide the first one.
        if module.value:
            cuda.lib.cuModuleUnload(module)
        if dptr.value:
            cuda.lib.cuMemFree_v2(dptr.value)
        cuda.release(dev)
    return {"ok": True, "seconds": round(time.monotonic() - start, 3), "device": name_buf.value.decode()}


def run_simulated(behaviour: str) -> dict[str, object]:
    """Stand in for a GPU: compute on the CPU (``wrong`` corrupts one element), or hang forever."""
    start = time.monotonic()
    if behaviour == "hang":
        while True:  # a stuck GPU: only the parent's kill ends this
            time.sleep(3600)
    values = inputs()
    result = expected(values)
    if behaviour == "wrong":
        result[N_ELEMENTS // 2] ^= 0x4
    elif behaviour != "ok":
        raise ProbeError(f"unknown simulated probe behaviour {behaviour!r} (expected ok, wrong or hang)")
    verify(values, result)
    return {"ok": True, "seconds": round(time.monotonic() - start, 3), "device": "simulated"}


USAGE = "usage: cuda_probe.py --uuid UUID [--simulate ok|wrong|hang]"
BEHAVIOURS = ("ok", "wrong", "hang")


class UsageError(Exception):
    """The command line is not ``--uuid UUID [--simulate ok|wrong|hang]``; the message says why."""


def parse_args(argv: list[str]) -> tuple[str, str | None]:
    """``(uuid, simulate)`` from ``--uuid UUID [--simulate BEHAVIOUR]`` (``--flag=value`` too)."""
    found: dict[str, str] = {}
    i = 0
    while i < len(argv):
        flag, eq, value = argv[i].partition("=")
        if flag not in ("--uuid", "--simulate"):
            raise UsageError(f"unknown argument {argv[i]!r}")
        if not eq:
            if i + 1 >= len(argv):
                raise UsageError(f"{flag} needs a value")
            i += 1
            value = argv[i]
        found[flag] = value
        i += 1
    if not found.get("--uuid"):
        raise UsageError("--uuid is required")
    simulate = found.get("--simulate")
    if simulate is not None and simulate not in BEHAVIOURS:
        raise UsageError(f"--simulate {simulate!r}: expected one of {', '.join(BEHAVIOURS)}")
    return found["--uuid"], simulate


def json_line(result: dict[str, object]) -> str:
    """``result`` (str keys; str, bool, int or float values) as one line of JSON, without ``json``."""
    def value(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        text = str(v).replace("\\", "\\\\").replace('"', '\\"')
        return '"' + "".join(c if c >= " " else f"\\u{ord(c):04x}" for c in text) + '"'

    return "{" + ", ".join(f"{value(k)}: {value(v)}" for k, v in result.items()) + "}"


def main(argv: list[str] | None = None) -> int:
    """Run one probe and print its JSON result line; exit 0 on success, 1 on failure, 2 on bad usage."""
    try:
        uuid, simulate = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        print(f"{USAGE}\ncuda_probe.py: error: {exc}", file=sys.stderr)
        return 2
    try:
        result = run_simulated(simulate) if simulate else run_cuda_probe(uuid)
    except ProbeError as exc:
        print(json_line({"ok": False, "error": str(exc)}), flush=True)
        return 1
    print(json_line(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
