"""Argument checks of the PyTorch ops (flashoverlap.torch): messages that
name the argument, what it is and what the op wants; the ReduceScatter's
rows per rank (what its fake implementations need); the op's device and
process group. Shared by the eager calls and the custom ops' real and fake
implementations."""

import importlib
import os

from . import InvalidArgument, NoGpu, _capi


def _tm():
    """The torch module: the one flashoverlap.torch accepted, or (the checks'
    tests under an older torch) the importable one."""
    ops = importlib.import_module(__package__ + ".torch")
    return ops._torch if ops._torch is not None else importlib.import_module("torch")


def _describe(t):
    return f"shape {tuple(t.shape)}, strides {tuple(t.stride())}"


def _check_tensor(op, name, t, shape, rows_contiguous=False, dtype=None):
    """t: a tensor of op's dtype (or `dtype`) and device, row-major
    contiguous (or, with rows_contiguous, 2-D with each row contiguous and
    rows a stride of at least their length apart), of `shape` (None: that
    dimension is free)."""
    if not hasattr(t, "data_ptr") or not hasattr(t, "dtype"):
        raise InvalidArgument(f"{op}: {name} must be a torch.Tensor, not {type(t).__name__}")
    want = op.dtype if dtype is None else dtype
    if t.dtype != want:
        raise InvalidArgument(f"{op}: {name} has dtype {t.dtype}, expected {want}")
    if t.device != op.device:
        raise InvalidArgument(f"{op}: {name} is on {t.device}, expected {op.device}")
    if t.dim() != len(shape):
        raise InvalidArgument(f"{op}: {name} has {t.dim()} dimensions ({_describe(t)}), expected {len(shape)}")
    for got, want in zip(t.shape, shape):
        if want is not None and got != want:
            want_s = "(" + ", ".join("m" if w is None else str(w) for w in shape) + ("," if len(shape) == 1 else "") + ")"
            raise InvalidArgument(f"{op}: {name} has shape {tuple(t.shape)}, expected {want_s}")
    if rows_contiguous and t.dim() == 2 and t.stride(1) == 1 and t.stride(0) >= t.shape[1]:
        return
    if not t.is_contiguous():
        raise InvalidArgument(f"{op}: {name} is not contiguous ({_describe(t)}): the op reads row-major rows; "
                              f"pass {name}.contiguous()")


def check_inputs(op, x, weight, residual=None, norm_weight=None, bound_m=True):
    """InvalidArgument unless x (m x k), weight (n x k) and, for the RMSNorm
    form, residual (m x n) and norm_weight (n) fit op (anything with max_m,
    n, k, dtype and device): dtype, device, shape, contiguity, m <= max_m."""
    m = _check_x_and_weight(op, x, weight, bound_m)
    _check_rmsnorm(op, residual, norm_weight, m)


def _check_x_and_weight(op, x, weight, bound_m):
    """x (m x k) and weight (n x k) of op, m <= max_m where bound_m; m."""
    _check_tensor(op, "x", x, (None, op.k))
    _check_tensor(op, "weight", weight, (op.n, op.k))
    m = x.shape[0]
    if bound_m and m > op.max_m:
        raise InvalidArgument(f"{op}: x has m = {m} rows, more than the op's max_m = {op.max_m} "
                              "(build the op with a larger max_m)")
    return m


def _check_rmsnorm(op, residual, norm_weight, rows):
    """The RMSNorm form's residual (rows x n) and norm_weight (n), given together, or neither."""
    if residual is not None or norm_weight is not None:
        if residual is None or norm_weight is None:
            raise InvalidArgument(f"{op}: residual and norm_weight come together (the fused residual + RMSNorm form)")
        _check_tensor(op, "residual", residual, (rows, op.n))
        _check_tensor(op, "norm_weight", norm_weight, (op.n,))


RS_TILE_ROWS = 128  # the sub-tile layout's tile rows (every tile shape's height)


def _clamp(v, lo, hi):
    """min(max(v, lo), hi), for a torch SymInt too (without a guard on it)."""
    if isinstance(v, int):
        return min(max(v, lo), hi)
    torch = _tm()
    return torch.sym_min(torch.sym_max(v, lo), hi)


