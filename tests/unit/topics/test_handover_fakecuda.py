"""Hand-overs around a topic's frames on the stand-in libcuda (its ``fake_cuda_hold`` keeps a stream
"busy", so the order between streams shows without a GPU): ``publish_from`` of a received frame,
a discarded pool frame, a producer's frame handed to a second stream, a message in a forked child
and a copied message. Each case runs in a fresh interpreter and prints what it saw as JSON."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

PRELUDE = textwrap.dedent("""
    import ctypes, json, os, sys, tempfile
    import numpy as np
    import eglcuda
    from eglcuda._bind import cuda
    CU = ctypes.CDLL("libcuda.so.1")
    CU.fake_cuda_hold.argtypes = [ctypes.c_void_p, ctypes.c_int]
    CU.cuStreamQuery.argtypes = [ctypes.c_void_p]
    NOT_READY = 600
    folder = tempfile.mkdtemp()
    def topic(name):
        return dict(path=os.path.join(folder, name), transports=["cuda-vmm"])
    def at(name):
        return dict(path=os.path.join(folder, name))
    def busy(stream):
        return CU.cuStreamQuery(ctypes.c_void_p(stream)) == NOT_READY
    def hold(stream, held):
        CU.fake_cuda_hold(ctypes.c_void_p(stream), held)
    eglcuda.get_device(0).make_current()
    rng = np.random.default_rng()
    Y = rng.integers(0, 256, (48, 64), np.uint8)
    UV = rng.integers(0, 256, (24, 32, 2), np.uint8)
    out = {}
""")


def run(fake_env: dict, body: str) -> dict:
    code = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    # (fake_env is this process's environment: tests/conftest.py made children import this eglcuda)
    child = subprocess.run([sys.executable, "-c", code], env=fake_env, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


def test_publish_from_a_received_frame_is_published_after_its_copy(fake_env):
    """The copy of a frame received on the user's non-blocking stream S goes on the publish's
    stream (the legacy one when none is named), ordered after S: the publish does not run ahead of
    the copy, and the bytes that arrive are the source's."""
    seen = run(fake_env, """
        S = cuda.stream_create(non_blocking=True)
        source = eglcuda.Publisher("a", 64, 48, "NV12", **topic("a"))
        sub = eglcuda.Subscriber("a", qos="every", cuda_stream=S, **at("a"))
        relay = eglcuda.Publisher("b", 64, 48, "NV12", **topic("b"))
        watcher = eglcuda.Subscriber("b", qos="every", **at("b"))
        source.publish_from([Y, UV])
        with sub.receive(5) as message:
            hold(S, 1)  # the frame's stream has work queued that has not run
            relay.publish_from(message.frame)
            out["legacy_waits"] = busy(0)
            hold(S, 0)
        with watcher.receive(5) as copied:
            y, uv = copied.frame.to_numpy()
            out["bytes_right"] = bool(np.array_equal(y, Y) and np.array_equal(uv, UV))
        for end in (watcher, relay, sub, source):
            end.close()
    """)
    assert seen == {"legacy_waits": True, "bytes_right": True}


def test_a_discarded_frame_keeps_nothing_of_its_cycle(fake_env):
    """A pool frame handed to a stream W (DLPack), then discarded: the discard waits for W on the
    host and forgets it, so W may be destroyed and the frame's next cycle publishes cleanly."""
    seen = run(fake_env, """
        pub = eglcuda.Publisher("a", 64, 48, "NV12", pool=1, **topic("a"))
        W = cuda.stream_create(non_blocking=True)
        frame = pub.next_frame()
        frame.planes[0].__dlpack__(stream=W)
        pub.discard(frame)
        out["remembered"] = frame._handed_to
        cuda.stream_destroy(W)
        again = pub.next_frame()
        out["same_frame"] = again is frame
        again.planes[0].copy_from(Y)
        again.planes[1].copy_from(UV)
        out["seq"] = pub.publish(again)
        pub.close()
    """)
    assert seen == {"remembered": None, "same_frame": True, "seq": 0}


def test_a_producer_frame_handed_to_a_second_stream_waits_for_the_first(fake_env):
    """A producer's frame written on stream X (a copy into it, or a DLPack writer) and then
    exported to stream Y: Y is made to wait for X, as the protocol asks of the exporter."""
    seen = run(fake_env, """
        X = cuda.stream_create(non_blocking=True)
        Y_stream = cuda.stream_create(non_blocking=True)
        for how in ("copy", "dlpack"):
            frame = eglcuda.Frame.allocate(64, 48, "NV12")
            if how == "copy":
                source = cuda.mem_alloc(64 * 48, "test")
                frame.planes[0].copy_from_device(source, 64, cuda_stream=X)
            else:
                frame.planes[0].__dlpack__(stream=X)
            hold(X, 1)
            frame.planes[0].__dlpack__(stream=Y_stream)
            out[how] = busy(Y_stream)
            hold(X, 0)
            frame.close()
    """)
    assert seen == {"copy": True, "dlpack": True}


def test_a_cuda_array_plane_says_it_exports_nothing(fake_env):
    """A CUDA-array plane has no linear memory: ``hasattr(plane, "__cuda_array_interface__")`` is
    False (what CuPy and Numba probe), DLPack raises ``BufferError``, and neither leaves a stream
    remembered."""
    seen = run(fake_env, """
        frame = eglcuda.Frame.allocate(64, 48, "ARGB", layout="array")
        plane = frame.planes[0]
        out["has_cai"] = hasattr(plane, "__cuda_array_interface__")
        try:
            plane.__dlpack__()
            out["dlpack"] = "exported"
        except BufferError:
            out["dlpack"] = "BufferError"
        out["remembered"] = frame._handed_to
        frame.close()
    """)
    assert seen == {"has_cai": False, "dlpack": "BufferError", "remembered": None}


