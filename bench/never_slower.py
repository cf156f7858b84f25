#!/usr/bin/env python3
"""Never slower: the library's public PyTorch ops, built and called as users
build and call them, against what PyTorch users run instead; one process per
GPU (world 1 is the main case):

    python3 -m torch.distributed.run --standalone --nproc-per-node=W bench/never_slower.py
        [--ops allreduce,reducescatter,alltoall] [--pairs "N,K;N,K"] [--ms 1,2,8,...] [--dtypes bf16,fp16,fp8]
        [--modes eager,graph,latency] [--turns 6] [--quick] [--kernels] [--tuning-cache FILE]
        [--out-dir bench/results] [--row-budget-ms 1000]
    python3 bench/never_slower.py --self-test      # the pure helpers, on the CPU, without torch

Ops, ours | PyTorch's (x: m x k, w: n x k, random in [-1, 1), different on every rank):
  allreduce      op = fo.GemmAllReduce(None, max_m, n, k, dtype); op(x, w)
                 | y = F.linear(x, w); dist.all_reduce(y)
  reducescatter  rs = fo.GemmReduceScatter(None, max_m, n, k, dtype); rs(x, w)
                 | y = F.linear(x, w); out = torch.empty(m // W, n); dist.reduce_scatter_tensor(out, y)
                 m must be a multiple of the world size W: at W > 1 every m is rounded up to one.
                 At W > 1 also rows of op "rs-async-tp": ours against PyTorch's Async-TP,
                 torch.ops.symm_mem.fused_matmul_reduce_scatter(x, w.t(), "sum", 0, group) (symmetric memory
                 enabled for the world group; --no-async-tp leaves them out; bf16 and fp16 only).
  alltoall       fo.GemmAllToAll(None, max_rows, max_tokens, topk, n, k, dtype), the MoE combine, called
                 with the routing on the device, as a dispatch leaves it
                 | bench/torch_alltoall.py's torch-sequential (F.linear, all_to_all_single, index_add_
                 combine), its routing draws and expert rows imported from there. One expert per rank,
                 so topk <= W: topk 2 at W > 2, else 1 (at W = 2 a top-2 token goes to both ranks, whatever
                 the routing). Tokens per rank 128, 1024 and 8192, routed "uniform" and "zipf:1.2"; at world
                 1 every routing sends every row to the one rank, so both rows measure the same thing (both
                 are emitted all the same). Shapes: torch_alltoall.py's expert GEMMs (--pairs replaces
                 them); m = the largest expert's rows.
                 Then, at world 1 (without --pairs), several experts per rank: GemmAllToAll(..., experts=E)
                 with a [E, n, k] weight and each call's expert_counts | torch._grouped_mm + all_to_all_single
                 + the weighted index_add_, on the experts a rank holds in Mixtral-8x7B at EP 2 (4 of n 4096,
                 k 14336, top-2), Qwen3-30B-A3B (16 of 2048 x 768, top-8) and DeepSeek-V3 (32 of 7168 x 2048,
                 top-8) at EP 8, 128, 1024 and 4096 tokens, uniform and Zipf(1.2) loads (A2A_EXPERTS); m =
                 the rows.
  fp8 rows   (--dtypes fp8) the op built with input="e4m3", scales="row"; op(x, w, scale_a=sa, scale_b=sb)
                 with x, w torch.float8_e4m3fn (random in [-1, 1) rounded to e4m3) and sa (m), sb (n) in
                 [0.5, 1) | y = torch._scaled_mm(x, w.t(), sa (m, 1), sb (1, n), out_dtype=bf16,
                 use_fast_accum=False), then the collective as above (alltoall: one expert per rank, its
                 rows' pipeline with torch._scaled_mm for F.linear; pairs with n or k not a multiple of 16
                 left out: torch._scaled_mm refuses them); graph rows capture both sides' FP8 calls as the
                 16-bit rows do.
max_m (max_rows, max_tokens) is the largest of the run: one op per (op, n, k, dtype), closed after it.

Default (n, k): the GEMMs before tensor parallelism's AllReduce in real models (PAIRS below), bf16, and
8192 x 8192 in fp16 too, each at m in 1, 2, 8, 32, 128, 512, 2048, 8192. --pairs / --ms / --dtypes
replace them (--dtypes: every pair in every dtype); --quick: 3 pairs (and the fp16 one), m in 1, 32, 2048.

Modes, a row each per (op, m, n, k, dtype):
  eager    device time per call: per turn and variant one torch.cuda._sleep of >= 50 ms, then that
           variant's N calls back to back between CUDA events: ms = elapsed / N (one variant per sleep: a
           stream queues about a thousand kernels and copies before the host blocks, and two variants'
           calls behind one sleep would charge the second variant the first one's queue). The sleep's cycles
           come from the GPU's clock (torch.cuda.clock_rate(), else 2 GHz; a timed sleep's where faster;
           raised where a turn's sleep came out shorter). The GPU never waits on the host: a turn whose
           sleep ended before the host had enqueued everything is run again with a sleep twice as long.
           N = 200, fewer (>= 10) where 200 calls would take more than the row's device budget
           (--row-budget-ms over both variants and all turns, from a warm-up call's time): the big
           GEMMs, whose device time dominates.
  graph    allreduce and reducescatter: op.prepare(m) (the ops refuse to plan under capture), warm-up on a
           side stream, 10 calls captured into a torch.cuda.CUDAGraph (torch.cuda.graph), and 10 calls of
           PyTorch's into its own; per turn R replays of each behind a sleep of its own (>= 10 ms): ms per call = elapsed /
           (10 R), R <= 20 by the same budget. Where PyTorch's capture fails the row records its error
           (plan column) and has no times. Ours' last replay output is checked as the eager call's.
  latency  one call, host included: synchronize; t0; f(); synchronize; per turn ceil(120 / turns)
           calls of each variant, alternating call by call, the median per turn, then the median over
           turns, in us. alltoall: latency, and eager at world 1 only: at W > 1 its call syncs the host
           (the ranks exchange their routings and plan on the host), so that calls cannot queue behind a
           sleep; at world 1 with the routing on the GPU nothing waits. CUDA graphs are refused by it.
  Host time per call (host_torch_us, host_ours_us; eager rows only, empty in the others): the wall
           time of enqueuing the eager turn's N calls while the GPU sleeps, / N, the median over the
           turns (6 by default, each after a synchronize): 200 calls behind the sleep, fewer for the
           largest GEMMs (N above: a call's enqueueing costs the host the same whatever its device time).
Turns: every measurement alternates PyTorch's and ours in turns (an even number, at least 6; the
first of a turn swapped every turn, so that each goes first after the sleep equally often) and
reports the median over turns; with several ranks, the slowest rank's (bench/torch_timing.py's
slowest()). All ranks run the same sequence: every branch a rank could take
alone (an error, a retried turn, N) is agreed on with an all_reduce first.

Checks, first, per (op, shape, m): ours against PyTorch's output, elementwise within bf16's bound of
a sum of W k products (fp16's rows too; bench/torch_linear.py's: 2^-7 relative on the reference's
magnitude plus W k 2^-9); alltoall within torch_alltoall.py's bound (max error <= 2^-5 topk
max|reference|). A failure is printed and recorded (the plan column, the JSON), the row still timed,
and the script exits 1 at the end (as for an error of ours: an exception in a row is recorded as its
plan, "error: ...", and the run goes on; PyTorch's failed capture is recorded alike, exit unaffected).

Output (rank 0): DIR/never-slower-<gpu>.csv (<gpu>: h100, h200 or the device name's lowercase letters
and digits; "x<W>" appended at W > 1), rows written as they are measured; columns op, m, n, k, dtype,
mode, torch_us, ours_us, ratio (torch_us / ours_us: above 1, ours is faster), host_torch_us,
host_ours_us, plan (ours' op.plan(m); alltoall: last_plan()), routing, topk, tokens (alltoall only).
Beside it never-slower-<gpu>.json: the machine (GPU, world, torch, CUDA, NCCL, the library's version),
date, host, command line, and the summary printed at the end: per op and mode the worst ratio and its
row and the rows below the bar (eager and graph 0.98, latency 0.95); per op the worst host_ours_us -
host_torch_us. --kernels first lists the CUDA kernels (with their device time) one F.linear call
(fp8 in --dtypes: also torch._scaled_mm's) and one call of each dense op runs, for a few (n, k, m),
eager and (graph in --modes) as one replay of a captured call, into never-slower-kernels-<gpu>.txt
(--modes none: only the eager calls').

Budget: the AllReduce and ReduceScatter rows of the default run (480) took 177 s on one H200 at world 1
(6 turns, --row-budget-ms 250: the defaults), the All-to-All's 18 rows 12 s; --quick about a minute.
Needs torch with CUDA and a Hopper GPU (exit 2 otherwise, with a one-line reason).
"""
import argparse
import csv
import datetime
import json
import math
import os
import re
import shlex
import socket
import statistics
import sys
import tempfile
import time

