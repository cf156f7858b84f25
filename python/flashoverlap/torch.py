"""FlashOverlap's GEMM + AllReduce for PyTorch tensors (PyTorch >= 2.4).

    import flashoverlap.torch as fo
    op = fo.GemmAllReduce(group, max_m=8192, n=8192, k=8192, dtype=torch.bfloat16)  # collective
    y = op(x, weight)                    # AllReduce(x @ weight.T) over the group (x: m x k, weight: n x k)
    y, h = op(x, weight, residual=r, norm_weight=g, eps=1e-6)   # + residual, RMSNorm (h = the new residual)
    y = fo.gemm_all_reduce(x, weight, group)   # the same, the op built and cached for you

The library is reached through its C ABI (ctypes): nothing here is compiled
against torch, so any torch >= 2.4 serves. torch is imported at first use,
not when this module is imported, and before the library is loaded, so that
the library's libnccl.so.2 is the one torch loaded (one library of that name
serves a process).

The ops are torch.library custom ops (flashoverlap::gemm_all_reduce,
flashoverlap::gemm_all_reduce_rmsnorm) taking the op object as an integer
handle, with fake implementations: torch.compile keeps them whole (one node
each) and traces through without running them. They run on torch's current
stream of the op's device, and may be captured into CUDA graphs for an m the
op has planned (an eager call with that m, or op.prepare(m), first: planning
allocates); an unplanned m under capture is refused with a message. They are
forward-only (no autograd formula is registered).

Collective: building an op (and, the first time per group, its communicator)
is collective over the group, and so is every call: every rank makes the
same calls, with the same m, in the same order, as SPMD code does.
"""

import itertools
import os
import re
import threading
import weakref

from . import FlashOverlapError, InvalidArgument, NoGpu, _capi, load

__all__ = ["GemmAllReduce", "gemm_all_reduce", "clear_cache", "require_torch", "MIN_TORCH"]

MIN_TORCH = (2, 4)  # torch.library.custom_op and register_fake

_torch = None  # the torch module, once require_torch() has accepted it
_lock = threading.RLock()
_ops = weakref.WeakValueDictionary()  # handle -> GemmAllReduce: what the custom ops' integer names
_ids = itertools.count(1)
_comms = {}  # (group, device index, mode) -> _capi.Communicator: one per group, shared by its ops
_cache = {}  # the functional's ops: (group, device, dtype, n, k, options) -> GemmAllReduce
_registered = False


def torch_version(torch_module):
    """(major, minor) of a torch module ("2.4.1+cu121" -> (2, 4))."""
    m = re.match(r"(\d+)\.(\d+)", torch_module.__version__)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def require_torch():
    """The torch module, or FlashOverlapError saying why it cannot serve: not
    installed, or older than 2.4 (no torch.library.custom_op to register the
    ops with)."""
    global _torch
    if _torch is None:
        try:
            import torch
        except ImportError as e:
            raise FlashOverlapError(f"flashoverlap.torch needs PyTorch >= {_v(MIN_TORCH)}: {e}") from None
        if torch_version(torch) < MIN_TORCH or not hasattr(torch.library, "custom_op"):
            raise FlashOverlapError(
                f"flashoverlap.torch needs PyTorch >= {_v(MIN_TORCH)} (torch.library.custom_op registers its ops); "
                f"this is torch {torch.__version__}")
        _torch = torch
    return _torch


def _v(t):
    return ".".join(map(str, t))