def test_a_message_is_neither_copied_nor_usable_in_a_forked_child(fake_env):
    """copy.copy and pickle of a message raise TypeError (a copy's release would be a second
    one, which gets the subscriber dropped); in a forked child the parent's message exports
    nothing and makes no driver call, and the parent's goes on working."""
    seen = run(fake_env, """
        import copy, pickle
        pub = eglcuda.Publisher("a", 64, 48, "NV12", **topic("a"))
        sub = eglcuda.Subscriber("a", qos="every", **at("a"))
        pub.publish_from([Y, UV])
        message = sub.receive(5)
        for name, attempt in (("copy", copy.copy), ("pickle", pickle.dumps)):
            try:
                attempt(message)
                out[name] = "made"
            except TypeError:
                out[name] = "TypeError"
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                message.frame.planes[0].__dlpack__(stream=2)
                answer = "exported"
            except eglcuda.ClosedError:
                answer = "ClosedError"
            os.write(write, answer.encode())
            os._exit(0)
        os.waitpid(pid, 0)
        out["child"] = os.read(read, 100).decode()
        out["parent_reads"] = bool(np.array_equal(message.frame.to_numpy()[0], Y))
        message.release()
        sub.close()
        pub.close()
    """)
    assert seen == {"copy": "TypeError", "pickle": "TypeError", "child": "ClosedError", "parent_reads": True}


def test_a_pool_that_failed_to_grow_stays_as_it_was(fake_env):
    """The driver refuses to export a pool frame through CUDA IPC as the pool grows (out of
    memory, once): next_frame raises that CUDAError, the pool keeps its size, and the next growth
    works; every frame published after it goes out (no slot left unexported)."""
    seen = run(fake_env, """
        CU.fake_fail.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
        pub = eglcuda.Publisher("a", 64, 48, "NV12", pool=1, max_pool=4, path=os.path.join(folder, "a"),
                                transports=["cuda-ipc"])
        kept = pub.next_frame()  # (held unpublished: the next frame needs the pool to grow)
        CU.fake_fail(b"cuIpcGetMemHandle", 1, 2)
        try:
            pub.next_frame(timeout=0.5)
            out["failed_growth"] = "no error"
        except eglcuda.CUDAError as exc:
            out["failed_growth"] = "CUDAError" if "cuIpcGetMemHandle" in str(exc) else str(exc)
        out["pool_after_failure"] = pub.pool_size
        grown = pub.next_frame(timeout=0.5)
        out["pool_after_growth"] = pub.pool_size
        out["seqs"] = [pub.publish(grown), pub.publish(kept)]
        out["seqs"] += [pub.publish(pub.next_frame(timeout=0.5)) for _ in range(4)]
        pub.close()
    """)
    assert seen == {"failed_growth": "CUDAError", "pool_after_failure": 1, "pool_after_growth": 2,
                    "seqs": [0, 1, 2, 3, 4, 5]}


def test_a_closed_cuda_vmm_publisher_frees_its_pool_though_a_frame_is_still_referred_to(fake_env):
    """A program's variable still holds the last pool frame it published: the publisher's close()
    frees every VMM handle, mapping and descriptor all the same."""
    seen = run(fake_env, """
        CU.fake_cuda_count.argtypes = [ctypes.c_char_p]
        pub = eglcuda.Publisher("a", 64, 48, "NV12", **topic("a"))
        frame = pub.next_frame()
        pub.publish(frame)
        out["open"] = CU.fake_cuda_count(b"vmm_mappings") > 0
        pub.close()
        import gc
        gc.collect()
        out["after_close"] = [CU.fake_cuda_count(b"vmm_handles"), CU.fake_cuda_count(b"vmm_mappings")]
        out["frame_closed"] = frame.closed
    """)
    assert seen == {"open": True, "after_close": [0, 0], "frame_closed": True}


def test_publish_from_refuses_before_taking_a_pool_frame(fake_env):
    """A source of another color format (BGRA bytes into an RGBA topic would arrive as other
    colors) and a bad payload or time stamp are refused at once, also while every pool frame is
    taken (the call would otherwise wait for one first)."""
    seen = run(fake_env, """
        import time
        pub = eglcuda.Publisher("a", 64, 48, "RGBA", pool=1, max_pool=1, **topic("a"))
        source = eglcuda.Frame.allocate(64, 48, "BGRA")
        try:
            pub.publish_from(source)
            out["format"] = "published"
        except eglcuda.UsageError as exc:
            out["format"] = "refused" if "BGRA" in str(exc) else str(exc)
        taken = pub.next_frame()
        same = eglcuda.Frame.allocate(64, 48, "RGBA")
        for name, options in (("payload", dict(payload="text")), ("stamp", dict(timestamp_ns=-5))):
            started = time.monotonic()
            try:
                pub.publish_from(same, timeout=2, **options)
                out[name] = "published"
            except eglcuda.UsageError:
                out[name] = "at once" if time.monotonic() - started < 0.5 else "late"
        pub.discard(taken)
        out["published"] = pub.publish_from(same)
        for frame in (source, same):
            frame.close()
        pub.close()
    """)
    assert seen == {"format": "refused", "payload": "at once", "stamp": "at once", "published": 0}
