"""The C ABI (include/flashoverlap/flashoverlap_c.h) through ctypes.

Every function of the header is declared here with its argtypes and restype
(_PROTOTYPES, in the header's order); those that return an fo_status raise
the matching exception (flashoverlap.error_for) with fo_last_error()'s
message, read right after the call on the same thread (the last error is
per thread). The loader checks fo_c_abi_version() against C_ABI_VERSION: a
library whose layouts differ from these declarations is refused before any
call.

Above the raw functions, Communicator, GemmAllReduce, GemmReduceScatter and
GemmAllToAll own a handle each (destroyed by close() or by the garbage
collector) and take device pointers and streams as integers, as torch's
data_ptr() and cuda_stream give them.

NCCL: the library needs libnccl.so.2 >= 2.28 (it calls 2.28's device API and
symmetric windows) and runs on whichever libnccl.so.2 the process has loaded
first: one library of that name serves a process. Library.nccl_version() and
nccl_file() say which; Communicator's constructors refuse an unsupported one.
"""

import collections
import ctypes
import os
import re
from ctypes import POINTER, byref, c_char_p, c_double, c_float, c_int, c_int32, c_int64, c_size_t, c_uint32, c_void_p

from . import FO_OK, FlashOverlapError, InvalidArgument, error_for

# FO_C_ABI_VERSION of the header these declarations mirror.
C_ABI_VERSION = 1
UNIQUE_ID_BYTES = 128  # FO_UNIQUE_ID_BYTES

# fo_dtype, fo_path, fo_rs_layout
DTYPE_BF16, DTYPE_FP16 = 0, 1
PATHS = {"auto": 0, "sequential": 1, "row_bands": 2, "slots": 3, "nvlink": 5, "owners": 5}  # ("owners": nvlink's
# former name, taken as it)
RS_PATHS = {"auto": 0, "sequential": 1, "slots": 3, "nvlink": 5}  # (GemmReduceScatter's: those fo_path values)
A2A_PATHS = dict(RS_PATHS)  # (GemmAllToAll's: the same)
RS_LAYOUTS = {"standard": 0, "subtile": 1}
DTYPES = {"bf16": DTYPE_BF16, "bfloat16": DTYPE_BF16, "fp16": DTYPE_FP16, "float16": DTYPE_FP16}

# The NCCL versions the library runs on: [NCCL_MIN, NCCL_END). 2.28 is what
# it is built for (docs/design.md §1) and the first with the device API it
# calls (ncclTeamLsa); NCCL keeps its ABI within a major version.
NCCL_MIN = (2, 28)
NCCL_END = (3, 0)


class Options(ctypes.Structure):
    """fo_gemm_allreduce_options (56 bytes; c_api.cpp asserts the offsets)."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("path", c_int32),
        ("nccl_sms", c_int32),
        ("wait_timeout_s", c_double),
        ("check_m", c_int32),
        ("reserved_", c_int32),
        ("curves", c_char_p),
        ("tuning_cache", c_char_p),
        ("input", c_int32),
        ("scales", c_int32),
    ]


assert ctypes.sizeof(Options) == 56 and Options.curves.offset == 32 and Options.tuning_cache.offset == 40 \
    and Options.input.offset == 48 and Options.scales.offset == 52, "fo_gemm_allreduce_options layout"


class RsOptions(ctypes.Structure):
    """fo_gemm_reducescatter_options (48 bytes; c_api.cpp asserts the offsets)."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("path", c_int32),
        ("nccl_sms", c_int32),
        ("wait_timeout_s", c_double),
        ("check_m", c_int32),
        ("layout", c_int32),
        ("tuning_cache", c_char_p),
        ("input", c_int32),
        ("scales", c_int32),
    ]


assert ctypes.sizeof(RsOptions) == 48 and RsOptions.layout.offset == 28 and RsOptions.tuning_cache.offset == 32 \
    and RsOptions.input.offset == 40 and RsOptions.scales.offset == 44, "fo_gemm_reducescatter_options layout"


class A2aOptions(ctypes.Structure):
    """fo_gemm_alltoall_options (48 bytes; c_api.cpp asserts the offsets).
    experts is appended after the first version's fields (a struct_size of 32
    reads as one expert per rank), input and scales after the second's (40:
    16-bit inputs)."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("path", c_int32),
        ("nccl_sms", c_int32),
        ("wait_timeout_s", c_double),
        ("exchange_timeout_s", c_double),
        ("experts", c_int32),
        ("input", c_int32),
        ("scales", c_int32),
    ]


assert ctypes.sizeof(A2aOptions) == 48 and A2aOptions.exchange_timeout_s.offset == 24 \
    and A2aOptions.experts.offset == 32 and A2aOptions.input.offset == 36 and A2aOptions.scales.offset == 40, \
    "fo_gemm_alltoall_options layout"


class GroupedOptions(ctypes.Structure):
    """fo_gemm_grouped_options (16 bytes; c_api.cpp asserts the offsets)."""

    _fields_ = [("struct_size", c_size_t), ("path", c_int32)]


assert ctypes.sizeof(GroupedOptions) == 16 and GroupedOptions.path.offset == 8, "fo_gemm_grouped_options layout"

# GroupedGemmOptions::Path, by name.
GROUPED_PATHS = {"auto": 0, "ours": 1, "cublas": 2}


class Routing(ctypes.Structure):
    """fo_alltoall_routing (80 bytes; c_api.cpp asserts the offsets): one
    call's routing on this rank, its arrays in host memory, or in device
    memory with on_device. expert_counts (host, world * experts entries;
    NULL with one expert per rank) is appended last (a struct_size without
    it reads as NULL)."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("rows", c_int64),
        ("dest_rank", POINTER(c_int32)),
        ("dest_token", POINTER(c_int32)),
        ("gate", POINTER(c_float)),
        ("tokens", c_int64),
        ("send_counts", POINTER(c_int64)),
        ("recv_counts", POINTER(c_int64)),
        ("on_device", c_int64),
        ("expert_counts", POINTER(c_int64)),
    ]


assert ctypes.sizeof(Routing) == 80 and Routing.tokens.offset == 40 and Routing.recv_counts.offset == 56 \
    and Routing.on_device.offset == 64 and Routing.expert_counts.offset == 72, "fo_alltoall_routing layout"

# flashoverlap::LocalGpus: the GPUs of this process the ops run on, or why none.
LocalGpus = collections.namedtuple("LocalGpus", ["hopper", "cuda_failed", "reason"])

