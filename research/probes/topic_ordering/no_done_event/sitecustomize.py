# Diagnostic only, NOT SAFE: cuda-ipc subscribers never record a done event at release, so the
# publisher never waits for their GPU work. Loaded by research/probes/topic_ordering.sh through
# PYTHONPATH into every process of a bench run.
from eglcuda.topics import protocol
from eglcuda.topics.transports import cuda_ipc as transports


def _release(self, obj, frame, cuda_stream):
    obj._released = True
    return protocol.RELEASE_TAKEN, b""


transports.CudaIpcSubscriber.release = _release