def _register_ops(torch):
    """Defines the custom ops (once). Their real implementations look the op
    up by handle and validate the tensors; the fake ones only say the output's
    shape (validating what needs no data), so that tracing runs nothing."""
    global _registered, _lookup
    with _lock:
        if _registered:
            return

        @torch.library.custom_op("flashoverlap::gemm_all_reduce", mutates_args=(),
                                 schema="(Tensor x, Tensor weight, int handle) -> Tensor")
        def _gemm_all_reduce(x, weight, handle):
            return _op_of(handle)._run(x, weight)

        @_gemm_all_reduce.register_fake
        def _(x, weight, handle):
            op = _ops.get(handle) if isinstance(handle, int) else None
            if op is not None:
                check_inputs(op, x, weight, bound_m=False)
            return x.new_empty((x.shape[0], weight.shape[0]))

        @torch.library.custom_op(
            "flashoverlap::gemm_all_reduce_rmsnorm", mutates_args=(),
            schema="(Tensor x, Tensor weight, Tensor residual, Tensor norm_weight, float eps, int handle) -> (Tensor, Tensor)")
        def _gemm_all_reduce_rmsnorm(x, weight, residual, norm_weight, eps, handle):
            return _op_of(handle)._run_rmsnorm(x, weight, residual, norm_weight, eps)

        @_gemm_all_reduce_rmsnorm.register_fake
        def _(x, weight, residual, norm_weight, eps, handle):
            op = _ops.get(handle) if isinstance(handle, int) else None
            if op is not None:
                check_inputs(op, x, weight, residual, norm_weight, bound_m=False)
            return residual.new_empty(residual.shape), residual.new_empty(residual.shape)

        # The functional's op lookup builds ops (collective, ctypes): run it
        # eagerly under torch.compile (a graph break), then trace the op call.
        _lookup = torch.compiler.disable(_cached_op)
        _registered = True


def _op_of(handle):
    op = _ops.get(handle)
    if op is None:
        raise FlashOverlapError(f"flashoverlap: no op with handle {handle} (closed or garbage-collected: keep the "
                                "GemmAllReduce alive while graphs or compiled code use it)")
    return op


# ---- validation: messages that name the argument, what it is and what the op wants ----

def _describe(t):
    return f"shape {tuple(t.shape)}, strides {tuple(t.stride())}"


def _check_tensor(op, name, t, shape):
    """t: a tensor of op's dtype and device, row-major contiguous, of `shape`
    (None: that dimension is free)."""
    if not hasattr(t, "data_ptr") or not hasattr(t, "dtype"):
        raise InvalidArgument(f"{op}: {name} must be a torch.Tensor, not {type(t).__name__}")
    if t.dtype != op.dtype:
        raise InvalidArgument(f"{op}: {name} has dtype {t.dtype}, expected {op.dtype}")
    if t.device != op.device:
        raise InvalidArgument(f"{op}: {name} is on {t.device}, expected {op.device}")
    if t.dim() != len(shape):
        raise InvalidArgument(f"{op}: {name} has {t.dim()} dimensions ({_describe(t)}), expected {len(shape)}")
    for got, want in zip(t.shape, shape):
        if want is not None and got != want:
            want_s = "(" + ", ".join("m" if w is None else str(w) for w in shape) + ("," if len(shape) == 1 else "") + ")"
            raise InvalidArgument(f"{op}: {name} has shape {tuple(t.shape)}, expected {want_s}")
    if not t.is_contiguous():
        raise InvalidArgument(f"{op}: {name} is not contiguous ({_describe(t)}): the op reads row-major rows; "
                              f"pass {name}.contiguous()")


def check_inputs(op, x, weight, residual=None, norm_weight=None, bound_m=True):
    """InvalidArgument unless x (m x k), weight (n x k) and, for the RMSNorm
    form, residual (m x n) and norm_weight (n) fit op (anything with max_m,
    n, k, dtype and device): dtype, device, shape, contiguity, m <= max_m."""
    _check_tensor(op, "x", x, (None, op.k))
    _check_tensor(op, "weight", weight, (op.n, op.k))
    m = x.shape[0]
    if bound_m and m > op.max_m:
        raise InvalidArgument(f"{op}: x has m = {m} rows, more than the op's max_m = {op.max_m} "
                              "(build the op with a larger max_m)")
    if residual is not None or norm_weight is not None:
        if residual is None or norm_weight is None:
            raise InvalidArgument(f"{op}: residual and norm_weight come together (the fused residual + RMSNorm form)")
        _check_tensor(op, "residual", residual, (m, op.n))
        _check_tensor(op, "norm_weight", norm_weight, (op.n,))