_h = c_void_p  # fo_comm_t, fo_gemm_*_t, void* (device pointers, streams, ncclComm_t)
_STATUS = "status"  # restype marker: an fo_status, checked

# name: (restype, argtypes), in flashoverlap_c.h's order.
_PROTOTYPES = {
    "fo_version": (c_char_p, []),
    "fo_c_abi_version": (c_uint32, []),
    "fo_status_string": (c_char_p, [c_int]),
    "fo_last_error": (c_char_p, []),
    "fo_local_gpus": (_STATUS, [POINTER(c_int), POINTER(c_int), c_char_p, c_size_t, POINTER(c_size_t)]),
    "fo_measure_allreduce_curve": (_STATUS, [_h, c_int, c_int, c_double, c_int, c_char_p]),
    "fo_allreduce_curve_path": (_STATUS, [c_char_p, c_int, c_int, c_int, c_char_p, c_size_t, POINTER(c_size_t)]),
    "fo_plan_gemm_allreduce": (_STATUS, [c_int64, c_int64, c_int64, c_int, c_int, POINTER(Options), c_int, c_char_p,
                                         c_char_p, c_size_t, POINTER(c_size_t)]),
    "fo_plan_gemm_reducescatter": (_STATUS, [c_int64, c_int64, c_int64, c_int, c_int, POINTER(RsOptions), c_int,
                                             c_char_p, c_int, c_char_p, c_size_t, POINTER(c_size_t)]),
    "fo_plan_gemm_alltoall": (_STATUS, [POINTER(Routing), c_int, c_int64, c_int64, c_int, POINTER(A2aOptions), c_int,
                                        c_int, c_char_p, c_size_t, POINTER(c_size_t)]),
    "fo_comm_adopt": (_STATUS, [_h, POINTER(_h)]),
    "fo_comm_from_env": (_STATUS, [POINTER(_h)]),
    "fo_comm_from_unique_id": (_STATUS, [c_void_p, c_size_t, c_int, c_int, POINTER(_h)]),
    "fo_unique_id": (_STATUS, [c_void_p, c_size_t]),
    "fo_comm_rank": (_STATUS, [_h, POINTER(c_int)]),
    "fo_comm_world": (_STATUS, [_h, POINTER(c_int)]),
    "fo_comm_nccl": (_STATUS, [_h, POINTER(_h)]),
    "fo_comm_destroy": (_STATUS, [_h]),
    "fo_gemm_allreduce_options_default": (_STATUS, [POINTER(Options), c_size_t]),
    "fo_gemm_allreduce_create": (_STATUS, [_h, c_int64, c_int64, c_int64, c_int, POINTER(Options), POINTER(_h)]),
    "fo_gemm_allreduce_run": (_STATUS, [_h, _h, _h, _h, c_int64, _h, c_int64]),
    "fo_gemm_allreduce_run_scaled": (_STATUS, [_h, _h, _h, _h, c_int64, _h, c_int64, _h, _h]),
    "fo_gemm_allreduce_run_rmsnorm": (_STATUS, [_h, _h, _h, _h, _h, c_float, _h, _h, c_int64, _h]),
    "fo_gemm_allreduce_run_rmsnorm_scaled": (_STATUS, [_h, _h, _h, _h, _h, c_float, _h, _h, c_int64, _h, _h, _h]),
    "fo_gemm_allreduce_register_output": (_STATUS, [_h, _h, c_int64, POINTER(ctypes.c_int)]),
    "fo_gemm_allreduce_run_registered": (_STATUS, [_h, _h, _h, ctypes.c_int, c_int64, _h]),
    "fo_gemm_allreduce_run_registered_scaled": (_STATUS, [_h, _h, _h, ctypes.c_int, c_int64, _h, _h, _h]),
    "fo_gemm_allreduce_prepare": (_STATUS, [_h, c_int64]),
    "fo_gemm_allreduce_plan": (_STATUS, [_h, c_int64, c_void_p, c_size_t, POINTER(c_size_t)]),
    "fo_gemm_allreduce_check": (_STATUS, [_h]),
    "fo_gemm_allreduce_shape": (_STATUS, [_h, POINTER(c_int64), POINTER(c_int64), POINTER(c_int64), POINTER(c_int)]),
    "fo_gemm_allreduce_destroy": (_STATUS, [_h]),
    "fo_gemm_reducescatter_options_default": (_STATUS, [POINTER(RsOptions), c_size_t]),
    "fo_gemm_reducescatter_create": (_STATUS, [_h, c_int64, c_int64, c_int64, c_int, POINTER(RsOptions), POINTER(_h)]),
    "fo_gemm_reducescatter_run": (_STATUS, [_h, _h, _h, _h, c_int64, _h, c_int64]),
    "fo_gemm_reducescatter_run_scaled": (_STATUS, [_h, _h, _h, _h, c_int64, _h, c_int64, _h, _h]),
    "fo_gemm_reducescatter_run_rmsnorm": (_STATUS, [_h, _h, _h, _h, _h, c_float, _h, _h, c_int64, _h]),
    "fo_gemm_reducescatter_run_rmsnorm_scaled": (_STATUS, [_h, _h, _h, _h, _h, c_float, _h, _h, c_int64, _h, _h, _h]),
    "fo_gemm_reducescatter_rows_out": (_STATUS, [_h, c_int64, POINTER(c_int64)]),
    "fo_gemm_reducescatter_rows": (_STATUS, [_h, c_int64, POINTER(c_int64), c_size_t, POINTER(c_size_t)]),
    "fo_gemm_reducescatter_all_gather_rows": (_STATUS, [_h, _h, _h, c_int64, _h]),
    "fo_gemm_reducescatter_prepare": (_STATUS, [_h, c_int64]),
    "fo_gemm_reducescatter_plan": (_STATUS, [_h, c_int64, c_void_p, c_size_t, POINTER(c_size_t)]),
    "fo_gemm_reducescatter_check": (_STATUS, [_h]),
    "fo_gemm_reducescatter_shape": (_STATUS, [_h, POINTER(c_int64), POINTER(c_int64), POINTER(c_int64), POINTER(c_int),
                                              POINTER(c_int)]),
    "fo_gemm_reducescatter_destroy": (_STATUS, [_h]),
    "fo_gemm_alltoall_options_default": (_STATUS, [POINTER(A2aOptions), c_size_t]),
    "fo_gemm_alltoall_create": (_STATUS, [_h, c_int64, c_int64, c_int, c_int64, c_int64, c_int, POINTER(A2aOptions),
                                          POINTER(_h)]),
    "fo_gemm_alltoall_run": (_STATUS, [_h, _h, _h, POINTER(Routing), _h, c_int64, c_int, POINTER(c_int32), _h]),
    "fo_gemm_alltoall_run_scaled": (_STATUS, [_h, _h, _h, POINTER(Routing), _h, c_int64, c_int, POINTER(c_int32), _h,
                                              _h, _h]),
    "fo_gemm_alltoall_last_plan": (_STATUS, [_h, c_void_p, c_size_t, POINTER(c_size_t)]),
    "fo_gemm_alltoall_check": (_STATUS, [_h]),
    "fo_gemm_alltoall_shape": (_STATUS, [_h, POINTER(c_int64), POINTER(c_int64), POINTER(c_int), POINTER(c_int64),
                                         POINTER(c_int64), POINTER(c_int), POINTER(c_int)]),
    "fo_gemm_alltoall_destroy": (_STATUS, [_h]),
    "fo_gemm_grouped_options_default": (_STATUS, [POINTER(GroupedOptions), c_size_t]),
    "fo_gemm_grouped_create": (_STATUS, [c_int64, c_int, c_int64, c_int64, c_int, POINTER(GroupedOptions),
                                         POINTER(_h)]),
    "fo_gemm_grouped_run": (_STATUS, [_h, _h, _h, POINTER(c_int64), _h, c_int64, _h]),
    "fo_gemm_grouped_run_offsets": (_STATUS, [_h, _h, _h, _h, c_int64, _h, c_int64, _h]),
    "fo_gemm_grouped_check": (_STATUS, [_h]),
    "fo_gemm_grouped_last_plan": (_STATUS, [_h, c_void_p, c_size_t, POINTER(c_size_t)]),
    "fo_gemm_grouped_shape": (_STATUS, [_h, POINTER(c_int64), POINTER(c_int), POINTER(c_int64), POINTER(c_int64),
                                        POINTER(c_int)]),
    "fo_gemm_grouped_destroy": (_STATUS, [_h]),
}


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", c_char_p), ("dli_fbase", c_void_p), ("dli_sname", c_char_p), ("dli_saddr", c_void_p)]


