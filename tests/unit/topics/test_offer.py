"""What a publisher offers: the transports registry's one rule (a pool is one kind of memory in
one layout, and every transport offered serves it), checked when the Publisher is made, before
any file, socket or device is touched (whether the GPU is integrated: once the device is known).
Every combination the registry can express: each set of named transports (and the default),
each layout, a pool that can and one that cannot give an EGLStream a frame back, a discrete and
an integrated GPU."""
from __future__ import annotations

import ast
import itertools
import os
import re

import pytest

import eglcuda
from eglcuda.frames.formats import Layout
from eglcuda.topics import transports
from eglcuda.topics.transports import registry

NAMES = transports.names()
COMBINATIONS = [None] + [list(c) for n in range(1, len(NAMES) + 1) for c in itertools.combinations(NAMES, n)]
CASES = [(names, layout, max_pool, integrated) for names in COMBINATIONS for layout in Layout
         for max_pool in (1, 8) for integrated in (False, True)]


def _id(case) -> str:
    names, layout, max_pool, integrated = case
    gpu = "integrated" if integrated else "discrete"
    return f"{'+'.join(names) if names else 'default'}-{layout.value}-max_pool{max_pool}-{gpu}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_a_publisher_offers_only_what_its_pool_can_serve(case):
    """Accepted: every transport offered serves the pool (one memory), and each one left out has
    a reason a subscriber is told. Refused: the named set truly cannot share a pool (no memory
    kind serves them all), the error says why for each, and every set it proposes is accepted."""
    names, layout, max_pool, integrated = case

    def _serves(spec: registry.TransportSpec, memory: str) -> bool:
        """Whether ``spec`` can serve a pool of ``memory`` here (from what each transport
        declares, independently of the rule's code)."""
        return (spec.memory == memory and layout in spec.layouts and max_pool > spec.keeps_frames
                and (spec.on_integrated or not integrated))

    specs = [s for s in registry.registered() if (s.offered if names is None else s.name in names)]
    memories = {s.memory for s in specs}
    servable = [m for m in memories if all(_serves(s, m) for s in specs)]
    try:
        offer = registry.offer(names, layout, max_pool, integrated)
    except eglcuda.UsageError as exc:
        message = str(exc)
        if names is None:  # the defaults: refused only when none of them can serve the pool
            assert not any(_serves(s, s.memory) for s in specs), message
            return
        assert not servable, f"{names} can share a pool of {servable}, yet: {message}"
        unfit = [s for s in specs if not _serves(s, s.memory)]
        for spec in unfit or specs:  # each transport in the way is named, with its reason
            assert spec.name in message
        for proposal in re.findall(r"transports=(\[[^\]]*\])", message):
            proposed = ast.literal_eval(proposal)
            assert set(proposed) < set(names)
            assert registry.offer(proposed, layout, max_pool, integrated).names == proposed
        assert "cuIpcGetMemHandle failed" not in message and "CUDA_ERROR" not in message
        return
    offered = list(offer.specs)
    assert offered and {s.memory for s in offered} == {offer.memory}
    assert all(_serves(s, offer.memory) for s in offered)
    if names is not None:
        assert offer.names == [n for n in NAMES if n in names]  # all of them, in auto's order
    else:
        assert offer.names == [s.name for s in specs if _serves(s, offer.memory)]
    for spec in registry.registered():
        if spec in offered:
            assert spec.name not in offer.refusals
            continue
        why = offer.refusal(spec.name)
        said = f"not offered by this publisher (it offers {', '.join(offer.names)})"
        assert why.startswith(said)
        if not _serves(spec, offer.memory):  # it could not have been offered: why
            assert why.startswith(said + ": ") and len(why) > len(said) + 20, why


def test_cuda_ipc_and_cuda_vmm_together_are_refused_saying_why_and_what_to_name():
    with pytest.raises(eglcuda.UsageError) as raised:
        registry.offer(["cuda-ipc", "cuda-vmm"], Layout.PITCH, 8)
    message = str(raised.value)
    assert "one kind of memory" in message and "cuIpcGetMemHandle refuses VMM memory" in message
    assert "transports=['cuda-ipc'] or transports=['cuda-vmm']" in message
    with pytest.raises(eglcuda.UsageError, match=r"cannot present VMM memory.*transports=\['cuda-vmm'\] or "
                                                 r"transports=\['eglstream'\]"):
        registry.offer(["cuda-vmm", "eglstream"], Layout.PITCH, 8)
    with pytest.raises(eglcuda.UsageError, match=r"transports=\['cuda-ipc', 'eglstream'\] or "
                                                 r"transports=\['cuda-vmm'\]"):
        registry.offer(["cuda-ipc", "cuda-vmm", "eglstream"], Layout.PITCH, 8)


