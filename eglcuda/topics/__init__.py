"""Frame topics: one publisher, any number of subscriber processes, zero-copy and crash-isolated.

- :class:`Publisher` owns a pool of frames and a topic name (a UNIX socket under
  ``$XDG_RUNTIME_DIR/eglcuda/``); :meth:`Publisher.next_frame` / :meth:`Publisher.publish` hand
  each frame to every subscriber without a copy.
- :class:`Subscriber` joins and leaves at any time, chooses its quality of service (``latest`` or
  ``every``) and receives :class:`Message` objects whose ``frame`` is read in place.
- :func:`list_topics` (``python -m eglcuda topics``) lists live topics and removes the sockets of
  dead publishers.

Modules (docs/architecture.md draws them): :mod:`.publisher` (a facade over :mod:`.pool`,
:mod:`.delivery` with the compiled books of ``_delivery``, :mod:`.handshake` and :mod:`.files`),
:mod:`.subscriber` (with :mod:`.joining` and :mod:`.message`), :mod:`.transports` (one module per
transport behind one interface, registered by name), :mod:`.protocol` and ``_wire`` (the wire
format), :mod:`.naming` (names, directories, locks), :mod:`.sockets` (the topic's socket steps),
:mod:`.registry` (listing), :mod:`.waitset` (waiting on many sources, through each subscriber's
:mod:`.readiness` descriptor), :mod:`.batcher` (batches from many sources). See docs/topics.md and docs/sources.md.
"""
from .batcher import Batch, BatchFrame, Batcher, BatchPlane
from .info import DropRecord, SubscriberInfo, TopicInfo
from .protocol import Qos, Reason
from .publisher import Publisher
from .registry import Listing, TopicStatus, list_topics
from .message import Message
from .subscriber import Subscriber
from .transports import SlotView
from .waitset import Attachment, Event, WaitSet

__all__ = ["Attachment", "Batch", "BatchFrame", "BatchPlane", "Batcher", "DropRecord", "Event", "Listing", "Message",
           "Publisher", "Qos", "Reason", "SlotView", "Subscriber", "SubscriberInfo", "TopicInfo", "TopicStatus", "WaitSet",
           "list_topics"]
