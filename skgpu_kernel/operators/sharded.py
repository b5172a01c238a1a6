"""Centers in contiguous shards over devices or a process group's ranks: an operator per shard, products summed."""

import dataclasses
from dataclasses import dataclass

import torch

from ..operator_facts import (
    OperatorBlocks,
    shard_bounds,
)
from .core import KernelOperator
from .factory import CenterOperators


@dataclass(frozen=True)
class ShardLayout:
    """Which contiguous ranges of the centers this process holds, on which devices.

    Attributes
    ----------
    bounds : tuple of (int, int)
        ``(start, stop)`` of each local shard among the ``n_centers`` centers.
    devices : tuple of torch.device
        The device of each local shard.
    main : torch.device
        Where coefficient-sized tensors and results live.
    n_centers : int
    group : ProcessGroup or None
        With a group, each rank holds one shard and products are completed by an
        all-reduce.
    """

    bounds: tuple
    devices: tuple
    main: torch.device
    n_centers: int
    group: object = None

    @classmethod
    def of(cls, n_centers, devices, group=None):
        """Shards over ``devices`` (one process), or this rank's shard of ``group`` on ``devices[0]``."""
        devices = tuple(devices)
        if group is None:
            return cls(tuple(shard_bounds(n_centers, len(devices))), devices, devices[0], n_centers)
        import torch.distributed as dist

        rank, world = dist.get_rank(group), dist.get_world_size(group)
        return cls((shard_bounds(n_centers, world)[rank],), devices[:1], devices[0], n_centers, group)

    def all_reduce(self, tensor):
        """``tensor`` summed over the group's ranks (itself without a group)."""
        if self.group is not None:
            import torch.distributed as dist

            dist.all_reduce(tensor, group=self.group)
        return tensor


class ShardedBlock:
    """``K(rows, Z)`` held as one block per local shard, each on its shard's device.

    One evaluation serves both products of a step: the predictions ``K(rows, Z) @
    coef`` and the gradient's ``K(Z, rows) @ values``.
    """

    def __init__(self, blocks, layout):
        self.blocks, self.layout = blocks, layout

    def matmul(self, coef):
        """``K(rows, Z) @ coef`` (rows x l, on the main device) for ``coef`` of all ``n_centers`` rows."""
        out = None
        for block, (start, stop) in zip(self.blocks, self.layout.bounds, strict=True):
            part = (block @ coef[start:stop].to(block.device, non_blocking=True)).to(self.layout.main)
            out = part if out is None else out.add_(part)
        return self.layout.all_reduce(out)

    def transpose_matmul(self, values):
        """``K(Z, rows) @ values`` (n_centers x l, on the main device)."""
        layout = self.layout
        out = torch.zeros(layout.n_centers, values.shape[1], dtype=values.dtype, device=layout.main)
        for block, (start, stop) in zip(self.blocks, layout.bounds, strict=True):
            out[start:stop] = (block.T @ values.to(block.device, non_blocking=True)).to(layout.main)
        return layout.all_reduce(out)


class ShardedOperator(KernelOperator):
    """``K(X, Z)`` with the centers in contiguous shards, one operator of any kind per local shard.

    Parameters
    ----------
    shards : list of KernelOperator
        ``K(X, Z_i)`` of each local shard, on its device.
    layout : ShardLayout
    row_block : int
        Rows whose blocks are evaluated at once by :meth:`matmul`.
    """

    kind = "sharded"

    def __init__(self, shards, layout, row_block):
        self.shards, self.layout, self.row_block = shards, layout, max(int(row_block), 1)
        self.dtype, self.device = shards[0].dtype, layout.main
        self.shape = (shards[0].shape[0], layout.n_centers)
        self.kernel = shards[0].kernel

    def sharded_block(self, rows=None):
        """``K[rows, :]`` as one block per local shard (a :class:`ShardedBlock`).

        Tensor ``rows`` (a batch's indices, on the main device) are moved to each
        shard's device: a shard on the CPU beside a GPU cannot read CUDA indices.
        """
        if not isinstance(rows, torch.Tensor):
            return ShardedBlock([shard.block(rows) for shard in self.shards], self.layout)
        blocks = [shard.block(rows.to(device)) for shard, device in zip(self.shards, self.layout.devices, strict=True)]
        return ShardedBlock(blocks, self.layout)

    def matmul(self, V, rows=None, leading=0):
        if leading:
            raise NotImplementedError("a sharded operator has no leading block: the correction reads one shard")
        if rows is not None:
            return self.sharded_block(rows).matmul(V)
        m = self.shape[0]
        pieces = [
            self.sharded_block(slice(start, min(start + self.row_block, m))).matmul(V)
            for start in range(0, m, self.row_block)
        ]
        if not pieces:
            return torch.zeros(0, V.shape[1], dtype=self.dtype, device=self.device)
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def block(self, rows=None):
        if self.layout.group is not None:
            raise NotImplementedError("each rank holds only its own shard's columns: use sharded_block")
        pieces = [block.to(self.layout.main) for block in self.sharded_block(rows).blocks]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)

    def cached(self, storage_dtype, column_block):
        """The same operator with every shard's ``K(X, Z_i)`` computed once (:meth:`CachedOperator.fill`)."""
        caches = [shard.cached(storage_dtype, self.row_block, column_block) for shard in self.shards]
        return ShardedOperator(caches, self.layout, self.row_block)

    @property
    def nbytes(self):
        return sum(shard.nbytes for shard in self.shards)


