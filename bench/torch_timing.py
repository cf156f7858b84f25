"""What the PyTorch baseline scripts (torch_linear.py, torch_alltoall.py,
never_slower.py, scaled_mm.py) share: joining the NCCL process group, the
slowest rank's value, variants timed in turns (host included, or the device's
time alone), and the CSV's '#' line naming the machine."""
import datetime
import statistics
import sys

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


def timed_sleep_cycles_per_ms(cycles):
    """GPU clock cycles per ms of one torch.cuda._sleep(cycles), timed by CUDA events."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    torch.cuda._sleep(cycles)
    e.record()
    e.synchronize()
    return cycles / max(s.elapsed_time(e), 1e-3)


_cycles_per_ms = None


def _sleep_cycles_per_ms():
    """GPU clock cycles per ms of torch.cuda._sleep, measured once (the faster
    of two timed sleeps: a sleep longer than asked is harmless)."""
    global _cycles_per_ms
    if _cycles_per_ms is None:
        # (two: the first may load the kernel)
        _cycles_per_ms = max(timed_sleep_cycles_per_ms(20_000_000) for _ in range(2))
    return _cycles_per_ms


def device_ms_in_turns(fns, iters, turns, warmup=3, sleep_ms=5.0):
    """ms of device time per call of each of fns (one process): as
    time_in_turns, but each run of `iters` calls is queued behind a GPU sleep
    long enough that the host has queued the whole run before the GPU reaches
    it, so the events time the kernels back to back, not the host's dispatch
    (as a kernel timed alone, or a CUDA graph's replay, would be). A run whose
    sleep ended before the host was done is run again behind a sleep twice as
    long; after four tries the run counts as is and a warning says so."""
    for f in fns:
        for _ in range(warmup):
            f()
    torch.cuda.synchronize()
    per = [[] for _ in fns]
    for t in range(turns):
        order = list(range(len(fns)))
        if t % 2:
            order.reverse()
        for i in order:
            for attempt in range(4):
                torch.cuda.synchronize()
                torch.cuda._sleep(int(sleep_ms * _sleep_cycles_per_ms()))
                awake = torch.cuda.Event()
                awake.record()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(iters):
                    fns[i]()
                e.record()
                early = awake.query()  # (the GPU is past the sleep: it may have waited for the host)
                e.synchronize()
                if not early:
                    break
                if attempt == 3:
                    print(f"device_ms_in_turns: the GPU woke before the host had queued {iters} calls behind "
                          f"{sleep_ms:.0f} ms: this run's time may hold host gaps", file=sys.stderr)
                else:
                    sleep_ms *= 2
            per[i].append(s.elapsed_time(e) / iters)
    return [statistics.median(p) for p in per]


def machine_line(device, world, **more):
    """'# gpu=...; torch=...; nccl=...; <more, in order>; world=W; date=...' (and a newline)."""
    nccl = torch.cuda.nccl.version()
    nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    fields = [f"gpu={torch.cuda.get_device_name(device)}", f"torch={torch.__version__}", f"nccl={nccl}"]
    fields += [f"{k}={v}" for k, v in more.items()]
    fields += [f"world={world}", f"date={datetime.datetime.now().isoformat(timespec='seconds')}"]
    return "# " + "; ".join(fields) + "\n"
