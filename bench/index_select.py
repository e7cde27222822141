# torch baselines for bench/hot-path.ts, on the same GPU in the same run: for each token count, the
# device time of x.index_select(0, rows) of every row (the local path of a dispatch that keeps all
# rows), of a device-to-device copy of the same bytes, and the host time of a trivial torch op.
# CUDA events around `iters` calls after warm-up (back to back: the launch latency hidden); for
# index_select also the median of events around each single call after a synchronize (as the addon
# times one op: rank.timeOps). Prints one JSON object.
import json
import sys
import time

import torch

hidden = int(sys.argv[1]) if len(sys.argv) > 1 else 7168
tokens = [int(t) for t in (sys.argv[2] if len(sys.argv) > 2 else "128,4096").split(",")]
iters = 200
dev = torch.device("cuda")
out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "hidden": hidden, "figures": []}


def device_us(fn):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / iters


def per_call_us(fn):
    for _ in range(20):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    us = []
    for _ in range(iters):
        torch.cuda.synchronize()
        a.record()
        fn()
        b.record()
        b.synchronize()
        us.append(a.elapsed_time(b) * 1e3)
    return sorted(us)[len(us) // 2]


for t in tokens:
    x = torch.randn(t, hidden, device=dev, dtype=torch.bfloat16)
    rows = torch.randperm(t, device=dev)
    y = torch.empty_like(x)
    out["figures"].append({"op": "index_select of every row", "tokens": t, "device_us": device_us(lambda: torch.index_select(x, 0, rows, out=y))})
    out["figures"].append({"op": "index_select of every row, per call", "tokens": t, "device_us": per_call_us(lambda: torch.index_select(x, 0, rows, out=y))})
    out["figures"].append({"op": "device-to-device copy", "tokens": t, "device_us": device_us(lambda: y.copy_(x))})

z = torch.zeros(1, device=dev)
for _ in range(100):
    z.add_(1)
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(2000):
    z.add_(1)
out["trivial_op_host_us"] = (time.perf_counter() - t0) * 1e6 / 2000
torch.cuda.synchronize()
print(json.dumps(out))
