"""EGLStream CUDA -> CUDA per-frame cost: C reference vs eglcuda vs PyOpenGL + cuda-python.

Serial round trip (one thread: present, acquire, map, release, return) and pipelined throughput
(producer and consumer threads, FIFO 4), ARGB pitch-linear frames, at several sizes. All three
stacks run in this one invocation, interleaved per size, so their ratios share the machine's state.

    python bench/stream_roundtrip.py [--quick] [--repeats N] [--cpus 2,5] [--fresh] [--markdown FILE]
                                     [--plot docs/img/roundtrip_MODE.svg]

Each round runs every column once, the C side first in even rounds and the Python side first in
odd ones. Each C column is a fresh process; with --fresh each round's Python columns run in a fresh
interpreter too (otherwise in this long-lived one).

(1) C: bench/c/stream_roundtrip.c, built here with gcc, the same driver calls with no Python; and
    "C + counter", which also reads the stream's consumer frame counter after each acquire, as
    eglcuda's consumer does when its producer is in another process (it is how
    AcquiredFrame.is_new tells new from old); and "C, same calls", exactly the driver calls of
    eglcuda's four-call loop: C plus the current-context check eglcuda makes on each call from
    Python (with both ends in this process, frame numbers come from the present counts).
(2) eglcuda: the public API (Stream, CudaProducer, CudaConsumer, Frame), with the four single calls
    (present, acquire, release, return_frame) and with the loop steps (present_and_return,
    acquire_next / frames), which make the same driver calls in two crossings per frame; and the
    loop steps with frame_numbers=False ("bare"). Each eglcuda serial run checks that its frame
    numbers came without the EGL query.
(3) What a Python user would write today: PyOpenGL's EGL bindings for the display and stream
    (they need a current context for extension calls) and cuda-python's driver bindings.

Needs an NVIDIA GPU with EGL streams and gcc; ``pip install -e '.[bench]'`` brings PyOpenGL and
cuda-python for (3) (without them that column reads n/a) and matplotlib for --plot.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _script import (MATPLOTLIB, at_least, build_reference, lazy, listed, one_line,  # noqa: E402
                     output_file, plot_bars, require, run)

PROGRAM = "bench/stream_roundtrip.py"
eglcuda = lazy("eglcuda")  # imported at first use, once require() has checked it is there
SIZES = [(640, 480), (1920, 1080), (3840, 2160), (7680, 4320)]


def build_c() -> pathlib.Path:
    return build_reference("stream_roundtrip")


def run_c(binary: pathlib.Path, width: int, height: int, iterations: int, mode: str) -> float:
    out = subprocess.run([str(binary), str(width), str(height), str(iterations), mode], check=True,
                         capture_output=True, text=True, timeout=600).stdout
    return float(out.split("us_per_frame=")[1].split()[0])


# ---- eglcuda ----------------------------------------------------------------------------------

def eglcuda_serial(display, width: int, height: int, iterations: int, frame_numbers: bool = True) -> float:
    with display.create_stream() as stream:
        consumer = stream.connect_cuda_consumer(frame_numbers=frame_numbers)
        producer = stream.connect_cuda_producer(width, height)
        frames = [producer.allocate_frame(), producer.allocate_frame()]
        warmup = iterations // 10 + 2
        start = 0.0
        for i in range(iterations + warmup):
            if i == warmup:
                start = time.perf_counter()
            producer.present(frames[i & 1])
            consumer.acquire().release()
            if i:
                frames[(i - 1) & 1] = producer.return_frame(1_000_000)
        elapsed = time.perf_counter() - start
        check_numbered_without_egl(consumer, iterations + warmup)
        return 1e6 * elapsed / iterations


def check_numbered_without_egl(consumer, acquires: int) -> None:
    """The serial loop is the case the producer's present counts settle: every acquire but the
    first gets its number without the EGL query. Anything else means the bench measured
    another path than the one it reports."""
    if consumer.frame_numbers and consumer._numbers_derived != acquires - 1:
        raise RuntimeError(f"{consumer._numbers_derived} of {acquires} acquires numbered without EGL")


def eglcuda_breakdown(display, width: int, height: int, iterations: int) -> dict[str, float]:
    """Median microseconds of each public call in the serial loop (where eglcuda's time goes)."""
    clock = time.perf_counter
    with display.create_stream() as stream:
        consumer = stream.connect_cuda_consumer()
        producer = stream.connect_cuda_producer(width, height)
        frames = [producer.allocate_frame(), producer.allocate_frame()]
        spent: dict[str, list[float]] = {"present": [], "acquire": [], "release": [], "return_frame": []}
        for i in range(iterations):
            t0 = clock()
            producer.present(frames[i & 1])
            t1 = clock()
            acquired = consumer.acquire()
            t2 = clock()
            acquired.release()
            t3 = clock()
            if i:
                frames[(i - 1) & 1] = producer.return_frame(1_000_000)
            t4 = clock()
            if i > iterations // 10:
                for name, seconds in zip(spent, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                    spent[name].append(seconds)
        return {name: 1e6 * statistics.median(values) for name, values in spent.items()}


def eglcuda_pipelined(display, width: int, height: int, iterations: int, steps: bool = False,
                      frame_numbers: bool = True) -> float:
    """Producer and consumer threads, FIFO 4. ``steps``: the producer presents and takes back in
    one call (present_and_return) and the consumer iterates ``consumer.frames()``."""
    with display.create_stream(fifo_length=4) as stream:
        consumer = stream.connect_cuda_consumer(frame_numbers=frame_numbers)
        producer = stream.connect_cuda_producer(width, height)
        pool = [producer.allocate_frame() for _ in range(6)]

        def produce():
            free = list(pool)
            for _ in range(iterations):
                while not free:
                    back = producer.return_frame(100_000)
                    if back is not None:
                        free.append(back)
                if steps:
                    back = producer.present_and_return(free.pop())
                    if back is not None:
                        free.append(back)
                else:
                    producer.present(free.pop())

        start = time.perf_counter()
        thread = threading.Thread(target=produce)
        thread.start()
        if steps:
            got = 0
            for _frame in consumer.frames():
                got += 1
                if got == iterations:
                    break
        else:
            for _ in range(iterations):
                consumer.acquire().release()
        thread.join()
        return 1e6 * (time.perf_counter() - start) / iterations


def eglcuda_serial_steps(display, width: int, height: int, iterations: int, frame_numbers: bool = True) -> float:
    """The serial round trip written with the loop steps: present_and_return + acquire_next
    (two calls per frame instead of four; the same driver calls)."""
    with display.create_stream() as stream:
        consumer = stream.connect_cuda_consumer(frame_numbers=frame_numbers)
        producer = stream.connect_cuda_producer(width, height)
        free = [producer.allocate_frame() for _ in range(3)]
        warmup = iterations // 10 + 2
        start = 0.0
        acquired = None
        for i in range(iterations + warmup):
            if i == warmup:
                start = time.perf_counter()
            frame = free.pop()
            back = producer.present_and_return(frame, timeout_us=1_000_000 if not free and i > 1 else 0)
            if back is not None:
                free.append(back)
            acquired = consumer.acquire_next()
        elapsed = time.perf_counter() - start
        acquired.release()
        check_numbered_without_egl(consumer, iterations + warmup)
        return 1e6 * elapsed / iterations


# ---- PyOpenGL + cuda-python -------------------------------------------------------------------

class Stack:
    """The display, a current context (PyOpenGL's EGL extension calls need one) and CUDA."""

    def __init__(self) -> None:
        os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
        import ctypes

        from cuda.bindings import driver as cu
        from OpenGL import EGL

        self.cu, self.EGL, self.ctypes = cu, EGL, ctypes
        # PyOpenGL checks extension functions against the current display, so the usual recipe is
        # the default display, initialized and made current before any extension call.
        self.dpy = EGL.eglGetDisplay(EGL.EGL_DEFAULT_DISPLAY)
        major, minor = EGL.EGLint(), EGL.EGLint()
        EGL.eglInitialize(self.dpy, ctypes.pointer(major), ctypes.pointer(minor))
        config = EGL.EGLConfig()
        num = EGL.EGLint()
        EGL.eglChooseConfig(self.dpy, (EGL.EGLint * 5)(EGL.EGL_SURFACE_TYPE, EGL.EGL_PBUFFER_BIT,
                                                       EGL.EGL_RENDERABLE_TYPE, EGL.EGL_OPENGL_BIT, EGL.EGL_NONE),
                            ctypes.pointer(config), 1, ctypes.pointer(num))
        EGL.eglBindAPI(EGL.EGL_OPENGL_API)
        self.context = EGL.eglCreateContext(self.dpy, config, EGL.EGL_NO_CONTEXT, None)
        EGL.eglMakeCurrent(self.dpy, EGL.EGL_NO_SURFACE, EGL.EGL_NO_SURFACE, self.context)
        from OpenGL.EGL.KHR.stream import eglCreateStreamKHR, eglDestroyStreamKHR

        self.create_stream, self.destroy_stream = eglCreateStreamKHR, eglDestroyStreamKHR
        self.check(cu.cuInit(0))
        device = self.check(cu.cuDeviceGet(0))
        self.cuda_context = self.check(cu.cuDevicePrimaryCtxRetain(device))
        self.check(cu.cuCtxSetCurrent(self.cuda_context))

    def check(self, result):
        err, *rest = result
        if err != self.cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuda-python: {err}")
        return rest[0] if len(rest) == 1 else rest

    def session(self, width: int, height: int, fifo: int, count: int):
        cu, EGL = self.cu, self.EGL
        attribs = (EGL.EGLint * 3)(0x31FC, fifo, EGL.EGL_NONE) if fifo else (EGL.EGLint * 1)(EGL.EGL_NONE)
        stream = self.create_stream(self.dpy, attribs)
        handle = self.ctypes.cast(stream, self.ctypes.c_void_p).value
        consumer = self.check(cu.cuEGLStreamConsumerConnect(handle))
        producer = self.check(cu.cuEGLStreamProducerConnect(handle, width, height))
        pitch = (width * 4 + 255) // 256 * 256
        frames = []
        for _ in range(count):
            pointer = self.check(cu.cuMemAlloc(pitch * height))
            frame = cu.CUeglFrame()
            frame.frame.pPitch = [int(pointer), 0, 0]
            frame.width, frame.height, frame.depth, frame.pitch = width, height, 1, pitch
            frame.planeCount, frame.numChannels = 1, 4
            frame.frameType = cu.CUeglFrameType.CU_EGL_FRAME_TYPE_PITCH
            frame.eglColorFormat = cu.CUeglColorFormat.CU_EGL_COLOR_FORMAT_ARGB
            frame.cuFormat = cu.CUarray_format.CU_AD_FORMAT_UNSIGNED_INT8
            frames.append((frame, pointer))
        consumer_stream = self.check(cu.cuStreamCreate(0))
        return stream, consumer, producer, frames, consumer_stream

    def close(self, stream, consumer, producer, frames) -> None:
        cu = self.cu
        cu.cuEGLStreamProducerDisconnect(producer)
        cu.cuEGLStreamConsumerDisconnect(consumer)
        self.destroy_stream(self.dpy, stream)
        for _, pointer in frames:
            cu.cuMemFree(pointer)

    def serial(self, width: int, height: int, iterations: int) -> float:
        cu = self.cu
        stream, consumer, producer, frames, consumer_stream = self.session(width, height, 0, 2)
        resource = cu.CUgraphicsResource()
        producer_stream = cu.CUstream(0)
        back = cu.CUeglFrame()
        warmup = iterations // 10 + 2
        start = 0.0
        for i in range(iterations + warmup):
            if i == warmup:
                start = time.perf_counter()
            self.check(cu.cuEGLStreamProducerPresentFrame(producer, frames[i & 1][0], producer_stream))
            self.check(cu.cuEGLStreamConsumerAcquireFrame(consumer, resource, consumer_stream, 1_000_000))
            self.check(cu.cuGraphicsResourceGetMappedEglFrame(resource, 0, 0))
            self.check(cu.cuEGLStreamConsumerReleaseFrame(consumer, resource, consumer_stream))
            if i:
                while True:
                    err, = cu.cuEGLStreamProducerReturnFrame(producer, back, producer_stream)
                    if err != cu.CUresult.CUDA_ERROR_LAUNCH_TIMEOUT:
                        self.check((err,))
                        break
        elapsed = time.perf_counter() - start
        self.close(stream, consumer, producer, frames)
        return 1e6 * elapsed / iterations

    def pipelined(self, width: int, height: int, iterations: int) -> float:
        cu = self.cu
        stream, consumer, producer, frames, consumer_stream = self.session(width, height, 4, 6)
        resource = cu.CUgraphicsResource()

        def produce():
            self.check(cu.cuCtxSetCurrent(self.cuda_context))
            producer_stream = cu.CUstream(0)
            back = cu.CUeglFrame()
            free, nxt = len(frames), 0
            for _ in range(iterations):
                while free == 0:
                    err, = cu.cuEGLStreamProducerReturnFrame(producer, back, producer_stream)
                    if err == cu.CUresult.CUDA_SUCCESS:
                        free += 1
                self.check(cu.cuEGLStreamProducerPresentFrame(producer, frames[nxt][0], producer_stream))
                nxt = (nxt + 1) % len(frames)
                free -= 1

        start = time.perf_counter()
        thread = threading.Thread(target=produce)
        thread.start()
        for _ in range(iterations):
            self.check(cu.cuEGLStreamConsumerAcquireFrame(consumer, resource, consumer_stream, 1_000_000))
            self.check(cu.cuGraphicsResourceGetMappedEglFrame(resource, 0, 0))
            self.check(cu.cuEGLStreamConsumerReleaseFrame(consumer, resource, consumer_stream))
        thread.join()
        elapsed = time.perf_counter() - start
        self.close(stream, consumer, producer, frames)
        return 1e6 * elapsed / iterations


# Columns of the tables: what runs in each loop mode. "eglcuda" is the public API with its defaults
# (four calls, frame numbers on), whose driver calls "C, same calls" makes; "steps" the loop steps;
# "bare" the loop steps with frame_numbers=False. "C + counter" is what a loop that asks EGL for
# each frame's number costs in C.
COLUMNS = ["C", "C + counter", "C, same calls", "eglcuda", "eglcuda steps", "eglcuda steps, bare", "PyOpenGL+cuda-python"]
# (label, numerator, denominator). The first is the target (C: the five driver calls); the
# second compares the same driver calls; steps make one context check per crossing more than C.
RATIOS = [("eglcuda / C", "eglcuda", "C"),
          ("eglcuda / C same calls", "eglcuda", "C, same calls"),
          ("steps / C", "eglcuda steps", "C"),
          ("bare / C", "eglcuda steps, bare", "C"),
          ("stack / C", "PyOpenGL+cuda-python", "C"),
          ("stack / eglcuda", "PyOpenGL+cuda-python", "eglcuda"),
          ("stack / steps", "PyOpenGL+cuda-python", "eglcuda steps")]
RATIO = "ratio: "  # prefix of the ratio entries in a row's results


def measure_c(mode: str, binary, width: int, height: int, iterations: int) -> dict:
    """One run of each C column for one size and loop mode (NaN where a column has no such loop);
    each is a fresh process."""
    nan = float("nan")
    if mode == "serial":
        return {name: run_c(binary, width, height, iterations, variant) for name, variant in
                (("C", "serial"), ("C + counter", "serial_counter"), ("C, same calls", "serial_same"))}
    return {"C": run_c(binary, width, height, iterations, "pipelined"), "C + counter": nan, "C, same calls": nan}


def measure_python(mode: str, display, stack, width: int, height: int, iterations: int) -> dict:
    """One run of each Python column (eglcuda's three, then the PyOpenGL + cuda-python stack) in
    this process."""
    if mode == "serial":
        result = {"eglcuda": eglcuda_serial(display, width, height, iterations),
                  "eglcuda steps": eglcuda_serial_steps(display, width, height, iterations),
                  "eglcuda steps, bare": eglcuda_serial_steps(display, width, height, iterations, frame_numbers=False)}
    else:
        result = {"eglcuda": eglcuda_pipelined(display, width, height, iterations),
                  "eglcuda steps": eglcuda_pipelined(display, width, height, iterations, steps=True),
                  "eglcuda steps, bare": eglcuda_pipelined(display, width, height, iterations, steps=True,
                                                           frame_numbers=False)}
    result["PyOpenGL+cuda-python"] = getattr(stack, mode)(width, height, iterations) if stack is not None else float("nan")
    return result


def measure_python_fresh(mode: str, width: int, height: int, iterations: int) -> dict:
    """:func:`measure_python` in a fresh interpreter (on this process's CPUs), as each C column
    runs: a long-lived process and a fresh one need not run at the same speed."""
    done = subprocess.run([sys.executable, __file__, "--child", mode, str(width), str(height), str(iterations)],
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"the fresh Python process failed ({done.returncode}): "
                           f"{one_line(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.stdout)}")
    return {name: float(value) for name, value in json.loads(lines[-1][7:]).items()}


def child(mode: str, width: int, height: int, iterations: int) -> int:
    """--child: the Python columns of one round, printed as one RESULT line of JSON."""
    display = eglcuda.Display.for_cuda_device(0)
    try:
        stack = Stack()
    except Exception as exc:  # the parent reads n/a, as in its own process
        print(f"PyOpenGL+cuda-python stack unavailable: {one_line(exc)[:200]}", file=sys.stderr)
        stack = None
    result = measure_python(mode, display, stack, width, height, iterations)
    display.close()
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def markdown_tables(rows) -> str:
    """The us/frame table (with eglcuda's frames/s) and the ratio table."""
    def cell(value: float, digits: int) -> str:
        return "n/a" if value != value else f"{value:.{digits}f}"

    lines = ["| size | loop | " + " | ".join(f"{c} us/frame" for c in COLUMNS) + " | eglcuda steps frames/s |",
             "|---|---|" + "---:|" * (len(COLUMNS) + 1)]
    for size, mode, med in rows:
        lines.append(f"| {size} | {mode} | " + " | ".join(cell(med[c], 2) for c in COLUMNS)
                     + f" | {cell(1e6 / med['eglcuda steps'], 0)} |")
    lines += ["", "| size | loop | " + " | ".join(label for label, _, _ in RATIOS) + " |",
              "|---|---|" + "---:|" * len(RATIOS)]
    for size, mode, med in rows:
        lines.append(f"| {size} | {mode} | " + " | ".join(cell(med[RATIO + label], 3) for label, _, _ in RATIOS)
                     + " |")
    return "\n".join(lines)


# Every cell of the goal table within this much of C: eglcuda's loops against the same driver
# calls made from C (serial and pipelined; four calls, steps and bare steps).
GOAL = 1.05
GOAL_CELLS = [("serial", "eglcuda / C"), ("serial", "steps / C"), ("serial", "bare / C"),
              ("pipelined", "eglcuda / C"), ("pipelined", "steps / C"), ("pipelined", "bare / C")]


def goal_table(rows) -> tuple[str, list[str]]:
    """Per size, each loop's ratio to C (a serial cell is the median of its CPUs' rows), and the
    cells over GOAL."""
    sizes = list(dict.fromkeys(size for size, _, _ in rows))
    header = [f"{mode} {label}" for mode, label in GOAL_CELLS] + ["pipelined stack / C"]
    lines = ["| size | " + " | ".join(header) + " |", "|---|" + "---:|" * len(header)]
    over = []
    for size in sizes:
        cells = []
        for mode, label in GOAL_CELLS + [("pipelined", "stack / C")]:
            values = [med[RATIO + label] for s, m, med in rows if s == size and m.startswith(mode)]
            value = statistics.median(values) if values else float("nan")
            cells.append("n/a" if value != value else f"{value:.3f}")
            if label != "stack / C" and value == value and value > GOAL:
                over.append(f"{size} {mode} {label} {value:.3f}")
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    return "\n".join(lines), over


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (the GPU check's setting)")
    parser.add_argument("--repeats", type=at_least(1), default=3,
                        help="interleaved rounds per cell; medians of the times and of the per-round ratios are reported")
    parser.add_argument("--markdown", help="write the markdown tables to this file")
    parser.add_argument("--plot", "--svg", dest="plot", metavar="FILE",
                        help="write bar charts to this path (.svg, .png); MODE in it becomes serial / pipelined")
    parser.add_argument("--fresh", action="store_true",
                        help="run each round's Python columns in a fresh interpreter, as each C column runs")
    parser.add_argument("--child", nargs=4, metavar=("MODE", "W", "H", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--cpus", default=None,
                        help="comma-separated CPUs to pin the serial loops to, one row each (default: the "
                             "lowest CPU this process may use); C and eglcuda run on the same CPU")
    args = parser.parse_args()
    output_file(parser, "--markdown", args.markdown)
    output_file(parser, "--plot", args.plot and args.plot.replace("MODE", "serial"))
    if args.child:
        mode, width, height, iterations = args.child
        return child(mode, int(width), int(height), int(iterations))
    if args.cpus:
        allowed = sorted(os.sched_getaffinity(0))
        listed(parser, "--cpus", args.cpus, f"CPUs this process may use, from {','.join(map(str, allowed))}", int,
               choices=[str(cpu) for cpu in allowed])
    require(PROGRAM, "cuda-stream", modules=[MATPLOTLIB] if args.plot else [], gcc=True)
    serial_n, pipe_n = (500, 500) if args.quick else (10000, 3000)
    # One serial round trip took 10.3 to 12.9 us in C alone depending on the CPU it ran on (H200
    # VM, docs/benchmarks.md): so every serial column runs pinned to the same CPU; the pipelined
    # loops (two threads) get every CPU.
    all_cpus = os.sched_getaffinity(0)
    cpus = [int(c) for c in args.cpus.split(",")] if args.cpus else [min(all_cpus)]
    binary = build_c()
    display = eglcuda.Display.for_cuda_device(0)
    try:
        stack = Stack()
        stack_error = None
    except Exception as exc:  # reported in the table (PyOpenGL or cuda-python missing, or failing)
        stack, stack_error = None, one_line(exc)[:200]
        print(f"PyOpenGL+cuda-python stack unavailable, its column reads n/a: {stack_error}")

    def python_columns(mode: str, width: int, height: int, iterations: int) -> dict:
        nonlocal stack, stack_error
        if args.fresh:
            return measure_python_fresh(mode, width, height, iterations)
        try:
            return measure_python(mode, display, stack, width, height, iterations)
        except Exception as exc:  # the stack failing mid-run: its column reads n/a from here on
            if stack is None:
                raise
            stack_error, stack = f"{type(exc).__name__}: {exc}", None
            return measure_python(mode, display, stack, width, height, iterations)

    rows = []
    loops = [("serial", serial_n, {cpu}) for cpu in cpus] + [("pipelined", pipe_n, all_cpus)]
    for width, height in SIZES:
        for mode, iterations, affinity in loops:
            os.sched_setaffinity(0, affinity)  # inherited by the C reference's process
            cells: dict[str, list[float]] = {name: [] for name in COLUMNS}
            for round_ in range(args.repeats):  # interleaved, so drift hits all of them alike
                # C first in even rounds, Python first in odd ones: a drift within a round then
                # favours neither side.
                if round_ % 2 == 0:
                    run = measure_c(mode, binary, width, height, iterations)
                    run.update(python_columns(mode, width, height, iterations))
                else:
                    run = python_columns(mode, width, height, iterations)
                    run.update(measure_c(mode, binary, width, height, iterations))
                for name, value in run.items():
                    cells[name].append(value)
            med = {k: statistics.median(v) for k, v in cells.items()}
            # Each ratio is the median of its per-round ratios: both sides of a round ran back to
            # back, so a slow spell of the machine (runs 15-25% slower for seconds at a time)
            # mostly hits both.
            for label, a, b in RATIOS:
                med[RATIO + label] = statistics.median(x / y for x, y in zip(cells[a], cells[b]))
            label = f"serial, CPU {min(affinity)}" if mode == "serial" else mode
            rows.append((f"{width}x{height}", label, med))
            if mode == "serial":
                parts = eglcuda_breakdown(display, width, height, iterations)
                print("  eglcuda per call (median us): " + ", ".join(f"{k} {v:.2f}" for k, v in parts.items()))
            print(f"{width}x{height} {label:14s} " + "  ".join(f"{k} {v:.2f}" for k, v in med.items()
                                                              if not k.startswith(RATIO)), flush=True)
    os.sched_setaffinity(0, all_cpus)
    display.close()

    goal, over = goal_table(rows)
    tables = markdown_tables(rows) + "\n\n" + goal
    print(tables)
    print(f"GOAL every cell <= {GOAL:.2f}x C: " + ("met" if not over else "not met: " + "; ".join(over)))
    if stack_error:
        print(f"PyOpenGL+cuda-python stack failed: {stack_error}")
    serial = [med for _, mode, med in rows if mode.startswith("serial")]
    summary = {label: max(m[RATIO + label] for m in serial) for label, _, _ in RATIOS[:4]}
    vs_stack = [m[RATIO + "stack / eglcuda"] for _, _, m in rows]
    print("SUMMARY serial worst " + ", ".join(f"{k} x{v:.3f}" for k, v in summary.items())
          + "; stack/eglcuda " + (f"x{min(vs_stack):.2f}..x{max(vs_stack):.2f}" if stack_error is None else f"n/a ({stack_error})"))
    if args.markdown:
        pathlib.Path(args.markdown).write_text(tables + "\n")
    if args.plot:
        for mode in ("serial", "pipelined"):
            shown = f"serial, CPU {cpus[0]}" if mode == "serial" else mode  # the first CPU's rows
            picked = [(size, med) for size, m, med in rows if m == shown]
            names = [c for c in COLUMNS if all(med[c] == med[c] for _, med in picked)]
            plot_bars(args.plot.replace("MODE", mode),
                      f"EGLStream CUDA->CUDA, {mode} loop: us per frame (lower is better)", "us/frame",
                      [size for size, _ in picked], {name: [med[name] for _, med in picked] for name in names})
    return 0


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
