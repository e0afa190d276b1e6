"""What a training job computes: datasets by name and workloads.

The torch-free catalog (:mod:`.catalog`), the loaders and samplers (:mod:`.datasets`), the
:class:`~.workload.Workload` interface (:mod:`.workload`) and the built-in classification workloads
(:mod:`.builtin`).

May import: the top-level modules and models. Importing this package imports neither torch nor a dataset.
"""
