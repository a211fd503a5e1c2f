"""Remote subscribers: a topic that crosses hosts, on UCX through UCXX (docs/remote.md).

The relay's side: :class:`Relay` (relay.py: the local subscription, its thread, which remote
gets which frame) owns a staging ring (staging.py), a server (server.py: listener and
handshake) and a sender per remote subscriber (sender.py).
The subscriber's side: ``eglcuda.Subscriber(name, remote="HOST:PORT")`` holds a
:class:`RemoteFeed` (subscriber.py: the pool on its own GPU, the messages), which owns a
receiver for each joined connection (receiver.py: the handshake, the receive window, credits,
beats, notes); :class:`RemoteSubscriber` is the name of such a subscriber.
Under both: wire.py: the messages, each of a size known before it arrives; session.py: the
Noise NNpsk0 handshake and the sealed channels after it; keys.py: the pre-shared key;
buffers.py: page-locked buffers; _ucx.py: the one UCX engine.

Importing this package imports neither ucxx nor pyca/cryptography: a relay or remote subscriber
made without them raises :class:`eglcuda.Unsupported` naming what to install (:func:`ucxx_missing`).
"""
from ._ucx import INSTALL, ucxx_missing
from .relay import Relay, RemoteInfo
from .subscriber import RemoteSubscriber

__all__ = ["INSTALL", "Relay", "RemoteInfo", "RemoteSubscriber", "ucxx_missing"]
