"""A real network link on one host, unprivileged: two network namespaces joined by a veth pair,
optionally impaired by netem (delay and loss on both ends), for bench/remote_link.py and the
remote-subscriber link tests (tests/unit/remote/test_link.py, tests/gpu/test_remote_link.py).

    spec = LinkSpec.parse("netem:delay=2ms,loss=0.5%")      # or "veth": a clean link
    why = missing(spec)                                     # None, or one line naming what is not here
    with Link(spec) as link:
        subprocess.Popen(link.enter("a") + [sys.executable, "relay.py"], ...)      # side a: 10.211.0.1
        subprocess.Popen(link.enter("b") + [sys.executable, "remote.py"], ...)     # side b: 10.211.0.2

How: ``unshare -rnm`` makes a user namespace (this user mapped to its root, so no privilege is
needed) with network namespace a; a second process enters it and ``unshare -nm`` makes network
namespace b, owned by the same user namespace. Each side has a mount namespace of its own with a
sysfs of its network namespace on /sys (UCX finds network devices there: the host's /sys lists
the host's devices). Each holder is a ``sh`` reading its stdin, so it ends, and its namespaces
with it, when this process closes the pipe or dies. The veth pair is made in a and one end moved
into b (``ip link set ... netns PID``); a process joins either side with ``nsenter --target PID
--user --net --mount --preserve-credentials``. Each capability is probed on its own
(:func:`missing`): the programs, namespaces, sysfs, veth, then ``tc`` and netem, so a machine
runs what it has and says what it lacks.
"""
from __future__ import annotations

import dataclasses
import re
import select
import shutil
import subprocess
import time
from typing import Sequence

ADDRESSES = {"a": "10.211.0.1", "b": "10.211.0.2"}
DEVICES = {"a": "eglcuda-a", "b": "eglcuda-b"}
NETEM_LIMIT = 100_000  # packets queued in netem: its default (1,000) would drop on its own at these rates
SETUP_S = 10.0


@dataclasses.dataclass(frozen=True)
class LinkSpec:
    """The link: a veth pair, with netem's ``delay`` (ms) and ``loss`` (%) on both ends when either
    is set (so a round trip sees twice the delay), and the veth's MTU."""

    delay_ms: float = 0.0
    loss_pct: float = 0.0
    mtu: int = 1500

    @property
    def netem(self) -> bool:
        return self.delay_ms > 0 or self.loss_pct > 0

    @classmethod
    def parse(cls, text: str) -> "LinkSpec":
        """``veth[:mtu=N]`` or ``netem:delay=2ms,loss=0.5%[,mtu=N]``; ValueError names what is wrong."""
        kind, _, rest = text.partition(":")
        if kind not in ("veth", "netem"):
            raise ValueError(f"a link is veth or netem:delay=2ms,loss=0.5%, not {text!r}")
        values: dict[str, float] = {}
        for item in filter(None, rest.split(",")):
            key, _, value = item.partition("=")
            pattern = {"delay": r"(\d+(?:\.\d+)?)ms", "loss": r"(\d+(?:\.\d+)?)%", "mtu": r"(\d+)"}.get(key)
            if pattern is None or key in values:
                raise ValueError(f"unknown or repeated link setting {key!r} in {text!r}: delay=, loss=, mtu=")
            found = re.fullmatch(pattern, value)
            if found is None:
                raise ValueError(f"link setting {item!r} in {text!r}: delay=2ms, loss=0.5%, mtu=1500")
            values[key] = float(found.group(1))
        if kind == "veth" and set(values) - {"mtu"}:
            raise ValueError(f"delay and loss need netem: netem:{rest}")
        spec = cls(values.get("delay", 0.0), values.get("loss", 0.0), int(values.get("mtu", 1500)))
        if kind == "netem" and not spec.netem:
            raise ValueError(f"netem without delay or loss in {text!r}: netem:delay=2ms,loss=0.5%")
        if not (0 <= spec.loss_pct < 100 and 68 <= spec.mtu <= 65535):
            raise ValueError(f"loss below 100 %, MTU 68 to 65535 in {text!r}")
        return spec

    def describe(self) -> str:
        parts = [f"veth, MTU {self.mtu}"]
        if self.netem:
            parts.append(f"netem {self.delay_ms:g} ms delay and {self.loss_pct:g} % loss each way")
        return ", ".join(parts)

    def netem_args(self) -> list[str]:
        return ["delay", f"{self.delay_ms:g}ms", "loss", f"{self.loss_pct:g}%", "limit", str(NETEM_LIMIT)]