try:  # (not needed by --self-test)
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch_timing import join_nccl_group, machine_line, slowest, timed_sleep_cycles_per_ms
except ImportError:
    torch = None

HERE = os.path.dirname(os.path.abspath(__file__))
OPS = ("allreduce", "reducescatter", "alltoall")
MODES = ("eager", "graph", "latency")
DTYPES = ("bf16", "fp16", "fp8")  # (fp8: e4m3 inputs, row-wise scales, bf16 out; not the All-to-All)
PAIRS = [  # (n, k) of the GEMM before the collective
    (4096, 4096),    # Llama-3-8B o_proj
    (4096, 14336),   # Llama-3-8B down_proj
    (8192, 8192),    # Llama-3-70B o_proj
    (8192, 3584),    # Llama-3-70B down_proj at TP 8
    (5120, 13824),   # Qwen2.5-32B down_proj at TP 2
    (5120, 5120),    # Qwen2.5-32B o_proj
    (4096, 7168),    # Mixtral-8x7B down_proj at TP 2
    (7168, 2304),    # DeepSeek-V3 dense MLP down_proj at TP 8
    (5000, 8192),    # an n that no tile width divides
]
EXTRA = [(8192, 8192, "fp16")]  # beside the bf16 pairs in the default and quick sets
MS = [1, 2, 8, 32, 128, 512, 2048, 8192]
QUICK_PAIRS = [(4096, 4096), (8192, 8192), (5000, 8192)]
QUICK_MS = [1, 32, 2048]
A2A_TOKENS = [128, 1024, 8192]
A2A_ROUTINGS = ["uniform", "zipf:1.2"]
# Several experts per rank (world 1): (n, k, experts per rank, top-k) of the experts a rank holds in
# Mixtral-8x7B at EP 2, Qwen3-30B-A3B and DeepSeek-V3 at EP 8, and the tokens of a call.
A2A_EXPERTS = [(4096, 14336, 4, 2), (2048, 768, 16, 8), (7168, 2048, 32, 8)]
A2A_EXPERT_TOKENS = [128, 1024, 4096]
KERNEL_SHAPES = [(8192, 8192, 1), (8192, 8192, 32), (8192, 8192, 512), (8192, 8192, 4096), (5120, 13824, 8)]
COLUMNS = ["op", "m", "n", "k", "dtype", "mode", "torch_us", "ours_us", "ratio", "host_torch_us", "host_ours_us",
           "plan", "routing", "topk", "tokens"]
BARS = {"eager": 0.98, "graph": 0.98, "latency": 0.95}  # a ratio below its mode's bar: ours slower
GRAPH_CALLS = 10  # calls captured per graph
LATENCY_CALLS = 120  # latency samples per variant, over all turns
# The sleep before each variant's calls: eager's at least 50 ms, so that the GPU never waits on the host; a graph turn's
# 20 replays enqueue in well under a millisecond. Doubled (to at most MAX) where too short.
SLEEP_MS, MAX_SLEEP_MS = {"eager": 50.0, "graph": 10.0}, 800.0


# ---- the pure helpers (--self-test checks them) ----

def gpu_slug(name):
    """'h100' or 'h200' where the device name says so, else its lowercase letters and digits."""
    if "H100" in name:
        return "h100"
    if "H200" in name:
        return "h200"
    return re.sub(r"[^a-z0-9]", "", name.lower()) or "gpu"


def out_paths(out_dir, slug, world):
    """(CSV, JSON, kernel list) paths; "x<W>" appended to the slug at W > 1, so
    that runs at several world sizes keep their own files."""
    tag = slug + (f"x{world}" if world > 1 else "")
    return (os.path.join(out_dir, f"never-slower-{tag}.csv"), os.path.join(out_dir, f"never-slower-{tag}.json"),
            os.path.join(out_dir, f"never-slower-kernels-{tag}.txt"))


def parse_pairs(text):
    """'N,K;N,K' -> [(n, k), ...]; ValueError unless n >= 1 and k a positive multiple of 8 (the ops' rows)."""
    pairs = []
    for item in filter(None, (v.strip() for v in text.split(";"))):
        parts = [p.strip() for p in item.split(",")]
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"bad --pairs item '{item}' (expected \"N,K;N,K;...\")")
        n, k = int(parts[0]), int(parts[1])
        if n < 1 or k < 8 or k % 8:
            raise ValueError(f"bad --pairs item '{item}': n >= 1 and k a positive multiple of 8")
        pairs.append((n, k))
    if not pairs:
        raise ValueError(f"bad --pairs '{text}': no pair")
    return pairs


def parse_ms(text):
    """'1,2,8' -> [1, 2, 8] (each >= 1, duplicates dropped, order kept)."""
    ms = []
    for v in filter(None, (v.strip() for v in text.split(","))):
        if not v.isdigit() or int(v) < 1:
            raise ValueError(f"bad --ms value '{v}' (positive integers)")
        if int(v) not in ms:
            ms.append(int(v))
    if not ms:
        raise ValueError(f"bad --ms '{text}': no m")
    return ms


def parse_choice(text, allowed, what):
    """'a,b' -> ['a', 'b'], each one of allowed; 'none' -> []."""
    if text.strip() == "none":
        return []
    got = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in got if v not in allowed]
    if bad or not got:
        raise ValueError(f"bad --{what} '{text}' (a comma-separated subset of {', '.join(allowed)}, or none)")
    return list(dict.fromkeys(got))


