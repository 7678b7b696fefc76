"""`gpulab doctor --project` trusts only the hub's own records, runs every image confined as
a project's container, and believes no answer it cannot read (gpulab issue 23, item 7).

Each test performs the attack on a real Docker engine: an attacker's project image whose
Dockerfile carries the victim's labels, running containers of it, images whose python3
answers the doctor's probe with bad JSON, wrong types, control characters, forged fields,
several answers or megabytes of output, and one that reports what the kernel gives it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import tarfile
import threading
import time

import pytest
from conftest import PREFIX
from traitlets.config import Config

from gpulab_hub import host, hubsettings, images
from gpulab_hub.doctor import answer, findings, project, protections, sandbox
from gpulab_hub.doctor.findings import FAIL, OK, WARN
from gpulab_hub.images import project as projectimage
from gpulab_hub.projects import Project, objects

pytestmark = pytest.mark.docker
# this site's own container prefix: the doctor counts the running project containers of
# its prefix, and other tests' hubs (PREFIX) may have some running or left by a failure
SITE = f"{PREFIX}doc"

VICTIM = "victim/vproj"
FORGED = "6.6.6+forged"  # what the attacker's probe claims; must never reach a finding
FORGED_ANSWER = {
    "python": "6.6.6",
    "env": {"CUDA_VISIBLE_DEVICES": "forged"},
    "device_nodes": [],
    "ldconfig": "",
    "realpaths": {},
    "torch": {"version": FORGED, "cuda": ""},
    "libs": [],
}


def fake_python(output: str) -> str:
    """A python3 that answers the probe with ``output`` (a shell script's body)."""
    return f"#!/bin/sh\n{output}\n"


def marker(value: object) -> str:
    """A shell line printing one answer line: the marker, then ``value`` as JSON."""
    text = value if isinstance(value, str) else json.dumps(value)
    return "printf '%s%s\\n' '" + answer.MARKER + "' '" + text.replace("'", "'\\''") + "'"


ATTACKER_DOCKERFILE = """FROM {base}
LABEL gpulab.instance={prefix} gpulab.owner=victim gpulab.project=vproj
COPY python3 /usr/local/bin/python3
RUN chmod 0755 /usr/local/bin/python3
"""


@dataclasses.dataclass
class Site:
    dk: host.Docker
    hub: hubsettings.Layout
    probes: sandbox.ProbeInputs
    base: str

    def project(self, spec: str) -> Project:
        user, _, name = spec.partition("/")
        return Project(self.hub.projects_root, user, name, self.hub.state_root)

    def build(self, spec: str, dockerfile: str, files: dict[str, str]) -> str:
        """The project's image, built and recorded as the hub builds a project's."""
        p = self.project(spec)
        p.path.mkdir(parents=True)
        (p.path / "Dockerfile").write_text(dockerfile)
        for name, text in files.items():
            (p.path / name).write_text(text)
        return projectimage.ensure_image(
            self.dk.call,
            p,
            self.hub.projects_root / ".locks",
            lambda line: None,
            300,
            repo=self.hub.image_repo,
            network=self.hub.network,
            allowed=self.hub.allowed_base_images,
        )

    def image_answering(self, spec: str, script: str) -> str:
        """A project image whose python3 is ``script``, recorded as the project's last
        good image (made by commit: quicker than a build, the same image to the doctor)."""
        tar = io.BytesIO()
        with tarfile.open(fileobj=tar, mode="w") as t:
            data = script.encode()
            info = tarfile.TarInfo("usr/local/bin/python3")
            info.size, info.mode = len(data), 0o755
            t.addfile(info, io.BytesIO(data))
        cid = self.dk.call("create_container", self.base, command=["true"])["Id"]
        try:
            self.dk.call("put_archive", cid, "/", tar.getvalue())
            digest = hashlib.sha256((spec + script).encode()).hexdigest()[:16]
            tag = f"{self.hub.image_repo}:{digest}"
            repo, _, version = tag.rpartition(":")
            self.dk.call("commit", cid, repository=repo, tag=version)
        finally:
            self.dk.call("remove_container", cid, force=True)
        p = self.project(spec)
        p.path.mkdir(parents=True, exist_ok=True)
        projectimage.record(p, tag, failed=False)
        return tag

    def run(self, spec: str, image: str, name: str | None = None) -> str:
        """A running container of ``image``, confined as a project's: by default named as
        the spawner names ``spec``'s container."""
        user, _, proj = spec.partition("/")
        spec_ = sandbox.probe_spec(self.probes, image, ["sleep", "600"])
        spec_["name"] = name or sandbox.container_name(self.probes, user, proj)
        spec_["labels"] = {}  # the image's labels show through, as in a build's RUN step
        spec_["host_config"] = self.dk.call("create_host_config", **spec_["host_config"])
        cid = self.dk.call("create_container", **spec_)["Id"]
        self.dk.call("start", cid)
        return cid

    def doctor(self, spec: str, hub: hubsettings.Layout | None = None) -> list:
        return project.project_findings(self.dk, hub or self.hub, self.probes, spec, None)


@pytest.fixture(scope="module")
def site(docker_engine, local_debian, tmp_path_factory) -> Site:
    root = tmp_path_factory.mktemp("doctor-site")
    c = Config()
    c.ProjectSpawner.prefix = SITE
    c.ProjectSpawner.projects_root = str(root / "projects")
    c.ProjectSpawner.state_root = str(root / "hub" / "projects")
    c.ProjectSpawner.data_root = str(root / "data")
    c.ProjectSpawner.image_repo = f"{PREFIX}/project"  # removed with the tests' images
    c.ProjectSpawner.mem_limit = 1 << 30
    c.ProjectSpawner.pids_limit = 256
    c.ProjectSpawner.allowed_base_images = [local_debian]  # what the test projects start FROM
    spawner = hubsettings.spawner_of(c)
    hub = hubsettings.from_spawner(spawner)
    host.ensure_network(docker_engine, hub.network)
    return Site(docker_engine, hub, sandbox.of_spawner(spawner), local_debian)


def text_of(found: list) -> str:
    """Everything a person could read of the findings: the table and the JSON."""
    return findings.render_table(found, color=False, width=200) + findings.to_json(found)


def by_id(found: list) -> dict:
    return {f.id: f for f in found}


@pytest.fixture(scope="module")
def attack(site: Site) -> dict:
    """The victim's project image (built and recorded by the hub) and the attacker's, built
    later from a Dockerfile that labels it as the victim's project, with a python3 that
    answers the probe with a forged answer; a container of the attacker's image runs under
    another name, carrying the victim's labels (as a build's RUN step would)."""
    victim = site.build(VICTIM, f"FROM {site.base}\nENV GPULAB_ROLE=victim\n", {})
    attacker = site.build(
        "mallory/evil",
        ATTACKER_DOCKERFILE.format(base=site.base, prefix=SITE),
        {"python3": fake_python(marker(FORGED_ANSWER))},
    )
    step = site.run("mallory/evil", attacker, name=f"{SITE}-mallory-build-step")
    labels = site.dk.call("inspect_container", step)["Config"]["Labels"]
    assert labels["gpulab.owner"] == "victim" and labels["gpulab.project"] == "vproj"
    labelled = site.dk.call(
        "images", filters={"label": [f"gpulab.instance={SITE}", "gpulab.owner=victim"]}
    )
    assert [i["Id"] for i in labelled] == [images.image_id(site.dk.call, attacker)]
    yield {"victim": victim, "attacker": attacker}
    site.dk.call("remove_container", step, force=True)


def test_an_image_labelled_as_the_victims_project_is_never_checked_as_it(site, attack):
    found = site.doctor(VICTIM)
    container = by_id(found)["project.container"]
    assert container.status == OK, container
    assert f"a throwaway container of its image {attack['victim']}" in container.seen
    assert "Python 3." in container.seen
    assert FORGED not in text_of(found) and "6.6.6" not in text_of(found)
    assert "forged" not in text_of(found)

    # Without the hub's record there is no image, whatever the labels say.
    empty = dataclasses.replace(site.hub, state_root=site.hub.state_root.parent / "none")
    found = site.doctor(VICTIM, empty)
    assert [(f.id, f.status) for f in found] == [("project.container", FAIL)]
    assert "has no image" in found[0].seen and "forged" not in text_of(found)

    # Nor is a container carrying the victim's labels counted as a project's container.
    info = site.dk.call("info")
    checks = by_id(protections.findings(site.dk, info, site.hub.network, site.probes))
    assert checks["security.containers"].seen.startswith("0 running project container(s)")


def test_a_container_of_the_projects_name_is_probed_only_with_the_recorded_image(site, attack):
    # Named exactly as the spawner names the victim's container, but of the attacker's image.
    impostor = site.run(VICTIM, attack["attacker"])
    try:
        found = site.doctor(VICTIM)
    finally:
        site.dk.call("remove_container", impostor, force=True)
    container = by_id(found)["project.container"]
    assert container.status == WARN and "does not run that image" in container.seen
    assert "so it was not probed" in container.seen and "Restart" in container.fix
    assert attack["victim"] in container.seen and "forged" not in text_of(found)

    # The victim's own running container is probed where it runs.
    own = site.run(VICTIM, attack["victim"])
    try:
        found = site.doctor(VICTIM)
    finally:
        site.dk.call("remove_container", own, force=True)
    container = by_id(found)["project.container"]
    assert container.status == OK and "checked in the running container" in container.seen
    assert "forged" not in text_of(found)


VALID = {**FORGED_ANSWER, "torch": {"version": "HOSTILE"}}
HOSTILE = {
    "bad JSON": marker('{"python": "3.11", "torch": {"version": '),
    "wrong types": marker({**VALID, "python": 3, "env": ["HOSTILE"]}),
    "control characters": marker({**VALID, "python": "3.11\u001b]0;HOSTILE\u0007\u001b[2J"}),
    "a field the probe never writes": marker({**VALID, "status": "ok", "error": "HOSTILE"}),
    "two answers": marker(VALID) + "\n" + marker(VALID),
    "deep nesting": marker("[" * 50_000 + "]" * 50_000),
    # 1.5 MB then a well-formed answer: the engine keeps it all (sandbox.LOG_CONFIG), the
    # doctor reads 1 MiB of it and stops.
    "megabytes of output": "head -c 1500000 /dev/zero | tr '\\0' A\necho\n" + marker(VALID),
}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_hostile_answer_is_a_finding_never_believed(site, kind):
    spec = f"mallory/bad{list(HOSTILE).index(kind)}"
    site.image_answering(spec, fake_python(HOSTILE[kind]))
    found = site.doctor(spec)
    assert [(f.id, f.status) for f in found] == [("project.container", FAIL)], found
    seen = found[0].seen
    assert "the project's image answered the doctor's probe with something it cannot read" in seen
    assert "HOSTILE" not in text_of(found) and "\x1b" not in text_of(found)
    assert "Nothing the image answered was used" in found[0].fix


def test_endless_output_is_cut_in_a_running_container_and_timed_out_in_a_throwaway(site):
    spec = "mallory/endless"
    image = site.image_answering(spec, fake_python("exec yes HOSTILE"))
    cid = site.run(spec, image)  # the project runs its recorded image: probed by exec
    try:
        started = time.monotonic()
        found = site.doctor(spec)
        assert time.monotonic() - started < 30
    finally:
        site.dk.call("remove_container", cid, force=True)
    assert found[0].status == FAIL and "over 1 MiB of output" in found[0].seen
    started = time.monotonic()
    with pytest.raises(answer.ProbeError, match="did not finish within 3 s"):
        sandbox.run_probe(site.dk, image, ["project"], site.probes, timeout=3)
    assert time.monotonic() - started < 15
    left = site.dk.call("containers", all=True, filters={"name": f"{SITE}-doctor-"})
    assert not left


# The kernel's view of the probe's process, then time to look at its container.
REPORT = fake_python("grep -E '^(CapEff|CapPrm|NoNewPrivs|Uid|Gid):' /proc/self/status\nsleep 3")
CONFINEMENT = (
    "CapAdd",
    "CapDrop",
    "SecurityOpt",
    "Privileged",
    "NetworkMode",
    "PidsLimit",
    "Memory",
    "NanoCpus",
    "CpuPeriod",
    "CpuQuota",
    "ShmSize",
    "IpcMode",
    "PidMode",
    "UsernsMode",
    "Devices",
    "ReadonlyRootfs",
)


def test_the_probe_container_is_confined_as_a_project_container(site, tmp_path):
    spec = "mallory/report"
    image = site.image_answering(spec, REPORT)
    # A project container as the spawner makes it, with the same settings (created only).
    sp = site.probes
    settings = objects.ContainerInputs(
        name=f"{SITE}-compare",
        image=image,
        command=["sleep", "1"],
        env={},
        project_dir=str(site.project(spec).path),
        data_root=str(tmp_path),
        hf_cache_volume=f"{SITE}-hf-doctor",
        network=sp.network,
        port=8888,
        owner="mallory",
        user=sp.user,
        shm_size=sp.shm_size,
        mem_limit=sp.mem_limit,
        cpu_limit=sp.cpu_limit,
        pids_limit=sp.pids_limit,
    )
    made = objects.container_spec(settings)
    made["host_config"] = site.dk.call("create_host_config", **made["host_config"])
    ref = site.dk.call("create_container", **made)["Id"]
    try:
        project_side = site.dk.call("inspect_container", ref)
    finally:
        site.dk.call("remove_container", ref, force=True)

    result: dict = {}
    doctor = threading.Thread(target=lambda: result.update(found=site.doctor(spec)))
    doctor.start()
    probe_side, kernel = None, ""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "NoNewPrivs" not in kernel:
        running = site.dk.call("containers", filters={"name": f"{SITE}-doctor-"})
        if running:
            probe_side = site.dk.call("inspect_container", running[0]["Id"])
            kernel = site.dk.call("logs", running[0]["Id"]).decode()
        time.sleep(0.2)
    doctor.join(60)
    assert probe_side is not None, "no probe container was seen running"
    for key in CONFINEMENT:
        assert probe_side["HostConfig"].get(key) == project_side["HostConfig"].get(key), key
    assert probe_side["HostConfig"]["CapDrop"] == ["ALL"]
    assert probe_side["HostConfig"]["NetworkMode"] == site.hub.network != "host"
    assert probe_side["Config"]["User"] == project_side["Config"]["User"] == "1000:100"
    assert not probe_side["HostConfig"].get("Binds")  # the probe gets no project folder
    status = dict(line.split(":\t", 1) for line in kernel.splitlines())
    assert status["CapEff"].strip() == status["CapPrm"].strip() == "0000000000000000"
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Uid"].split()[0] == "1000" and status["Gid"].split()[0] == "100"
    # What it printed is no answer: said so, not believed.
    assert result["found"][0].status == FAIL and "no answer" in result["found"][0].seen