def _dladdr():
    for name in (None, "libdl.so.2"):  # (glibc >= 2.34 has it in libc)
        try:
            f = ctypes.CDLL(name).dladdr
        except (OSError, AttributeError):
            continue
        f.argtypes, f.restype = [c_void_p, POINTER(_DlInfo)], c_int
        return f
    return None


def file_of(function):
    """The file of the loaded object that defines a ctypes function, or None."""
    dladdr = _dladdr()
    info = _DlInfo()
    if dladdr is None or not dladdr(ctypes.cast(function, c_void_p), byref(info)) or not info.dli_fname:
        return None
    return os.path.realpath(os.fsdecode(info.dli_fname))


def mapped_nccl_files():
    """The libnccl files mapped into this process (/proc/self/maps), sorted."""
    try:
        with open("/proc/self/maps") as f:
            fields = (line.split(None, 5) for line in f if "libnccl" in line)
            paths = {x[5].strip() for x in fields if len(x) == 6}
    except OSError:
        return []
    return sorted(p for p in paths if re.search(r"libnccl[^/]*\.so", os.path.basename(p)))


def decode_nccl_version(code):
    """ncclGetVersion's integer as (major, minor, patch): 22809 -> (2, 28, 9)
    (NCCL >= 2.9: major*10000 + minor*100 + patch; before: major*1000 + ...)."""
    if code >= 10000:
        return code // 10000, (code % 10000) // 100, code % 100
    return code // 1000, (code % 1000) // 100, code % 100


def check_nccl_version(version, where=""):
    """FlashOverlapError unless NCCL_MIN <= version[:2] < NCCL_END."""
    if not (NCCL_MIN <= tuple(version[:2]) < NCCL_END):
        v = ".".join(map(str, version))
        raise FlashOverlapError(
            f"flashoverlap runs on NCCL {NCCL_MIN[0]}.{NCCL_MIN[1]} and later {NCCL_MIN[0]}.x, but this process runs "
            f"NCCL {v}{where}: one libnccl.so.2 serves a process (torch's, where torch loaded it first): "
            f"use a PyTorch whose NCCL is >= {NCCL_MIN[0]}.{NCCL_MIN[1]}")


def _nccl_version_of(cdll):
    get = cdll.ncclGetVersion
    get.argtypes, get.restype = [POINTER(c_int)], c_int
    code = c_int(0)
    if get(byref(code)) != 0:
        raise FlashOverlapError("ncclGetVersion failed")
    return decode_nccl_version(code.value)


def _describe_nccl(files):
    """Which NCCL files are mapped and their versions, for messages."""
    out = []
    for path in files:
        try:
            out.append(f"{path} (NCCL {'.'.join(map(str, _nccl_version_of(ctypes.CDLL(path))))})")
        except (OSError, AttributeError, FlashOverlapError):
            out.append(path)
    return ", ".join(out) or "none"


