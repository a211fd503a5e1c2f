"""The interop conformance checks behind ``python -m eglcuda check``.

Each check moves data (random texels, random frame bytes) through one of eglcuda's paths on this
machine and compares what arrives with what was sent, byte for byte; a check that returns without
comparing data does not exist here. A check whose platform is missing is *not applicable*, with
the reason from :func:`eglcuda.available`; it never counts as passed.

========================  =========================================================================
``gl-context``            a display, a headless GL context, its GL version; a cleared framebuffer
                          and an uploaded texture read back exactly
``eglimage-siblings``     an EGLImage of a texture of random texels; a second texture bound to the
                          image reads the same texels
``fence-sync``            a fence sync is signaled once glFinish returns; a server wait on a fence
``reusable-sync``         a reusable sync: signal, unsignal, client waits with and without timeout,
                          a signal from another thread ending a wait
``cuda-stream``           CUDA -> CUDA EGLStream: FIFO and mailbox, pitch and array, ARGB and NV12,
                          every byte of random frames (mailbox: the newest frame wins)
``cross-process``         a producer in a child interpreter (``python -m eglcuda.conformance
                          _child``), every byte of every frame, frame numbers in order
``eglimage-cuda``         EGLImage -> CUDA: the path the self-test chose, GL -> CUDA and CUDA -> GL,
                          every texel
``cuda-egl-gl-sync``      CUDA -> EGLSync -> GL: a CUDA copy held back behind an EGLSync gate; the
                          sync made after it stays unsignaled, GL work after its server wait does
                          not finish, until the gate opens; then the copied bytes are checked
========================  =========================================================================

The checks run against the eglcuda that Python imports (the installed package, wherever this is
run from) and need nothing outside it but PyOpenGL for the GL checks (``pip install PyOpenGL``).
"""
from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import pathlib
import platform
import site
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from ._bind import cuda
from ._bind.gl import gl
from ._version import __version__
from .availability import CAPABILITIES, NEEDS, available, explain
from .display import Display
from .errors import EglCudaError, PeerError, StreamDisconnected, Timeout
from .frames.formats import ColorFormat, Layout
from .frames.frame import Frame
from .images.image import TEXTURE_FORMATS, Image
from .images.paths import image_path, make_texture, read_texture, write_texture
from .streams.share import receive_stream, serve_stream
from .syncs.paths import ServerWaitPath, SyncPath, gl_server_wait_path, sync_paths
from .syncs.sync import Sync, cuda_wait_sync, sync_after_cuda

__all__ = ["CHECKS", "Check", "Outcome", "format_table", "main", "run_checks"]

PASS, FAIL, NOT_APPLICABLE = "pass", "fail", "n/a"


class CheckFailed(Exception):
    """The data that arrived is not the data that was sent (or a step did not happen)."""


class NotApplicable(Exception):
    """This machine lacks what the check needs (an extension, a package)."""


@dataclasses.dataclass(frozen=True)
class Check:
    """One conformance check: ``run()`` returns what it verified, raises :class:`CheckFailed`
    (or any error) when something is wrong, :class:`NotApplicable` when it cannot run here."""

    name: str
    summary: str
    needs: tuple[str, ...]  # names for eglcuda.available()
    gl: bool  # needs PyOpenGL
    run: Callable[[], str]


@dataclasses.dataclass
class Outcome:
    name: str
    status: str  # PASS, FAIL or NOT_APPLICABLE
    detail: str
    seconds: float


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def _compare(what: str, got: np.ndarray, expected: np.ndarray) -> None:
    _expect(got.shape == expected.shape, f"{what}: shape {got.shape}, expected {expected.shape}")
    wrong = int(np.count_nonzero(got != expected))
    _expect(wrong == 0, f"{what}: {wrong} of {expected.size} bytes differ")


# ---- GL helpers (PyOpenGL, through eglcuda's EGL platform choice) -----------------------------------

_RGBA8 = TEXTURE_FORMATS[0x8058]  # what the checks' textures hold: random RGBA bytes

