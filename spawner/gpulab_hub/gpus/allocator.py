"""GPU allocation: which devices a project gets, and a durable record of who holds what.

``choose`` decides, pure (no I/O, no clock); ``AllocationStore`` keeps the holdings
in one JSON file, rewritten atomically under a file lock. Rules of ``choose``:
``count=0`` without ``mig_profile``: no device; ``count>=1``: that many whole GPUs
(never a MIG slice, never a GPU in MIG mode); ``mig_profile``: one MIG slice of it.
``gpu_type`` must equal one of ``policy.allowed_types`` (case-insensitive) and
matches the devices whose name contains it ("h100" ~ "NVIDIA H100 80GB HBM3").
Exclusive: a device held by another project is busy; shared: busy once
``shared_cap`` other projects hold it. Free devices the project already holds come
first (a respawn keeps its GPUs), then the fewest-held, then the lowest index.
``max_per_project`` caps one request; ``max_per_user`` an owner's holdings over all
projects, counted per project. A slice whose parent GPU's UUID is held is busy.
Refusals raise ``AllocationError``: what was asked, what is free, who holds the rest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from gpulab_hub import jsonfile, stateversion
from gpulab_hub.gpus import Device

Held = dict[str, tuple["Holder", ...]]
MOST = 4  # holders a refusal names per device (and of the owner's); the rest are counted
Alive = Callable[[str, str], bool]


@dataclass(frozen=True)
class Holder:
    owner: str
    project: str
    since: float  # epoch seconds: held since
    # last reserved (epoch seconds): its container may not exist yet; not part of equality
    reserved: float = field(default=0.0, compare=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.owner, self.project)


@dataclass(frozen=True)
class Policy:
    mode: str = "exclusive"  # or "shared"
    shared_cap: int = 2  # shared mode: most projects on one device
    max_per_user: int | None = None  # devices one user may hold over all projects
    max_per_project: int | None = None  # devices one project may ask for
    allowed_types: tuple[str, ...] = ()  # GPU names a request may ask for; () = none
    allow_mig: bool = True

    def __post_init__(self) -> None:
        if self.mode not in ("exclusive", "shared") or self.shared_cap < 1:
            raise ValueError(f"GPU policy: mode 'exclusive' or 'shared', shared_cap >= 1: {self}")


@dataclass(frozen=True)
class Request:
    owner: str
    project: str
    count: int = 0
    gpu_type: str = ""
    mig_profile: str = ""


class AllocationError(Exception):
    """A request that cannot be met; ``str()`` is the message for the user (an admin:
    it names who holds what); ``unnamed`` the same refusal naming none of other users'
    projects (what anyone else is told, docs/security.md), "" where it names none."""

    def __init__(
        self,
        message: str,
        busy: Iterable[tuple[Device, tuple[Holder, ...]]] = (),
        unnamed: str = "",
    ):
        super().__init__(message)
        self.busy = tuple(busy)  # (device, its other holders) that stood in the way
        self.unnamed = unnamed

    def told(self, admin: bool) -> str:
        """The message for an admin (``admin``) or for anyone else."""
        return str(self) if admin or not self.unnamed else self.unnamed


def label(d: Device) -> str:
    return f"{'MIG slice' if d.parent_uuid else 'GPU'} {d.index} ({d.name})"


def _who(holders: Sequence[Holder], on: Sequence[str] = ()) -> str:
    """The first MOST holders (on those devices, if given) and since when; the rest counted."""
    at = [f"{h.owner}/{h.project} since {_when(h.since)}" for h in holders[:MOST]]
    at = [f"{d} for {t}" for d, t in zip(on, at, strict=True)] if on else at
    return ", ".join(at) + (f" and {len(holders) - MOST} more" if len(holders) > MOST else "")


def _unnamed(holders: Sequence[Holder], owner: str) -> str:
    """Like :func:`_who`, naming only ``owner``'s projects: the others are counted."""
    mine = [h for h in holders if h.owner == owner]
    others = len(holders) - len(mine)
    said = _who(mine) if mine else ""
    if others:
        said += (" and " if said else "") + (
            "another project" if others == 1 else f"{others} other projects"
        )
    return said


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _order(d: Device) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in d.index.split(":")), d.uuid


