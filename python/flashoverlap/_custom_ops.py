"""The torch.library custom ops of flashoverlap.torch: what traced and
compiled code (and torch.compile's graphs) call. Each op is one row of
_OPS: its name, its schema, its real implementation (the op object looked
up by the integer handle that ends every schema's required arguments,
then its method) and its fake one (the output's shape from what needs no
data, after the checks that need none), so that tracing runs nothing.
Registered once, by register()."""

from . import torch as ops
from ._checks import (check_a2a_inputs, check_fp8_inputs, check_gather_inputs, check_inputs, check_rs_inputs,
                      rs_rows_out)


def _lenient(handle, cls):
    """The op of a handle where it names one of cls, else None: the
    AllReduce's output shape needs no op, so its fakes check only when they
    find it."""
    op = ops._ops.get(handle) if isinstance(handle, int) else None
    return op if isinstance(op, cls) else None


# ---- GemmAllReduce: (m, n), and the residual + RMSNorm form's two (m, n) ----

def _all_reduce(x, weight, handle):
    return ops._op_of(handle, ops.GemmAllReduce)._run(x, weight)


def _all_reduce_fake(x, weight, handle):
    op = _lenient(handle, ops.GemmAllReduce)
    if op is not None:
        check_inputs(op, x, weight, bound_m=False)
    return x.new_empty((x.shape[0], weight.shape[0]))


def _all_reduce_rmsnorm(x, weight, residual, norm_weight, eps, handle):
    return ops._op_of(handle, ops.GemmAllReduce)._run_rmsnorm(x, weight, residual, norm_weight, eps)


def _all_reduce_rmsnorm_fake(x, weight, residual, norm_weight, eps, handle):
    op = _lenient(handle, ops.GemmAllReduce)
    if op is not None:
        check_inputs(op, x, weight, residual, norm_weight, bound_m=False)
    return residual.new_empty(residual.shape), residual.new_empty(residual.shape)


# ---- GemmReduceScatter: the output's rows depend on the op (world, rank,
# layout); rs_rows_out says them for a symbolic m too (dynamic shapes) ----

def _reduce_scatter(x, weight, handle):
    return ops._op_of(handle, ops.GemmReduceScatter)._run(x, weight)


def _reduce_scatter_fake(x, weight, handle):
    op = ops._op_of(handle, ops.GemmReduceScatter)
    check_rs_inputs(op, x, weight, bound_m=False)
    return x.new_empty((rs_rows_out(x.shape[0], op.world, op.rank, op.layout), weight.shape[0]))


def _reduce_scatter_rmsnorm(x, weight, residual, norm_weight, eps, handle):
    return ops._op_of(handle, ops.GemmReduceScatter)._run_rmsnorm(x, weight, residual, norm_weight, eps)


def _reduce_scatter_rmsnorm_fake(x, weight, residual, norm_weight, eps, handle):
    op = ops._op_of(handle, ops.GemmReduceScatter)
    check_rs_inputs(op, x, weight, residual, norm_weight, bound_m=False)
    return residual.new_empty(residual.shape), residual.new_empty(residual.shape)


# ---- FP8 inputs (input="e4m3"): the scales after the op's arguments; the
# outputs as the 16-bit forms' (the op's dtype) ----

def _scaled(cls):
    def real(x, weight, scale_a, scale_b, handle):
        return ops._op_of(handle, cls)._run_fp8(x, weight, None, None, 1e-6, scale_a, scale_b)
    return real


def _scaled_fake(cls):
    def fake(x, weight, scale_a, scale_b, handle):
        op = ops._op_of(handle, cls)
        check_fp8_inputs(op, x, weight)
        m = x.shape[0]
        rows = m if cls is ops.GemmAllReduce else rs_rows_out(m, op.world, op.rank, op.layout)
        return x.new_empty((rows, op.n), dtype=op.dtype)
    return fake


def _scaled_rmsnorm(cls):
    def real(x, weight, residual, norm_weight, eps, scale_a, scale_b, handle):
        return ops._op_of(handle, cls)._run_fp8(x, weight, residual, norm_weight, eps, scale_a, scale_b)
    return real


def _scaled_rmsnorm_fake(cls):
    def fake(x, weight, residual, norm_weight, eps, scale_a, scale_b, handle):
        check_fp8_inputs(ops._op_of(handle, cls), x, weight)
        return residual.new_empty(residual.shape), residual.new_empty(residual.shape)
    return fake


# The AllGather that closes the chain: m is an argument (a SymInt: the
# standard layout's default, rows * world, is symbolic under dynamic shapes).
def _all_gather_rows(y, m, handle):
    return ops._op_of(handle, ops.GemmReduceScatter)._all_gather_rows(y, m)


def _all_gather_rows_fake(y, m, handle):
    op = ops._op_of(handle, ops.GemmReduceScatter)
    check_gather_inputs(op, y, m, bound_m=False)
    return y.new_empty((m, op.n))


# ---- GemmAllToAll: the counts are int lists (SymInt[]), so the outputs' rows
# are known without the data: (tokens, n) combined; (sum(recv_counts), n) and
# the rows' tokens not. expert_counts (several experts per rank; None with
# one) and FP8 inputs' scale_a and scale_b come after the handle, with
# defaults, so that the calls without them leave them out; they change no
# output's shape ----

