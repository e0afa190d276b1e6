"""Synthetic benchmark with Horovod, in the style of Horovod's examples/pytorch/pytorch_synthetic_benchmark.py.

A fixed random batch, --num-iters timed iterations of --num-batches-per-iter steps each after a warm-up. Models:
any torchvision model by name (resnet18, resnet50, ...), or gpt-mini / gpt-tiny, a small decoder-only transformer
defined here (bytes as tokens, no download). A plain Horovod script:

    horovodrun -np 2 python synthetic_benchmark.py --model resnet18 --batch-size 16
    mpirun -np 2 python -m dpcompare.native synthetic_benchmark.py --model resnet18 --batch-size 16
"""

import argparse
import timeit

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

parser = argparse.ArgumentParser(description="PyTorch Synthetic Benchmark",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", action="store_true", default=False, help="use fp16 compression in allreduce")
parser.add_argument("--model", type=str, default="resnet18", help="torchvision model, or gpt-mini / gpt-tiny")
parser.add_argument("--batch-size", type=int, default=16, help="input batch size (sequences for gpt-*)")
parser.add_argument("--num-warmup-batches", type=int, default=5, help="warm-up batches not counted")
parser.add_argument("--num-batches-per-iter", type=int, default=5, help="batches per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=5, help="number of benchmark iterations")
parser.add_argument("--no-cuda", action="store_true", default=False, help="disables CUDA training")
parser.add_argument("--seed", type=int, default=42, help="random seed for the weights and the batch")

#: (layers, heads, width, context) of the built-in transformers
GPT = {"gpt-tiny": (4, 4, 128, 256), "gpt-mini": (6, 8, 256, 256)}


class TinyGPT(nn.Module):
    """Pre-LayerNorm causal transformer over bytes, no dropout."""

    def __init__(self, layers, heads, width, context, vocab=256):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(context, width))
        block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, idx):
        t = idx.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
        x = self.blocks(self.tok(idx) + self.pos[:t], mask=mask, is_causal=True)
        return self.head(self.norm(x))


def build(args):
    if args.model in GPT:
        layers, heads, width, context = GPT[args.model]
        model = TinyGPT(layers, heads, width, context)
        data = torch.randint(0, 256, (args.batch_size, context + 1))
        return model, data[:, :-1], data[:, 1:], args.batch_size * context, "tokens"
    from torchvision import models

    model = getattr(models, args.model)()
    data = torch.randn(args.batch_size, 3, 224, 224)
    target = torch.LongTensor(args.batch_size).random_() % 1000
    return model, data, target, args.batch_size, "img"


def main(args):
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    hvd.init()
    torch.manual_seed(args.seed)
    if args.cuda:
        # Horovod: pin GPU to local rank.
        torch.cuda.set_device(hvd.local_rank())

    model, data, target, per_batch, unit = build(args)
    if args.cuda:
        model.cuda()
        data, target = data.cuda(), target.cuda()

    optimizer = optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    # Horovod: wrap optimizer with DistributedOptimizer.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average)
    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def benchmark_step():
        optimizer.zero_grad()
        output = model(data)
        loss = F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
        loss.backward()
        optimizer.step()

    def log(s):
        if hvd.rank() == 0:
            print(s, flush=True)

    device = "GPU" if args.cuda else "CPU"
    log(f"Model: {args.model}\nBatch size: {args.batch_size}\nNumber of {device}s: {hvd.size()}")
    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    log("Running benchmark...")
    rates = []
    for x in range(args.num_iters):
        seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        rates.append(per_batch * args.num_batches_per_iter / seconds)
        log(f"Iter #{x}: {rates[-1]:.1f} {unit}/sec per {device}")
    mean, conf = np.mean(rates), 1.96 * np.std(rates)
    log(f"{unit.capitalize()}/sec per {device}: {mean:.1f} +-{conf:.1f}")
    log(f"Total {unit}/sec on {hvd.size()} {device}(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")


if __name__ == "__main__":
    main(parser.parse_args())