class Library:
    """libflashoverlap.so, loaded, its functions declared (attribute `c`)."""

    def __init__(self, path):
        self.path = path
        # Which NCCL was here before us: the one our libnccl.so.2 binds to.
        self.nccl_before = mapped_nccl_files()
        try:
            c = ctypes.CDLL(path)
        except OSError as e:
            hint = ""
            if "nccl" in str(e).lower() or "undefined symbol: nccl" in str(e):
                hint = (f"; the process's NCCL: {_describe_nccl(mapped_nccl_files())} "
                        f"(flashoverlap needs NCCL >= {NCCL_MIN[0]}.{NCCL_MIN[1]})")
            raise FlashOverlapError(f"cannot load {path}: {e}{hint}") from None
        self.c = c
        for name, (restype, argtypes) in _PROTOTYPES.items():
            try:
                f = getattr(c, name)
            except AttributeError:
                raise FlashOverlapError(f"{path} has no {name}: not a flashoverlap library of this version") from None
            f.argtypes = argtypes
            if restype is _STATUS:
                f.restype = c_int
                f.errcheck = self._errcheck
            else:
                f.restype = restype
        abi = c.fo_c_abi_version()
        if abi != C_ABI_VERSION:
            raise FlashOverlapError(
                f"{path} speaks C ABI {abi}, this package (flashoverlap {self.package_version()}) C ABI "
                f"{C_ABI_VERSION}: install the package and the library from one build")

    @staticmethod
    def package_version():
        from . import __version__
        return __version__

    def _errcheck(self, status, func, args):
        if status != FO_OK:
            raise error_for(status, self.last_error() or f"{func.__name__}: {self.status_string(status)}")
        return status

    def version(self):
        """fo_version(): the library's "MAJOR.MINOR.PATCH"."""
        return self.c.fo_version().decode()

    def abi_version(self):
        return int(self.c.fo_c_abi_version())

    def status_string(self, status):
        return self.c.fo_status_string(status).decode()

    def last_error(self):
        return self.c.fo_last_error().decode(errors="replace")

    def local_gpus(self):
        """fo_local_gpus(): (usable Hopper GPUs, whether CUDA failed, why there are none)."""
        hopper, failed, needed = c_int(0), c_int(0), c_size_t(0)
        self.c.fo_local_gpus(byref(hopper), byref(failed), None, 0, byref(needed))
        buf = ctypes.create_string_buffer(needed.value)
        self.c.fo_local_gpus(byref(hopper), byref(failed), buf, needed.value, None)
        return LocalGpus(hopper.value, bool(failed.value), buf.value.decode(errors="replace"))

    def nccl_version(self):
        """(major, minor, patch) of the NCCL the library's calls go to."""
        return _nccl_version_of(self.c)  # (dlsym through our handle: our libnccl.so.2)

    def nccl_file(self):
        """The path of that NCCL, or None where it cannot be told."""
        return file_of(self.c.ncclGetVersion)

    def check_nccl(self):
        """FlashOverlapError unless the NCCL underneath is one the library supports."""
        check_nccl_version(self.nccl_version(), f" ({self.nccl_file() or 'libnccl.so.2'})")

    def shares_nccl_with(self, other_library):
        """(True, "") if the shared library at that path calls the same loaded
        NCCL as this one (the same ncclGetVersion), else (False, why): a
        communicator of the one may then be handed to the other."""
        try:
            theirs = ctypes.CDLL(other_library).ncclGetVersion
        except OSError as e:
            return False, f"cannot open {other_library}: {e}"
        except AttributeError:
            return False, f"{other_library} shows no NCCL of its own (statically linked or hidden)"
        ours = self.c.ncclGetVersion
        a, b = ctypes.cast(ours, c_void_p).value, ctypes.cast(theirs, c_void_p).value
        if a != b:
            return False, f"{other_library} calls the NCCL in {file_of(theirs)}, flashoverlap the one in {file_of(ours)}"
        return True, ""


def _lib():
    from . import load
    return load()


def unique_id():
    """A new NCCL unique id (FO_UNIQUE_ID_BYTES bytes), to send to every rank."""
    buf = ctypes.create_string_buffer(UNIQUE_ID_BYTES)
    _lib().c.fo_unique_id(buf, UNIQUE_ID_BYTES)
    return buf.raw


class _Handle:
    _destroy = None  # the C function's name

    def __init__(self, lib, handle):
        self._lib, self._handle = lib, handle

    @property
    def handle(self):
        """The C handle (c_void_p); FlashOverlapError once closed."""
        if not self._handle:
            raise FlashOverlapError(f"this {type(self).__name__} is closed")
        return self._handle

    def close(self):
        """Releases the handle now (the garbage collector does it otherwise)."""
        h, self._handle = getattr(self, "_handle", None), None
        if h:
            getattr(self._lib.c, self._destroy)(h)

    def __del__(self):
        try:
            self.close()
        except Exception:  # (at interpreter exit CUDA may be gone: nothing to report to)
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Communicator(_Handle):
    """The NCCL communicator the ops run on (flashoverlap::Communicator). An op
    keeps its communicator alive: this object may be closed once its ops exist."""

    _destroy = "fo_comm_destroy"

    @classmethod
    def _make(cls, create):
        lib = _lib()
        lib.check_nccl()
        out = c_void_p()
        create(lib.c, byref(out))
        return cls(lib, out)

    @classmethod
    def from_env(cls):
        """A new communicator over torchrun's or OpenMPI's processes (collective;
        one rank without their variables)."""
        return cls._make(lambda c, out: c.fo_comm_from_env(out))

    @classmethod
    def from_unique_id(cls, uid, rank, world):
        """A new communicator from rank 0's unique_id(), collective over `world`
        ranks, each on its current CUDA device."""
        uid = bytes(uid)
        return cls._make(lambda c, out: c.fo_comm_from_unique_id(uid, len(uid), rank, world, out))

    @classmethod
    def adopt(cls, nccl_comm):
        """A communicator the caller owns (a ncclComm_t as an integer): it must
        outlive this object and every op built on it, and be of the NCCL that
        the library runs on (Library.shares_nccl_with)."""
        return cls._make(lambda c, out: c.fo_comm_adopt(nccl_comm, out))

    def _int(self, fn):
        v = c_int()
        fn(self.handle, byref(v))
        return v.value

    @property
    def rank(self):
        return self._int(self._lib.c.fo_comm_rank)

    @property
    def world(self):
        return self._int(self._lib.c.fo_comm_world)

    @property
    def nccl(self):
        """The ncclComm_t underneath, as an integer."""
        v = c_void_p()
        self._lib.c.fo_comm_nccl(self.handle, byref(v))
        return v.value or 0

    def measure_allreduce_curve(self, path, dtype="bf16", nccl_ctas=0, max_mib=256, iters=10):
        """Collective: NCCL's AllReduce measured over the ranks, written by rank
        0 to path as JSON (flashoverlap::measure_allreduce_curve; where
        allreduce_curve_path(dir, ...) says, GemmAllReduce's curves=dir reads it)."""
        self._lib.c.fo_measure_allreduce_curve(self.handle, dtype_code(dtype), int(nccl_ctas), float(max_mib),
                                               int(iters), os.fsencode(path))


def allreduce_curve_path(directory, nccl_ctas, world, dtype="bf16"):
    """The file under a curves directory that GemmAllReduce reads for that CTA
    budget (0: NCCL's default), world size and dtype."""
    c, d, needed = _lib().c, os.fsencode(directory), c_size_t(0)
    code = dtype_code(dtype)
    c.fo_allreduce_curve_path(d, int(nccl_ctas), int(world), code, None, 0, byref(needed))
    buf = ctypes.create_string_buffer(needed.value)
    c.fo_allreduce_curve_path(d, int(nccl_ctas), int(world), code, buf, needed.value, None)
    return os.fsdecode(buf.value)


def _text(fn, *args):
    """A free function's text (fo_plan_gemm_*, ...: the size first, then the text)."""
    needed = c_size_t(0)
    fn(*args, None, 0, byref(needed))
    buf = ctypes.create_string_buffer(needed.value)
    fn(*args, buf, needed.value, None)
    return buf.value.decode(errors="replace")


