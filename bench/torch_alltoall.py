#!/usr/bin/env python3
"""The MoE combine (expert GEMM -> All-to-All back to the tokens -> gate-weighted
sum per token) as PyTorch users run it today, one process per GPU:

    torchrun --nproc-per-node W bench/torch_alltoall.py [--shapes "N,K;N,K"] [--tokens T] [--topk K]
        [--routing uniform|zipf:S|one:R|empty:R] [--runs 20] [--warmup 5] [--seed 1] [--out FILE]

Every rank has T tokens; each picks topk distinct ranks (one expert per rank;
topk <= W, so world 1 needs --topk 1) with gates positive, summing to 1. The
kinds are plan::make_moe_routing's (uniform; zipf:S, rank i with weight
1/(i+1)^S, topk draws without replacement; one:R, every token picks R, its
other topk-1 ranks uniform; empty:R, never R, topk <= W-1), drawn with torch's
RNG (not the C++ draws): one CPU torch.Generator seeded by --seed on every rank
draws all ranks' tokens and each takes its part, so all agree (checked). Rank
e's expert holds the m_e rows dispatched to it (m_e = 0 allowed), by source
rank, then token, then k slot: A_e (m_e x K) and B_e (N x K), random bf16.
Variants, one CSV row each:
  torch-sequential  Y = F.linear(A_e, B_e); dist.all_to_all_single back to the
                    sources (Y's rows are already grouped by destination);
                    out = zeros(T, N).index_add_(0, token_idx, rows * gate[:, None]),
                    all in bf16 as typical MoE code does it
  torch-unweighted  the same without the combine (F.linear + all_to_all_single)
  flashoverlap-torch flashoverlap.torch.GemmAllToAll (path auto), the library as
                    a user calls it: each call exchanges the ranks' routings,
                    plans, and runs (where the package imports; checked against
                    torch-sequential within bf16's bound)
torch-sequential's output is checked once per shape against a float64 CPU
reference on rank 0 (a few tokens and columns, from the experts' own A and B
rows). Timing: per run one call between CUDA events, the median of --runs runs
after --warmup calls, the slowest rank's (all_reduce MAX). The CSV (--out, or
stdout) starts with a "#" line (GPU, torch, NCCL, world, date), then the header
N,K,tokens,topk,routing,dtype,world,variant,ms,max_rows (max_rows: the largest m_e).
"""
import argparse
import csv
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from torch_timing import join_nccl_group, machine_line, slowest, time_in_turns

SHAPES = "4096,14336;7168,2048;2048,768"
COLUMNS = ["N", "K", "tokens", "topk", "routing", "dtype", "world", "variant", "ms", "max_rows"]


def draw_routing(kind, world, tokens, topk, seed):
    """dest[s, t, j] (int64 rank) and gate[s, t, j] (float64) of every rank s's
    tokens, the same on every rank. Raises ValueError for a bad kind or top-k."""
    W, T, K = world, tokens, topk
    if T < 0:
        raise ValueError(f"--tokens {T} < 0")
    if not 1 <= K <= W:
        raise ValueError(f"--topk {K} outside [1, world = {W}] (a token picks distinct ranks)")
    weight = torch.ones(W, dtype=torch.float64)
    first, special = 0, 0  # one:R: the first k slot fixed to `special`
    if kind.startswith("zipf:"):
        try:
            s = float(kind[5:])
        except ValueError:
            s = float("nan")
        if not (s >= 0 and math.isfinite(s)):
            raise ValueError(f"bad routing '{kind}': the Zipf exponent must be a finite number >= 0")
        # kept positive: a huge S must not leave the topk draws nothing to pick
        weight = (1.0 / torch.arange(1, W + 1, dtype=torch.float64) ** s).clamp_min(1e-300)
    elif kind.startswith(("one:", "empty:")):
        tail = kind.split(":", 1)[1]
        if not tail.isdigit() or int(tail) >= W:
            raise ValueError(f"bad routing '{kind}': the rank must be in [0, {W})")
        special = int(tail)
        weight[special] = 0
        if kind.startswith("one:"):
            first = 1
        elif K > W - 1:
            raise ValueError(f"routing '{kind}': top-k {K} distinct ranks without rank {special} needs world > top-k")
    elif kind != "uniform":
        raise ValueError(f"unknown routing '{kind}' (expected uniform, zipf:S, one:R or empty:R)")
    g = torch.Generator().manual_seed(seed)
    n = W * T
    dest = torch.full((n, K), special, dtype=torch.int64)
    if n and K > first:
        dest[:, first:] = torch.multinomial(weight.expand(n, W).contiguous(), K - first, replacement=False, generator=g)
    u = 1 - torch.rand(W, T, K, generator=g, dtype=torch.float64)  # (0, 1]
    return dest.view(W, T, K), u / u.sum(-1, keepdim=True)


