#!/usr/bin/env python
"""Seed 003 as an illustration of ``dpcompare predict``: ResNet-50 on A100-class nodes, 4 → 32 nodes.

    python bench/predict_seed003.py [--gpus-per-node 4] [--link 200gbit]

Inputs, all assumptions (bench/predict-validation.md, "Seed 003", says where they come from): ResNet-50's parameter
tensors from torchvision (25.6 M parameters, 102 MB of fp32 gradients); 2,470 images/s per A100 with mixed precision at
256 images per GPU (NVIDIA DeepLearningExamples, ResNet-50 v1.5 PyTorch, DGX A100, 1 GPU), so 103.6 ms of
compute per step, one third forward and two thirds backward, the optimizer and data loading free; gradients
ready one after another at equal intervals over backward in reverse parameter order. Prints the model's step
time and efficiency against 4 nodes for ddp and horovod next to the seed's measured wall times.
"""

from __future__ import annotations

import argparse

from dpcompare.argtypes import format_rate_bits, rate_bits
from dpcompare.prediction.network import Link, Network, parse_duration
from dpcompare.prediction.profile import Grad, Profile
from dpcompare.prediction.schedule import Knobs
from dpcompare.prediction.strategies import schedule

IMAGES_PER_S, BATCH = 2470.0, 256
MEASURED_S = {4: 24 * 60 + 48, 8: 13 * 60 + 10, 16: 6 * 60 + 56, 32: 4 * 60 + 48}


def resnet50_profile() -> Profile:
    import torchvision

    params = list(torchvision.models.resnet50().named_parameters())
    step = BATCH / IMAGES_PER_S
    forward, backward = step / 3, 2 * step / 3
    grads = [Grad(n, backward * (i + 1) / len(params), p.numel() * 4.0) for i, (n, p) in enumerate(reversed(params))]
    buffers = sum(b.numel() * b.element_size() for b in torchvision.models.resnet50().buffers())
    return Profile(run="seed 003 (assumed)", strategy="ddp", sharded=False, world_size=1, data=0.0, forward=forward,
                   backward=backward, optimizer=0.0, grads=grads, batch=BATCH, buffer_bytes=float(buffers))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--link", type=rate_bits, default="200gbit")
    ap.add_argument("--latency", default="5us")
    ap.add_argument("--intra-link", type=rate_bits, default="300gbyte")
    a = ap.parse_args()
    p = resnet50_profile()
    print(f"ResNet-50: {len(p.grads)} tensors, {p.grad_bytes / 1e6:.1f} MB of fp32 gradients, "
          f"{p.compute * 1e3:.1f} ms compute per step ({BATCH} images per GPU), buffers {p.buffer_bytes / 1e6:.2f} MB")
    net = Network(1, Link.of(parse_duration(a.latency), a.link), a.gpus_per_node,
                  Link.of(parse_duration("1us"), a.intra_link))
    for name in ("ddp", "horovod"):
        s = schedule(name)(p, Knobs())
        steps = {n: s.run(net.with_hosts(n)) for n in MEASURED_S}
        base = steps[4].step
        # one constant that does not shrink with nodes (start-up, first epoch, evaluation, file system), fitted to
        # the 4- and 32-node times: T(n) = F + (T4 - F) * (4 / n) * step(n) / step(4)
        r32, t4, t32 = steps[32].step / base, MEASURED_S[4], MEASURED_S[32]
        fixed = (t32 - t4 * 4 / 32 * r32) / (1 - 4 / 32 * r32)
        print(f"\n{name}: {a.gpus_per_node} GPUs/node, {format_rate_bits(a.link)} between nodes, "
              f"{format_rate_bits(a.intra_link)} inside")
        print(" nodes  step ms  exposed ms  hidden ms  eff. vs 4 nodes | measured  of linear | F + model")
        for n, st in steps.items():
            eff, meas = base / st.step, MEASURED_S[n]
            lin = MEASURED_S[4] * 4 / n / meas
            fit = fixed + (t4 - fixed) * 4 / n * st.step / base
            print(f" {n:5d}  {st.step * 1e3:7.1f}  {st.exposed * 1e3:10.2f}  {st.hidden * 1e3:9.2f}  {eff:14.1%} | "
                  f"{meas // 60:3.0f}m{meas % 60:02.0f}s  {lin:9.0%} | {fit // 60:3.0f}m{fit % 60:02.0f}s")
        print(f" fitted fixed part F = {fixed:.0f} s")


if __name__ == "__main__":
    main()
