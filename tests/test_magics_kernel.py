"""The magics in a real IPython kernel, installing into a throwaway environment from
a local wheelhouse the tests build (pure packages, a failing build, a failing import)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from magics_kit import (
    Kernel,
    autoload_like_the_image,
    build_sdist,
    build_wheels,
    make_package,
    make_venv,
    new_dockerfile,
    pip_env,
    run_notebook,
    site_packages,
)

PKGS = {
    # name, version: files (module -> source), extra build settings
    ("tiny-pure", "1.0"): {"tiny_pure/__init__.py": "X = 1\n"},
    ("tiny-pure", "2.0"): {"tiny_pure/__init__.py": "X = 2\n"},
    ("tiny-pure", "3.0"): {"tiny_pure/__init__.py": "raise ImportError('needs libfoo.so.3')\n"},
    ("tiny-badimport", "1.0"): {"tiny_badimport/__init__.py": "import not_there_at_all\n"},
    ("tiny-dep", "1.0"): {"tiny_dep.py": "D = 1\n"},
    ("tiny-app", "1.0"): {"tiny_app/__init__.py": "import tiny_dep\nraise RuntimeError('boom')\n"},
    ("tiny-extra", "1.0"): {"tiny_extra.py": "E = 1\n"},
    ("tiny-other", "1.0"): {"tiny_other/__init__.py": "O = 1\n"},
    ("nvidia-fake-lib", "1.0"): {"nvidia_fake_lib.py": "V = 1\n"},
    ("nvidia-fake-lib", "2.0"): {"nvidia_fake_lib.py": "V = 2\n"},
    ("needs-new-nvidia", "1.0"): {"needs_new_nvidia.py": "import nvidia_fake_lib\n"},
}
REQUIRES = {"tiny-app": ["tiny-dep"], "needs-new-nvidia": ["nvidia-fake-lib>=2"]}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("magics")
    wheelhouse = root / "wheelhouse"
    wheelhouse.mkdir()
    sources = [
        make_package(root / "src", name, version, files, requires=REQUIRES.get(name, []))
        for (name, version), files in PKGS.items()
    ]
    build_wheels(sources, wheelhouse)
    broken = make_package(root / "src", "tiny-broken", "1.0", {"tiny_broken.py": ""},
                          compile="broken.c")  # fmt: skip
    (broken / "broken.c").write_text("int main( { return cudaStreamMagic; }\n")
    build_sdist(broken, wheelhouse)
    venv = root / "venv"
    make_venv(venv)
    autoload_like_the_image(venv)
    project = root / "project"
    project.mkdir()
    env = pip_env()
    env.update(GPULAB_PROJECT_DIR=str(project), GPULAB_ENV_SINCE=str(time.time()))
    kernel = Kernel(venv, env)
    yield {"root": root, "wh": wheelhouse, "venv": venv, "project": project, "kernel": kernel}
    kernel.close()


def magic(lab, line: str) -> dict:
    """Run a %gpu_install (from the test wheelhouse) in the kernel."""
    return lab["kernel"].run(f"%gpu_install --no-index --find-links {lab['wh']} {line}")


def tree(venv: Path) -> dict[str, str]:
    """Every file of the environment (but bytecode caches) with its content hash."""
    site = site_packages(venv / "bin" / "python")
    out = {}
    for path in sorted(site.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            out[str(path.relative_to(site))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def managed_lines(project: Path) -> list[str]:
    text = (project / "Dockerfile").read_text()
    block = text.split("by hand >>>\n")[1].split("# <<< gpulab managed block")[0]
    return block.splitlines()


@pytest.fixture(autouse=True)
def fresh_dockerfile(lab):
    new_dockerfile(lab["project"])


def test_magics_load_by_themselves_and_with_load_ext(lab):
    out = lab["kernel"].run("%gpu_install --help")  # the image's IPython config loaded them
    assert out["status"] == "ok", out
    assert "usage: %gpu_install [options] PACKAGE" in out["stdout"]
    out = lab["kernel"].run(
        "%unload_ext gpulab_jupyter.magics\n"
        "print('gpu_install' in get_ipython().magics_manager.magics['line'])\n"
        "%load_ext gpulab_jupyter.magics\n"
        "%gpu_install --help"
    )
    assert out["status"] == "ok", out
    assert out["stdout"].startswith("False\n")
    assert "usage: %gpu_install [options] PACKAGE" in out["stdout"]
    assert "--allow-torch-change" in out["stdout"]
    out = lab["kernel"].run(
        "%unload_ext gpulab_jupyter.magics\n%load_ext gpulab_jupyter\n%gpu_info"
    )
    assert out["status"] == "ok" and "No NVIDIA GPU" in out["stdout"], out


def test_pure_package_installs_verifies_and_writes_exactly_one_line(lab):
    before = (lab["project"] / "Dockerfile").read_text().splitlines()
    out = magic(lab, "tiny-pure==1.0")
    assert out["status"] == "ok", out
    assert "tiny-pure 1.0: installed, verified and written to the Dockerfile" in out["stdout"]
    after = (lab["project"] / "Dockerfile").read_text().splitlines()
    added = [ln for ln in after if ln not in before]
    assert added == [
        "RUN python -m pip install --no-cache-dir tiny-pure==1.0 && python -c 'import tiny_pure'"
    ]
    assert len(after) == len(before) + 1
    assert out["displays"] >= 1  # the progress widget
    logs = list((lab["project"] / ".gpulab" / "logs").glob("gpu_install-*-tiny-pure.log"))
    assert logs and "Successfully installed" in logs[-1].read_text()
    check = lab["kernel"].run("import tiny_pure; print(tiny_pure.X)")
    assert check["stdout"].strip() == "1"


def test_a_second_install_replaces_the_line_of_the_same_package(lab):
    magic(lab, "tiny-pure==1.0")
    out = magic(lab, "tiny-pure==2.0")
    assert out["status"] == "ok", out
    assert "restart the kernel" in out["stdout"]  # tiny_pure was imported at 1.0
    assert managed_lines(lab["project"]) == [
        "RUN python -m pip install --no-cache-dir tiny-pure==2.0 && python -c 'import tiny_pure'"
    ]


def test_failed_build_leaves_dockerfile_and_environment_as_they_were(lab):
    dockerfile = (lab["project"] / "Dockerfile").read_bytes()
    env = tree(lab["venv"])
    out = magic(lab, "tiny-broken")
    assert out["status"] == "error"
    assert (lab["project"] / "Dockerfile").read_bytes() == dockerfile
    assert tree(lab["venv"]) == env
    err = out["stderr"]
    assert "tiny-broken failed while building" in err
    assert "error: expected declaration specifiers" in err  # the compiler's own line
    assert "Traceback" not in err + out["stdout"]
    assert "The Dockerfile is unchanged" in err


def test_failed_import_after_an_upgrade_puts_the_old_version_back(lab):
    magic(lab, "tiny-pure==2.0")
    new_dockerfile(lab["project"])
    dockerfile = (lab["project"] / "Dockerfile").read_bytes()
    env = tree(lab["venv"])
    out = magic(lab, "tiny-pure==3.0")
    assert out["status"] == "error"
    assert "import tiny_pure failed: ImportError: needs libfoo.so.3" in out["stderr"]
    assert "the environment is as it was" in out["stderr"]
    assert (lab["project"] / "Dockerfile").read_bytes() == dockerfile
    assert tree(lab["venv"]) == env
    check = lab["kernel"].run("import subprocess, sys; print(subprocess.run([sys.executable, "
                              "'-c', 'import tiny_pure; print(tiny_pure.X)'], "
                              "capture_output=True, text=True).stdout)")  # fmt: skip
    assert check["stdout"].strip() == "2"


def test_failed_import_removes_the_package_and_its_new_dependencies(lab):
    env = tree(lab["venv"])
    dockerfile = (lab["project"] / "Dockerfile").read_bytes()
    for line in ("tiny-badimport", "tiny-app"):
        out = magic(lab, line)
        assert out["status"] == "error"
        assert "failed while verifying" in out["stderr"]
    assert "No module named 'not_there_at_all'" in magic(lab, "tiny-badimport")["stderr"]
    assert tree(lab["venv"]) == env  # tiny-dep (brought by tiny-app) is gone too
    assert (lab["project"] / "Dockerfile").read_bytes() == dockerfile


def test_the_torch_stack_is_pinned(lab):
    assert magic(lab, "nvidia-fake-lib==1.0")["status"] == "ok"
    new_dockerfile(lab["project"])
    dockerfile = (lab["project"] / "Dockerfile").read_bytes()
    env = tree(lab["venv"])
    out = magic(lab, "needs-new-nvidia")
    assert out["status"] == "error"
    assert "would replace the image's torch stack (nvidia-fake-lib==1.0)" in out["stderr"]
    assert "needs-new-nvidia 1.0 depends on nvidia-fake-lib>=2" in out["stderr"]
    assert "--allow-torch-change" in out["stderr"]
    assert tree(lab["venv"]) == env
    assert (lab["project"] / "Dockerfile").read_bytes() == dockerfile
    out = magic(lab, "--allow-torch-change needs-new-nvidia")
    assert out["status"] == "ok", out
    assert "with: nvidia-fake-lib 2.0" in out["stdout"]


@pytest.mark.parametrize(
    "line",
    [
        "'tiny-pure --index-url http://127.0.0.1:9/simple'",
        "tiny-pure;--extra-index-url=http://127.0.0.1:9/",
        "-r /etc/passwd",
        "'tiny-pure==1.0 && touch /tmp/gpulab-owned'",
        "$(touch /tmp/gpulab-owned)",
        "--apt 'vim; touch /tmp/gpulab-owned'",
        "--import 'os; import this' tiny-pure",
        "tiny-pure @ http://127.0.0.1:9/x.whl",
        f"{Path(__file__).parent}/x.whl",
    ],
)
def test_injection_attempts_are_rejected(lab, line):
    dockerfile = (lab["project"] / "Dockerfile").read_bytes()
    env = tree(lab["venv"])
    out = lab["kernel"].run(f"%gpu_install {line}")
    assert out["status"] == "error"
    assert "UsageError" in out["stderr"]
    assert "Traceback" not in out["stderr"]
    assert (lab["project"] / "Dockerfile").read_bytes() == dockerfile
    assert tree(lab["venv"]) == env
    assert not os.path.exists("/tmp/gpulab-owned")


def test_dry_run_shows_the_line_and_changes_nothing(lab):
    dockerfile = (lab["project"] / "Dockerfile").read_bytes()
    env = tree(lab["venv"])
    out = magic(lab, "--dry-run tiny-other --apt libgl1")
    assert out["status"] == "ok", out
    assert "RUN python -m pip install --no-cache-dir tiny-other==1.0" in out["stdout"]
    assert "apt-get install -y --no-install-recommends libgl1" in out["stdout"]
    assert (lab["project"] / "Dockerfile").read_bytes() == dockerfile
    assert tree(lab["venv"]) == env


def test_apt_packages_are_recorded_for_the_next_build(lab):
    out = lab["kernel"].run("%gpu_install --apt libgl1 --apt ffmpeg")
    assert out["status"] == "ok", out
    assert "restart the project to rebuild" in out["stdout"]
    lines = managed_lines(lab["project"])
    if os.getuid() != 0:  # apt-get runs as root, then the image's user again
        assert lines.pop(0) == "USER root"
        assert lines.pop(1) == f"USER {os.getuid()}:{os.getgid()}"
    assert lines == [
        "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
        "--no-install-recommends ffmpeg libgl1 && rm -rf /var/lib/apt/lists/*"
    ]


def test_gpu_info_says_plainly_there_is_no_gpu(lab):
    out = lab["kernel"].run("%gpu_info")
    assert out["status"] == "ok", out
    assert out["stdout"].startswith("No NVIDIA GPU is visible here:")
    assert "torch: not installed" in out["stdout"]
    # The GPU panel's words, from the same diagnosis, with what to do.
    from gpulab_jupyter.diagnosis import why_no_gpu

    why = why_no_gpu()
    assert why is not None and why.message in out["stdout"] and why.hint in out["stdout"]


def test_gpu_diff_finds_what_plain_pip_installed(lab):
    out = lab["kernel"].run(f"%pip install -q --no-index --find-links {lab['wh']} tiny-extra")
    assert out["status"] == "ok", out
    out = lab["kernel"].run("%gpu_diff")
    assert "tiny-extra 1.0" in out["stdout"]
    command = out["stdout"].split("Record them with:\n")[1].splitlines()[0].split()
    assert command[0] == "%gpu_install"
    assert "tiny-extra==1.0" in command[1:]
    assert "tiny-pure==2.0" in command[1:]  # installed earlier, not in this fresh Dockerfile
    assert magic(lab, "tiny-extra==1.0")["status"] == "ok"
    with open(lab["project"] / "Dockerfile", "a") as f:  # recorded, but not installed
        f.write("RUN true\n")
    text = (lab["project"] / "Dockerfile").read_text()
    text = text.replace("# <<< gpulab", "RUN python -m pip install tiny-gone==1.0\n# <<< gpulab")
    (lab["project"] / "Dockerfile").write_text(text)
    out = lab["kernel"].run("%gpu_diff")
    assert "tiny-extra" not in out["stdout"].split("Record them with")[0]
    assert "tiny-gone==1.0 (not installed)" in out["stdout"]


def test_no_dockerfile_means_nothing_is_installed(lab, tmp_path):
    env = tree(lab["venv"])
    out = lab["kernel"].run(
        f"%env GPULAB_PROJECT_DIR={tmp_path}\n"
        f"%gpu_install --no-index --find-links {lab['wh']} tiny-other\n"
    )
    lab["kernel"].run(f"%env GPULAB_PROJECT_DIR={lab['project']}")
    assert out["status"] == "error"
    assert f"There is no Dockerfile at {tmp_path}/Dockerfile" in out["stderr"]
    assert tree(lab["venv"]) == env


@pytest.mark.skipif(not shutil.which("nvcc"), reason="nvcc (CUDA toolkit) is not installed here")
def test_cuda_code_without_a_gpu_installs_and_says_there_is_nothing_to_check(lab, tmp_path):
    cu = tmp_path / "k.cu"
    cu.write_text("__global__ void k(float *x) { x[0] = 1; }\n"
                  'extern "C" void run(float *x) { k<<<1, 1>>>(x); }\n')  # fmt: skip
    so = tmp_path / "libk.so"
    nvcc = ["nvcc", "-shared", "-Xcompiler", "-fPIC", "-gencode=arch=compute_80,code=sm_80"]
    subprocess.run([*nvcc, "-o", str(so), str(cu)], check=True, capture_output=True)
    src = make_package(
        tmp_path / "src", "tiny-cuda", "1.0",
        {"tiny_cuda/__init__.py": "import ctypes, os\n"
         "lib = ctypes.CDLL(os.path.join(os.path.dirname(__file__), 'libk.so'))\n"},
        copy={"tiny_cuda/libk.so": str(so)},
    )  # fmt: skip
    build_wheels([src], lab["wh"])
    out = magic(lab, "tiny-cuda")
    assert out["status"] == "ok", out
    assert "libk.so carries sm_80; there is no GPU here to check it against" in out["stdout"]
    # The same binary, judged for an H100 (compute capability 9.0):
    out = lab["kernel"].run(
        "from gpulab_jupyter.magics import verify\n"
        "print(verify.gpu_check('tiny-cuda', ['9.0']).problems[0])"
    )
    assert "libk.so has no code for this GPU (sm_90, compute capability 9.0)" in out["stdout"]
    assert "carries sm_80 only" in out["stdout"]
    assert "no kernel image is available for execution on the device" in out["stdout"]


def test_a_local_wheel_needs_allow_local_and_is_recorded_pinned(lab):
    wheel = next(lab["wh"].glob("tiny_other-1.0-*.whl"))
    refused = lab["kernel"].run(f"%gpu_install {wheel}")
    assert refused["status"] == "error" and "--allow-local" in refused["stderr"]
    out = lab["kernel"].run(f"%gpu_install --allow-local {wheel}")
    assert out["status"] == "ok", out
    assert "is not visible to image builds" in out["stdout"]
    assert managed_lines(lab["project"]) == [
        "RUN python -m pip install --no-cache-dir tiny-other==1.0 && python -c 'import tiny_other'"
    ]
    lab["kernel"].run("%pip uninstall -q -y tiny-other")


def outputs_of(nb) -> list[dict]:
    return [out for cell in nb["cells"] for out in cell.get("outputs", [])]


def joined(value) -> str:
    """A saved notebook's text (a string, or a list of lines as nbformat writes it)."""
    return "".join(value) if isinstance(value, list) else value


