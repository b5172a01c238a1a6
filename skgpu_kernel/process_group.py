"""The process group of a fit that runs on every rank of a ``torch.distributed`` group (``distributed=True``).

Below the solvers and the parallel strategies, which both use it: the ranks agree
on every decision that depends on what each measures.
"""

import io

import torch

__all__ = ["agree", "agree_on_object", "default_process_group"]


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


def agree_on_object(value, group, device):
    """Rank 0's ``value`` (any picklable object, tensors moved to ``device``) on every rank.

    For decisions computed from floating-point results that may differ in the last
    bits between ranks: a symmetric eigensolver's threads (MKL on a busy CPU) gave
    two ranks learning rates 2e-10 apart, and their models drifted 2e-5 apart in two
    epochs.  Without a group, ``value`` itself.
    """
    if group is None:
        return value
    import torch.distributed as dist

    on = device if dist.get_backend(group) == "nccl" else torch.device("cpu")
    first = dist.get_global_rank(group, 0)
    payload = [None]
    if dist.get_rank() == first:
        buffer = io.BytesIO()
        torch.save(value, buffer)
        payload = [buffer.getvalue()]
    dist.broadcast_object_list(payload, src=first, group=group, device=on)
    if dist.get_rank() == first:
        return value
    return torch.load(io.BytesIO(payload[0]), map_location=device, weights_only=False)