def rank_plan(dest, gate, rank):
    """counts[src, dst] (rows src dispatched to dst), this rank's split sizes as
    the expert sending rows back (send) and as the source receiving them (recv),
    and each received row's token and gate (rows come back per expert, in the
    order this rank dispatched them: token, then k slot)."""
    W, T, K = dest.shape
    counts = torch.stack([torch.bincount(dest[s].reshape(-1), minlength=W) for s in range(W)])
    order = torch.sort(dest[rank].reshape(-1), stable=True).indices
    return counts, counts[:, rank].tolist(), counts[rank].tolist(), order // K, gate[rank].reshape(-1)[order]


def make_variants(a, b, send, recv, token_idx, gate_rows, tokens):
    n, rows_back = b.shape[0], sum(recv)

    def unweighted():
        y = F.linear(a, b)  # (m_e, n): rows by source rank, so already split by destination
        out = torch.empty(rows_back, n, device=a.device, dtype=y.dtype)
        dist.all_to_all_single(out, y, output_split_sizes=recv, input_split_sizes=send)
        return out

    def sequential():
        rows = unweighted()
        out = torch.zeros(tokens, n, device=a.device, dtype=rows.dtype)
        # In the activation dtype (bf16) throughout, as typical MoE code does it:
        # the gate product rounded to bf16 and index_add_ accumulating in bf16.
        out.index_add_(0, token_idx, rows * gate_rows[:, None])
        return out

    return {"torch-sequential": sequential, "torch-unweighted": unweighted}