def plan_gemm_allreduce(m, n, k, world, dtype="bf16", *, sms=132, gpu="NVIDIA H200", **options):
    """The plan GemmAllReduce runs for m, from the model alone (no GPU;
    flashoverlap::plan_gemm_allreduce). options: GemmAllReduce's keywords
    (path, nccl_sms, curves, tuning_cache, ...)."""
    lib = _lib()
    opts = make_options(lib, **options)
    return _text(lib.c.fo_plan_gemm_allreduce, m, n, k, world, dtype_code(dtype), byref(opts), sms, gpu.encode())


def plan_gemm_reducescatter(m, n, k, world, dtype="bf16", *, sms=132, gpu="NVIDIA H200", rank=0, **options):
    """The plan GemmReduceScatter runs for m on `rank`, from the model alone
    (flashoverlap::plan_gemm_reducescatter). options: GemmReduceScatter's keywords."""
    lib = _lib()
    opts = make_rs_options(lib, **options)
    return _text(lib.c.fo_plan_gemm_reducescatter, m, n, k, world, dtype_code(dtype), byref(opts), sms, gpu.encode(),
                 rank)


def plan_gemm_alltoall(routings, n, k, dtype="bf16", *, sms=132, rank=0, **options):
    """The plan GemmAllToAll runs for a call on `rank`, from the model alone
    (flashoverlap::plan_gemm_alltoall). routings: one per rank, each a dict of
    dest_rank, dest_token, gate (optional), tokens, send_counts, recv_counts
    and, with several experts per rank, expert_counts (host sequences, as
    make_routing takes them). options: GemmAllToAll's keywords (experts
    among them)."""
    lib = _lib()
    opts = make_a2a_options(lib, **options)
    world = len(routings)
    if world < 1:
        raise InvalidArgument("routings: one per rank, at least one")
    experts = options.get("experts") or 1
    array, keep = (Routing * world)(), []
    for i, r in enumerate(routings):
        rows = len(r["dest_rank"])
        array[i], kept = make_routing(rows, r["dest_rank"], r["dest_token"], r.get("gate"), r["tokens"],
                                      r["send_counts"], r["recv_counts"], world,
                                      expert_counts=r.get("expert_counts"), experts=experts)
        keep.append(kept)
    return _text(lib.c.fo_plan_gemm_alltoall, array, world, n, k, dtype_code(dtype), byref(opts), sms, rank)


# InputType and ScaleKind (fo_input_type, fo_scale_kind)
INPUTS = {"same": 0, "e4m3": 1}
SCALES = {"none": 0, "tensor": 1, "row": 2}


def input_codes(input, scales):
    """(fo_input_type, fo_scale_kind) of the keywords input and scales."""
    if input not in INPUTS:
        raise InvalidArgument(f"input = {input!r}: one of {', '.join(map(repr, INPUTS))}")
    if scales not in SCALES:
        raise InvalidArgument(f"scales = {scales!r}: one of {', '.join(map(repr, SCALES))}")
    return INPUTS[input], SCALES[scales]


def make_options(lib, path="auto", nccl_sms=None, wait_timeout_s=None, check_m=None, curves=None, tuning_cache=None,
                 input="same", scales="none"):
    """fo_gemm_allreduce_options: the library's defaults, then what is given."""
    o = Options()
    lib.c.fo_gemm_allreduce_options_default(byref(o), ctypes.sizeof(o))
    if path not in PATHS:
        raise InvalidArgument(f"path = {path!r}: one of {', '.join(map(repr, PATHS))}")
    o.path = PATHS[path]
    o.input, o.scales = input_codes(input, scales)
    if nccl_sms is not None:
        o.nccl_sms = int(nccl_sms)
    if wait_timeout_s is not None:
        o.wait_timeout_s = float(wait_timeout_s)
    if check_m is not None:
        o.check_m = 1 if check_m else 0
    if curves:
        o.curves = os.fsencode(curves)
    if tuning_cache:
        o.tuning_cache = os.fsencode(tuning_cache)
    return o


def make_rs_options(lib, path="auto", layout="standard", nccl_sms=None, wait_timeout_s=None, check_m=None,
                    tuning_cache=None, input="same", scales="none"):
    """fo_gemm_reducescatter_options: the library's defaults, then what is given."""
    o = RsOptions()
    lib.c.fo_gemm_reducescatter_options_default(byref(o), ctypes.sizeof(o))
    if path not in RS_PATHS:
        raise InvalidArgument(f"path = {path!r}: one of {', '.join(map(repr, RS_PATHS))} (GemmReduceScatter's)")
    if layout not in RS_LAYOUTS:
        raise InvalidArgument(f"layout = {layout!r}: one of {', '.join(map(repr, RS_LAYOUTS))}")
    o.path, o.layout = RS_PATHS[path], RS_LAYOUTS[layout]
    o.input, o.scales = input_codes(input, scales)
    if nccl_sms is not None:
        o.nccl_sms = int(nccl_sms)
    if wait_timeout_s is not None:
        o.wait_timeout_s = float(wait_timeout_s)
    if check_m is not None:
        o.check_m = 1 if check_m else 0
    if tuning_cache:
        o.tuning_cache = os.fsencode(tuning_cache)
    return o


def check_experts(experts, who=""):
    """experts as an int >= 1 (experts per rank), else InvalidArgument."""
    if isinstance(experts, bool) or not isinstance(experts, int):
        raise InvalidArgument(f"{who}experts = {experts!r} is not an int (experts per rank)")
    if experts < 1:
        raise InvalidArgument(f"{who}experts = {experts}: needs experts >= 1 (experts per rank)")
    return experts


def make_a2a_options(lib, path="auto", nccl_sms=None, wait_timeout_s=None, exchange_timeout_s=None, experts=None,
                     input="same", scales="none"):
    """fo_gemm_alltoall_options: the library's defaults, then what is given.
    experts None or 1 keeps the default (one expert per rank), which leaves
    the field unset for a library that does not know it."""
    o = A2aOptions()
    lib.c.fo_gemm_alltoall_options_default(byref(o), ctypes.sizeof(o))
    if path not in A2A_PATHS:
        raise InvalidArgument(f"path = {path!r}: one of {', '.join(map(repr, A2A_PATHS))} (GemmAllToAll's)")
    o.path = A2A_PATHS[path]
    o.input, o.scales = input_codes(input, scales)
    if experts is not None and check_experts(experts) != 1:
        o.experts = experts
    if nccl_sms is not None:
        o.nccl_sms = int(nccl_sms)
    if wait_timeout_s is not None:
        o.wait_timeout_s = float(wait_timeout_s)
    if exchange_timeout_s is not None:
        o.exchange_timeout_s = float(exchange_timeout_s)
    return o


