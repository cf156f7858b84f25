"""GPU tests of flashoverlap.torch: one process per GPU under torchrun, every
rank running the same tests in the same order (the ops are collective).

    tests/python/run_gpu_tests.sh          # world 1, and 2 (and N) where there are 2 (N) Hopper GPUs
    torchrun --nproc-per-node=2 -m pytest tests/python/test_gpu.py    # by hand (or the file as a script)

Without torchrun's variables it runs as one rank (world 1). Skipped without
torch >= 2.4, a CUDA GPU or a Hopper one (failed instead where
FO_REQUIRE_GPUS promises one, as the C++ GPU tests do).

What it checks, on both dtypes where it says so: the op against F.linear +
dist.all_reduce within a bf16/fp16 bound derived below; bitwise equal to the
op's own sequential path on every path (world <= 2, where NCCL's sum is
a + b); 1000 calls in a row with a random m each; the RMSNorm form against
its definition; leading batch dimensions; the functional and its cache;
torch.compile (fullgraph: the op stays one node; inductor's output bitwise
the eager op's, for several m); CUDA-graph capture and replay mixed with
eager calls, and the refusal of an unplanned m; bad input; a group of
another size; the group's own communicator (comm="adopt"); and, in fresh
processes, that torch and the library share one NCCL whichever is
imported first.

GemmReduceScatter (class ReduceScatter*): against F.linear +
dist.reduce_scatter_tensor (the standard layout) or F.linear + all_reduce
then this rank's rows (the sub-tile layout) within the same bound; rows_out
and rows against their definition (flashoverlap.torch.rs_rows); bitwise
equal to the op's own sequential path (world <= 2); calls in a row with a
random m (a multiple of the world) each; the RMSNorm form against its
definition; leading batch dimensions; the functional and its cache;
torch.compile (fullgraph, one node; inductor's output bitwise the eager
op's); CUDA-graph capture and replay mixed with eager calls; bad input.

GemmReduceScatter.all_gather_rows (class ReduceScatterAllGather*), both
layouts: all_gather_rows(rs(x, w)) against F.linear + all_reduce within the
same bound, each rank's rows of it bitwise its own output and the whole the
same on every rank; the chain rs(x, w, residual=..., norm_weight=...) ->
all_gather_rows (out and h) bitwise the standard layout's sequential chain
(world <= 2), the residual given to each op being the full residual's rows
op.rows(m); m = 0; torch.compile (fullgraph: the chain two nodes; inductor's
output bitwise the eager chain's, m dynamic); opcheck; CUDA-graph capture
and replay of the chain, and the sub-tile layout's refusal of an m not yet
gathered; bad input.

GemmAllToAll (class AllToAll*), the MoE combine, on a random routing that
every rank draws alike (each token picks up to topk distinct ranks, each
expert's rows shuffled or in token order; at world 1 topk is 1, every row
back to rank 0, some tokens without a row): combine=True against the fp32
reference (out[t] = sum of gate * row) within a bound of the dtype's
rounding, and against its own received rows (bitwise at world 1, where
each token has one row: out[t] = the row times its gate, rounded once);
combine=False: the received rows in (source rank, source row) order against
the fp32 GEMM (and, at world 1, against F.linear) within the GEMM's bound,
their tokens exactly; rows of no rank; the routing tensors on the GPU or
the host, the counts as lists or tensors; both paths; the functional and
its cache; opcheck; the refusal under CUDA-graph capture; bad input (counts
that disagree with dest_rank or between ranks: refused on every rank). The
data are random; the seed is printed (FO_TEST_SEED=<seed> replays it).

GemmAllToAll with several experts per rank (class AllToAllExperts), at
world 1: 2 and 3 experts, a 3-D weight, random rows per expert (some
experts without any), x's rows expert after expert: combine=True against
the fp32 reference (row i times its expert's weight, then out[t] = the sum
of gate * row over token t's rows) and against its own received rows;
combine=False against the fp32 grouped GEMM, the tokens exactly; the
routing on the GPU or the host, on each path; expert_counts as a list,
nested lists or tensors on either device, alike; one expert with a 2-D or
(1, n, k) weight, alike; the functional with a 3-D weight and its cache;
opcheck with expert_counts; bad input (the weight's shape, expert_counts
missing, short, negative or not adding up, the NVLink path refused).
"""

import datetime
import itertools
import os
import random
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if not os.environ.get("FO_TEST_INSTALLED"):
    sys.path.insert(0, os.path.join(REPO, "python"))

import flashoverlap  # noqa: E402
from flashoverlap import FlashOverlapError, InvalidArgument  # noqa: E402

torch = dist = F = fo = None
RANK, WORLD, DEVICE, SEED = 0, 1, None, 0
# The unit roundoff of each dtype (p bits of significand: 2^-p).
U = {}


def _unusable():
    """Why this process cannot run the tests (None: it can), and whether a GPU is what is missing."""
    global torch, dist, F, fo
    try:
        import torch as t
    except ImportError as e:
        return f"torch is not installed ({e})", False
    import flashoverlap.torch as fot
    if fot.torch_version(t) < fot.MIN_TORCH:
        return f"torch {t.__version__} is older than 2.4", False
    if not t.cuda.is_available():
        return "torch sees no CUDA GPU", True
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if local >= t.cuda.device_count():
        return f"LOCAL_RANK {local} but {t.cuda.device_count()} GPUs", True
    if t.cuda.get_device_capability(local) != (9, 0):
        return f"GPU {local} ({t.cuda.get_device_name(local)}) is not a Hopper (sm_90)", True
    import torch.distributed as d
    import torch.nn.functional as f
    torch, dist, F, fo = t, d, f, fot
    return None, False


def setUpModule():
    global RANK, WORLD, DEVICE, SEED
    why, gpu_missing = _unusable()
    if why:
        need = int(os.environ.get("FO_REQUIRE_GPUS", "0") or 0)
        if gpu_missing and need >= int(os.environ.get("WORLD_SIZE", "1")):
            raise AssertionError(f"{why}, but FO_REQUIRE_GPUS={need} promises the GPUs")
        raise unittest.SkipTest(why)
    if "RANK" not in os.environ:  # (one rank without torchrun)
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(29500 + os.getpid() % 1000))
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    DEVICE = torch.device("cuda", local)
    if not dist.is_initialized():
        dist.init_process_group("nccl", timeout=datetime.timedelta(minutes=5))
    RANK, WORLD = dist.get_rank(), dist.get_world_size()
    seed = [int(os.environ["FO_TEST_SEED"]) if os.environ.get("FO_TEST_SEED") else random.randrange(1 << 30)]
    dist.broadcast_object_list(seed, src=0)
    SEED = seed[0]
    U.update({torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11})
    # The reference GEMM with one rounding, as ours (no reduced-precision split-K sums in cuBLAS).
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    if RANK == 0:
        print(f"\n[test_gpu] world {WORLD}, torch {torch.__version__}, NCCL {flashoverlap.nccl_version()} "
              f"({flashoverlap.load().nccl_file()}), FO_TEST_SEED={SEED}", flush=True)


def tearDownModule():
    if dist is not None and dist.is_initialized():
        fo.clear_cache()
        import gc
        gc.collect()
        torch.cuda.synchronize()
        dist.barrier()
        dist.destroy_process_group()


# ---- helpers: data, references, bounds, agreement over ranks ----

def rand(*shape, dtype, seed, per_rank=True):
    """Uniform in [-1, 1), from a seed (each rank its own unless per_rank is False)."""
    g = torch.Generator(device=DEVICE)
    g.manual_seed(SEED * 7 + seed * 1009 + (RANK * 7919 if per_rank else 0))
    return (torch.rand(*shape, generator=g, device=DEVICE) * 2 - 1).to(dtype)


def reference(x, w):
    """What the op replaces: F.linear, then dist.all_reduce."""
    y = F.linear(x, w)
    dist.all_reduce(y)
    return y


def gemm_bound(x, w, dtype):
    """|op - reference| bound, per element: each of the two rounds each rank's
    partial p once (W u max|p| in all) and each running sum of the AllReduce
    once (the j-th <= j max|p|: u max|p| (2 + ... + W)), so each is within
    u max|p| (W + W (W + 1) / 2) of the exact sum and the two within twice
    that (the fp32 accumulation's order is far below it)."""
    p = F.linear(x.float(), w.float()).abs().max()
    dist.all_reduce(p, op=dist.ReduceOp.MAX)
    return 2 * U[dtype] * p.item() * (WORLD + WORLD * (WORLD + 1) / 2) + 1e-6