def rs_rows_out(m, world, rank, layout):
    """How many rows of the sum rank `rank` of `world` holds for m (as
    GemmReduceScatter::rows_out; m may be a torch SymInt): standard, m /
    world; sub-tile, 128 / world of every 128-row tile row (fewer in the last,
    partial one)."""
    if layout == "standard":
        return m // world
    h = RS_TILE_ROWS // world
    return (m // RS_TILE_ROWS) * h + _clamp(m % RS_TILE_ROWS - rank * h, 0, h)


def rs_rows(m, world, rank, layout):
    """Which rows of the sum rank `rank` holds for m, in order (a list; as
    GemmReduceScatter::rows)."""
    if layout == "standard":
        return list(range(rank * (m // world), (rank + 1) * (m // world)))
    h = RS_TILE_ROWS // world
    return [t + rank * h + i for t in range(0, m, RS_TILE_ROWS) for i in range(h) if t + rank * h + i < m]


def check_rs_inputs(op, x, weight, residual=None, norm_weight=None, bound_m=True):
    """check_inputs for a GemmReduceScatter (anything with max_m, n, k, dtype,
    device, world, rank and layout): x (m x k), weight (n x k), m <= max_m, m
    a multiple of the world size for the standard layout, and, for the
    RMSNorm form, residual (rows_out(m) x n: this rank's rows) and
    norm_weight (n)."""
    m = _check_x_and_weight(op, x, weight, bound_m)
    if op.layout == "standard" and isinstance(m, int) and m % op.world:
        raise InvalidArgument(f"{op}: x has m = {m} rows, not a multiple of the world size {op.world} (the "
                              "standard layout gives every rank m / world rows: pad x, or use layout='subtile')")
    if residual is not None or norm_weight is not None:
        _check_rmsnorm(op, residual, norm_weight, rs_rows_out(m, op.world, op.rank, op.layout))


def check_gather_inputs(op, y, m, bound_m=True):
    """InvalidArgument unless y fits an all_gather_rows of m rows on op (a
    GemmReduceScatter, or anything with its attributes): y this rank's rows,
    rows_out(m) x n (what the op's call gives for m rows, or a row-wise step's
    output of it), of the op's dtype and device, row-major contiguous; 0 <= m
    <= max_m, a multiple of the world size for the standard layout; n % 8 ==
    0 for the sub-tile layout (its row exchange moves 16-byte pieces). m may
    be a torch SymInt (the fake implementation): what would guard on its
    value is checked for ints only."""
    _check_tensor(op, "y", y, (None, None))
    if isinstance(m, int):
        if m < 0 or (bound_m and m > op.max_m):
            raise InvalidArgument(f"{op}: all_gather_rows: m = {m}: needs 0 <= m <= max_m = {op.max_m}")
        if op.layout == "standard" and m % op.world:
            raise InvalidArgument(f"{op}: all_gather_rows: m = {m} is not a multiple of the world size {op.world} "
                                  "(the standard layout gives every rank m / world rows)")
    if op.layout != "standard" and op.n % 8:
        raise InvalidArgument(f"{op}: all_gather_rows: the sub-tile layout's row exchange needs n % 8 == 0, not "
                              f"n = {op.n}")
    rows = rs_rows_out(m, op.world, op.rank, op.layout)
    if y.shape[0] != rows or y.shape[1] != op.n:
        raise InvalidArgument(f"{op}: all_gather_rows: y has shape {tuple(y.shape)}, expected ({rows}, {op.n}): "
                              f"this rank's rows_out(m) = {rows} rows of the sum for m = {m}, as the op's output "
                              "gives them")


def _check_shape(max_m, n, k, who="GemmAllReduce"):
    for name, v in (("max_m", max_m), ("n", n), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise InvalidArgument(f"{who}: {name} = {v!r} is not an int")
    if max_m < 1 or n < 1 or k < 8 or k % 8:
        raise InvalidArgument(f"{who}: max_m = {max_m}, n = {n}, k = {k}: needs max_m >= 1, n >= 1 and k a "
                              "positive multiple of 8 (16-byte rows)")
    return max_m, n, k


def _check_dtype(torch, dtype, who="GemmAllReduce"):
    codes = {torch.bfloat16: _capi.DTYPE_BF16, torch.float16: _capi.DTYPE_FP16}
    if dtype not in codes:
        raise InvalidArgument(f"{who}: dtype {dtype} is not supported: torch.bfloat16 or torch.float16")
    return codes[dtype]


def _require_gpu(torch, device, who="GemmAllReduce"):
    """NoGpu unless device is a CUDA device of compute capability 9.0 (Hopper)."""
    if not torch.cuda.is_available():
        raise NoGpu(f"flashoverlap.torch.{who}: no usable GPU: torch.cuda.is_available() is False"
                    + (f" (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']})"
                       if "CUDA_VISIBLE_DEVICES" in os.environ else ""))
    cc = torch.cuda.get_device_capability(device)
    if cc != (9, 0):
        raise NoGpu(f"flashoverlap.torch.{who}: {device} ({torch.cuda.get_device_name(device)}) is "
                    f"sm_{cc[0]}{cc[1]}, not a Hopper (sm_90) GPU")


def _resolve_device(torch, device, who="GemmAllReduce"):
    """The op's device, with its index; InvalidArgument for a non-CUDA one,
    NoGpu where it is no Hopper GPU."""
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type != "cuda":
        raise InvalidArgument(f"{who}: device {device} is not a CUDA device")
    if not torch.cuda.is_available():
        _require_gpu(torch, device, who)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    _require_gpu(torch, device, who)
    return device


def _resolve_group(torch, group, who="GemmAllReduce"):
    """(group, rank in it, its size); InvalidArgument without torch.distributed
    or for a group this process is not in."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidArgument(f"{who}: torch.distributed is not initialised: call "
                              "torch.distributed.init_process_group first (the op is collective over a process group)")
    if group is None:
        group = dist.group.WORLD
    elif not isinstance(group, dist.ProcessGroup) and group == getattr(dist.GroupMember, "NON_GROUP_MEMBER", object()):
        # (what new_group returns to the processes it leaves out)
        raise InvalidArgument(f"{who}: this process (global rank {dist.get_rank()}) is not a member of the group")
    elif not isinstance(group, dist.ProcessGroup):
        raise InvalidArgument(f"{who}: group must be a torch.distributed ProcessGroup or None (the default "
                              f"group), not {type(group).__name__}")
    rank = dist.get_rank(group)
    if rank < 0:
        raise InvalidArgument(f"{who}: this process (global rank {dist.get_rank()}) is not a member of the group")
    return group, rank, dist.get_world_size(group)


INT32_MAX = (1 << 31) - 1


def _is_int(v):
    """An int or a torch SymInt (not a bool)."""
    if isinstance(v, bool):
        return False
    return isinstance(v, int) or isinstance(v, getattr(_tm(), "SymInt", ()))


def _counts(torch, op, name, v):
    """send_counts / recv_counts as a list of op.world ints: from a list or
    tuple of ints (torch SymInts too), or from an integer tensor of world
    entries on any device (tolist(): a device tensor syncs)."""
    if type(v) is list and len(v) == op.world and all(type(c) is int for c in v):  # (the common case, told fast)
        return v
    if torch.is_tensor(v):
        if v.dtype.is_floating_point or v.dtype.is_complex or v.dtype == torch.bool or v.dim() != 1:
            raise InvalidArgument(f"{op}: {name} must be a 1-D integer tensor or a list of ints, not a tensor of "
                                  f"dtype {v.dtype} and {_describe(v)}")
        v = v.tolist()
    if not isinstance(v, (list, tuple)):
        raise InvalidArgument(f"{op}: {name} must be a list of {op.world} ints (one per rank) or a 1-D integer "
                              f"tensor, not {type(v).__name__}")
    if len(v) != op.world:
        raise InvalidArgument(f"{op}: {name} has {len(v)} entries, expected the world size {op.world} (one per rank)")
    for c in v:
        if not _is_int(c):
            raise InvalidArgument(f"{op}: {name} = {list(v)!r}: not a list of ints")
    return list(v)


def _expert_counts(torch, op, v):
    """expert_counts as a list of op.world * op.experts ints (None passes
    through): from a flat list or tuple of them, a nested one (world lists
    of experts ints), or an integer tensor of world * experts entries, 1-D
    or (world, experts), on any device (tolist(): a device tensor syncs).
    What the values say is check_expert_counts'."""
    if v is None:
        return None
    world, experts = op.world, op.experts
    want = world * experts
    if torch.is_tensor(v):
        if v.dtype.is_floating_point or v.dtype.is_complex or v.dtype == torch.bool or \
                tuple(v.shape) not in ((want,), (world, experts)):
            raise InvalidArgument(f"{op}: expert_counts must be an integer tensor of shape ({want},) or ({world}, "
                                  f"{experts}) (world x experts), or a list of ints, not a tensor of dtype {v.dtype} "
                                  f"and {_describe(v)}")
        return v.reshape(-1).tolist()
    if not isinstance(v, (list, tuple)):
        raise InvalidArgument(f"{op}: expert_counts must be a list of {want} ints (world {world} x {experts} experts, "
                              f"source-major), {world} lists of {experts}, or an integer tensor, not "
                              f"{type(v).__name__}")
    if v and all(isinstance(c, (list, tuple)) for c in v):
        if len(v) != world or any(len(c) != experts for c in v):
            raise InvalidArgument(f"{op}: expert_counts has {len(v)} lists of {[len(c) for c in v]} entries, expected "
                                  f"the world size {world} lists of {experts} (one per expert of this rank)")
        v = [c for per_source in v for c in per_source]
    for c in v:
        if not _is_int(c):
            raise InvalidArgument(f"{op}: expert_counts = {list(v)!r}: not a list of ints")
    return list(v)


def check_expert_counts(op, expert_counts, send_counts):
    """InvalidArgument unless expert_counts fits op: None with one expert per
    rank; with several, world * experts ints (expert_counts[s * experts + e]
    = the rows of x from rank s for expert e), and at world 1 none negative,
    each source's summing to its send_counts entry (its rows go back to it;
    at world > 1 the library checks these on every rank at once). Values that
    are torch SymInts (a fake call) are not compared, so as not to guard on
    them."""
    world, experts = op.world, op.experts
    if experts == 1:
        if expert_counts is not None:
            raise InvalidArgument(f"{op}: expert_counts is for several experts per rank; this op has one (pass None: "
                                  "send_counts say the rows)")
        return
    want = world * experts
    if expert_counts is None:
        raise InvalidArgument(f"{op}: expert_counts is required with {experts} experts per rank: the rows of x from "
                              f"each rank for each expert, {want} ints (world x experts, source-major)")
    if not isinstance(expert_counts, (list, tuple)):
        raise InvalidArgument(f"{op}: expert_counts must be a list of world x experts = {world} x {experts} = {want} "
                              f"ints, not {type(expert_counts).__name__}")
    if len(expert_counts) != want:
        raise InvalidArgument(f"{op}: expert_counts has {len(expert_counts)} entries, expected world x experts = "
                              f"{world} x {experts} = {want} ints")
    for c in expert_counts:
        if not _is_int(c):
            raise InvalidArgument(f"{op}: expert_counts = {list(expert_counts)!r}: not a list of ints")
    # The values against each other: here only where this rank is every rank; with more, the library refuses
    # them on every rank together (a refusal on one rank alone would leave the others in the routing exchange).
    if world > 1:
        return
    for i, c in enumerate(expert_counts):
        if type(c) is int and c < 0:
            raise InvalidArgument(f"{op}: expert_counts[{i}] = {c} (rank {i // experts}, expert {i % experts}) is "
                                  "negative")
    for s in range(min(world, len(send_counts))):
        mine, sent = expert_counts[s * experts:(s + 1) * experts], send_counts[s]
        if type(sent) is int and all(type(c) is int for c in mine) and sum(mine) != sent:
            raise InvalidArgument(f"{op}: expert_counts of rank {s} ({list(mine)}) sum to {sum(mine)}, but "
                                  f"send_counts[{s}] = {sent}: rank {s}'s rows, expert after expert, are the rows that "
                                  "go back to it")


def _a2a_weight_shape(op, weight):
    """The weight's shape op takes: (n, k) with one expert per rank (or
    (1, n, k)), (experts, n, k) with several: the experts' nn.Linear weights
    stacked."""
    if op.experts == 1 and not (hasattr(weight, "dim") and weight.dim() == 3):
        return (op.n, op.k)
    return (op.experts, op.n, op.k)


def _input_dtype(op):
    """The dtype of x and weight: the op's, or its FP8 inputs' (input="e4m3")."""
    return getattr(op, "_fp8", None) or op.dtype


def _check_a2a_weight(op, weight):
    shape = _a2a_weight_shape(op, weight)
    if hasattr(weight, "data_ptr") and hasattr(weight, "dtype") and weight.dtype == _input_dtype(op) \
            and weight.device == op.device and weight.dim() != len(shape):
        # (named by the shape wanted: a 2-D weight with several experts is the common slip)
        if op.experts == 1:
            want = f"({op.n}, {op.k}) (or (1, {op.n}, {op.k}))"
        else:
            want = f"{shape}: the {op.experts} experts' weights stacked (experts, n, k)"
        raise InvalidArgument(f"{op}: weight has shape {tuple(weight.shape)}, expected {want}")
    _check_tensor(op, "weight", weight, shape, dtype=_input_dtype(op))


def _check_index(op, name, t, rows):
    """t: an integer tensor of rows entries (dest_rank, dest_token), 1-D, on any device."""
    if not hasattr(t, "data_ptr") or not hasattr(t, "dtype"):
        raise InvalidArgument(f"{op}: {name} must be a torch.Tensor, not {type(t).__name__}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == _tm().bool:
        raise InvalidArgument(f"{op}: {name} has dtype {t.dtype}, expected an integer dtype (int32 or int64)")
    if t.dim() != 1 or t.shape[0] != rows:
        raise InvalidArgument(f"{op}: {name} has shape {tuple(t.shape)}, expected ({rows},): one entry per row of x")


def check_fp8_inputs(op, x, weight):
    """InvalidArgument unless op takes FP8 inputs (input="e4m3") and x (m x
    k) and weight (n x k) are contiguous torch.float8_e4m3fn tensors on its
    device (the FP8 custom ops' fakes: the scales' checks need the data's
    counts and come with the call)."""
    if getattr(op, "_fp8", None) is None:
        raise InvalidArgument(f"{op}: scale_a and scale_b are for an op built with input='e4m3'")
    _check_tensor(op, "x", x, (None, op.k), dtype=op._fp8)
    _check_tensor(op, "weight", weight, (op.n, op.k), dtype=op._fp8)


def check_a2a_inputs(op, x, weight, dest_rank, dest_token, gate, send_counts, recv_counts, tokens, combine,
                     expert_counts=None):
    """InvalidArgument unless a GemmAllToAll call's arguments have the types and
    shapes op (anything with n, k, dtype, device, world and experts) wants:
    x (rows x k) and weight (n x k, or (1, n, k); with several experts per
    rank (experts, n, k)) of its dtype and device, contiguous; dest_rank and
    dest_token integer tensors of rows entries and gate (required to
    combine) a floating one, on any device; send_counts and recv_counts
    lists of world ints; tokens an int; expert_counts as
    check_expert_counts says (None with one expert). What the values say
    (ranks and tokens in range, counts that add up between ranks and with
    dest_rank, sizes within the op's) the library checks, on every rank
    together."""
    _check_tensor(op, "x", x, (None, op.k), dtype=_input_dtype(op))
    _check_a2a_weight(op, weight)
    rows = x.shape[0]
    _check_index(op, "dest_rank", dest_rank, rows)
    _check_index(op, "dest_token", dest_token, rows)
    if gate is None:
        if combine:
            raise InvalidArgument(f"{op}: gate_weight is required to combine (combine=False returns the rows "
                                  "unweighted)")
    else:
        if not hasattr(gate, "data_ptr") or not hasattr(gate, "dtype"):
            raise InvalidArgument(f"{op}: gate_weight must be a torch.Tensor, not {type(gate).__name__}")
        if not gate.dtype.is_floating_point:
            raise InvalidArgument(f"{op}: gate_weight has dtype {gate.dtype}, expected a floating dtype (float32)")
        if gate.dim() != 1 or gate.shape[0] != rows:
            raise InvalidArgument(f"{op}: gate_weight has shape {tuple(gate.shape)}, expected ({rows},): one entry "
                                  "per row of x")
    for name, v in (("send_counts", send_counts), ("recv_counts", recv_counts)):
        if not isinstance(v, (list, tuple)) or len(v) != op.world:
            raise InvalidArgument(f"{op}: {name} must be a list of the world size {op.world} ints")
    if not _is_int(tokens):
        raise InvalidArgument(f"{op}: tokens = {tokens!r} is not an int (this rank's tokens)")
    check_expert_counts(op, expert_counts, send_counts)


def _host_int32(op, name, h):
    """h (an integer CPU tensor) as a contiguous int32 one, InvalidArgument
    for values outside int32."""
    if h.dtype != _tm().int32:
        if h.numel() and (int(h.min()) < -INT32_MAX - 1 or int(h.max()) > INT32_MAX):
            raise InvalidArgument(f"{op}: {name} has values outside int32 (from {int(h.min())} to {int(h.max())})")
        h = h.to(_tm().int32)
    return h.contiguous()


def _flatten(op, name, t):
    if not t.is_contiguous():
        raise InvalidArgument(f"{op}: {name} is not contiguous ({_describe(t)}): the op reads row-major rows; "
                              f"pass {name}.contiguous()")
    return t.view(-1, t.shape[-1])