def _gl() -> Any:
    try:
        return gl()
    except EglCudaError as exc:  # Unsupported: says what is missing and how to get it
        raise NotApplicable(f"needs {NEEDS['gl']}: {_one_line(exc)}") from exc


def _random_texels(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    return rng.integers(0, 256, (height, width, 4), dtype=np.uint8)


def _open_display() -> Display:
    """The display the EGL-only checks use: CUDA device 0's where there is one, else the first
    EGL device's, else Mesa's surfaceless one (:meth:`Display.default`)."""
    return Display.default()


# ---- checks on any EGL (Mesa included) ---------------------------------------------------------------

def check_gl_context() -> str:
    GL = _gl()
    rng = np.random.default_rng()
    width, height = 37, 19
    with _open_display() as display, display.create_context() as context:
        _expect(context.is_current, "the new context is not current on this thread")
        version = GL.glGetString(GL.GL_VERSION)
        renderer = GL.glGetString(GL.GL_RENDERER)
        version_text = version.decode() if isinstance(version, bytes) else str(version or "")
        renderer_text = renderer.decode() if isinstance(renderer, bytes) else str(renderer or "")
        _expect(bool(version_text) and version_text[0].isdigit(), f"GL_VERSION is {version_text!r}")
        # An uploaded texture reads back exactly.
        texels = _random_texels(rng, width, height)
        texture = make_texture(_RGBA8, texels)
        framebuffer = 0
        try:
            _compare("texture read back", read_texture(_RGBA8, texture, width, height), texels)
            # GL draws: clear a framebuffer of that texture to a random color, read the pixels.
            color = rng.integers(0, 256, 4, dtype=np.uint8)
            framebuffer = int(GL.glGenFramebuffers(1))
            GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, framebuffer)
            GL.glFramebufferTexture2D(GL.GL_FRAMEBUFFER, GL.GL_COLOR_ATTACHMENT0, GL.GL_TEXTURE_2D, texture, 0)
            status = GL.glCheckFramebufferStatus(GL.GL_FRAMEBUFFER)
            _expect(status == GL.GL_FRAMEBUFFER_COMPLETE, f"framebuffer incomplete (0x{int(status):04X})")
            GL.glViewport(0, 0, width, height)
            GL.glClearColor(*(float(c) / 255.0 for c in color))
            GL.glClear(GL.GL_COLOR_BUFFER_BIT)
            pixels = np.zeros((height, width, 4), np.uint8)
            GL.glPixelStorei(GL.GL_PACK_ALIGNMENT, 1)
            GL.glReadPixels(0, 0, width, height, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, pixels)
            _compare("cleared framebuffer", pixels, np.broadcast_to(color, pixels.shape))
        finally:
            if framebuffer:
                GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, 0)
                GL.glDeleteFramebuffers(1, [framebuffer])
            GL.glDeleteTextures([texture])
        kind = "surfaceless" if context.surfaceless else "pbuffer"
        return (f"OpenGL {version_text} ({renderer_text}) in a {kind} context on {display.description}, "
                f"EGL {display.version[0]}.{display.version[1]}: an uploaded {width}x{height} texture and a "
                "cleared framebuffer read back exactly")


def check_eglimage_siblings() -> str:

    GL = _gl()
    rng = np.random.default_rng()
    width, height = 61, 23
    with _open_display() as display:
        missing = [e for e in ("EGL_KHR_image_base", "EGL_KHR_gl_texture_2D_image") if not display.supports(e)]
        if missing:
            raise NotApplicable(f"{', '.join(missing)} missing on {display.description}")
        with display.create_context() as context:
            texels = _random_texels(rng, width, height)
            texture = make_texture(_RGBA8, texels)
            sibling = 0
            try:
                with Image(context, texture) as image:
                    _expect((image.width, image.height) == (width, height),
                            f"the image is {image.width}x{image.height}, the texture {width}x{height}")
                    sibling = image.bind_texture()
                    _compare("sibling texture", read_texture(_RGBA8, sibling, width, height), texels)
                    # Whether later writes cross over is the driver's business (Mesa: they do;
                    # NVIDIA 580: the sibling is a copy): reported, not judged.
                    update = _random_texels(rng, width, height)
                    write_texture(_RGBA8, texture, update)
                    GL.glFinish()
                    shared = bool(np.array_equal(read_texture(_RGBA8, sibling, width, height), update))
            finally:
                GL.glDeleteTextures([t for t in (texture, sibling) if t])
        return (f"a second texture bound to an EGLImage of a {width}x{height} RGBA8 texture read every random "
                f"texel on {display.description}; later writes {'reach' if shared else 'do not reach'} it "
                f"({'siblings share storage' if shared else 'the sibling is a copy taken at bind time'})")


