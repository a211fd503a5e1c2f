"""Per-frame timestamps for research/remote_runs/remote-trace.sh, patched into a copy of the package (never committed into it):
where a frame's and a credit's time goes between the relay's and the remote subscriber's threads. Each marked step
appends (step, seq or count, CLOCK_MONOTONIC ns) in its process; at exit the process writes them to
$EGLX_TRACE_DIR/trace-PID.json (CLOCK_MONOTONIC is one clock for the host's processes), once EGLX_TRACE_S (3)
seconds after its first mark (bench/remote.py kills its processes soon after their results) and again at exit.

    relay:  R.credit (a credit read, its count)  R.wake (the local thread woken to stage)  R.staged (seq)
            R.dispatch (seq, on the loop)  R.post (seq, the send posted)  R.sent (seq, the send ended)
    remote: S.arrive (seq, the receive's completion on the loop)  S.take (seq, receive() took it)
            S.copied (seq, its H2D copy waited for)  S.credit (count, the credit posted on the loop)
    both:   notify (the notifier woke for finished requests)

    python research/remote_runs/_trace46.py CHECKOUT"""
import sys

from _patch import patch

root = sys.argv[1] if len(sys.argv) > 1 else "."

TRACE = '''"""Per-frame timestamps (research/remote_runs/_trace46.py): not part of eglcuda."""
import atexit, json, os, time
marks = []
seq_of = {}
DUMP_NS = int(float(os.environ.get("EGLX_TRACE_S", "3")) * 1e9)  # written this long after the first mark
first = [0, False]
def mark(step, value=-1):
    now = time.monotonic_ns()
    marks.append((step, value, now))
    if not first[0]:
        first[0] = now
    elif not first[1] and now - first[0] > DUMP_NS:
        first[1] = True
        _dump()
def _dump():
    folder = os.environ.get("EGLX_TRACE_DIR")
    if folder and marks:
        path = os.path.join(folder, "trace-%d.json" % os.getpid())
        text = json.dumps(marks)
        with open(path + ".part", "w") as out:
            out.write(text)
        os.replace(path + ".part", path)  # (a process killed while writing leaves no half file)
atexit.register(_dump)
'''


open(f"{root}/eglcuda/remote/_trace.py", "w").write(TRACE)
T = "__import__('eglcuda.remote._trace', fromlist=['x'])"
patch(f"{root}/eglcuda/remote/serving.py", [
    ("                if kind is wire.Control.CREDIT:\n",
     f"                if kind is wire.Control.CREDIT:\n                    {T}.mark('R.credit', count)\n"),
    ('        """A staged frame: queue it for each remote subscriber that has room for it."""\n',
     f'        """A staged frame: queue it for each remote subscriber that has room for it."""\n        {T}.mark("R.dispatch", seq); {T}.seq_of[index] = seq\n'),
    ("                remote.ep.send_now(buffers[index], wire.FRAME_TAG,",
     f"                {T}.mark('R.post', {T}.seq_of.get(index, -1))\n                remote.ep.send_now(buffers[index], wire.FRAME_TAG,"),
    ("        remote.inflight -= 1\n        self._unref(index)\n",
     f"        remote.inflight -= 1\n        {T}.mark('R.sent', {T}.seq_of.get(index, -1))\n        self._unref(index)\n"),
])
patch(f"{root}/eglcuda/remote/relay.py", [
    ("                index = None if look else self._stage(message)\n",
     f"                if not look:\n                    {T}.mark('R.wake')\n                index = None if look else self._stage(message)\n"
     f"                if index is not None:\n                    {T}.mark('R.staged', seq)\n"),
])
patch(f"{root}/eglcuda/remote/link.py", [
    ("            kind, seq, timestamp_ns, length, _, _ = wire.decode_header(buffer[:wire.HEADER].tobytes())\n",
     f"            kind, seq, timestamp_ns, length, _, _ = wire.decode_header(buffer[:wire.HEADER].tobytes())\n            {T}.mark('S.arrive', seq)\n"),
    ("    def _give_credit(self, link: _Link, count: int) -> None:\n",
     f"    def _give_credit(self, link: _Link, count: int) -> None:\n        {T}.mark('S.credit', count)\n"),
])
patch(f"{root}/eglcuda/remote/subscriber.py", [
    ("                seq, timestamp_ns, payload, index = link.ready.popleft()\n",
     f"                seq, timestamp_ns, payload, index = link.ready.popleft()\n            {T}.mark('S.take', seq)\n"),
    ('            cuda.stream_synchronize(copy, "copying a remote frame into the subscriber\'s pool")\n',
     f'            cuda.stream_synchronize(copy, "copying a remote frame into the subscriber\'s pool")\n            {T}.mark("S.copied", seq)\n'),
])
patch(f"{root}/eglcuda/remote/_ucx.py", [
    ("                if state != ready:\n                    continue\n",
     f"                if state != ready:\n                    continue\n                {T}.mark('notify')\n"),
])
print(f"trace marks patched into {root}")
