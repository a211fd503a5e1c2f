"""Status: runs against the current package (a GPU machine, or the stand-in libcuda).

Timestamps at the entry of the remote wing's per-frame steps, in every Python process started
with this folder first on PYTHONPATH and EGLTRACE=1 (Python imports ``sitecustomize`` itself):

    EGLTRACE=1 PYTHONPATH=research/probes/remote_trace python bench/remote.py --no-plots \\
        --subscribers 1 --rates max --variants eglcuda --duration 3 --rounds 1 --width 320 --height 240
    python research/probes/remote_trace/summarize.py /tmp/eglcuda-trace

Each process that took steps writes /tmp/eglcuda-trace/<pid>.txt at exit (``step monotonic_ns``
lines). Steps: the relay's credit, dispatch, hand-over and send completion; the remote's frame
arrival (engine), the user's take, the copy queued (give_back_when), the credit; every tagged
send (send1 frames, send3 control). A process ended by a signal writes nothing.
"""
import atexit
import os
import time

if os.environ.get("EGLTRACE"):
    _EVENTS: list = []
    _now = time.monotonic_ns

    def _wrap(cls, name, step):
        original = getattr(cls, name)

        def traced(*args, **kwargs):
            _EVENTS.append((step, _now()))
            return original(*args, **kwargs)

        setattr(cls, name, traced)

    def _dump():
        if _EVENTS:
            os.makedirs("/tmp/eglcuda-trace", exist_ok=True)
            with open(f"/tmp/eglcuda-trace/{os.getpid()}.txt", "w") as out:
                out.writelines(f"{step} {at}\n" for step, at in _EVENTS)

    atexit.register(_dump)
    try:
        from eglcuda.remote import _ucx, receiver, relay, sender, subscriber
    except Exception as exc:  # noqa: BLE001 - no remote wing here (ucxx missing): nothing traced
        print("remote trace: not installed:", exc)
    else:
        _wrap(sender.Sender, "credit", "R_credit")
        _wrap(sender.Sender, "_sent_one", "R_sent")
        _wrap(relay.Relay, "_dispatch", "R_dispatch")
        _wrap(relay.Relay, "_hand_over", "R_handover")
        _wrap(receiver.Receiver, "_on_frame", "M_frame")
        _wrap(subscriber.RemoteFeed, "_deliver", "M_take")
        _wrap(receiver.Receiver, "give_back_when", "M_gbw")
        _wrap(receiver.Receiver, "_give_credit", "M_credit")
        _send_now = _ucx.Endpoint.send_now

        def send_now(self, array, kind, done):
            _EVENTS.append((f"send{kind}", _now()))
            return _send_now(self, array, kind, done)

        _ucx.Endpoint.send_now = send_now
