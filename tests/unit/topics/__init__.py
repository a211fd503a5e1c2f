"""Frame topics on the CPU: real sockets, real processes, the real publisher and subscriber,
with the "null" transport (tests/topics_null.py) standing in for the GPU. Frames carry bytes in
shared memory derived from their payload, so a pool frame written again while a subscriber still
holds it shows up as wrong bytes.

The tests are split by subject into the modules of this package; conftest.py holds their
fixtures and helpers.py the helpers they share. The wire protocol's own tests, and the topics on
the stand-in libcuda (tests/fakes/driver/fake_cuda.c), are here too."""
