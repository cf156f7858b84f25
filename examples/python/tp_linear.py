"""A row-parallel linear layer (Megatron-LM's RowParallelLinear) on
FlashOverlap's GEMM + AllReduce, checked and timed against what it replaces,
F.linear + dist.all_reduce.

    torchrun --nproc-per-node=2 examples/python/tp_linear.py [--m 4096] [--in-features 8192]
        [--out-features 8192] [--dtype bf16|fp16] [--iters 20]

(with the package installed, or PYTHONPATH=python and FLASHOVERLAP_LIBRARY
naming the library; run without torchrun it is one rank). Y = X A^T + b with A (out x in) split along its input
dimension over the ranks of the tensor-parallel group: rank r holds the
columns [r in/W, (r+1) in/W) of A and receives the same slice of X (the
output of a column-parallel layer before it, input_is_parallel in
Megatron's terms); Y = AllReduce(X_r A_r^T) + b. The AllReduce is what
FlashOverlap hides behind the GEMM.

Exit status 1 if the two differ by more than bf16's (fp16's) rounding
allows; 2 without PyTorch or the flashoverlap package (one line says
which); 0, saying so, without a CUDA GPU (nothing to run).
"""

import argparse
import os
import socket
import statistics
import sys

try:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
except ImportError as e:
    print(f"tp_linear: needs PyTorch with CUDA (python3 -m pip install torch): {e}", file=sys.stderr)
    sys.exit(2)
try:
    import flashoverlap.torch as fo
except ImportError as e:
    print(f"tp_linear: needs the flashoverlap package (python3 -m pip install ./python, or PYTHONPATH=python): {e}",
          file=sys.stderr)
    sys.exit(2)


class RowParallelLinear(torch.nn.Module):
    """Y = AllReduce(X_r A_r^T) + b over `group`, the AllReduce overlapped with
    the GEMM. Construction is collective over the group (it builds the op);
    forward takes this rank's slice of the input, (..., in_features / world),
    up to max_m rows."""

    def __init__(self, in_features, out_features, *, group=None, bias=True, max_m=8192, dtype=torch.bfloat16,
                 device=None):
        super().__init__()
        world = dist.get_world_size(group)
        if in_features % world:
            raise ValueError(f"in_features = {in_features} is not a multiple of the group's {world} ranks")
        self.in_per_rank = in_features // world
        device = torch.device("cuda", torch.cuda.current_device()) if device is None else device
        self.weight = torch.nn.Parameter(torch.empty(out_features, self.in_per_rank, dtype=dtype, device=device))
        self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device)) if bias else None
        self.op = fo.GemmAllReduce(group, max_m, out_features, self.in_per_rank, dtype, device=device)

    def forward(self, x):
        y = self.op(x, self.weight)
        return y if self.bias is None else y + self.bias


def reference(layer, x, group=None):
    """What the layer replaces: this rank's partial product, then one AllReduce."""
    y = F.linear(x, layer.weight)
    dist.all_reduce(y, group=group)
    return y if layer.bias is None else y + layer.bias


def time_ms(fn, iters):
    """Device time per call of fn (CUDA events around iters calls)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, default=4096, help="rows (tokens) per call")
    p.add_argument("--in-features", type=int, default=8192)
    p.add_argument("--out-features", type=int, default=8192)
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--iters", type=int, default=20, help="calls per timed run (5 runs each, in turns)")
    a = p.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]

    if not torch.cuda.is_available():
        print("tp_linear: no CUDA GPU: nothing to run")
        raise SystemExit(0)
    if "RANK" not in os.environ:  # (not under torchrun: one rank)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False

    layer = RowParallelLinear(a.in_features, a.out_features, max_m=a.m, dtype=dtype)
    g = torch.Generator(device="cuda").manual_seed(1234 + rank)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=g, device="cuda") * 0.02)
        layer.bias.copy_(torch.randn(layer.bias.shape, generator=torch.Generator(device="cuda").manual_seed(7),
                                     device="cuda") * 0.02)
    x = torch.randn(a.m, layer.in_per_rank, generator=g, device="cuda").to(dtype)

    with torch.no_grad():
        # Correct first: within the rounding of W partials and of the running sums
        # of the AllReduce, in both (2 u max|partial| (W + W (W + 1) / 2)), and of
        # the bias's addition.
        y, y_ref = layer(x), reference(layer, x)
        partial = F.linear(x.float(), layer.weight.float()).abs().max()
        dist.all_reduce(partial, op=dist.ReduceOp.MAX)
        u = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
        bound = 2 * u * (partial.item() * (world + world * (world + 1) / 2) + y_ref.abs().max().item()) + 1e-3
        diff = torch.tensor([(y.float() - y_ref.float()).abs().max().item()], device="cuda")
        dist.all_reduce(diff, op=dist.ReduceOp.MAX)
        ok = diff.item() <= bound

        for _ in range(3):  # warm-up
            layer(x), reference(layer, x)
        times = {"flashoverlap": [], "F.linear + all_reduce": []}
        for _ in range(5):  # in turns, so that clocks and neighbours treat both alike
            times["flashoverlap"].append(time_ms(lambda: layer(x), a.iters))
            times["F.linear + all_reduce"].append(time_ms(lambda: reference(layer, x), a.iters))
    med = {}
    for name, ts in times.items():
        t = torch.tensor([statistics.median(ts)], device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # (the slowest rank's time is the layer's)
        med[name] = t.item()

    if rank == 0:
        print(f"RowParallelLinear {a.m} x {a.in_features} -> {a.out_features} ({a.dtype}, world {world}, "
              f"{layer.in_per_rank} input features per rank)")
        print(f"  plan: {layer.op.plan(a.m)}")
        print(f"  max |flashoverlap - F.linear + all_reduce| = {diff.item():.4g} (bound {bound:.4g}): "
              f"{'ok' if ok else 'MISMATCH'}")
        fo_ms, ref_ms = med["flashoverlap"], med["F.linear + all_reduce"]
        gain = "n/a: one rank's AllReduce moves nothing" if world == 1 else f"{ref_ms / fo_ms:.3f}x"
        print(f"  flashoverlap {fo_ms:.3f} ms, F.linear + all_reduce {ref_ms:.3f} ms per call "
              f"(median of 5 runs of {a.iters}, slowest rank): {gain}")
    layer.op.close()
    fo.clear_cache()
    dist.barrier()
    dist.destroy_process_group()
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