def _run(argv: Sequence[str], timeout: float = SETUP_S) -> str | None:
    """None when ``argv`` succeeds, else the last line it said (or its status)."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    said = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    return said[-1] if said else f"exit status {done.returncode}"


_probed: dict[str, str | None] = {}


def _probe(name: str) -> str | None:
    """One capability's probe: None when this machine has it, else why not (one line)."""
    if name in _probed:
        return _probed[name]
    why: str | None = None
    if name == "programs":
        absent = [p for p in ("unshare", "nsenter", "ip") if shutil.which(p) is None]
        if absent:
            why = (f"no {', '.join(absent)} command (util-linux has unshare and nsenter, iproute2 has ip: "
                   f"apt-get install util-linux iproute2)")
    elif name == "namespaces":
        said = _run(["unshare", "-rnm", "true"])
        if said:
            why = (f"no unprivileged user, network and mount namespaces here (unshare -rnm: {said}; "
                   f"sysctl kernel.unprivileged_userns_clone=1 or user.max_user_namespaces > 0, "
                   f"and a container that permits unshare)")
    elif name == "sysfs":
        said = _run(["unshare", "-rnm", "mount", "-t", "sysfs", "sysfs", "/sys"])
        if said:
            why = (f"no sysfs of its own for a network namespace (mount -t sysfs: {said}); UCX finds the "
                   f"namespace's network devices there")
    elif name == "veth":
        said = _run(["unshare", "-rn", "ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"])
        if said:
            why = f"no veth pairs in a network namespace (ip link add ... type veth: {said}; the veth kernel module)"
    elif name == "tc":
        if shutil.which("tc") is None:
            why = "no tc command for netem (iproute2 has it: apt-get install iproute2)"
    elif name == "netem":
        said = _run(["unshare", "-rn", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"])
        if said:
            why = f"no netem qdisc (tc qdisc add ... netem: {said}; the sch_netem kernel module: modprobe sch_netem)"
    _probed[name] = why
    return why


def missing(spec: LinkSpec) -> str | None:
    """None when this machine can make ``spec``'s link, else one line naming the first thing missing:
    the programs, user, network and mount namespaces, a sysfs in them, veth, and (for a netem link)
    tc and netem."""
    needs = ["programs", "namespaces", "sysfs", "veth"] + (["tc", "netem"] if spec.netem else [])
    for name in needs:
        why = _probe(name)
        if why:
            return why
    return None


class LinkError(RuntimeError):
    """Making the link failed although the probes passed (the step and what the tool said)."""


class Link:
    """Two network namespaces, ``a`` and ``b``, joined by ``spec``'s link; see the module notes.
    Use it as a context manager: the namespaces end with it (or with this process)."""

    def __init__(self, spec: LinkSpec) -> None:
        self.spec = spec
        self._holders: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> "Link":
        try:
            self._holders["a"] = self._hold(["unshare", "-rnm"])
            self._holders["b"] = self._hold(self.enter("a") + ["unshare", "-nm"])
            self._configure()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _hold(self, prefix: list[str]) -> subprocess.Popen[bytes]:
        """A holder of new namespaces made by ``prefix``, once its sysfs is mounted."""
        holder = subprocess.Popen(prefix + ["sh", "-c", "mount -t sysfs sysfs /sys && echo up && read line"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert holder.stdout is not None and holder.stderr is not None
        ready = select.select([holder.stdout], [], [], SETUP_S)[0]
        if not ready or holder.stdout.readline().strip() != b"up":
            holder.kill()
            holder.wait(5)
            said = holder.stderr.read().decode(errors="replace").strip()
            raise LinkError(f"{' '.join(prefix)} made no namespaces within {SETUP_S:g} s "
                            f"(status {holder.returncode}): {said}")
        return holder

    def pid(self, side: str) -> int:
        """The pid holding ``side``'s namespaces."""
        return self._holders[side].pid

    def enter(self, side: str) -> list[str]:
        """The command prefix that runs a program in ``side``'s network namespace (as this user)."""
        return ["nsenter", f"--target={self.pid(side)}", "--user", "--net", "--mount", "--preserve-credentials"]

    def run(self, side: str, *argv: str) -> str:
        """``argv`` run in ``side``'s namespace; its stdout (LinkError with what it said when it fails)."""
        done = subprocess.run(self.enter(side) + list(argv), capture_output=True, text=True, timeout=SETUP_S)
        if done.returncode:
            raise LinkError(f"{' '.join(argv)} in namespace {side}: {(done.stderr or done.stdout).strip()}")
        return done.stdout

    def _configure(self) -> None:
        a, b = DEVICES["a"], DEVICES["b"]
        mtu = str(self.spec.mtu)
        self.run("a", "ip", "link", "add", a, "mtu", mtu, "type", "veth", "peer", "name", b, "mtu", mtu)
        self.run("a", "ip", "link", "set", b, "netns", str(self.pid("b")))
        for side in ("a", "b"):
            device = DEVICES[side]
            self.run(side, "ip", "link", "set", "lo", "up")
            self.run(side, "ip", "addr", "add", f"{ADDRESSES[side]}/24", "dev", device)
            self.run(side, "ip", "link", "set", device, "up")
            if self.spec.netem:
                self.run(side, "tc", "qdisc", "add", "dev", device, "root", "netem", *self.spec.netem_args())
        deadline = time.monotonic() + SETUP_S
        while not all("state UP" in self.run(s, "ip", "link", "show", DEVICES[s]) for s in ("a", "b")):
            if time.monotonic() > deadline:
                raise LinkError("the veth pair did not come up")
            time.sleep(0.02)

    def counters(self, side: str) -> dict[str, int]:
        """What ``side`` saw: bytes its end of the veth sent (/proc/net/dev), TCP segments sent and
        retransmitted (/proc/net/snmp, of its namespace), packets netem dropped there (0 without netem)."""
        devices = self.run(side, "cat", "/proc/net/dev")
        row = re.search(rf"^\s*{DEVICES[side]}:(.*)$", devices, re.MULTILINE)
        tx_bytes = int(row.group(1).split()[8]) if row else 0
        snmp = self.run(side, "cat", "/proc/net/snmp").splitlines()
        tcp = [line.split()[1:] for line in snmp if line.startswith("Tcp:")]
        fields = dict(zip(tcp[0], tcp[1])) if len(tcp) >= 2 else {}
        dropped = 0
        if self.spec.netem:
            shown = self.run(side, "tc", "-s", "qdisc", "show", "dev", DEVICES[side])
            found = re.search(r"dropped (\d+)", shown)
            dropped = int(found.group(1)) if found else 0
        return {"tx_bytes": tx_bytes, "tcp_out_segments": int(fields.get("OutSegs", 0)),
                "tcp_retransmitted": int(fields.get("RetransSegs", 0)), "netem_dropped": dropped}

    def close(self) -> None:
        """End both holders (b first: its namespace lives in a's user namespace); idempotent."""
        for side in ("b", "a"):
            holder = self._holders.pop(side, None)
            if holder is None:
                continue
            for pipe in (holder.stdin, holder.stdout, holder.stderr):
                if pipe is not None:
                    pipe.close()  # (its read ends: it exits)
            try:
                holder.wait(5)
            except subprocess.TimeoutExpired:
                holder.kill()
                holder.wait(5)
