"""The exceptions prx_hooks raises. Their messages are the Rust library's."""

from __future__ import annotations

__all__ = ["Error", "BuildError", "ExtrasError", "BusError", "ClosedError", "ForkError", "DecideError"]


class Error(Exception):
    """Base of every prx_hooks exception (bad argument types are TypeError, as usual)."""


class BuildError(Error):
    """``Hooks(...)`` could not start: an invalid option, a missing workspace, a NATS
    configuration that cannot work, an API address that cannot be bound, a token refused."""


class ExtrasError(Error, ValueError):
    """``extras=`` / ``omit=`` were refused (not one JSON object, a member repeating a
    documented field or another member, too deep, an unknown field to omit). Nothing was
    emitted; the refusal is counted in ``stats()["refused_extras"]``."""


class BusError(Error, ValueError):
    """The bus refused a pattern, a topic or a payload."""


class ClosedError(Error):
    """The hooks have shut down (and the subscription's queue is empty), or the subscription
    was closed."""


class ForkError(Error, RuntimeError):
    """An object made before ``os.fork()`` was used in the child, where its threads do not
    exist. Make a new ``Hooks`` in the child."""


class DecideError(Error, ValueError):
    """``hooks.decide(...)`` could not ask: the payload is not a JSON object, or is larger
    than a decision reads (the limit is named). Nothing was decided; the refusal is counted
    in ``stats()["policies"]``."""