def expert_rows(dest, gate, e):
    """Expert e's rows as the dispatch delivered them (by source rank, then
    token, then k slot): each one's destination (its source), token and gate."""
    W, T, K = dest.shape
    ranks, tokens, gates = [], [], []
    for s in range(W):
        idx = (dest[s].reshape(-1) == e).nonzero().flatten()
        ranks.append(torch.full((idx.numel(),), s, dtype=torch.int32))
        tokens.append((idx // K).to(torch.int32))
        gates.append(gate[s].reshape(-1)[idx].to(torch.float32))
    return torch.cat(ranks), torch.cat(tokens), torch.cat(gates)


def flashoverlap_variant(a, b, dest, gate, send, recv, tokens, max_rows):
    """The binding's GemmAllToAll, or None (with the reason) where the package is not importable."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
    why = None
    try:
        import flashoverlap.torch as fo
    except Exception as e:  # (not installed, no library: the torch rows still count)
        why = f"flashoverlap not importable ({type(e).__name__}: {e})"
    if slowest(float(why is not None), a.device):  # (every rank runs it, or none: its calls are collective)
        return None, why or "not importable on another rank"
    rank = dist.get_rank()
    W, T, K = dest.shape
    op = fo.GemmAllToAll(None, max_rows=max(max_rows, 1), max_tokens=max(tokens, 1), topk=K, n=b.shape[0],
                         k=b.shape[1], dtype=torch.bfloat16)
    d_rank, d_token, d_gate = expert_rows(dest, gate, rank)

    def call():
        return op(a, b, d_rank, d_token, d_gate, send, recv, tokens=tokens)

    return call, None


def check_combine(out, a, b, dest, gate, rank, ntok=8, ncol=64):
    """Rank 0's combine output at a few tokens and columns against float64 on
    the CPU, from every expert's own A rows and B rows (not through the
    All-to-All): (max abs error, max of error / sum_j |gate_j y_j|, elements
    beyond the loose bound 2^-4 sum_j |gate_j y_j| + 1e-2, for bf16's roundings of
    the GEMM output, gate product and topk-term sum). None off rank 0; a collective."""
    W, T, K = dest.shape
    n = b.shape[0]
    toks = torch.linspace(0, max(T - 1, 0), min(ntok, T)).round().long().unique().tolist()
    cols = torch.linspace(0, n - 1, min(ncol, n)).round().long().unique()
    d0 = dest[0].reshape(-1)
    mine = d0 == rank  # rank 0's rows come first in A_rank, in (token, k slot) order
    pos = torch.cumsum(mine, 0) - 1
    sel = [int(pos[t * K + j]) for t in toks for j in range(K) if mine[t * K + j]]
    part = (a[torch.tensor(sel, dtype=torch.long, device=a.device)].cpu(), b[cols.to(b.device)].cpu())
    parts = [None] * W
    dist.all_gather_object(parts, part)
    if rank != 0:
        return None
    got = out[torch.tensor(toks, dtype=torch.long, device=out.device)][:, cols.to(out.device)].double().cpu()
    ref = torch.zeros(len(toks), len(cols), dtype=torch.float64)
    scale = torch.zeros_like(ref)
    used = [0] * W
    for i, t in enumerate(toks):
        for j in range(K):
            e = int(dest[0, t, j])
            y = parts[e][1].double() @ parts[e][0][used[e]].double()
            used[e] += 1
            ref[i] += float(gate[0, t, j]) * y
            scale[i] += float(gate[0, t, j]) * y.abs()
    err = (got - ref).abs()
    if not err.numel():
        return 0.0, 0.0, 0
    return float(err.max()), float((err / (scale + 1e-30)).max()), int((err > 2.0 ** -4 * scale + 1e-2).sum())


def parse_shapes(text):
    shapes = [tuple(item.split(",")) for item in filter(None, (v.strip() for v in text.split(";")))]
    if not shapes or any(len(p) != 2 or not all(v.strip().isdigit() and int(v) > 0 for v in p) for p in shapes):
        raise ValueError(f"bad --shapes '{text}' (expected \"N,K;N,K;...\", N and K >= 1)")
    return [(int(n), int(k)) for n, k in shapes]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=SHAPES, help='"N,K;N,K;..." (B_e is N x K)')
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per rank")
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--routing", default="uniform", help="uniform | zipf:S | one:R | empty:R")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="", help="CSV file (default: stdout)")
    args = ap.parse_args()
    if args.runs < 1 or args.warmup < 0:
        ap.error("--runs must be >= 1 and --warmup >= 0")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:  # (arguments first: the same error on every rank, before any GPU work)
        shapes = parse_shapes(args.shapes)
        dest, gate = draw_routing(args.routing, world, args.tokens, args.topk, args.seed)
    except ValueError as e:
        ap.error(str(e))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if not torch.cuda.is_available() or local >= torch.cuda.device_count():
        sys.exit(f"torch_alltoall.py: needs one CUDA GPU per process (NCCL); found "
                 f"{torch.cuda.device_count() if torch.cuda.is_available() else 'no CUDA'} for local rank {local}")
    device = join_nccl_group(local)
    rank = dist.get_rank()
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if rank == 0 else (lambda msg: None)
    counts, send, recv, token_idx, gate_rows = rank_plan(dest, gate, rank)
    # The same routing everywhere (one torch, one seed): compared, not assumed.
    mine = torch.cat([counts.reshape(-1).double(), (gate * (dest + 1)).sum().reshape(1)]).to(device)
    top = mine.clone()
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    if slowest(float(not torch.equal(top, mine)), device):
        log("the ranks drew different routings (different torch builds?)")
        dist.destroy_process_group()
        sys.exit(1)
    m_rows = counts.sum(0)  # m_e of every expert
    log(f"routing {args.routing}: T={args.tokens} K={args.topk} world={world}, rows per expert {m_rows.tolist()}")
    token_idx, gate_rows = token_idx.to(device), gate_rows.to(device, torch.bfloat16)
    rows = []
    for n, k in shapes:
        g = torch.Generator(device=device).manual_seed(args.seed * 1000003 + 1000 * rank + n + k)
        a = torch.rand(int(m_rows[rank]), k, device=device, dtype=torch.bfloat16, generator=g) * 2 - 1
        b = torch.rand(n, k, device=device, dtype=torch.bfloat16, generator=g) * 2 - 1
        variants = make_variants(a, b, send, recv, token_idx, gate_rows, args.tokens)
        ref = variants["torch-sequential"]()
        checked = check_combine(ref, a, b, dest, gate, rank)
        fo_call, why = flashoverlap_variant(a, b, dest, gate, send, recv, args.tokens, int(m_rows.max()))
        if fo_call is None:
            log(f"N={n} K={k}: flashoverlap-torch skipped: {why}")
        else:
            got = fo_call()
            # torch's combine rounds each product and sum to bf16, ours once from fp32: bf16's bound on the terms.
            scale = ref.float().abs().max().item() + 1e-6
            err = (got.float() - ref.float()).abs().max().item()
            bad = slowest(float(err > 2.0 ** -5 * scale * max(args.topk, 1)), device)
            log(f"N={n} K={k}: flashoverlap-torch vs torch-sequential max abs error {err:.3g} (of {scale:.3g}): "
                f"{'ok' if not bad else 'BEYOND THE BOUND'}")
            variants["flashoverlap-torch"] = fo_call
        if rank == 0:
            err, rel, bad = checked
            log(f"N={n} K={k}: combine vs float64 max abs error {err:.3g} (relative {rel:.3g}): "
                f"{'ok' if bad == 0 else f'{bad} elements BEYOND THE TOLERANCE'}")
        names = list(variants)
        ms = time_in_turns([variants[v] for v in names], 1, args.runs, device, warmup=args.warmup)
        for v, t in zip(names, ms):
            log(f"  {v:18s} {t:8.3f} ms")
            rows.append(dict(N=n, K=k, tokens=args.tokens, topk=args.topk, routing=args.routing, dtype="bf16",
                             world=world, variant=v, ms=f"{t:.6f}", max_rows=int(m_rows.max())))
        del a, b, variants
        torch.cuda.empty_cache()
    if rank == 0:
        fh = open(args.out, "w") if args.out else sys.stdout
        fh.write(machine_line(device, world))
        out = csv.DictWriter(fh, fieldnames=COLUMNS, lineterminator="\n")
        out.writeheader()
        out.writerows(rows)
        if fh is not sys.stdout:
            fh.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
