"""Why a call failed, machine-readable: the reason the daemon puts in a failed call's trailing metadata.

The status code says what kind of failure it was and the message says it to a person; the reason
lets a program act on it (open the session again, upload the model) without reading the message.
Both sides import these names, so the trailing-metadata contract is written once:

- `rknn-error-reason`: one `Reason` value (absent when the daemon has nothing more to say than the code);
- `rknn-hint-<name>`: facts for the client to word its advice with (e.g. `rknn-hint-board_soc`).

A client reads an unknown reason (from a newer daemon) as none.
"""

from __future__ import annotations

from enum import Enum

REASON_METADATA_KEY = "rknn-error-reason"
HINT_PREFIX = "rknn-hint-"


class Reason(str, Enum):
    # The session id is unknown: released, expired after its idle lease, or the daemon restarted
    # (GetInfo's instance_id tells a restart apart).
    SESSION_NOT_FOUND = "SESSION_NOT_FOUND"
    # The session's worker process was lost (timeout, crash): release it and open another.
    SESSION_BROKEN = "SESSION_BROKEN"
    # The model digest is not in the daemon's cache: upload it first.
    MODEL_NOT_CACHED = "MODEL_NOT_CACHED"
    # The model was built for another SoC than the board's (hints: board_soc, target).
    TARGET_MISMATCH = "TARGET_MISMATCH"
    # A daemon limit or budget was reached; the message names it and its value.
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"
    # Another client holds the board's reservation.
    BOARD_RESERVED = "BOARD_RESERVED"
    # The reservation id is unknown (expired or released).
    RESERVATION_NOT_FOUND = "RESERVATION_NOT_FOUND"
    # A request stream sent nothing for the daemon's stream idle timeout.
    STREAM_IDLE = "STREAM_IDLE"
    # The client speaks an older protocol than the daemon still serves.
    PROTOCOL_TOO_OLD = "PROTOCOL_TOO_OLD"
    # A shared-memory frame's output is larger than the slot given for it; nothing was written.
    OUTPUT_SLOT_TOO_SMALL = "OUTPUT_SLOT_TOO_SMALL"


def parse_reason(value: str | bytes | None) -> Reason | None:
    """The reason a trailing-metadata value names, or None (absent, or unknown to this version)."""
    if value is None:
        return None
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    try:
        return Reason(text)
    except ValueError:
        return None


__all__ = ["HINT_PREFIX", "REASON_METADATA_KEY", "Reason", "parse_reason"]
