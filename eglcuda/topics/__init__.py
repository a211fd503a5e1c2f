"""Frame topics: one publisher, any number of subscriber processes, zero-copy and crash-isolated.

- :class:`Publisher` owns a pool of frames and a topic name (a UNIX socket under
  ``$XDG_RUNTIME_DIR/eglcuda/``); :meth:`Publisher.next_frame` / :meth:`Publisher.publish` hand
  each frame to every subscriber without a copy.
- :class:`Subscriber` joins and leaves at any time, chooses its quality of service (``latest`` or
  ``every``) and receives :class:`Message` objects whose ``frame`` is read in place.
- :func:`list_topics` (``python -m eglcuda topics``) lists live topics and removes the sockets of
  dead publishers.

Modules: :mod:`.naming` (names, directories, locks), :mod:`.protocol` (the wire format),
:mod:`.sockets` (socket helpers), :mod:`.transports` (CUDA IPC and EGLStream behind one
interface), :mod:`.publisher`, :mod:`.subscriber`, :mod:`.registry`. See docs/topics.md.
"""
from .info import DropRecord, SubscriberInfo, TopicInfo
from .protocol import Qos, Reason
from .publisher import Publisher
from .registry import Listing, TopicStatus, list_topics
from .subscriber import Message, Subscriber
from .transports import SlotView

__all__ = ["DropRecord", "Listing", "Message", "Publisher", "Qos", "Reason", "SlotView", "Subscriber", "SubscriberInfo",
           "TopicInfo", "TopicStatus", "list_topics"]