def round_ms(op, ms, world):
    """The m's op runs: reducescatter's rounded up to multiples of the world size (duplicates dropped)."""
    if op != "reducescatter":
        return list(ms)
    return list(dict.fromkeys(-(-m // world) * world for m in ms))


def parse_args(argv):
    """The options, with the run's sets resolved: combos [(n, k, dtype)] of
    the dense ops, ms, a2a_pairs (None: torch_alltoall.py's shapes; quick:
    its first) and a2a_dtypes."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default=",".join(OPS), help="allreduce,reducescatter,alltoall (or a subset)")
    ap.add_argument("--pairs", default="", help='"N,K;N,K" (default: PAIRS, the real models\' GEMMs)')
    ap.add_argument("--ms", default="", help="m values, comma-separated (default 1,2,8,32,128,512,2048,8192)")
    ap.add_argument("--dtypes", default="", help="bf16,fp16: every pair in each (default: bf16, 8192x8192 fp16 too)")
    ap.add_argument("--modes", default=",".join(MODES), help="eager,graph,latency (or a subset, or none)")
    ap.add_argument("--turns", type=int, default=6,
                    help="turns per measurement (even, >= 6: each variant goes first after the sleep in half)")
    ap.add_argument("--quick", action="store_true", help="3 pairs at m 1, 32, 2048: a smoke run")
    ap.add_argument("--kernels", action="store_true",
                    help="list the CUDA kernels (and their device time) of PyTorch's and of ours first, eager and "
                         "as a graph replay")
    ap.add_argument("--no-async-tp", action="store_true",
                    help="at world > 1, leave out the ReduceScatter's rows against PyTorch's Async-TP")
    ap.add_argument("--tuning-cache", default="", help="a tuning cache FILE for the ops")
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    ap.add_argument("--row-budget-ms", type=float, default=250.0,
                    help="device time per eager or graph row, both variants, all turns (sets N and R)")
    args = ap.parse_args(argv)
    try:
        args.ops = parse_choice(args.ops, OPS, "ops")
        args.modes = parse_choice(args.modes, MODES, "modes")
        dtypes = parse_choice(args.dtypes, DTYPES, "dtypes") if args.dtypes else []
        pairs = parse_pairs(args.pairs) if args.pairs else (QUICK_PAIRS if args.quick else PAIRS)
        args.ms = parse_ms(args.ms) if args.ms else (QUICK_MS if args.quick else MS)
    except ValueError as e:
        ap.error(str(e))
    if args.turns < 6 or args.turns % 2:
        # (odd: one variant would go first after the sleep once more than the other, and the first run
        # after an idle GPU meets other clocks)
        ap.error("--turns must be even and >= 6")
    if args.row_budget_ms <= 0:
        ap.error("--row-budget-ms must be > 0")
    if dtypes:
        args.combos = [(n, k, d) for n, k in pairs for d in dtypes]
    else:
        args.combos = [(n, k, "bf16") for n, k in pairs] + ([] if args.pairs else EXTRA)
    args.a2a_pairs = parse_pairs(args.pairs) if args.pairs else None
    args.a2a_dtypes = dtypes or ["bf16"]
    return args


def fmt(v, digits):
    return "" if v is None else f"{v:.{digits}f}"


def make_row(op, m, n, k, dtype, mode, torch_us=None, ours_us=None, host=None, plan="", routing="", topk="",
             tokens=""):
    """A CSV row (strings): times in us with 2 decimals, ratio = torch_us / ours_us with 3."""
    ratio = torch_us / ours_us if torch_us is not None and ours_us else None
    host_t, host_o = host if host else (None, None)
    return dict(op=op, m=m, n=n, k=k, dtype=dtype, mode=mode, torch_us=fmt(torch_us, 2), ours_us=fmt(ours_us, 2),
                ratio=fmt(ratio, 3), host_torch_us=fmt(host_t, 2), host_ours_us=fmt(host_o, 2),
                plan=" ".join(str(plan).split())[:400], routing=routing, topk=topk, tokens=tokens)


def row_name(r):
    """'m=.. n=.. k=.. dtype' (and the routing and tokens of an alltoall row)."""
    s = f"m={r['m']} n={r['n']} k={r['k']} {r['dtype']}"
    return s + (f" {r['routing']} tokens={r['tokens']}" if r.get("routing") else "")


def summarize(rows):
    """Per op: per mode the rows with a ratio, the worst (lowest) ratio and its
    row, the rows below the mode's bar; the worst host_ours_us -
    host_torch_us and its row; rows without a ratio (errors)."""
    out = {}
    for r in rows:
        s = out.setdefault(r["op"], {"modes": {}, "worst_host_gap_us": None, "worst_host_row": None, "no_ratio": 0})
        if r["ratio"] == "":
            s["no_ratio"] += 1
            continue
        ratio = float(r["ratio"])
        m = s["modes"].setdefault(r["mode"], {"rows": 0, "worst_ratio": None, "worst_row": None, "below_bar": 0,
                                              "bar": BARS[r["mode"]]})
        m["rows"] += 1
        m["below_bar"] += ratio < BARS[r["mode"]]
        if m["worst_ratio"] is None or ratio < m["worst_ratio"]:
            m["worst_ratio"], m["worst_row"] = ratio, dict(r)
        if r["host_torch_us"] != "" and r["host_ours_us"] != "":
            gap = float(r["host_ours_us"]) - float(r["host_torch_us"])
            if s["worst_host_gap_us"] is None or gap > s["worst_host_gap_us"]:
                s["worst_host_gap_us"], s["worst_host_row"] = round(gap, 2), dict(r)
    return out


def summary_table(summary):
    """The summary as text lines (printed at the end of the run)."""
    lines = [f"{'op':14s} {'mode':8s} {'rows':>5s} {'below':>6s} {'worst':>7s}  at"]
    for op, s in summary.items():
        for mode in MODES:
            m = s["modes"].get(mode)
            if m:
                lines.append(f"{op:14s} {mode:8s} {m['rows']:5d} {m['below_bar']:6d} {m['worst_ratio']:7.3f}  "
                             f"{row_name(m['worst_row'])}")
        if s["worst_host_gap_us"] is not None:
            lines.append(f"{op:14s} host: ours - torch at worst {s['worst_host_gap_us']:+.2f} us per call  "
                         f"({row_name(s['worst_host_row'])})")
        if s["no_ratio"]:
            lines.append(f"{op:14s} {s['no_ratio']} rows without a ratio (errors)")
    lines.append("(below: rows under the bar, eager and graph 0.98, latency 0.95; worst: the lowest torch/ours)")
    return lines


def fp8_a2a_sequential(x, w, sa, sb, send, recv, token_idx, gate_rows, tokens):
    """PyTorch's MoE combine with FP8 inputs: torch._scaled_mm (row-wise
    scales, use_fast_accum=False) for F.linear, then all_to_all_single and
    the gate-weighted index_add_, as torch_alltoall.py's torch-sequential."""
    n = w.shape[0]

    def run():
        y = torch._scaled_mm(x, w.t(), scale_a=sa.view(-1, 1), scale_b=sb.view(1, -1), out_dtype=torch.bfloat16,
                             use_fast_accum=False)
        rows = torch.empty(sum(recv), n, device=x.device, dtype=y.dtype)
        dist.all_to_all_single(rows, y, output_split_sizes=recv, input_split_sizes=send)
        out = torch.zeros(tokens, n, device=x.device, dtype=rows.dtype)
        out.index_add_(0, token_idx, rows * gate_rows[:, None])
        return out
    return run


class CsvOut:
    """The CSV, rows written and flushed as they come (a run cut short keeps them); kept for the summary."""

    def __init__(self, path):
        self.rows = []
        self.fh = open(path, "w", newline="") if path else None
        if self.fh:
            self.out = csv.DictWriter(self.fh, fieldnames=COLUMNS, lineterminator="\n")
            self.out.writeheader()
            self.fh.flush()

    def add(self, row):
        self.rows.append(row)
        if self.fh:
            self.out.writerow(row)
            self.fh.flush()

    def close(self):
        if self.fh:
            self.fh.close()


def self_test():
    """The pure helpers: the slug, the paths, argument parsing, the CSV, the summary."""
    assert gpu_slug("NVIDIA H100 80GB HBM3") == "h100" and gpu_slug("NVIDIA H200") == "h200"
    assert gpu_slug("NVIDIA A100-SXM4-80GB") == "nvidiaa100sxm480gb" and gpu_slug("--") == "gpu"
    assert out_paths("d", "h100", 1)[0] == os.path.join("d", "never-slower-h100.csv")
    assert out_paths("d", "h200", 2)[1:] == (os.path.join("d", "never-slower-h200x2.json"),
                                             os.path.join("d", "never-slower-kernels-h200x2.txt"))
    assert parse_pairs("4096,4096; 5000,8192;") == [(4096, 4096), (5000, 8192)]
    for bad in ("", "4096", "4096,12", "a,b", "1,2,3", "0,8"):
        try:
            parse_pairs(bad)
        except ValueError:
            continue
        raise AssertionError(f"parse_pairs accepted {bad!r}")
    assert parse_ms("1, 2,8,2") == [1, 2, 8]
    for bad in ("", "0", "1,x", "-1"):
        try:
            parse_ms(bad)
        except ValueError:
            continue
        raise AssertionError(f"parse_ms accepted {bad!r}")
    assert round_ms("reducescatter", [1, 2, 8, 33], 8) == [8, 40] and round_ms("allreduce", [1, 2], 8) == [1, 2]
    assert round_ms("reducescatter", [1, 3], 1) == [1, 3]
    a = parse_args([])
    assert a.ops == list(OPS) and a.modes == list(MODES) and a.ms == MS and a.turns >= 5
    assert len(a.combos) == len(PAIRS) + 1 and a.combos[-1] == (8192, 8192, "fp16") and a.a2a_pairs is None
    q = parse_args(["--quick"])
    assert q.ms == [1, 32, 2048] and {(n, k) for n, k, _ in q.combos} == set(QUICK_PAIRS) and len(q.combos) == 4
    c = parse_args(["--pairs", "8,16;24,32", "--ms", "4,1", "--dtypes", "fp16,bf16", "--modes", "latency",
                    "--ops", "alltoall,allreduce"])
    assert c.combos == [(8, 16, "fp16"), (8, 16, "bf16"), (24, 32, "fp16"), (24, 32, "bf16")], c.combos
    assert c.ms == [4, 1] and c.modes == ["latency"] and c.ops == ["alltoall", "allreduce"]
    assert c.a2a_pairs == [(8, 16), (24, 32)] and c.a2a_dtypes == ["fp16", "bf16"]
    assert parse_args(["--pairs", "8,16"]).combos == [(8, 16, "bf16")] and parse_args(["--modes", "none"]).modes == []
    rows = [make_row("allreduce", 1, 8, 16, "bf16", "eager", 20.0, 10.0, (5.0, 7.5), "plan a"),
            make_row("allreduce", 2, 8, 16, "bf16", "eager", 9.9, 10.0, (5.0, 6.0), "plan, with comma"),
            make_row("allreduce", 2, 8, 16, "bf16", "latency", 30.0, 33.0),
            make_row("allreduce", 8, 8, 16, "bf16", "graph", plan="error: capture\nfailed"),
            make_row("alltoall", 128, 8, 16, "bf16", "latency", 50.0, 49.0, plan="p", routing="uniform", topk=1,
                     tokens=128)]
    assert rows[0]["ratio"] == "2.000" and rows[1]["ratio"] == "0.990" and rows[0]["host_ours_us"] == "7.50"
    assert rows[3]["ratio"] == "" and rows[3]["plan"] == "error: capture failed" and rows[2]["host_torch_us"] == ""
    s = summarize(rows)
    ar = s["allreduce"]
    assert ar["modes"]["eager"]["rows"] == 2 and ar["modes"]["eager"]["worst_ratio"] == 0.99
    assert ar["modes"]["eager"]["below_bar"] == 0 and ar["modes"]["eager"]["worst_row"]["m"] == 2
    assert ar["modes"]["latency"]["below_bar"] == 1 and ar["modes"]["latency"]["worst_ratio"] == 0.909
    assert ar["worst_host_gap_us"] == 2.5 and ar["worst_host_row"]["m"] == 1 and ar["no_ratio"] == 1
    assert "graph" not in ar["modes"] and s["alltoall"]["modes"]["latency"]["worst_ratio"] == 1.02
    assert s["alltoall"]["worst_host_gap_us"] is None
    table = "\n".join(summary_table(s))
    assert "0.909" in table and "+2.50 us" in table and "tokens=128" in table, table
    json.dumps(s)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "never-slower-h100.csv")
        out = CsvOut(path)
        for r in rows:
            out.add(r)
        with open(path, newline="") as fh:  # (flushed as written: readable before close)
            back = list(csv.DictReader(fh))
        out.close()
        with open(path) as fh:
            header = fh.readline().strip()
    assert header == "op,m,n,k,dtype,mode,torch_us,ours_us,ratio,host_torch_us,host_ours_us,plan,routing,topk,tokens"
    assert len(back) == len(rows) and back[1]["plan"] == "plan, with comma" and back[4]["tokens"] == "128"
    assert summarize(back)["allreduce"]["modes"]["eager"]["worst_ratio"] == 0.99
    print("never_slower self-test: ok")


# ---- on the GPU ----

RANK = 0  # this process's rank (main() sets it): rank 0 prints and writes


def log(msg):
    if RANK == 0:
        print(msg, flush=True)


class Failure(Exception):
    """A row's failure of PyTorch's side (its graph capture): recorded, but not ours."""


def agreed(fn, device):
    """(fn(), None) on every rank, or (None, the error) on every rank where it
    raised on any: the same branch everywhere (the ops' calls are collective)."""
    try:
        value, err = fn(), None
    except Exception as e:  # (recorded in the row; the run goes on)
        value, err = None, e
    if slowest(1.0 if err is not None else 0.0, device) > 0:
        if err is None:
            err = RuntimeError("failed on another rank")
        return None, err
    return value, None


def error_text(err):
    return f"{type(err).__name__}: {err}" if not isinstance(err, Failure) else str(err)


def beyond_bound(got, ref, k, world):
    """Elements of got outside bf16's bound of a sum of world * k products
    around ref (bench/torch_linear.py's: 2^-7 relative on the reference's
    magnitude plus a k-scaled absolute term); NaN counts as outside."""
    r = ref.float()
    bound = 2.0 ** -7 * r.abs() + world * k * 2.0 ** -9
    return int((~((got.float() - r).abs() <= bound)).sum().item())


def a2a_beyond(got, ref, topk):
    """(max abs error, max |ref|, outside?) of a combine against PyTorch's, in
    bench/torch_alltoall.py's bound: its combine rounds each product and sum to
    bf16, ours once from fp32."""
    scale = ref.float().abs().max().item() + 1e-6 if ref.numel() else 1e-6
    err = (got.float() - ref.float()).abs().max().item() if ref.numel() else 0.0
    return err, scale, not err <= 2.0 ** -5 * scale * max(topk, 1)


def expert_routing(kind, experts, tokens, topk, seed):
    """One rank's tokens each picking topk distinct of `experts` (uniform or zipf:S weights), the rows
    by expert (then token, then slot), as the dispatch delivers them at world 1: each row's token and
    gate (gates of a token summing to 1), and the rows per expert."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.ones(experts, dtype=torch.float64)
    if kind.startswith("zipf:"):
        weight = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64) ** float(kind[5:])
    pick = torch.multinomial(weight.expand(tokens, experts).contiguous(), topk, replacement=False, generator=g) \
        if tokens else torch.zeros(0, topk, dtype=torch.int64)
    u = 1 - torch.rand(tokens, topk, generator=g, dtype=torch.float64)
    gate = (u / u.sum(-1, keepdim=True)).reshape(-1)
    order = torch.sort(pick.reshape(-1), stable=True).indices
    counts = torch.bincount(pick.reshape(-1), minlength=experts).tolist()
    return order // topk, gate[order], counts


def clock_mhz(device):
    """The SM clock torch reports (torch.cuda.clock_rate(), NVML's), else 2 GHz."""
    try:
        mhz = float(torch.cuda.clock_rate(device))
        if mhz > 0:
            return mhz
    except Exception:  # (no pynvml, or a torch without it)
        pass
    return 2000.0


class Timer:
    """The three ways of timing, variant 0 PyTorch's and 1 ours, in turns."""

    def __init__(self, device, world):
        self.device, self.world = device, world
        self.flag = torch.zeros(1, device=device)
        self.sleep_ms = dict(SLEEP_MS)  # per mode, doubled where the GPU woke too soon
        self.late_turns = 0
        # The sleep spins on clock cycles: cycles per ms from the clock torch
        # reports, or from a timed sleep where the GPU runs faster (a longer
        # sleep is harmless, a shorter one would let the GPU wait).
        self.mhz = clock_mhz(device)
        measured = 0.0
        for _ in range(2):  # (the first may load the kernel)
            measured = timed_sleep_cycles_per_ms(int(20 * self.mhz * 1000)) / 1000
        self.measured_mhz = slowest(measured, device)
        sane = self.measured_mhz if 100 <= self.measured_mhz <= 5000 else 0.0
        self.cycles_per_ms = max(self.mhz, sane) * 1000

    def _sleep(self, ms):
        torch.cuda._sleep(int(ms * self.cycles_per_ms))
        if self.world > 1:
            # The ranks wake together: a rank whose sleep ends first waits here, not in its first run.
            dist.all_reduce(self.flag)

    def estimate_ms(self, fns, calls=3):
        """ms per call of the slowest of fns, the slowest rank's (after a warm-up call each)."""
        for f in fns:
            f()
        torch.cuda.synchronize()
        worst = 0.0
        for f in fns:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(calls):
                f()
            e.record()
            e.synchronize()
            worst = max(worst, s.elapsed_time(e) / calls)
        return slowest(worst, self.device)

    def behind_sleep(self, units, reps, turns, mode):
        """units[i]() enqueues one unit of variant i (a call, a graph replay).
        Per turn and variant one sleep, then `reps` units between CUDA events,
        the first variant swapped every turn. [(device ms per unit, host us
        per unit)] per variant: the median over turns, the slowest rank's; and
        whether a turn's GPU still woke before the host was done.

        Each variant has its sleep to itself: a stream queues about a
        thousand kernels and copies before its launches block the host, so
        two variants' 200 calls of three entries each behind one sleep would
        charge the second the first's wait."""
        dev, host = [[] for _ in units], [[] for _ in units]
        late = False
        for t in range(turns):
            order = list(range(len(units)))
            if t % 2:
                order.reverse()
            for i in order:
                d, h, was_late = self._one_behind_sleep(units[i], reps, mode)
                dev[i].append(d)
                host[i].append(h)
                late = late or was_late
        res = [(slowest(statistics.median(d), self.device), slowest(statistics.median(h), self.device))
               for d, h in zip(dev, host)]
        return res, late

    def _one_behind_sleep(self, f, reps, mode):
        """One sleep, then `reps` units of f between CUDA events: (device ms
        per unit, host us per unit, late). A sleep that ended before the host
        had enqueued the units is run again twice as long (at most twice)."""
        for attempt in range(3):
            torch.cuda.synchronize()
            asleep, wake = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            asleep.record()
            self._sleep(self.sleep_ms[mode])
            wake.record()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            h0 = time.perf_counter()
            s.record()
            for _ in range(reps):
                f()
            e.record()
            h = time.perf_counter() - h0
            woke = wake.query()  # (the GPU is past the sleep: it may have waited for the host)
            torch.cuda.synchronize()
            slept = asleep.elapsed_time(wake)
            if slept < 0.95 * self.sleep_ms[mode]:  # (the clock rose since: more cycles per ms; rank-local, harmless)
                self.cycles_per_ms = min(self.cycles_per_ms * min(self.sleep_ms[mode] / max(slept, 1e-3), 4.0), 5e6)
            late = False
            if not slowest(float(woke), self.device):
                break
            if attempt == 2 or self.sleep_ms[mode] >= MAX_SLEEP_MS:
                late = True
                self.late_turns += 1
                break
            self.sleep_ms[mode] = min(2 * self.sleep_ms[mode], MAX_SLEEP_MS)
            log(f"  (the GPU woke before the host had enqueued a {mode} turn: {mode} sleeps of {self.sleep_ms[mode]:.0f} ms "
                "from now)")
        return s.elapsed_time(e) / reps, h / reps * 1e6, late

    def latency_us(self, fns, turns):
        """us per call, host included, of each of fns: per turn ceil(LATENCY_CALLS /
        turns) synchronised calls of each, the variants alternating call by call
        (the first swapped every turn), so that a drift of the clocks or the host
        meets both alike; the median per turn, the median over turns, the slowest
        rank's."""
        calls = max(1, math.ceil(LATENCY_CALLS / turns))
        per = [[] for _ in fns]
        for t in range(turns):
            order = list(range(len(fns)))
            if t % 2:
                order.reverse()
            samples = [[] for _ in fns]
            for _ in range(calls):
                for i in order:
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    fns[i]()
                    torch.cuda.synchronize()
                    samples[i].append(time.perf_counter() - t0)
            for i in order:
                per[i].append(statistics.median(samples[i]))
        return [slowest(statistics.median(p) * 1e6, self.device) for p in per]


def capture(fn, calls):
    """A CUDA graph of `calls` calls of fn (warmed up on a side stream, as
    torch's CUDA-graph docs advise) and the last call's output."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            out = fn()
    return g, out


def rand(shape, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.rand(*shape, device=device, dtype=dtype, generator=g) * 2 - 1


def clamp(v, lo, hi):
    return int(min(max(v, lo), hi))


class Run:
    """One run: the process group, the ops module, the timer, the outputs."""

    def __init__(self, args, device, world, fo, out, meta, json_path):
        self.args, self.device, self.world, self.fo, self.out = args, device, world, fo, out
        self.meta, self.json_path = meta, json_path
        self.timer = Timer(device, world)
        self.check_failures, self.our_errors = [], []
        self.t0 = time.perf_counter()

    def add(self, row, note=""):
        self.out.add(row)
        t = f"torch {row['torch_us']:>9s} us  ours {row['ours_us']:>9s} us  {row['ratio']:>6s}x" if row["ratio"] else ""
        host = f"  host {row['host_torch_us']}/{row['host_ours_us']} us" if row["host_ours_us"] else ""
        log(f"{row['op']:13s} {row_name(row):40s} {row['mode']:7s} {t}{host}  {row['plan'][:100]}{note}")

    def failed_check(self, what):
        self.check_failures.append(what)
        log(f"check FAILED: {what}")

    def write_json(self, complete):
        if RANK != 0:
            return
        meta = dict(self.meta, elapsed_s=round(time.perf_counter() - self.t0, 1), complete=complete,
                    sleep_mhz={"reported": self.timer.mhz, "measured": round(self.timer.measured_mhz, 1)},
                    sleep_ms_last=self.timer.sleep_ms, late_turns=self.timer.late_turns,
                    check_failures=self.check_failures, our_errors=self.our_errors,
                    summary=summarize(self.out.rows))
        tmp = self.json_path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(meta, fh, indent=1)
            fh.write("\n")
        os.replace(tmp, self.json_path)

    # ---- allreduce and reducescatter ----

    def dense(self, opname, n, k, dt):
        fo, device, world, args = self.fo, self.device, self.world, self.args
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}[dt]  # (fp8: the output's)
        ms = round_ms(opname, args.ms, world)
        rank = dist.get_rank()
        if dt == "fp8" and (n % 16 or k % 16):  # (no baseline: torch._scaled_mm refuses them)
            log(f"{opname} n={n} k={k} fp8: skipped (torch._scaled_mm takes n and k multiples of 16 only)")
            return
        log(f"[{time.perf_counter() - self.t0:5.0f} s] {opname} n={n} k={k} {dt}: m in {ms}")

        def build():
            if opname == "allreduce":
                extra = {"tuning_cache": args.tuning_cache} if args.tuning_cache else {}
                if dt == "fp8":
                    extra.update(input="e4m3", scales="row")
                return fo.GemmAllReduce(None, max_m=max(ms), n=n, k=k, dtype=dtype, **extra)
            fp8 = dict(input="e4m3", scales="row") if dt == "fp8" else {}
            return fo.GemmReduceScatter(None, max(ms), n, k, dtype, **fp8)

        op, err = agreed(build, device)
        if err is not None:
            self.our_errors.append(f"{opname} n={n} k={k} {dt}: {error_text(err)}")
            for m in ms:
                for mode in args.modes:
                    self.add(make_row(opname, m, n, k, dt, mode, plan=f"error: {error_text(err)}"))
            return
        try:
            w = rand((n, k), dtype, device, 7 + n + k)
            if dt == "fp8":
                w = w.to(torch.float8_e4m3fn)
            for m in ms:
                self.dense_m(opname, op, m, n, k, dt, dtype, w, rank)
                torch.cuda.empty_cache()
        finally:
            torch.cuda.synchronize()
            op.close()
            torch.cuda.empty_cache()

    def dense_m(self, opname, op, m, n, k, dt, dtype, w, rank):
        device, world, args, timer = self.device, self.world, self.args, self.timer
        x = rand((m, k), dtype, device, 1000 * rank + m + 3 * k)
        scales = {}
        if dt == "fp8":
            x = x.to(torch.float8_e4m3fn)
            sa = rand((m,), torch.float32, device, 11 + m) * 0.25 + 0.75
            sb = rand((n,), torch.float32, device, 13 + n) * 0.25 + 0.75
            scales = dict(scale_a=sa, scale_b=sb)
            sa_t, sb_t = sa.view(-1, 1), sb.view(1, -1)

            def theirs():
                y = torch._scaled_mm(x, w.t(), scale_a=sa_t, scale_b=sb_t, out_dtype=torch.bfloat16,
                                     use_fast_accum=False)
                if opname == "allreduce":
                    dist.all_reduce(y)
                    return y
                out = torch.empty(m // world, n, device=device, dtype=dtype)
                dist.reduce_scatter_tensor(out, y)
                return out
        elif opname == "allreduce":
            def theirs():
                y = F.linear(x, w)
                dist.all_reduce(y)
                return y
        else:
            def theirs():
                y = F.linear(x, w)
                out = torch.empty(m // world, n, device=device, dtype=dtype)
                dist.reduce_scatter_tensor(out, y)
                return out

        def ours():
            return op(x, w, **scales)

        def error_rows(err, modes, label=opname):
            if not isinstance(err, Failure):
                self.our_errors.append(f"{label} m={m} n={n} k={k} {dt}: {error_text(err)}")
            for mode in modes:
                self.add(make_row(label, m, n, k, dt, mode, plan=f"error: {error_text(err)}"))

        # Correctness first; the ops plan m at their first call (plan() after it).
        got, err = agreed(lambda: (theirs(), ours(), op.plan(m)), device)
        if err is not None:
            return error_rows(err, args.modes)
        ref, y, plan = got
        bad = int(slowest(beyond_bound(y, ref, k, world), device))
        if bad:
            self.failed_check(f"{opname} m={m} n={n} k={k} {dt}: {bad} elements beyond the bound")
            plan += f"; CHECK FAILED: {bad} elements beyond the bound"
        del y
        self.against(opname, theirs, ours, op, m, n, k, dt, plan, ref, error_rows)
        symm = self.async_tp_group() if opname == "reducescatter" and dt != "fp8" else None
        if symm:  # (PyTorch's Async-TP: its fused GEMM + ReduceScatter, rows of their own)
            wt = w.t()
            atp = lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(x, wt, "sum", 0, symm)  # noqa: E731
            got, err = agreed(atp, device)
            if err is not None:
                return error_rows(Failure(f"Async-TP failed: {error_text(err)}"), args.modes, "rs-async-tp")
            note = "; Async-TP beyond the bound" if int(slowest(beyond_bound(got, ref, k, world), device)) else ""
            del got
            self.against("rs-async-tp", atp, ours, op, m, n, k, dt, plan + note, ref, error_rows)

    def against(self, label, theirs, ours, op, m, n, k, dt, plan, ref, error_rows):
        """One (op, m, n, k, dtype)'s rows, a row per mode: theirs against ours, in turns."""
        device, world, args, timer = self.device, self.world, self.args, self.timer
        t_est, err = agreed(lambda: timer.estimate_ms([theirs, ours]), device)
        if err is not None:
            return error_rows(err, args.modes, label)
        budget = args.row_budget_ms / (2 * args.turns)  # ms per variant per turn
        for mode in args.modes:
            if mode == "eager":
                reps = clamp(budget / max(t_est, 1e-4), 10, 200)
                got, err = agreed(lambda: timer.behind_sleep([theirs, ours], reps, args.turns, "eager"), device)
                if err is not None:
                    error_rows(err, [mode], label)
                    continue
                ((t_ms, t_host), (o_ms, o_host)), late = got
                self.add(make_row(label, m, n, k, dt, mode, t_ms * 1e3, o_ms * 1e3, (t_host, o_host),
                                  plan + ("; the GPU waited on the host in a turn" if late else "")),
                         f"  (N={reps})")
            elif mode == "graph":
                reps = clamp(budget / (GRAPH_CALLS * max(t_est, 1e-4)), 1, 20)
                got, err = agreed(lambda: self.graph_times(op, m, theirs, ours, reps), device)
                if err is not None:
                    error_rows(err, [mode], label)
                    continue
                (t_ms, o_ms), late, out = got
                note = "; the GPU waited on the host in a turn" if late else ""
                bad = int(slowest(beyond_bound(out, ref, k, world), device))
                if bad:
                    self.failed_check(f"{label} m={m} n={n} k={k} {dt} graph replay: {bad} elements beyond the bound")
                    note += f"; CHECK FAILED (graph replay): {bad} elements beyond the bound"
                del out
                self.add(make_row(label, m, n, k, dt, mode, t_ms * 1e3, o_ms * 1e3, plan=plan + note),
                         f"  (R={reps})")
            else:
                got, err = agreed(lambda: timer.latency_us([theirs, ours], args.turns), device)
                if err is not None:
                    error_rows(err, [mode], label)
                    continue
                self.add(make_row(label, m, n, k, dt, mode, got[0], got[1], plan=plan))

    def async_tp_group(self):
        """The group name Async-TP runs on (symmetric memory enabled for the
        world group once), or None: at world 1, with --no-async-tp, or where
        this torch has none (said once)."""
        if not hasattr(self, "_symm"):
            self._symm = None
            if self.world > 1 and not self.args.no_async_tp:
                try:
                    import torch.distributed._symmetric_memory as symm_mem
                    symm_mem.enable_symm_mem_for_group(dist.group.WORLD.group_name)
                    self._symm = dist.group.WORLD.group_name
                except Exception as e:  # (PyTorch's side: its rows left out, said so)
                    log(f"Async-TP unavailable in torch {torch.__version__} ({type(e).__name__}: {e}): its rows "
                        "left out")
        return self._symm

    def graph_times(self, op, m, theirs, ours, reps):
        """(ms per call of PyTorch's and ours' graphs), late, ours' last output."""
        op.prepare(m)
        try:
            g_t, _ = capture(theirs, GRAPH_CALLS)
        except Exception as e:  # (PyTorch's side: recorded, not ours)
            torch.cuda.synchronize()
            raise Failure(f"PyTorch's graph capture failed: {type(e).__name__}: {e}") from None
        g_o, out = capture(ours, GRAPH_CALLS)
        res, late = self.timer.behind_sleep([g_t.replay, g_o.replay], reps, self.args.turns, "graph")
        torch.cuda.synchronize()
        del g_t, g_o
        return (res[0][0] / GRAPH_CALLS, res[1][0] / GRAPH_CALLS), late, out

    # ---- alltoall ----

    def alltoall(self, n, k, dt, a2a):
        fo, device, world, args = self.fo, self.device, self.world, self.args
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}[dt]  # (fp8: the output's)
        fp8 = dt == "fp8"
        if fp8 and (n % 16 or k % 16):  # (no baseline: torch._scaled_mm refuses them)
            log(f"alltoall n={n} k={k} fp8: skipped (torch._scaled_mm takes n and k multiples of 16 only)")
            return
        rank = dist.get_rank()
        topk = 2 if world > 2 else 1
        cases = []
        for tokens in A2A_TOKENS:
            for routing in A2A_ROUTINGS:
                dest, gate = a2a.draw_routing(routing, world, tokens, topk, 1)
                counts, send, recv, token_idx, gate_rows = a2a.rank_plan(dest, gate, rank)
                cases.append((tokens, routing, dest, gate, counts, send, recv, token_idx, gate_rows))
        max_rows = max(int(c[4].sum(0).max()) for c in cases)
        log(f"[{time.perf_counter() - self.t0:5.0f} s] alltoall n={n} k={k} {dt}: topk {topk}, max_rows {max_rows}")
        extra = dict(input="e4m3", scales="row") if fp8 else {}
        op, err = agreed(lambda: fo.GemmAllToAll(None, max(max_rows, 1), max(A2A_TOKENS), topk, n, k, dtype, **extra),
                         device)
        if err is not None:
            self.our_errors.append(f"alltoall n={n} k={k} {dt}: {error_text(err)}")
            for tokens, routing, *_ in cases:
                self.add(make_row("alltoall", "", n, k, dt, "latency", plan=f"error: {error_text(err)}",
                                  routing=routing, topk=topk, tokens=tokens))
            return
        try:
            w = rand((n, k), dtype, device, 11 + n + k)
            if fp8:
                w = w.to(torch.float8_e4m3fn)
                sb = rand((n,), torch.float32, device, 13 + n) * 0.25 + 0.75
            for tokens, routing, dest, gate, counts, send, recv, token_idx, gate_rows in cases:
                m_rows = counts.sum(0)
                x = rand((int(m_rows[rank]), k), dtype, device, 1000 * rank + tokens + k)
                scales = {}
                if fp8:  # (row-wise scales; PyTorch's pipeline with torch._scaled_mm for F.linear)
                    x = x.to(torch.float8_e4m3fn)
                    sa = rand((x.shape[0],), torch.float32, device, 11 + tokens) * 0.25 + 0.75
                    scales = dict(scale_a=sa, scale_b=sb)
                    theirs = fp8_a2a_sequential(x, w, sa, sb, send, recv, token_idx.to(device),
                                                gate_rows.to(device, dtype), tokens)
                else:
                    theirs = a2a.make_variants(x, w, send, recv, token_idx.to(device), gate_rows.to(device, dtype),
                                               tokens)["torch-sequential"]
                d_rank, d_token, d_gate = (t.to(device) for t in a2a.expert_rows(dest, gate, rank))

                def ours():
                    return op(x, w, d_rank, d_token, d_gate, send, recv, tokens, **scales)

                row = dict(routing=routing, topk=topk, tokens=tokens)
                got, err = agreed(lambda: (theirs(), ours()), device)
                if err is not None:
                    self.our_errors.append(f"alltoall n={n} k={k} {dt} {routing} tokens={tokens}: {error_text(err)}")
                    self.add(make_row("alltoall", int(m_rows.max()), n, k, dt, "latency",
                                      plan=f"error: {error_text(err)}", **row))
                    continue
                ref, y = got
                err_abs, scale, bad = a2a_beyond(y, ref, topk)
                if slowest(float(bad), device):
                    self.failed_check(f"alltoall n={n} k={k} {dt} {routing} tokens={tokens}: max error "
                                      f"{err_abs:.3g} of {scale:.3g} beyond the bound (on some rank)")
                    note = "; CHECK FAILED"
                else:
                    note = ""
                del ref, y
                self.a2a_modes(theirs, ours, op, int(m_rows.max()), n, k, dt, row, note)
        finally:
            torch.cuda.synchronize()
            op.close()
            torch.cuda.empty_cache()

    def a2a_modes(self, theirs, ours, op, m, n, k, dt, row, note):
        """An All-to-All case's rows: latency, and eager at world 1 (at W > 1 its call syncs the host)."""
        args, device, world = self.args, self.device, self.world
        what = f"alltoall n={n} k={k} {dt} {row['routing']} tokens={row['tokens']}"
        for mode in [md for md in args.modes if md == "latency" or (md == "eager" and world == 1)]:
            if mode == "latency":
                got, err = agreed(lambda: self.timer.latency_us([theirs, ours], args.turns), device)
            else:
                t_est, err = agreed(lambda: self.timer.estimate_ms([theirs, ours]), device)
                if err is None:
                    # (<= 100: a call of either queues up to ~10 kernels, and a stream ~1,020)
                    reps = clamp(args.row_budget_ms / (2 * args.turns) / max(t_est, 1e-4), 10, 100)
                    got, err = agreed(lambda: self.timer.behind_sleep([theirs, ours], reps, args.turns, "eager"),
                                      device)
            if err is not None:
                self.our_errors.append(f"{what} {mode}: {error_text(err)}")
                self.add(make_row("alltoall", m, n, k, dt, mode, plan=f"error: {error_text(err)}", **row))
                continue
            if mode == "latency":
                self.add(make_row("alltoall", m, n, k, dt, mode, got[0], got[1], plan=op.last_plan() + note, **row))
            else:
                ((t_ms, t_host), (o_ms, o_host)), late = got
                self.add(make_row("alltoall", m, n, k, dt, mode, t_ms * 1e3, o_ms * 1e3, (t_host, o_host),
                                  op.last_plan() + note + ("; the GPU waited on the host in a turn" if late else ""),
                                  **row), f"  (N={reps})")

    def alltoall_experts(self, n, k, experts, topk, dt):
        """The combine with several experts per rank, at world 1: each token's topk distinct experts of E
        (uniform or Zipf(1.2) loads), its rows by expert, against PyTorch's pipeline: torch._grouped_mm (a loop
        of F.linear without it) + all_to_all_single + the weighted index_add_."""
        fo, device, args = self.fo, self.device, self.args
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
        grouped_mm = getattr(torch, "_grouped_mm", None) if dtype == torch.bfloat16 else None
        cases = []
        for tokens in A2A_EXPERT_TOKENS:
            for routing in A2A_ROUTINGS:
                cases.append((tokens, routing) + expert_routing(routing, experts, tokens, topk, 7 + tokens))
        max_rows = max(len(c[2]) for c in cases)
        log(f"[{time.perf_counter() - self.t0:5.0f} s] alltoall n={n} k={k} {dt}: {experts} experts, top-{topk}, "
            f"max_rows {max_rows}")
        op, err = agreed(lambda: fo.GemmAllToAll(None, max_rows, max(A2A_EXPERT_TOKENS), topk, n, k, dtype,
                                                 experts=experts), device)
        if err is not None:
            self.our_errors.append(f"alltoall n={n} k={k} {dt} {experts} experts: {error_text(err)}")
            return
        try:
            w = rand((experts, n, k), dtype, device, 13 + n + k)
            for tokens, routing, token_idx, gate_rows, counts in cases:
                rows = len(token_idx)
                x = rand((rows, k), dtype, device, tokens + k)
                d_token = token_idx.to(device, torch.int32)
                d_rank = torch.zeros_like(d_token)
                d_gate = gate_rows.to(device, torch.float32)
                gate_t = gate_rows.to(device, dtype)
                tok = token_idx.to(device)
                offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(device, torch.int32)
                starts = [0]
                for c in counts:
                    starts.append(starts[-1] + c)

                def theirs():
                    if grouped_mm is not None:
                        y = grouped_mm(x, w.transpose(-2, -1), offs=offs)
                    else:
                        y = torch.cat([F.linear(x[starts[e]:starts[e + 1]], w[e]) for e in range(experts)])
                    back = torch.empty_like(y)
                    dist.all_to_all_single(back, y, output_split_sizes=[rows], input_split_sizes=[rows])
                    out = torch.zeros(tokens, n, device=device, dtype=back.dtype)
                    out.index_add_(0, tok, back * gate_t[:, None])
                    return out

                def ours():
                    return op(x, w, d_rank, d_token, d_gate, [rows], [rows], tokens, expert_counts=counts)

                row = dict(routing=f"{routing}, {experts} experts", topk=topk, tokens=tokens)
                got, err = agreed(lambda: (theirs(), ours()), device)
                if err is not None:
                    self.our_errors.append(f"alltoall n={n} k={k} {dt} {experts} experts {routing} tokens={tokens}: "
                                           f"{error_text(err)}")
                    self.add(make_row("alltoall", rows, n, k, dt, "latency", plan=f"error: {error_text(err)}", **row))
                    continue
                ref, y = got
                err_abs, scale, bad = a2a_beyond(y, ref, topk)
                note = ""
                if bad:
                    self.failed_check(f"alltoall n={n} k={k} {dt} {experts} experts {routing} tokens={tokens}: max "
                                      f"error {err_abs:.3g} of {scale:.3g} beyond the bound")
                    note = "; CHECK FAILED"
                del ref, y
                self.a2a_modes(theirs, ours, op, rows, n, k, dt, row, note)
        finally:
            torch.cuda.synchronize()
            op.close()
            torch.cuda.empty_cache()

    # ---- --kernels ----

    def kernels(self, path):
        """The CUDA kernels of one call of PyTorch's GEMM (F.linear; fp8 in --dtypes: torch._scaled_mm too) and
        of each dense op, per KERNEL_SHAPES, each with its device time; graph in --modes: also those of one
        replay of a graph of one call (what a captured call runs)."""
        from torch import profiler
        fo, device, world = self.fo, self.device, self.world
        lines = [f"# {self.meta['gpu']}, world {world}, torch {torch.__version__}, flashoverlap "
                 f"{self.meta['flashoverlap']}: CUDA kernels (and copies) of one call, in launch order, "
                 f"with their device time"]
        rank = dist.get_rank()
        dts = ["bf16"] + (["fp8"] if "fp8" in self.args.dtypes.split(",") else [])
        forms = ["eager"] + (["graph"] if "graph" in self.args.modes else [])
        for dt in dts:
            for n, k, m0 in KERNEL_SHAPES:
                fp8 = dt == "fp8"
                w = rand((n, k), torch.bfloat16, device, 5)
                if fp8:
                    w = w.to(torch.float8_e4m3fn)
                variants = [("torch._scaled_mm" if fp8 else "F.linear", m0, None)]
                for opname in ("allreduce", "reducescatter"):
                    if opname in self.args.ops:
                        variants.append((opname, round_ms(opname, [m0], world)[0], opname))
                for name, m, opname in variants:
                    x = rand((m, k), torch.bfloat16, device, 1000 * rank + m)
                    sa = rand((m,), torch.float32, device, 11 + m) * 0.25 + 0.75
                    sb = rand((n,), torch.float32, device, 13 + n) * 0.25 + 0.75
                    if fp8:
                        x = x.to(torch.float8_e4m3fn)

                    def build():
                        if opname is None and fp8:
                            return None, (lambda: torch._scaled_mm(
                                x, w.t(), scale_a=sa.view(-1, 1), scale_b=sb.view(1, -1), out_dtype=torch.bfloat16,
                                use_fast_accum=False)), ""
                        if opname is None:
                            return None, (lambda: F.linear(x, w)), ""
                        cls = fo.GemmAllReduce if opname == "allreduce" else fo.GemmReduceScatter
                        extra = dict(input="e4m3", scales="row") if fp8 else {}
                        op = cls(None, m, n, k, torch.bfloat16, **extra)
                        call_args = dict(scale_a=sa, scale_b=sb) if fp8 else {}
                        return op, (lambda: op(x, w, **call_args)), op.plan(m)

                    def profile():
                        op, f, plan = build()
                        try:
                            got = {}
                            for form in forms:
                                if form == "graph":
                                    if op is not None:
                                        op.prepare(m)  # (the ops refuse to plan under capture)
                                    g, _ = capture(f, 1)
                                    run = g.replay
                                else:
                                    run = f
                                for _ in range(2):
                                    run()
                                torch.cuda.synchronize()
                                with profiler.profile(activities=[profiler.ProfilerActivity.CUDA]) as prof:
                                    run()
                                    torch.cuda.synchronize()
                                got[form] = kernel_names(prof, times=True)
                            return got, plan
                        finally:
                            if op is not None:
                                torch.cuda.synchronize()
                                op.close()

                    got, err = agreed(profile, device)
                    head, first = f"n={n} k={k} m={m} {dt} {name}", len(lines)
                    if err is not None:
                        lines.append(f"{head}: error: {error_text(err)}")
                    else:
                        by_form, plan = got
                        for form, names in by_form.items():
                            lines.append(f"{head} {form}" + (f"  (plan: {plan})" if plan else ""))
                            lines += [f"    {kn}" for kn in names] or ["    (no CUDA kernel recorded)"]
                    log("\n".join(lines[first:]))
        if RANK == 0:
            with open(path, "w") as fh:
                fh.write("\n".join(lines) + "\n")
            log(f"kernels: {path}")


def kernel_names(prof, times=False):
    """The names of the CUDA kernels (and memcpy/memset) a profile recorded, in order; times: each as
    "<device us> us  <name>"."""
    cuda = torch.autograd.DeviceType.CUDA
    events = [e for e in prof.events() if getattr(e, "device_type", None) == cuda]
    if not events:  # (a torch that keeps them only as its CPU ops' children)
        events = [kn for e in prof.events() for kn in getattr(e, "kernels", [])]
    if not times:
        return [e.name for e in events]

    def us(e):
        for attr in ("device_time_total", "cuda_time_total", "device_time", "duration"):
            v = getattr(e, attr, None)
            if isinstance(v, (int, float)):
                return float(v)
        return float("nan")
    return [f"{us(e):9.1f} us  {e.name}" for e in events]


def main():
    global RANK
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    args = parse_args(sys.argv[1:])
    if torch is None:
        print("never_slower.py: torch is not importable (needs PyTorch >= 2.4 with CUDA)", file=sys.stderr)
        sys.exit(2)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if not torch.cuda.is_available() or local >= torch.cuda.device_count():
        print(f"never_slower.py: needs one CUDA GPU per process; found "
              f"{torch.cuda.device_count() if torch.cuda.is_available() else 'no CUDA'} for local rank {local}",
              file=sys.stderr)
        sys.exit(2)
    if torch.cuda.get_device_capability(local) != (9, 0):
        print(f"never_slower.py: needs a Hopper (sm_90) GPU; this is {torch.cuda.get_device_name(local)}",
              file=sys.stderr)
        sys.exit(2)
    device = join_nccl_group(local)
    RANK, world = dist.get_rank(), dist.get_world_size()
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    if args.tuning_cache:
        # GemmAllReduce takes it as an option; GemmReduceScatter's binding has none, but the
        # library reads the variable at construction.
        os.environ["FLASHOVERLAP_TUNING_CACHE"] = os.path.abspath(args.tuning_cache)
    why = None
    try:
        import flashoverlap
        import flashoverlap.torch as fo
        fo.require_torch()
        lib = flashoverlap.load()  # (the package loads the library lazily: a missing one shows here)
        versions = dict(flashoverlap=lib.version(), flashoverlap_package=flashoverlap.__version__,
                        flashoverlap_library=flashoverlap.library_path(),
                        nccl_library=".".join(map(str, flashoverlap.nccl_version())))
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
    if slowest(1.0 if why else 0.0, device):  # (every rank stops, or none)
        print(f"never_slower.py: flashoverlap is not usable on rank {RANK}: {why or 'on another rank'}",
              file=sys.stderr)
        dist.destroy_process_group()
        sys.exit(2)
    import torch_alltoall as a2a

    name = torch.cuda.get_device_name(device)
    csv_path, json_path, kernels_path = out_paths(args.out_dir, gpu_slug(name), world)
    if RANK == 0:
        os.makedirs(args.out_dir, exist_ok=True)
    nccl = torch.cuda.nccl.version()
    meta = dict(gpu=name, world=world, torch=torch.__version__, cuda=torch.version.cuda,
                nccl_torch=".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl), **versions,
                date=datetime.datetime.now().isoformat(timespec="seconds"), hostname=socket.gethostname(),
                command=" ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
                tuning_cache=os.environ.get("FLASHOVERLAP_TUNING_CACHE", ""),
                machine_line=machine_line(device, world, flashoverlap=versions["flashoverlap"]).strip(),
                ops=args.ops, modes=args.modes, turns=args.turns, ms=args.ms, combos=args.combos,
                row_budget_ms=args.row_budget_ms, bars=BARS, csv=csv_path)
    out = CsvOut(csv_path if RANK == 0 else "")
    run = Run(args, device, world, fo, out, meta, json_path)
    log(meta["machine_line"])
    log(f"sleep clock: {run.timer.mhz:.0f} MHz reported, {run.timer.measured_mhz:.0f} MHz measured; CSV {csv_path}")
    if args.kernels:
        run.kernels(kernels_path)
    if args.modes:
        for opname in ("allreduce", "reducescatter"):
            if opname in args.ops:
                for n, k, dt in args.combos:
                    run.dense(opname, n, k, dt)
                    run.write_json(False)
        if "alltoall" in args.ops:
            if "latency" not in args.modes and not ("eager" in args.modes and world == 1):
                log("alltoall: latency mode (and eager at world 1) only: its call syncs the host; left out")
            else:
                pairs = args.a2a_pairs or a2a.parse_shapes(a2a.SHAPES)
                if args.quick and not args.a2a_pairs:
                    pairs = pairs[:1]
                for n, k in pairs:
                    for dt in args.a2a_dtypes:
                        run.alltoall(n, k, dt, a2a)
                        run.write_json(False)
                if world > 1:
                    log("alltoall with several experts per rank: at world 1 only in this table")
                elif not args.a2a_pairs and "bf16" in args.a2a_dtypes:
                    for n, k, experts, topk in A2A_EXPERTS[:1] if args.quick else A2A_EXPERTS:
                        run.alltoall_experts(n, k, experts, topk, "bf16")
                        run.write_json(False)
    run.write_json(True)
    out.close()
    if RANK == 0:
        log("")
        for line in summary_table(summarize(out.rows)):
            log(line)
        log(f"{len(out.rows)} rows in {time.perf_counter() - run.t0:.0f} s: {csv_path}, {json_path}")
        for what in run.check_failures:
            log(f"check FAILED: {what}")
        for what in run.our_errors:
            log(f"error: {what}")
    dist.destroy_process_group()
    if run.check_failures or run.our_errors:
        sys.exit(1)


if __name__ == "__main__":
    main()
