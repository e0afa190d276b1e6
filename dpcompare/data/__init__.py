"""Datasets by name: the torch-free catalog (:mod:`.catalog`) and the loaders and samplers (:mod:`.datasets`).

May import: the top-level modules (errors, files) and ``models`` (for the optional torchvision import).
Importing this package imports neither torch nor a dataset.
"""