def _noun(r: Request) -> str:
    kind = f"{r.gpu_type} " if r.gpu_type else ""
    return f"{kind}{r.mig_profile} MIG slice" if r.mig_profile else kind + "GPU"


def _fits(d: Device, r: Request) -> bool:
    if r.gpu_type and r.gpu_type.strip().casefold() not in d.name.casefold():
        return False
    if r.mig_profile:
        return bool(d.parent_uuid) and d.mig_profile == r.mig_profile
    return not d.parent_uuid and not d.mig_mode


def _too_few(devices: list[Device], kind: list[Device], r: Request) -> str:
    has = f"this host has {_plural(len(kind), _noun(r))}"
    if r.mig_profile:
        profiles = ", ".join(sorted({d.mig_profile for d in devices if d.parent_uuid}))
        return has + (f" (MIG profiles here: {profiles})" if profiles else "")
    split = ", ".join(sorted({d.index.split(":")[0] for d in devices if d.mig_mode}))
    return has + (f" (GPU {split} in MIG mode: ask for a MIG slice)" if split else "")


def choose(devices: list[Device], held: Held, request: Request, policy: Policy) -> list[Device]:
    """The devices ``request`` gets, given who holds what; raises AllocationError.

    The request's own project's holdings do not stand in its way, and come first.
    """
    r, p = request, policy
    what = f"a {_noun(r)}" if r.mig_profile else _plural(r.count, _noun(r))
    ask = f"{r.owner}/{r.project} asked for {what}"
    if r.count < 0:
        raise AllocationError(f"{ask}: the number of GPUs cannot be negative.")
    if r.mig_profile:
        if not p.allow_mig:
            raise AllocationError(f"{ask}, but MIG slices are not handed out here: ask for GPUs.")
        if r.count > 1:
            raise AllocationError(f"{ask} ×{r.count}: a project gets at most one MIG slice.")
    need = 1 if r.mig_profile else r.count
    if need == 0:
        return []
    if p.max_per_project is not None and need > p.max_per_project:
        raise AllocationError(
            f"{ask}, but a project may have at most {_plural(p.max_per_project, 'GPU')} here."
        )
    if r.gpu_type and r.gpu_type.strip().casefold() not in {t.casefold() for t in p.allowed_types}:
        allowed = f"one may ask for {', '.join(p.allowed_types)}" if p.allowed_types else ""
        raise AllocationError(f"{ask}, but {allowed or 'no GPU type may be asked for'} here.")
    kind = [d for d in devices if _fits(d, r)]
    if len(kind) < need:
        raise AllocationError(f"{ask}, but {_too_few(devices, kind, r)}.")
    if p.max_per_user is not None:
        mine = [(u, h) for u, hs in held.items() for h in hs if h.owner == r.owner]
        mine = [(u, h) for u, h in mine if h.project != r.project]
        if len(mine) + need > p.max_per_user:
            names = {d.uuid: label(d) for d in devices}
            listed = _who([h for _, h in mine], [names.get(u, u) for u, _ in mine[:MOST]])
            raise AllocationError(
                f"{ask}, but {r.owner} may hold at most {_plural(p.max_per_user, 'GPU')} over "
                f"all projects and holds {len(mine)} already" + (f": {listed}." if mine else ".")
            )
    cap = 1 if p.mode == "exclusive" else p.shared_cap
    free: list[tuple[bool, int, tuple, Device]] = []
    busy: list[tuple[Device, tuple[Holder, ...]]] = []
    for d in kind:
        hs = held.get(d.uuid, ()) + (held.get(d.parent_uuid, ()) if d.parent_uuid else ())
        others = tuple(h for h in hs if h.project != r.project or h.owner != r.owner)
        if len(others) < cap:
            free.append((len(others) == len(hs), len(others), _order(d), d))
        else:
            busy.append((d, others))
    if len(free) < need:
        free_text = ", ".join(label(t[3]) for t in free) or "none"
        full = "is held by" if cap == 1 else f"is full ({cap} projects):"
        held_text = "; ".join(f"{label(d)} {full} {_who(hs)}" for d, hs in busy)
        unnamed = "; ".join(f"{label(d)} {full} {_unnamed(hs, r.owner)}" for d, hs in busy)
        head = (
            f"{ask}, but {len(free)} of {_plural(len(kind), _noun(r))} "
            f"{'is' if len(free) == 1 else 'are'} free ({free_text}). "
        )
        raise AllocationError(f"{head}{held_text}.", busy, f"{head}{unnamed}.")
    free.sort(key=lambda t: t[:3])
    return sorted((t[3] for t in free[:need]), key=_order)


