"""The site's own configuration files ($GPULAB_HOME/jupyterhub_config.d/*.py): which
the hub runs, in which order, and which it refuses (a link, a file others may change)."""

from __future__ import annotations

import os

from gpulab_hub import hubfiles


def test_own_files_run_in_name_order_and_others_are_skipped(tmp_path):
    site = tmp_path / hubfiles.CONFIG_D
    site.mkdir(mode=0o755)
    for name in ("20-b.py", "10-a.py", "notes.txt"):
        (site / name).write_text("c = get_config()\n")
        (site / name).chmod(0o644)
    loose = site / "30-loose.py"
    loose.write_text("import os\n")
    loose.chmod(0o666)  # any user of the machine could change what the hub runs
    outside = tmp_path / "elsewhere.py"
    outside.write_text("import os\n")
    os.symlink(outside, site / "40-link.py")  # never follow a link into the hub
    files, skipped = hubfiles.config_d_files(tmp_path)
    assert [f.name for f in files] == ["10-a.py", "20-b.py"]
    assert len(skipped) == 2
    assert any("30-loose.py" in s for s in skipped) and any("40-link.py" in s for s in skipped)


def test_no_folder_nothing_to_run_and_a_loose_folder_is_ignored(tmp_path):
    assert hubfiles.config_d_files(tmp_path) == ([], [])
    site = tmp_path / hubfiles.CONFIG_D
    site.mkdir()
    site.chmod(0o777)
    (site / "10-a.py").write_text("c = get_config()\n")
    files, skipped = hubfiles.config_d_files(tmp_path)
    assert files == [] and "only it may change" in skipped[0]
