"""FlashOverlap's GEMM + AllReduce, GEMM + ReduceScatter and GEMM + All-to-All
(the MoE combine) for PyTorch tensors (PyTorch >= 2.4).

    import flashoverlap.torch as fo
    op = fo.GemmAllReduce(group, max_m=8192, n=8192, k=8192, dtype=torch.bfloat16)  # collective
    y = op(x, weight)                    # AllReduce(x @ weight.T) over the group (x: m x k, weight: n x k)
    y, h = op(x, weight, residual=r, norm_weight=g, eps=1e-6)   # + residual, RMSNorm (h = the new residual)
    y = fo.gemm_all_reduce(x, weight, group)   # the same, the op built and cached for you

    rs = fo.GemmReduceScatter(group, max_m=8192, n=8192, k=8192, dtype=torch.bfloat16)  # collective
    y = rs(x, weight)                    # this rank's rows of the sum: (m / world, n), as
                                         # dist.reduce_scatter_tensor of x @ weight.T gives them
    y, h = rs(x, weight, residual=r, norm_weight=g)   # r, y, h: (m / world, n)
    full = rs.all_gather_rows(y)         # (m, n): every rank's rows, in x's row order (the AllGather that
                                         # closes the chain; the sub-tile layout: rs.all_gather_rows(y, m))
    y = fo.gemm_reduce_scatter(x, weight, group)

    a2a = fo.GemmAllToAll(group, max_rows=8192, max_tokens=4096, topk=2, n=4096, k=8192, dtype=torch.bfloat16)
    y = a2a(x, weight, dest_rank, dest_token, gate, send_counts, recv_counts, tokens)   # (tokens, n): each
                                         # token's rows from every rank's expert, summed by gate
    rows, tok = a2a(x, weight, dest_rank, dest_token, gate, send_counts, recv_counts, tokens, combine=False)
    y = fo.gemm_all_to_all(x, weight, dest_rank, dest_token, gate, send_counts, recv_counts, group, tokens)
    moe = fo.GemmAllToAll(group, 8192, 4096, topk=8, n=4096, k=8192, dtype=torch.bfloat16, experts=4)
    y = moe(x, w4, dest_rank, dest_token, gate, send_counts, recv_counts, tokens, expert_counts=counts)
                                         # w4: (4, n, k), the rank's 4 experts; x's rows by (source rank,
                                         # expert): counts[s * 4 + e] of them from rank s for expert e

The library is reached through its C ABI (ctypes): nothing here is compiled
against torch, so any torch >= 2.4 serves. torch is imported at first use,
not when this module is imported, and before the library is loaded, so that
the library's libnccl.so.2 is the one torch loaded (one library of that name
serves a process).

The ops are torch.library custom ops (flashoverlap::gemm_all_reduce,
flashoverlap::gemm_all_reduce_rmsnorm, flashoverlap::gemm_reduce_scatter,
flashoverlap::gemm_reduce_scatter_rmsnorm,
flashoverlap::gemm_reduce_scatter_all_gather_rows; _custom_ops.py) taking the
op object as an integer handle, with fake implementations: torch.compile keeps
them whole (one node each) and traces through without running them. An eager
call skips torch's dispatcher and calls the library directly. They run on torch's current
stream of the op's device, and may be captured into CUDA graphs for an m the
op has planned (an eager call with that m, or op.prepare(m), first: planning
allocates); an unplanned m under capture is refused with a message. (The
sub-tile layout's all_gather_rows allocates at its first call with an m, which
prepare(m) does not make: an eager all_gather_rows with that m first.) They are
forward-only (no autograd formula is registered).

GemmAllToAll's calls are custom ops too (flashoverlap::gemm_all_to_all,
flashoverlap::gemm_all_to_all_rows): the counts are int lists, so that the
fake implementations know the outputs' rows ((tokens, n); (sum(recv_counts),
n) and their tokens), and so are, with several experts per rank, each
call's expert_counts (an optional last argument). At world > 1 each call
synchronises the host (the ranks exchange their routings there); at world 1
a routing on the op's GPU is read there and nothing waits. They are not for
CUDA graphs.

Collective: building an op (and, the first time per group, its communicator)
is collective over the group, and so is every call: every rank makes the
same calls, with the same m, in the same order, as SPMD code does (the
All-to-All's rows and tokens differ between ranks: its routing is what the
ranks agree on). An op is called by one thread at a time, as its C++ object.

An eager call goes straight to the library (torch's dispatcher is for traced
and compiled code). The AllReduce's and ReduceScatter's next output is
allocated after the call, so that its allocation is off the next call's way
to the GPU: up to 8 MiB, one per op, for its next eager call with the same
rows on the same stream and memory pool; above, one per thread, for the next
eager call of any op with that output's shape, device, stream and pool (the
ops of a model's layers share their output's shape: the memory held is then
one output, not one per op; clear_cache() drops it).
"""

import ctypes
import itertools
import os
import re
import threading
import weakref

from . import FlashOverlapError, InvalidArgument, _capi, load
from ._checks import (INT32_MAX, RS_TILE_ROWS, _check_dtype, _check_rmsnorm, _check_shape, _check_tensor,  # noqa: F401
                      _counts, _describe, _expert_counts, _flatten, _host_int32, _is_int, _require_gpu,
                      _resolve_device, _resolve_group, _tm, check_a2a_inputs, check_fp8_inputs,
                      check_expert_counts, check_gather_inputs, check_inputs, check_rs_inputs, rs_rows, rs_rows_out)

__all__ = ["GemmAllReduce", "GemmReduceScatter", "GemmAllToAll", "GroupedGemm", "gemm_all_reduce",
           "gemm_reduce_scatter", "gemm_all_to_all", "clear_cache", "require_torch", "MIN_TORCH"]

MIN_TORCH = (2, 4)  # torch.library.custom_op and register_fake

_torch = None  # the torch module, once require_torch() has accepted it
_lock = threading.RLock()
_ops = weakref.WeakValueDictionary()  # handle -> an op (GemmAllReduce, ...): what the custom ops' integer names
_ids = itertools.count(1)
_comms = {}  # (group, device index, mode) -> _capi.Communicator: one per group, shared by its ops
_cache = {}  # the functional's ops: (group, device, dtype, n, k, options) -> GemmAllReduce
_rs_cache = {}  # gemm_reduce_scatter's, the same way -> GemmReduceScatter
_a2a_cache = {}  # gemm_all_to_all's: (group, device, dtype, n, k, topk, options with experts) -> GemmAllToAll
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
    """Defines the custom ops (once: _custom_ops) and the functionals' op
    lookups."""
    global _registered, _lookup, _rs_lookup, _a2a_lookup
    with _lock:
        if _registered:
            return
        from . import _custom_ops
        _custom_ops.register(torch)
        # The functionals' op lookups build ops (collective, ctypes): run them
        # eagerly under torch.compile (a graph break), then trace the op call.
        _lookup = torch.compiler.disable(_cached_op)
        _rs_lookup = torch.compiler.disable(_cached_rs_op)
        _a2a_lookup = torch.compiler.disable(_cached_a2a_op)
        _registered = True