def _check_shape(max_m, n, k):
    for name, v in (("max_m", max_m), ("n", n), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise InvalidArgument(f"GemmAllReduce: {name} = {v!r} is not an int")
    if max_m < 1 or n < 1 or k < 8 or k % 8:
        raise InvalidArgument(f"GemmAllReduce: max_m = {max_m}, n = {n}, k = {k}: needs max_m >= 1, n >= 1 and k a "
                              "positive multiple of 8 (16-byte rows)")
    return max_m, n, k


def _check_dtype(torch, dtype):
    codes = {torch.bfloat16: _capi.DTYPE_BF16, torch.float16: _capi.DTYPE_FP16}
    if dtype not in codes:
        raise InvalidArgument(f"GemmAllReduce: dtype {dtype} is not supported: torch.bfloat16 or torch.float16")
    return codes[dtype]


def _require_gpu(torch, device):
    """NoGpu unless device is a CUDA device of compute capability 9.0 (Hopper)."""
    if not torch.cuda.is_available():
        raise NoGpu("flashoverlap.torch.GemmAllReduce: no usable GPU: torch.cuda.is_available() is False"
                    + (f" (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']})"
                       if "CUDA_VISIBLE_DEVICES" in os.environ else ""))
    cc = torch.cuda.get_device_capability(device)
    if cc != (9, 0):
        raise NoGpu(f"flashoverlap.torch.GemmAllReduce: {device} ({torch.cuda.get_device_name(device)}) is "
                    f"sm_{cc[0]}{cc[1]}, not a Hopper (sm_90) GPU")


def _resolve_device(torch, device):
    """The op's device, with its index; InvalidArgument for a non-CUDA one,
    NoGpu where it is no Hopper GPU."""
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type != "cuda":
        raise InvalidArgument(f"GemmAllReduce: device {device} is not a CUDA device")
    if not torch.cuda.is_available():
        _require_gpu(torch, device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    _require_gpu(torch, device)
    return device


def _resolve_group(torch, group):
    """(group, rank in it, its size); InvalidArgument without torch.distributed
    or for a group this process is not in."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidArgument("GemmAllReduce: torch.distributed is not initialised: call "
                              "torch.distributed.init_process_group first (the op is collective over a process group)")
    if group is None:
        group = dist.group.WORLD
    elif not isinstance(group, dist.ProcessGroup) and group == getattr(dist.GroupMember, "NON_GROUP_MEMBER", object()):
        # (what new_group returns to the processes it leaves out)
        raise InvalidArgument(f"GemmAllReduce: this process (global rank {dist.get_rank()}) is not a member of the group")
    elif not isinstance(group, dist.ProcessGroup):
        raise InvalidArgument(f"GemmAllReduce: group must be a torch.distributed ProcessGroup or None (the default "
                              f"group), not {type(group).__name__}")
    rank = dist.get_rank(group)
    if rank < 0:
        raise InvalidArgument(f"GemmAllReduce: this process (global rank {dist.get_rank()}) is not a member of the group")
    return group, rank, dist.get_world_size(group)


# ---- communicators ----

def _bootstrap(torch, group, rank, world, device):
    """A new NCCL communicator over the group, of the NCCL the library runs on:
    rank 0 makes a unique id and the group broadcasts it (collective)."""
    dist = torch.distributed
    load().check_nccl()  # (before the broadcast: every rank fails alike and none waits)
    uid = [_capi.unique_id() if rank == 0 else None]
    with torch.cuda.device(device):
        dist.broadcast_object_list(uid, src=dist.get_global_rank(group, 0), group=group)
        return _capi.Communicator.from_unique_id(uid[0], rank, world)


def _adopt(torch, group, device):
    """The group's own communicator (ProcessGroupNCCL's), where that is safe:
    torch calls the very NCCL the library runs on (the same loaded
    ncclGetVersion: not a second copy, not a static one) and the
    communicator exists (it is made at the group's first collective; one
    small all_reduce makes it). The group must outlive every op built on it."""
    lib = load()
    lib.check_nccl()
    torch_cuda = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so")
    same, why = lib.shares_nccl_with(torch_cuda)
    if not same:
        raise FlashOverlapError(f"GemmAllReduce(comm='adopt'): torch's NCCL is not the one flashoverlap runs on "
                                f"({why}); use comm='bootstrap' (the default)")
    dist = torch.distributed
    with torch.cuda.device(device):
        try:
            backend = group._get_backend(device)
            backend._comm_ptr
        except (AttributeError, RuntimeError) as e:
            raise FlashOverlapError(f"GemmAllReduce(comm='adopt') needs the group's NCCL backend and its "
                                    f"_comm_ptr(): {e}; use comm='bootstrap' (the default)") from None

        def comm_ptr():  # (a method in the torch versions seen; read as an attribute otherwise)
            v = backend._comm_ptr
            return int(v() if callable(v) else v)

        ptr = comm_ptr()
        if not ptr:
            dist.all_reduce(torch.zeros(1, device=device), group=group)
            torch.cuda.synchronize(device)
            ptr = comm_ptr()
        if not ptr:
            raise FlashOverlapError("GemmAllReduce(comm='adopt'): the group has no NCCL communicator on "
                                    f"{device}, even after a collective; use comm='bootstrap' (the default)")
        return _capi.Communicator.adopt(ptr)


def _communicator(torch, group, rank, world, device, mode):
    if mode not in ("bootstrap", "adopt"):
        raise InvalidArgument(f"GemmAllReduce: comm = {mode!r}: 'bootstrap', 'adopt' or a flashoverlap.Communicator")
    key = (group, device.index, mode)
    with _lock:
        comm = _comms.get(key)
        if comm is None:
            comm = _bootstrap(torch, group, rank, world, device) if mode == "bootstrap" else _adopt(torch, group, device)
            _comms[key] = comm
        return comm


# ---- the op ----

class GemmAllReduce:
    """AllReduce(x @ weight.T) over a process group, the AllReduce overlapped
    with the GEMM (flashoverlap::GemmAllReduce).

    GemmAllReduce(group, max_m, n, k, dtype, *, device=None, comm="bootstrap",
                  path="auto", nccl_sms=None, wait_timeout_s=None, check_m=False, curves=None,
                  tuning_cache=None)

    group: a torch.distributed ProcessGroup (None: the default group); every
    member builds the op with the same arguments, in the same order as its
    other collectives (it is collective: like creating the group's NCCL
    communicator). max_m: the most rows per call; n, k: weight's shape (n x
    k, as nn.Linear's); dtype: torch.bfloat16 or torch.float16; device: the
    CUDA device (default: the current one).

    comm: where the NCCL communicator comes from. "bootstrap" (default): one
    made once per group and device with the NCCL the library runs on (rank 0
    makes a unique id, the group broadcasts it), shared by the group's ops.
    "adopt": the group's own ProcessGroupNCCL communicator, only where torch
    and the library share one NCCL (refused otherwise, with the reason); the
    group must then outlive the op. Or a flashoverlap.Communicator.

    path, nccl_sms, wait_timeout_s, check_m, curves, tuning_cache: GemmAllReduceOptions
    (flashoverlap.h): path "auto" | "sequential" | "row_bands" | "slots" | "owners".
    """

    def __init__(self, group, max_m, n, k, dtype, *, device=None, comm="bootstrap", path="auto", nccl_sms=None,
                 wait_timeout_s=None, check_m=False, curves=None, tuning_cache=None):
        torch = require_torch()
        self.max_m, self.n, self.k = _check_shape(max_m, n, k)
        code = _check_dtype(torch, dtype)
        if path not in _capi.PATHS:
            raise InvalidArgument(f"GemmAllReduce: path = {path!r}: one of {', '.join(map(repr, _capi.PATHS))}")
        self.dtype, self.path = dtype, path
        self.device = _resolve_device(torch, device)
        self.group, self.rank, self.world = _resolve_group(torch, group)
        _register_ops(torch)
        if isinstance(comm, _capi.Communicator):
            communicator = comm
        else:
            communicator = _communicator(torch, self.group, self.rank, self.world, self.device, comm)
        if communicator.world != self.world or communicator.rank != self.rank:
            raise InvalidArgument(f"GemmAllReduce: the group has {self.world} ranks (this one is rank {self.rank}), "
                                  f"its communicator {communicator.world} (rank {communicator.rank})")
        with torch.cuda.device(self.device):
            self._op = _capi.GemmAllReduce(communicator, max_m, n, k, code, path=path, nccl_sms=nccl_sms,
                                           wait_timeout_s=wait_timeout_s, check_m=check_m, curves=curves,
                                           tuning_cache=tuning_cache)
        self._planned = set()  # the m's with a plan: those a CUDA graph may capture
        self.handle = next(_ids)  # what the custom ops are given
        _ops[self.handle] = self

    def __repr__(self):
        dt = str(self.dtype).replace("torch.", "")
        return f"GemmAllReduce(max_m={self.max_m}, n={self.n}, k={self.k}, {dt}, {self.device}, world {self.world})"

    def __call__(self, x, weight, residual=None, norm_weight=None, eps=1e-6):
        """AllReduce(x @ weight.T) (m x n) on torch's current stream; with
        residual (m x n) and norm_weight (n): (RMSNorm(h) * norm_weight, h),
        h = AllReduce(x @ weight.T) + residual. x may have leading batch
        dimensions (..., k), as nn.Linear's input; the outputs then have them."""
        torch = _torch
        if not torch.is_tensor(x):
            raise InvalidArgument(f"{self}: x must be a torch.Tensor, not {type(x).__name__}")
        lead = None
        if x.dim() > 2:
            lead = tuple(x.shape[:-1])
            x = _flatten(self, "x", x)
            if residual is not None:
                residual = _flatten(self, "residual", residual)
        if residual is None and norm_weight is None:
            y = torch.ops.flashoverlap.gemm_all_reduce(x, weight, self.handle)
            return y if lead is None else y.view(*lead, self.n)
        if residual is None or norm_weight is None:
            raise InvalidArgument(f"{self}: residual and norm_weight come together (the fused residual + RMSNorm form)")
        y, h = torch.ops.flashoverlap.gemm_all_reduce_rmsnorm(x, weight, residual, norm_weight, float(eps), self.handle)
        return (y, h) if lead is None else (y.view(*lead, self.n), h.view(*lead, self.n))

    # (the custom ops' real implementations)
    def _run(self, x, weight):
        check_inputs(self, x, weight)
        m = x.shape[0]
        out = _torch.empty((m, self.n), dtype=self.dtype, device=self.device)
        if m:
            self._enqueue(m, lambda s: self._op.run(x.data_ptr(), weight.data_ptr(), out.data_ptr(), m, s))
        return out

    def _run_rmsnorm(self, x, weight, residual, norm_weight, eps):
        check_inputs(self, x, weight, residual, norm_weight)
        m = x.shape[0]
        out = _torch.empty((m, self.n), dtype=self.dtype, device=self.device)
        h = _torch.empty((m, self.n), dtype=self.dtype, device=self.device)
        if m:
            self._enqueue(m, lambda s: self._op.run_rmsnorm(x.data_ptr(), weight.data_ptr(), residual.data_ptr(),
                                                            norm_weight.data_ptr(), eps, out.data_ptr(),
                                                            h.data_ptr(), m, s))
        return out, h

    def _enqueue(self, m, call):
        """call(stream) on the op's device and its current stream; under CUDA
        graph capture only for a planned m (planning allocates)."""
        torch = _torch
        if torch.cuda.current_device() != self.device.index:
            with torch.cuda.device(self.device):
                self._enqueue_here(m, call)
        else:
            self._enqueue_here(m, call)

    def _enqueue_here(self, m, call):
        torch = _torch
        # (check_m's exchange is skipped by the library under capture)
        if m not in self._planned and torch.cuda.is_current_stream_capturing():
            raise FlashOverlapError(f"{self}: m = {m} has no plan yet, and planning allocates, which a CUDA graph "
                                    f"capture forbids: call op.prepare({m}) (or run m once) before capturing")
        call(torch.cuda.current_stream(self.device).cuda_stream)
        self._planned.add(m)

    def _m(self, m):
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= self.max_m:
            raise InvalidArgument(f"{self}: m = {m!r}: needs 1 <= m <= max_m = {self.max_m}")
        return m

    def prepare(self, m):
        """Plans m and allocates what its calls need, without running: before
        capturing a call with this m into a CUDA graph."""
        with _torch.cuda.device(self.device):
            self._op.prepare(self._m(m))
        self._planned.add(m)

    def plan(self, m):
        """The plan m runs with, as text (e.g. "row bands, groups of bands 2,1,1 ...")."""
        with _torch.cuda.device(self.device):
            return self._op.plan(self._m(m))

    def check(self):
        """Raises the error of an earlier call whose wait timed out (synchronise
        its stream first); after one, build the communicator and op anew."""
        self._op.check()

    def close(self):
        """Releases the op now (waits for its last call's work); the garbage
        collector does it otherwise. Not while a CUDA graph that captured it
        may still be replayed."""
        _ops.pop(self.handle, None)
        self._op.close()


def _flatten(op, name, t):
    if not t.is_contiguous():
        raise InvalidArgument(f"{op}: {name} is not contiguous ({_describe(t)}): the op reads row-major rows; "
                              f"pass {name}.contiguous()")
    return t.view(-1, t.shape[-1])


# ---- the functional ----

def round_max_m(m):
    """The max_m the functional builds for m rows: the next power of two, at
    least 128 (one tile row), so that a few ops serve every m."""
    return max(128, 1 << (max(int(m), 1) - 1).bit_length())


def _cached_op(x, weight, group, max_m, options):
    torch = require_torch()
    for name, t in (("x", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise InvalidArgument(f"gemm_all_reduce: {name} must be a torch.Tensor, not {type(t).__name__}")
    if weight.dim() != 2 or x.dim() < 2 or x.shape[-1] != weight.shape[1]:
        raise InvalidArgument(f"gemm_all_reduce: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not fit: "
                              "x is (..., k), weight (n, k)")
    n, k = weight.shape
    m = x.numel() // k if k else 0
    group_obj = _resolve_group(torch, group)[0]
    key = (group_obj, weight.device, weight.dtype, n, k, tuple(sorted(options.items())))
    with _lock:
        op = _cache.get(key)
        need = max(m, max_m or 0)
        if op is None or op.max_m < need:
            # (an op outgrown is dropped here and released once nothing uses it)
            op = GemmAllReduce(group_obj, round_max_m(need), n, k, weight.dtype, device=weight.device, **options)
            _cache[key] = op
        return op


_lookup = _cached_op  # rebound by _register_ops to the same, eager under torch.compile


def gemm_all_reduce(x, weight, group=None, *, residual=None, norm_weight=None, eps=1e-6, max_m=None, **options):
    """AllReduce(x @ weight.T) over group (None: the default group), or with
    residual and norm_weight the RMSNorm form (see GemmAllReduce.__call__),
    through an op built at the first call for (group, device, dtype, n, k,
    options) and kept: max_m is m rounded up to a power of two (round_max_m;
    or max_m if larger), and a larger m builds a larger op.

    Building an op is collective over the group: SPMD code, which makes the
    same calls with the same shapes in the same order on every rank, builds
    the same ops at the same calls. Code whose ranks could see different m
    first should pass max_m (the same on every rank) or build a
    GemmAllReduce itself. Under torch.compile the lookup runs eagerly (a
    graph break); use a GemmAllReduce for fullgraph=True."""
    op = _lookup(x, weight, group, max_m, options)
    return op(x, weight, residual=residual, norm_weight=norm_weight, eps=eps)


def clear_cache():
    """Drops the functional's ops and the bootstrapped communicators (each is
    released once no op uses it); the next call builds anew (collective)."""
    with _lock:
        _cache.clear()
        for comm in _comms.values():
            comm.close()  # (the ops built on a communicator keep it alive)
        _comms.clear()