def shown_text(output: dict) -> str:
    """Everything an output holds as text: stream text, every format of display data."""
    if output["output_type"] == "stream":
        return joined(output["text"])
    if output["output_type"] == "error":
        return "\n".join([output["ename"], output["evalue"], *output["traceback"]])
    return "\n".join(
        v if isinstance(v, str | list) and not isinstance(v, dict) else json.dumps(v)
        for v in (joined(v) if isinstance(v, list) else v for v in output["data"].values())
    )


def test_a_saved_notebook_shows_a_readable_summary(lab, tmp_path):
    """A notebook saved after %gpu_install holds no widget (it dies with the kernel),
    no terminal escape codes and no CUDA line for pure Python: a summary to read."""
    from jupyter_server.services.contents.filemanager import FileContentsManager

    colour = ["\x1b[33mwarning: tiny-color is built in colour\x1b[0m", "50%\r\x1b[2K100% built"]
    src = make_package(tmp_path, "tiny-color", "1.0", {"tiny_color.py": "C = 1\n"}, say=colour)
    build_sdist(src, lab["wh"])
    bad = ["\x1b[31mERROR: tiny-colorfail needs libcolor.so.7\x1b[0m"]
    src = make_package(tmp_path, "tiny-colorfail", "1.0", {"tiny_colorfail.py": ""}, say=bad,
                       fail=True)  # fmt: skip
    build_sdist(src, lab["wh"])
    env = pip_env()
    env.update(GPULAB_PROJECT_DIR=str(lab["project"]))
    where = f"--no-index --find-links {lab['wh']}"
    nb = run_notebook(lab["venv"], env, [f"%gpu_install {where} tiny-color",
                                         f"%gpu_install {where} tiny-colorfail"])  # fmt: skip
    # Saved as JupyterLab saves it: through the contents API's file manager.
    contents = FileContentsManager(root_dir=str(lab["project"]))
    contents.save({"type": "notebook", "format": "json", "content": nb}, "install.ipynb")
    raw = (lab["project"] / "install.ipynb").read_text()
    saved = json.loads(raw)
    ok, failed = (cell["outputs"] for cell in saved["cells"])
    every = [shown_text(o) for o in ok + failed]
    assert every and not [t for t in every if "VBox(children=" in t], every
    assert "\\u001b" not in raw and not [t for t in every if "\x1b" in t], every
    assert not [t for t in every if "CUDA architectures" in t], every
    mimes = {m for o in ok + failed for m in o.get("data", {})}
    assert "application/vnd.jupyter.widget-view+json" not in mimes, mimes

    # The install: a summary display (HTML and text), then what was written where.
    summary = [o for o in ok if o["output_type"] == "display_data"]
    assert len(summary) == 1, ok
    text, page = (joined(summary[0]["data"][m]) for m in ("text/plain", "text/html"))
    assert text.startswith("%gpu_install tiny-color: ✔ done in "), text
    assert "Full log: " in text and "/.gpulab/logs/gpu_install-" in text
    assert "✔ done in" in page and "<details>" in page
    assert "warning: tiny-color is built in colour" in page  # the build's own line, uncoloured
    assert "100% built" in page and "[2K" not in page  # the erase-line code is gone
    said = "".join(joined(o["text"]) for o in ok if o["output_type"] == "stream")
    assert "✔ tiny-color 1.0: installed, verified and written to the Dockerfile (" in said
    assert "RUN python -m pip install --no-cache-dir tiny-color==1.0 && python -c " in said
    # Built here, but pure Python: recorded without the compile variables.
    assert "RUN python -m pip install --no-cache-dir tiny-color==1.0" in managed_lines(
        lab["project"]
    )[0]

    # The failure: the summary says so, and the pip line that matters is readable.
    summary = [o for o in failed if o["output_type"] == "display_data"]
    assert len(summary) == 1, failed
    assert joined(summary[0]["data"]["text/plain"]).startswith(
        "%gpu_install tiny-colorfail: ✘ failed while building, after "
    )
    err = "".join(joined(o["text"]) for o in failed if o["output_type"] == "stream")
    assert "ERROR: tiny-colorfail needs libcolor.so.7" in err
    assert "The Dockerfile is unchanged" in err
    assert "UsageError: tiny-colorfail: failed while building (Dockerfile unchanged)" in err
    lab["kernel"].run("%pip uninstall -q -y tiny-color")