def test_transports_given_as_a_generator_are_read_once_and_offered():
    """A generator of names (a filter over a list, say) is read once: the names were checked by
    a first pass over it, which left nothing for the offer, and the publisher offered none."""
    vmm = registry.offer((name for name in ["cuda-vmm"]), Layout.PITCH, 8)
    assert vmm.names == ["cuda-vmm"]
    both = registry.offer(iter(["eglstream", "cuda-ipc"]), Layout.PITCH, 8)
    assert both.names == ["cuda-ipc", "eglstream"]


def test_what_a_subscriber_asking_for_another_transport_is_told():
    vmm = registry.offer(["cuda-vmm"], Layout.PITCH, 8)
    assert vmm.names == ["cuda-vmm"] and vmm.memory == registry.VMM_MEMORY
    assert "an EGLStream producer cannot present VMM memory" in vmm.refusal("eglstream")
    assert "CUDA IPC calls export cuMemAlloc memory only" in vmm.refusal("cuda-ipc")
    default = registry.offer(None, Layout.PITCH, 8)
    assert default.names == ["cuda-ipc", "eglstream"]
    assert "cuda-vmm shares VMM memory only" in default.refusal("cuda-vmm")
    array = registry.offer(None, Layout.ARRAY, 8)  # the defaults that serve CUDA arrays
    assert array.names == ["eglstream"] and "CUDA-array frames" in array.refusal("cuda-ipc")
    one = registry.offer(None, Layout.PITCH, 1)  # an EGLStream would keep the only pool frame
    assert one.names == ["cuda-ipc"] and "max_pool >= 2" in one.refusal("eglstream")
    ipc = registry.offer(["cuda-ipc"], Layout.PITCH, 8)
    assert ipc.refusal("eglstream") == "not offered by this publisher (it offers cuda-ipc)"
    tegra = default.on_integrated_gpu()  # (the device is known only after the rest was checked)
    assert tegra.names == ["eglstream"] and "integrated (Tegra)" in tegra.refusal("cuda-ipc")
    with pytest.raises(eglcuda.UsageError, match=r"'cuda-ipc' cannot be offered: the publisher's GPU is integrated"):
        ipc.on_integrated_gpu()
    assert registry.offer(["cuda-vmm"], Layout.PITCH, 8).on_integrated_gpu().names == ["cuda-vmm"]


@pytest.mark.parametrize("options, why", [
    ({"transports": ["cuda-ipc", "cuda-vmm"]}, "cannot be offered together"),
    ({"transports": ["cuda-vmm", "eglstream"]}, "cannot be offered together"),
    ({"transports": ["cuda-ipc"], "layout": "array"}, "CUDA-array frames"),
    ({"transports": ["cuda-vmm"], "layout": "array"}, "pitch-linear frames only"),
    ({"transports": ["eglstream"], "pool": 1, "max_pool": 1}, r"max_pool >= 2"),
    ({"layout": "array", "pool": 1, "max_pool": 1}, "no registered transport can serve"),
    ({"transports": "cuda-ipc"}, "sequence of transport names"),
    ({"transports": 5}, "sequence of transport names"),
    ({"transports": b"cuda-ipc"}, "sequence of transport names"),
    ({"transports": ["pigeon"]}, "transports are some of"),
    ({"transports": []}, "transports are some of"),
])
def test_the_publisher_refuses_at_construction_before_touching_anything(folder, options, why):
    """On a machine without a GPU too: the rule is the publisher's first word, before its files,
    its socket or the driver (which would say it is missing, or fail later at a handshake)."""
    path = os.path.join(folder, "t.topic")
    with pytest.raises(eglcuda.UsageError, match=why):
        eglcuda.Publisher("t", 64, 32, "NV12", path=path, **options)
    assert os.listdir(folder) == []
