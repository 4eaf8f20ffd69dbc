"""What the provider's triggers share: each serializes as the constructor arguments it keeps under their names."""

from __future__ import annotations

from typing import Any


class SerializedByArguments:
    """Mixin: ``serialize()`` returns the class path and the attributes named in :attr:`ARGUMENTS` (the
    constructor's parameters, kept under the same names), so the triggerer rebuilds the trigger as it was made."""

    ARGUMENTS: tuple[str, ...] = ()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", {
            name: getattr(self, name) for name in self.ARGUMENTS
        }