class AllocationStore(jsonfile.LockedRecord):
    """Who holds which device, in one JSON file; every change under a file lock.

    Writes are atomic and durable (temporary file, fsync, ``os.replace``, fsync of
    the folder), so a hub that restarts finds every holding it recorded, and two
    hub processes or threads sharing the file never hand out the same device twice
    in exclusive mode.

    ``rebuild`` (the spawner's: the project containers that exist, and the spawns
    under way) is what a damaged or missing record is rebuilt from; without it, a
    damaged record is refused with a message saying how it gets repaired.
    ``on_dead(held, dead)`` is told of the holdings dropped because their projects
    were found dead (the usage ledger records them), under the lock.
    """

    kind = stateversion.KINDS["gpu-allocations"]
    section = "holdings"
    what = "The GPU allocation record"
    on_damage = "its holdings were rebuilt from the project containers that exist"
    Error = AllocationError

    def __init__(
        self,
        path: Path,
        clock: Callable[[], float] = time.time,
        rebuild: Callable[[], Held] | None = None,
        log=None,
        on_dead: Callable[[Held, list[tuple[str, str]]], None] | None = None,
    ):
        super().__init__(path, log)
        self._clock = clock
        self._rebuild = rebuild
        self._on_dead = on_dead
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _parse(self, section) -> Held:
        if not isinstance(section, dict):
            raise TypeError('"holdings" is not a mapping of device UUIDs')
        held = {}
        for u, hs in section.items():
            if not isinstance(hs, list):
                raise TypeError(f"the holders of {u} are not a list")
            held[u] = tuple(map(_holder, hs))
        return _keep(held, bool)

    def _dump(self, held: Held) -> dict:
        return {u: [asdict(h) for h in hs] for u, hs in held.items()}

    def _missing(self) -> Held:
        return self._rebuild() if self._rebuild is not None else {}

    def _recover(self) -> Held:
        return self._rebuild() if self._rebuild is not None else {}

    def _damaged(self, reason: str) -> Held:
        if self._rebuild is None:
            raise AllocationError(
                f"{self.what} {self.path} is damaged ({reason}). gpulab repairs it at the next "
                "GPU spawn (it moves the file aside and rebuilds it from the project containers "
                "that exist); to repair it now, move the file away: the next spawn rebuilds it."
            )
        held = super()._damaged(reason)
        self.log.warning(
            "%s rebuilt: %s", self.what,
            "; ".join(f"{u} for {_who(hs)}" for u, hs in held.items()) or "no GPU is held",
        )  # fmt: skip
        return held

    def holdings(self) -> Held:
        with self.locked():
            return self._read()

    def held_by(self, owner: str, project: str) -> list[str]:
        return _uuids(self.holdings(), (owner, project))

    def allocate(
        self,
        devices: list[Device],
        request: Request,
        policy: Policy,
        alive: Alive | None = None,
        grace: float = 0.0,
    ) -> list[Device]:
        """Reserve devices for the request's project and record it; raises AllocationError.

        What the project holds is kept where it still fits (a respawn after a hub
        restart gets the same GPUs), released where not. Projects that
        ``alive(owner, project)`` (called under the lock) calls dead lose their
        holdings first; without it none does. A holding reserved less than
        ``grace`` seconds ago is never dropped: its container may not exist yet.
        Each holding the project keeps or gets is stamped ``reserved`` now.
        A refused request writes nothing.
        """
        me = (request.owner, request.project)
        with self.locked():
            before = held = self._read()
            now = self._clock()
            dead: list[tuple[str, str]] = []
            if alive is not None:
                fresh = {h.key for hs in held.values() for h in hs if now - h.reserved < grace}
                held, dead = _drop_dead(held, lambda o, p: (o, p) in fresh or alive(o, p), keep=me)
            chosen = choose(devices, held, request, policy)
            keep = {d.uuid for d in chosen}
            after = {
                u: tuple(replace(h, reserved=now) if h.key == me else h for h in hs)
                for u, hs in held.items()
            }
            after = {u: tuple(h for h in hs if h.key != me or u in keep) for u, hs in after.items()}
            for u in sorted(keep - set(_uuids(held, me))):
                after[u] = after.get(u, ()) + (Holder(*me, now, now),)
            after = _keep(after, bool)
            if self._dump(after) != self._dump(before) or not self.path.exists():
                self._write(after)
            self._tell_dead(before, dead)  # once written: a refusal writes nothing
            return chosen

    def release(self, owner: str, project: str) -> list[str]:
        """Free what (owner, project) holds; the UUIDs freed (server stopped, culled, died)."""
        with self.locked():
            held = self._read()
            freed = _uuids(held, (owner, project))
            if freed:
                self._write(_keep(held, lambda h: h.key != (owner, project)))
            return freed

    def release_dead(self, alive: Alive) -> list[tuple[str, str]]:
        """Drop the holdings of every project ``alive`` calls dead; those (owner, project)."""
        with self.locked():
            held = self._read()
            after, dead = _drop_dead(held, alive)
            if dead:
                self._write(after)
                self._tell_dead(held, dead)
            return dead

    def _tell_dead(self, held: Held, dead: list[tuple[str, str]]) -> None:
        if dead and self._on_dead is not None:
            self._on_dead(held, dead)


