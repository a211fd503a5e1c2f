# Diagnostic only, NOT SAFE: the cuda-ipc publisher never waits for a subscriber's done event (a
# slot may be written while a subscriber's kernel still reads it). Loaded by
# research/probes/topic_ordering.sh through PYTHONPATH into every process of a bench run.
from eglcuda.topics.transports import cuda_ipc as transports

transports.CudaIpcLink.reading_done = lambda self, slot: True