@pytest.fixture
def http_index(lab, tmp_path):
    """A plain-http package index on this machine, named by the machine's host name
    (pip trusts only localhost and 127.0.0.0/8 by address): /simple/tiny-http/."""
    import functools
    import socket
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    host = socket.gethostname()
    address = socket.gethostbyname(host)  # this machine's own name: no other machine is asked
    assert host != "localhost", "the test needs a host name pip does not trust by itself"
    folder = tmp_path / "index" / "simple" / "tiny-http"
    folder.mkdir(parents=True)
    src = make_package(tmp_path / "src", "tiny-http", "1.0", {"tiny_http.py": "H = 1\n"})
    build_wheels([src], folder)

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(tmp_path / "index"))
    server = ThreadingHTTPServer((address, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield host, f"http://{host}:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()
    lab["kernel"].run("%pip uninstall -q -y tiny-http")


def test_an_untrusted_http_index_is_explained(lab, http_index):
    host, url = http_index
    dockerfile = (lab["project"] / "Dockerfile").read_bytes()
    env = tree(lab["venv"])
    out = lab["kernel"].run(f"%gpu_install --index-url {url} tiny-http")
    assert out["status"] == "error"
    err = out["stderr"]
    assert f"pip ignored the package index at {host}: it is plain http:// and {host} is not " \
        "a trusted host" in err, err  # fmt: skip
    assert f"add --trusted-host {host}" in err and "https://" in err
    assert "No matching distribution found for tiny-http" in err  # what pip said, below
    assert (lab["project"] / "Dockerfile").read_bytes() == dockerfile
    assert tree(lab["venv"]) == env

    # Doing what it says works, and the build gets the same index and trust.
    out = lab["kernel"].run(f"%gpu_install --index-url {url} --trusted-host {host} tiny-http")
    assert out["status"] == "ok", out
    assert managed_lines(lab["project"]) == [
        f"RUN python -m pip install --no-cache-dir --index-url {url} --trusted-host {host} "
        "tiny-http==1.0 && python -c 'import tiny_http'"
    ]
    refused = lab["kernel"].run("%gpu_install --trusted-host 'evil;rm' tiny-http")
    assert refused["status"] == "error" and "is not a host name" in refused["stderr"]