def _plan_text(fn, handle, *args):
    """A plan function's text (fo_gemm_*_plan(handle, m, ...), fo_gemm_alltoall_last_plan(handle, ...): the size
    first, then the text)."""
    needed = c_size_t(0)
    fn(handle, *args, None, 0, byref(needed))
    buf = ctypes.create_string_buffer(needed.value)
    fn(handle, *args, buf, needed.value, None)
    return buf.value.decode(errors="replace")


def dtype_code(dtype):
    """An fo_dtype from 0/1 or "bf16"/"bfloat16"/"fp16"/"float16"."""
    if isinstance(dtype, str) and dtype.lower() in DTYPES:
        return DTYPES[dtype.lower()]
    if dtype in (DTYPE_BF16, DTYPE_FP16) and not isinstance(dtype, bool):
        return int(dtype)
    raise InvalidArgument(f"dtype = {dtype!r}: bf16 or fp16")


class _GemmBase(_Handle):
    """What every op's class shares: the C functions fo_gemm_<kind>_<name>."""

    _kind = None  # "allreduce" | "reducescatter" | "alltoall"

    def _c(self, name):
        return getattr(self._lib.c, f"fo_gemm_{self._kind}_{name}")

    def check(self):
        """Raises the error of an earlier call whose wait timed out."""
        self._c("check")(self.handle)


class _GemmOp(_GemmBase):
    """What the ops whose calls take m rows share (GemmAllReduce, GemmReduceScatter)."""

    def run(self, a, b, out, m, stream=None, ld_out=0):
        """The op's result for m rows of a into out, on stream (a cudaStream_t
        as an integer; None/0: the legacy default stream)."""
        self._c("run")(self.handle, a, b, out, m, stream or None, ld_out)

    def run_rmsnorm(self, a, b, residual, norm_weight, eps, out, residual_out, m, stream=None):
        """out = RMSNorm(h) * norm_weight, h = the op's result + residual;
        residual_out (optional) = h."""
        self._c("run_rmsnorm")(self.handle, a, b, residual, norm_weight, eps, out, residual_out or None, m,
                               stream or None)

    def run_scaled(self, a, b, out, m, stream, scale_a, scale_b):
        """run with FP8 inputs' scales (device pointers; None, None: unscaled)."""
        self._c("run_scaled")(self.handle, a, b, out, m, stream or None, 0, scale_a, scale_b)

    def run_rmsnorm_scaled(self, a, b, residual, norm_weight, eps, out, residual_out, m, stream, scale_a, scale_b):
        """run_rmsnorm with FP8 inputs' scales."""
        self._c("run_rmsnorm_scaled")(self.handle, a, b, residual, norm_weight, eps, out, residual_out or None, m,
                                      stream or None, scale_a, scale_b)

    def prepare(self, m):
        """Plans m and allocates what its calls need: before a CUDA-graph capture."""
        self._c("prepare")(self.handle, m)

    def plan(self, m):
        """The plan m runs with, as text."""
        return _plan_text(self._c("plan"), self.handle, m)


class GemmAllReduce(_GemmOp):
    """out (m x n) = AllReduce(a (m x k) * b^T (b: n x k)) over comm's ranks, on
    device pointers (flashoverlap::GemmAllReduce). Construction is collective."""

    _destroy = "fo_gemm_allreduce_destroy"
    _kind = "allreduce"

    def __init__(self, comm, max_m, n, k, dtype, *, path="auto", nccl_sms=None, wait_timeout_s=None, check_m=None,
                 curves=None, tuning_cache=None, input="same", scales="none"):
        lib = _lib()
        opts = make_options(lib, path, nccl_sms, wait_timeout_s, check_m, curves, tuning_cache, input, scales)
        code = dtype_code(dtype)
        out = c_void_p()
        lib.c.fo_gemm_allreduce_create(comm.handle, max_m, n, k, code, byref(opts), byref(out))
        super().__init__(lib, out)

    def register_output(self, out, ld_out=0):
        """Collective: out (a device pointer, max_m x n, ld_out per row, 0: n;
        it must outlive the op) becomes an output slot, returned (the same
        on every rank)."""
        slot = ctypes.c_int(-1)
        self._lib.c.fo_gemm_allreduce_register_output(self.handle, out, ld_out, byref(slot))
        return slot.value

    def run_registered(self, a, b, slot, m, stream=None, scale_a=None, scale_b=None):
        """The AllReduce of m rows of a into the registered output `slot`
        (FP8 inputs: with the scales' device pointers, as the options say)."""
        if scale_a is None and scale_b is None:
            self._lib.c.fo_gemm_allreduce_run_registered(self.handle, a, b, slot, m, stream or None)
        else:
            self._lib.c.fo_gemm_allreduce_run_registered_scaled(self.handle, a, b, slot, m, stream or None, scale_a,
                                                                 scale_b)


    def shape(self):
        """(max_m, n, k, dtype code)."""
        max_m, n, k, d = c_int64(), c_int64(), c_int64(), c_int()
        self._lib.c.fo_gemm_allreduce_shape(self.handle, byref(max_m), byref(n), byref(k), byref(d))
        return max_m.value, n.value, k.value, d.value


