"""The runner of a parallel BMGD fit: a strategy's workers train what the pipeline planned.

The estimator hands :func:`worker_runner` its ``parallel=`` strategy (a copy); the
BMGD pipeline (:func:`~skgpu_kernel.bmgd_fit.fit_bmgd_model`) plans the
fit and calls :meth:`WorkerRunner.train`, which sends one
:class:`~skgpu_kernel.parallel.worker.TrainingJob` to the workers
(:func:`~skgpu_kernel.parallel.launch.run_distributed`) and returns their model
with the facts only a parallel fit reports.  The pipeline knows neither the
strategies nor the workers: it reaches them through this runner only.
"""

from dataclasses import dataclass

import torch

from ..solvers.sgd import SGDOutcome
from .launch import run_distributed, share_for_workers
from .worker import TrainingJob, source_spec, train_worker

__all__ = ["WorkerRunner", "worker_runner"]


def worker_runner(strategy, default_device):
    """The runner of ``strategy``'s workers, placed and validated before any process starts.

    Parameters
    ----------
    strategy : ParallelStrategy
        The estimator's ``parallel=`` (a copy: the fit records it).
    default_device : torch.device
        Where workers go when the strategy names no devices.

    Returns
    -------
    WorkerRunner
    """
    return WorkerRunner(strategy, strategy.resolve_devices(default_device))


@dataclass(frozen=True)
class WorkerRunner:
    """Trains a planned BMGD fit on a strategy's worker processes (or as this rank of a torchrun group).

    Parameters
    ----------
    strategy : ParallelStrategy
    devices : list of torch.device
        One per worker.
    """

    strategy: object
    devices: list
    # The strategy's model is its own: a rank of a torchrun group reads its shard
    # alone, and a polish here would finish another problem than the workers solved.
    trains_in_process = False

    @property
    def description(self):
        """The strategy and its workers' devices, for the ``verbose`` line."""
        return f"{type(self.strategy).__name__} on {[str(device) for device in self.devices]}"

    def check_settings(self, settings):
        """Reject early stopping: its one validation split would have to be seen by one process.

        Parameters
        ----------
        settings : BMGDSettings

        Raises
        ------
        ValueError
            When ``settings.early_stopping`` is set.
        """
        if settings.early_stopping:
            raise ValueError(
                "early_stopping needs one validation split seen by one process; it is not available with "
                "parallel=. Set early_stopping=False (tol does not apply to parallel fits either)."
            )

    def train(self, training):
        """Train on the workers, starting from ``training.coef`` and ``training.intercept``.

        Parameters
        ----------
        training : BMGDTraining

        Returns
        -------
        SGDOutcome
            The model on the CPU; its facts are the strategy (``parallel_``), the
            number of workers (``n_workers_``), the bytes each all-reduced
            (``communication_bytes_``) and the strategy's own
            (:meth:`~skgpu_kernel.parallel.ParallelStrategy.fitted_facts`).
        """
        devices = [str(device) for device in self.devices]
        outcome = run_distributed(train_worker, self._job(training), devices, timeout=self.strategy.timeout)[0]
        distributed = torch.distributed.is_initialized()
        facts = {
            "parallel_": self.strategy,
            "n_workers_": torch.distributed.get_world_size() if distributed else len(devices),
            "communication_bytes_": outcome.bytes_all_reduced,
            **self.strategy.fitted_facts(outcome.result.history),
        }
        return SGDOutcome(outcome.result, torch.as_tensor(outcome.coef), torch.as_tensor(outcome.intercept), facts)

    def _job(self, training):
        """What every worker receives: the run, the sources as specs, the starting point and the strategy."""
        layout = training.layout
        return TrainingJob(
            run=training.run,
            sources=[source_spec(source.data, share_for_workers) for source in layout.sources],
            dtypes=[str(dtype).removeprefix("torch.") for dtype in layout.dtypes],
            coef=training.coef.cpu().numpy(),
            intercept=training.intercept.cpu().numpy(),
            buffer_size=training.plan.buffer_size,
            prefetch=layout.prefetch,
            seed=training.seed,
            first_pass=training.passes_done,
            segments=layout.segments,
            strategy=self.strategy,
        )
