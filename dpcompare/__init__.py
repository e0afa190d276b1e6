"""dpcompare: one training job under DDP and Horovod, compared honestly."""
__version__ = "0.1.0"