class GemmReduceScatter(_GemmOp):
    """out (rows_out(m) x n) = this rank's rows of the sum over comm's ranks of
    a (m x k) * b^T (b: n x k), on device pointers
    (flashoverlap::GemmReduceScatter). Construction is collective.

    layout "standard": rank r holds rows [r m/W, (r+1) m/W) (m % W == 0);
    "subtile": rows t*128 + r*128/W + [0, 128/W) of every 128-row tile row t
    (rows(m) lists them)."""

    _destroy = "fo_gemm_reducescatter_destroy"
    _kind = "reducescatter"

    def __init__(self, comm, max_m, n, k, dtype, *, path="auto", layout="standard", nccl_sms=None,
                 wait_timeout_s=None, check_m=None, tuning_cache=None, input="same", scales="none"):
        lib = _lib()
        opts = make_rs_options(lib, path, layout, nccl_sms, wait_timeout_s, check_m, tuning_cache, input, scales)
        code = dtype_code(dtype)
        out = c_void_p()
        lib.c.fo_gemm_reducescatter_create(comm.handle, max_m, n, k, code, byref(opts), byref(out))
        super().__init__(lib, out)

    def rows_out(self, m):
        """How many rows this rank's output holds for m."""
        v = c_int64()
        self._lib.c.fo_gemm_reducescatter_rows_out(self.handle, m, byref(v))
        return v.value

    def rows(self, m):
        """Which rows of C this rank's output holds for m, in order (a list)."""
        needed = c_size_t(0)
        self._lib.c.fo_gemm_reducescatter_rows(self.handle, m, None, 0, byref(needed))
        buf = (c_int64 * max(needed.value, 1))()
        self._lib.c.fo_gemm_reducescatter_rows(self.handle, m, buf, needed.value, None)
        return list(buf[:needed.value])

    def all_gather_rows(self, local, full, m, stream=None):
        """full (m x n, rows in C's order) = every rank's rows_out(m) x n `local`
        (ld n, in the layout's row order), gathered on every rank, on stream (a
        cudaStream_t as an integer; None/0: the legacy default stream): the
        AllGather that closes a ReduceScatter -> row-wise step -> AllGather
        chain. Collective. local and full are device pointers, both required
        (a rank with no rows for m passes some buffer as local); the sub-tile
        layout needs n % 8 == 0, and its first call with an m allocates (not
        under CUDA-graph capture)."""
        self._lib.c.fo_gemm_reducescatter_all_gather_rows(self.handle, local, full, m, stream or None)

    def shape(self):
        """(max_m, n, k, dtype code, world)."""
        max_m, n, k, d, w = c_int64(), c_int64(), c_int64(), c_int(), c_int()
        self._lib.c.fo_gemm_reducescatter_shape(self.handle, byref(max_m), byref(n), byref(k), byref(d), byref(w))
        return max_m.value, n.value, k.value, d.value, w.value


def _host_array(ctype, v, name, count, keep):
    """A POINTER(ctype) to count entries of v: a ctypes pointer (to the
    caller's array, which it keeps alive and which must have count entries),
    or a sequence of numbers, copied into a new array (kept in keep)."""
    if isinstance(v, ctypes._Pointer):
        return ctypes.cast(v, POINTER(ctype))
    try:
        n = len(v)
    except TypeError:
        raise InvalidArgument(f"{name} must be a sequence of {count} numbers, not {type(v).__name__}") from None
    if n != count:
        raise InvalidArgument(f"{name} has {n} entries, expected {count}")
    a = (ctype * max(n, 1))(*v)
    keep.append(a)
    return ctypes.cast(a, POINTER(ctype))


class RoutingSlot:
    """One op's fo_alltoall_routing and count arrays, filled in place for
    each call (the library reads them during the call only): a call builds
    no ctypes objects. The arrays' pointers are ctypes pointers (device
    memory with on_device), or None for a NULL gate. With several experts
    per rank the routing's expert_counts points to an array of world *
    experts entries, filled by each call; with one it stays NULL."""

    def __init__(self, world, experts=1):
        self.world, self.experts = int(world), int(experts)
        self.send = (c_int64 * max(self.world, 1))()
        self.recv = (c_int64 * max(self.world, 1))()
        self.r = Routing()
        self.r.struct_size = ctypes.sizeof(self.r)
        self.r.send_counts = ctypes.cast(self.send, POINTER(c_int64))
        self.r.recv_counts = ctypes.cast(self.recv, POINTER(c_int64))
        self.expert = None
        if self.experts > 1:
            self.expert = (c_int64 * (self.world * self.experts))()
            self.r.expert_counts = ctypes.cast(self.expert, POINTER(c_int64))
        # (dest_rank, dest_token and gate as three void*: an address is stored without a ctypes cast)
        self._arrays = (c_void_p * 3).from_buffer(self.r, Routing.dest_rank.offset)

    def fill(self, rows, dest_rank, dest_token, gate, tokens, send_counts, recv_counts, on_device=False,
             expert_counts=None):
        """dest_rank, dest_token, gate: ctypes pointers, addresses (ints) or None (NULL); expert_counts:
        world * experts ints with several experts per rank, None with one."""
        if len(send_counts) != self.world or len(recv_counts) != self.world:
            raise InvalidArgument(f"send_counts and recv_counts need {self.world} entries, not {len(send_counts)} and "
                                  f"{len(recv_counts)}")
        if self.expert is not None:
            want = self.world * self.experts
            if expert_counts is None or len(expert_counts) != want:
                got = "none" if expert_counts is None else len(expert_counts)
                raise InvalidArgument(f"expert_counts needs {want} entries (world {self.world} x {self.experts} "
                                      f"experts), not {got}")
            self.expert[:want] = expert_counts
        elif expert_counts is not None:
            raise InvalidArgument("expert_counts is for several experts per rank; this routing has one (pass None)")
        r, a = self.r, self._arrays
        r.rows, r.tokens = int(rows), int(tokens)
        a[0], a[1], a[2] = _address(dest_rank), _address(dest_token), _address(gate)
        self.send[:self.world] = send_counts
        self.recv[:self.world] = recv_counts
        r.on_device = 1 if on_device else 0
        return r


def _address(p):
    """A ctypes pointer's address, or p itself (an int or None)."""
    return p if p is None or type(p) is int else ctypes.cast(p, c_void_p).value


def make_routing(rows, dest_rank, dest_token, gate, tokens, send_counts, recv_counts, world, on_device=False,
                 expert_counts=None, experts=1):
    """(fo_alltoall_routing, what it points to: keep it alive while the routing
    is used) for one call: rows and tokens, and host arrays, each a sequence
    of numbers (copied) or a ctypes pointer to an array of the C type (int32
    dest_rank and dest_token and float gate of rows entries, int64
    send_counts and recv_counts of world entries, int64 expert_counts of
    world * experts; the caller's, not copied). gate None: NULL (not
    combining); expert_counts None: NULL (one expert per rank). on_device:
    the three arrays are ctypes pointers to device memory (read by the GPU,
    in the call's stream)."""
    keep = []
    r = Routing()
    r.struct_size = ctypes.sizeof(r)
    r.rows, r.tokens = int(rows), int(tokens)
    r.dest_rank = _host_array(c_int32, dest_rank, "dest_rank", r.rows, keep)
    r.dest_token = _host_array(c_int32, dest_token, "dest_token", r.rows, keep)
    if gate is not None:
        r.gate = _host_array(c_float, gate, "gate", r.rows, keep)
    r.send_counts = _host_array(c_int64, send_counts, "send_counts", world, keep)
    r.recv_counts = _host_array(c_int64, recv_counts, "recv_counts", world, keep)
    r.on_device = 1 if on_device else 0
    if expert_counts is not None:
        r.expert_counts = _host_array(c_int64, expert_counts, "expert_counts", world * int(experts), keep)
    return r, keep


