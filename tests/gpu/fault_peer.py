"""The processes of tests/gpu/test_mps_faults.py, each started as a fresh interpreter (never forked,
so that each is a CUDA client of its own: of the MPS daemon its environment names, or none).

    python tests/gpu/fault_peer.py consumer --socket PATH [--seed N] [--fifo N]
    python tests/gpu/fault_peer.py producer --socket PATH [--seed N] [--frames N] [--pace-ms MS]
    python tests/gpu/fault_peer.py faulter [--target null|freed]
    python tests/gpu/fault_peer.py client

consumer: serves a cross-process stream on PATH and checks every frame's bytes (the content is a
function of seed and frame number, tests/gpu/stream_peer.py's ``frame_content``), until the stream
disconnects or an error. producer: receives the stream and presents frames until a line on stdin
(or --frames of them, then waits for that line). faulter: prepares a kernel that writes through a
bad pointer (address 0x10, or a freed allocation), says "ready", launches it when a line arrives on
stdin, and reports the CUDA error codes it got. client: starts CUDA, allocates a frame and round-trips
data through it (can a new client start?).

Progress goes to stdout, one JSON object per line, flushed, each stamped with ``t`` (time.monotonic(),
the machine's CLOCK_MONOTONIC, so the test can time events across processes): "start" (pid, under
MPS or not), then "progress" every 0.2 s, then one "outcome": ``how`` is "stopped" (the test asked),
"disconnected" (eglcuda.StreamDisconnected: the other side closed or died) or "error" (any other
exception, with its class, whether it is an eglcuda error, and its code, name and call). The faulter
says "ready" and then "faulted" instead of progress. Exit status: 0 for stopped or
disconnected, 3 for an eglcuda error, 1 for any other exception (a crash, as far as the test is
concerned), 4 when the faulter's kernel did not fault, 5 when cuda-python is missing. SIGUSR1 dumps
every thread's stack to stderr (the test asks for it before it kills a process that hangs); SIGALRM
ends any of them after --lifetime seconds (900), should the test process itself be gone.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

# Safe paths (PYTHONSAFEPATH, set by tests/conftest.py in some layouts) leave this script's folder
# off sys.path: stream_peer.py beside it holds the frame content both sides agree on.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import eglcuda  # noqa: E402
from eglcuda import ColorFormat, mps  # noqa: E402
from stream_peer import frame_content  # noqa: E402

PROGRESS_EVERY_S = 0.2
EXIT_CODES = {"stopped": 0, "disconnected": 0, "error": 3}


def say(**message: Any) -> None:
    """One JSON line; ``t`` is time.monotonic() (CLOCK_MONOTONIC: the test's clock too, on Linux)."""
    print(json.dumps({**message, "t": time.monotonic()}, default=str), flush=True)


def describe(exc: BaseException) -> dict[str, Any]:
    """What a test records about an exception: its class (and eglcuda's classes above it), and the
    driver's code, name and call where the exception carries them."""
    code = getattr(exc, "code", None)
    found = {
        "type": type(exc).__name__,
        "eglcuda": isinstance(exc, eglcuda.EglCudaError),
        "classes": [c.__name__ for c in type(exc).__mro__ if issubclass(c, eglcuda.EglCudaError)],
        "code": int(code) if isinstance(code, int) else code,
        "name": getattr(exc, "name", None),
        "call": getattr(exc, "call", None),
        "message": str(exc)[:600],
    }
    if exc.__context__ is not None:  # raised while handling another (a release after a failed copy)
        found["during"] = f"{type(exc.__context__).__name__}: {str(exc.__context__)[:300]}"
    return found


def outcome_of(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, eglcuda.StreamDisconnected):
        return {"how": "disconnected", "error": describe(exc)}
    return {"how": "error", "error": describe(exc)}


def exit_code(outcome: dict[str, Any]) -> int:
    if outcome["how"] == "error" and not outcome["error"]["eglcuda"]:
        return 1
    return EXIT_CODES[outcome["how"]]


def start(role: str) -> float:
    """Report this process's pid and whether its CUDA runs under MPS (this starts CUDA here)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    active, reason = mps.under_mps(0)
    say(event="start", role=role, pid=os.getpid(), under_mps=active, mps_reason=reason)
    return time.monotonic()


class StdinLine:
    """Set when a line (or EOF: the test process is gone) arrives on stdin; ``text`` is the line."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.text = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        self.text = sys.stdin.readline()
        self.arrived.set()


def close_quietly(*closables: Any) -> None:
    """Close what is left after an outcome; a failure here is reported, not raised."""
    for item in closables:
        if item is None:
            continue
        try:
            item.close()
        except BaseException as exc:  # noqa: BLE001 - reported: it is part of what the test measures
            say(event="cleanup", error=describe(exc))


# ---- consumer --------------------------------------------------------------------------------------

def check_frame(frame: Any, seed: int, counts: dict[str, int]) -> None:
    """Compare every byte of an acquired frame with what its producer wrote; count it."""
    number = frame.number
    if counts["last"] and number != counts["last"] + 1:
        counts["gaps"] += 1  # a FIFO stream hands over every frame, in order
    counts["last"] = number
    expected = frame_content(frame, seed, number)
    for index, (got, want) in enumerate(zip(frame.to_numpy(), expected)):
        differ = int(np.count_nonzero(got != want))
        if differ:
            counts["bad"] += 1
            if counts["bad"] <= 5:
                say(event="bad", number=number, plane=index, differ=differ, size=int(got.size))
            break
    counts["checked"] += 1


def consume(args: argparse.Namespace) -> int:
    started = start("consumer")
    counts = {"checked": 0, "bad": 0, "gaps": 0, "repeats": 0, "last": 0}
    display = stream = None
    last_report = 0.0
    outcome: dict[str, Any] = {"how": "disconnected"}
    try:
        display = eglcuda.Display.for_cuda_device(0)
        stream = display.create_stream(fifo_length=args.fifo, cross_process=True)
        consumer = stream.connect_cuda_consumer()
        say(event="serving", pid=os.getpid())
        eglcuda.serve_stream(stream, args.socket, timeout=30)
        while True:
            try:
                with consumer.acquire(timeout_us=500_000) as frame:
                    if frame.is_new:
                        check_frame(frame, args.seed, counts)
                    else:
                        counts["repeats"] += 1
            except eglcuda.Timeout:
                pass
            now = time.monotonic()
            if now - last_report >= PROGRESS_EVERY_S:
                say(event="progress", **counts, seconds=round(now - started, 3))
                last_report = now
    except BaseException as exc:  # noqa: BLE001 - every way out is reported
        outcome = outcome_of(exc)
    say(event="outcome", role="consumer", **outcome, **counts)
    close_quietly(stream, display)
    return exit_code(outcome)


# ---- producer --------------------------------------------------------------------------------------

def produce(args: argparse.Namespace) -> int:
    started = start("producer")
    stop = StdinLine().arrived
    presented = 0
    display = stream = None
    last_report = 0.0
    outcome: dict[str, Any] = {"how": "stopped"}
    try:
        display = eglcuda.Display.for_cuda_device(0)
        stream = eglcuda.receive_stream(display, args.socket, timeout=30)
        producer = stream.connect_cuda_producer(args.width, args.height, format=ColorFormat.ARGB)
        free = [producer.allocate_frame() for _ in range(stream.fifo_length + 2)]
        say(event="connected", fifo_length=stream.fifo_length)
        while not stop.is_set():
            if args.frames and presented >= args.frames:
                stop.wait(0.05)
            else:
                while not free and not stop.is_set():
                    back = producer.return_frame(timeout_us=500_000)
                    if back is not None:
                        free.append(back)
                if free:
                    frame = free.pop()
                    number = producer.frames_presented + 1
                    for plane, data in zip(frame.planes, frame_content(frame, args.seed, number)):
                        plane.copy_from(data)
                    producer.present(frame)
                    presented += 1
                    if args.pace_ms:
                        time.sleep(args.pace_ms / 1e3)
            now = time.monotonic()
            if now - last_report >= PROGRESS_EVERY_S:
                say(event="progress", presented=presented, seconds=round(now - started, 3))
                last_report = now
    except BaseException as exc:  # noqa: BLE001 - every way out is reported
        outcome = outcome_of(exc)
    say(event="outcome", role="producer", **outcome, presented=presented)
    close_quietly(stream, display)
    return exit_code(outcome)


# ---- faulter ---------------------------------------------------------------------------------------

KERNEL = 'extern "C" __global__ void fault() {{ *(volatile unsigned int *)({address:#x}ULL) = 1u; }}\n'
# Hand-written PTX, for when NVRTC is missing or its output does not load (an NVRTC newer than the
# driver writes a PTX version the driver's JIT does not know): the lowest PTX ISA version each
# target needs (PTX ISA, "Release notes"); an unknown GPU gets sm_75 PTX, which the driver JITs up.
PTX_VERSIONS = {(7, 0): "6.0", (7, 2): "6.1", (7, 5): "6.3", (8, 0): "7.0", (8, 6): "7.1", (8, 7): "7.4",
                (8, 9): "7.8", (9, 0): "7.8"}
PTX = """.version {version}
.target sm_{major}{minor}
.address_size 64

.visible .entry fault()
{{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    mov.u64 %rd1, {address};
    mov.u32 %r1, 1;
    st.volatile.u32 [%rd1], %r1;
    ret;
}}
"""


class Unavailable(Exception):
    """cuda-python is not installed in this interpreter."""


class DriverCallFailed(Exception):
    def __init__(self, call: str, code: int, name: str) -> None:
        self.call, self.code, self.name = call, code, name
        super().__init__(f"{call} failed with {name} ({code})")


def cuda_python() -> tuple[Any, Any]:
    """cuda-python's driver and NVRTC modules (cuda.bindings since 12.6, ``cuda.cuda`` before)."""
    try:
        from cuda.bindings import driver, nvrtc
    except ImportError:
        try:
            from cuda import cuda as driver, nvrtc  # type: ignore[no-redef]
        except ImportError as exc:
            raise Unavailable(f"cuda-python is not installed ({exc}); pip install 'cuda-python>=12' "
                              "(the `cuda` extra)") from None
    return driver, nvrtc


def as_int(result: Any) -> int:
    return int(getattr(result, "value", result))


class Driver:
    """The few CUDA driver calls the faulter makes, through cuda-python, returning plain values."""

    def __init__(self, driver: Any) -> None:
        self.cu = driver

    def name(self, code: int) -> str:
        try:
            err, text = self.cu.cuGetErrorName(self.cu.CUresult(code))
            if as_int(err) == 0 and text:
                return text.decode() if isinstance(text, bytes) else str(text)
        except Exception:  # noqa: BLE001 - a name is a nicety
            pass
        return f"CUresult {code}"

    def status(self, result: Any) -> dict[str, Any]:
        """The code and name of a call's CUresult (its first return value)."""
        code = as_int(result[0] if isinstance(result, tuple) else result)
        return {"code": code, "name": self.name(code)}

    def call(self, name: str, *args: Any) -> Any:
        result = getattr(self.cu, name)(*args)
        code = as_int(result[0])
        if code:
            raise DriverCallFailed(name, code, self.name(code))
        values = result[1:]
        return values[0] if len(values) == 1 else values


def nvrtc_image(nvrtc: Any, source: str, major: int, minor: int, cubin: bool) -> bytes:
    """The kernel compiled by NVRTC: a CUBIN for this GPU (no JIT: works with an NVRTC newer than
    the driver) or PTX for its virtual architecture."""

    def check(result: Any, call: str) -> Any:
        code = as_int(result[0])
        if code:
            raise RuntimeError(f"{call} failed with nvrtcResult {code}")
        return result[1] if len(result) > 1 else None

    program = check(nvrtc.nvrtcCreateProgram(source.encode(), b"fault.cu", 0, [], []), "nvrtcCreateProgram")
    try:
        arch = f"--gpu-architecture={'sm' if cubin else 'compute'}_{major}{minor}".encode()
        compiled = nvrtc.nvrtcCompileProgram(program, 1, [arch])
        if as_int(compiled[0]):
            size = check(nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(program, log)
            text = log.rstrip(b" \0").decode(errors="replace")
            raise RuntimeError(f"NVRTC ({arch.decode()}): {text}")
        kind = "CUBIN" if cubin else "PTX"
        size = check(getattr(nvrtc, f"nvrtcGet{kind}Size")(program), f"nvrtcGet{kind}Size")
        image = b" " * size
        check(getattr(nvrtc, f"nvrtcGet{kind}")(program, image), f"nvrtcGet{kind}")
        return image
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def load_kernel(cu: Driver, nvrtc: Any, address: int, major: int, minor: int) -> tuple[Any, Any, str, list[str]]:
    """Load the faulting kernel: NVRTC's CUBIN, else NVRTC's PTX, else hand-written PTX. Returns the
    module, the function, how it was made, and why the earlier ways failed."""
    tried: list[str] = []
    attempts = [("nvrtc-cubin", lambda: nvrtc_image(nvrtc, KERNEL.format(address=address), major, minor, True)),
                ("nvrtc-ptx", lambda: nvrtc_image(nvrtc, KERNEL.format(address=address), major, minor, False))]
    version = PTX_VERSIONS.get((major, minor))
    target = (major, minor) if version else (7, 5)
    handwritten = PTX.format(version=version or "6.3", major=target[0], minor=target[1], address=address)
    attempts.append((f"ptx-sm_{target[0]}{target[1]}", lambda: handwritten.encode()))
    for how, make in attempts:
        try:
            image = make()
            if not image.endswith(b"\0"):
                image += b"\0"  # PTX is loaded as a NUL-terminated string
            buffer = np.frombuffer(image, dtype=np.uint8).copy()
            module = cu.call("cuModuleLoadData", buffer.ctypes.data)
            return module, cu.call("cuModuleGetFunction", module, b"fault"), how, tried
        except Exception as exc:  # noqa: BLE001 - the next way is tried; all of them are reported
            tried.append(f"{how}: {type(exc).__name__}: {exc}")
    raise RuntimeError("the faulting kernel could not be loaded: " + "; ".join(tried))


def fault(args: argparse.Namespace) -> int:
    start("faulter")
    go = StdinLine()
    try:
        driver, nvrtc = cuda_python()
    except Unavailable as exc:
        say(event="unavailable", reason=str(exc))
        return 5
    cu = Driver(driver)
    try:
        cu.call("cuInit", 0)
        device = cu.call("cuDeviceGet", 0)
        context = cu.call("cuDevicePrimaryCtxRetain", device)
        cu.call("cuCtxSetCurrent", context)
        attribute = driver.CUdevice_attribute
        major = cu.call("cuDeviceGetAttribute", attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)
        minor = cu.call("cuDeviceGetAttribute", attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)
        if args.target == "freed":
            pointer = cu.call("cuMemAlloc", 2 << 20)
            cu.call("cuMemFree", pointer)
            address = as_int(pointer)
        else:
            address = 0x10
        module, function, how, tried = load_kernel(cu, nvrtc, address, major, minor)
        stream = cu.call("cuStreamCreate", 0)
    except Exception as exc:  # noqa: BLE001 - reported: the test cannot go on without a kernel
        say(event="outcome", role="faulter", how="error", error={**describe(exc), "setup": True})
        return 1
    say(event="ready", pid=os.getpid(), compiled=how, not_compiled=tried, target=args.target,
        address=hex(address), capability=f"{major}.{minor}")
    go.arrived.wait()
    if go.text.strip() != "go":  # EOF: the test is gone; fault nobody's GPU for nothing
        say(event="outcome", role="faulter", how="stopped")
        return 0
    began = time.monotonic()
    launch = cu.status(driver.cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, stream, None, 0))
    synchronize = cu.status(driver.cuStreamSynchronize(stream))
    context_synchronize = cu.status(driver.cuCtxSynchronize())
    seconds = time.monotonic() - began
    # What eglcuda says in this process afterwards: the same sticky error, by name?
    try:
        frame = eglcuda.Frame.allocate(64, 48)
        frame.planes[0].to_numpy()
        frame.close()
        after: dict[str, Any] = {"ok": True}
    except BaseException as exc:  # noqa: BLE001 - recorded
        after = {"ok": False, **describe(exc)}
    faulted = bool(synchronize["code"] or context_synchronize["code"])
    say(event="faulted", faulted=faulted, launch=launch, synchronize=synchronize,
        context_synchronize=context_synchronize, seconds=round(seconds, 4), eglcuda_after=after)
    return 0 if faulted else 4


# ---- client ----------------------------------------------------------------------------------------

def client(args: argparse.Namespace) -> int:
    """A new client: CUDA starts, a frame is allocated, data goes in and comes back."""
    began = time.monotonic()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    active, reason = mps.under_mps(0)
    try:
        frame = eglcuda.Frame.allocate(64, 48)
        data = np.random.default_rng().integers(0, 256, frame.planes[0].shape, dtype=np.uint8)
        frame.planes[0].copy_from(data)
        same = bool(np.array_equal(frame.planes[0].to_numpy(), data))
        frame.close()
        outcome: dict[str, Any] = {"how": "stopped" if same else "error", "ok": same}
        if not same:
            outcome["error"] = {"type": "WrongBytes", "eglcuda": False, "message": "the data came back changed"}
    except BaseException as exc:  # noqa: BLE001 - reported
        outcome = {**outcome_of(exc), "ok": False}
    say(event="outcome", role="client", under_mps=active, mps_reason=reason,
        seconds=round(time.monotonic() - began, 3), **outcome)
    return 0 if outcome["ok"] else exit_code(outcome)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("role", choices=["consumer", "producer", "faulter", "client"])
    parser.add_argument("--socket", help="the hand-over socket (consumer, producer)")
    parser.add_argument("--seed", type=int, default=1, help="frame content seed (consumer, producer)")
    parser.add_argument("--fifo", type=int, default=4, help="FIFO length (consumer)")
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--frames", type=int, default=0, help="producer: present this many, then wait (0: no end)")
    parser.add_argument("--pace-ms", type=float, default=2.0, help="producer: sleep between frames")
    parser.add_argument("--target", choices=["null", "freed"], default="null",
                        help="faulter: write to address 0x10, or into a freed allocation")
    parser.add_argument("--lifetime", type=int, default=900,
                        help="SIGALRM ends this process after that many seconds, whatever it is doing")
    args = parser.parse_args()
    signal.alarm(args.lifetime)  # the default action terminates it, even inside a driver call
    if args.role in ("consumer", "producer") and not args.socket:
        parser.error(f"{args.role} needs --socket")
    return {"consumer": consume, "producer": produce, "faulter": fault, "client": client}[args.role](args)


if __name__ == "__main__":
    sys.exit(main())
