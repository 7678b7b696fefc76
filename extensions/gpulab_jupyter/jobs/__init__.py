"""Jobs: a script or a notebook run in the project's container, detached from any
browser, kernel or hub, with its state and output in the project folder.

The runner sits behind a small interface (:class:`~gpulab_jupyter.jobs.engine.Engine`:
start, status, logs, stop, list). :class:`~gpulab_jupyter.jobs.local.LocalEngine` runs
jobs in this container; on gpulab's Slurm cluster,
:class:`~gpulab_jupyter.jobs.cluster.ClusterEngine` (``cluster.engine_for`` picks it
when the spawner sets ``GPULAB_JOBS_ENGINE=cluster``) also runs multi-node jobs
(``--nodes``) as Slurm jobs the hub submits, and ``node`` is the wrapper each node's
container runs. ``model`` holds the records and the checks of what users type,
``launch`` the pure command builders (``torchrun`` for multi-GPU jobs), ``supervise``
the small process that runs one job and writes its result, ``cli`` the ``gpulab-job``
command.
"""
