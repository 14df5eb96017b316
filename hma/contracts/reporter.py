"""The reporter contract: classes registered under the entry point group ``hma.reporters``,
configured in ``[reporters.<name>]`` (each declares its options; ``enabled`` is always there)."""

from __future__ import annotations

from typing import Any, ClassVar, Mapping, Optional

from hma.contracts.alert import Alert
from hma.contracts.options import Option

GROUP = "hma.reporters"


class Reporter:
    """Base class of reporters."""

    name: ClassVar[str] = ""
    options: ClassVar[Mapping[str, Option]] = {}
    default_enabled: ClassVar[bool] = False

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.config = options

    @classmethod
    def unmet(cls, options: Mapping[str, Any]) -> Optional[str]:
        """What this host lacks for the reporter to run with these options (a missing library,
        say), or None. ``hma config check`` fails on it when the reporter is enabled."""
        return None

    def alert(self, alert: Alert) -> None:
        """Deliver one alert."""

    def publish(self, status: Mapping[str, Any]) -> None:
        """Publish the full status document after a change."""

    def close(self) -> None:
        """Release resources at shutdown."""
