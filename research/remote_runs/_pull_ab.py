"""Variants of the package's remote frame path, for an A/B run (research/remote_runs/remote-pull.sh):
    python3 research/remote_runs/_pull_ab.py COPY_DIR base|renew
base:  a 'latest' relay's local thread receives every frame, waking on the room the engine counts (as before the
       engine's thread received itself);
renew: the engine's thread receives, and the relay's room is renewed as each send ends too (not only on a credit)."""
import pathlib
import sys

root, mode = pathlib.Path(sys.argv[1]), sys.argv[2]


def patch(rel: str, old: str, new: str) -> None:
    path = root / rel
    text = path.read_text()
    if text.count(old) != 1:
        sys.exit(f"_pull_ab.py: {rel}: expected one {old!r}")
    path.write_text(text.replace(old, new))


if mode == "base":
    patch("eglcuda/remote/relay.py", "self._pull_on_loop = self.qos is Qos.LATEST",
          "self._pull_on_loop = False")
    patch("eglcuda/remote/relay.py", "            look = False\n            if self._pull_on_loop:\n",
          "            look = self.qos is Qos.LATEST and not staging.wanted.wait(0.25)\n            if False:\n")
elif mode == "renew":
    patch("eglcuda/remote/sender.py", "        self.last_sent = time.monotonic()\n        self.pump()\n"
          .replace("self.last_sent", "self._last_sent"),
          "        self._last_sent = time.monotonic()\n        self.pump()\n        self._changed()\n")
else:
    sys.exit(f"_pull_ab.py: mode is base or renew, got {mode!r}")
