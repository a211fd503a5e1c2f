"""Remote subscribers over a real link on GPUs: the publisher and the relay in one network
namespace, the remote subscriber in another, a veth pair between them, UCX over TCP (with
cuda_copy) on the veth; 1080p NV12 at 60 frames/s over the clean link and, with netem, over 2 ms
delay and 0.5 % loss each way, every byte checked in order (tests/netlink.py). Each case skips
naming what the machine lacks (the unshare/nsenter/mount programs, namespaces, a sysfs in them,
veth, netem: bench/_netlink.py probes each; neither ip nor tc is needed), even with
EGLCUDA_REQUIRE_GPU=1: none of them is a GPU's."""
from __future__ import annotations

import os
import secrets
import tempfile

import pytest

from .. import netlink, remote_extra


@pytest.fixture
def env(cuda_ordinal):
    remote_extra.skip_without("remote-cu13", "remote-cu12")
    return {**os.environ, "UCX_TLS": "tcp,cuda_copy", "UCX_WARN_UNUSED_ENV_VARS": "n",
            "EGLCUDA_REMOTE_KEY": secrets.token_hex(32), "EGLCUDA_REMOTE_KEY_FILE": ""}


@pytest.fixture
def path():
    with tempfile.TemporaryDirectory(prefix="eglcuda-gpu-link-") as folder:
        os.chmod(folder, 0o700)
        yield os.path.join(folder, "t.topic")


def test_remote_subscribers_in_another_network_namespace_get_every_byte_over_veth(env, path):
    with netlink.sides(netlink.CLEAN, env, path) as group:
        netlink.across_the_link(group, 1920, 1080)


@pytest.mark.parametrize("spec", [netlink.CLEAN, netlink.LOSSY], ids=["veth", "netem-2ms-0.5%"])
def test_1080p_over_the_link_holds_60_frames_a_second_every_byte(env, path, spec):
    with netlink.sides(spec, env, path) as group:
        measured = netlink.at_60(group, spec)
    print(f"\n{spec.describe()}: {measured}")
