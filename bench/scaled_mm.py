#!/usr/bin/env python3
"""torch._scaled_mm on the shapes of a `flashoverlap-lab bench-fp8` CSV, and
the table of ours against it:

    python3 bench/scaled_mm.py --ours gemm-fp8-lab.csv [--kernels build/tools/libflashoverlap_kernel_bench.so]
        [--out gemm-fp8-h100.csv] [--runs 20] [--warmup 5]

Per row of the lab's CSV (M, N, K, scales, ours_ms: our GEMM with e4m3
inputs, the kernel alone on the fastest of its tiles (ours_tile), timed by
the lab on the same GPU just before: runs of 20 launches back to back, its
stream held until the host had queued the run), torch._scaled_mm(a, b.t(), scale_a, scale_b,
out_dtype=torch.bfloat16) with use_fast_accum=False and True, timed the same
way: in turns, per turn --runs calls between CUDA events queued behind a GPU
sleep (torch_timing.device_ms_in_turns), the median over 5 turns: the
kernels' time, not Python's dispatch (which at M = 256 takes longer than the
kernel). Beside them, use_fast_accum=False called eagerly (host included) for
reference. With --kernels (libflashoverlap_kernel_bench.so: the lab's
launch behind a C interface), ours is timed here instead, in the same turns
as torch's calls (the ops' tiles, stream-K where the lab's rule puts
it; ours the fastest tile), each of its outputs first checked against
torch._scaled_mm's: one process, one timing, the same duty cycle, so the
GPU's clocks and power state are the same for both (the lab runs its
variants back to back without pause, and a GPU kept busy runs slower than
one given pauses: docs/results.md §4e.2); the lab's time stays beside it
(ours_lab_ms). Scales as torch takes them: per tensor one fp32 each; row-wise
scale_a [M, 1] and scale_b [1, N]. Inputs random e4m3 in +-[1/8, 4] (as the
lab's), scales in [0.5, 2].

The CSV starts with a "#" line (GPU, torch, date), then
M,N,K,scales,ours_ms,scaled_mm_ms,scaled_mm_fast_ms,ours_tflops,ratio
(scaled_mm_ms / ours_ms: above 1, ours is faster),ours_tile,scaled_mm_eager_ms,
scaled_mm_kernel (the kernel torch._scaled_mm ran on that row, from a
profiler trace of one call),ours_lab_ms (with --kernels: the lab's time of
ours; ours_ms is then this process's).
"""
import argparse
import ctypes
import csv
import datetime
import statistics
import sys

import torch

from torch_timing import device_ms_in_turns, time_in_turns

COLUMNS = ["M", "N", "K", "scales", "ours_ms", "scaled_mm_ms", "scaled_mm_fast_ms", "ours_tflops", "ratio", "ours_tile",
           "scaled_mm_eager_ms", "scaled_mm_kernel", "ours_lab_ms"]

SCALE_KINDS = {"none": 0, "tensor": 1, "row": 2}


class OurFp8Gemm:
    """Our FP8 GEMM alone (libflashoverlap_kernel_bench.so) into c, on the
    current stream: C = scale(x w^T), tile_m x tile_n tiles, stream-K where the
    lab's rule puts it (stream_k 1: plan::stream_k_split's splits on the
    in-step grid; 0: never; 2: the pair split, GemmParams::pair_k, where two
    CTAs a tile fit the SMs; 3: the tail split, plan::stream_k_tail_split,
    where the tiles fill more than a wave and the last is partial); pdl: as
    programmatic dependent launches."""

    lib = None

    @classmethod
    def load(cls, path):
        cls.lib = ctypes.CDLL(path)
        vp, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        cls.lib.fobk_fp8_gemm_create.argtypes = [i64, i64, i64, c_int, vp, vp, vp, vp, vp, c_int, c_int, c_int, c_int,
                                                 ctypes.POINTER(vp), ctypes.c_char_p, c_int]
        cls.lib.fobk_fp8_gemm_launch.argtypes = [vp, vp, ctypes.c_char_p, c_int]
        cls.lib.fobk_fp8_gemm_split.argtypes = [vp]
        cls.lib.fobk_fp8_gemm_destroy.argtypes = [vp]

    def __init__(self, x, w, c, kind, sa, sb, tile, stream_k=1, pdl=False):
        self.keep = (x, w, c, sa, sb)  # (the device memory the handle points at)
        self.err = ctypes.create_string_buffer(512)
        self.h = ctypes.c_void_p()
        m, k = x.shape
        n = w.shape[0]
        if self.lib.fobk_fp8_gemm_create(m, n, k, SCALE_KINDS[kind], x.data_ptr(), w.data_ptr(), c.data_ptr(),
                                         sa.data_ptr(), sb.data_ptr(), tile[0], tile[1], stream_k, int(pdl),
                                         ctypes.byref(self.h), self.err, 512):
            raise RuntimeError(f"our FP8 GEMM {m}x{n}x{k} {tile[0]}x{tile[1]}: {self.err.value.decode()}")
        self.split = int(self.lib.fobk_fp8_gemm_split(self.h))  # (0 whole tiles, 1 stream-K, 2 the pair split)

    def __call__(self):
        if self.lib.fobk_fp8_gemm_launch(self.h, torch.cuda.current_stream().cuda_stream, self.err, 512):
            raise RuntimeError(f"our FP8 GEMM: {self.err.value.decode()}")

    def close(self):
        self.lib.fobk_fp8_gemm_destroy(self.h)


