"""gpulab's hub-project contract: the facts the hub and a project's container share.

Standard library only: the hub imports it without the user side's Jupyter stack, and
every project image installs it next to ``gpulab_jupyter``. One module per fact.
"""
