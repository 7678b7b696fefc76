"""What a hostile build step tries (copied into a test project, run by its RUN line).

``python3 /probe.py net|forks|disk`` prints ``PROBE <json>`` with what worked.
Standard library only: the image is plain Debian.
"""

import errno
import json
import os
import signal
import socket
import struct
import sys
import time


def try_socket(family, kind, proto=0) -> str:
    try:
        s = socket.socket(family, kind, proto)
    except OSError as e:
        return f"refused: {e}"
    s.close()
    return "opened"


def arp_spoof() -> str:
    """An ARP reply claiming every address of the segment: needs a raw packet socket."""
    try:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
    except OSError as e:
        return f"refused: {e}"
    try:
        s.bind(("eth0", 0))
        frame = b"\xff" * 6 + b"\x02\x42\xac\x11\x00\x99" + struct.pack("!H", 0x0806)
        s.send(frame + b"\x00" * 28)
        return "sent"
    finally:
        s.close()


def dial(ip: str, port: int) -> str:
    try:
        with socket.create_connection((ip, port), timeout=2) as s:
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
            return "open: " + s.recv(200).decode(errors="replace")
    except OSError as e:
        return f"closed: {e}"


def gateway() -> str:
    with open("/proc/net/route") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[1] == "00000000":
                return socket.inet_ntoa(struct.pack("<L", int(fields[2], 16)))
    return ""


def own_subnet() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((gateway() or "192.0.2.1", 9))
        return ".".join(s.getsockname()[0].split(".")[:3])


def status_field(name: str) -> str:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split()[1]
    return ""


def first_readable(*paths: str) -> str:
    """The first of these cgroup files that exists (cgroup v1, then v2), stripped."""
    for path in paths:
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            continue
    return ""


def pids_max() -> str:
    return first_readable("/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max")


def cpu_quota() -> str:
    return first_readable("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu.max")


def net() -> dict:
    args = json.load(open("/probe.json"))
    out = {
        "raw_packet": try_socket(socket.AF_PACKET, socket.SOCK_RAW),
        "raw_inet": try_socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
        "arp_spoof": arp_spoof(),
        "cap_eff": int(status_field("CapEff"), 16),
        "no_new_privs": int(status_field("NoNewPrivs")),
        "pids_max": pids_max(),
        "cpu_quota": cpu_quota(),
        "victim": dial(args["victim"], 8000),
        "gateway": dial(gateway(), args["port"]),
        "host": dial(args["host"], args["port"]),
        "own_subnet": own_subnet(),
    }
    out["arp_table"] = open("/proc/net/arp").read()
    return out


def forks(hold: float = 0) -> dict:
    children, refused = [], False
    for _ in range(5000):
        try:
            pid = os.fork()
        except OSError as e:
            refused = e.errno == errno.EAGAIN
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
    time.sleep(hold)  # a bomb that keeps its processes, as a real one does
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return {"forked": len(children), "fork_refused": refused}


def disk() -> dict:
    chunk = b"\0" * (1 << 20)
    with open("/tmp/fill", "wb") as f:
        for mib in range(1, 4097):
            f.write(chunk)
            if mib % 10 == 0:
                f.flush()
                os.fsync(f.fileno())
                print(f"WROTE {mib}", flush=True)
                time.sleep(0.1 if len(sys.argv) < 3 else 0.5)
    return {"wrote": 4096}


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "forks" and len(sys.argv) > 2:
        result = forks(float(sys.argv[2]))
    else:
        result = {"net": net, "forks": forks, "disk": disk}[what]()
    print("PROBE " + json.dumps(result), flush=True)