def _scales(scale_a, scale_b):
    return None if scale_a is None and scale_b is None else (scale_a, scale_b)


def _all_to_all(x, weight, dest_rank, dest_token, gate, send_counts, recv_counts, tokens, handle, expert_counts=None,
                scale_a=None, scale_b=None):
    return ops._op_of(handle, ops.GemmAllToAll)._run(x, weight, dest_rank, dest_token, gate, send_counts,
                                                     recv_counts, tokens, True, expert_counts,
                                                     _scales(scale_a, scale_b))[0]


def _all_to_all_fake(x, weight, dest_rank, dest_token, gate, send_counts, recv_counts, tokens, handle,
                     expert_counts=None, scale_a=None, scale_b=None):
    op = ops._op_of(handle, ops.GemmAllToAll)
    check_a2a_inputs(op, x, weight, dest_rank, dest_token, gate, send_counts, recv_counts, tokens, True,
                     expert_counts)
    return x.new_empty((tokens, op.n))


def _all_to_all_rows(x, weight, dest_rank, dest_token, gate, send_counts, recv_counts, tokens, handle,
                     expert_counts=None, scale_a=None, scale_b=None):
    return ops._op_of(handle, ops.GemmAllToAll)._run(x, weight, dest_rank, dest_token, gate, send_counts,
                                                     recv_counts, tokens, False, expert_counts,
                                                     _scales(scale_a, scale_b))


def _all_to_all_rows_fake(x, weight, dest_rank, dest_token, gate, send_counts, recv_counts, tokens, handle,
                          expert_counts=None, scale_a=None, scale_b=None):
    op = ops._op_of(handle, ops.GemmAllToAll)
    check_a2a_inputs(op, x, weight, dest_rank, dest_token, gate, send_counts, recv_counts, tokens, False,
                     expert_counts)
    received = sum(recv_counts)
    return x.new_empty((received, op.n)), x.new_empty((received,), dtype=ops._tm().int32)


_RMSNORM_ARGS = "(Tensor x, Tensor weight, Tensor residual, Tensor norm_weight, float eps, int handle)"
_SCALED_ARGS = "(Tensor x, Tensor weight, Tensor? scale_a, Tensor? scale_b, int handle)"
_SCALED_RMSNORM_ARGS = ("(Tensor x, Tensor weight, Tensor residual, Tensor norm_weight, float eps, Tensor? scale_a, "
                        "Tensor? scale_b, int handle)")
_A2A_ARGS = ("(Tensor x, Tensor weight, Tensor dest_rank, Tensor dest_token, Tensor{gate} gate, SymInt[] send_counts, "
             "SymInt[] recv_counts, SymInt tokens, int handle, SymInt[]? expert_counts=None, Tensor? scale_a=None, "
             "Tensor? scale_b=None)")

# name (in the flashoverlap namespace), schema, real implementation, fake implementation
_OPS = (
    ("gemm_all_reduce", "(Tensor x, Tensor weight, int handle) -> Tensor", _all_reduce, _all_reduce_fake),
    ("gemm_all_reduce_rmsnorm", _RMSNORM_ARGS + " -> (Tensor, Tensor)", _all_reduce_rmsnorm,
     _all_reduce_rmsnorm_fake),
    ("gemm_reduce_scatter", "(Tensor x, Tensor weight, int handle) -> Tensor", _reduce_scatter, _reduce_scatter_fake),
    ("gemm_reduce_scatter_rmsnorm", _RMSNORM_ARGS + " -> (Tensor, Tensor)", _reduce_scatter_rmsnorm,
     _reduce_scatter_rmsnorm_fake),
    ("gemm_reduce_scatter_all_gather_rows", "(Tensor y, SymInt m, int handle) -> Tensor", _all_gather_rows,
     _all_gather_rows_fake),
    ("gemm_all_to_all", _A2A_ARGS.format(gate="") + " -> Tensor", _all_to_all, _all_to_all_fake),
    ("gemm_all_to_all_rows", _A2A_ARGS.format(gate="?") + " -> (Tensor, Tensor)", _all_to_all_rows,
     _all_to_all_rows_fake),
    ("gemm_all_reduce_scaled", _SCALED_ARGS + " -> Tensor", _scaled(ops.GemmAllReduce),
     _scaled_fake(ops.GemmAllReduce)),
    ("gemm_all_reduce_rmsnorm_scaled", _SCALED_RMSNORM_ARGS + " -> (Tensor, Tensor)",
     _scaled_rmsnorm(ops.GemmAllReduce), _scaled_rmsnorm_fake(ops.GemmAllReduce)),
    ("gemm_reduce_scatter_scaled", _SCALED_ARGS + " -> Tensor", _scaled(ops.GemmReduceScatter),
     _scaled_fake(ops.GemmReduceScatter)),
    ("gemm_reduce_scatter_rmsnorm_scaled", _SCALED_RMSNORM_ARGS + " -> (Tensor, Tensor)",
     _scaled_rmsnorm(ops.GemmReduceScatter), _scaled_rmsnorm_fake(ops.GemmReduceScatter)),
)


def register(torch):
    """Defines every op of _OPS in torch.library (once per process: the caller keeps that)."""
    for name, schema, real, fake in _OPS:
        torch.library.custom_op(f"flashoverlap::{name}", mutates_args=(), schema=schema)(real).register_fake(fake)