def random_e4m3(rows, cols, dev, gen):
    """Random e4m3 of magnitudes 2^-3 .. 2^2, any sign (no NaN)."""
    mag = torch.exp2(torch.randint(-3, 3, (rows, cols), generator=gen, device="cpu").float())
    mag *= 1 + torch.randint(0, 8, (rows, cols), generator=gen).float() / 8
    sign = torch.randint(0, 2, (rows, cols), generator=gen).float() * 2 - 1
    return (mag * sign).to(dev).to(torch.float8_e4m3fn)


def kernels_of(fn):
    """The CUDA kernels one call of fn runs, from a profiler trace."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.key for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    return " + ".join(n[:120] for n in names) or "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ours", required=True, help="the lab's bench-fp8 CSV")
    ap.add_argument("--kernels", help="libflashoverlap_kernel_bench.so: time ours here, in turns with torch")
    ap.add_argument("--pdl", action="store_true",
                    help="with --kernels: ours launched as programmatic dependent launches")
    ap.add_argument("--tiles", default="112,128,144,160,192",
                    help="with --kernels: our tiles timed in turns, ours the fastest: 128-row tiles by their width "
                         "(default the ops' tiles), the 64-row ones (kernel tiles the ops do not plan with) as 64x48 "
                         "and 64x144")
    ap.add_argument("--pair", action="store_true",
                    help="with --kernels: each tile also with the pair split (GemmParams::pair_k) where it fits, "
                         "timed in the same turns")
    ap.add_argument("--tail", action="store_true",
                    help="with --kernels: each tile also with the tail split (plan::stream_k_tail_split) where the "
                         "tiles fill more than a wave and the last is partial, timed in the same turns")
    ap.add_argument("--out", help="CSV file (default: stdout)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("scaled_mm.py: no CUDA GPU: nothing to measure")
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        sys.exit(f"scaled_mm.py: torch {torch.__version__} has no torch._scaled_mm")
    with open(a.ours) as f:
        ours = list(csv.DictReader(line for line in f if not line.startswith("#")))
    if not ours:
        sys.exit(f"scaled_mm.py: no rows in {a.ours}")
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator().manual_seed(1)
    known = {"112": (128, 112), "128": (128, 128), "144": (128, 144), "160": (128, 160), "192": (128, 192),
             "64x48": (64, 48), "64x144": (64, 144)}
    names = [t.strip().removeprefix("128x") for t in a.tiles.split(",") if t.strip()]
    if not names or any(t not in known for t in names):
        sys.exit(f"scaled_mm.py: --tiles takes 112, 128, 144, 160 and 192 (128-row tiles), and 64x48 and 64x144 "
                 f"(got '{a.tiles}')")
    tile_list = [known[t] for t in names]
    if a.kernels:
        OurFp8Gemm.load(a.kernels)
    rows = []
    wrong = 0
    for r in ours:
        m, n, k, kind = int(r["M"]), int(r["N"]), int(r["K"]), r["scales"]
        x, w = random_e4m3(m, k, dev, gen), random_e4m3(n, k, dev, gen)
        if kind == "row":
            sa = (torch.rand(m, 1, generator=gen) * 1.5 + 0.5).to(dev)
            sb = (torch.rand(1, n, generator=gen) * 1.5 + 0.5).to(dev)
        else:  # (tensor; "none" as unit scales)
            sa = (torch.rand((), generator=gen) * 1.5 + 0.5).to(dev) if kind == "tensor" else torch.ones((), device=dev)
            sb = (torch.rand((), generator=gen) * 1.5 + 0.5).to(dev) if kind == "tensor" else torch.ones((), device=dev)
        wt = w.t()

        def call(fast, x=x, wt=wt, sa=sa, sb=sb):
            return torch._scaled_mm(x, wt, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast)

        kernel = kernels_of(lambda: call(False))
        lab_ms = float(r["ours_ms"])
        tile = r.get("ours_tile") or ""
        tile = tile if "x" in tile or not tile else f"128x{tile}"  # (the lab writes 64-row tiles as 64xN)
        if a.kernels:
            ref = call(False).float()
            gemms, labels = [], []
            splits = (1,) + ((2,) if a.pair else ()) + ((3,) if a.tail else ())
            for tile_mn, stream_k in [(t, s) for t in tile_list for s in splits]:
                c = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
                g = OurFp8Gemm(x, w, c, kind, sa.contiguous(), sb.contiguous(), tile_mn, stream_k, a.pdl)
                if (stream_k == 2 and g.split != 2) or (stream_k == 3 and g.split != 1):
                    g.close()  # (two CTAs a tile do not fit, or no partial last wave: that variant is the whole one)
                    continue
                suffix = {0: "", 1: "/tail" if stream_k == 3 else "/sk", 2: "/pair"}[g.split]
                labels.append(f"{tile_mn[0]}x{tile_mn[1]}" + suffix)
                g()
                err = ((c.float() - ref).norm() / ref.norm()).item()
                if not err < 5e-3:  # (bf16's rounding: ~1e-3 between two fp32-summing kernels)
                    wrong += 1
                    print(f"WRONG: {m}x{n}x{k} {kind} {labels[-1]}: ours differs from torch._scaled_mm's by "
                          f"{err:.2e} (relative L2)", file=sys.stderr, flush=True)
                gemms.append(g)
            times = device_ms_in_turns(gemms + [lambda: call(False), lambda: call(True)], a.runs, 5,
                                       warmup=a.warmup)
            best = min(range(len(gemms)), key=lambda i: times[i])
            ours_ms, (slow_ms, fast_ms) = times[best], times[len(gemms):]
            tile = labels[best]
            per_tile = "; ".join(f"{t} {ms:.4f}" for t, ms in zip(labels, times))
            for g in gemms:
                g.close()
        else:
            slow_ms, fast_ms = device_ms_in_turns([lambda: call(False), lambda: call(True)], a.runs, 5,
                                                  warmup=a.warmup)
            ours_ms = lab_ms
            per_tile = ""
        eager_ms = time_in_turns([lambda: call(False)], a.runs, 5, warmup=a.warmup)[0]
        rows.append([m, n, k, kind, f"{ours_ms:.4f}", f"{slow_ms:.4f}", f"{fast_ms:.4f}",
                     f"{2.0 * m * n * k / ours_ms / 1e9:.1f}", f"{slow_ms / ours_ms:.3f}", tile, f"{eager_ms:.4f}",
                     kernel, f"{lab_ms:.4f}"])
        print(f"{m}x{n}x{k} {kind}: ours {ours_ms:.4f} ms ({tile}; lab {lab_ms:.4f}), _scaled_mm {slow_ms:.4f} ms "
              f"(fast {fast_ms:.4f}), ratio {slow_ms / ours_ms:.3f}; eager {eager_ms:.4f} ms; {kernel}"
              + (f"; ours per tile: {per_tile}" if per_tile else ""),
              file=sys.stderr, flush=True)
    out = open(a.out, "w", newline="") if a.out else sys.stdout
    out.write(f"# gpu={torch.cuda.get_device_name(dev)}; torch={torch.__version__}; "
              f"date={datetime.datetime.now().isoformat(timespec='seconds')}; "
              + (f"ours (our kernel alone, libflashoverlap_kernel_bench.so) and torch._scaled_mm timed in this "
                 f"process in turns, behind a GPU sleep (device time); ours_lab_ms from {a.ours}\n" if a.kernels else
                 f"ours from {a.ours} (flashoverlap-lab bench-fp8: our kernel alone); torch._scaled_mm timed behind "
                 f"a GPU sleep (device time)\n"))
    wr = csv.writer(out)
    wr.writerow(COLUMNS)
    wr.writerows(rows)
    ratios = [float(r[8]) for r in rows]
    at256 = [float(r[8]) for r in rows if r[0] >= 256]
    below = sum(1 for x in at256 if x < 0.90)
    print(f"ratio median {statistics.median(ratios):.3f} over {len(ratios)} rows; min at M >= 256 "
          f"{min(at256) if at256 else float('nan'):.3f}; {below} rows at M >= 256 below 0.90", file=sys.stderr)
    if wrong:
        sys.exit(f"scaled_mm.py: {wrong} of our launches differ from torch._scaled_mm's output (above)")


if __name__ == "__main__":
    main()
