"""Status: needs nothing of eglcuda (Linux, Python's select.epoll).

What does a wait through nested epoll sets cost a woken thread, against one set over the
sockets themselves? A subscriber's fileno() is an epoll set of its own (its socket and an
eventfd, so that the descriptor stays the same across reconnects), and a WaitSet's epoll watches
those sets. A forked writer sends one byte at a time to N Unix sockets, each at RATE/s from a
random phase (cameras that are not synchronized); the reader waits for any (a "flat" set over the
sockets, or a "nested" one over one set per socket, as the WaitSet over subscribers) and reads the
byte. Printed: the reader's CPU time (thread_time) per byte, both ways in alternate rounds.

    python research/probes/nested_epoll_probe.py [--sockets 32] [--rate 30] [--seconds 8] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import random
import select
import socket
import time


def writer(socks: list[socket.socket], rate: float, seconds: float) -> None:
    start = time.monotonic()
    phases = [random.random() / rate for _ in socks]
    sent = [0] * len(socks)
    while time.monotonic() < start + seconds + 1:
        index = min(range(len(socks)), key=lambda i: phases[i] + sent[i] / rate)
        due = start + phases[index] + sent[index] / rate
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        socks[index].send(b"W")
        sent[index] += 1


def reader(mode: str, socks: list[socket.socket], seconds: float) -> float:
    outer = select.epoll()
    by_fd: dict[int, socket.socket] = {}
    keep = []
    for sock in socks:
        if mode == "flat":
            outer.register(sock.fileno(), select.EPOLLIN)
            by_fd[sock.fileno()] = sock
        else:
            inner = select.epoll(2)
            due = os.eventfd(0, os.EFD_NONBLOCK)
            inner.register(due, select.EPOLLIN)
            inner.register(sock.fileno(), select.EPOLLIN)
            outer.register(inner.fileno(), select.EPOLLIN)
            by_fd[inner.fileno()] = sock
            keep.append((inner, due))
    spent, count = 0.0, 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        started = time.thread_time()
        for fd, _ in outer.poll(0.1, 64):
            by_fd[fd].recv(64)
            count += 1
        spent += time.thread_time() - started
    for inner, due in keep:
        inner.close()
        os.close(due)
    outer.close()
    return spent / max(count, 1) * 1e6


def one(mode: str, sockets: int, rate: float, seconds: float) -> float:
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(sockets)]
    pid = os.fork()
    if pid == 0:
        try:
            writer([a for a, _ in pairs], rate, seconds)
        finally:
            os._exit(0)
    time.sleep(0.5)
    try:
        return reader(mode, [b for _, b in pairs], seconds)
    finally:
        os.waitpid(pid, 0)
        for a, b in pairs:
            a.close()
            b.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[2])
    parser.add_argument("--sockets", type=int, default=32)
    parser.add_argument("--rate", type=float, default=30.0)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for index in range(args.rounds):
        flat = one("flat", args.sockets, args.rate, args.seconds)
        nested = one("nested", args.sockets, args.rate, args.seconds)
        print(f"round {index + 1}: flat {flat:.1f} us a byte, nested {nested:.1f}", flush=True)


if __name__ == "__main__":
    main()