def check_fence_sync() -> str:

    GL = _gl()
    rng = np.random.default_rng()
    with _open_display() as display, display.create_context():
        texels = _random_texels(rng, 64, 64)
        texture = make_texture(_RGBA8, texels)  # GL work before the fence
        try:
            fence = Sync.fence(display)
            GL.glFinish()
            _expect(fence.signaled, "the fence is not signaled after glFinish")
            _expect(fence.wait(timeout=0) is True, "a client wait on a signaled fence did not return True")
            fence.close()
            detail = "a fence is signaled once glFinish returns; a zero-timeout client wait says so"
            if display.supports("EGL_KHR_wait_sync"):
                write_texture(_RGBA8, texture, _random_texels(rng, 64, 64))
                fence = Sync.fence(display)
                GL.glFlush()
                _expect(fence.server_wait(timeout=10) is False, "a server wait on a fence blocked this thread")
                _expect(fence.server_wait_path == "egl", f"server wait path {fence.server_wait_path!r}")
                _expect(fence.wait(timeout=10), "the fence did not signal within 10 s")
                fence.close()
                detail += "; a server wait on a fence is queued without blocking"
        finally:
            GL.glDeleteTextures([texture])
        return f"{detail} ({display.description})"


def check_reusable_sync() -> str:

    with _open_display() as display:
        with Sync.reusable(display) as sync:
            _expect(not sync.signaled, "a new reusable sync is signaled")
            _expect(sync.wait(timeout=0) is False, "a zero-timeout wait on an unsignaled sync returned True")
            sync.signal()
            _expect(sync.signaled, "signal() did not signal the sync")
            _expect(sync.wait(timeout=0) is True, "a wait on a signaled sync returned False")
            sync.unsignal()
            _expect(not sync.signaled, "unsignal() did not unsignal the sync")
            started = time.perf_counter()
            _expect(sync.wait(timeout=0.05) is False, "a 50 ms wait on an unsignaled sync returned True")
            waited = time.perf_counter() - started
            _expect(waited >= 0.03, f"a 50 ms wait returned after {waited * 1e3:.1f} ms")
            timer = threading.Timer(0.1, sync.signal)
            started = time.perf_counter()
            timer.start()
            try:
                woke = sync.wait(timeout=5)
            finally:
                timer.join()
            waited = time.perf_counter() - started
            _expect(woke is True, "a signal from another thread did not end the wait")
            _expect(0.05 <= waited < 4, f"the wait ended after {waited * 1e3:.0f} ms, the signal came at 100 ms")
        return (f"signal, unsignal and status; waits of 0 and 50 ms; a signal from another thread after 100 ms "
                f"ended a wait after {waited * 1e3:.0f} ms ({display.description})")


# ---- checks on an NVIDIA GPU ----------------------------------------------------------------------------

def _fill(frame: Any, rng: np.random.Generator) -> list[np.ndarray]:
    data = [rng.integers(0, 256, plane.shape, dtype=np.uint8) for plane in frame.planes]
    for plane, values in zip(frame.planes, data):
        plane.copy_from(values)
    return data


def _compare_frame(what: str, acquired: Any, expected: list[np.ndarray]) -> None:
    planes = acquired.planes
    _expect(len(planes) == len(expected), f"{what}: {len(planes)} planes, expected {len(expected)}")
    for index, (plane, data) in enumerate(zip(planes, expected)):
        _compare(f"{what}, plane {index}", plane.to_numpy(), data)


