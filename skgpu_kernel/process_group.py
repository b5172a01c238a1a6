"""The process group of a fit that runs on every rank of a ``torch.distributed`` group (``distributed=True``).

Below the solvers and the parallel strategies, which both use it: the ranks agree
on every decision that depends on what each measures.
"""

import torch

__all__ = ["agree", "default_process_group"]


def default_process_group():
    """The default ``torch.distributed`` group, which ``distributed=True`` requires."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "distributed=True shards the centers across the ranks of the default torch.distributed process "
            "group, but none is initialised: launch with torchrun (or call torch.distributed.init_process_group) "
            "and call fit with the same data and parameters on every rank."
        )
    return dist.group.WORLD


def agree(values, group, device):
    """Rank 0's integers on every rank (``values`` as integers without a group).

    Decisions that depend on what a rank measures (free memory, timings) must be
    the same on every rank, or the ranks' collectives fall out of step.
    """
    if group is None:
        return [int(value) for value in values]
    import torch.distributed as dist

    on = device if dist.get_backend(group) == "nccl" else torch.device("cpu")
    tensor = torch.tensor([int(value) for value in values], dtype=torch.int64, device=on)
    dist.broadcast(tensor, src=dist.get_global_rank(group, 0), group=group)
    return [int(value) for value in tensor.tolist()]
