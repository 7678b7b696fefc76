"""The containers the test cluster's tests run (tests/cluster_kit.py): an 11 MB root
file system made from this machine's own programs, and a command that makes it answer
HTTP. No registry or network is needed to make them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

from cluster_engines import KitError


def _out(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout


def tiny_image_tar(path: Path) -> Path:
    """A root file system holding only /bin/sleep, perl with Debian's perl-base modules,
    and the libraries they link (about 11 MB): enough for a container that runs until
    it is stopped, or that answers HTTP (``http_answer``)."""
    programs = [shutil.which("sleep"), shutil.which("perl")]
    libs = re.findall(r"(/\S+\.so[.\d]*)", _out("ldd", *programs))
    inc = _out("perl", "-e", 'print join("\\n", @INC)').split()
    modules = [d for d in inc if d.endswith("/perl-base") and Path(d).is_dir()]
    with tarfile.open(path, "w") as tar:
        for f in [*programs, *sorted(set(libs))]:
            real = os.path.realpath(f)
            tar.add(real, arcname=f.lstrip("/"))
            if real != f:
                tar.add(real, arcname=real.lstrip("/"))
        for d in modules:
            tar.add(d, arcname=d.lstrip("/"))
    return path


def http_answer(port: int, text: str) -> list[str]:
    """A container command (for ``tiny_image_tar``'s image) that answers every HTTP
    request on ``port`` with 200 and ``text``."""
    if not re.fullmatch(r"[A-Za-z0-9 .,:_-]{1,200}", text):
        raise KitError(f"http_answer text {text!r}: letters, digits and . , : _ - only")
    return [
        "perl", "-MIO::Socket::INET", "-e",
        f"my $s = IO::Socket::INET->new(LocalPort => {int(port)}, Listen => 8, ReuseAddr => 1)"
        ' or die "listen: $!"; while (my $c = $s->accept) {'
        " while (my $l = <$c>) { last if $l =~ /^\\r?\\n$/ }"
        ' print $c "HTTP/1.0 200 OK\\r\\nContent-Type: text/plain\\r\\n\\r\\n'
        f'{text}\\n"; close $c }}',
    ]  # fmt: skip