def check_cuda_stream() -> str:

    rng = np.random.default_rng()
    width, height = 334, 98
    configurations = 0
    frames_checked = 0
    with Display.for_cuda_device(0) as display:
        for fifo in (4, 0):
            for layout in (Layout.PITCH, Layout.ARRAY):
                for fmt in (ColorFormat.ARGB, ColorFormat.NV12):
                    what = f"{'FIFO 4' if fifo else 'mailbox'} {layout.value} {fmt.name}"
                    frames = []
                    with display.create_stream(fifo_length=fifo) as stream:
                        consumer = stream.connect_cuda_consumer()
                        producer = stream.connect_cuda_producer(width, height, format=fmt, layout=layout)
                        frames = [producer.allocate_frame() for _ in range(3)]
                        contents = [_fill(frame, rng) for frame in frames]
                        if fifo:
                            for frame in frames:  # three frames fit a FIFO of four: no wait
                                producer.present(frame)
                            for index in range(3):
                                with consumer.acquire(timeout_us=2_000_000) as acquired:
                                    _expect(acquired.is_new is True, f"{what}: frame {index + 1} is not new")
                                    _compare_frame(f"{what}, frame {index + 1}", acquired, contents[index])
                                frames_checked += 1
                        else:
                            producer.present(frames[0])
                            with consumer.acquire(timeout_us=2_000_000) as acquired:
                                _compare_frame(f"{what}, frame 1", acquired, contents[0])
                            producer.present(frames[1])
                            producer.present(frames[2])  # replaces frame 2 in the mailbox
                            with consumer.acquire(timeout_us=2_000_000) as acquired:
                                _expect(acquired.is_new is True, f"{what}: the newest frame is not new")
                                _compare_frame(f"{what}, the newest of two presents", acquired, contents[2])
                            frames_checked += 2
                    for frame in frames:  # the producer disconnected with the stream
                        frame.close()
                    configurations += 1
        return (f"{frames_checked} frames of {width}x{height} in {configurations} configurations (FIFO 4 and "
                f"mailbox, pitch and array, ARGB and NV12): every byte arrived, FIFO in order, mailbox the newest "
                f"({display.description})")


CHILD_FRAMES = 6


def _frame_content(shapes: Sequence[tuple[int, ...]], seed: int, number: int) -> list[np.ndarray]:
    """The random planes of frame ``number`` (frames count from 1, as the stream does)."""
    rng = np.random.default_rng([seed, number])
    return [rng.integers(0, 256, shape, dtype=np.uint8) for shape in shapes]