def _raw_stream(torch, index):
    """torch's current stream on device `index`, as a cudaStream_t (an int)."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # (what torch's own compiled code calls)
    return get(index) if get else torch.cuda.current_stream(index).cuda_stream


def _pool_of(torch):
    """The id of the memory pool torch allocates from now (torch.cuda.use_mem_pool), None for the default."""
    context = getattr(torch.cuda, "MemPoolContext", None)
    pool = context.active_pool() if context is not None else None
    return None if pool is None else pool.id


def _eager(torch, *tensors):
    """Whether an op's call may run its implementation directly rather
    than through torch's dispatcher: eager (not traced by torch.compile),
    plain tensors (not fake or functional ones), no autograd to record. The
    custom op is what compiled and traced code sees; calling it eagerly
    would only add the dispatcher's host time to every call. (A weight is
    often an nn.Parameter: a plain tensor too.)"""
    compiler = getattr(torch, "compiler", None)  # (torch >= 2.4 has it; the package's CPU tests run older ones)
    if compiler is not None and compiler.is_compiling():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if (type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter) or (grad and t.requires_grad):
            return False
    return True


def _op_of(handle, cls):
    """The op of a handle, a cls (GemmAllReduce or GemmReduceScatter)."""
    op = _ops.get(handle)
    if op is None:
        raise FlashOverlapError(f"flashoverlap: no op with handle {handle} (closed or garbage-collected: keep the "
                                f"{cls.__name__} alive while graphs or compiled code use it)")
    if not isinstance(op, cls):
        raise FlashOverlapError(f"flashoverlap: handle {handle} is a {type(op).__name__}, not a {cls.__name__}")
    return op


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


def _adopt(torch, group, device, who="GemmAllReduce"):
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
        raise FlashOverlapError(f"{who}(comm='adopt'): torch's NCCL is not the one flashoverlap runs on "
                                f"({why}); use comm='bootstrap' (the default)")
    dist = torch.distributed
    with torch.cuda.device(device):
        try:
            backend = group._get_backend(device)
            backend._comm_ptr
        except (AttributeError, RuntimeError) as e:
            raise FlashOverlapError(f"{who}(comm='adopt') needs the group's NCCL backend and its "
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
            raise FlashOverlapError(f"{who}(comm='adopt'): the group has no NCCL communicator on "
                                    f"{device}, even after a collective; use comm='bootstrap' (the default)")
        return _capi.Communicator.adopt(ptr)


def _communicator(torch, group, rank, world, device, mode, who="GemmAllReduce"):
    if mode not in ("bootstrap", "adopt"):
        raise InvalidArgument(f"{who}: comm = {mode!r}: 'bootstrap', 'adopt' or a flashoverlap.Communicator")
    key = (group, device.index, mode)
    with _lock:
        comm = _comms.get(key)
        if comm is None:
            comm = (_bootstrap(torch, group, rank, world, device) if mode == "bootstrap"
                    else _adopt(torch, group, device, who))
            _comms[key] = comm
        return comm


# ---- the ops ----

def _on_device(device, fn):
    """fn() with device current (the library launches on the current device)."""
    torch = _torch
    if torch._C._cuda_getDevice() != device.index:  # (current_device() without its init check: CUDA is up by now)
        with torch.cuda.device(device):
            return fn()
    return fn()


class _OpBase:
    """What every op shares: the group, device and communicator it is built
    on, the handle the custom ops are given, calls on the op's device, the
    error check and close."""

    _fp8 = None  # (input="e4m3": torch.float8_e4m3fn, the inputs' dtype)
    input, scales = "same", "none"

    def _check_fp8_options(self, torch, input, scales, who):
        """input and scales of an op's keywords; the inputs' torch dtype (None for 16-bit inputs)."""
        if input not in _capi.INPUTS or scales not in _capi.SCALES:
            raise InvalidArgument(f"{who}: input = {input!r}, scales = {scales!r}: input one of "
                                  f"{', '.join(map(repr, _capi.INPUTS))}, scales one of "
                                  f"{', '.join(map(repr, _capi.SCALES))}")
        fp8 = getattr(torch, "float8_e4m3fn", None) if input == "e4m3" else None
        if input == "e4m3" and fp8 is None:
            raise InvalidArgument(f"{who}: input = 'e4m3' needs torch.float8_e4m3fn (torch {torch.__version__} has "
                                  "none)")
        self.input, self.scales, self._fp8 = input, scales, fp8

    def _run_fp8(self, x, weight, residual, norm_weight, eps, scale_a, scale_b):
        """The FP8 custom ops' real implementation: the checked call, run here."""
        return self._call_fp8(_tm(), x, weight, residual, norm_weight, eps, scale_a, scale_b, direct=True)

    def _scale_ptrs(self, torch, scale_a, scale_b, m):
        """The scales' device pointers (None, None without scales), checked
        against the op's kind: float32, contiguous, on its device; "tensor":
        one element each; "row": scale_a m, scale_b n elements."""
        if self.scales == "none":
            if scale_a is not None or scale_b is not None:
                raise InvalidArgument(f"{self}: scale_a and scale_b given to an op built with scales='none'")
            return None, None
        want = {"tensor": (1, 1), "row": (m, self.n)}[self.scales]
        ptrs = []
        for name, t, count in (("scale_a", scale_a, want[0]), ("scale_b", scale_b, want[1])):
            if (not torch.is_tensor(t) or t.dtype is not torch.float32 or t.numel() != count
                    or t.get_device() != self.device.index or not t.is_contiguous()):
                raise InvalidArgument(f"{self}: {name} must be a contiguous float32 tensor of {count} element"
                                      f"{'s' if count != 1 else ''} on {self.device} (scales={self.scales!r}), not "
                                      f"{_describe(t) if torch.is_tensor(t) else type(t).__name__}")
            ptrs.append(t.data_ptr())
        return ptrs[0], ptrs[1]

    def _resolve(self, torch, group, device, who):
        """The op's device and group (and its rank and size in it); registers
        the custom ops."""
        self.device = _resolve_device(torch, device, who)
        self.group, self.rank, self.world = _resolve_group(torch, group, who)
        _register_ops(torch)

    def _connect(self, torch, comm, who):
        """The op's communicator, comm's (InvalidArgument for one of another
        group's size or rank); after _resolve."""
        if isinstance(comm, _capi.Communicator):
            communicator = comm
        else:
            communicator = _communicator(torch, self.group, self.rank, self.world, self.device, comm, who)
        if communicator.world != self.world or communicator.rank != self.rank:
            raise InvalidArgument(f"{who}: the group has {self.world} ranks (this one is rank {self.rank}), "
                                  f"its communicator {communicator.world} (rank {communicator.rank})")
        return communicator

    def _publish(self):
        self.handle = next(_ids)  # what the custom ops are given
        _ops[self.handle] = self

    def _on_device(self, fn):
        return _on_device(self.device, fn)

    def check(self):
        """Raises the error of an earlier call whose wait timed out (synchronise
        its stream first); after one, build the communicator and op anew. A
        GemmAllToAll at world 1 with its routing on the GPU also raises
        InvalidArgument, once, for a bad row a call found there."""
        self._op.check()

    def close(self):
        """Releases the op now (waits for its last call's work); the garbage
        collector does it otherwise. Not while a CUDA graph that captured it
        may still be replayed."""
        _ops.pop(self.handle, None)
        self._op.close()


# An eager call's output up to this size is allocated after the call is
# enqueued, for the next call of the same rows on the same stream: its
# allocation is then off the next call's way to the GPU (torch.empty costs a
# few microseconds, which a synced call waits for). An op holds at most one
# such tensor. A bigger output's next one is held per thread (_big), for
# any op's call. Either holder's _ahead: ((rows, n, dtype, device index,
# stream), pool, tensor), or None.
_AHEAD_BYTES = 8 << 20


class _ThreadAhead(threading.local):
    _ahead = None  # (each thread's own once set)


_big = _ThreadAhead()

# torch's calls an eager call's fast way makes, bound once (_bind_fast): the
# tensor types taken as plain, whether torch.compile is tracing, whether
# autograd records, the current device, whether the current stream is being
# captured, the current stream (a cudaStream_t) of a device, the current
# memory pool's id (None: the default pool).
_Tensor = _Parameter = _F32 = _is_compiling = _grad_enabled = _get_device = _capturing = _current_stream = _pool_id = None


def _bind_fast(torch):
    global _Tensor, _Parameter, _F32, _is_compiling, _grad_enabled, _get_device, _capturing, _current_stream, _pool_id
    if _Tensor is None:
        _Tensor, _Parameter, _F32 = torch.Tensor, torch.nn.Parameter, torch.float32
        _is_compiling, _grad_enabled = torch.compiler.is_compiling, torch.is_grad_enabled
        _get_device, _capturing = torch._C._cuda_getDevice, torch._C._cuda_isCurrentStreamCapturing
        _current_stream = (getattr(torch._C, "_cuda_getCurrentRawStream", None)
                           or (lambda index, torch=torch: _raw_stream(torch, index)))
        _pool_id = lambda torch=torch: _pool_of(torch)  # noqa: E731


class _Op(_OpBase):
    """What the ops whose calls take m rows share (GemmAllReduce,
    GemmReduceScatter): each call's enqueueing (the op's device, torch's
    current stream, the CUDA-graph rule), the eager call's fast way, the FP8
    call, prepare and plan."""

    def _publish(self):
        self._planned = set()  # the m's with a plan: those a CUDA graph may capture
        self._steady = {}  # m -> its output's rows (> 0): the m's planned and checked, which the fast way takes
        self._index = self.device.index
        self._weight_shape = (self.n, self.k)
        # (bound once: the eager call's C entry point and the handle)
        self._c_run, self._c_handle = self._op._c("run"), self._op.handle
        self._c_run_scaled = self._op._c("run_scaled") if self._fp8 is not None else None
        self._ahead = None  # (key, pool, tensor): the next call's output up to 8 MiB, allocated ahead (_fast_call)
        self._ahead_rows = _AHEAD_BYTES // (self.n * (_torch.finfo(self.dtype).bits // 8))
        _bind_fast(_torch)
        super()._publish()

    def _enqueue(self, m, call, planned=None, unplanned=None):
        """call(stream) on the op's device and its current stream; under CUDA
        graph capture only for a planned m (planning allocates). planned: the
        set of the m's that are ready (default: the run's plans, self._planned;
        m is added once called); unplanned: a function giving the refusal's
        message then."""
        if _torch._C._cuda_getDevice() != self._index:
            with _torch.cuda.device(self.device):
                return self._enqueue_here(m, call, planned, unplanned)
        return self._enqueue_here(m, call, planned, unplanned)

    def _enqueue_here(self, m, call, planned=None, unplanned=None):
        torch = _torch
        planned = self._planned if planned is None else planned
        if m in planned:  # (the steady state: nothing to ask torch but its stream)
            return call(_raw_stream(torch, self._index))
        # (check_m's exchange is skipped by the library under capture)
        if torch.cuda.is_current_stream_capturing():
            raise FlashOverlapError(unplanned() if unplanned else (
                f"{self}: m = {m} has no plan yet, and planning allocates, which a CUDA graph capture forbids: call "
                f"op.prepare({m}) (or run m once) before capturing"))
        call(_raw_stream(torch, self._index))
        planned.add(m)

    def close(self):
        self._c_handle = None  # (the eager calls' bound handle: no call may reach the freed op)
        self._steady = {}  # (no fast way: a call goes the general way, which refuses the closed op)
        self._ahead = None
        super().close()

    def _open(self):
        """FlashOverlapError (as the custom ops raise it) once the op is closed."""
        if self._c_handle is None:
            _op_of(self.handle, type(self))

    # ---- FP8 inputs (input="e4m3"): checked here, through the library's _scaled calls ----

    def _call_fp8(self, torch, x, weight, residual, norm_weight, eps, scale_a, scale_b, direct=False):
        """The FP8 call on a 2-D x: its tensors and scales checked, then the
        library's _scaled entry points; (out) or (out, h) of _rows_of(m) rows.
        Traced or compiled (and not direct: the custom op's own call), the
        custom op flashoverlap::<op>_scaled (or _rmsnorm_scaled) instead."""
        if self._fp8 is None:
            raise InvalidArgument(f"{self}: scale_a and scale_b are for an op built with input='e4m3'")
        if not direct and not _eager(torch, x, weight,
                                     *(t for t in (residual, norm_weight, scale_a, scale_b) if t is not None)):
            name = self._custom_op
            if residual is None and norm_weight is None:
                return getattr(torch.ops.flashoverlap, name + "_scaled")(x, weight, scale_a, scale_b, self.handle)
            if residual is None or norm_weight is None:
                raise InvalidArgument(f"{self}: residual and norm_weight come together (the fused residual + RMSNorm "
                                      "form)")
            return getattr(torch.ops.flashoverlap, name + "_rmsnorm_scaled")(x, weight, residual, norm_weight,
                                                                               float(eps), scale_a, scale_b,
                                                                               self.handle)
        self._open()
        check_fp8_inputs(self, x, weight)
        m = x.shape[0]
        if m:
            self._m(m)
        rows = self._rows_of(m) if m else 0
        sa, sb = self._scale_ptrs(torch, scale_a, scale_b, m)
        _check_rmsnorm(self, residual, norm_weight, rows)
        out = torch.empty((rows, self.n), dtype=self.dtype, device=self.device)
        if residual is None:
            if m:
                self._enqueue(m, lambda s: self._op.run_scaled(x.data_ptr(), weight.data_ptr(), out.data_ptr(), m, s,
                                                               sa, sb))
                if rows:
                    self._steady[m] = rows
            return out
        h = torch.empty((rows, self.n), dtype=self.dtype, device=self.device)
        if m:
            self._enqueue(m, lambda s: self._op.run_rmsnorm_scaled(x.data_ptr(), weight.data_ptr(), residual.data_ptr(),
                                                                   norm_weight.data_ptr(), float(eps), out.data_ptr(),
                                                                   h.data_ptr(), m, s, sa, sb))
        return out, h

    def _plain(self, x, weight):
        """Whether x (m x k, m <= max_m) and weight (n x k) are contiguous
        tensors of the op's dtype on its device: check_inputs' common case,
        told in a few attribute reads (anything else goes to check_inputs,
        which names what is wrong)."""
        dt, i = self.dtype, self._index
        return (x.dtype is dt and weight.dtype is dt and x.dim() == 2 and x.shape[1] == self.k
                and x.shape[0] <= self.max_m and weight.shape == self._weight_shape and x.get_device() == i
                and weight.get_device() == i and x.is_contiguous() and weight.is_contiguous())

    def _m(self, m):
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= self.max_m:
            raise InvalidArgument(f"{self}: m = {m!r}: needs 1 <= m <= max_m = {self.max_m}")
        return m

    def prepare(self, m):
        """Plans m and allocates what its calls need, without running: before
        capturing a call with this m into a CUDA graph."""
        m = self._m(m)
        with _torch.cuda.device(self.device):
            self._op.prepare(m)
        self._planned.add(m)

    def plan(self, m):
        """The plan m runs with, as text (e.g. "row bands, groups of bands 2,1,1 ...")."""
        m = self._m(m)
        with _torch.cuda.device(self.device):
            return self._op.plan(m)