class CenterShards:
    """The centers split in contiguous shards, prepared on their devices: the factory of sharded operators.

    In one process, shard ``i`` lives on ``devices[i]``.  With a ``group`` (an
    initialised ``torch.distributed`` process group of ``W`` ranks), the centers are
    split in ``W`` shards and this rank holds only its own, on ``devices[0]``.  With
    a ``grid`` (the operator plan's), each shard's blocks come from exact int8
    distances of rows on that grid (:class:`GridOperator`), and from float blocks
    for rows off it.  After :meth:`cache`, the training rows' blocks are read from
    the cache (:meth:`rows_block`).

    Parameters
    ----------
    kernel : Kernel
    centers : Tensor of shape (p, d)
        Raw (not prepared) centers, on any device.
    devices : list of torch.device
    column_block : int
        Columns of a kernel block evaluated at once.
    group : ProcessGroup or None
    grid : Grid or None
        The common grid of the centers and the training rows, where the products take it.
    """

    def __init__(self, kernel, centers, devices, column_block, group=None, grid=None):
        self.kernel = kernel
        self.layout = layout = ShardLayout.of(centers.shape[0], devices, group)
        self.main, self.group, self.n_centers = layout.main, group, layout.n_centers
        # The plan measured that the centers lie on the grid, where it takes one.
        self.factories = [
            CenterOperators.of(kernel, centers[start:stop].to(device), grid)
            for (start, stop), device in zip(layout.bounds, layout.devices, strict=True)
        ]
        self.prepared = [factory.prepared for factory in self.factories]
        self.column_block = max(int(column_block), 1)
        self.cached = None
        self.grid = grid

    def operator(self, rows, row_block=None, on_grid=False):
        """The sharded operator ``K(rows, Z)`` (``row_block`` rows prepared at once).

        ``on_grid``: ``rows`` are training rows, which the plan found on the grid
        (they are encoded unchecked); other rows are checked, and evaluated in float
        blocks when off the grid.
        """
        row_block = row_block or rows.shape[0]
        blocks = OperatorBlocks.whole(row_block, self.column_block)
        # The rows' codes once, on the main device: the same codes for every shard.
        codes = None if self.grid is None else self.factories[0].encode(rows.to(self.main), on_grid)
        pairs = zip(self.factories, self.layout.devices, strict=True)
        if codes is None:
            shards = [factory.operator(rows.to(device, non_blocking=True), blocks) for factory, device in pairs]
        else:
            shards = [factory.operator(rows, blocks, _codes_on(codes, device)) for factory, device in pairs]
        return ShardedOperator(shards, self.layout, row_block)

    def cache(self, rows, row_block):
        """Compute and keep ``K(rows, Z_i)`` of the training ``rows`` (on the main device) for every local shard."""
        self.cached = self.operator(rows, row_block, on_grid=True).cached(rows.dtype, self.column_block)

    def rows_block(self, rows, indices=None):
        """``K(rows, Z)`` of training rows: read at ``indices`` from the cache where there is one, else evaluated."""
        if self.cached is not None:
            return self.cached.sharded_block(indices)
        return self.operator(rows, on_grid=True).sharded_block()


def _codes_on(codes, device):
    """``codes`` (a :class:`~skgpu_kernel.grid.GridCodes`) on ``device``."""
    if codes.codes_t.device == device:
        return codes
    return dataclasses.replace(codes, codes_t=codes.codes_t.to(device), sq_norms=codes.sq_norms.to(device))
