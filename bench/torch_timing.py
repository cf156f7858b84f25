"""What the PyTorch baseline scripts (torch_linear.py, torch_alltoall.py,
never_slower.py) share: joining the NCCL process group, the slowest rank's
value, variants timed in turns, and the CSV's '#' line naming the machine."""
import datetime
import statistics

import torch
import torch.distributed as dist


def join_nccl_group(local):
    """This process on GPU `local` in the default NCCL process group; its device."""
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    try:
        dist.init_process_group("nccl", device_id=device)
    except TypeError:  # (a torch without device_id)
        dist.init_process_group("nccl")
    return device


def slowest(value, device):
    """The largest of every rank's value (the slowest rank's time, or 'any rank')."""
    t = torch.tensor([value], device=device, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def time_in_turns(fns, iters, turns, device=None, warmup=3):
    """ms per call of each of fns: `warmup` calls each, then `turns` turns, in
    each a run of `iters` calls per fn between CUDA events (the ranks started
    together); the median over the turns, the slowest rank's. device None:
    one process without a process group (no barrier; its own medians)."""
    for f in fns:
        for _ in range(warmup):
            f()
    torch.cuda.synchronize()
    per = [[] for _ in fns]
    for _ in range(turns):
        for i, f in enumerate(fns):
            if device is not None:
                dist.barrier()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(iters):
                f()
            e.record()
            e.synchronize()
            per[i].append(s.elapsed_time(e) / iters)
    return [statistics.median(p) if device is None else slowest(statistics.median(p), device) for p in per]


def machine_line(device, world, **more):
    """'# gpu=...; torch=...; nccl=...; <more, in order>; world=W; date=...' (and a newline)."""
    nccl = torch.cuda.nccl.version()
    nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    fields = [f"gpu={torch.cuda.get_device_name(device)}", f"torch={torch.__version__}", f"nccl={nccl}"]
    fields += [f"{k}={v}" for k, v in more.items()]
    fields += [f"world={world}", f"date={datetime.datetime.now().isoformat(timespec='seconds')}"]
    return "# " + "; ".join(fields) + "\n"