def _with_lead(got, lead, n):
    """A call's output (or (out, h)) viewed with x's leading dimensions where it had them."""
    if lead is None:
        return got
    if isinstance(got, tuple):
        return tuple(t.view(*lead, n) for t in got)
    return got.view(*lead, n)


def _fast_call(general):
    """An op's __call__ (GemmAllReduce's, GemmReduceScatter's): an eager call
    in its steady state enqueued in one go (plain contiguous tensors of the
    op's dtype on its device, that device current, an m called before, so
    planned and checked; no residual, no capture, no autograd to record, not
    traced by torch.compile), the (rows, n) output returned; anything else
    goes to the op's call written out, general (its _call, which checks the
    call and names what is wrong), whose docstring it takes. Kept flat, in
    one frame: all of it precedes the GEMM's launch, which a synced call
    waits for. An output allocated ahead (the op's up to 8 MiB, the
    thread's above) serves only a call of its shape, stream and memory
    pool."""
    def __call__(self, x, weight, residual=None, norm_weight=None, eps=1e-6, *, scale_a=None, scale_b=None):
        fp8 = self._fp8
        if fp8 is not None or scale_a is not None or scale_b is not None:  # (FP8 inputs)
            if (fp8 is None or residual is not None or norm_weight is not None or type(x) is not _Tensor
                    or (type(weight) is not _Tensor and type(weight) is not _Parameter) or _is_compiling()
                    or x.dtype is not fp8 or weight.dtype is not fp8 or x.dim() != 2):
                return self._call(x, weight, residual, norm_weight, eps, scale_a, scale_b)
            m, k = x.shape
            rows, i, kind = self._steady.get(m), self._index, self.scales
            if (rows is None or k != self.k or weight.shape != self._weight_shape or x.get_device() != i
                    or weight.get_device() != i or not x.is_contiguous() or not weight.is_contiguous()
                    or _get_device() != i or _capturing()):
                return self._call(x, weight, residual, norm_weight, eps, scale_a, scale_b)
            if kind == "none":
                if scale_a is not None or scale_b is not None:
                    return self._call(x, weight, residual, norm_weight, eps, scale_a, scale_b)
                sa = sb = None
            else:
                if (type(scale_a) is not _Tensor or type(scale_b) is not _Tensor or scale_a.dtype is not _F32
                        or scale_b.dtype is not _F32
                        or scale_a.numel() != (1 if kind == "tensor" else m)
                        or scale_b.numel() != (1 if kind == "tensor" else self.n)
                        or scale_a.get_device() != i or scale_b.get_device() != i
                        or not scale_a.is_contiguous() or not scale_b.is_contiguous()):
                    return self._call(x, weight, residual, norm_weight, eps, scale_a, scale_b)
                sa, sb = scale_a.data_ptr(), scale_b.data_ptr()
            out = x.new_empty((rows, self.n), dtype=self.dtype)
            self._c_run_scaled(self._c_handle, x.data_ptr(), weight.data_ptr(), out.data_ptr(), m, _current_stream(i),
                               0, sa, sb)
            return out
        if (residual is not None or norm_weight is not None or type(x) is not _Tensor
                or (type(weight) is not _Tensor and type(weight) is not _Parameter) or _is_compiling()
                or ((x.requires_grad or weight.requires_grad) and _grad_enabled())):
            return self._call(x, weight, residual, norm_weight, eps)
        dt, i = self.dtype, self._index
        if x.dtype is not dt or weight.dtype is not dt or x.dim() != 2:
            return self._call(x, weight, residual, norm_weight, eps)
        m, k = x.shape
        rows = self._steady.get(m)
        if (rows is None or k != self.k or weight.shape != self._weight_shape or x.get_device() != i
                or weight.get_device() != i or not x.is_contiguous() or not weight.is_contiguous()
                or _get_device() != i or _capturing()):
            return self._call(x, weight, residual, norm_weight, eps)
        n, stream = self.n, _current_stream(i)
        # (the next output allocated on this stream, for a call on it, as torch.empty then would be: held by the
        # op up to 8 MiB, by the thread above)
        holder = self if rows <= self._ahead_rows else _big
        key, pool, ahead = (rows, n, dt, i, stream), _pool_id(), holder._ahead
        if ahead is not None and ahead[0] == key and ahead[1] == pool:
            out, holder._ahead = ahead[2], None
        else:
            out = x.new_empty((rows, n))  # (x's dtype and device: the op's)
        self._c_run(self._c_handle, x.data_ptr(), weight.data_ptr(), out.data_ptr(), m, stream, 0)
        holder._ahead = (key, pool, x.new_empty((rows, n)))
        return out
    __call__.__doc__ = general.__doc__
    return __call__


class GemmAllReduce(_Op):
    """AllReduce(x @ weight.T) over a process group, the AllReduce overlapped
    with the GEMM (flashoverlap::GemmAllReduce).

    GemmAllReduce(group, max_m, n, k, dtype, *, device=None, comm="bootstrap",
                  path="auto", nccl_sms=None, wait_timeout_s=None, check_m=False, curves=None,
                  tuning_cache=None, input="same", scales="none")

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
    (flashoverlap.h): path "auto" | "sequential" | "row_bands" | "slots" | "nvlink" ("owners": its former name).

    input "e4m3": FP8 inputs (x and weight torch.float8_e4m3fn, k % 16 == 0;
    the output and the sum in dtype), scaled as `scales` says: "none",
    "tensor" (scale_a, scale_b one fp32 each) or "row" (scale_a (m,), one per
    row of x; scale_b (n,), one per row of weight), as torch._scaled_mm takes
    them: each call passes op(x, weight, scale_a=..., scale_b=...). Traced
    and compiled code sees the custom ops flashoverlap::gemm_all_reduce_scaled
    and gemm_all_reduce_rmsnorm_scaled; CUDA graphs capture a call of a
    prepared m as the 16-bit calls.
    """

    _custom_op = "gemm_all_reduce"  # (its FP8 custom ops: flashoverlap::<this>_scaled, <this>_rmsnorm_scaled)

    def __init__(self, group, max_m, n, k, dtype, *, device=None, comm="bootstrap", path="auto", nccl_sms=None,
                 wait_timeout_s=None, check_m=False, curves=None, tuning_cache=None, input="same", scales="none"):
        torch = require_torch()
        self.max_m, self.n, self.k = _check_shape(max_m, n, k)
        code = _check_dtype(torch, dtype)
        if path not in _capi.PATHS:
            raise InvalidArgument(f"GemmAllReduce: path = {path!r}: one of {', '.join(map(repr, _capi.PATHS))}")
        self._check_fp8_options(torch, input, scales, "GemmAllReduce")
        self.dtype, self.path = dtype, path
        self._resolve(torch, group, device, "GemmAllReduce")
        communicator = self._connect(torch, comm, "GemmAllReduce")
        with torch.cuda.device(self.device):
            self._op = _capi.GemmAllReduce(communicator, max_m, n, k, code, path=path, nccl_sms=nccl_sms,
                                           wait_timeout_s=wait_timeout_s, check_m=check_m, curves=curves,
                                           tuning_cache=tuning_cache, input=input, scales=scales)
        self._registered = {}  # slot -> the registered output (kept: the op writes into it)
        self._publish()

    def __repr__(self):
        dt = str(self.dtype).replace("torch.", "")
        return f"GemmAllReduce(max_m={self.max_m}, n={self.n}, k={self.k}, {dt}, {self.device}, world {self.world})"

    def _call(self, x, weight, residual=None, norm_weight=None, eps=1e-6, scale_a=None, scale_b=None):
        """AllReduce(x @ weight.T) (m x n) on torch's current stream; with
        residual (m x n) and norm_weight (n): (RMSNorm(h) * norm_weight, h),
        h = AllReduce(x @ weight.T) + residual. x may have leading batch
        dimensions (..., k), as nn.Linear's input; the outputs then have them.
        FP8 inputs (input="e4m3"): scale_a, scale_b as the op's scales say."""
        torch = _torch
        if not torch.is_tensor(x):
            raise InvalidArgument(f"{self}: x must be a torch.Tensor, not {type(x).__name__}")
        lead = None
        if x.dim() > 2:
            lead = tuple(x.shape[:-1])
            x = _flatten(self, "x", x) if self._fp8 is None else x.reshape(-1, x.shape[-1])
            if residual is not None:
                residual = _flatten(self, "residual", residual)
        if self._fp8 is not None or scale_a is not None or scale_b is not None:
            return _with_lead(self._call_fp8(torch, x, weight, residual, norm_weight, eps, scale_a, scale_b), lead,
                              self.n)
        if residual is None and norm_weight is None:
            y = (self._run(x, weight) if _eager(torch, x, weight)
                 else torch.ops.flashoverlap.gemm_all_reduce(x, weight, self.handle))
            return y if lead is None else y.view(*lead, self.n)
        if residual is None or norm_weight is None:
            raise InvalidArgument(f"{self}: residual and norm_weight come together (the fused residual + RMSNorm form)")
        if _eager(torch, x, weight, residual, norm_weight):
            y, h = self._run_rmsnorm(x, weight, residual, norm_weight, float(eps))
        else:
            y, h = torch.ops.flashoverlap.gemm_all_reduce_rmsnorm(x, weight, residual, norm_weight, float(eps),
                                                                  self.handle)
        return (y, h) if lead is None else (y.view(*lead, self.n), h.view(*lead, self.n))

    __call__ = _fast_call(_call)

    def _rows_of(self, m):
        return m  # (an FP8 call's output rows: all of them)

    # (the custom ops' real implementations)
    def _run(self, x, weight):
        self._open()
        if not self._plain(x, weight):
            check_inputs(self, x, weight)
        m = x.shape[0]
        out = _torch.empty((m, self.n), dtype=self.dtype, device=self.device)
        if m:
            self._enqueue(m, lambda s: self._c_run(self._c_handle, x.data_ptr(), weight.data_ptr(), out.data_ptr(), m,
                                                   s, 0))
            self._steady[m] = m
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

    def register_output(self, out):
        """Collective (every rank, in the same order, each its own tensor):
        out, a (max_m, n) tensor of the op's dtype on its device (rows
        contiguous, a row stride that is a multiple of 8, 16-byte aligned),
        becomes an output slot, returned (the same on every rank); the op
        keeps it. run_registered writes into it; on the "nvlink" path the
        other ranks store their final tiles straight into it
        (GemmAllReduce::register_output). Eager calls only."""
        self._open()
        _check_tensor(self, "out", out, (self.max_m, self.n), rows_contiguous=True)
        if out.stride(0) % 8 or out.data_ptr() % 16:
            raise InvalidArgument(f"{self}: out needs a row stride that is a multiple of 8 and 16-byte alignment "
                                  f"({_describe(out)}, address {out.data_ptr():#x})")
        slot = self._on_device(lambda: self._op.register_output(out.data_ptr(), out.stride(0)))
        self._registered[slot] = out
        return slot

    def run_registered(self, x, weight, slot):
        """AllReduce(x @ weight.T) into the registered output `slot`, on
        torch's current stream: returns its first m rows (a view). Eager
        calls only (the registered tensor is written in place)."""
        self._open()
        if slot not in self._registered:
            raise InvalidArgument(f"{self}: slot {slot!r} is not a registered output (register_output returns one)")
        check_inputs(self, x, weight)
        m = x.shape[0]
        if m:
            self._enqueue(m, lambda s: self._op.run_registered(x.data_ptr(), weight.data_ptr(), slot, m, s))
        return self._registered[slot][:m]


