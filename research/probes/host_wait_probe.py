# Research record (see research/README.md): runs against the current package (public API and CuPy).
"""Probe: which per-frame driver calls wait on the host, and for what?

A kernel that spins about 200 ms is queued before each call on the stream the call names; the
call's duration and whether that kernel is still running when the call returns show whether the
call waited for it. Also: does a return_frame right after the consumer's release (its work still
running) come back at once, and does a present into a full FIFO wait?"""
import threading, time

import _needs  # research/probes/_needs.py: a missing need is one line and status 2

_needs.answer_help(__doc__)
_needs.needs_cuda(__file__, "cuda", "cuda-stream")
_needs.needs_module(__file__, "cupy", _needs.CUPY_HOW)

import cupy as cp
import eglcuda

spin = cp.RawKernel(r'''extern "C" __global__ void spin(long long cycles)
{ long long start = clock64(); while (clock64() - start < cycles) {} }''', "spin")
CYCLES = cp.int64(400_000_000)  # about 200 ms at the H200's clock


def timed(label, call):
    start = time.perf_counter()
    result = call()
    print(f"  {label:48s} {1e3 * (time.perf_counter() - start):8.3f} ms", flush=True)
    return result


display = eglcuda.Display.for_cuda_device(0)
for fifo in (0, 4):
    print(f"fifo_length={fifo}")
    with display.create_stream(fifo_length=fifo) as stream:
        consumer = stream.connect_cuda_consumer()
        producer = stream.connect_cuda_producer(640, 480)
        frames = [producer.allocate_frame() for _ in range(8)]
        work = cp.cuda.Stream(non_blocking=True)
        spin((1,), (1,), (CYCLES,), stream=work)
        timed("present, producer kernel running", lambda: producer.present(frames[0], cuda_stream=work.ptr))
        print("    producer kernel still running:", not work.done)
        frame = timed("acquire, producer kernel running", lambda: consumer.acquire(timeout_us=2_000_000))
        print("    producer kernel still running:", not work.done)
        spin((1,), (1,), (CYCLES,), stream=cp.cuda.ExternalStream(frame.cuda_stream))
        timed("release, consumer kernel running", frame.release)
        print("    consumer kernel still running:", not cp.cuda.ExternalStream(consumer.cuda_stream).done)
        timed("present the next frame (default stream)", lambda: producer.present(frames[1]))
        back = timed("return_frame(0), consumer kernel running", lambda: producer.return_frame(0))
        print("    came back:", back is frames[0], " consumer kernel still running:",
              not cp.cuda.ExternalStream(consumer.cuda_stream).done)
        if back is None:
            back = timed("return_frame(1 s)", lambda: producer.return_frame(1_000_000))
            print("    came back:", back is frames[0])
        cp.cuda.Device().synchronize()
        # return_frame(0) with nothing to return: how long does one try take?
        frame = consumer.acquire()
        timed("return_frame(0), the one frame in flight held", lambda: producer.return_frame(0))
        frame.release()
        if fifo:
            # Fill the FIFO without acquiring: does a present into a full FIFO wait?
            outcome = []
            def fill():
                try:
                    for i in range(2, 8):
                        start = time.perf_counter()
                        producer.present(frames[i])
                        outcome.append(f"present {i}: {1e3 * (time.perf_counter() - start):.3f} ms")
                except Exception as error:  # noqa: BLE001 - the probe reports whatever happens
                    outcome.append(f"present {i}: {type(error).__name__}: {error}")
            filler = threading.Thread(target=fill, daemon=True)
            filler.start()
            filler.join(3)
            print("   ", outcome, "still blocked:" if filler.is_alive() else "", filler.is_alive())
            while filler.is_alive():
                f = consumer.acquire(timeout_us=100_000)
                f.release()
                filler.join(0.2)
            print("   ", outcome[-1])
