# gpulab's JupyterHub configuration: wires gpulab's classes and reads the site
# settings (GPULAB_* environment variables, see docs/configuration.md).
# Add your own `c.ProjectSpawner.* = ...` lines where this file says so, or in files of
# $GPULAB_HOME/jupyterhub_config.d/*.py (kept across updates); each trait's help says how.
import os
from pathlib import Path

from gpulab_hub import hubconfig, hubfiles, settings, stateversion
from gpulab_hub.gpus import metrics
from gpulab_hub.secrets import crypt

c = get_config()  # noqa: F821 (provided by JupyterHub)
# gpulab's settings, parsed once from the site's environment (docs/configuration.md).
site = hubconfig.with_hub_ip(settings.parse(os.environ))
# The hub folder is private: umask 077 for what the hub makes, older files fixed.
hubfiles.start_private(site.hub_dir)
# State of a newer gpulab ends the start with a sentence; older state is upgraded.
stateversion.refuse_newer_at_start(site.hub_dir)
# The key that encrypts users' secrets, made once unless JUPYTERHUB_CRYPT_KEY is set.
crypt.ensure_key(site.hub_dir)
images = Path(__file__).resolve().parent / "images"
hubconfig.apply(c, site, images_dir=images)

# ---- Your own lines go here, above gpulab's last lines. ----


# gpulab's last lines. The site's own configuration files, in name order
# (hubfiles.config_d_files); then what reads the whole configuration.
site_files, ignored = hubfiles.config_d_files(site.home)
for why in ignored:
    print(f"gpulab: {why}", flush=True)
for path in site_files:
    load_subconfig(str(path))  # noqa: F821 (provided by JupyterHub)
site = hubconfig.finish(c)
# gpulab's tables in the hub's database brought up to date, a SQLite database backed up
# first (db/migrate.py; `gpulab upgrade-db` does the same by hand).
hubconfig.upgrade_database(site)
# A project's rename or deletion that a killed hub left half done, finished first
# (workflows/recovery.py).
hubconfig.finish_interrupted(c, site)
# gpulab's GPU figures on /hub/metrics, beside JupyterHub's (gpus/metrics.py).
metrics.register(metrics.Sources.of_config(c))
