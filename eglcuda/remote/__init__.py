"""Remote subscribers: a topic that crosses hosts, on UCX through UCXX (docs/remote.md).

- :class:`Relay` (relay.py; its connections: serving.py): a local subscriber of a topic that
  serves remote subscribers.
- :class:`RemoteSubscriber` (subscriber.py; joining and its link: link.py): what
  ``eglcuda.Subscriber(name, remote="HOST:PORT")`` makes; frames land in a pool on its own GPU.
- wire.py: the messages, each of a size known before it arrives; session.py: the Noise NNpsk0
  handshake and the sealed channels after it; keys.py: the pre-shared key; buffers.py:
  page-locked staging; _ucx.py: the one UCX engine.

Importing this package imports neither ucxx nor pyca/cryptography: a relay or remote subscriber
made without them raises :class:`eglcuda.Unsupported` naming what to install (:func:`ucxx_missing`).
"""
from ._ucx import INSTALL, ucxx_missing
from .relay import Relay, RemoteInfo
from .subscriber import RemoteSubscriber

__all__ = ["INSTALL", "Relay", "RemoteInfo", "RemoteSubscriber", "ucxx_missing"]
