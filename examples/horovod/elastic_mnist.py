"""Elastic MNIST-style training with Horovod Elastic, on scikit-learn's 8x8 digits (bundled: nothing to download).

In the style of Horovod's examples/elastic/pytorch/pytorch_mnist_elastic.py: the training function wrapped in
hvd.elastic.run, a TorchState holding the model, the optimizer, the ElasticSampler and the loop's place (epoch,
batch), a commit every --batches-per-commit batches, and the learning rate scaled again for the new number of
workers after a reset. The same script runs under real Horovod Elastic and under dpcompare's native layer on
torchrun's elastic agent:

    horovodrun -np 3 --min-np 2 --host-discovery-script ./discover.sh python elastic_mnist.py
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes 1:2 --nproc-per-node 2 --rdzv-backend c10d \\
        --rdzv-endpoint localhost:29400 --max-restarts 3 \\
        --no-python dpcompare script -- python elastic_mnist.py        # the layer, no Horovod needed

No dropout, and only whole batches: a run that lost a worker and resumed from a commit computes the same numbers as
one that did not (at the same number of workers).
"""

import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

parser = argparse.ArgumentParser(description="PyTorch elastic digits example")
parser.add_argument("--batch-size", type=int, default=16, help="input batch size per worker (default: 16)")
parser.add_argument("--epochs", type=int, default=2, help="number of epochs to train (default: 2)")
parser.add_argument("--lr", type=float, default=0.05, help="learning rate per worker (default: 0.05)")
parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default: 0.9)")
parser.add_argument("--seed", type=int, default=42, help="random seed (default: 42)")
parser.add_argument("--batches-per-commit", type=int, default=10, help="batches between commits (default: 10)")
parser.add_argument("--log-interval", type=int, default=20, help="batches between log lines")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(32 * 2 * 2, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


def digits():
    data = load_digits()
    x = torch.tensor(data.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(data.target, dtype=torch.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    return torch.utils.data.TensorDataset(x_train, y_train), torch.utils.data.TensorDataset(x_test, y_test)


def main(args):
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    train_dataset, test_dataset = digits()
    # Horovod: ElasticSampler splits what is left of the epoch among the workers there are now.
    train_sampler = hvd.elastic.ElasticSampler(train_dataset, shuffle=True, seed=args.seed)
    # drop_last: the sampler pads the rest of the epoch with its first samples, which differ after a resume
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler,
                                               drop_last=True)

    model = Net()
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    @hvd.elastic.run
    def train(state):
        # after a reset this starts again from the last commit: state.epoch, state.batch and the sampler's place
        for state.epoch in range(state.epoch, args.epochs + 1):  # noqa: B020  (Horovod's idiom)
            state.model.train()
            for batch_idx, (data, target) in enumerate(train_loader):
                state.optimizer.zero_grad()
                loss = F.nll_loss(state.model(data), target)
                loss.backward()
                state.optimizer.step()
                state.train_sampler.record_batch(batch_idx, args.batch_size)
                state.batch += 1
                if state.batch % args.log_interval == 0 and hvd.rank() == 0:
                    print(f"epoch {state.epoch} batch {state.batch} ({hvd.size()} workers): loss {loss.item():.4f}")
                if state.batch % args.batches_per_commit == 0:
                    state.commit()
            # Horovod: set_epoch at the end of an epoch clears the samples processed
            state.train_sampler.set_epoch(state.epoch + 1)
            state.batch = 0
            state.commit()

    def on_state_reset():
        # Horovod: the learning rate for the new number of workers
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()

    state = hvd.elastic.TorchState(model, optimizer, train_sampler=train_sampler, epoch=1, batch=0)
    state.register_reset_callbacks([on_state_reset])
    train(state)

    model.eval()
    x, y = test_dataset.tensors
    with torch.no_grad():
        accuracy = model(x).argmax(dim=1).eq(y).float().mean()
    accuracy = hvd.allreduce(accuracy, name="val_accuracy").item()
    if hvd.rank() == 0:
        print(f"test accuracy: {100.0 * accuracy:.2f}% ({hvd.size()} workers)")


if __name__ == "__main__":
    main(parser.parse_args())
