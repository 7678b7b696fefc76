"""Project images reach the nodes through a registry: the hub's engine pushes the
image it built, and the nodes pull exactly the digest the push gave (a tag can be
pushed again; a digest always names the same image).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from gpulab_hub.cluster import ClusterError

# host[:port] of a registry: a host name or IPv4 address, and a port.
_REGISTRY = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?(?::[0-9]{1,5})?")
_REPO = re.compile(r"[a-z0-9][a-z0-9._/-]{0,200}")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def registry_name(value: str, setting: str = "registry") -> str:
    """``value`` if it is a registry's host[:port] (full match), else ClusterError."""
    if not isinstance(value, str) or _REGISTRY.fullmatch(value) is None or ".." in value:
        raise ClusterError(
            f"The hub's {setting} setting {value!r} is not a registry's host:port; ask the "
            "administrator (docs/cluster.md)"
        )
    return value


def split_tag(image: str) -> tuple[str, str]:
    """("gpulab/project", "0123abcd") of "gpulab/project:0123abcd"."""
    repo, _, tag = image.rpartition(":")
    if _REPO.fullmatch(repo) is None or _TAG.fullmatch(tag) is None or ".." in repo:
        raise ClusterError(f"Image {image!r} is not a repository:tag gpulab pushes")
    return repo, tag


def node_reference(registry_for_nodes: str, image: str, digest: str) -> str:
    """What the nodes pull and run: <registry for nodes>/<repository>@<digest>."""
    repo, _ = split_tag(image)
    if DIGEST.fullmatch(digest) is None:
        raise ClusterError(f"{digest!r} is not an image digest")
    return f"{registry_name(registry_for_nodes, 'registry_for_nodes')}/{repo}@{digest}"


class PushProgress:
    """Push events -> a line for the spawn page, at most every ``every`` seconds (the
    megabytes sent of the layers the registry does not have yet)."""

    def __init__(self, emit: Callable[[str], None], every: float = 3.0, clock=time.monotonic):
        self.emit, self.every, self.clock = emit, every, clock
        self.layers: dict[str, tuple[int, int]] = {}  # layer -> (bytes sent, size)
        self.last = 0.0

    def __call__(self, event: dict) -> None:
        layer, detail = event.get("id"), event.get("progressDetail") or {}
        if not isinstance(layer, str):
            return
        current, total = detail.get("current"), detail.get("total")
        if isinstance(current, int) and isinstance(total, int) and total > 0:
            self.layers[layer] = (min(current, total), total)
        elif event.get("status") in ("Pushed", "Layer already exists") and layer in self.layers:
            self.layers[layer] = (self.layers[layer][1], self.layers[layer][1])
        now = self.clock()
        if self.layers and now - self.last >= self.every:
            self.last = now
            sent = sum(c for c, _ in self.layers.values()) / 1e6
            size = sum(t for _, t in self.layers.values()) / 1e6
            self.emit(f"Sending the image to the cluster's registry: {sent:.0f} of {size:.0f} MB")


def push(docker_call, image: str, registry: str, on_event: Callable[[dict], None]) -> str:
    """Blocking: tag ``image`` (repository:tag of this machine's engine) into
    ``registry``, push it, and return the digest the registry gave it."""
    repo, tag = split_tag(image)
    target = f"{registry_name(registry)}/{repo}"
    docker_call("tag", image, target, tag=tag)
    digest = ""
    for event in docker_call("push", target, tag=tag, stream=True, decode=True):
        if not isinstance(event, dict):
            continue
        if event.get("error"):
            raise ClusterError(
                f"The cluster's registry {registry} did not take the project's image: "
                f"{str(event['error'])[:300]}. Ask the administrator (docs/cluster.md)."
            )
        aux = event.get("aux")
        if isinstance(aux, dict) and isinstance(aux.get("Digest"), str):
            digest = aux["Digest"]
        on_event(event)
    if DIGEST.fullmatch(digest) is None:
        raise ClusterError(
            f"The cluster's registry {registry} took the project's image but gave no digest"
        )
    return digest
