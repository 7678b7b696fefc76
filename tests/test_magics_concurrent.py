"""Twenty %gpu_install runs at once, from separate IPython processes, into one
environment and one Dockerfile: twenty distinct lines, none lost."""

from __future__ import annotations

import subprocess
import time

from magics_kit import backend_wheels, make_package, make_venv, new_dockerfile, pip_env

from gpulab_jupyter.magics import dockerfile as df

N = 20


def test_twenty_concurrent_installs_record_twenty_lines(tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    names = [f"tiny-c{i:02d}" for i in range(N)]
    backend_wheels(
        [make_package(tmp_path / "src", n, "1.0", {f"{n.replace('-', '_')}.py": "C = 1\n"})
         for n in names],
        wheelhouse,
    )  # fmt: skip
    python = make_venv(tmp_path / "venv")
    project = tmp_path / "project"
    project.mkdir()
    original = new_dockerfile(project).decode()
    env = pip_env()
    # pip's check of every installed distribution's requirements after each install
    # (1.5 of pip's 2.5 s here: the runner's few hundred packages are visible) is pip's
    # own, not what this test is about (the installs, the lock, the lines): off. pip
    # reads this variable as its warn-about-conflicts setting itself, so "0" is "off".
    env.update(GPULAB_PROJECT_DIR=str(project), GPULAB_PROGRESS="text",
               PIP_NO_WARN_CONFLICTS="0")  # fmt: skip
    procs = []
    start = time.monotonic()
    for name in names:
        code = (
            "%load_ext gpulab_jupyter.magics\n"
            f"%gpu_install --no-index --find-links {wheelhouse} {name}\n"
        )
        cmd = [str(python), "-m", "IPython", "--no-banner", "--colors=nocolor", "-c", code]
        procs.append(
            subprocess.Popen(
                cmd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=project,
            )  # fmt: skip
        )
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    elapsed = time.monotonic() - start
    for name, p, out in zip(names, procs, outputs, strict=True):
        assert p.returncode == 0, out
        assert f"{name} 1.0: installed, verified and written to the Dockerfile" in out, out
    text = (project / "Dockerfile").read_text()
    head, block, tail = df.split(text)
    assert "".join(head) + "".join(tail) == original  # outside the block: as it was
    expected = {
        f"RUN python -m pip install --no-cache-dir {n}==1.0 && python -c 'import "
        f"{n.replace('-', '_')}'\n"
        for n in names
    }
    assert len(block) == N and set(block) == expected, block
    installed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True,
        env=pip_env(),
    ).stdout  # fmt: skip
    assert all(f"{n}==1.0" in installed for n in names)
    print(f"{N} concurrent installs took {elapsed:.1f} s")
