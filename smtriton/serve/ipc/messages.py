"""Every message between `serve`'s main process and its front workers, declared once.

A worker asks the endpoint's owner (the main process) for what it must not decide alone — the
multi-model API, the stateful sessions, the out-of-memory verdict — and the owner tells every worker
each change it must see before anyone is answered (docs/design.md §3a). Each message is a class here:
its fields are checked by the type checker where it is built and where it is handled, and a
:class:`Call` says the type of its reply. On the wire (:mod:`smtriton.serve.ipc.channel`) a message is
``{"op": <its name>, "args": {<its fields>}}``; nothing else spells an operation by hand.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypedDict, TypeVar, Union

from smtriton.serve.multimodel.records import ModelRecord

R = TypeVar("R")


class UnknownMessage(ValueError):
    """A message whose operation this side does not know (two sides of different versions)."""


@dataclass(frozen=True)
class Message:
    """One message; its subclasses name their operation: ``class Load(Call[None], op="load")``."""

    op: ClassVar[str] = ""

    def __init_subclass__(cls, op: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if op:
            if op in _BY_OP:
                raise TypeError(f"two messages named {op!r}")
            cls.op = op
            _BY_OP[op] = cls

    @classmethod
    def from_wire(cls, op: str, args: dict[str, Any]) -> Message:
        """The message ``op`` with the fields ``args`` (nested records and states rebuilt)."""
        kind = _BY_OP.get(op)
        if kind is None:
            raise UnknownMessage(f"unknown operation {op!r}")
        return kind(**{name: _rebuild(hint, args[name]) for name, hint in _fields(kind).items() if name in args})


@dataclass(frozen=True)
class Call(Message, Generic[R]):
    """A message that gets a reply of type ``R`` (sent as a notice, its reply is not asked for)."""


_BY_OP: dict[str, type[Message]] = {}


_FIELDS: dict[type[Message], dict[str, Any]] = {}


def _fields(kind: type[Message]) -> dict[str, Any]:
    """A message's fields and their types (resolved once per message type)."""
    fields = _FIELDS.get(kind)
    if fields is None:
        hints = typing.get_type_hints(kind)
        fields = _FIELDS[kind] = {field.name: hints[field.name] for field in dataclasses.fields(kind)}
    return fields


def _rebuild(hint: Any, value: Any) -> Any:
    """A field's value from its JSON form: dataclasses (a record, the state) and tuples of them."""
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin is Union or origin is types.UnionType:  # Optional[X]: the one type that is not None
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        origin = typing.get_origin(hint)
    if origin is tuple:
        item = typing.get_args(hint)[0]
        return tuple(_rebuild(item, element) for element in value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint(**value)
    return value


# ----- the state a worker answers from ------------------------------------------------------------------


@dataclass(frozen=True)
class EndpointState:
    """What a worker needs to answer without asking: sent to every worker whenever it changes."""

    healthy: bool  # what /ping answers: 200 or 503
    serving: bool  # requests may go to Triton
    reason: str  # why not, while not serving (the 503's message)
    http_port: int | None  # Triton's loopback ports, new after each restart
    grpc_port: int | None
    decoupled: bool = False  # the SME model streams its responses
    generation: int = 0  # which Triton: the count of tritonserver processes started (a new one after each death)
    # Not serving now, but a Triton that served is being restarted (its models to come back): a request may
    # wait for it. False before the first Triton served, once a model failed, and while stopping: 503 at once.
    returning: bool = False
    # The value Triton's restricted APIs (model config, repository, shared memory) want; never shown.
    triton_key: str | None = field(default=None, repr=False)


STARTING = EndpointState(False, False, "Triton is starting", None, None)


# ----- from the main process to a worker ---------------------------------------------------------------


@dataclass(frozen=True)
class Hello(Message, op="hello"):
    """A worker's first message: who it is, the settings, the state and the models it may invoke."""

    index: int
    settings: dict[str, Any]  # Settings.model_dump(mode="json")
    default_model: str | None
    state: EndpointState
    models: tuple[ModelRecord, ...]


@dataclass(frozen=True)
class StateChanged(Message, op="state"):
    state: EndpointState


@dataclass(frozen=True)
class ModelAdded(Call[None], op="model_added"):
    """A model was loaded: invokes may reach it (answered once the worker recorded it)."""

    record: ModelRecord


@dataclass(frozen=True)
class ModelDraining(Call[None], op="model_draining"):
    """A model is being unloaded: 404 for new invokes; answered once the running ones finished (or
    ``seconds`` passed)."""

    name: str
    seconds: float


@dataclass(frozen=True)
class ModelRemoved(Call[None], op="model_removed"):
    """A model is gone: it could not be restored after Triton restarted, or its load failed while it
    was being announced (some workers had recorded it)."""

    name: str


@dataclass(frozen=True)
class Heartbeat(Call[None], op="heartbeat"):
    """Answered by the worker's event loop: one that does not answer in time is frozen or stuck."""


# ----- from a worker to the main process ---------------------------------------------------------------


@dataclass(frozen=True)
class LoadModel(Call[None], op="load"):
    body: str  # the load request's body, latin-1 (any bytes cross as they came)
    target: str | None  # X-Amzn-SageMaker-Target-Model


@dataclass(frozen=True)
class UnloadModel(Call[None], op="unload"):
    name: str
    target: str | None


@dataclass(frozen=True)
class ListModels(Call[dict[str, Any]], op="list"):
    token: str | None
    limit: str | None


@dataclass(frozen=True)
class DescribeModel(Call[dict[str, str]], op="describe"):
    name: str


@dataclass(frozen=True)
class InvokeFailed(Call[bool], op="invoke_failed"):
    """An MME invoke failed: was it out of memory (507)? ``status`` is Triton's answer; ``oom_kills``
    the OOM killer's count in this cgroup when the invoke began (None: no count here)."""

    message: str
    status: int
    oom_kills: int | None


class OpenedSession(TypedDict):
    id: str
    sequence_id: int
    expires: str  # SageMaker's form of the time it expires


class UsedSession(TypedDict):
    sequence_id: int
    start: bool  # the request starts the sequence (no request of the session was answered yet)


@dataclass(frozen=True)
class OpenSession(Call[OpenedSession], op="session_open"):
    model: str  # the Triton model the session is a sequence of


@dataclass(frozen=True)
class UseSession(Call[UsedSession], op="session_use"):
    session: str
    model: str


@dataclass(frozen=True)
class CloseSession(Call[None], op="session_close"):
    """The caller closes its session (400 unless open for ``model``), or with ``any_model`` the front
    closes it after the request that ended it."""

    session: str
    model: str
    any_model: bool = False


@dataclass(frozen=True)
class SessionAnswered(Call[None], op="session_answered"):
    """The model answered a request of the session: its sequence has started."""

    session: str


@dataclass(frozen=True)
class Probation(Call[bool], op="probation"):
    """A worker would send again a request that was in flight when Triton died, now that a Triton
    serves: answered True when no other such request runs anywhere on the endpoint, so that a request
    whose Triton dies again while it runs alone on probation is the one that killed it (False: the turn
    was given back before it came). ``worker`` (its process id) and ``ticket`` (its own count) name the
    turn, so that the worker can give it back before it comes, and the owner with a worker that died."""

    worker: int
    ticket: int


@dataclass(frozen=True)
class ProbationOver(Call[None], op="probation_over"):
    """The turn is over: its request was answered or failed, or no longer waits for it (its client
    left, its timeout passed). Sent as a notice."""

    worker: int
    ticket: int
