"""``torch.tpu`` streams and events, at ``torch.cuda``'s API.

The device has ONE in-order stream (XLA runs a device's work in dispatch order): every
``Stream()`` is that stream, ``wait_stream``/``wait_event`` are no-ops, ``synchronize`` waits for
all pending device work. These classes are ``torch.Stream``/``torch.Event`` backed by the C++ device
guard in csrc/tpu_native.cpp, so ``torch.Stream(device="tpu")``, ``torch.Event`` and
``torch.accelerator`` see the same objects. A timing event (``enable_timing=True``) waits for the
device when recorded, so ``elapsed_time`` measures finished device work, not dispatch.
"""
from __future__ import annotations

from typing import Any

import torch
from typing_extensions import Self

from . import native


class Stream(torch.Stream):
    """The device's stream (``torch.cuda.Stream``'s API); ``priority`` is accepted and ignored."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Self:
        if kwargs:  # wrapping an existing stream by its ids (stream_id=, device_index=, device_type=)
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, device=_tpu_device(device), priority=priority)

    def wait_event(self, event: torch.Event) -> None:
        event.wait(self)

    def wait_stream(self, stream: torch.Stream) -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event: torch.Event | None = None) -> torch.Event:
        event = Event() if event is None else event
        event.record(self)
        return event


class Event(torch.Event):
    """``torch.cuda.Event``'s API: ``record``/``wait``/``query``/``synchronize``/``elapsed_time``."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> Self:
        return super().__new__(cls, device=torch.device("tpu", 0), enable_timing=enable_timing, blocking=blocking,
                               interprocess=interprocess)

    def record(self, stream: torch.Stream | None = None) -> None:
        super().record(current_stream() if stream is None else stream)

    def wait(self, stream: torch.Stream | None = None) -> None:
        super().wait(current_stream() if stream is None else stream)

    def elapsed_time(self, end_event: torch.Event) -> float:
        native.require("Event.elapsed_time")
        return native.elapsed_time(self, end_event)  # torch.Event's own accepts no subclass


def _tpu_device(device: Any) -> torch.device:
    if device is None or isinstance(device, int):
        index = 0 if device is None else device
        return torch.device("tpu", index)
    return torch.device(device)


def _wrap(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def current_stream(device: Any = None) -> Stream:
    return _wrap(torch.accelerator.current_stream(_tpu_device(device)))


def default_stream(device: Any = None) -> Stream:
    # one stream: the current stream is always the default one
    return current_stream(device)


def set_stream(stream: torch.Stream) -> None:
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """``with torch.tpu.stream(s):`` selects ``s`` (the device's one stream) for the block."""

    def __init__(self, stream: torch.Stream | None):
        self.stream = stream
        self._previous: Stream | None = None

    def __enter__(self) -> torch.Stream | None:
        if self.stream is not None:
            self._previous = current_stream()
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc: object) -> bool:
        if self._previous is not None:
            set_stream(self._previous)
        return False


def stream(stream: torch.Stream | None) -> StreamContext:
    return StreamContext(stream)