def _child_environment() -> dict[str, str]:
    """The child imports the same eglcuda as this process. It runs in a scratch folder, so no
    source checkout in the working folder shadows the package; a package found outside the
    interpreter's own site folders (a checkout on PYTHONPATH) goes first on its path."""
    environment = dict(os.environ, PYTHONUNBUFFERED="1")
    package_root = str(pathlib.Path(__file__).resolve().parent.parent)
    if package_root not in {*site.getsitepackages(), site.getusersitepackages()}:
        paths = [package_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        environment["PYTHONPATH"] = os.pathsep.join(paths)
    return environment


def _child_report(child: "subprocess.Popen[str]", out: str, err: str) -> str:
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if "error" in message:
                return f"the producer process failed: {message['error']}"
    last = [line for line in err.splitlines() if line.strip()]
    return f"the producer process exited with {child.returncode}" + (f": {last[-1].strip()}" if last else "")


def check_cross_process() -> str:

    width, height = 334, 98
    seed = int(np.random.default_rng().integers(1, 2**31))
    with tempfile.TemporaryDirectory(prefix="eglcuda-check-") as folder:
        socket_path = os.path.join(folder, "stream.sock")
        with Display.for_cuda_device(0) as display:
            stream = display.create_stream(fifo_length=4, cross_process=True)
            consumer = stream.connect_cuda_consumer()
            command = [sys.executable, "-m", "eglcuda.conformance", "_child", "--socket", socket_path,
                       "--width", str(width), "--height", str(height), "--frames", str(CHILD_FRAMES),
                       "--seed", str(seed)]
            child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=folder, env=_child_environment())
            failure: BaseException | None = None
            numbers: list[int] = []
            try:
                serve_stream(stream, socket_path, timeout=30)
                for expected_number in range(1, CHILD_FRAMES + 1):
                    with consumer.acquire(timeout_us=10_000_000) as acquired:
                        _expect(acquired.is_new is True, f"frame {expected_number} is not new")
                        _expect(acquired.number == expected_number,
                                f"frame number {acquired.number}, expected {expected_number}")
                        numbers.append(expected_number)
                        shapes = [plane.shape for plane in acquired.planes]
                        _compare_frame(f"frame {expected_number}", acquired,
                                       _frame_content(shapes, seed, expected_number))
            except BaseException as exc:
                failure = exc
            finally:
                if failure is not None:
                    stream.close()  # a producer waiting in present() sees the consumer go, and ends
                try:
                    assert child.stdin is not None
                    child.stdin.write("done\n")
                    child.stdin.flush()
                except OSError:
                    pass  # the child is gone already: its report says why
                try:
                    out, err = child.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    child.kill()
                    out, err = child.communicate()
                stream.close()
        # Which side to name first: a timeout or a lost peer here follows from a failed producer;
        # anything else went wrong here first (the producer then only saw the consumer leave).
        if failure is not None and not isinstance(failure, (Timeout, PeerError, StreamDisconnected)):
            if isinstance(failure, CheckFailed):
                raise failure
            raise CheckFailed(_one_line(failure)) from failure
        if child.returncode != 0:
            raise CheckFailed(_child_report(child, out, err)
                              + (f" (this side: {_one_line(failure)})" if failure is not None else ""))
        if failure is not None:
            raise CheckFailed(_one_line(failure)) from failure
        return (f"{CHILD_FRAMES} frames of {width}x{height} ARGB from a producer in another interpreter, FIFO 4: "
                f"every byte arrived, numbered {numbers[0]}..{numbers[-1]} in order ({display.description})")