class GemmAllToAll(_GemmBase):
    """The MoE combine (flashoverlap::GemmAllToAll): each rank's rows of a (m x
    k) * b^T (b: n x k; with experts > 1, [experts, n, k] and each row times
    its expert's, a's rows by (source rank, expert) as the routing's
    expert_counts say) back to the ranks and tokens its routing names, on
    device pointers, overlapped with the GEMM. Construction and every call are
    collective; each call exchanges the ranks' routings (the host waits)."""

    _destroy = "fo_gemm_alltoall_destroy"
    _kind = "alltoall"

    def __init__(self, comm, max_rows, max_tokens, topk, n, k, dtype, *, path="auto", nccl_sms=None,
                 wait_timeout_s=None, exchange_timeout_s=None, experts=None, input="same", scales="none"):
        lib = _lib()
        opts = make_a2a_options(lib, path, nccl_sms, wait_timeout_s, exchange_timeout_s, experts, input, scales)
        code = dtype_code(dtype)
        out = c_void_p()
        lib.c.fo_gemm_alltoall_create(comm.handle, max_rows, max_tokens, topk, n, k, code, byref(opts), byref(out))
        super().__init__(lib, out)
        # (the C ABI has no accessor for it: the options say it)
        self.experts = 1 if experts is None else experts

    def run(self, a, b, routing, out, ld_out=0, combine=True, tokens_out=None, stream=None):
        """One call: routing a Routing (make_routing; a pointer to one also
        serves); with combine, out (tokens x n) = the gated sum per token,
        else the received rows, in (source rank, source row) order;
        tokens_out (optional, a device int32 pointer) their tokens; on stream
        (a cudaStream_t as an integer; None/0: the legacy default stream). a,
        b may be 0/None without rows, out where nothing is written."""
        ref = routing if not isinstance(routing, Routing) else byref(routing)
        tok = ctypes.cast(c_void_p(tokens_out), POINTER(c_int32)) if tokens_out else None
        self._c("run")(self.handle, a or None, b or None, ref, out or None, ld_out, 1 if combine else 0, tok,
                       stream or None)

    def run_scaled(self, a, b, routing, out, scale_a, scale_b, ld_out=0, combine=True, tokens_out=None, stream=None):
        """run with FP8 inputs' scales (device pointers; None, None: unscaled)."""
        ref = routing if not isinstance(routing, Routing) else byref(routing)
        tok = ctypes.cast(c_void_p(tokens_out), POINTER(c_int32)) if tokens_out else None
        self._c("run_scaled")(self.handle, a or None, b or None, ref, out or None, ld_out, 1 if combine else 0, tok,
                              stream or None, scale_a, scale_b)

    def last_plan(self):
        """The last call's plan, as text ("no call yet" before one)."""
        return _plan_text(self._c("last_plan"), self.handle)

    def shape(self):
        """(max_rows, max_tokens, topk, n, k, dtype code, world)."""
        mr, mt, topk, n, k, d, w = c_int64(), c_int64(), c_int(), c_int64(), c_int64(), c_int(), c_int()
        self._c("shape")(self.handle, byref(mr), byref(mt), byref(topk), byref(n), byref(k), byref(d), byref(w))
        return mr.value, mt.value, topk.value, n.value, k.value, d.value, w.value


def make_grouped_options(lib, path="auto"):
    """fo_gemm_grouped_options: the library's defaults, then what is given."""
    o = GroupedOptions()
    lib.c.fo_gemm_grouped_options_default(byref(o), ctypes.sizeof(o))
    if path not in GROUPED_PATHS:
        raise InvalidArgument(f"path = {path!r}: one of {', '.join(map(repr, GROUPED_PATHS))} (GroupedGemm's)")
    o.path = GROUPED_PATHS[path]
    return o


class GroupedGemm(_Handle):
    """The experts' GEMM of a mixture of experts (flashoverlap::GroupedGemm),
    on the current device, no communication: each expert's rows of a times
    its weight of b ([experts, n, k]), on device pointers."""

    _destroy = "fo_gemm_grouped_destroy"

    def _c(self, name):
        return getattr(self._lib.c, f"fo_gemm_grouped_{name}")

    def __init__(self, max_rows, experts, n, k, dtype, *, path="auto"):
        lib = _lib()
        opts = make_grouped_options(lib, path)
        out = c_void_p()
        lib.c.fo_gemm_grouped_create(max_rows, experts, n, k, dtype_code(dtype), byref(opts), byref(out))
        super().__init__(lib, out)
        self.experts = int(experts)
        self._counts = (c_int64 * self.experts)()  # (filled in place each call: no ctypes object per call)

    def run(self, a, b, counts, out, ld_out=0, stream=None):
        """out (sum(counts) x n) = each expert's counts[e] rows of a (expert
        after expert) times its weight of b, on stream (a cudaStream_t as an
        integer; None/0: the legacy default stream)."""
        if len(counts) != self.experts:
            raise InvalidArgument(f"counts has {len(counts)} entries, the op {self.experts} experts")
        for i, c in enumerate(counts):
            self._counts[i] = int(c)
        self._c("run")(self.handle, a or None, b or None, self._counts, out or None, ld_out, stream or None)

    def run_offsets(self, a, b, offsets, rows, out, ld_out=0, stream=None):
        """The same with the experts' row offsets in device memory (an int32 pointer: offsets[e] = the rows of
        experts 0..e) and the call's rows given: the host waits for nothing."""
        self._c("run_offsets")(self.handle, a or None, b or None, offsets or None, rows, out or None, ld_out,
                               stream or None)

    def check(self):
        """InvalidArgument if an earlier run_offsets call's offsets were bad (reported once)."""
        self._c("check")(self.handle)

    def last_plan(self):
        """The last call's GEMM and why, as text ("no call yet" before one)."""
        return _plan_text(self._c("last_plan"), self.handle)

    def shape(self):
        """(max_rows, experts, n, k, dtype code)."""
        mr, e, n, k, d = c_int64(), c_int(), c_int64(), c_int64(), c_int()
        self._c("shape")(self.handle, byref(mr), byref(e), byref(n), byref(k), byref(d))
        return mr.value, e.value, n.value, k.value, d.value
