"""FlashOverlap from Python: a Hopper GEMM overlapped with the NCCL AllReduce,
ReduceScatter or MoE All-to-All that follows it (include/flashoverlap/flashoverlap.h),
through the library's C ABI (flashoverlap_c.h) and ctypes, as vLLM's PyNccl
calls NCCL: nothing is compiled against PyTorch's C++ ABI, so one install
serves every PyTorch.

    import flashoverlap.torch as fo
    op = fo.GemmAllReduce(group, max_m=8192, n=8192, k=8192, dtype=torch.bfloat16)  # collective
    y = op(x, weight)       # AllReduce(x @ weight.T) over the group, on torch's current stream
    rs = fo.GemmReduceScatter(group, max_m=8192, n=8192, k=8192, dtype=torch.bfloat16)
    y = rs(x, weight)       # this rank's rows of the sum: (m / world, n)
    a2a = fo.GemmAllToAll(group, max_rows=8192, max_tokens=4096, topk=2, n=4096, k=8192, dtype=torch.bfloat16)
    y = a2a(x, weight, dest_rank, dest_token, gate, send_counts, recv_counts, tokens)  # the MoE combine: (tokens, n)

Importing this package imports no torch and loads no library: the library
(and with it libnccl.so.2) is loaded at first use (load()), after torch
where flashoverlap.torch is used, so that the process's one libnccl.so.2 is
torch's. Which library: FLASHOVERLAP_LIBRARY if set, else the copy the
install bundled next to this file (flashoverlap/lib/), else, run from a
source checkout, <repo>/build/src/api/ (library_path()).

Errors: FlashOverlapError, with InvalidArgument (the caller can fix it; also
a ValueError) and NoGpu (no usable Hopper GPU: fall back to another
implementation), mirroring the C ABI's FO_ERROR, FO_INVALID_ARGUMENT and
FO_NO_GPU with fo_last_error()'s message.
"""

import os
import threading

# The package's version; the library's (fo_version()) must be the same: the
# tests compare both with the CMake project's version.
__version__ = "0.1.0"

__all__ = [
    "__version__", "FlashOverlapError", "InvalidArgument", "NoGpu", "library_path", "load", "local_gpus", "nccl_version",
    "Communicator", "GemmAllReduce", "GemmReduceScatter", "GemmAllToAll", "unique_id", "allreduce_curve_path",
    "plan_gemm_allreduce", "plan_gemm_reducescatter", "plan_gemm_alltoall", "GroupedGemm",
]

# The C ABI's status codes (fo_status).
FO_OK, FO_INVALID_ARGUMENT, FO_NO_GPU, FO_ERROR = 0, 1, 2, 3

# The environment variable that names the library to load (overrides the bundled one).
LIBRARY_ENV = "FLASHOVERLAP_LIBRARY"


class FlashOverlapError(RuntimeError):
    """A FlashOverlap call failed (FO_ERROR: CUDA, NCCL or cuBLAS failed, a
    wait timed out, a broken installation). `status` is the C status code."""

    status = FO_ERROR

    def __init__(self, message, status=None):
        super().__init__(message)
        if status is not None:
            self.status = status


class InvalidArgument(FlashOverlapError, ValueError):
    """The caller can fix it (FO_INVALID_ARGUMENT): a bad shape, dtype,
    device or layout, m out of range, a null handle. Nothing was done."""

    status = FO_INVALID_ARGUMENT


class NoGpu(FlashOverlapError):
    """This process has no usable GPU (FO_NO_GPU): no driver, no CUDA device,
    or the device is not a Hopper (sm_90). The caller may fall back."""

    status = FO_NO_GPU


def error_for(status, message):
    """The exception for a C status and its message (fo_last_error())."""
    cls = {FO_INVALID_ARGUMENT: InvalidArgument, FO_NO_GPU: NoGpu}.get(status, FlashOverlapError)
    return cls(message, status)


_HERE = os.path.dirname(os.path.abspath(__file__))
_LIB_NAME = "libflashoverlap.so"


def library_path():
    """The libflashoverlap.so this package loads: $FLASHOVERLAP_LIBRARY, else
    the one installed with the package (flashoverlap/lib/), else the source
    checkout's build (<repo>/build/src/api/, for PYTHONPATH=python or an
    editable install). FlashOverlapError when none exists, naming where it
    looked."""
    env = os.environ.get(LIBRARY_ENV)
    if env:
        if not os.path.isfile(env):
            raise FlashOverlapError(f"{LIBRARY_ENV}={env}: no such file (it must name libflashoverlap.so)")
        return os.path.abspath(env)
    candidates = [
        os.path.join(_HERE, "lib", _LIB_NAME),
        os.path.join(os.path.dirname(os.path.dirname(_HERE)), "build", "src", "api", _LIB_NAME),
    ]
    for c in candidates:
        if os.path.isfile(c):
            return c
    raise FlashOverlapError(
        f"{_LIB_NAME} not found: {LIBRARY_ENV} is not set and the package has no library of its own "
        f"(looked at {', '.join(candidates)}); reinstall it from a build (python/pyproject.toml) or set {LIBRARY_ENV}")


_load_lock = threading.Lock()
_library = None


def load():
    """Loads the library (once; later calls return the same object) and
    checks that it speaks this package's C ABI. Loading maps libnccl.so.2
    too: import torch first where torch is used (flashoverlap.torch does)."""
    global _library
    with _load_lock:
        if _library is None:
            from . import _capi
            _library = _capi.Library(library_path())
        return _library


def local_gpus():
    """(hopper, cuda_failed, reason): the GPUs of this process the ops run on
    (Hopper, sm_90), whether CUDA failed to start or answer, and why there
    are none (flashoverlap::local_gpus(); loads the library)."""
    return load().local_gpus()


def nccl_version():
    """(major, minor, patch) of the NCCL the library runs on (loads it)."""
    return load().nccl_version()


def __getattr__(name):
    # The ctypes layer's classes, without importing it (nor loading anything) at import.
    if name in ("Communicator", "GemmAllReduce", "GemmReduceScatter", "GemmAllToAll", "unique_id",
                "allreduce_curve_path", "plan_gemm_allreduce", "plan_gemm_reducescatter", "plan_gemm_alltoall",
                "GroupedGemm"):
        from . import _capi
        return getattr(_capi, name)
    raise AttributeError(f"module 'flashoverlap' has no attribute {name!r}")
