"""eglcuda._resource.Resource's lifetime rules, with releases that only record themselves (no
driver): the order of releases at close() and when the collector frees a reference cycle."""
from __future__ import annotations

import gc
import weakref

from eglcuda._resource import Resource


class Recorded(Resource):
    """A resource whose release appends its name to ``log``."""

    def __init__(self, log: list[str], name: str, parent: Resource | None = None) -> None:
        self._own(log.append, name, parent=parent)


def family(log: list[str]) -> tuple[Recorded, Recorded, Recorded, Recorded]:
    """A display, a stream made from it, and the stream's two endpoints, made in that order."""
    display = Recorded(log, "display")
    stream = Recorded(log, "stream", parent=display)
    consumer = Recorded(log, "consumer", parent=stream)
    producer = Recorded(log, "producer", parent=stream)
    return display, stream, consumer, producer


def test_close_releases_the_children_newest_first_then_the_parent():
    log: list[str] = []
    display, *_ = family(log)
    display.close()
    assert log == ["producer", "consumer", "stream", "display"]


def test_a_cycle_collected_releases_every_child_before_its_parent():
    """The collector finalizes a cycle's objects in the order they were made: a stream dropped
    with its endpoints inside a cycle (a traceback, a list holding itself) must not be destroyed
    before they disconnect."""
    log: list[str] = []
    bag: list[object] = list(family(log))
    bag.append(bag)
    del bag
    gc.collect()
    assert log == ["producer", "consumer", "stream", "display"]


def test_a_child_closed_before_the_cycle_is_released_once():
    log: list[str] = []
    display, stream, consumer, producer = family(log)
    consumer.close()
    bag: list[object] = [display, stream, consumer, producer]
    bag.append(bag)
    del bag, display, stream, consumer, producer
    gc.collect()
    assert log == ["consumer", "producer", "stream", "display"]


def test_a_parent_keeps_no_finalizer_of_a_closed_child():
    """A display's finalizer holds its children's: those of children closed must not pile up."""
    log: list[str] = []
    display = Recorded(log, "display")
    before = len([obj for obj in gc.get_objects() if isinstance(obj, weakref.finalize)])
    for index in range(1000):
        Recorded(log, f"sync {index}", parent=display).close()
    gc.collect()
    after = len([obj for obj in gc.get_objects() if isinstance(obj, weakref.finalize)])
    assert after - before < 20
    display.close()
    assert log[-1] == "display" and len(log) == 1001