def _child_main(argv: Sequence[str]) -> int:
    """The producer process of :func:`check_cross_process`; reports one JSON line on failure."""
    parser = argparse.ArgumentParser(prog="python -m eglcuda.conformance _child")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--height", type=int, required=True)
    parser.add_argument("--frames", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    args = parser.parse_args(argv)
    try:

        with Display.for_cuda_device(0) as display:
            stream = receive_stream(display, args.socket, timeout=30)
            producer = stream.connect_cuda_producer(args.width, args.height)
            frames = [producer.allocate_frame() for _ in range(args.frames)]
            for number, frame in enumerate(frames, start=1):
                shapes = [plane.shape for plane in frame.planes]
                for plane, data in zip(frame.planes, _frame_content(shapes, args.seed, number)):
                    plane.copy_from(data)
                producer.present(frame)  # waits while the FIFO is full: the consumer acquires meanwhile
            print(json.dumps({"event": "presented", "frames": args.frames}), flush=True)
            sys.stdin.readline()  # the consumer has checked every frame: the stream may go
            stream.close()
            for frame in frames:
                frame.close()
        return 0
    except BaseException as exc:  # reported to the parent in one line, never as a traceback
        print(json.dumps({"error": _one_line(exc)}), flush=True)
        return 1


def check_eglimage_cuda() -> str:

    GL = _gl()
    rng = np.random.default_rng()
    width, height = 61, 17
    with Display.for_cuda_device(0) as display, display.create_context() as context:
        choice = image_path(display)
        _expect(choice.path is not None, f"no coherent EGLImage -> CUDA path: {choice.reason}")
        texels = _random_texels(rng, width, height)
        texture = make_texture(_RGBA8, texels)
        try:
            with Image(context, texture) as image, image.register_cuda() as registration:
                path = registration.path
                _expect(path == choice.path, f"registered through {path}, the self-test chose {choice.path}")
                with registration.map() as mapped:  # GL's work is finished first
                    _compare("GL texels read through CUDA", mapped.to_numpy(), texels)
                    written = _random_texels(rng, width, height)
                    mapped.copy_from(written)
                GL.glFinish()  # the unmap ordered CUDA's writes before GL's next command
                _compare("CUDA's writes read in GL", read_texture(_RGBA8, texture, width, height), written)
        finally:
            GL.glDeleteTextures([texture])
        return (f"path {path} ({choice.reason}): GL's random texels read through CUDA and CUDA's random bytes "
                f"read in GL, {width}x{height} RGBA8, every texel ({display.description})")


def _gate(blocker: Any, stream: int) -> Any:
    """Hold ``stream`` until ``blocker`` (a reusable sync) is signaled: an EGLSync -> CUDA wait,
    through the emulation where the native path refuses reusable syncs."""

    try:
        return cuda_wait_sync(blocker, cuda_stream=stream, timeout=30)
    except EglCudaError:
        if sync_paths(blocker.display).egl_to_cuda != SyncPath.EMULATED:
            raise
        return cuda_wait_sync(blocker, cuda_stream=stream, path=SyncPath.EMULATED, timeout=30)


def check_cuda_egl_gl_sync() -> str:

    GL = _gl()
    rng = np.random.default_rng()
    width, height = 512, 64
    with Display.for_cuda_device(0) as display, display.create_context():
        if not display.supports("EGL_KHR_wait_sync"):
            raise NotApplicable(f"EGL_KHR_wait_sync missing on {display.description}")
        wait_path, wait_why = gl_server_wait_path(display)
        device = display.cuda_device()
        source = Frame.allocate(width, height, ColorFormat.Y, device=device)
        target = Frame.allocate(width, height, ColorFormat.Y, device=device, memory="pinned")
        data = rng.integers(1, 256, (height, width), dtype=np.uint8)  # no zeros: the target starts zeroed
        source.planes[0].copy_from(data)
        view = target.host_array()
        view[...] = 0
        device.make_current()
        stream = cuda.stream_create()
        blocker = Sync.reusable(display)
        gate = done = None
        try:
            # Nothing below may wait for CUDA until the gate opens: the stream is held behind it.
            gate = _gate(blocker, stream)
            source.planes[0].copy_to_device(target.planes[0].pointer, target.pitch, cuda_stream=stream)
            done = sync_after_cuda(display, cuda_stream=stream)
            time.sleep(0.1)
            _expect(not np.any(view), "the CUDA copy ran before the EGLSync it waits on was signaled")
            _expect(not done.signaled, "the CUDA sync was signaled before its stream reached it")
            if wait_path == ServerWaitPath.CLIENT_WAIT:
                # This thread waits inside server_wait: the gate opens from another thread.
                opener = threading.Timer(0.2, blocker.signal)
                opener.start()
                try:
                    _expect(done.server_wait(timeout=10) is True, "the client-wait path did not wait")
                finally:
                    opener.join()
                ordering = f"GL server wait path {wait_path} ({wait_why}): this thread waited for CUDA"
            else:
                _expect(done.server_wait(timeout=10) is False,
                        f"the server wait ({done.server_wait_path}) blocked this thread")
                fence = GL.glFenceSync(GL.GL_SYNC_GPU_COMMANDS_COMPLETE, 0)
                GL.glFlush()
                try:
                    time.sleep(0.1)
                    status = GL.glClientWaitSync(fence, 0, 0)
                    _expect(status == GL.GL_TIMEOUT_EXPIRED, "GL work queued after the server wait finished "
                                                             "before the CUDA stream reached the sync")
                    blocker.signal()
                    status = GL.glClientWaitSync(fence, GL.GL_SYNC_FLUSH_COMMANDS_BIT, 10_000_000_000)
                    _expect(status in (GL.GL_ALREADY_SIGNALED, GL.GL_CONDITION_SATISFIED),
                            "GL did not finish within 10 s after the CUDA stream passed the sync")
                finally:
                    GL.glDeleteSync(fence)
                ordering = (f"GL server wait path {done.server_wait_path} ({wait_why}): GL work after it did not "
                            "finish while the CUDA stream was held, and finished after")
            _expect(done.wait(timeout=10) is True, "the CUDA sync did not signal within 10 s of the gate opening")
            _expect(gate.join(10), "the EGLSync -> CUDA wait did not end")
            _compare("bytes the CUDA copy wrote before the sync signaled", np.array(view), data)
        finally:
            if not blocker.closed and not blocker.signaled:
                blocker.signal()  # never leave the stream held
            if gate is not None:
                gate.join(10)
            if done is not None:
                done.close()
            blocker.close()
            device.make_current()
            cuda.stream_destroy(stream)
            del view
            source.close()
            target.close()
        return (f"EGLSync -> CUDA (gate) and CUDA -> EGLSync ({done.path}): the sync stayed unsignaled while the "
                f"stream was held; {ordering}; {width}x{height} copied bytes checked ({display.description})")


CHECKS: list[Check] = [
    Check("gl-context", "display, headless GL context, GL version; texture and framebuffer read back",
          ("egl", "gl"), True, check_gl_context),
    Check("eglimage-siblings", "EGLImage of a texture; a sibling texture reads the same random texels",
          ("egl", "gl"), True, check_eglimage_siblings),
    Check("fence-sync", "fence sync signaled after glFinish; server wait on a fence", ("sync", "gl"), True,
          check_fence_sync),
    Check("reusable-sync", "reusable sync: signal, unsignal, waits, a signal from another thread", ("sync",), False,
          check_reusable_sync),
    Check("cuda-stream", "CUDA -> CUDA EGLStream, FIFO and mailbox, pitch and array, ARGB and NV12, every byte",
          ("cuda-stream",), False, check_cuda_stream),
    Check("cross-process", "EGLStream with the producer in another interpreter, every byte",
          ("cross-process",), False, check_cross_process),
    Check("eglimage-cuda", "EGLImage -> CUDA on the self-tested path, both directions, every texel",
          ("eglimage-cuda",), True, check_eglimage_cuda),
    Check("cuda-egl-gl-sync", "CUDA -> EGLSync -> GL server wait ordering, held-back stream, copied bytes",
          ("cuda-sync", "gl"), True, check_cuda_egl_gl_sync),
]


def _run_one(check: Check) -> Outcome:
    started = time.perf_counter()
    missing = explain(*check.needs)
    if missing:
        return Outcome(check.name, NOT_APPLICABLE, missing, 0.0)
    try:
        if check.gl:
            _gl()
        detail = check.run()
        status = PASS
    except NotApplicable as exc:
        detail, status = str(exc), NOT_APPLICABLE
    except CheckFailed as exc:
        detail, status = str(exc), FAIL
    except Exception as exc:  # a driver error, a bug: one line, never a traceback
        detail, status = _one_line(exc), FAIL
    return Outcome(check.name, status, detail, time.perf_counter() - started)


def run_checks(names: Sequence[str] | None = None, require: Sequence[str] = (),
               progress: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run the checks (all, or those named) and return their outcomes. A capability in
    ``require`` that this machine lacks is reported as a failed check ``require:NAME``."""
    outcomes = []
    for name in require:
        missing = explain(name)
        if missing:
            outcome = Outcome(f"require:{name}", FAIL, f"--require {name}: {missing}", 0.0)
            outcomes.append(outcome)
            if progress:
                progress(outcome)
    for check in CHECKS:
        if names and check.name not in names:
            continue
        outcome = _run_one(check)
        outcomes.append(outcome)
        if progress:
            progress(outcome)
    return outcomes


def counts(outcomes: Sequence[Outcome]) -> dict[str, int]:
    return {status: sum(1 for o in outcomes if o.status == status) for status in (PASS, FAIL, NOT_APPLICABLE)}


def format_row(outcome: Outcome, width: int = 18) -> str:
    seconds = f" ({outcome.seconds:.2f} s)" if outcome.status != NOT_APPLICABLE else ""
    label = {PASS: "pass", FAIL: "FAIL", NOT_APPLICABLE: "n/a"}[outcome.status]
    return f"  {outcome.name:<{width}} {label:<6} {outcome.detail}{seconds}"


def format_table(outcomes: Sequence[Outcome]) -> str:
    width = max([18, *(len(o.name) for o in outcomes)])
    return "\n".join(format_row(o, width) for o in outcomes)


def summary_line(outcomes: Sequence[Outcome]) -> str:
    c = counts(outcomes)
    return f"{c[PASS]} passed, {c[FAIL]} failed, {c[NOT_APPLICABLE]} not applicable"


def report(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """The results as plain data (what the JSON file holds)."""
    c = counts(outcomes)
    return {
        "eglcuda": __version__,
        "package": str(pathlib.Path(__file__).resolve().parent),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "capabilities": {name: dict(zip(("available", "reason"), available(name, reason=True)))
                         for name in CAPABILITIES},
        "checks": [dataclasses.asdict(o) for o in outcomes],
        "passed": c[PASS],
        "failed": c[FAIL],
        "not_applicable": c[NOT_APPLICABLE],
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``python -m eglcuda check``."""
    parser.add_argument("--json", default="eglcuda-check.json", metavar="PATH",
                        help="where to write the results (default: %(default)s; '-' for none)")
    parser.add_argument("--only", default=None, metavar="NAMES",
                        help="comma-separated checks to run (default: all): " + ", ".join(c.name for c in CHECKS))
    parser.add_argument("--require", default="", metavar="NAMES",
                        help="comma-separated capabilities this machine must have (a missing one fails), e.g. "
                             "egl,sync on CI or cuda-stream,cross-process on a GPU machine: "
                             + ", ".join(CAPABILITIES))


def run_command(args: argparse.Namespace) -> int:
    """``python -m eglcuda check``: print the table, write the JSON, exit 1 on a failure."""
    names = [n.strip() for n in (args.only or "").split(",") if n.strip()]
    if args.only is not None and not names:  # (`--only ''`: naming no check is not "all of them")
        print("python -m eglcuda check: --only names no check", file=sys.stderr)
        return 2
    unknown = [n for n in names if n not in {c.name for c in CHECKS}]
    require = [n.strip() for n in args.require.split(",") if n.strip()]
    unknown += [n for n in require if n not in CAPABILITIES]
    if unknown:
        print(f"python -m eglcuda check: unknown name(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    unwritable = None if args.json == "-" else "is an empty path: name a file, or '-' for none" if not args.json \
        else _unwritable(pathlib.Path(args.json))
    if unwritable is not None:
        print(f"python -m eglcuda check: --json {args.json}: {unwritable}", file=sys.stderr)
        return 2
    print(f"eglcuda {__version__} conformance checks, package at {pathlib.Path(__file__).resolve().parent}")
    print(f"  {'check':<18} {'result':<6} what was verified, what failed, or why it does not apply")
    outcomes = run_checks(names, require, progress=lambda o: print(format_row(o), flush=True))
    if args.json != "-":
        path = pathlib.Path(args.json)
        try:
            path.write_text(json.dumps(report(outcomes), indent=2) + "\n")
        except OSError as exc:  # (it changed while the checks ran)
            print(summary_line(outcomes))
            print(f"python -m eglcuda check: --json {args.json}: {exc.strerror}", file=sys.stderr)
            return 2
        print(f"results written to {path}")
    print(summary_line(outcomes))
    return 1 if counts(outcomes)[FAIL] else 0


def _unwritable(path: pathlib.Path) -> str | None:
    """Why the results could not be written to ``path`` (None: they can), known before the
    checks run: a missing folder, a folder as the path, a folder or file that cannot be written
    (tried by opening the file for appending; a file the probe created is removed again)."""
    if path.is_dir():
        return f"is a folder: name a file in it (e.g. --json {path / 'eglcuda-check.json'}), or '-' for none"
    if not path.parent.is_dir():
        return f"no such folder {path.parent}"
    existed = path.exists()
    try:
        # (O_NONBLOCK: a FIFO nobody reads is refused at once rather than waited on)
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666))
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return "is a pipe that nobody reads: start its reader first, or pass --json PATH elsewhere"
        return f"cannot be written ({exc.strerror}): pass --json PATH elsewhere, or '-' for none"
    if not existed:
        path.unlink(missing_ok=True)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m eglcuda.conformance``: the checks (as ``python -m eglcuda check``), or the
    child process of the cross-process check (``_child``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_child"]:
        return _child_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m eglcuda check", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
