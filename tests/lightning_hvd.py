"""A Horovod Lightning 1.x script in the idioms of Horovod's pytorch_lightning_mnist.py, on tiny random data:
``Trainer(accelerator='horovod')``, hooks Lightning 2 removed, a 'log' dict, and an ``hvd.allreduce`` metric
helper after training. tests/test_port_lightning.py ports it (dpcompare/native/port_lightning.py) and runs it.

``lightning_hvd.py OUT``: rank 0 writes OUT (the epoch-end counts and the averaged metric) when done.
"""

import json
import sys

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from pytorch_lightning import Callback, LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset


class Net(LightningModule):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x):
        return F.log_softmax(self.fc(x), -1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def training_step(self, batch, batch_nb):
        x, y = batch
        loss = F.nll_loss(self(x), y)
        return {'loss': loss, 'log': {'train_loss': loss}}

    def validation_step(self, batch, batch_nb):
        x, y = batch
        return {'val_loss': F.nll_loss(self(x), y)}

    def validation_epoch_end(self, outputs):
        avg_loss = torch.stack([x['val_loss'] for x in outputs]).mean()
        return {'avg_val_loss': avg_loss, 'log': {'val_loss': avg_loss}}


class Counter(Callback):
    def __init__(self):
        self.epoch_ends = 0

    def on_init_start(self, trainer):
        print('Starting to init trainer!')

    def on_epoch_end(self, trainer, model):
        self.epoch_ends += 1


def metric_average(val, name):
    avg_tensor = hvd.allreduce(torch.tensor(val), name=name)
    return avg_tensor.item()


if __name__ == '__main__':
    hvd.init()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 8), torch.randint(0, 3, (32,)))
    sampler = torch.utils.data.distributed.DistributedSampler(data, num_replicas=hvd.size(), rank=hvd.rank())
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    counter = Counter()
    trainer = Trainer(accelerator='horovod',
                      gpus=0,
                      callbacks=[counter],
                      max_epochs=1,
                      logger=False,
                      enable_checkpointing=False,
                      enable_progress_bar=False,
                      num_sanity_val_steps=0)
    trainer.fit(Net(), loader, loader)
    average = metric_average(float(hvd.rank()), 'rank')
    if hvd.rank() == 0:
        with open(sys.argv[1], 'w') as f:
            json.dump({'epoch_ends': counter.epoch_ends, 'average_rank': average, 'size': hvd.size(),
                       'val_loss': float(trainer.callback_metrics['val_loss'])}, f)