class GemmReduceScatter(_Op):
    """This rank's rows of sum over the group of x @ weight.T (ReduceScatter),
    the ReduceScatter overlapped with the GEMM (flashoverlap::GemmReduceScatter):
    the GEMM + ReduceScatter of sequence-parallel and FSDP layers.

    GemmReduceScatter(group, max_m, n, k, dtype, *, device=None, comm="bootstrap",
                      path="auto", layout="standard", nccl_sms=None, wait_timeout_s=None,
                      check_m=False, tuning_cache=None, input="same", scales="none")

    group, max_m, n, k, dtype, device, comm: as GemmAllReduce's (collective
    alike). path: "auto" | "sequential" | "slots" | "nvlink" (rows stored
    straight into their owners' windows: the standard layout, one host);
    nccl_sms, wait_timeout_s, check_m, tuning_cache: GemmReduceScatterOptions
    (flashoverlap.h). input, scales: FP8 inputs, as GemmAllReduce's
    (op(x, weight, scale_a=..., scale_b=...); the custom ops
    flashoverlap::gemm_reduce_scatter_scaled and _rmsnorm_scaled).

    layout: which rows each rank ends with. "standard" (default): rank r
    holds rows [r m/W, (r+1) m/W) of the sum (W the group's size), what
    dist.reduce_scatter_tensor of x @ weight.T gives; m must be a multiple of
    W. "subtile": the paper's sub-tile layout, rank r holds rows t*128 +
    r*128/W + [0, 128/W) of every 128-row tile row t (rows(m) lists them),
    for a ReduceScatter -> row-wise step -> AllGather chain whose row order
    the caller restores after the AllGather; any m, W dividing 128.
    rows_out(m) says how many rows this rank gets; all_gather_rows(y, m)
    is that AllGather, every rank's rows back in x's row order (either
    layout).
    """

    _custom_op = "gemm_reduce_scatter"  # (its FP8 custom ops: flashoverlap::<this>_scaled, <this>_rmsnorm_scaled)

    def __init__(self, group, max_m, n, k, dtype, *, device=None, comm="bootstrap", path="auto", layout="standard",
                 nccl_sms=None, wait_timeout_s=None, check_m=False, tuning_cache=None, input="same", scales="none"):
        who = "GemmReduceScatter"
        torch = require_torch()
        self.max_m, self.n, self.k = _check_shape(max_m, n, k, who)
        code = _check_dtype(torch, dtype, who)
        self._check_fp8_options(torch, input, scales, who)
        if path not in _capi.RS_PATHS:
            raise InvalidArgument(f"{who}: path = {path!r}: one of {', '.join(map(repr, _capi.RS_PATHS))}")
        if layout not in _capi.RS_LAYOUTS:
            raise InvalidArgument(f"{who}: layout = {layout!r}: one of {', '.join(map(repr, _capi.RS_LAYOUTS))}")
        self.dtype, self.path, self.layout = dtype, path, layout
        self._rows_seen = {}  # m -> rows_out(m), the library's, checked against rs_rows_out (the fake's)
        self._gathered = set()  # the m's all_gather_rows has run eagerly: those a CUDA graph may capture (sub-tile)
        self._resolve(torch, group, device, who)
        # (what the library refuses too, said here before any collective: the communicator's, the op's)
        if layout == "subtile" and RS_TILE_ROWS % self.world:
            raise InvalidArgument(f"{who}: the sub-tile layout needs the world size to divide {RS_TILE_ROWS}, not "
                                  f"{self.world}")
        if layout == "standard" and max_m < self.world:
            raise InvalidArgument(f"{who}: max_m = {max_m} is below the world size {self.world} (the standard layout "
                                  "gives every rank m / world rows)")
        communicator = self._connect(torch, comm, who)
        with torch.cuda.device(self.device):
            self._op = _capi.GemmReduceScatter(communicator, max_m, n, k, code, path=path, layout=layout,
                                               nccl_sms=nccl_sms, wait_timeout_s=wait_timeout_s, check_m=check_m,
                                               tuning_cache=tuning_cache, input=input, scales=scales)
        self._publish()

    def __repr__(self):
        dt = str(self.dtype).replace("torch.", "")
        return (f"GemmReduceScatter(max_m={self.max_m}, n={self.n}, k={self.k}, {dt}, {self.device}, world "
                f"{self.world}, {self.layout} layout)")

    def _call(self, x, weight, residual=None, norm_weight=None, eps=1e-6, scale_a=None, scale_b=None):
        """This rank's rows of the sum over the group of x @ weight.T, on torch's
        current stream: (rows_out(m), n) for x (m, k). With residual (this
        rank's rows: rows_out(m) x n) and norm_weight (n): (RMSNorm(h) *
        norm_weight, h), h = those rows + residual.

        With the standard layout x may have leading batch dimensions (d0, ...,
        k), d0 a multiple of the world size: the sum is scattered along d0, as
        dist.reduce_scatter_tensor scatters its first dimension, and the
        outputs (and residual) are (d0 / world, ..., n)."""
        torch = _torch
        if not torch.is_tensor(x):
            raise InvalidArgument(f"{self}: x must be a torch.Tensor, not {type(x).__name__}")
        lead = None
        if x.dim() > 2:
            if self.layout != "standard":
                raise InvalidArgument(f"{self}: x has {x.dim()} dimensions ({_describe(x)}): the sub-tile layout "
                                      "takes x as (m, k) (its rows are no slice of x's first dimension): pass "
                                      "x.view(-1, k)")
            if x.shape[0] % self.world != 0:
                raise InvalidArgument(f"{self}: x has shape {tuple(x.shape)}: its first dimension {x.shape[0]} is not "
                                      f"a multiple of the world size {self.world} (each rank gets x.shape[0] / world "
                                      "of it)")
            lead = (x.shape[0] // self.world,) + tuple(x.shape[1:-1])
            x = _flatten(self, "x", x) if self._fp8 is None else x.reshape(-1, x.shape[-1])
            if residual is not None:
                residual = _flatten(self, "residual", residual)
        if self._fp8 is not None or scale_a is not None or scale_b is not None:
            return _with_lead(self._call_fp8(torch, x, weight, residual, norm_weight, eps, scale_a, scale_b), lead,
                              self.n)
        if residual is None and norm_weight is None:
            y = (self._run(x, weight) if _eager(torch, x, weight)
                 else torch.ops.flashoverlap.gemm_reduce_scatter(x, weight, self.handle))
            return y if lead is None else y.view(*lead, self.n)
        if residual is None or norm_weight is None:
            raise InvalidArgument(f"{self}: residual and norm_weight come together (the fused residual + RMSNorm form)")
        if _eager(torch, x, weight, residual, norm_weight):
            y, h = self._run_rmsnorm(x, weight, residual, norm_weight, float(eps))
        else:
            y, h = torch.ops.flashoverlap.gemm_reduce_scatter_rmsnorm(x, weight, residual, norm_weight, float(eps),
                                                                      self.handle)
        return (y, h) if lead is None else (y.view(*lead, self.n), h.view(*lead, self.n))

    __call__ = _fast_call(_call)

    def all_gather_rows(self, y, m=None):
        """The AllGather that closes a ReduceScatter -> row-wise step ->
        AllGather chain: a new (m, n) tensor, on torch's current stream, whose
        rows are every rank's y in x's row order (rows(m) of each rank put back
        in place): y is this rank's rows, (rows_out(m), n), as this op's call
        gives them for x (m, k), or a row-wise step's output of them (the
        RMSNorm form's out or h, an activation, ...).

        m: the rows of x. The standard layout: y.shape[0] * world by default.
        The sub-tile layout: required (rows_out(m) does not say m: a rank may
        even hold no rows). Collective, as the op's calls: every rank calls it
        with the same m. The sub-tile layout's first call with an m allocates:
        make it eagerly before capturing that m into a CUDA graph."""
        torch = _torch
        if not torch.is_tensor(y):
            raise InvalidArgument(f"{self}: all_gather_rows: y must be a torch.Tensor, not {type(y).__name__}")
        if m is None:
            if self.layout != "standard":
                raise InvalidArgument(f"{self}: all_gather_rows: m is required with the sub-tile layout (this rank's "
                                      f"rows do not say m): pass all_gather_rows(y, m), m the rows of x")
            m = (y.shape[0] if y.dim() > 0 else 0) * self.world
        elif isinstance(m, bool) or not isinstance(m, int):
            raise InvalidArgument(f"{self}: all_gather_rows: m = {m!r} is not an int")
        return torch.ops.flashoverlap.gemm_reduce_scatter_all_gather_rows(y, m, self.handle)

    def _m(self, m):
        m = super()._m(m)
        if self.layout == "standard" and m % self.world:
            raise InvalidArgument(f"{self}: m = {m} is not a multiple of the world size {self.world} (the standard "
                                  "layout gives every rank m / world rows)")
        return m

    def rows_out(self, m):
        """How many rows this rank's output holds for m (standard: m / world)."""
        m = self._m(m)
        return self._op.rows_out(m)

    _rows_of = rows_out  # (an FP8 call's output rows)

    def rows(self, m):
        """Which rows of the sum this rank's output holds for m, in order (a list
        of ints): standard, [rank m/W, (rank+1) m/W); sub-tile, its 128/W rows
        of every 128-row tile row."""
        m = self._m(m)
        return self._op.rows(m)

    def _rows_checked(self, m):
        """rows_out(m) as the output's allocation (the fake implementation's
        rs_rows_out), checked once per m against the library's."""
        rows = self._rows_seen.get(m)
        if rows is None:
            rows = rs_rows_out(m, self.world, self.rank, self.layout)
            theirs = self._op.rows_out(m) if m else 0
            if theirs != rows:
                raise FlashOverlapError(f"{self}: the library gives rank {self.rank} {theirs} rows for m = {m}, "
                                        f"flashoverlap.torch.rs_rows_out {rows} (a package and a library that "
                                        "disagree: install both from one build)")
            self._rows_seen[m] = rows
        return rows

    def _empty_rows(self, rows):
        """(a new rows x n tensor, a data pointer for it): never a null pointer,
        since a rank with no rows for m (the sub-tile layout, m small) still
        takes part in the call, and the library wants a buffer: then one of a
        row, not written (the tensor itself is (0, n))."""
        t = _torch.empty((rows, self.n), dtype=self.dtype, device=self.device)
        if rows:
            return t, t.data_ptr(), None
        spare = _torch.empty((1, self.n), dtype=self.dtype, device=self.device)
        return t, spare.data_ptr(), spare

    # (the custom ops' real implementations)
    def _run(self, x, weight):
        self._open()
        if not (self._plain(x, weight) and (self.layout != "standard" or x.shape[0] % self.world == 0)):
            check_rs_inputs(self, x, weight)
        m = x.shape[0]
        rows = self._rows_checked(m)
        out, out_ptr, spare = self._empty_rows(rows)
        if m:
            self._enqueue(m, lambda s: self._c_run(self._c_handle, x.data_ptr(), weight.data_ptr(), out_ptr, m, s, 0))
            if rows:
                self._steady[m] = rows
        del spare  # (after the call is enqueued: torch's allocator orders its reuse after it on this stream)
        return out

    def _run_rmsnorm(self, x, weight, residual, norm_weight, eps):
        check_rs_inputs(self, x, weight, residual, norm_weight)
        m = x.shape[0]
        rows = self._rows_checked(m)
        out, out_ptr, spare_out = self._empty_rows(rows)
        h, h_ptr, spare_h = self._empty_rows(rows)
        # (an empty residual has no pointer either)
        res_ptr, spare_res = (residual.data_ptr(), None) if rows else self._empty_rows(0)[1:]
        if m:
            self._enqueue(m, lambda s: self._op.run_rmsnorm(x.data_ptr(), weight.data_ptr(), res_ptr,
                                                            norm_weight.data_ptr(), eps, out_ptr, h_ptr, m, s))
        del spare_out, spare_h, spare_res
        return out, h

    def _all_gather_rows(self, y, m):
        check_gather_inputs(self, y, m)
        full = _torch.empty((m, self.n), dtype=self.dtype, device=self.device)
        if m:
            rows = self._rows_checked(m)
            # (a rank without rows still takes part, and the library wants a buffer: an empty y has none)
            local, spare = (y.data_ptr(), None) if rows else self._empty_rows(0)[1:]
            if self.layout == "standard":
                self._gathered.add(m)  # (one ncclAllGather: nothing to allocate, any m may be captured)
            unplanned = lambda: (  # noqa: E731
                f"{self}: all_gather_rows: m = {m} has not been gathered yet, and the sub-tile layout's first gather "
                "of an m allocates (where each row goes), which a CUDA graph capture forbids: call "
                f"op.all_gather_rows(y, {m}) once eagerly before capturing")
            self._enqueue(m, lambda s: self._op.all_gather_rows(local, full.data_ptr(), m, s), self._gathered,
                          unplanned)
            del spare  # (after the call is enqueued, as _run's)
        return full

# ---- the MoE combine: GemmAllToAll ----


def _to_host(*tensors):
    """The tensors (None passes through) on the host: a device tensor's copy
    is queued on its stream into pinned memory, and the host waits once for
    all of them (one wait, not one per tensor)."""
    torch = _tm()
    out, waits = [], set()
    for t in tensors:
        if t is None or t.device.type == "cpu":
            out.append(None if t is None else t.detach())
            continue
        h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        h.copy_(t.detach(), non_blocking=True)
        waits.add(t.device)
        out.append(h)
    for d in waits:
        torch.cuda.current_stream(d).synchronize()
    return out


def _device_int32(t):
    """An integer device tensor as a contiguous int32 one; int64 values
    beyond int32 become -1 or INT32_MAX (out of range either way: the
    library reports the row). Narrower types convert as they are."""
    torch = _tm()
    t = t.detach()
    if t.dtype == torch.int64:
        t = t.clamp(-1, INT32_MAX)
    if t.dtype != torch.int32:
        t = t.to(torch.int32)
    return t.contiguous()


def _address_of(t):
    """A tensor's data address, host or device (None: NULL, for an empty one or None)."""
    return t.data_ptr() if t is not None and t.numel() else None


class GemmAllToAll(_OpBase):
    """The MoE combine of expert parallelism, the All-to-All overlapped with
    the GEMM (flashoverlap::GemmAllToAll): each rank's expert output x @
    weight.T (x: the rows its experts received in the dispatch; weight: its
    expert's, n x k, or with several experts per rank theirs stacked,
    (experts, n, k), each row times its own expert's) goes back to the ranks
    of their tokens, and each token's rows are summed, weighted by their
    gates.

    GemmAllToAll(group, max_rows, max_tokens, topk, n, k, dtype, *, experts=1, device=None,
                 comm="bootstrap", path="auto", nccl_sms=None, wait_timeout_s=None, exchange_timeout_s=None,
                 input="same", scales="none")

    group, n, k, dtype, device, comm: as GemmAllReduce's (collective alike:
    every rank builds it with the same arguments). max_rows: the most rows of
    x on any rank in a call; max_tokens: the most tokens of any rank; topk:
    the experts each token picks (1 <= topk <= world * experts; each token
    gets topk rows back, so a rank receives at most max_tokens * topk rows).
    experts: the experts on each rank (the same on every rank): the weight
    is then (experts, n, k) and each call says how many of x's rows each
    expert has (__call__'s expert_counts). path: "auto" | "sequential" |
    "slots" | "nvlink" (rows stored straight into the ranks' windows; one
    host, n % 8 == 0, at most 8 ranks); nccl_sms
    (None: the library's default, 8), wait_timeout_s, exchange_timeout_s
    (None: 120 s, the wait of each call's routing exchange for the other
    ranks): GemmAllToAllOptions (flashoverlap.h).

    input "e4m3": FP8 inputs, as GemmAllReduce's (one expert per rank): x
    and weight torch.float8_e4m3fn, the rows moved and combined in dtype;
    each call passes scale_a (scales "tensor": one element; "row": one per
    row of x) and scale_b (one, or n); traced and compiled code sees the
    custom ops with the scales after expert_counts.

    Every call is collective, and synchronises the host: the ranks' routings
    are exchanged (the host waits for that exchange) and the call planned on
    the host; at world 1 with the routing on the GPU nothing is exchanged or
    waited for. So it is not for CUDA graphs (refused under capture). It is the
    torch.library custom op flashoverlap::gemm_all_to_all (combine) or
    flashoverlap::gemm_all_to_all_rows (not), with fake implementations.
    """

    def __init__(self, group, max_rows, max_tokens, topk, n, k, dtype, *, experts=1, device=None, comm="bootstrap",
                 path="auto", nccl_sms=None, wait_timeout_s=None, exchange_timeout_s=None, input="same",
                 scales="none"):
        who = "GemmAllToAll"
        torch = require_torch()
        for name, v in (("max_rows", max_rows), ("max_tokens", max_tokens), ("topk", topk), ("n", n), ("k", k)):
            if not _is_int(v):
                raise InvalidArgument(f"{who}: {name} = {v!r} is not an int")
        if max_rows < 1 or max_tokens < 1 or max_tokens >= 1 << 30 or n < 1 or k < 8 or k % 8:
            raise InvalidArgument(f"{who}: max_rows = {max_rows}, max_tokens = {max_tokens}, n = {n}, k = {k}: needs "
                                  "max_rows >= 1, 1 <= max_tokens < 2^30, n >= 1 and k a positive multiple of 8 "
                                  "(16-byte rows)")
        experts = _capi.check_experts(experts, f"{who}: ")
        code = _check_dtype(torch, dtype, who)
        self._check_fp8_options(torch, input, scales, who)
        if input == "e4m3" and experts > 1:
            raise InvalidArgument(f"{who}: input = 'e4m3' takes one expert per rank (the grouped GEMM's inputs are "
                                  "16-bit)")
        if path not in _capi.A2A_PATHS:
            raise InvalidArgument(f"{who}: path = {path!r}: one of {', '.join(map(repr, _capi.A2A_PATHS))}")
        self.max_rows, self.max_tokens, self.topk, self.n, self.k = max_rows, max_tokens, topk, n, k
        self.experts, self.dtype, self.path = experts, dtype, path
        self._resolve(torch, group, device, who)
        if not 1 <= topk <= self.world * experts:
            bound = f"the world size {self.world}" if experts == 1 else \
                f"the world size {self.world} x {experts} experts per rank = {self.world * experts}"
            raise InvalidArgument(f"{who}: topk = {topk}: needs 1 <= topk <= {bound} (each token picks distinct "
                                  "experts)")
        communicator = self._connect(torch, comm, who)
        with torch.cuda.device(self.device):
            self._op = _capi.GemmAllToAll(communicator, max_rows, max_tokens, topk, n, k, code, path=path,
                                          nccl_sms=nccl_sms, wait_timeout_s=wait_timeout_s,
                                          exchange_timeout_s=exchange_timeout_s, experts=experts, input=input,
                                          scales=scales)
        self._routing = _capi.RoutingSlot(self.world, experts)  # (each call's routing struct, filled in place)
        # (bound once for the eager calls: the C entry point, the handle, the routing's pointer)
        self._index, self._weight_shape = self.device.index, (n, k) if experts == 1 else (experts, n, k)
        self._c_run, self._c_handle = self._op._c("run"), self._op.handle
        self._routing_ptr = ctypes.pointer(self._routing.r)
        self._publish()

    def __repr__(self):
        dt = str(self.dtype).replace("torch.", "")
        experts = f"experts={self.experts}, " if self.experts > 1 else ""
        return (f"GemmAllToAll(max_rows={self.max_rows}, max_tokens={self.max_tokens}, topk={self.topk}, {experts}"
                f"n={self.n}, k={self.k}, {dt}, {self.device}, world {self.world})")

    def __call__(self, x, weight, dest_rank, dest_token, gate_weight, send_counts, recv_counts, tokens, combine=True,
                 *, expert_counts=None, scale_a=None, scale_b=None):
        """One call of the MoE combine, on torch's current stream.

        x (rows, k): the rows this rank's experts received (rows may be 0);
        weight (n, k): its expert's (also (1, n, k)); with experts > 1,
        (experts, n, k): the experts' nn.Linear weights stacked, contiguous.
        Row i of x @ weight.T (its expert's weight) goes back to rank
        dest_rank[i], where it is that rank's token dest_token[i], weighted
        by gate_weight[i]. dest_rank, dest_token: integer tensors of rows
        entries; gate_weight: a floating tensor of rows entries (used in
        float32; None allowed with combine=False). On the op's GPU they are
        read there: at world 1 (path "auto" or "sequential") the call then
        never waits for the host, and a bad row in them (a rank other than
        0, a token out of range, a gate not finite) is left out and raised,
        once, by check() or by the next call. Elsewhere, or on another
        device, they are copied to the host, which syncs with their stream
        (the call synchronises the host anyway: the ranks' routings are
        exchanged).
        send_counts[d]: the rows with dest_rank d; recv_counts[s]: the rows
        rank s sends here (all_to_all_single's split sizes): lists of world
        ints, or integer tensors (a device tensor syncs). tokens: this rank's
        tokens (the combined output's rows; also the range of the tokens the
        other ranks send here), required since no rank can infer it.

        expert_counts (experts > 1 only; None, the default, with one expert):
        x's rows come source after source and, within a source, expert after
        expert, as all_to_all_single delivers them when every rank sends its
        rows sorted by global expert (rank * experts + e), and
        expert_counts[s * experts + e] = the rows from rank s for expert e:
        a list of world * experts ints, world lists of experts ints, or an
        integer tensor of world * experts entries (1-D or (world, experts))
        on any device (copied to the host: a device tensor syncs). None
        negative, and a source's sum to its send_counts entry (its rows go
        back to it). A token may have several rows here, one per expert of
        this rank it picked: each comes back as its own row, none summed
        before the All-to-All.

        combine=True: a (tokens, n) tensor, row t = the sum of gate * row over
        the rows of token t from every rank, in fp32 in (source rank, source
        row) order, rounded once (zeros for a token without rows).
        combine=False: (rows received, a (sum(recv_counts),) int32 tensor):
        the received rows (sum(recv_counts), n), unweighted, in (source rank,
        source row) order (what all_to_all_single of the rows sorted stably by
        dest_rank gives), and each one's token.

        A routing that does not add up (counts that disagree with dest_rank or
        between ranks, a rank or token out of range, sizes beyond the op's)
        raises InvalidArgument on every rank.

        FP8 inputs (input="e4m3"): scale_a, scale_b as the op's scales say."""
        torch = _torch
        if not torch.is_tensor(x):
            raise InvalidArgument(f"{self}: x must be a torch.Tensor, not {type(x).__name__}")
        send = _counts(torch, self, "send_counts", send_counts)
        recv = _counts(torch, self, "recv_counts", recv_counts)
        if not _is_int(tokens):
            raise InvalidArgument(f"{self}: tokens = {tokens!r} is not an int (this rank's tokens: the combined "
                                  "output's rows)")
        if combine and gate_weight is None:
            raise InvalidArgument(f"{self}: gate_weight is required to combine (combine=False returns the rows "
                                  "unweighted)")
        by_expert = _expert_counts(torch, self, expert_counts)
        check_expert_counts(self, by_expert, send)  # (here too: the eager way below checks nothing else of them)
        if self._fp8 is not None or scale_a is not None or scale_b is not None:
            if self._fp8 is None:
                raise InvalidArgument(f"{self}: scale_a and scale_b are for an op built with input='e4m3'")
            if not _eager(torch, *(t for t in (x, weight, dest_rank, dest_token, gate_weight, scale_a, scale_b)
                                   if t is not None)):  # (the custom op, its scales after expert_counts)
                fn = torch.ops.flashoverlap.gemm_all_to_all if combine else torch.ops.flashoverlap.gemm_all_to_all_rows
                return fn(x, weight, dest_rank, dest_token, gate_weight, send, recv, tokens, self.handle, by_expert,
                          scale_a, scale_b)
            if self._c_handle is None:
                _op_of(self.handle, GemmAllToAll)  # (closed: the custom op's message)
            out, tokens_out = self._run(x, weight, dest_rank, dest_token, gate_weight, send, recv, tokens, combine,
                                        by_expert, (scale_a, scale_b))
            return out if combine else (out, tokens_out)
        if _eager(torch, *(t for t in (x, weight, dest_rank, dest_token, gate_weight) if t is not None)):
            if self._c_handle is None:
                _op_of(self.handle, GemmAllToAll)  # (closed: the custom op's message)
            if combine and self._plain(x, weight, dest_rank, dest_token, gate_weight):
                return self._run_plain(x, weight, dest_rank, dest_token, gate_weight, send, recv, tokens, by_expert)
            out, tokens_out = self._run(x, weight, dest_rank, dest_token, gate_weight, send, recv, tokens, combine,
                                        by_expert)
            return out if combine else (out, tokens_out)
        # (one expert: the argument left to its default, so that such a call's graph has no expert_counts)
        extra = () if by_expert is None else (by_expert,)
        if combine:
            return torch.ops.flashoverlap.gemm_all_to_all(x, weight, dest_rank, dest_token, gate_weight, send, recv,
                                                          tokens, self.handle, *extra)
        return torch.ops.flashoverlap.gemm_all_to_all_rows(x, weight, dest_rank, dest_token, gate_weight, send, recv,
                                                           tokens, self.handle, *extra)

    def last_plan(self):
        """The last call's plan, as text ("no call yet" before one)."""
        return self._op.last_plan()

    def close(self):
        self._c_handle = None  # (the eager calls' bound handle: no call may reach the freed op)
        super().close()

    def _plain(self, x, weight, dest_rank, dest_token, gate):
        """Whether a combining call's tensors are what the op reads as they
        are: x and weight (of the op's weight shape: (n, k), or (experts, n,
        k)) contiguous of its dtype, dest_rank and dest_token
        contiguous int32 and gate contiguous float32 of x's rows, all on the
        op's GPU (anything else takes _run, which checks and converts)."""
        i, dt, i32 = self._index, self.dtype, _torch.int32
        if i is None or gate is None:
            return False
        rows = x.shape[0] if x.dim() == 2 else -1
        return (rows >= 0 and x.dtype is dt and weight.dtype is dt and x.shape[1] == self.k and weight.shape == self._weight_shape
                and dest_rank.dtype is i32 and dest_token.dtype is i32 and gate.dtype is _torch.float32
                and dest_rank.dim() == 1 and dest_rank.shape[0] == rows and dest_token.dim() == 1
                and dest_token.shape[0] == rows and gate.dim() == 1 and gate.shape[0] == rows
                and x.get_device() == i and weight.get_device() == i and dest_rank.get_device() == i
                and dest_token.get_device() == i and gate.get_device() == i and x.is_contiguous()
                and weight.is_contiguous() and dest_rank.is_contiguous() and dest_token.is_contiguous()
                and gate.is_contiguous())

    def _run_plain(self, x, weight, dest_rank, dest_token, gate, send, recv, tokens, expert_counts=None):
        """_run for plain tensors (_plain): the routing read where it is, on the
        GPU, and the C call made with nothing converted (expert_counts:
        checked, a list or None)."""
        torch = _torch
        if torch._C._cuda_getDevice() != self._index:
            with torch.cuda.device(self.device):
                return self._run_plain(x, weight, dest_rank, dest_token, gate, send, recv, tokens, expert_counts)
        self._refuse_capture()
        rows = x.shape[0]
        self._routing.fill(rows, dest_rank.data_ptr() if rows else None, dest_token.data_ptr() if rows else None,
                           gate.data_ptr() if rows else None, tokens, send, recv, on_device=True,
                           expert_counts=expert_counts)
        out = torch.empty((max(int(tokens), 0), self.n), dtype=self.dtype, device=self.device)
        self._c_run(self._c_handle, x.data_ptr() if rows else None, weight.data_ptr(), self._routing_ptr,
                    out.data_ptr() if tokens > 0 else None, 0, 1, None, _raw_stream(torch, self._index))
        return out

    # (the custom ops' real implementation)
    def _run(self, x, weight, dest_rank, dest_token, gate, send_counts, recv_counts, tokens, combine,
             expert_counts=None, scales=None):
        torch = _tm()
        check_a2a_inputs(self, x, weight, dest_rank, dest_token, gate, send_counts, recv_counts, tokens, combine,
                         expert_counts)
        sa = sb = None
        if self._fp8 is not None:  # (the scales checked against the op's kind and x's rows; none read without rows)
            sa, sb = self._scale_ptrs(torch, *(scales or (None, None)), x.shape[0])
            if x.shape[0] == 0:
                sa = sb = None
        self._on_device(self._refuse_capture)  # (before the copies to the host, which a capture forbids too)
        rows = x.shape[0]
        send, recv = [int(c) for c in send_counts], [int(c) for c in recv_counts]
        by_expert = None if expert_counts is None else [int(c) for c in expert_counts]
        on_gpu = self.device.type == "cuda" and all(t is None or t.device == self.device
                                                    for t in (dest_rank, dest_token, gate))
        if on_gpu:  # passed where they are (at world 1 the call then never waits for the host)
            ranks, toks = _device_int32(dest_rank), _device_int32(dest_token)
            gates = None if gate is None else gate.detach().to(torch.float32).contiguous()
        else:
            ranks, toks, gates = _to_host(dest_rank, dest_token, gate)
            ranks, toks = _host_int32(self, "dest_rank", ranks), _host_int32(self, "dest_token", toks)
            gates = None if gates is None else gates.to(torch.float32).contiguous()
        routing = self._routing.fill(rows, _address_of(ranks), _address_of(toks), _address_of(gates), tokens, send,
                                     recv, on_device=on_gpu, expert_counts=by_expert)
        # (a negative size is the library's refusal, on every rank: allocate nothing for it)
        out_rows = max(int(tokens), 0) if combine else max(sum(recv), 0)
        out = torch.empty((out_rows, self.n), dtype=self.dtype, device=self.device)
        tokens_out = None if combine else torch.empty((out_rows,), dtype=torch.int32, device=self.device)

        tok = tokens_out.data_ptr() if tokens_out is not None and out_rows else None
        if self._fp8 is not None:
            self._enqueue_call(lambda stream: self._op.run_scaled(
                x.data_ptr() if rows else 0, weight.data_ptr(), routing, out.data_ptr() if out_rows else 0, sa, sb, 0,
                combine, tok, stream))
        else:
            self._enqueue_call(lambda stream: self._op.run(
                x.data_ptr() if rows else 0, weight.data_ptr(), routing, out.data_ptr() if out_rows else 0, 0,
                combine, tok, stream))
        # (no longer needed: a host routing was read by the call; a device one is read in the current stream,
        # whose order torch's allocator keeps before reusing the memory)
        del ranks, toks, gates
        return out, tokens_out

    def _refuse_capture(self):
        if _torch.cuda.is_current_stream_capturing():
            raise FlashOverlapError(f"{self}: a call cannot be captured into a CUDA graph (each call exchanges the "
                                    "ranks' routings and plans on the host)")

    def _enqueue_call(self, call):
        """call(stream) on the op's device and its current stream."""
        self._on_device(lambda: call(_torch.cuda.current_stream(self.device).cuda_stream))


# ---- the functionals ----

class GroupedGemm:
    """The experts' GEMM of a mixture of experts, no communication
    (flashoverlap::GroupedGemm): each expert's rows of x times its own weight.

    GroupedGemm(max_rows, experts, n, k, dtype, *, device=None, path="auto")

    op(x, weight, counts, out=None) -> out: x [rows, k] holds the experts'
    rows expert after expert (counts[e] rows of expert e, as a dispatch
    sorts them), weight [experts, n, k] the experts' nn.Linear weights
    stacked, counts the rows per expert (ints, or a CPU integer tensor; their
    sum is rows <= max_rows); out [rows, n] (allocated where not given) =
    each row of x times its expert's weight transposed. op(x, weight,
    offs=offs): the experts' row offsets instead, an int32 tensor on the
    op's device (offs[e] = the rows of experts 0..e, as torch._grouped_mm
    takes them): the host then waits for nothing and our GEMM runs; offsets
    that decrease or pass x's rows leave that expert's rows and every later
    one's out, and op.check() raises InvalidArgument (once). path: "auto" (the
    fastest at the call's mean rows per expert, timed at construction, of
    ours, cuBLAS's per-expert GEMMs and, in bf16 where torch has it,
    torch._grouped_mm: PyTorch's own, so that the op is never slower than
    it; the offs form runs ours, which checks the offsets), "ours" or
    "cublas". Eager calls on the current stream (not yet a
    custom op: not for torch.compile or CUDA graphs).
    """

    # (torch's grouped GEMM where it beat the library's choice by more than this, at a calibration sample)
    TORCH_MARGIN = 0.02
    # (the calibration's weights: at most this many bytes, all experts where they fit)
    CALIBRATION_BYTES = 1 << 30

    def __init__(self, max_rows, experts, n, k, dtype, *, device=None, path="auto"):
        who = "GroupedGemm"
        torch = require_torch()
        for name, v in (("max_rows", max_rows), ("experts", experts), ("n", n), ("k", k)):
            if not _is_int(v):
                raise InvalidArgument(f"{who}: {name} = {v!r} is not an int")
        if max_rows < 1 or experts < 1 or n < 1 or k < 8 or k % 8:
            raise InvalidArgument(f"{who}: max_rows = {max_rows}, experts = {experts}, n = {n}, k = {k}: needs "
                                  "max_rows, experts and n >= 1 and k a positive multiple of 8 (16-byte rows)")
        code = _check_dtype(torch, dtype, who)
        if path not in _capi.GROUPED_PATHS:
            raise InvalidArgument(f"{who}: path = {path!r}: one of {', '.join(map(repr, _capi.GROUPED_PATHS))}")
        self.device = _resolve_device(torch, device, who)
        self.max_rows, self.experts, self.n, self.k, self.dtype, self.path = max_rows, experts, n, k, dtype, path
        with torch.cuda.device(self.device):
            self._op = _capi.GroupedGemm(max_rows, experts, n, k, code, path=path)
        # {mean rows per expert sample: torch's grouped GEMM faster there}, sorted; empty: never torch's
        self._torch_at, self._last_torch = [], False
        grouped_mm = getattr(torch, "_grouped_mm", None)
        if path == "auto" and grouped_mm is not None and dtype is torch.bfloat16:
            with torch.cuda.device(self.device):
                self._torch_at = self._calibrate(torch, grouped_mm)

    def _calibrate(self, torch, grouped_mm):
        """[(mean rows per expert, torch's faster)] at powers of two up to max_rows / experts: ours (the
        library's pick) and torch._grouped_mm timed in turns, on as many of the experts
        as CALIBRATION_BYTES of weights hold (all where they fit), the counts ragged about the mean."""
        e_cal = max(1, min(self.experts, self.max_rows, self.CALIBRATION_BYTES // max(self.n * self.k * 2, 1)))
        most = max(self.max_rows // self.experts, 1)
        samples = sorted({min(1 << i, most) for i in range(4, max(most.bit_length(), 5))} | {most})
        dev, dt = self.device, self.dtype
        w = torch.randn(e_cal, self.n, self.k, device=dev).to(dt)
        x = torch.randn(min(samples[-1] * e_cal, self.max_rows), self.k, device=dev).to(dt)
        found = []
        stream = torch.cuda.current_stream(dev)
        for mean in samples:
            per = max(1, min(mean, self.max_rows // e_cal))
            # (ragged, as drawn counts are: per each would fill whole tile rows; see plan::ragged_counts)
            h = min(per // 2, 64)
            counts = [per + (h if e % 2 == 0 else -h) if e + 1 < e_cal or e % 2 else per for e in range(e_cal)]
            rows = per * e_cal
            xs = x[:rows]
            out = torch.empty(rows, self.n, dtype=dt, device=dev)
            offs = torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32, device=dev)
            ours = lambda: self._op.run(xs.data_ptr(), w.data_ptr(), counts + [0] * (self.experts - e_cal),  # noqa: E731
                                        out.data_ptr(), out.stride(0), stream.cuda_stream)
            theirs = lambda: grouped_mm(xs, w.transpose(-2, -1), offs=offs)  # noqa: E731
            times = [[], []]
            try:
                for f in (ours, theirs):
                    f()
            except RuntimeError:  # (torch's not for this shape or GPU: the library's alone)
                return []
            for _ in range(3):
                for i, f in enumerate((ours, theirs)):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    for _ in range(5):
                        f()
                    e.record()
                    e.synchronize()
                    times[i].append(s.elapsed_time(e))
            found.append((mean, min(times[1]) < (1 - self.TORCH_MARGIN) * min(times[0])))
        return found

    def _torch_for(self, rows):
        """Whether a call of `rows` rows runs torch._grouped_mm (the sample at or below its mean rows)."""
        if not self._torch_at:
            return False
        mean, pick = max(rows // self.experts, 1), self._torch_at[0][1]
        for at, faster in self._torch_at:
            if at <= mean:
                pick = faster
        return pick

    def __repr__(self):
        dt = str(self.dtype).replace("torch.", "")
        return (f"GroupedGemm(max_rows={self.max_rows}, experts={self.experts}, n={self.n}, k={self.k}, {dt}, "
                f"path={self.path!r}, {self.device})")

    def __str__(self):
        return repr(self)

    def __call__(self, x, weight, counts=None, out=None, *, offs=None):
        torch = require_torch()
        if (counts is None) == (offs is None):
            raise InvalidArgument(f"{self}: pass counts (host) or offs (the GPU's), one of them")
        if offs is not None:
            return self._call_offs(torch, x, weight, offs, out)
        if hasattr(counts, "tolist"):
            counts = counts.tolist()
        if len(counts) != self.experts:
            raise InvalidArgument(f"{self}: counts has {len(counts)} entries, expected {self.experts}")
        rows = sum(counts)  # (each count is checked by the library, which refuses a negative one)
        if rows > self.max_rows:
            raise InvalidArgument(f"{self}: the counts sum to {rows} rows, more than max_rows = {self.max_rows}")
        dt, i = self.dtype, self.device.index
        if not (type(x) is torch.Tensor and x.dtype is dt and x.dim() == 2 and x.shape[0] == rows
                and x.shape[1] == self.k and x.get_device() == i and x.is_contiguous()):
            _check_tensor(self, "x", x, (rows, self.k))
        if not (hasattr(weight, "get_device") and weight.dtype is dt and weight.shape == (self.experts, self.n, self.k) and weight.get_device() == i
                and weight.is_contiguous()):
            _check_tensor(self, "weight", weight, (self.experts, self.n, self.k))
        # (torch's reads what the counts say without checking them: the library's checks first)
        self._last_torch = rows > 0 and min(counts) >= 0 and self._torch_for(rows)
        if self._last_torch:
            # (from pinned memory, non-blocking: a copy from pageable memory would make the host wait for the GPU)
            offs = torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32).pin_memory().to(
                self.device, non_blocking=True)
            return self._torch_out(torch, x, weight, offs, out, rows)
        out = self._out(torch, out, rows)
        if rows:
            _on_device(self.device, lambda: self._op.run(x.data_ptr(), weight.data_ptr(), counts, out.data_ptr(),
                                                          out.stride(0), _raw_stream(torch, self.device.index)))
        return out

    def _torch_out(self, torch, x, weight, offs, out, rows):
        """torch._grouped_mm's product (into out where given)."""
        if out is not None:
            _check_tensor(self, "out", out, (rows, self.n), rows_contiguous=True)
        y = torch._grouped_mm(x, weight.transpose(-2, -1), offs=offs)
        if out is None:
            return y
        out.copy_(y)
        return out

    def _out(self, torch, out, rows):
        """out checked, or a new one of rows rows."""
        if out is None:
            return torch.empty(rows, self.n, dtype=self.dtype, device=self.device)
        _check_tensor(self, "out", out, (rows, self.n), rows_contiguous=True)
        return out

    def _call_offs(self, torch, x, weight, offs, out):
        if not hasattr(offs, "dtype") or offs.dtype != torch.int32 or offs.device != self.device or offs.dim() != 1 \
                or offs.shape[0] != self.experts or not offs.is_contiguous():
            raise InvalidArgument(f"{self}: offs must be a contiguous int32 tensor of {self.experts} entries on "
                                  f"{self.device}")
        if not hasattr(x, "shape") or x.dim() != 2:
            raise InvalidArgument(f"{self}: x must be a 2-D tensor (rows, k)")
        rows = int(x.shape[0])
        if rows > self.max_rows:
            raise InvalidArgument(f"{self}: x has {rows} rows, more than max_rows = {self.max_rows}")
        _check_tensor(self, "x", x, (rows, self.k))
        _check_tensor(self, "weight", weight, (self.experts, self.n, self.k))
        # (ours only: it checks the offsets on the GPU and leaves rows past the last one as they are)
        self._last_torch = False
        out = self._out(torch, out, rows)
        if rows:
            _on_device(self.device, lambda: self._op.run_offsets(x.data_ptr(), weight.data_ptr(), offs.data_ptr(),
                                                                  rows, out.data_ptr(), out.stride(0),
                                                                  _raw_stream(torch, self.device.index)))
        return out

    def check(self):
        """InvalidArgument if an earlier call's offs were bad (synchronise its stream first; raised once)."""
        self._op.check()

    def last_plan(self):
        """The last call's GEMM and why, as text."""
        if self._last_torch:
            return "torch._grouped_mm (faster than ours and cuBLAS's at this mean rows per expert at construction)"
        return self._op.last_plan()


def round_max_m(m):
    """The max_m the functional builds for m rows: the next power of two, at
    least 128 (one tile row), so that a few ops serve every m."""
    return max(128, 1 << (max(int(m), 1) - 1).bit_length())


def _cached(cls, cache, fn, x, weight, group, max_m, options):
    """The functional fn's op (a cls) for these tensors, built or found in cache."""
    torch = require_torch()
    for name, t in (("x", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise InvalidArgument(f"{fn}: {name} must be a torch.Tensor, not {type(t).__name__}")
    if weight.dim() != 2 or x.dim() < 2 or x.shape[-1] != weight.shape[1]:
        raise InvalidArgument(f"{fn}: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not fit: "
                              "x is (..., k), weight (n, k)")
    n, k = weight.shape
    m = x.numel() // k if k else 0
    group_obj = _resolve_group(torch, group, cls.__name__)[0]
    key = (group_obj, weight.device, weight.dtype, n, k, tuple(sorted(options.items())))
    with _lock:
        op = cache.get(key)
        need = max(m, max_m or 0)
        if op is None or op.max_m < need:
            # (an op outgrown is dropped here and released once nothing uses it)
            op = cls(group_obj, round_max_m(need), n, k, weight.dtype, device=weight.device, **options)
            cache[key] = op
        return op


def _cached_op(x, weight, group, max_m, options):
    return _cached(GemmAllReduce, _cache, "gemm_all_reduce", x, weight, group, max_m, options)


def _cached_rs_op(x, weight, group, max_m, options):
    return _cached(GemmReduceScatter, _rs_cache, "gemm_reduce_scatter", x, weight, group, max_m, options)


_lookup = _cached_op  # rebound by _register_ops to the same, eager under torch.compile
_rs_lookup = _cached_rs_op


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


def gemm_reduce_scatter(x, weight, group=None, *, residual=None, norm_weight=None, eps=1e-6, max_m=None,
                        **options):
    """This rank's rows of sum over group of x @ weight.T (see
    GemmReduceScatter.__call__: (m / world, n) with the default standard
    layout), or with residual and norm_weight the RMSNorm form, through an op
    built at the first call for (group, device, dtype, n, k, options) and
    kept, as gemm_all_reduce keeps its ops (max_m: m rounded up to a power of
    two, or max_m if larger). options: GemmReduceScatter's (path, layout,
    nccl_sms, ...). Collective as gemm_all_reduce; under torch.compile the
    lookup runs eagerly (a graph break): use a GemmReduceScatter for
    fullgraph=True."""
    op = _rs_lookup(x, weight, group, max_m, options)
    return op(x, weight, residual=residual, norm_weight=norm_weight, eps=eps)


def _cached_a2a_op(x, weight, recv_counts, tokens, group, max_rows, max_tokens, topk, options):
    """gemm_all_to_all's op for these tensors and sizes, built or found in the
    cache. The ranks' rows (and tokens) differ, but the op's sizes must be the
    same on every rank, and so must the decision to build a larger one: unless
    max_rows and max_tokens are both given, one small all_reduce (MAX) over
    the group agrees on the largest of the call."""
    torch = require_torch()
    fn = "gemm_all_to_all"
    for name, t in (("x", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise InvalidArgument(f"{fn}: {name} must be a torch.Tensor, not {type(t).__name__}")
    if weight.dim() not in (2, 3) or x.dim() != 2 or x.shape[1] != weight.shape[-1]:
        raise InvalidArgument(f"{fn}: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not fit: x is (rows, k), "
                              "weight (n, k) or (experts, n, k)")
    if isinstance(tokens, bool) or not isinstance(tokens, int):
        raise InvalidArgument(f"{fn}: tokens = {tokens!r} is not an int (this rank's tokens: the combined output's rows)")
    n, k = weight.shape[-2:]
    # (the experts per rank: a 3-D weight's first dimension; they are part of the op, so of its key)
    experts = options.get("experts", weight.shape[0] if weight.dim() == 3 else 1)
    if weight.dim() == 3 and experts != weight.shape[0]:
        raise InvalidArgument(f"{fn}: experts = {experts!r}, but weight {tuple(weight.shape)} holds "
                              f"{weight.shape[0]} experts' weights")
    options = dict(options, experts=_capi.check_experts(experts, f"{fn}: "))
    group_obj, _, world = _resolve_group(torch, group, "GemmAllToAll")
    if topk is None and experts > 1:  # (its buffers grow with it: world x experts would be far too many)
        raise InvalidArgument(f"{fn}: topk is required with a 3-D weight ({experts} experts per rank): the experts "
                              "each token picks")
    topk = world if topk is None else topk
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= world * experts:
        raise InvalidArgument(f"{fn}: topk = {topk!r}: needs 1 <= topk <= the world size {world}"
                              + ("" if experts == 1 else f" x {experts} experts per rank = {world * experts}"))
    if torch.is_tensor(recv_counts):
        recv_counts = recv_counts.tolist()
    received = sum(int(c) for c in recv_counts) if isinstance(recv_counts, (list, tuple)) else 0
    need = [max_rows or 0, max_tokens or 0]
    if max_rows is None or max_tokens is None:
        # (received rows: at most max_tokens * topk)
        mine = torch.tensor([x.shape[0], tokens, -(-max(received, 0) // topk)], dtype=torch.int64,
                            device=weight.device)
        with torch.cuda.device(weight.device):
            torch.distributed.all_reduce(mine, op=torch.distributed.ReduceOp.MAX, group=group_obj)
        rows_all, tokens_all, recv_all = mine.tolist()
        need = [max(need[0], rows_all), max(need[1], tokens_all, recv_all)]
    key = (group_obj, weight.device, weight.dtype, n, k, topk, tuple(sorted(options.items())))
    with _lock:
        op = _a2a_cache.get(key)
        if op is None or op.max_rows < need[0] or op.max_tokens < need[1]:
            # (an op outgrown is dropped here and released once nothing uses it; sizes never shrink)
            rows = round_max_m(max(need[0], op.max_rows if op else 0))
            toks = min(round_max_m(max(need[1], op.max_tokens if op else 0)), (1 << 30) - 1)
            op = GemmAllToAll(group_obj, rows, toks, topk, n, k, weight.dtype, device=weight.device, **options)
            _a2a_cache[key] = op
        return op


_a2a_lookup = _cached_a2a_op


def gemm_all_to_all(x, weight, dest_rank, dest_token, gate_weight, send_counts, recv_counts, group, tokens,
                    combine=True, *, expert_counts=None, max_rows=None, max_tokens=None, topk=None, **options):
    """The MoE combine (see GemmAllToAll.__call__: the (tokens, n) combined
    output, or with combine=False the received rows and their tokens) over
    group (None: the default group), through an op built at the first call
    for (group, device, dtype, n, k, topk, options) and kept. A 3-D weight
    (experts, n, k) is several experts per rank (their number joins the
    options; expert_counts as GemmAllToAll.__call__ takes them). topk: the
    world size unless given (the loosest bound on the rows a rank receives,
    max_tokens * topk, with one expert per rank); with a 3-D weight it is
    required (world x experts would size the buffers for every token
    picking every expert). Its max_rows and
    max_tokens are the largest of the call over the ranks (rows of x,
    tokens, received rows / topk), rounded up to a power of two
    (round_max_m), or max_rows / max_tokens where given and larger; a call
    beyond them builds a larger op.

    The ranks' sizes differ (each expert receives its own rows), so unless
    max_rows and max_tokens are both given (the same on every rank), every
    call first agrees on them with one small all_reduce over the group (and
    a sync): then every rank builds the same ops at the same calls (building
    is collective). With both given nothing is exchanged, and a call beyond
    them is refused by the library, on every rank. options:
    GemmAllToAll's (path, nccl_sms, wait_timeout_s, experts). Under
    torch.compile the lookup runs eagerly (a graph break): use a
    GemmAllToAll for fullgraph=True."""
    op = _a2a_lookup(x, weight, recv_counts, tokens, group, max_rows, max_tokens, topk, options)
    return op(x, weight, dest_rank, dest_token, gate_weight, send_counts, recv_counts, tokens, combine,
              expert_counts=expert_counts)


def clear_cache():
    """Drops the functionals' ops and the bootstrapped communicators (each is
    released once no op uses it), and this thread's output allocated ahead
    (the eager calls' outputs above 8 MiB); the next call builds anew
    (collective)."""
    _big._ahead = None
    with _lock:
        _cache.clear()
        _rs_cache.clear()
        _a2a_cache.clear()
        for comm in _comms.values():
            comm.close()  # (the ops built on a communicator keep it alive)
        _comms.clear()
