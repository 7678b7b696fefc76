"""gpulab's hub side (distribution gpulab-hub), one folder per capability:

- ``spawner.py``: ProjectSpawner, the one class JupyterHub is given; it calls the rooms below
- ``projects/``: the project store (names, folders read as hostile input in ``safefs``),
  spawn options, the container spec (``objects``), renaming and deleting projects
- ``images/``: image templates and builds, the base image, each project's image
- ``gpus/``: the GPU inventory, the allocator and its durable record, GPUs at spawn
- ``accounts/``: sign-up, approval, passwords and lockout (NativeAuthenticator), deleting users
- ``sharing/``: roles, the share page, shared-with-me, save a copy, public links
- ``home/``: gpulab's home page (projects, their state, GPUs and builds; shared with me),
  and no default project
- ``doctor/``: ``gpulab doctor``'s checks and its hub page
- ``cli/``: the ``gpulab`` command (up, down, status, build, images, gpus)
- ``settings.py`` (the one settings object, parsed once from the GPULAB_* variables),
  ``hubsettings.py`` (the layout: where things live, read back from the traits for
  pages, CLI and doctor), ``hubconfig.py`` (the JupyterHub configuration made from them);
  ``host.py`` (the Docker client and re-runnable set-up steps), ``hubfiles.py``,
  ``jsonfile.py`` (the one locked, durable record store), ``pidfile.py``.
"""
