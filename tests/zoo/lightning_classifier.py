"""A LightningModule, written as Lightning's docs teach, trained by dpcompare under every strategy without the
Trainer (``--workload lightning:tests/zoo/lightning_classifier.py:LitClassifier``).

It has what Lightning users write: ``training_step`` returning the loss, ``validation_step`` logging metrics with
``self.log``, ``configure_optimizers`` with an optimizer and a scheduler stepped per step, its own dataloaders,
dropout and ``save_hyperparameters``. (Only ``lightning`` itself is needed: ``pip install -e '.[lightning]'``.)
"""

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def blobs(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g)
    return TensorDataset(x, (x[:, :3].sum(1) > 0).long() + (x[:, 3] > 1).long())


class LitClassifier(pl.LightningModule):
    def __init__(self, hidden: int = 32, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(20, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_acc", (logits.argmax(1) == y).float().mean())
        self.log("val_loss", F.cross_entropy(logits, y))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def train_dataloader(self):
        return DataLoader(blobs(512, 0), batch_size=16, shuffle=True)

    def val_dataloader(self):
        return DataLoader(blobs(128, 1), batch_size=64)
