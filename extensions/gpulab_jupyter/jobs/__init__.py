"""Jobs: a script or a notebook run in the project's container, detached from any
browser, kernel or hub, with its state and output in the project folder.

The runner sits behind a small interface (:class:`~gpulab_jupyter.jobs.engine.Engine`:
start, status, logs, stop, list), so a cluster engine can run the same jobs later;
today's engine, :class:`~gpulab_jupyter.jobs.local.LocalEngine`, runs them in this
container. ``model`` holds the records and the checks of what users type, ``launch``
the pure command builders (``torchrun`` for multi-GPU jobs), ``supervise`` the small
process that runs one job and writes its result, ``cli`` the ``gpulab-job`` command.
"""