def all_ok(ok):
    """ok on every rank (one small all_reduce), so that every rank passes or fails together."""
    t = torch.tensor([1 if ok else 0], device=DEVICE, dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def within(out, ref, atol):
    """(every |out - ref| <= atol, the largest difference)."""
    d = (out.float() - ref.float()).abs()
    worst = d.max().item() if d.numel() else 0.0
    return worst <= atol, worst


def rs_reference(x, w, rows=None):
    """What GemmReduceScatter replaces: F.linear, then dist.reduce_scatter_tensor
    (rows None: the standard layout), or, for the sub-tile layout, all_reduce
    and this rank's rows."""
    y = F.linear(x, w)
    if rows is None:
        out = torch.empty((y.shape[0] // WORLD, y.shape[1]), dtype=y.dtype, device=DEVICE)
        dist.reduce_scatter_tensor(out, y)
        return out
    dist.all_reduce(y)
    return y[torch.tensor(rows, dtype=torch.long, device=DEVICE)]


def multiples_of_world(*ms):
    """Each m rounded down to a multiple of the world size (at least the world size), sorted, once each."""
    return sorted({max(WORLD, m - m % WORLD) for m in ms})


def subtile_ok():
    """Whether the sub-tile layout serves this world (it needs the world size to divide 128)."""
    return 128 % WORLD == 0


class Case(unittest.TestCase):
    def ok(self, ok, message):
        self.assertTrue(all_ok(ok), f"{message} (rank {RANK}: {'ok' if ok else 'FAILED'}; FO_TEST_SEED={SEED})")

    @staticmethod
    def make(max_m=512, n=768, k=1024, dtype=None, **kw):
        return fo.GemmAllReduce(None, max_m, n, k, dtype or torch.bfloat16, **kw)

    @staticmethod
    def make_rs(max_m=512, n=768, k=1024, dtype=None, **kw):
        return fo.GemmReduceScatter(None, max_m, n, k, dtype or torch.bfloat16, **kw)


class Correctness(Case):
    def test_against_linear_all_reduce_both_dtypes(self):
        for dtype in (torch.bfloat16, torch.float16):
            op = self.make(dtype=dtype)
            w = rand(768, 1024, dtype=dtype, seed=1)
            for m in (1, 7, 128, 300, 512):
                x = rand(m, 1024, dtype=dtype, seed=m)
                y = op(x, w)
                self.assertEqual((y.shape, y.dtype, y.device), ((m, 768), dtype, DEVICE))
                good, worst = within(y, reference(x, w), gemm_bound(x, w, dtype))
                self.ok(good, f"{op} m={m}: |op - F.linear + all_reduce| up to {worst}")

    def test_bitwise_equal_to_the_sequential_path(self):
        if WORLD > 2:
            self.skipTest("bitwise only where NCCL's sum is a + b (world <= 2)")
        shape = dict(max_m=2048, n=2048, k=2048)
        seq = self.make(path="sequential", **shape)
        w = rand(2048, 2048, dtype=torch.bfloat16, seed=2)
        for path in ("auto", "row_bands", "slots") + (("nvlink",) if WORLD == 2 else ()):
            op = self.make(path=path, **shape)
            for m in (1, 200, 1000, 2048):
                x = rand(m, 2048, dtype=torch.bfloat16, seed=m + 3)
                same = torch.equal(op(x, w), seq(x, w))
                if RANK == 0 and m == 2048:
                    print(f"[test_gpu] {path}, m={m}: {op.plan(m)}", flush=True)
                self.ok(same, f"path {path}, m={m}: not bitwise the sequential path's")

    def test_outputs_kept_across_calls_are_each_their_own(self):
        # A small output is allocated ahead, after the call before: every
        # call's output must still be a tensor of its own, holding its own
        # result while later calls run, on another stream or at another m too.
        for make, ref, rows_of in ((self.make, reference, lambda m: m),
                                   (self.make_rs, rs_reference, lambda m: m // WORLD)):
            op = make(max_m=256, n=512, k=256)
            w = rand(512, 256, dtype=torch.bfloat16, seed=7)
            side = torch.cuda.Stream()
            kept = []
            for i, (m, on_side) in enumerate([(64, False)] * 4 + [(64, True), (64, False), (128, False), (64, False)]):
                m = max(WORLD, m - m % WORLD)
                x = rand(m, 256, dtype=torch.bfloat16, seed=500 + i)
                if on_side:
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        y = op(x, w)
                    torch.cuda.current_stream().wait_stream(side)
                else:
                    y = op(x, w)
                self.assertEqual(tuple(y.shape), (rows_of(m), 512))
                kept.append((x, y))
            ptrs = [y.data_ptr() for _, y in kept]
            self.assertEqual(len(set(ptrs)), len(ptrs), f"{op}: outputs share memory")
            for i, (x, y) in enumerate(kept):
                good, worst = within(y, ref(x, w), gemm_bound(x, w, torch.bfloat16))
                self.ok(good, f"{op}: call {i}'s output, read after the later calls: |diff| up to {worst}")
            op.close()

    def test_1000_calls_in_a_row_with_random_m(self):
        op = self.make(max_m=1024, n=1024, k=512)
        w = rand(1024, 512, dtype=torch.bfloat16, seed=4)
        rng = random.Random(SEED)  # (the same m's on every rank)
        worst_excess = torch.full((), -1.0, device=DEVICE)
        for i in range(1000):
            m = rng.randint(1, 1024)
            x = rand(m, 512, dtype=torch.bfloat16, seed=100 + i)
            atol = gemm_bound(x, w, torch.bfloat16)
            d = ((op(x, w).float() - reference(x, w).float()).abs().max() - atol) / atol
            worst_excess = torch.maximum(worst_excess, d)
        op.check()
        excess = worst_excess.item()
        self.ok(excess <= 0, f"1000 calls: the worst difference is {1 + excess:.3g} x the bound")

    def test_rmsnorm_form_both_dtypes(self):
        eps = 1e-6
        for dtype in (torch.bfloat16, torch.float16):
            op = self.make(dtype=dtype)
            w = rand(768, 1024, dtype=dtype, seed=5)
            g = rand(768, dtype=dtype, seed=6, per_rank=False)
            for m in (1, 64, 333, 512):
                x = rand(m, 1024, dtype=dtype, seed=m + 7)
                r = rand(m, 768, dtype=dtype, seed=m + 8, per_rank=False)
                out, h = op(x, w, residual=r, norm_weight=g, eps=eps)
                y = reference(x, w)
                h_ref = (y.float() + r.float()).to(dtype)
                hf = h_ref.float()
                rms = torch.sqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
                out_ref = (hf / rms * g.float()).to(dtype)
                atol_h = gemm_bound(x, w, dtype) + 2 * U[dtype] * hf.abs().max().item()
                good_h, worst_h = within(h, h_ref, atol_h)
                self.ok(good_h, f"{op} m={m}: residual_out differs from AllReduce + residual by up to {worst_h}")
                # the norm of the op's own h: fp32 arithmetic, then one rounding
                ho = h.float()
                norm = ho * torch.rsqrt(ho.pow(2).mean(-1, keepdim=True) + eps) * g.float()
                bound = 2 * U[dtype] * norm.abs() + 1e-5
                good_o = bool(((out.float() - norm).abs() <= bound).all())
                self.ok(good_o, f"{op} m={m}: out is not RMSNorm(residual_out) * norm_weight, rounded")
                # and against the definition from the reference's h: an error e
                # in h moves out by ~e / rms * |g|, and rms by at most e
                loose = 4 * atol_h / rms * g.float().abs().max() + 2 * U[dtype] * out_ref.float().abs() + 1e-5
                self.ok(bool(((out.float() - out_ref.float()).abs() <= loose).all()), f"{op} m={m}: RMSNorm output")

    def test_leading_batch_dimensions(self):
        op = self.make()
        w = rand(768, 1024, dtype=torch.bfloat16, seed=9)
        x = rand(2, 3, 1024, dtype=torch.bfloat16, seed=10)
        y = op(x, w)
        self.assertEqual(tuple(y.shape), (2, 3, 768))
        self.ok(torch.equal(y, op(x.view(6, 1024), w).view(2, 3, 768)), "(2, 3, k) is not the (6, k) result")

    def test_empty_batch(self):
        op = self.make()
        y = op(torch.empty(0, 1024, dtype=torch.bfloat16, device=DEVICE), rand(768, 1024, dtype=torch.bfloat16, seed=0))
        self.assertEqual(tuple(y.shape), (0, 768))

    def test_functional_builds_and_caches(self):
        fo.clear_cache()
        w = rand(256, 512, dtype=torch.float16, seed=11)
        for m, max_m in ((100, 128), (120, 128), (300, 512), (5, 512)):
            x = rand(m, 512, dtype=torch.float16, seed=m + 12)
            y = fo.gemm_all_reduce(x, w)
            good, worst = within(y, reference(x, w), gemm_bound(x, w, torch.float16))
            self.ok(good, f"gemm_all_reduce m={m}: |diff| up to {worst}")
            self.assertEqual([op.max_m for op in fo._cache.values()], [max_m])
        x, r, g = (rand(5, 512, dtype=torch.float16, seed=13), rand(5, 256, dtype=torch.float16, seed=14, per_rank=False),
                   rand(256, dtype=torch.float16, seed=15, per_rank=False))
        out, h = fo.gemm_all_reduce(x, w, residual=r, norm_weight=g)
        self.assertEqual((tuple(out.shape), tuple(h.shape)), ((5, 256), (5, 256)))
        fo.clear_cache()


class Fp8(Case):
    """FP8 inputs (input="e4m3"): small integers in e4m3 and power-of-two scales, so that each rank's product is
    exact before its one rounding; the output torch._scaled_mm's (use_fast_accum=False) + dist.all_reduce,
    bitwise where NCCL's sum is a + b (world <= 2), within one unit of the last place per rank beyond."""

    def test_against_scaled_mm_and_all_reduce_every_scale_kind(self):
        if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
            self.skipTest("this torch has no float8_e4m3fn or _scaled_mm")
        n, k = 768, 1024
        gen = torch.Generator().manual_seed(SEED + 7 + RANK)
        small = lambda *shape: (torch.randint(-3, 4, shape, generator=gen).float()).to(DEVICE)  # noqa: E731
        pow2 = lambda *shape: (2.0 ** torch.randint(-2, 3, shape, generator=gen).float()).to(DEVICE)  # noqa: E731
        w = small(n, k).to(torch.float8_e4m3fn)
        for scales in ("none", "tensor", "row"):
            for path in ("sequential", "auto", "row_bands", "slots"):
                op = self.make(max_m=512, n=n, k=k, input="e4m3", scales=scales, path=path)
                for m in (1, 77, 512):
                    x = small(m, k).to(torch.float8_e4m3fn)
                    sa = pow2(m if scales == "row" else 1)
                    sb = pow2(n if scales == "row" else 1)
                    kw = {} if scales == "none" else dict(scale_a=sa, scale_b=sb)
                    y = op(x, w, **kw)
                    one = torch.ones(1, device=DEVICE)
                    ref = torch._scaled_mm(x, w.t(), scale_a=sa.view(-1, 1) if scales == "row" else
                                           (sa if scales != "none" else one),
                                           scale_b=sb.view(1, -1) if scales == "row" else (sb if scales != "none" else one),
                                           out_dtype=torch.bfloat16, use_fast_accum=False)
                    dist.all_reduce(ref)
                    if WORLD <= 2:
                        good = torch.equal(y, ref)
                    else:
                        good, _ = within(y, ref, float(ref.abs().max()) * 2 ** -7 * WORLD + 1e-6)
                    self.ok(good, f"{op} scales={scales} path={path} m={m}: not torch._scaled_mm + all_reduce")
                with self.assertRaises(fo.InvalidArgument):  # (a 16-bit x, or scales of the wrong kind)
                    op(small(4, k).to(torch.bfloat16), w, **kw)
                if scales != "none":
                    with self.assertRaises(fo.InvalidArgument):
                        op(small(4, k).to(torch.float8_e4m3fn), w)
                op.close()

    def row_scaled_inputs(self, seed, m, n, k):
        """x (m, k) and w (n, k) of small integers in e4m3, row-wise scales in 1..4, and the generator's small()."""
        if not hasattr(torch, "float8_e4m3fn"):
            self.skipTest("this torch has no float8_e4m3fn")
        gen = torch.Generator().manual_seed(SEED + seed + RANK)
        small = lambda *shape: torch.randint(-3, 4, shape, generator=gen).float().to(DEVICE)  # noqa: E731
        w = small(n, k).to(torch.float8_e4m3fn)
        x = small(m, k).to(torch.float8_e4m3fn)
        return x, w, small(m).abs() + 1, small(n).abs() + 1, small

    def test_captured_into_a_cuda_graph_after_prepare(self):
        """An FP8 call captured after op.prepare(m) replays as the eager call computes (its scales' pointers
        captured with it, as x's and w's are)."""
        n, k, m = 768, 1024, 96
        x, w, sa, sb, _ = self.row_scaled_inputs(13, m, n, k)
        for make in (self.make, self.make_rs):
            op = make(max_m=512, n=n, k=k, input="e4m3", scales="row")
            want = op(x, w, scale_a=sa, scale_b=sb)
            op.prepare(m)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                got = op(x, w, scale_a=sa, scale_b=sb)
            for _ in range(2):
                got.zero_()
                g.replay()
                torch.cuda.synchronize()
                self.ok(torch.equal(got, want), f"{op}: the replayed FP8 call differs from the eager one")
            del g
            op.close()

    def test_torch_compile_calls_the_fp8_custom_ops(self):
        """Under torch.compile an FP8 call is the custom op flashoverlap::<op>_scaled (and _rmsnorm_scaled):
        the compiled function computes what the eager call does."""
        n, k, m = 768, 1024, 64
        x, w, sa, sb, small = self.row_scaled_inputs(17, m, n, k)
        for make in (self.make, self.make_rs):
            op = make(max_m=512, n=n, k=k, input="e4m3", scales="row")
            want = op(x, w, scale_a=sa, scale_b=sb)
            f = torch.compile(lambda x, w, sa, sb: op(x, w, scale_a=sa, scale_b=sb) * 2, fullgraph=True)
            self.ok(torch.equal(f(x, w, sa, sb), want * 2), f"{op}: the compiled FP8 call differs from the eager one")
            rows = want.shape[0]
            r = small(rows, n).to(torch.bfloat16)
            g = small(n).to(torch.bfloat16)
            y, h = op(x, w, residual=r, norm_weight=g, scale_a=sa, scale_b=sb)
            fn = torch.compile(lambda x, w, r, g, sa, sb: op(x, w, residual=r, norm_weight=g, scale_a=sa, scale_b=sb),
                               fullgraph=True)
            y2, h2 = fn(x, w, r, g, sa, sb)
            self.ok(torch.equal(y, y2) and torch.equal(h, h2), f"{op}: the compiled FP8 RMSNorm form differs")
            op.close()

    def test_reduce_scatter_against_scaled_mm_and_reduce_scatter_tensor(self):
        if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
            self.skipTest("this torch has no float8_e4m3fn or _scaled_mm")
        n, k = 768, 1024
        gen = torch.Generator().manual_seed(SEED + 11 + RANK)
        small = lambda *shape: torch.randint(-3, 4, shape, generator=gen).float().to(DEVICE)  # noqa: E731
        w = small(n, k).to(torch.float8_e4m3fn)
        sb = (2.0 ** torch.randint(-2, 3, (n,), generator=gen).float()).to(DEVICE)
        for path in ("sequential", "auto", "slots"):
            op = self.make_rs(max_m=512, n=n, k=k, input="e4m3", scales="row", path=path)
            for m in sorted({WORLD, 96 * WORLD, 512 - 512 % WORLD}):
                x = small(m, k).to(torch.float8_e4m3fn)
                sa = (2.0 ** torch.randint(-2, 3, (m,), generator=gen).float()).to(DEVICE)
                y = op(x, w, scale_a=sa, scale_b=sb)
                full = torch._scaled_mm(x, w.t(), scale_a=sa.view(-1, 1), scale_b=sb.view(1, -1),
                                        out_dtype=torch.bfloat16, use_fast_accum=False)
                ref = torch.empty(m // WORLD, n, dtype=torch.bfloat16, device=DEVICE)
                dist.reduce_scatter_tensor(ref, full)
                if WORLD <= 2:
                    good = torch.equal(y, ref)
                else:
                    good, _ = within(y, ref, float(ref.abs().max()) * 2 ** -7 * WORLD + 1e-6)
                self.ok(good, f"{op} path={path} m={m}: not torch._scaled_mm + reduce_scatter_tensor")
            op.close()


class Compile(Case):
    def test_torch_compile_keeps_the_op_whole(self):
        torch._dynamo.reset()
        op = self.make(max_m=256, n=512, k=256)
        w = rand(512, 256, dtype=torch.bfloat16, seed=20)

        class Layer(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.op = op
                self.register_buffer("weight", w)

            def forward(self, x):
                return self.op(x, self.weight) * 2

        layer = Layer()
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        x = rand(64, 256, dtype=torch.bfloat16, seed=21)
        out = torch.compile(layer, backend=backend, fullgraph=True)(x)
        calls = [str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
        self.assertEqual(sum("flashoverlap" in c for c in calls), 1, calls)
        self.ok(torch.equal(out, op(x, w) * 2), "the traced graph's output is not the eager op's")

        torch._dynamo.reset()
        compiled = torch.compile(layer, fullgraph=True)  # inductor
        for m in (64, 96, 160, 256):  # (a second m recompiles with m dynamic: the fake impl's symbolic m)
            x = rand(m, 256, dtype=torch.bfloat16, seed=22 + m)
            self.ok(torch.equal(compiled(x), op(x, w) * 2), f"inductor m={m}: not the eager op's output")

    def test_torch_compile_rmsnorm_form(self):
        torch._dynamo.reset()
        op = self.make(max_m=256, n=512, k=256)
        w = rand(512, 256, dtype=torch.bfloat16, seed=23)
        g = rand(512, dtype=torch.bfloat16, seed=24, per_rank=False)

        def block(x, r):
            return op(x, w, residual=r, norm_weight=g, eps=1e-5)

        compiled = torch.compile(block, fullgraph=True)
        for m in (32, 200):
            x = rand(m, 256, dtype=torch.bfloat16, seed=25 + m)
            r = rand(m, 512, dtype=torch.bfloat16, seed=26 + m, per_rank=False)
            (a, b), (c, d) = compiled(x, r), block(x, r)
            self.ok(torch.equal(a, c) and torch.equal(b, d), f"compiled RMSNorm form m={m}: not the eager op's")

    def test_opcheck(self):
        op = self.make(max_m=128, n=256, k=128)
        x, w = rand(40, 128, dtype=torch.bfloat16, seed=27), rand(256, 128, dtype=torch.bfloat16, seed=28)
        torch.library.opcheck(torch.ops.flashoverlap.gemm_all_reduce.default, (x, w, op.handle),
                              test_utils=("test_schema", "test_faketensor"))


class CudaGraphs(Case):
    def test_capture_and_replay_mixed_with_eager_calls(self):
        op = self.make(max_m=512, n=512, k=512)
        w = rand(512, 512, dtype=torch.bfloat16, seed=30)
        x, x2 = rand(100, 512, dtype=torch.bfloat16, seed=31), rand(200, 512, dtype=torch.bfloat16, seed=32)
        r, g = rand(100, 512, dtype=torch.bfloat16, seed=33, per_rank=False), rand(512, dtype=torch.bfloat16, seed=34)
        op(x, w)        # m = 100 planned by an eager call (both forms),
        op(x, w, residual=r, norm_weight=g)
        op.prepare(200)  # m = 200 by prepare
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # (warm-up on a side stream, as torch's CUDA-graph docs advise)
            op(x, w)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y, y2 = op(x, w), op(x2, w)
            out, h = op(x, w, residual=r, norm_weight=g)
        for i in range(4):
            x.copy_(rand(100, 512, dtype=torch.bfloat16, seed=40 + i))
            x2.copy_(rand(200, 512, dtype=torch.bfloat16, seed=50 + i))
            graph.replay()
            e, e2 = op(x, w), op(x2, w)
            eo, eh = op(x, w, residual=r, norm_weight=g)
            same = torch.equal(y, e) and torch.equal(y2, e2) and torch.equal(out, eo) and torch.equal(h, eh)
            self.ok(same, f"replay {i}: not the eager calls' outputs")
        torch.cuda.synchronize()
        op.check()

    def test_an_unplanned_m_is_refused_under_capture(self):
        op = self.make(max_m=512, n=512, k=512)
        w, x = rand(512, 512, dtype=torch.bfloat16, seed=35), rand(300, 512, dtype=torch.bfloat16, seed=36)
        graph = torch.cuda.CUDAGraph()
        with self.assertRaisesRegex(FlashOverlapError, r"m = 300 has no plan yet.*op\.prepare\(300\)"):
            with torch.cuda.graph(graph):
                op(x, w)
        self.ok(torch.equal(op(x, w), op(x, w)), "the op after a refused capture")


class BadInput(Case):
    def test_messages(self):
        op = self.make(max_m=64, n=32, k=16)
        name = str(op)
        w, x = rand(32, 16, dtype=torch.bfloat16, seed=0), rand(8, 16, dtype=torch.bfloat16, seed=0)
        cases = [
            ((x.float(), w), "x has dtype torch.float32, expected torch.bfloat16"),
            ((x.cpu(), w), f"x is on cpu, expected {DEVICE}"),
            ((rand(16, 8, dtype=torch.bfloat16, seed=0).t(), w), "x is not contiguous"),
            ((x, rand(32, 8, dtype=torch.bfloat16, seed=0)), "weight has shape (32, 8), expected (32, 16)"),
            ((rand(65, 16, dtype=torch.bfloat16, seed=0), w), "x has m = 65 rows, more than the op's max_m = 64"),
            ((rand(8, 8, dtype=torch.bfloat16, seed=0), w), "x has shape (8, 8), expected (m, 16)"),
        ]
        for args, message in cases:
            with self.assertRaises(InvalidArgument) as cm:
                op(*args)
            self.assertTrue(str(cm.exception).startswith(f"{name}: {message}"), str(cm.exception))
        with self.assertRaisesRegex(InvalidArgument, "residual has shape"):
            op(x, w, residual=rand(9, 32, dtype=torch.bfloat16, seed=0), norm_weight=rand(32, dtype=torch.bfloat16, seed=0))
        for m in (0, 65):
            with self.assertRaisesRegex(InvalidArgument, rf"m = {m}: needs 1 <= m <= max_m = 64"):
                op.prepare(m)
        with self.assertRaisesRegex(InvalidArgument, "dtype torch.float32 is not supported"):
            fo.GemmAllReduce(None, 64, 32, 16, torch.float32)
        with self.assertRaisesRegex(InvalidArgument, "k = 12: needs"):
            fo.GemmAllReduce(None, 64, 32, 12, torch.bfloat16)
        op.close()
        with self.assertRaisesRegex(FlashOverlapError, "no op with handle"):
            op(x, w)

    def test_a_group_of_another_size(self):
        if WORLD < 2:
            self.skipTest("needs 2 ranks")
        sub = dist.new_group([0])  # (collective over the world, as new_group is)
        world_comm = fo._communicator(torch, dist.group.WORLD, RANK, WORLD, DEVICE, "bootstrap")
        if RANK == 0:
            with self.assertRaisesRegex(InvalidArgument, rf"the group has 1 ranks \(this one is rank 0\), its communicator {WORLD}"):
                fo.GemmAllReduce(sub, 64, 32, 16, torch.bfloat16, comm=world_comm)
            op = fo.GemmAllReduce(sub, 64, 32, 16, torch.bfloat16)  # (world 1: the GEMM alone)
            x, w = rand(8, 16, dtype=torch.bfloat16, seed=60), rand(32, 16, dtype=torch.bfloat16, seed=61)
            good, worst = within(op(x, w), F.linear(x, w), 4 * U[torch.bfloat16] * 16)
            self.assertTrue(good, f"a group of one: |diff| up to {worst}")
            op.close()
        else:
            with self.assertRaisesRegex(InvalidArgument, "is not a member of the group"):
                fo.GemmAllReduce(sub, 64, 32, 16, torch.bfloat16)
        dist.barrier()


class Communicators(Case):
    def test_adopting_the_groups_communicator(self):
        try:
            adopted = self.make(max_m=256, n=256, k=256, comm="adopt")
        except FlashOverlapError as e:
            self.skipTest(f"comm='adopt' refused here: {e}")
        own = self.make(max_m=256, n=256, k=256)
        w = rand(256, 256, dtype=torch.bfloat16, seed=70)
        for m in (1, 100, 256):
            x = rand(m, 256, dtype=torch.bfloat16, seed=71 + m)
            if WORLD <= 2:
                self.ok(torch.equal(adopted(x, w), own(x, w)), f"adopted m={m}: not the bootstrapped op's output")
            else:
                good, worst = within(adopted(x, w), reference(x, w), gemm_bound(x, w, torch.bfloat16))
                self.ok(good, f"adopted m={m}: |diff| up to {worst}")

    def test_torch_and_flashoverlap_share_one_nccl_in_either_import_order(self):
        if RANK == 0:  # (fresh processes, no collective)
            check = (
                "import os, torch, flashoverlap, flashoverlap.torch\n"
                "from flashoverlap import _capi\n"
                "lib = flashoverlap.load()\n"
                "tc = os.path.join(os.path.dirname(torch.__file__), 'lib', 'libtorch_cuda.so')\n"
                "print(lib.shares_nccl_with(tc), len(_capi.mapped_nccl_files()), lib.nccl_version(), torch.cuda.nccl.version())\n")
            env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(flashoverlap.__file__)))
            for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
                env.pop(name, None)
            for first in ("import torch\n", "import flashoverlap\nimport torch\n"):
                r = subprocess.run([sys.executable, "-c", first + check], env=env, capture_output=True, text=True,
                                   timeout=300)
                self.assertEqual(r.returncode, 0, r.stderr)
                print(f"[test_gpu] {first.strip()!r} first: {r.stdout.strip()}", flush=True)
                self.assertTrue(r.stdout.startswith("(True, '') 1 "), r.stdout)
        dist.barrier()


class ReduceScatter(Case):
    def test_against_linear_reduce_scatter_both_dtypes(self):
        for dtype in (torch.bfloat16, torch.float16):
            op = self.make_rs(dtype=dtype)
            w = rand(768, 1024, dtype=dtype, seed=101)
            for m in multiples_of_world(1, 8 * WORLD, 128, 300, 512):
                x = rand(m, 1024, dtype=dtype, seed=m + 102)
                y = op(x, w)
                self.assertEqual((y.shape, y.dtype, y.device), ((m // WORLD, 768), dtype, DEVICE))
                good, worst = within(y, rs_reference(x, w), gemm_bound(x, w, dtype))
                self.ok(good, f"{op} m={m}: |op - F.linear + reduce_scatter_tensor| up to {worst}")
            if RANK == 0:
                print(f"[test_gpu] {op}: plan(512) = {op.plan(512 - 512 % WORLD)}", flush=True)

    def test_subtile_layout_against_its_rows(self):
        if not subtile_ok():
            self.skipTest(f"the sub-tile layout needs the world size to divide 128, not {WORLD}")
        op = self.make_rs(layout="subtile")
        w = rand(768, 1024, dtype=torch.bfloat16, seed=103)
        for m in (1, 7, 64, 130, 300, 512):  # (any m)
            rows = op.rows(m)
            # (checks that may differ between ranks: agreed on before the next collective)
            self.ok(rows == fo.rs_rows(m, WORLD, RANK, "subtile"), f"{op} m={m}: rows(m) = {rows[:8]}...")
            x = rand(m, 1024, dtype=torch.bfloat16, seed=m + 104)
            y = op(x, w)
            self.ok(tuple(y.shape) == (len(rows), 768), f"{op} m={m}: output shape {tuple(y.shape)}")
            good, worst = within(y, rs_reference(x, w, rows), gemm_bound(x, w, torch.bfloat16))
            self.ok(good, f"{op} m={m}: |op - (F.linear + all_reduce)[rows]| up to {worst}")
        if RANK == 0:
            print(f"[test_gpu] {op}: plan(300) = {op.plan(300)}", flush=True)

    def test_rows_out_and_rows(self):
        ops = [self.make_rs(max_m=1024, n=256, k=256)]
        if subtile_ok():
            ops.append(self.make_rs(max_m=1024, n=256, k=256, layout="subtile"))
        for op in ops:
            step = WORLD if op.layout == "standard" else 1
            bad = []
            for m in range(step, 1025, step):
                want = fo.rs_rows(m, WORLD, RANK, op.layout)
                if op.rows_out(m) != len(want) or op.rows_out(m) != fo.rs_rows_out(m, WORLD, RANK, op.layout):
                    bad.append(f"m={m}: rows_out {op.rows_out(m)}, want {len(want)}")
                if (m % 97 == 0 or m < 300) and op.rows(m) != want:
                    bad.append(f"m={m}: rows {op.rows(m)[:8]}..., want {want[:8]}...")
            self.ok(not bad, f"{op}: {len(bad)} m's with other rows than flashoverlap.torch.rs_rows's: {bad[:3]}")
        # every row of the sum once over the ranks
        for op in ops:
            m = 1000 - 1000 % WORLD
            gathered = [None] * WORLD
            dist.all_gather_object(gathered, op.rows(m))
            self.assertEqual(sorted(r for rows in gathered for r in rows), list(range(m)), f"{op}")

    def test_bitwise_equal_to_the_sequential_path(self):
        if WORLD > 2:
            self.skipTest("bitwise only where NCCL's sum is a + b (world <= 2)")
        shape = dict(max_m=2048, n=2048, k=2048)
        w = rand(2048, 2048, dtype=torch.bfloat16, seed=105)
        for layout in ("standard", "subtile"):
            seq = self.make_rs(path="sequential", layout=layout, **shape)
            for path in ("slots", "auto") + (("nvlink",) if layout == "standard" else ()):
                op = self.make_rs(path=path, layout=layout, **shape)
                for m in multiples_of_world(2, 200, 1000, 2048) + ([] if layout == "standard" else [1, 333]):
                    x = rand(m, 2048, dtype=torch.bfloat16, seed=m + 106)
                    same = torch.equal(op(x, w), seq(x, w))
                    if RANK == 0 and m == 2048:
                        print(f"[test_gpu] reducescatter {layout} {path}, m={m}: {op.plan(m)}", flush=True)
                    self.ok(same, f"reducescatter {layout} path {path}, m={m}: not bitwise the sequential path's")
                op.close()
            seq.close()

    def test_calls_in_a_row_with_random_m(self):
        op = self.make_rs(max_m=1024, n=1024, k=512)
        w = rand(1024, 512, dtype=torch.bfloat16, seed=107)
        rng = random.Random(SEED + 1)  # (the same m's on every rank)
        worst_excess = torch.full((), -1.0, device=DEVICE)
        bad_shapes = []
        for i in range(500):
            m = WORLD * rng.randint(1, 1024 // WORLD)
            x = rand(m, 512, dtype=torch.bfloat16, seed=200 + i)
            atol = gemm_bound(x, w, torch.bfloat16)
            y = op(x, w)
            if y.shape != (m // WORLD, 1024):
                bad_shapes.append((i, m, tuple(y.shape)))
                continue
            d = ((y.float() - rs_reference(x, w).float()).abs().max() - atol) / atol
            worst_excess = torch.maximum(worst_excess, d)
        op.check()
        self.ok(not bad_shapes, f"reducescatter calls with a wrong output shape (call, m, shape): {bad_shapes[:3]}")
        excess = worst_excess.item()
        self.ok(excess <= 0, f"500 reducescatter calls: the worst difference is {1 + excess:.3g} x the bound")

    def test_rmsnorm_form_both_dtypes(self):
        eps = 1e-6
        layouts = ("standard", "subtile") if subtile_ok() else ("standard",)
        for dtype in (torch.bfloat16, torch.float16):
            for layout in layouts:
                op = self.make_rs(dtype=dtype, layout=layout)
                w = rand(768, 1024, dtype=dtype, seed=108)
                g = rand(768, dtype=dtype, seed=109, per_rank=False)
                for m in multiples_of_world(1, 64, 333, 512):
                    rows = op.rows(m)
                    x = rand(m, 1024, dtype=dtype, seed=m + 110)
                    r = rand(len(rows), 768, dtype=dtype, seed=m + 111)  # (this rank's rows' residual)
                    out, h = op(x, w, residual=r, norm_weight=g, eps=eps)
                    self.ok((tuple(out.shape), tuple(h.shape)) == ((len(rows), 768), (len(rows), 768)),
                            f"{op} m={m}: output shapes {tuple(out.shape)}, {tuple(h.shape)}")
                    y = rs_reference(x, w, None if layout == "standard" else rows)
                    h_ref = (y.float() + r.float()).to(dtype)
                    hf = h_ref.float()
                    rms = torch.sqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
                    out_ref = (hf / rms * g.float()).to(dtype)
                    atol_h = gemm_bound(x, w, dtype) + 2 * U[dtype] * (hf.abs().max().item() if hf.numel() else 0.0)
                    good_h, worst_h = within(h, h_ref, atol_h)
                    self.ok(good_h, f"{op} m={m}: residual_out differs from its rows + residual by up to {worst_h}")
                    # the norm of the op's own h: fp32 arithmetic, then one rounding
                    ho = h.float()
                    norm = ho * torch.rsqrt(ho.pow(2).mean(-1, keepdim=True) + eps) * g.float()
                    bound = 2 * U[dtype] * norm.abs() + 1e-5
                    self.ok(bool(((out.float() - norm).abs() <= bound).all()),
                            f"{op} m={m}: out is not RMSNorm(residual_out) * norm_weight, rounded")
                    loose = 4 * atol_h / rms * g.float().abs().max() + 2 * U[dtype] * out_ref.float().abs() + 1e-5
                    self.ok(bool(((out.float() - out_ref.float()).abs() <= loose).all()),
                            f"{op} m={m}: RMSNorm output")

    def test_leading_batch_dimensions(self):
        op = self.make_rs()
        w = rand(768, 1024, dtype=torch.bfloat16, seed=112)
        x = rand(2 * WORLD, 3, 1024, dtype=torch.bfloat16, seed=113)
        y = op(x, w)
        self.assertEqual(tuple(y.shape), (2, 3, 768))
        self.ok(torch.equal(y, op(x.view(-1, 1024), w).view(2, 3, 768)), "(2W, 3, k) is not the (6W, k) result")
        # (the sum scattered along the first dimension, as reduce_scatter_tensor scatters it)
        ref = torch.empty(2, 3, 768, dtype=torch.bfloat16, device=DEVICE)
        dist.reduce_scatter_tensor(ref, F.linear(x, w))
        good, worst = within(y, ref, gemm_bound(x.view(-1, 1024), w, torch.bfloat16))
        self.ok(good, f"(2W, 3, k): |op - reduce_scatter_tensor| up to {worst}")
        r, g = rand(2, 3, 768, dtype=torch.bfloat16, seed=114), rand(768, dtype=torch.bfloat16, seed=115, per_rank=False)
        out, h = op(x, w, residual=r, norm_weight=g)
        self.assertEqual((tuple(out.shape), tuple(h.shape)), ((2, 3, 768), (2, 3, 768)))
        out2, h2 = op(x.view(-1, 1024), w, residual=r.view(-1, 768), norm_weight=g)
        self.ok(torch.equal(out, out2.view(2, 3, 768)) and torch.equal(h, h2.view(2, 3, 768)),
                "the RMSNorm form with (2W, 3, k) is not the (6W, k) result")

    def test_empty_batch(self):
        op = self.make_rs()
        y = op(torch.empty(0, 1024, dtype=torch.bfloat16, device=DEVICE), rand(768, 1024, dtype=torch.bfloat16, seed=0))
        self.assertEqual(tuple(y.shape), (0, 768))

    def test_functional_builds_and_caches(self):
        fo.clear_cache()
        w = rand(256, 512, dtype=torch.float16, seed=116)
        for m, max_m in ((100, 128), (120, 128), (300, 512), (5, 512)):
            m = max(WORLD, m - m % WORLD)
            max_m = max(max_m, fo.round_max_m(m))
            x = rand(m, 512, dtype=torch.float16, seed=m + 117)
            y = fo.gemm_reduce_scatter(x, w)
            self.assertEqual(tuple(y.shape), (m // WORLD, 256))
            good, worst = within(y, rs_reference(x, w), gemm_bound(x, w, torch.float16))
            self.ok(good, f"gemm_reduce_scatter m={m}: |diff| up to {worst}")
            self.assertEqual([op.max_m for op in fo._rs_cache.values()], [max_m])
            self.assertEqual(len(fo._cache), 0)  # (gemm_all_reduce's cache is its own)
        m = 5 * WORLD
        x, r, g = (rand(m, 512, dtype=torch.float16, seed=118), rand(5, 256, dtype=torch.float16, seed=119),
                   rand(256, dtype=torch.float16, seed=120, per_rank=False))
        out, h = fo.gemm_reduce_scatter(x, w, residual=r, norm_weight=g)
        self.assertEqual((tuple(out.shape), tuple(h.shape)), ((5, 256), (5, 256)))
        if subtile_ok():  # (options make another op)
            y = fo.gemm_reduce_scatter(x, w, layout="subtile")
            self.ok(tuple(y.shape) == (fo.rs_rows_out(m, WORLD, RANK, "subtile"), 256), f"sub-tile shape {y.shape}")
            self.assertEqual(len(fo._rs_cache), 2)
        fo.clear_cache()


class ReduceScatterCompile(Case):
    def test_torch_compile_keeps_the_op_whole(self):
        torch._dynamo.reset()
        op = self.make_rs(max_m=64 * WORLD, n=512, k=256)
        w = rand(512, 256, dtype=torch.bfloat16, seed=130)

        class Layer(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.op = op
                self.register_buffer("weight", w)

            def forward(self, x):
                return self.op(x, self.weight) * 2

        layer = Layer()
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        x = rand(16 * WORLD, 256, dtype=torch.bfloat16, seed=131)
        out = torch.compile(layer, backend=backend, fullgraph=True)(x)
        calls = [str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
        self.assertEqual(sum("flashoverlap" in c for c in calls), 1, calls)
        self.assertEqual(tuple(out.shape), (16, 512))
        self.ok(torch.equal(out, op(x, w) * 2), "the traced graph's output is not the eager op's")

        torch._dynamo.reset()
        compiled = torch.compile(layer, fullgraph=True)  # inductor
        for c in (16, 24, 40, 64):  # (a second m recompiles with m dynamic: rows m / world, symbolic)
            x = rand(c * WORLD, 256, dtype=torch.bfloat16, seed=132 + c)
            y = compiled(x)
            self.assertEqual(tuple(y.shape), (c, 512))
            self.ok(torch.equal(y, op(x, w) * 2), f"inductor m={c * WORLD}: not the eager op's output")

    def test_torch_compile_rmsnorm_form(self):
        torch._dynamo.reset()
        op = self.make_rs(max_m=64 * WORLD, n=512, k=256)
        w = rand(512, 256, dtype=torch.bfloat16, seed=133)
        g = rand(512, dtype=torch.bfloat16, seed=134, per_rank=False)

        def block(x, r):
            return op(x, w, residual=r, norm_weight=g, eps=1e-5)

        compiled = torch.compile(block, fullgraph=True)
        for c in (8, 50):
            x = rand(c * WORLD, 256, dtype=torch.bfloat16, seed=135 + c)
            r = rand(c, 512, dtype=torch.bfloat16, seed=136 + c)
            (a, b), (e, d) = compiled(x, r), block(x, r)
            self.ok(torch.equal(a, e) and torch.equal(b, d), f"compiled RMSNorm form m={c * WORLD}: not the eager op's")

    def test_opcheck(self):
        op = self.make_rs(max_m=128 * WORLD, n=256, k=128)
        x, w = rand(8 * WORLD, 128, dtype=torch.bfloat16, seed=137), rand(256, 128, dtype=torch.bfloat16, seed=138)
        torch.library.opcheck(torch.ops.flashoverlap.gemm_reduce_scatter.default, (x, w, op.handle),
                              test_utils=("test_schema", "test_faketensor"))
        r, g = rand(8, 256, dtype=torch.bfloat16, seed=139), rand(256, dtype=torch.bfloat16, seed=140, per_rank=False)
        torch.library.opcheck(torch.ops.flashoverlap.gemm_reduce_scatter_rmsnorm.default, (x, w, r, g, 1e-6, op.handle),
                              test_utils=("test_schema", "test_faketensor"))


class ReduceScatterCudaGraphs(Case):
    def test_capture_and_replay_mixed_with_eager_calls(self):
        op = self.make_rs(max_m=512, n=512, k=512)
        w = rand(512, 512, dtype=torch.bfloat16, seed=150)
        m1, m2 = multiples_of_world(100)[0], multiples_of_world(200)[0]
        x, x2 = rand(m1, 512, dtype=torch.bfloat16, seed=151), rand(m2, 512, dtype=torch.bfloat16, seed=152)
        r = rand(m1 // WORLD, 512, dtype=torch.bfloat16, seed=153)
        g = rand(512, dtype=torch.bfloat16, seed=154, per_rank=False)
        op(x, w)        # m1 planned by an eager call (both forms),
        op(x, w, residual=r, norm_weight=g)
        op.prepare(m2)  # m2 by prepare
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # (warm-up on a side stream, as torch's CUDA-graph docs advise)
            op(x, w)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y, y2 = op(x, w), op(x2, w)
            out, h = op(x, w, residual=r, norm_weight=g)
        for i in range(4):
            x.copy_(rand(m1, 512, dtype=torch.bfloat16, seed=160 + i))
            x2.copy_(rand(m2, 512, dtype=torch.bfloat16, seed=170 + i))
            graph.replay()
            e, e2 = op(x, w), op(x2, w)
            eo, eh = op(x, w, residual=r, norm_weight=g)
            same = torch.equal(y, e) and torch.equal(y2, e2) and torch.equal(out, eo) and torch.equal(h, eh)
            self.ok(same, f"reducescatter replay {i}: not the eager calls' outputs")
            good, worst = within(e, rs_reference(x, w), gemm_bound(x, w, torch.bfloat16))
            self.ok(good, f"reducescatter replay {i}: the eager call against the reference: up to {worst}")
        torch.cuda.synchronize()
        op.check()

    def test_an_unplanned_m_is_refused_under_capture(self):
        op = self.make_rs(max_m=512, n=512, k=512)
        m = multiples_of_world(300)[0]
        w, x = rand(512, 512, dtype=torch.bfloat16, seed=155), rand(m, 512, dtype=torch.bfloat16, seed=156)
        graph = torch.cuda.CUDAGraph()
        with self.assertRaisesRegex(FlashOverlapError, rf"m = {m} has no plan yet.*op\.prepare\({m}\)"):
            with torch.cuda.graph(graph):
                op(x, w)
        self.ok(torch.equal(op(x, w), op(x, w)), "the op after a refused capture")


class ReduceScatterBadInput(Case):
    def test_messages(self):
        op = self.make_rs(max_m=64, n=32, k=16)
        name = str(op)
        self.assertIn("standard layout", name)
        w, x = rand(32, 16, dtype=torch.bfloat16, seed=0), rand(8 * WORLD if 8 * WORLD <= 64 else WORLD, 16,
                                                                dtype=torch.bfloat16, seed=0)
        cases = [
            ((x.float(), w), "x has dtype torch.float32, expected torch.bfloat16"),
            ((x.cpu(), w), f"x is on cpu, expected {DEVICE}"),
            ((rand(16, 8, dtype=torch.bfloat16, seed=0).t(), w), "x is not contiguous"),
            ((x, rand(32, 8, dtype=torch.bfloat16, seed=0)), "weight has shape (32, 8), expected (32, 16)"),
            ((rand(64 + WORLD, 16, dtype=torch.bfloat16, seed=0), w),
             f"x has m = {64 + WORLD} rows, more than the op's max_m = 64"),
            ((rand(8, 8, dtype=torch.bfloat16, seed=0), w), "x has shape (8, 8), expected (m, 16)"),
        ]
        if WORLD > 1:
            cases.append(((rand(WORLD + 1, 16, dtype=torch.bfloat16, seed=0), w),
                          f"x has m = {WORLD + 1} rows, not a multiple of the world size {WORLD}"))
        for args, message in cases:
            with self.assertRaises(InvalidArgument) as cm:
                op(*args)
            self.assertTrue(str(cm.exception).startswith(f"{name}: {message}"), str(cm.exception))
        rows = x.shape[0] // WORLD
        with self.assertRaisesRegex(InvalidArgument, rf"residual has shape \({rows + 1}, 32\), expected \({rows}, 32\)"):
            op(x, w, residual=rand(rows + 1, 32, dtype=torch.bfloat16, seed=0),
               norm_weight=rand(32, dtype=torch.bfloat16, seed=0))
        for m in (0, 65):
            with self.assertRaisesRegex(InvalidArgument, rf"m = {m}: needs 1 <= m <= max_m = 64"):
                op.prepare(m)
            with self.assertRaisesRegex(InvalidArgument, rf"m = {m}: needs 1 <= m <= max_m = 64"):
                op.rows_out(m)
        if WORLD > 1:
            with self.assertRaisesRegex(InvalidArgument, f"m = {WORLD + 1} is not a multiple of the world size"):
                op.rows(WORLD + 1)
            # (the library's own refusal, through the ctypes layer)
            with self.assertRaisesRegex(InvalidArgument, "^fo_gemm_reducescatter_rows_out: .*not a multiple of the "
                                                         "world size"):
                op._op.rows_out(WORLD + 1)
        if not subtile_ok():
            with self.assertRaisesRegex(InvalidArgument, f"the sub-tile layout needs the world size to divide 128, "
                                                         f"not {WORLD}"):
                self.make_rs(max_m=64, n=32, k=16, layout="subtile")
        with self.assertRaisesRegex(InvalidArgument, "^GemmReduceScatter: dtype torch.float32 is not supported"):
            fo.GemmReduceScatter(None, 64, 32, 16, torch.float32)
        with self.assertRaisesRegex(InvalidArgument, "^GemmReduceScatter: max_m = 64, n = 32, k = 12: needs"):
            fo.GemmReduceScatter(None, 64, 32, 12, torch.bfloat16)
        with self.assertRaisesRegex(InvalidArgument, "^GemmReduceScatter: layout = 'diagonal'"):
            fo.GemmReduceScatter(None, 64, 32, 16, torch.bfloat16, layout="diagonal")
        with self.assertRaisesRegex(InvalidArgument, "^GemmReduceScatter: path = 'row_bands': one of 'auto', "
                                                     "'sequential', 'slots'"):
            fo.GemmReduceScatter(None, 64, 32, 16, torch.bfloat16, path="row_bands")
        # a handle of the other kind, given to the ReduceScatter's custom op
        ar = self.make(max_m=64, n=32, k=16)
        with self.assertRaisesRegex(FlashOverlapError, f"handle {ar.handle} is a GemmAllReduce, not a GemmReduceScatter"):
            torch.ops.flashoverlap.gemm_reduce_scatter(x, w, ar.handle)
        ar.close()
        op.close()
        with self.assertRaisesRegex(FlashOverlapError, "no op with handle"):
            op(x, w)


# ---- all_gather_rows: the AllGather that closes ReduceScatter -> row-wise step -> AllGather ----

def rows_index(rows):
    """A device index tensor of a list of rows (empty: an empty index)."""
    return torch.tensor(rows, dtype=torch.long, device=DEVICE)


def same_on_every_rank(t):
    """Whether t is bitwise rank 0's (one broadcast of a copy)."""
    ref = t.clone()
    dist.broadcast(ref, src=0)
    return torch.equal(t, ref)


def gather_layouts():
    return ("standard", "subtile") if subtile_ok() else ("standard",)


def gather_ms(layout, *ms):
    """The m's of a gather test: any m for the sub-tile layout, multiples of the world for the standard one."""
    return sorted(set(ms)) if layout == "subtile" else multiples_of_world(*ms)


class ReduceScatterAllGather(Case):
    def test_against_linear_all_reduce_both_dtypes(self):
        for dtype in (torch.bfloat16, torch.float16):
            for layout in gather_layouts():
                op = self.make_rs(dtype=dtype, layout=layout)
                w = rand(768, 1024, dtype=dtype, seed=301)
                # (1, 7, 64: ranks past the first hold no rows of the sub-tile layout; 130: a ragged tile row)
                for m in gather_ms(layout, 1, 7, 64, 130, 300, 512):
                    x = rand(m, 1024, dtype=dtype, seed=m + 302)
                    y = op(x, w)
                    full = op.all_gather_rows(y, m)
                    self.assertEqual((full.shape, full.dtype, full.device), ((m, 768), dtype, DEVICE))
                    good, worst = within(full, reference(x, w), gemm_bound(x, w, dtype))
                    self.ok(good, f"{op} m={m}: |all_gather_rows(op) - F.linear + all_reduce| up to {worst}")
                    # each rank's rows of the whole are its own output, bitwise; the whole is every rank's
                    self.ok(torch.equal(full[rows_index(op.rows(m))], y), f"{op} m={m}: its rows of the gathered "
                                                                           "whole are not its output")
                    self.ok(same_on_every_rank(full), f"{op} m={m}: the gathered whole differs between ranks")
                    if layout == "standard":  # (the default m: y's rows times the world)
                        self.ok(torch.equal(op.all_gather_rows(y), full), f"{op} m={m}: all_gather_rows(y) is not "
                                                                          f"all_gather_rows(y, {m})")
                op.close()

    def test_chain_bitwise_equal_to_the_standard_layouts(self):
        if WORLD > 2:
            self.skipTest("bitwise only where NCCL's sum is a + b (world <= 2)")
        shape = dict(max_m=1024, n=1024, k=1024)
        eps = 1e-6
        w = rand(1024, 1024, dtype=torch.bfloat16, seed=303)
        g = rand(1024, dtype=torch.bfloat16, seed=304, per_rank=False)
        seq = self.make_rs(path="sequential", **shape)  # (the standard layout's sequential chain: the reference)
        ops = [self.make_rs(path=path, layout=layout, **shape) for layout in gather_layouts()
               for path in ("sequential", "slots", "auto")]

        def chain(op, x, residual, m):
            # the residual each op is given: the full residual's rows op.rows(m), in its order
            r = residual[rows_index(op.rows(m))]
            out, h = op(x, w, residual=r, norm_weight=g, eps=eps)
            return op.all_gather_rows(op(x, w), m), op.all_gather_rows(out, m), op.all_gather_rows(h, m)

        for m in multiples_of_world(2, 130, 334, 1024):  # (2: a rank without rows of the sub-tile layout at 2)
            x = rand(m, 1024, dtype=torch.bfloat16, seed=m + 305)
            residual = rand(m, 1024, dtype=torch.bfloat16, seed=m + 306, per_rank=False)  # (the same on every rank)
            want = chain(seq, x, residual, m)
            self.assertEqual([tuple(t.shape) for t in want], [(m, 1024)] * 3)
            for op in ops:
                got = chain(op, x, residual, m)
                same = [torch.equal(a, b) for a, b in zip(got, want)]
                if RANK == 0 and m == 1024:
                    print(f"[test_gpu] all_gather_rows chain {op.layout} {op.path}, m={m}: {op.plan(m)}", flush=True)
                self.ok(all(same), f"{op} path {op.path}, m={m}: the chain (y, out, h gathered: {same}) is not "
                                   "bitwise the standard layout's sequential chain")
        for op in ops + [seq]:
            op.check()
            op.close()

    def test_empty_batch(self):
        for layout in gather_layouts():
            op = self.make_rs(layout=layout)
            y = op(torch.empty(0, 1024, dtype=torch.bfloat16, device=DEVICE), rand(768, 1024, dtype=torch.bfloat16,
                                                                                    seed=0))
            full = op.all_gather_rows(y, 0) if layout == "subtile" else op.all_gather_rows(y)
            self.assertEqual((tuple(full.shape), full.dtype), ((0, 768), torch.bfloat16))
            op.close()

    def test_bad_input(self):
        w = rand(32, 16, dtype=torch.bfloat16, seed=0)
        for layout in gather_layouts():
            op = self.make_rs(max_m=64, n=32, k=16, layout=layout)
            name = str(op)
            m = 8 * WORLD if 8 * WORLD <= 64 else 64 - 64 % WORLD
            y = op(rand(m, 16, dtype=torch.bfloat16, seed=0), w)
            rows = y.shape[0]
            cases = [
                ((y.float(), m), "y has dtype torch.float32, expected torch.bfloat16"),
                ((y.cpu(), m), f"y is on cpu, expected {DEVICE}"),
                ((y.view(-1), m), "y has 1 dimensions"),
                ((rand(rows + 1, 32, dtype=torch.bfloat16, seed=0), m),
                 f"all_gather_rows: y has shape ({rows + 1}, 32), expected ({rows}, 32): this rank's rows_out(m) = "
                 f"{rows} rows of the sum for m = {m}"),
                ((rand(rows, 16, dtype=torch.bfloat16, seed=0), m), f"all_gather_rows: y has shape ({rows}, 16), "
                                                                     f"expected ({rows}, 32)"),
                ((y, 64 + WORLD), f"all_gather_rows: m = {64 + WORLD}: needs 0 <= m <= max_m = 64"),
                (([1.0], m), "all_gather_rows: y must be a torch.Tensor, not list"),
                ((y, float(m)), f"all_gather_rows: m = {float(m)!r} is not an int"),
            ]
            if rows >= 2:
                cases.append(((rand(32, rows, dtype=torch.bfloat16, seed=0).t(), m), "y is not contiguous"))
            if layout == "subtile":
                cases.append(((y,), "all_gather_rows: m is required with the sub-tile layout"))
            elif WORLD > 1:
                cases.append(((y, m + 1), f"all_gather_rows: m = {m + 1} is not a multiple of the world size {WORLD}"))
            for args, message in cases:
                with self.assertRaises(InvalidArgument) as cm:
                    op.all_gather_rows(*args)
                self.assertTrue(str(cm.exception).startswith(f"{name}: {message}"), str(cm.exception))
            # (the library's own refusals, through the ctypes layer: before any collective, on every rank)
            full = torch.empty(m, 32, dtype=torch.bfloat16, device=DEVICE)
            stream = torch.cuda.current_stream().cuda_stream
            with self.assertRaisesRegex(InvalidArgument, r"^fo_gemm_reducescatter_all_gather_rows: .*m must be in "
                                                         r"\[1, max_m\], not 0"):
                op._op.all_gather_rows(full.data_ptr(), full.data_ptr(), 0, stream)
            with self.assertRaisesRegex(InvalidArgument, "^fo_gemm_reducescatter_all_gather_rows: local is NULL$"):
                op._op.all_gather_rows(0, full.data_ptr(), m, stream)
            with self.assertRaisesRegex(InvalidArgument, "^fo_gemm_reducescatter_all_gather_rows: full is NULL$"):
                op._op.all_gather_rows(full.data_ptr(), None, m, stream)
            # still usable after the refusals
            good, worst = within(op.all_gather_rows(y, m), reference(rand(m, 16, dtype=torch.bfloat16, seed=0), w),
                                 gemm_bound(rand(m, 16, dtype=torch.bfloat16, seed=0), w, torch.bfloat16))
            self.ok(good, f"{op}: all_gather_rows after the refusals: |diff| up to {worst}")
            # a handle of the other kind, given to the custom op; a closed op
            ar = self.make(max_m=64, n=32, k=16)
            with self.assertRaisesRegex(FlashOverlapError, f"handle {ar.handle} is a GemmAllReduce, not a "
                                                           "GemmReduceScatter"):
                torch.ops.flashoverlap.gemm_reduce_scatter_all_gather_rows(y, m, ar.handle)
            ar.close()
            op.close()
            with self.assertRaisesRegex(FlashOverlapError, "no op with handle"):
                op.all_gather_rows(y, m)


class ReduceScatterAllGatherCompile(Case):
    def test_torch_compile_keeps_the_chain_whole(self):
        for layout in gather_layouts():
            torch._dynamo.reset()
            op = self.make_rs(max_m=64 * WORLD, n=512, k=256, layout=layout)
            w = rand(512, 256, dtype=torch.bfloat16, seed=310)

            class Layer(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.op = op
                    self.register_buffer("weight", w)

                def forward(self, x):
                    y = torch.relu(self.op(x, self.weight))  # (a row-wise step between the two)
                    # (the standard layout's default m: y's rows times the world, symbolic under dynamic shapes)
                    full = self.op.all_gather_rows(y) if layout == "standard" else self.op.all_gather_rows(y, x.shape[0])
                    return full * 2

            layer = Layer()
            graphs = []

            def backend(gm, example_inputs):
                graphs.append(gm)
                return gm.forward

            x = rand(16 * WORLD, 256, dtype=torch.bfloat16, seed=311)
            eager = layer(x)
            out = torch.compile(layer, backend=backend, fullgraph=True)(x)
            calls = [str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
            self.assertEqual(sum("flashoverlap" in c for c in calls), 2, calls)
            self.assertEqual(sum("all_gather_rows" in c for c in calls), 1, calls)
            self.assertEqual(tuple(out.shape), (16 * WORLD, 512))
            self.ok(torch.equal(out, eager), f"{layout}: the traced graph's output is not the eager chain's")

            torch._dynamo.reset()
            compiled = torch.compile(layer, fullgraph=True)  # inductor
            for c in (16, 24, 40, 64):  # (a second m recompiles with m dynamic)
                x = rand(c * WORLD, 256, dtype=torch.bfloat16, seed=312 + c)
                got = compiled(x)
                self.assertEqual(tuple(got.shape), (c * WORLD, 512))
                self.ok(torch.equal(got, layer(x)), f"{layout} inductor m={c * WORLD}: not the eager chain's output")
            op.close()

    def test_opcheck(self):
        for layout in gather_layouts():
            op = self.make_rs(max_m=128 * WORLD, n=256, k=128, layout=layout)
            m = 8 * WORLD
            y = op(rand(m, 128, dtype=torch.bfloat16, seed=313), rand(256, 128, dtype=torch.bfloat16, seed=314))
            torch.library.opcheck(torch.ops.flashoverlap.gemm_reduce_scatter_all_gather_rows.default, (y, m, op.handle),
                                  test_utils=("test_schema", "test_faketensor"))
            op.close()


class ReduceScatterAllGatherCudaGraphs(Case):
    def test_capture_and_replay_of_the_chain(self):
        for layout in gather_layouts():
            op = self.make_rs(max_m=512, n=512, k=512, layout=layout)
            w = rand(512, 512, dtype=torch.bfloat16, seed=320)
            m1, m2 = gather_ms(layout, 100)[0], gather_ms(layout, 200)[0]
            x, x2 = rand(m1, 512, dtype=torch.bfloat16, seed=321), rand(m2, 512, dtype=torch.bfloat16, seed=322)
            g = rand(512, dtype=torch.bfloat16, seed=323, per_rank=False)
            r = rand(op.rows_out(m1), 512, dtype=torch.bfloat16, seed=324)
            # m1 and m2 planned, and gathered once, eagerly (the sub-tile layout's first gather of an m allocates)
            op.all_gather_rows(op(x, w), m1)
            op.all_gather_rows(op(x2, w), m2)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # (warm-up on a side stream, as torch's CUDA-graph docs advise)
                op.all_gather_rows(op(x, w, residual=r, norm_weight=g)[0], m1)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                full = op.all_gather_rows(op(x, w), m1)
                full2 = op.all_gather_rows(op(x2, w), m2)
                out, h = op(x, w, residual=r, norm_weight=g)
                full_out = op.all_gather_rows(out, m1)
            for i in range(3):
                x.copy_(rand(m1, 512, dtype=torch.bfloat16, seed=330 + i))
                x2.copy_(rand(m2, 512, dtype=torch.bfloat16, seed=340 + i))
                graph.replay()
                e, e2 = op.all_gather_rows(op(x, w), m1), op.all_gather_rows(op(x2, w), m2)
                eo = op.all_gather_rows(op(x, w, residual=r, norm_weight=g)[0], m1)
                same = torch.equal(full, e) and torch.equal(full2, e2) and torch.equal(full_out, eo)
                self.ok(same, f"{op} replay {i}: not the eager chain's outputs")
                good, worst = within(e, reference(x, w), gemm_bound(x, w, torch.bfloat16))
                self.ok(good, f"{op} replay {i}: the eager chain against the reference: up to {worst}")
            torch.cuda.synchronize()
            op.check()
            op.close()

    def test_a_subtile_m_not_yet_gathered_is_refused_under_capture(self):
        if not subtile_ok():
            self.skipTest(f"the sub-tile layout needs the world size to divide 128, not {WORLD}")
        op = self.make_rs(max_m=512, n=512, k=512, layout="subtile")
        m = 300
        w, x = rand(512, 512, dtype=torch.bfloat16, seed=350), rand(m, 512, dtype=torch.bfloat16, seed=351)
        y = op(x, w)  # (m planned by the run: its gather is not)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with self.assertRaisesRegex(FlashOverlapError, rf"all_gather_rows: m = {m} has not been gathered yet.*"
                                                       rf"op\.all_gather_rows\(y, {m}\) once eagerly"):
            with torch.cuda.graph(graph):
                op.all_gather_rows(y, m)
        full = op.all_gather_rows(y, m)
        good, worst = within(full, reference(x, w), gemm_bound(x, w, torch.bfloat16))
        self.ok(good, f"{op}: all_gather_rows after a refused capture: |diff| up to {worst}")
        op.close()


# ---- GemmAllToAll: the MoE combine ----

def moe_routing(tokens, topk, seed, shuffle=True):
    """A random routing that every rank draws alike (a shared seed): each
    token t of each rank s picks 0 to topk distinct ranks (experts); expert
    e's rows are the (s, t) that picked it, shuffled or in (s, t) order, each
    with a gate in [0.25, 1.5). Returns (rows, gates): per expert, its rows'
    (s, t) and their gates."""
    rng = random.Random(SEED * 31 + seed)
    rows = [[] for _ in range(WORLD)]
    for s in range(WORLD):
        for t in range(tokens[s]):
            for e in rng.sample(range(WORLD), rng.randint(0, topk)):
                rows[e].append((s, t))
    if shuffle:
        for r in rows:
            rng.shuffle(r)
    gates = [[rng.uniform(0.25, 1.5) for _ in r] for r in rows]
    return rows, gates


class MoeCase:
    """One call's data on every rank: each expert's x and weight (the same on
    every rank, so each can compute every expert's rows), this rank's
    routing, and the references."""

    def __init__(self, tokens, topk, n, k, dtype, seed, shuffle=True):
        self.rows, self.gates = moe_routing(tokens, topk, seed, shuffle)
        self.tokens, self.n, self.k, self.dtype = tokens[RANK], n, k, dtype
        self.x_of = [rand(len(self.rows[e]), k, dtype=dtype, seed=seed * 101 + e, per_rank=False) for e in range(WORLD)]
        self.w_of = [rand(n, k, dtype=dtype, seed=seed * 103 + e + 50, per_rank=False) for e in range(WORLD)]
        mine = self.rows[RANK]
        self.x, self.w = self.x_of[RANK], self.w_of[RANK]
        self.dest_rank = torch.tensor([s for s, _ in mine], dtype=torch.int32)
        self.dest_token = torch.tensor([t for _, t in mine], dtype=torch.int32)
        self.gate = torch.tensor(self.gates[RANK], dtype=torch.float32)
        self.send_counts = [sum(1 for s, _ in mine if s == d) for d in range(WORLD)]
        self.recv_counts = [sum(1 for s, _ in self.rows[e] if s == RANK) for e in range(WORLD)]
        # what comes here, in (source rank, source row) order: (expert, row, token, gate)
        self.received = [(e, i, t, self.gates[e][i]) for e in range(WORLD) for i, (s, t) in enumerate(self.rows[e])
                         if s == RANK]
        self.y32_of = [self.x_of[e].float() @ self.w_of[e].float().t() for e in range(WORLD)]

    def args(self, routing_on=None):
        """The call's arguments; routing_on: the device of dest_rank, dest_token and gate (None: the host's)."""
        on = (lambda t: t) if routing_on is None else (lambda t: t.to(routing_on))
        return (self.x, self.w, on(self.dest_rank), on(self.dest_token), on(self.gate), self.send_counts,
                self.recv_counts, self.tokens)

    def rows_ref(self):
        """The received rows in fp32 (exact products, fp32 sums) and their tokens."""
        rows = [self.y32_of[e][i] for e, i, _, _ in self.received]
        ref = torch.stack(rows) if rows else torch.zeros(0, self.n, device=DEVICE)
        return ref, torch.tensor([t for _, _, t, _ in self.received], dtype=torch.int32, device=DEVICE)

    def combine_ref(self):
        """out[t] = the sum of gate * row over token t's rows, in fp32."""
        out = torch.zeros(self.tokens, self.n, device=DEVICE)
        for e, i, t, g in self.received:
            out[t] += g * self.y32_of[e][i]
        return out

    def combine_of(self, rows):
        """The combine of the given received rows (of the dtype), in fp32 in their order, rounded once."""
        out = torch.zeros(self.tokens, self.n, device=DEVICE)
        for j, (_, _, t, g) in enumerate(self.received):
            out[t] += torch.tensor(g, dtype=torch.float32) * rows[j].float()
        return out.to(self.dtype)

    def row_bound(self):
        """|a row of ours - the fp32 GEMM|: one rounding to the dtype (u max|y|), and fp32's accumulation."""
        ymax = max([y.abs().max().item() for y in self.y32_of if y.numel()] + [0.0])
        return 2 * U[self.dtype] * ymax + 1e-5

    def combine_bound(self, topk):
        """|out - the fp32 combine|: each row's rounding, times its gate (< 1.5), over topk rows, then the
        output's own rounding."""
        ref = self.combine_ref()
        return 1.5 * topk * self.row_bound() + 2 * U[self.dtype] * (ref.abs().max().item() if ref.numel() else 0.0)


def a2a_topk():
    return min(2, WORLD)


class AllToAll(Case):
    @staticmethod
    def make_a2a(max_rows=1024, max_tokens=512, topk=None, n=512, k=256, dtype=None, **kw):
        return fo.GemmAllToAll(None, max_rows, max_tokens, topk or a2a_topk(), n, k, dtype or torch.bfloat16, **kw)

    def test_combine_and_rows_against_the_fp32_reference_both_dtypes(self):
        topk = a2a_topk()
        for dtype in (torch.bfloat16, torch.float16):
            op = self.make_a2a(dtype=dtype)
            for seed, tokens, shuffle in ((1, [300, 177, 64, 9][:WORLD] + [100] * max(0, WORLD - 4), True),
                                          (2, [77] * WORLD, False), (3, [1] * WORLD, True)):
                c = MoeCase(tokens, topk, 512, 256, dtype, seed, shuffle)
                # (the routing on the GPU: at world 1 the call never waits for the host)
                out = op(*c.args(DEVICE))
                good, worst = within(out, c.combine_ref(), c.combine_bound(topk))
                self.ok(good, f"{op} seed {seed}, the routing on the GPU: |combine - the fp32 reference| up to "
                              f"{worst} ({op.last_plan()})")
                out = op(*c.args())
                self.assertEqual((out.shape, out.dtype, out.device), ((c.tokens, 512), dtype, DEVICE))
                good, worst = within(out, c.combine_ref(), c.combine_bound(topk))
                self.ok(good, f"{op} seed {seed}: |combine - the fp32 reference| up to {worst}")
                rows_d, tok_d = op(*c.args(DEVICE), combine=False)
                rows, tok = op(*c.args(), combine=False)
                self.ok(torch.equal(rows_d, rows) and torch.equal(tok_d, tok),
                        f"{op} seed {seed}: the received rows and tokens alike with the routing on the GPU")
                ref, ref_tok = c.rows_ref()
                self.assertEqual((rows.shape, tok.shape, tok.dtype), ((len(c.received), 512), (len(c.received),),
                                                                      torch.int32))
                good, worst = within(rows, ref, c.row_bound())
                self.ok(good, f"{op} seed {seed}: |received rows - the fp32 GEMM| up to {worst}")
                self.ok(torch.equal(tok, ref_tok), f"{op} seed {seed}: the received rows' tokens")
                # the combine of those very rows: bitwise where each token has one row (world 1), else within
                # one rounding (the kernel's fma against torch's multiply, then add)
                mine = c.combine_of(rows)
                if WORLD == 1:
                    self.ok(torch.equal(out, mine), f"{op} seed {seed}: the combine is not gate * row, rounded once")
                else:
                    good, worst = within(out, mine, 2 * U[dtype] * mine.float().abs().max().item() + 1e-6)
                    self.ok(good, f"{op} seed {seed}: the combine against its own rows' up to {worst}")
            if RANK == 0:
                print(f"[test_gpu] {op}: last_plan = {op.last_plan()}", flush=True)
            op.close()

    def test_fp8_inputs_against_scaled_mm_every_scale_kind(self):
        """input="e4m3": small integers in e4m3 and power-of-two scales (every product exact before its one
        rounding): the received rows bitwise torch._scaled_mm's (use_fast_accum=False) of their senders' rows,
        the combine that of those rows."""
        if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
            self.skipTest("this torch has no float8_e4m3fn or _scaled_mm")
        topk, n, k = a2a_topk(), 512, 256
        c = MoeCase([200] * WORLD, topk, n, k, torch.bfloat16, 9)  # (its routing; the inputs are FP8 here)
        gen = torch.Generator().manual_seed(SEED + 23)  # (the same on every rank: each computes every sender's rows)
        small = lambda *shape: torch.randint(-3, 4, shape, generator=gen).float().to(DEVICE)  # noqa: E731
        pow2 = lambda *shape: (2.0 ** torch.randint(-2, 3, shape, generator=gen).float()).to(DEVICE)  # noqa: E731
        x_of = [small(len(c.rows[e]), k).to(torch.float8_e4m3fn) for e in range(WORLD)]
        w_of = [small(n, k).to(torch.float8_e4m3fn) for e in range(WORLD)]
        one = torch.ones(1, device=DEVICE)
        for scales in ("none", "tensor", "row"):
            sa_of = [pow2(len(c.rows[e]) if scales == "row" else 1) for e in range(WORLD)]
            sb_of = [pow2(n if scales == "row" else 1) for e in range(WORLD)]
            y_of = []
            for e in range(WORLD):
                if not len(c.rows[e]):
                    y_of.append(None)
                    continue
                sa = sa_of[e].view(-1, 1) if scales == "row" else sa_of[e] if scales != "none" else one
                sb = sb_of[e].view(1, -1) if scales == "row" else sb_of[e] if scales != "none" else one
                y_of.append(torch._scaled_mm(x_of[e], w_of[e].t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                             use_fast_accum=False))
            rows_ref = [y_of[e][i] for e, i, _, _ in c.received]
            rows_ref = torch.stack(rows_ref) if rows_ref else torch.zeros(0, n, dtype=torch.bfloat16, device=DEVICE)
            kw = {} if scales == "none" else dict(scale_a=sa_of[RANK], scale_b=sb_of[RANK])
            args = (x_of[RANK], w_of[RANK], c.dest_rank, c.dest_token, c.gate, c.send_counts, c.recv_counts, c.tokens)
            for path in ("sequential", "auto", "slots"):
                op = self.make_a2a(n=n, k=k, input="e4m3", scales=scales, path=path)
                rows, _ = op(*args, combine=False, **kw)
                self.ok(torch.equal(rows, rows_ref), f"{op} scales={scales} path={path}: the received rows are not "
                                                     f"torch._scaled_mm's ({op.last_plan()})")
                out = op(*args, **kw)
                mine = c.combine_of(rows)
                if WORLD == 1:
                    good = torch.equal(out, mine)
                else:
                    good, _ = within(out, mine, 2 * U[torch.bfloat16] * mine.float().abs().max().item() + 1e-6)
                self.ok(good, f"{op} scales={scales} path={path}: the combine is not that of the received rows")
                if scales == "row" and path == "auto":  # (compiled: the custom op, the scales after expert_counts)
                    f = torch.compile(lambda x, w, sa, sb: op(x, w, *args[2:], scale_a=sa, scale_b=sb))
                    self.ok(torch.equal(f(x_of[RANK], w_of[RANK], sa_of[RANK], sb_of[RANK]), out),
                            f"{op}: the compiled FP8 call differs from the eager one")
                with self.assertRaises(fo.InvalidArgument):  # (16-bit x on an FP8 op)
                    op(x_of[RANK].to(torch.bfloat16), *args[1:], **kw)
                if scales != "none":
                    with self.assertRaises(fo.InvalidArgument):  # (no scales)
                        op(*args)
                op.close()

    def test_world_1_against_linear(self):
        if WORLD != 1:
            self.skipTest("at world 1 the received rows are F.linear(x, w)'s")
        op = self.make_a2a(topk=1)
        for rows, shuffle in ((300, True), (128, False), (1, True)):
            x, w = rand(rows, 256, dtype=torch.bfloat16, seed=400 + rows), rand(512, 256, dtype=torch.bfloat16, seed=401)
            perm = torch.randperm(rows, generator=torch.Generator().manual_seed(SEED + rows)) if shuffle \
                else torch.arange(rows)
            dest_rank, dest_token = torch.zeros(rows, dtype=torch.int64), perm
            gate = torch.rand(rows, generator=torch.Generator().manual_seed(SEED + 7 * rows)) + 0.5
            y, tok = op(x, w, dest_rank, dest_token, gate, [rows], [rows], rows, combine=False)
            good, worst = within(y, F.linear(x, w), gemm_bound(x, w, torch.bfloat16))
            self.ok(good, f"{op} {rows} rows: |received rows - F.linear| up to {worst}")
            self.ok(torch.equal(tok.cpu(), perm.to(torch.int32)), f"{op} {rows} rows: tokens not in source-row order")
            out = op(x, w, dest_rank, dest_token, gate, [rows], [rows], rows)
            ref = torch.zeros(rows, 512, device=DEVICE)
            ref[perm.to(DEVICE)] = gate.to(DEVICE)[:, None] * F.linear(x.float(), w.float())
            good, worst = within(out, ref, 1.5 * gemm_bound(x, w, torch.bfloat16) + 2 * U[torch.bfloat16] *
                                 ref.abs().max().item())
            self.ok(good, f"{op} {rows} rows: |combine - gate * F.linear (fp32)| up to {worst}")
            exact = torch.zeros(rows, 512, device=DEVICE)
            exact[perm.to(DEVICE)] = gate.to(DEVICE)[:, None] * y.float()
            self.ok(torch.equal(out, exact.to(torch.bfloat16)), f"{op} {rows} rows: combine != gate * row, rounded")
        op.close()

    def test_routing_on_any_device_and_counts_as_tensors(self):
        op = self.make_a2a()
        c = MoeCase([200] * WORLD, a2a_topk(), 512, 256, torch.bfloat16, 5)
        want = op(*c.args())
        want_rows, want_tok = op(*c.args(), combine=False)
        x, w = c.x, c.w
        variants = (
            (c.dest_rank.to(DEVICE, torch.int64), c.dest_token.to(DEVICE), c.gate.to(DEVICE),
             torch.tensor(c.send_counts, device=DEVICE), torch.tensor(c.recv_counts)),
            (c.dest_rank.long(), c.dest_token.long(), c.gate.to(torch.float64), tuple(c.send_counts),
             torch.tensor(c.recv_counts, dtype=torch.int32, device=DEVICE)),
        )
        for i, (dr, dt, g, send, recv) in enumerate(variants):
            self.ok(torch.equal(op(x, w, dr, dt, g, send, recv, c.tokens), want), f"variant {i}: combine differs")
            rows, tok = op(x, w, dr, dt, g, send, recv, c.tokens, combine=False)
            self.ok(torch.equal(rows, want_rows) and torch.equal(tok, want_tok), f"variant {i}: rows differ")
        op.close()

    def test_ranks_without_rows(self):
        op = self.make_a2a()
        # every token picks nothing here: no rank has rows; the combine is zeros, nothing is received
        empty = torch.zeros(0, dtype=torch.int32)
        x, w = torch.empty(0, 256, dtype=torch.bfloat16, device=DEVICE), rand(512, 256, dtype=torch.bfloat16, seed=0)
        out = op(x, w, empty, empty, torch.zeros(0), [0] * WORLD, [0] * WORLD, 50)
        self.assertEqual(tuple(out.shape), (50, 512))
        self.ok(bool((out == 0).all()), "the combine of no rows is not zeros")
        rows, tok = op(x, w, empty, empty, None, [0] * WORLD, [0] * WORLD, 50, combine=False)
        self.assertEqual((tuple(rows.shape), tuple(tok.shape)), ((0, 512), (0,)))
        if WORLD > 1:  # only rank 0 has tokens: the others' combine has none, and nothing comes to them
            c = MoeCase([40] + [0] * (WORLD - 1), 1, 512, 256, torch.bfloat16, 6)
            out = op(*c.args())
            self.assertEqual(tuple(out.shape), (c.tokens, 512))
            good, worst = within(out, c.combine_ref(), c.combine_bound(1))
            self.ok(good, f"one rank's tokens: |diff| up to {worst}")
        op.close()

    def test_each_path(self):
        topk = a2a_topk()
        c = MoeCase([256] * WORLD, topk, 512, 256, torch.bfloat16, 7)
        for path in ("sequential", "slots", "auto", "nvlink"):
            op = self.make_a2a(path=path)
            out = op(*c.args())
            plan = op.last_plan()
            if RANK == 0:
                print(f"[test_gpu] GemmAllToAll path {path}: {plan}", flush=True)
            good, worst = within(out, c.combine_ref(), c.combine_bound(topk))
            self.ok(good, f"path {path}: |combine - the fp32 reference| up to {worst}")
            if path in ("sequential", "nvlink"):
                self.assertTrue(plan.startswith(path), plan)
            op.check()
            op.close()

    def test_functional_builds_and_caches(self):
        fo.clear_cache()
        topk = a2a_topk()
        sizes = []
        for seed, tokens in ((8, 100), (9, 120), (10, 700), (11, 5)):
            c = MoeCase([tokens] * WORLD, topk, 256, 128, torch.float16, seed)
            out = fo.gemm_all_to_all(c.x, c.w, c.dest_rank, c.dest_token, c.gate, c.send_counts, c.recv_counts, None,
                                     c.tokens, topk=topk)
            good, worst = within(out, c.combine_ref(), c.combine_bound(topk))
            self.ok(good, f"gemm_all_to_all tokens={tokens}: |diff| up to {worst}")
            rows, tok = fo.gemm_all_to_all(c.x, c.w, c.dest_rank, c.dest_token, c.gate, c.send_counts, c.recv_counts,
                                           None, c.tokens, False, topk=topk)
            self.ok(torch.equal(tok, c.rows_ref()[1]), f"gemm_all_to_all tokens={tokens}: tokens")
            self.assertEqual(len(fo._a2a_cache), 1)
            op = next(iter(fo._a2a_cache.values()))
            sizes.append((op.max_rows, op.max_tokens))
        # (the sizes every rank agreed on: the largest of the call, rounded up to a power of two; never smaller)
        self.assertTrue(all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(sizes, sizes[1:])), sizes)
        self.assertEqual((sizes[0][1], sizes[2][1]), (128, 1024), sizes)
        self.assertEqual(sizes[3], sizes[2], sizes)  # (a smaller call: the same op)
        for rows, toks in sizes:
            self.assertTrue(rows >= 128 and rows & (rows - 1) == 0, sizes)
        # given sizes: no exchange, an op of those sizes
        fo.clear_cache()
        c = MoeCase([50] * WORLD, topk, 256, 128, torch.float16, 12)
        fo.gemm_all_to_all(c.x, c.w, c.dest_rank, c.dest_token, c.gate, c.send_counts, c.recv_counts, None, c.tokens,
                           max_rows=300, max_tokens=200, topk=topk)
        op = next(iter(fo._a2a_cache.values()))
        self.assertEqual((op.max_rows, op.max_tokens, op.topk), (512, 256, topk))
        fo.clear_cache()

    def test_opcheck(self):
        op = self.make_a2a(max_rows=256, max_tokens=128, n=256, k=128)
        c = MoeCase([60] * WORLD, a2a_topk(), 256, 128, torch.bfloat16, 13)
        x, w, dr, dt, g, send, recv, tokens = c.args()
        torch.library.opcheck(torch.ops.flashoverlap.gemm_all_to_all.default,
                              (x, w, dr, dt, g, send, recv, tokens, op.handle),
                              test_utils=("test_schema", "test_faketensor"))
        torch.library.opcheck(torch.ops.flashoverlap.gemm_all_to_all_rows.default,
                              (x, w, dr, dt, g, send, recv, tokens, op.handle),
                              test_utils=("test_schema", "test_faketensor"))
        op.close()

    def test_capture_is_refused(self):
        op = self.make_a2a()
        c = MoeCase([64] * WORLD, a2a_topk(), 512, 256, torch.bfloat16, 14)
        want = op(*c.args())
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with self.assertRaisesRegex(FlashOverlapError, "cannot be captured into a CUDA graph"):
            with torch.cuda.graph(graph):
                op(*c.args())
        self.ok(torch.equal(op(*c.args()), want), "the op after a refused capture")
        op.close()


class AllToAllBadInput(Case):
    def test_messages(self):
        op = AllToAll.make_a2a(max_rows=256, max_tokens=128, n=256, k=128)
        name = str(op)
        c = MoeCase([60] * WORLD, a2a_topk(), 256, 128, torch.bfloat16, 20)
        x, w, dr, dt, g, send, recv, tokens = c.args()
        # what this rank refuses before any exchange (every rank makes the same mistake here)
        cases = [
            ((x.float(), w, dr, dt, g, send, recv, tokens), "x has dtype torch.float32, expected torch.bfloat16"),
            ((x.cpu(), w, dr, dt, g, send, recv, tokens), f"x is on cpu, expected {DEVICE}"),
            ((x, w[:, :64].contiguous(), dr, dt, g, send, recv, tokens), "weight has shape (256, 64), expected"),
            ((x, w, dr.float(), dt, g, send, recv, tokens), "dest_rank has dtype torch.float32, expected an integer"),
            ((x, w, dr, dt[:-1] if dt.numel() else torch.zeros(1, dtype=torch.int32), g, send, recv, tokens),
             "dest_token has shape"),
            ((x, w, dr, dt, None, send, recv, tokens), "gate_weight is required to combine"),
            ((x, w, dr, dt, g, send + [0], recv, tokens), f"send_counts has {WORLD + 1} entries, expected the world"),
            ((x, w, dr, dt, g, send, recv, float(tokens)), "tokens = "),
        ]
        for args, message in cases:
            with self.assertRaises(InvalidArgument) as cm:
                op(*args)
            self.assertTrue(str(cm.exception).startswith(f"{name}: {message}"), str(cm.exception))
        # what the library refuses on every rank together: send_counts that disagree with dest_rank (rank 0's)
        bad = list(send)
        if RANK == 0:
            bad[0] += 1
        e = self._last_message(op, x, w, dr, dt, g, bad, recv, tokens)  # (collective: every rank refuses it)
        self.assertRegex(str(e), r"^fo_gemm_alltoall_run: GemmAllToAll \(rank .*: the call of rank\(s\) 0 failed "
                                 r"their checks")
        if RANK == 0:
            self.assertIn(f"here send_counts[0] = {bad[0]} but {send[0]} rows go to rank 0", str(e))
        # recv_counts that disagree with what the ranks send
        bad = list(recv)
        bad[-1] += 1
        with self.assertRaisesRegex(InvalidArgument, r"recv_counts\[\d+\] = \d+ but rank \d+ sends it \d+ rows"):
            op(x, w, dr, dt, g, send, bad, tokens)
        # a token out of range at its destination, a rank out of range, sizes beyond the op's
        with self.assertRaisesRegex(InvalidArgument, "outside|failed their checks"):
            op(x, w, dr, dt, g, send, recv, 0)  # (0 tokens here: every row sent here is out of range)
        with self.assertRaisesRegex(InvalidArgument, r"tokens = 129 is outside \[0, max_tokens = 128\]"):
            op(x, w, dr, dt, g, send, recv, 129)
        # still usable after the refusals
        good, worst = within(op(*c.args()), c.combine_ref(), c.combine_bound(a2a_topk()))
        self.ok(good, f"{op} after the refusals: |diff| up to {worst}")
        with self.assertRaisesRegex(InvalidArgument, "^GemmAllToAll: topk = 0: needs 1 <= topk <= the world size"):
            fo.GemmAllToAll(None, 64, 64, 0, 32, 16, torch.bfloat16)
        with self.assertRaisesRegex(InvalidArgument, rf"^GemmAllToAll: topk = {WORLD + 1}: needs"):
            fo.GemmAllToAll(None, 64, 64, WORLD + 1, 32, 16, torch.bfloat16)
        with self.assertRaisesRegex(InvalidArgument, "^GemmAllToAll: path = 'row_bands'"):
            fo.GemmAllToAll(None, 64, 64, 1, 32, 16, torch.bfloat16, path="row_bands")
        # a handle of another kind, given to the All-to-All's custom op
        ar = self.make(max_m=64, n=32, k=16)
        with self.assertRaisesRegex(FlashOverlapError, f"handle {ar.handle} is a GemmAllReduce, not a GemmAllToAll"):
            torch.ops.flashoverlap.gemm_all_to_all(x, w, dr, dt, g, send, recv, tokens, ar.handle)
        ar.close()
        op.close()
        with self.assertRaisesRegex(FlashOverlapError, "no op with handle"):
            op(*c.args())

    def test_a_bad_row_found_on_the_gpu(self):
        # At world 1 the routing's arrays stay on the GPU: a bad row is left
        # out there and reported once, by check() or by the next call.
        if WORLD != 1:
            self.skipTest("world 1 only (elsewhere the routing goes to the host and is refused before the call)")
        op = AllToAll.make_a2a(max_rows=256, max_tokens=128, n=256, k=128)
        c = MoeCase([60], 1, 256, 128, torch.bfloat16, 21)
        x, w, dr, dt, g, send, recv, tokens = c.args(DEVICE)
        bad = dt.clone()
        bad[5] = tokens
        op(x, w, dr, bad, g, send, recv, tokens)  # (no wait: the GPU finds the row)
        torch.cuda.synchronize()
        with self.assertRaisesRegex(InvalidArgument, rf"row 5 of an earlier call's routing goes to token {tokens}, "
                                                     r"outside \[0, tokens\)"):
            op.check()
        op.check()  # (reported once)
        gate = g.clone()
        gate[7] = float("inf")
        op(x, w, dr, dt, gate, send, recv, tokens)
        torch.cuda.synchronize()
        with self.assertRaisesRegex(InvalidArgument, "row 7 of an earlier call's routing has the gate inf, not finite"):
            op(*c.args(DEVICE))  # (the next call reports it, before it runs)
        good, worst = within(op(*c.args(DEVICE)), c.combine_ref(), c.combine_bound(1))
        self.ok(good, f"{op} after the bad rows: |diff| up to {worst}")
        self.assertIn("on the GPU", op.last_plan())
        op.close()

    @staticmethod
    def _last_message(op, *args):
        """The InvalidArgument a call raises (collective: every rank calls it)."""
        try:
            op(*args)
        except InvalidArgument as e:
            return e
        raise AssertionError("no InvalidArgument")


# ---- GemmAllToAll with several experts per rank (world 1) ----

class ExpertsCase:
    """One call's data at world 1 with `experts` experts: each token picks 0
    to topk distinct experts (none of `empty`, which get no rows), with a
    gate in [0.25, 1.5) each; x's rows come expert after expert (each
    expert's rows shuffled), counts[e] of them for expert e; every row goes
    back to rank 0. weight: (experts, n, k)."""

    def __init__(self, tokens, experts, topk, n, k, dtype, seed, empty=()):
        rng = random.Random(SEED * 37 + seed)
        allowed = [e for e in range(experts) if e not in empty]
        picks = [[] for _ in range(experts)]
        for t in range(tokens):
            for e in rng.sample(allowed, rng.randint(0, min(topk, len(allowed)))):
                picks[e].append((t, rng.uniform(0.25, 1.5)))
        for p in picks:
            rng.shuffle(p)
        self.tokens, self.experts, self.n, self.k, self.dtype = tokens, experts, n, k, dtype
        self.counts = [len(p) for p in picks]
        self.expert_of = [e for e in range(experts) for _ in picks[e]]  # (each row's expert, in x's order)
        rows = [r for p in picks for r in p]
        self.rows = len(rows)
        self.x = rand(self.rows, k, dtype=dtype, seed=seed * 101, per_rank=False)
        self.w = rand(experts, n, k, dtype=dtype, seed=seed * 103 + 50, per_rank=False)
        self.dest_rank = torch.zeros(self.rows, dtype=torch.int32)
        self.dest_token = torch.tensor([t for t, _ in rows], dtype=torch.int32)
        self.gate = torch.tensor([g for _, g in rows], dtype=torch.float32)
        # row i times its expert's weight, exactly in fp32
        starts = [sum(self.counts[:e]) for e in range(experts + 1)]
        parts = [self.x[starts[e]:starts[e + 1]].float() @ self.w[e].float().t() for e in range(experts)]
        self.y32 = torch.cat(parts) if parts else torch.zeros(0, n, device=DEVICE)

    def args(self, routing_on=None):
        """The call's arguments (expert_counts aside); routing_on: the device of dest_rank, dest_token and gate
        (None: the host's)."""
        on = (lambda t: t) if routing_on is None else (lambda t: t.to(routing_on))
        return (self.x, self.w, on(self.dest_rank), on(self.dest_token), on(self.gate), [self.rows], [self.rows],
                self.tokens)

    def combine_ref(self):
        """out[t] = the sum of gate * row over token t's rows, in fp32."""
        out = torch.zeros(self.tokens, self.n, device=DEVICE)
        out.index_add_(0, self.dest_token.to(DEVICE, torch.int64), self.gate.to(DEVICE)[:, None] * self.y32)
        return out

    def combine_of(self, rows):
        """The combine of the given received rows (of the dtype), in fp32 in their order, rounded once."""
        out = torch.zeros(self.tokens, self.n, device=DEVICE)
        for i, (t, g) in enumerate(zip(self.dest_token.tolist(), self.gate.tolist())):
            out[t] += torch.tensor(g, dtype=torch.float32) * rows[i].float()
        return out.to(self.dtype)

    def row_bound(self):
        """|a row of ours - the fp32 GEMM|: one rounding to the dtype, and fp32's accumulation."""
        ymax = self.y32.abs().max().item() if self.y32.numel() else 0.0
        return 2 * U[self.dtype] * ymax + 1e-5

    def combine_bound(self, topk):
        """|out - the fp32 combine|: each row's rounding, times its gate (< 1.5), over topk rows, then the
        output's own rounding."""
        ref = self.combine_ref()
        return 1.5 * topk * self.row_bound() + 2 * U[self.dtype] * (ref.abs().max().item() if ref.numel() else 0.0)


class AllToAllExperts(Case):
    def setUp(self):
        if WORLD != 1:
            self.skipTest("world 1 only (every row goes back to rank 0)")

    @staticmethod
    def make_moe(experts, topk=None, max_rows=1024, max_tokens=512, n=512, k=256, dtype=None, **kw):
        return fo.GemmAllToAll(None, max_rows, max_tokens, topk or experts, n, k, dtype or torch.bfloat16,
                               experts=experts, **kw)

    def test_against_the_fp32_reference(self):
        for experts, dtype in ((2, torch.bfloat16), (3, torch.bfloat16), (3, torch.float16)):
            topk = 2
            op = self.make_moe(experts, topk, dtype=dtype)
            self.assertEqual((op.experts, op.topk), (experts, topk))
            for seed, tokens, empty in ((1, 300, ()), (2, 77, (0,)), (3, 120, (experts - 1,)), (4, 1, ()),
                                        (5, 40, tuple(range(1, experts)))):
                c = ExpertsCase(tokens, experts, topk, 512, 256, dtype, seed, empty)
                what = f"{op} seed {seed}, counts {c.counts}"
                for on in (DEVICE, None):
                    out = op(*c.args(on), expert_counts=c.counts)
                    self.assertEqual((out.shape, out.dtype, out.device), ((tokens, 512), dtype, DEVICE))
                    good, worst = within(out, c.combine_ref(), c.combine_bound(topk))
                    self.ok(good, f"{what}, the routing on {on or 'the host'}: |combine - the fp32 reference| up "
                                  f"to {worst} ({op.last_plan()})")
                    rows, tok = op(*c.args(on), combine=False, expert_counts=c.counts)
                    self.assertEqual((rows.shape, tok.shape, tok.dtype), ((c.rows, 512), (c.rows,), torch.int32))
                    good, worst = within(rows, c.y32, c.row_bound())
                    self.ok(good, f"{what}: |received rows - the fp32 grouped GEMM| up to {worst}")
                    self.ok(torch.equal(tok.cpu(), c.dest_token), f"{what}: the received rows' tokens")
                    # (the combine of those very rows, each token's in x's order: within one rounding)
                    mine = c.combine_of(rows)
                    good, worst = within(out, mine, 2 * U[dtype] * mine.float().abs().max().item() + 1e-6)
                    self.ok(good, f"{what}: the combine against its own rows' up to {worst}")
            if RANK == 0:
                print(f"[test_gpu] {op}: last_plan = {op.last_plan()}", flush=True)
            op.close()

    def test_each_path(self):
        c = ExpertsCase(256, 3, 2, 512, 256, torch.bfloat16, 7, (1,))
        for path in ("sequential", "slots", "auto"):
            op = self.make_moe(3, 2, path=path)
            for on in (DEVICE, None):
                out = op(*c.args(on), expert_counts=c.counts)
                good, worst = within(out, c.combine_ref(), c.combine_bound(2))
                self.ok(good, f"path {path}, the routing on {on or 'the host'}: |combine - the fp32 reference| up "
                              f"to {worst} ({op.last_plan()})")
            op.check()
            op.close()

    def test_expert_counts_in_any_form(self):
        op = self.make_moe(3, 2)
        c = ExpertsCase(200, 3, 2, 512, 256, torch.bfloat16, 8, (2,))
        want = op(*c.args(), expert_counts=c.counts)
        want_rows, want_tok = op(*c.args(), combine=False, expert_counts=c.counts)
        for form in (tuple(c.counts), [c.counts], torch.tensor(c.counts), torch.tensor(c.counts, device=DEVICE),
                     torch.tensor([c.counts], dtype=torch.int32, device=DEVICE), torch.tensor([c.counts])):
            what = f"expert_counts as {type(form).__name__} {getattr(form, 'device', '')}"
            self.ok(torch.equal(op(*c.args(), expert_counts=form), want), f"{what}: the combine differs")
            rows, tok = op(*c.args(), combine=False, expert_counts=form)
            self.ok(torch.equal(rows, want_rows) and torch.equal(tok, want_tok), f"{what}: the rows differ")
        op.close()

    def test_one_expert_with_a_2d_or_3d_weight(self):
        op = fo.GemmAllToAll(None, 1024, 512, 1, 512, 256, torch.bfloat16)
        self.assertEqual(op.experts, 1)
        c = ExpertsCase(300, 1, 1, 512, 256, torch.bfloat16, 9)
        w2 = c.w[0]
        for on in (DEVICE, None):
            out2 = op(c.x, w2, *c.args(on)[2:])
            out3 = op(*c.args(on))  # ((1, n, k))
            self.ok(torch.equal(out2, out3), f"routing on {on or 'the host'}: (n, k) and (1, n, k) weights differ")
            good, worst = within(out2, c.combine_ref(), c.combine_bound(1))
            self.ok(good, f"one expert, routing on {on or 'the host'}: |combine - the fp32 reference| up to {worst}")
            rows2, tok2 = op(c.x, w2, *c.args(on)[2:], combine=False)
            rows3, tok3 = op(*c.args(on), combine=False)
            self.ok(torch.equal(rows2, rows3) and torch.equal(tok2, tok3), "(n, k) and (1, n, k): the rows differ")
            good, worst = within(rows2, F.linear(c.x, w2), gemm_bound(c.x, w2, torch.bfloat16))
            self.ok(good, f"one expert: |received rows - F.linear| up to {worst}")
        with self.assertRaisesRegex(InvalidArgument, "expert_counts is for several experts per rank; this op has one"):
            op(*c.args(), expert_counts=[c.rows])
        op.close()

    def test_functional_with_a_3d_weight(self):
        fo.clear_cache()
        c = ExpertsCase(100, 2, 2, 256, 128, torch.float16, 10, (1,))
        with self.assertRaisesRegex(InvalidArgument, "topk is required with a 3-D weight"):
            fo.gemm_all_to_all(*c.args()[:7], None, c.tokens, expert_counts=c.counts)
        for _ in range(2):
            out = fo.gemm_all_to_all(*c.args()[:7], None, c.tokens, expert_counts=c.counts, topk=2)
            good, worst = within(out, c.combine_ref(), c.combine_bound(2))
            self.ok(good, f"gemm_all_to_all with 2 experts: |diff| up to {worst}")
        self.assertEqual(len(fo._a2a_cache), 1)
        op = next(iter(fo._a2a_cache.values()))
        self.assertEqual((op.experts, op.topk, op.world), (2, 2, 1))
        rows, tok = fo.gemm_all_to_all(*c.args()[:7], None, c.tokens, False, expert_counts=c.counts, topk=2)
        self.ok(torch.equal(tok.cpu(), c.dest_token), "gemm_all_to_all with 2 experts: tokens")
        # one expert's weight, 2-D: another op (the experts are part of its key)
        one = ExpertsCase(100, 1, 1, 256, 128, torch.float16, 11)
        fo.gemm_all_to_all(one.x, one.w[0], *one.args()[2:7], None, one.tokens)
        self.assertEqual(sorted(op.experts for op in fo._a2a_cache.values()), [1, 2])
        with self.assertRaisesRegex(InvalidArgument, r"^gemm_all_to_all: experts = 3, but weight \(2, 256, 128\) "
                                                     "holds 2 experts' weights"):
            fo.gemm_all_to_all(*c.args()[:7], None, c.tokens, expert_counts=c.counts, experts=3, topk=2)
        fo.clear_cache()

    def test_opcheck(self):
        op = self.make_moe(2, 2, max_rows=256, max_tokens=128, n=256, k=128)
        c = ExpertsCase(60, 2, 2, 256, 128, torch.bfloat16, 12)
        x, w, dr, dt, g, send, recv, tokens = c.args()
        for name in ("gemm_all_to_all", "gemm_all_to_all_rows"):
            torch.library.opcheck(getattr(torch.ops.flashoverlap, name).default,
                                  (x, w, dr, dt, g, send, recv, tokens, op.handle, c.counts),
                                  test_utils=("test_schema", "test_faketensor"))
        op.close()

    def test_bad_input(self):
        op = self.make_moe(2, 2, max_rows=256, max_tokens=128, n=256, k=128)
        name = str(op)
        c = ExpertsCase(60, 2, 2, 256, 128, torch.bfloat16, 13)
        x, w, dr, dt, g, send, recv, tokens = c.args()
        a, b = c.counts
        # (refused here before any work: the same on every rank)
        for weight, counts, message in (
                (w[0], c.counts, "weight has shape (256, 128), expected (2, 256, 128): the 2 experts' weights "
                                 "stacked (experts, n, k)"),
                (w[:1].contiguous(), c.counts, "weight has shape (1, 256, 128), expected (2, 256, 128)"),
                (w.transpose(1, 2).contiguous().transpose(1, 2), c.counts, "weight is not contiguous"),
                (w, None, "expert_counts is required with 2 experts per rank"),
                (w, [a + b], "expert_counts has 1 entries, expected world x experts = 1 x 2 = 2 ints"),
                (w, [a + b + 1, -1], "expert_counts[1] = -1 (rank 0, expert 1) is negative"),
                (w, [a, b + 1], f"expert_counts of rank 0 ([{a}, {b + 1}]) sum to {a + b + 1}, but send_counts[0] = "
                                f"{a + b}"),
                (w, torch.tensor([a, b], dtype=torch.float32), "expert_counts must be an integer tensor")):
            with self.assertRaises(InvalidArgument) as cm:
                op(x, weight, dr, dt, g, send, recv, tokens, expert_counts=counts)
            self.assertTrue(str(cm.exception).startswith(f"{name}: {message}"), str(cm.exception))
        # still usable after the refusals
        good, worst = within(op(*c.args(), expert_counts=c.counts), c.combine_ref(), c.combine_bound(2))
        self.ok(good, f"{op} after the refusals: |diff| up to {worst}")
        op.close()
        for kw, message in (({"experts": 0}, "^GemmAllToAll: experts = 0: needs experts >= 1"),
                            ({"experts": 2, "topk": 3}, r"^GemmAllToAll: topk = 3: needs 1 <= topk <= the world size 1 "
                                                        "x 2 experts per rank = 2")):
            args = dict(topk=1)
            args.update(kw)
            topk = args.pop("topk")
            with self.assertRaisesRegex(InvalidArgument, message):
                fo.GemmAllToAll(None, 256, 128, topk, 256, 128, torch.bfloat16, **args)


if __name__ == "__main__":
    unittest.main()


class Grouped(Case):
    """GroupedGemm: every path, the counts on the host and the offsets on the GPU, against each expert's
    F.linear in fp32 (within two roundings of the largest product); Auto's torch._grouped_mm candidate
    named in last_plan where it runs."""

    def test_every_path_computes_each_experts_rows(self):
        experts, n, k = 5, 384, 256
        w = rand(experts, n, k, dtype=torch.bfloat16, seed=71)
        g = torch.Generator().manual_seed(SEED + 3)
        for path in ("auto", "ours", "cublas"):
            op = fo.GroupedGemm(2048, experts, n, k, torch.bfloat16, path=path)
            for trial in range(4):
                counts = torch.randint(0, 400, (experts,), generator=g).tolist()
                counts[trial % experts] = 0  # (an expert without rows)
                rows = sum(counts)
                x = rand(rows, k, dtype=torch.bfloat16, seed=100 + trial)
                starts = [0] + list(itertools.accumulate(counts))
                ref = torch.cat([F.linear(x[starts[e]:starts[e + 1]].float(), w[e].float()) for e in range(experts)])
                bound = 2 * U[torch.bfloat16] * (ref.abs().max().item() + 1e-6) + 1e-6
                offs = torch.tensor(starts[1:], dtype=torch.int32, device=DEVICE)
                for form, y in (("counts", op(x, w, counts)), ("offs", op(x, w, offs=offs))):
                    torch.cuda.synchronize()
                    ok, worst = within(y, ref, bound)
                    self.ok(ok, f"{path} {form} trial {trial}: {worst} beyond {bound} ({op.last_plan()})")
                    if path != "auto":
                        self.ok("torch._grouped_mm" not in op.last_plan(), f"{path} ran {op.last_plan()}")
            op.check()
