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
into b; addresses, links up and netem are set in each; all through rtnetlink by this module run
inside the namespace (``python _netlink.py OP ARGS``), so neither ``ip`` nor ``tc`` is needed. A
process joins either side with ``nsenter --target PID --user --net --mount
--preserve-credentials``. Each capability is probed on its own (:func:`missing`): the
``unshare``, ``nsenter`` and ``mount`` programs, the namespaces, a sysfs in them, veth, then
netem, so a machine runs what it has and says what it lacks.
"""
from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import os
import re
import select
import shutil
import socket
import struct
import subprocess
import sys
import time
from typing import Callable, Sequence

ADDRESSES = {"a": "10.211.0.1", "b": "10.211.0.2"}
DEVICES = {"a": "eglcuda-a", "b": "eglcuda-b"}
NETEM_LIMIT = 100_000  # packets queued in netem: its default (1,000) would drop on its own at these rates
SETUP_S = 10.0
CC_SYSCTL = "/proc/sys/net/ipv4/tcp_congestion_control"
SELF = [sys.executable, os.path.abspath(__file__)]  # (its operations, run in a namespace: see _main)


@dataclasses.dataclass(frozen=True)
class LinkSpec:
    """The link: a veth pair, with netem's ``delay`` (ms) and ``loss`` (%) on both ends when either
    is set (so a round trip sees twice the delay); the veth's MTU; its segmentation offload
    (``offload``: None means off where there is loss, so that netem drops MTU-sized packets as a
    wire would, not whole 64 KB super-packets; on otherwise); and the TCP congestion control of both
    namespaces (``cc``: "" keeps the kernel's default)."""

    delay_ms: float = 0.0
    loss_pct: float = 0.0
    mtu: int = 1500
    offload: bool | None = None
    cc: str = ""

    @property
    def netem(self) -> bool:
        return self.delay_ms > 0 or self.loss_pct > 0

    @property
    def segments(self) -> bool:
        """Whether the veth keeps TCP segmentation offload (TSO, GSO)."""
        return self.offload if self.offload is not None else not self.loss_pct

    @classmethod
    def parse(cls, text: str) -> "LinkSpec":
        """``veth[:mtu=N]`` or ``netem:delay=2ms,loss=0.5%[,mtu=N]``, either with ``offload=on|off``
        and ``cc=NAME``; ValueError names what is wrong."""
        kind, _, rest = text.partition(":")
        if kind not in ("veth", "netem"):
            raise ValueError(f"a link is veth or netem:delay=2ms,loss=0.5%, not {text!r}")
        patterns = {"delay": r"(\d+(?:\.\d+)?)ms", "loss": r"(\d+(?:\.\d+)?)%", "mtu": r"(\d+)",
                    "offload": r"(on|off)", "cc": r"([a-z][a-z0-9_]*)"}
        values: dict[str, str] = {}
        for item in filter(None, rest.split(",")):
            key, _, value = item.partition("=")
            if key not in patterns or key in values:
                raise ValueError(f"unknown or repeated link setting {key!r} in {text!r}: "
                                 f"delay=, loss=, mtu=, offload=, cc=")
            found = re.fullmatch(patterns[key], value)
            if found is None:
                raise ValueError(f"link setting {item!r} in {text!r}: delay=2ms, loss=0.5%, mtu=1500, offload=off, "
                                 f"cc=bbr")
            values[key] = found.group(1)
        if kind == "veth" and {"delay", "loss"} & set(values):
            raise ValueError(f"delay and loss need netem: netem:{rest}")
        offload = {"on": True, "off": False}.get(values.get("offload", ""))
        spec = cls(float(values.get("delay", 0)), float(values.get("loss", 0)), int(values.get("mtu", 1500)),
                   offload, values.get("cc", ""))
        if kind == "netem" and not spec.netem:
            raise ValueError(f"netem without delay or loss in {text!r}: netem:delay=2ms,loss=0.5%")
        if not (0 <= spec.loss_pct < 100 and 68 <= spec.mtu <= 65535):
            raise ValueError(f"loss below 100 %, MTU 68 to 65535 in {text!r}")
        return spec

    def describe(self) -> str:
        parts = [f"veth, MTU {self.mtu}"]
        if self.netem:
            parts.append(f"netem {self.delay_ms:g} ms delay and {self.loss_pct:g} % loss each way")
        parts.append("segmentation offload " + ("on" if self.segments else "off"))
        if self.cc:
            parts.append(f"TCP {self.cc}")
        return ", ".join(parts)


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
        absent = [p for p in ("unshare", "nsenter", "mount", "sh") if shutil.which(p) is None]
        if absent:
            why = (f"no {', '.join(absent)} command (util-linux has unshare and nsenter: apt-get install "
                   f"util-linux mount)")
    elif name == "namespaces":
        said = _run(["unshare", "-rnm", sys.executable, "-c", ""])
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
        said = _run(["unshare", "-rn", *SELF, "veth", "v0", "v1", "1500"])
        if said:
            why = f"no veth pairs in a network namespace (making one: {said}; the veth kernel module)"
    elif name == "netem":
        said = _run(["unshare", "-rn", *SELF, "netem", "lo", "1", "0", "1000"])
        if said:
            why = f"no netem qdisc (adding one: {said}; the sch_netem kernel module: modprobe sch_netem)"
    _probed[name] = why
    return why


def _allowed_cc() -> str:
    """The congestion controls a network namespace may choose (the host's sysctl)."""
    try:
        with open("/proc/sys/net/ipv4/tcp_allowed_congestion_control") as allowed:
            return allowed.read().strip()
    except OSError:
        return "unknown"


def missing(spec: LinkSpec) -> str | None:
    """None when this machine can make ``spec``'s link, else one line naming the first thing missing:
    the programs, user, network and mount namespaces, a sysfs in them, veth, (for a netem link)
    netem, and the congestion control ``spec`` names."""
    needs = ["programs", "namespaces", "sysfs", "veth"] + (["netem"] if spec.netem else [])
    for name in needs:
        why = _probe(name)
        if why:
            return why
    allowed = _allowed_cc().split()
    if spec.cc and spec.cc not in allowed:
        return (f"no TCP congestion control {spec.cc} for a network namespace: it may choose only from "
                f"net.ipv4.tcp_allowed_congestion_control ({' '.join(allowed)}; sysctl -w as root to add one)")
    return None


# ==== rtnetlink: what ip and tc would do, so that neither is needed ==================================
# Run inside a namespace as ``python _netlink.py OP ARGS`` (see :func:`_main`). The messages are those
# iproute2 sends for the same commands (rtnetlink(7), linux/if_link.h, linux/pkt_sched.h).

RTM_NEWLINK, RTM_NEWADDR, RTM_NEWQDISC, RTM_GETQDISC = 16, 20, 36, 38
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE, NLM_F_DUMP = 0x1, 0x4, 0x200, 0x400, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
IFLA_IFNAME, IFLA_MTU, IFLA_LINKINFO, IFLA_NET_NS_PID = 3, 4, 18, 19
IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER = 1, 2, 1
IFA_ADDRESS, IFA_LOCAL = 1, 2
TCA_KIND, TCA_OPTIONS, TCA_STATS, TCA_STATS2, TCA_STATS_QUEUE = 1, 2, 3, 7, 3
TC_H_ROOT = 0xFFFFFFFF
TCA_NETEM_LATENCY64 = 10
IFF_UP = 0x1


def _attr(kind: int, payload: bytes) -> bytes:
    data = struct.pack("=HH", 4 + len(payload), kind) + payload
    return data + b"\0" * (-len(data) % 4)


def _attrs(data: bytes) -> dict[int, bytes]:
    found: dict[int, bytes] = {}
    while len(data) >= 4:
        length, kind = struct.unpack_from("=HH", data)
        if length < 4:
            break
        found[kind & 0x3FFF] = data[4:length]
        data = data[(length + 3) & ~3:]
    return found


def _ifinfo(index: int = 0, flags: int = 0, change: int = 0) -> bytes:
    return struct.pack("=BxHiII", socket.AF_UNSPEC, 0, index, flags, change)


class _Rtnl:
    """One NETLINK_ROUTE socket of this process's network namespace."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self.sock.bind((0, 0))
        self.seq = 0

    def request(self, kind: int, flags: int, body: bytes) -> list[tuple[int, bytes]]:
        """Send one message; the replies (type, payload) up to its ACK or the end of its dump.
        OSError with the kernel's errno when it says no."""
        self.seq += 1
        self.sock.send(struct.pack("=LHHLL", 16 + len(body), kind, NLM_F_REQUEST | flags, self.seq, 0) + body)
        replies: list[tuple[int, bytes]] = []
        while True:
            data = self.sock.recv(1 << 16)
            while len(data) >= 16:
                length, got, _, seq, _ = struct.unpack_from("=LHHLL", data)
                payload, data = data[16:length], data[(length + 3) & ~3:]
                if seq != self.seq:
                    continue
                if got == NLMSG_ERROR:
                    (error,) = struct.unpack_from("=i", payload)
                    if error:
                        raise OSError(-error, os.strerror(-error))
                    return replies
                if got == NLMSG_DONE:
                    return replies
                replies.append((got, payload))

    def link(self, index: int = 0, flags: int = 0, change: int = 0, attrs: bytes = b"", create: bool = False) -> None:
        self.request(RTM_NEWLINK, NLM_F_ACK | (NLM_F_CREATE | NLM_F_EXCL if create else 0),
                     _ifinfo(index, flags, change) + attrs)


def _veth(name: str, peer: str, mtu: str) -> None:
    """ip link add NAME mtu MTU type veth peer name PEER mtu MTU"""
    mtu_attr = _attr(IFLA_MTU, struct.pack("=I", int(mtu)))
    peer_info = _ifinfo() + mtu_attr + _attr(IFLA_IFNAME, peer.encode() + b"\0")
    info = _attr(IFLA_INFO_KIND, b"veth") + _attr(IFLA_INFO_DATA, _attr(VETH_INFO_PEER, peer_info))
    _Rtnl().link(attrs=mtu_attr + _attr(IFLA_IFNAME, name.encode() + b"\0") + _attr(IFLA_LINKINFO, info),
                 create=True)


def _move(name: str, pid: str) -> None:
    """ip link set NAME netns PID"""
    _Rtnl().link(socket.if_nametoindex(name), attrs=_attr(IFLA_NET_NS_PID, struct.pack("=I", int(pid))))


def _up(name: str, address: str) -> None:
    """ip link set lo up; ip addr add ADDRESS/24 dev NAME; ip link set NAME up"""
    rtnl = _Rtnl()
    rtnl.link(socket.if_nametoindex("lo"), IFF_UP, IFF_UP)
    index = socket.if_nametoindex(name)
    packed = socket.inet_aton(address)
    rtnl.request(RTM_NEWADDR, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
                 struct.pack("=BBBBI", socket.AF_INET, 24, 0, 0, index) + _attr(IFA_LOCAL, packed)
                 + _attr(IFA_ADDRESS, packed))
    rtnl.link(index, IFF_UP, IFF_UP)


def _ticks_per_us() -> float:
    """Packet scheduler ticks a microsecond, from /proc/net/psched (ticks-to-us and us-to-ticks
    factors, clock resolution); a resolution of 1 GHz means the factors' ratio is 1."""
    with open("/proc/net/psched") as psched:
        t2us, us2t, clock_res = (int(word, 16) for word in psched.read().split()[:3])
    return (1.0 if clock_res == 1_000_000_000 else t2us / us2t) * clock_res / 1e6


def _netem(name: str, delay_ms: str, loss_pct: str, limit: str) -> None:
    """tc qdisc add dev NAME root netem delay Dms loss P% limit N"""
    latency = round(float(delay_ms) * 1000 * _ticks_per_us())
    loss = round(float(loss_pct) / 100 * 0xFFFFFFFF)
    qopt = struct.pack("=6I", latency, int(limit), loss, 0, 0, 0)  # latency, limit, loss, gap, duplicate, jitter
    exact = _attr(TCA_NETEM_LATENCY64, struct.pack("=q", round(float(delay_ms) * 1e6)))  # ns: no tick rounding
    body = struct.pack("=BxxxiIII", socket.AF_UNSPEC, socket.if_nametoindex(name), 0, TC_H_ROOT, 0)
    _Rtnl().request(RTM_NEWQDISC, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
                    body + _attr(TCA_KIND, b"netem\0") + _attr(TCA_OPTIONS, qopt + exact))


def _netem_drops(name: str) -> None:
    """Prints the packets the netem qdisc of NAME dropped (tc -s qdisc show dev NAME)."""
    index = socket.if_nametoindex(name)
    dropped = 0
    for _, payload in _Rtnl().request(RTM_GETQDISC, NLM_F_DUMP, struct.pack("=BxxxiIII", 0, 0, 0, 0, 0)):
        if struct.unpack_from("=i", payload, 4)[0] != index:
            continue
        attrs = _attrs(payload[20:])
        if attrs.get(TCA_KIND, b"").rstrip(b"\0") != b"netem":
            continue
        queue = _attrs(attrs.get(TCA_STATS2, b"")).get(TCA_STATS_QUEUE)
        if queue is not None and len(queue) >= 12:
            dropped += struct.unpack_from("=I", queue, 8)[0]  # gnet_stats_queue: qlen, backlog, drops
        elif len(attrs.get(TCA_STATS, b"")) >= 16:
            dropped += struct.unpack_from("=I", attrs[TCA_STATS], 12)[0]  # tc_stats: bytes, packets, drops
    print(dropped)


SIOCETHTOOL, ETHTOOL_STSO, ETHTOOL_SGSO = 0x8946, 0x1F, 0x24


def _offload(name: str, state: str) -> None:
    """ethtool -K NAME tso STATE gso STATE"""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for command in (ETHTOOL_STSO, ETHTOOL_SGSO):
            value = ctypes.create_string_buffer(struct.pack("=II", command, int(state == "on")))
            fcntl.ioctl(sock, SIOCETHTOOL, struct.pack("16sP", name.encode(), ctypes.addressof(value)) + bytes(16))


def _set(path: str, value: str) -> None:
    """Writes a sysctl (/proc/sys/...) of this namespace."""
    with open(path, "w") as sysctl:
        sysctl.write(value)


def _show(path: str) -> None:
    """Prints a file as this namespace sees it (/proc/net/dev, /sys/class/net/...): no cat needed."""
    with open(path) as shown:
        sys.stdout.write(shown.read())


OPERATIONS: dict[str, Callable[..., None]] = {
    "show": _show, "set": _set, "offload": _offload, "veth": _veth, "move": _move, "up": _up, "netem": _netem,
    "netem-drops": _netem_drops}


def _main(argv: list[str]) -> int:
    """``python _netlink.py OP ARGS``: one operation in this process's network namespace; an error
    is one line on stderr and status 1; ``--help`` says the usage (status 0)."""
    if argv[:1] in (["-h"], ["--help"]):
        print(f"usage: _netlink.py {{{','.join(OPERATIONS)}}} ARGS\n{__doc__.splitlines()[0]}")
        return 0
    try:
        OPERATIONS[argv[0]](*argv[1:])
    except (KeyError, IndexError, TypeError):
        print(f"usage: _netlink.py {{{','.join(OPERATIONS)}}} ARGS", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{argv[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


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
        self.run("a", *SELF, "veth", DEVICES["a"], DEVICES["b"], str(self.spec.mtu))
        self.run("a", *SELF, "move", DEVICES["b"], str(self.pid("b")))
        for side in ("a", "b"):
            self.run(side, *SELF, "up", DEVICES[side], ADDRESSES[side])
            if not self.spec.segments:
                self.run(side, *SELF, "offload", DEVICES[side], "off")
            if self.spec.cc:
                try:
                    self.run(side, *SELF, "set", CC_SYSCTL, self.spec.cc)
                except LinkError as exc:
                    raise LinkError(f"TCP congestion control {self.spec.cc} refused in a network namespace (a "
                                    f"namespace may choose only from net.ipv4.tcp_allowed_congestion_control, "
                                    f"here {_allowed_cc()}): {exc}") from None
            if self.spec.netem:
                self.run(side, *SELF, "netem", DEVICES[side], f"{self.spec.delay_ms:g}", f"{self.spec.loss_pct:g}",
                         str(NETEM_LIMIT))
        deadline = time.monotonic() + SETUP_S
        while not all(self.run(s, *SELF, "show", f"/sys/class/net/{DEVICES[s]}/operstate").strip() == "up"
                      for s in "ab"):
            if time.monotonic() > deadline:
                raise LinkError("the veth pair did not come up")
            time.sleep(0.02)

    def congestion_control(self, side: str) -> str:
        """The TCP congestion control of ``side``'s namespace (its sender's, for what it sends)."""
        return self.run(side, *SELF, "show", CC_SYSCTL).strip()

    def counters(self, side: str) -> dict[str, int]:
        """What ``side`` saw: bytes its end of the veth sent (/proc/net/dev), TCP segments sent and
        retransmitted (/proc/net/snmp, of its namespace), packets netem dropped there (0 without netem)."""
        devices = self.run(side, *SELF, "show", "/proc/net/dev")
        row = re.search(rf"^\s*{DEVICES[side]}:(.*)$", devices, re.MULTILINE)
        tx_bytes = int(row.group(1).split()[8]) if row else 0
        snmp = self.run(side, *SELF, "show", "/proc/net/snmp").splitlines()
        tcp = [line.split()[1:] for line in snmp if line.startswith("Tcp:")]
        fields = dict(zip(tcp[0], tcp[1])) if len(tcp) >= 2 else {}
        dropped = int(self.run(side, *SELF, "netem-drops", DEVICES[side])) if self.spec.netem else 0
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


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
