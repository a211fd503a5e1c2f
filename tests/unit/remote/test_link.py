"""Remote subscribers over a real link on the stand-in libcuda: the publisher and the relay in one
network namespace, the remote subscribers in another, a veth pair between them (real addresses,
UCX over TCP on the veth); 1080p NV12 at 60 frames/s over the clean link and, with netem, over
2 ms delay and 0.5 % loss each way (tests/netlink.py). Each case skips naming what the machine
lacks: the unshare/nsenter/mount programs, user, network and mount namespaces, a sysfs in them,
veth or netem (bench/_netlink.py probes each; it needs neither ip nor tc)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ... import netlink

LINKS = pytest.mark.parametrize("spec", [netlink.CLEAN, netlink.LOSSY], ids=["veth", "netem-2ms-0.5%"])
RATE_CORES = 4  # publisher, relay and remote each copy and check 3.1 MB 60 times a second on the CPU


def test_remote_subscribers_in_another_network_namespace_get_every_byte_over_veth(env, path):
    with netlink.sides(netlink.CLEAN, env, path) as group:
        netlink.across_the_link(group)


@LINKS
def test_1080p_over_the_link_every_byte_in_order(env, path, spec):
    with netlink.sides(spec, env, path) as group:
        netlink.at_60(group, spec, frames=120, judge_rate=False)


@LINKS
def test_1080p_over_the_link_holds_60_frames_a_second(env, path, spec):
    cores = len(os.sched_getaffinity(0))
    if cores < RATE_CORES:
        pytest.skip(f"judging 60 frames/s of 1080p on the stand-in libcuda needs {RATE_CORES} CPU cores, "
                    f"this process has {cores} (the bytes are checked by the test before)")
    with netlink.sides(spec, env, path) as group:
        measured = netlink.at_60(group, spec)
    print(f"\n{spec.describe()}: {measured}")


BENCH = netlink.ROOT / "bench" / "remote_link.py"


def test_the_bench_row_over_veth_checks_every_byte(env, tmp_path):
    why = netlink._netlink.missing(netlink.CLEAN)
    if why:
        pytest.skip(why)
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, str(BENCH), "--link", "veth", "--width", "320", "--height", "240",
                             "--rate", "100", "--duration", "1", "--out", str(out)], capture_output=True, text=True,
                            env=env, cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    saved = json.loads((out / "results.json").read_text())
    remote = saved["remote"]
    assert remote["frames"] > 50 and remote["bad"] == 0 and remote["p50_us"] > 0, saved
    assert saved["tcp_cc"] and saved["link"] == f"{netlink.CLEAN.describe()}, TCP {saved['tcp_cc']}", saved
    assert saved["tx_bytes"] >= remote["frames"] * 320 * 240 * 3 // 2, saved
    assert f"| veth, MTU 1500, segmentation offload on, TCP {saved['tcp_cc']} | 320x240 NV12, every |" in \
        (out / "results.md").read_text()


def test_the_bench_says_in_one_line_what_the_link_lacks(env, tmp_path):
    why = netlink._netlink.missing(netlink.LOSSY)
    if why is None:
        pytest.skip("this machine has everything a lossy link needs (the bench measures it there)")
    result = subprocess.run([sys.executable, str(BENCH), "--link", "netem:delay=2ms,loss=0.5%"], capture_output=True,
                            text=True, env=env, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    said = [f"bench/remote_link.py: needs what its link is made of: {why}"]
    assert result.stdout == "" and result.stderr.splitlines() == said, result.stderr
