"""A stand-in for ``nvidia-cuda-mps-control``, for tests on machines without the NVIDIA driver.

It copies what eglcuda relies on from the real program (its manual page, the MPS documentation
and published logs of the daemon):

- ``-d`` forks a daemon and returns at once; the daemon writes ``nvidia-cuda-mps-control.pid``,
  ``control_lock`` and a listening UNIX socket ``control`` into CUDA_MPS_PIPE_DIRECTORY (default
  /tmp/nvidia-mps), and logs to ``control.log`` in CUDA_MPS_LOG_DIRECTORY. A second daemon on a pipe
  directory whose pid file names a live process is refused.
- Without arguments it is the client: it sends each line of its stdin to the daemon's socket and
  prints the answer; with no daemon it says so and exits with 1.
- Commands: ``quit`` (the daemon stops its servers, removes its pid file, leaves the socket file,
  exits), ``start_server -uid UID`` (starts ``nvidia-cuda-mps-server`` with the daemon's
  environment), ``get_server_list``.

FAKE_MPS_PID_DELAY (seconds) holds the daemon between opening its socket and writing its pid
file, as a busy machine may. FAKE_MPS_RECORD names a file where the daemon notes how it was asked to stop ("quit" or "SIGTERM").
FAKE_MPS_MODE makes it misbehave: ``refuse`` (the launcher fails as when not permitted),
``exit-at-once`` (the daemon logs why and dies right after the fork), ``stubborn`` (the daemon
ignores ``quit`` and SIGTERM).
"""
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

PIPE = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
LOG = os.environ.get("CUDA_MPS_LOG_DIRECTORY") or "/var/log/nvidia-mps"
MODE = os.environ.get("FAKE_MPS_MODE", "")
HERE = os.path.dirname(os.path.abspath(sys.argv[0]))
PID_FILE = os.path.join(PIPE, "nvidia-cuda-mps-control.pid")
SOCKET = os.path.join(PIPE, "control")


def log(line):
    with open(os.path.join(LOG, "control.log"), "a") as f:
        f.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}.000 Control {os.getpid():5d}] {line}\n")


def record(event):
    if os.environ.get("FAKE_MPS_RECORD"):
        with open(os.environ["FAKE_MPS_RECORD"], "a") as f:
            f.write(event + "\n")


def running():
    try:
        with open(PID_FILE) as f:
            os.kill(int(f.read()), 0)
    except (OSError, ValueError):
        return False
    return True


def daemon():
    if running():
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    if MODE == "refuse":
        log("Failed to start control daemon: Operation not permitted")
        print("Failed to start control daemon: Operation not permitted", file=sys.stderr)
        return 1
    if os.fork():
        return 0
    os.setsid()
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    if MODE == "exit-at-once":
        log("Startup")
        log("Failed to open the GPU: Operation not permitted")
        os._exit(1)
    servers = []

    def finish(*signalled):
        record("SIGTERM" if signalled else "quit")
        for server in servers:
            with contextlib.suppress(OSError):
                server.terminate()
            server.wait()
        with contextlib.suppress(OSError):
            os.unlink(PID_FILE)
        log("Exit")
        os._exit(0)

    signal.signal(signal.SIGTERM, (lambda *_: record("SIGTERM ignored")) if MODE == "stubborn" else finish)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(SOCKET)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(SOCKET)
    listener.listen(8)
    open(os.path.join(PIPE, "control_lock"), "w").close()
    time.sleep(float(os.environ.get("FAKE_MPS_PID_DELAY") or 0))  # a daemon descheduled before its pid file
    with open(PID_FILE, "w") as f:
        f.write(str(os.getpid()))
    log(f"Starting control daemon using socket {SOCKET}")
    log(f"To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={PIPE}")
    while True:
        connection, _ = listener.accept()
        with connection:
            command = connection.makefile().readline().strip()
            log(f"Accepting connection... {command}")
            if command == "quit":
                if MODE == "stubborn":
                    record("quit ignored")
                if MODE != "stubborn":
                    connection.close()
                    listener.close()
                    finish()
            elif command.startswith("start_server"):
                server = subprocess.Popen([sys.executable, os.path.join(HERE, "nvidia-cuda-mps-server")])
                servers.append(server)
                log(f"Starting new server {server.pid} for user {command.split()[-1]}")
                connection.sendall(f"{server.pid}\n".encode())
            elif command == "get_server_list":
                alive = [str(s.pid) for s in servers if s.poll() is None]
                connection.sendall(("\n".join(alive) + "\n").encode())
            else:
                connection.sendall(b"Invalid command\n")


def client():
    for line in sys.stdin:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
                connection.connect(SOCKET)
                connection.sendall(line.encode() if line.endswith("\n") else (line + "\n").encode())
                connection.shutdown(socket.SHUT_WR)
                answer = b"".join(iter(lambda: connection.recv(4096), b""))
        except OSError:
            print("Cannot find MPS control daemon process", file=sys.stderr)
            return 1
        sys.stdout.write(answer.decode())
    return 0


if __name__ == "__main__":
    sys.exit(daemon() if sys.argv[1:2] == ["-d"] else client())
