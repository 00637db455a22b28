"""A fake of danger: generations that refuse to die, for the fail-closed tests.

`KEELWAY_TESTING_UNKILLABLE=3,7` makes the supervisor report generations 3 and 7 as
not removable for as long as their process is alive, as a process stuck in the kernel
would be. Unset (always, outside tests), it changes nothing.
"""

from __future__ import annotations

import os


def refuses_to_die(generation_id: int) -> bool:
    raw = os.environ.get("KEELWAY_TESTING_UNKILLABLE", "")
    return str(generation_id) in {part.strip() for part in raw.split(",")}