def _uuids(held: Held, key: tuple[str, str]) -> list[str]:
    return [u for u, hs in held.items() if any(h.key == key for h in hs)]


def _holder(h: dict) -> Holder:
    if not isinstance(h, dict):
        raise TypeError(f"a holder is a {type(h).__name__}, not an object")
    owner, project, since = h["owner"], h["project"], h["since"]
    reserved = h.get("reserved", since)
    if not (isinstance(owner, str) and isinstance(project, str) and owner and project):
        raise TypeError(f"a holder's owner and project are not names: {owner!r}, {project!r}")
    if not all(isinstance(t, int | float) and not isinstance(t, bool) for t in (since, reserved)):
        raise TypeError(f"a holder's times are not numbers: {since!r}, {reserved!r}")
    return Holder(owner, project, float(since), float(reserved))


def _keep(held: Held, ok: Callable[[Holder], bool]) -> Held:
    """``held`` with only the holders ``ok`` accepts, and no device left without one."""
    kept = {u: tuple(h for h in hs if ok(h)) for u, hs in held.items()}
    return {u: hs for u, hs in kept.items() if hs}


def _drop_dead(held: Held, alive: Alive, keep: tuple = ()) -> tuple[Held, list[tuple[str, str]]]:
    verdict: dict[tuple[str, str], bool] = {}
    for h in (h for hs in held.values() for h in hs):
        if h.key not in verdict:
            verdict[h.key] = h.key == keep or bool(alive(*h.key))
    return _keep(held, lambda h: verdict[h.key]), [k for k, ok in verdict.items() if not ok]
