"""Pure: is this replica the active one, judged from kopf's peering object the way kopf judges it?

kopf pauses its watch handlers on a standby replica, but the operator's own backstop loop (resync,
requeues) runs outside kopf: it must pause too, or every replica would reconcile and write.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any


def _parse(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


def peering_active(status: dict[str, Any], *, own_priority: int, now: datetime) -> bool:
    """Active when a live peer has our priority (ourselves) and no other live peer has ours or a higher one.

    Equal priorities freeze every replica in kopf, so two live peers with our priority mean: not active.
    """
    live = []
    for info in (status or {}).values():
        try:
            if _parse(str(info["lastseen"])) + timedelta(seconds=int(info.get("lifetime", 60))) > now:
                live.append(int(info.get("priority", 0)))
        except (KeyError, TypeError, ValueError):
            continue
    if any(p > own_priority for p in live):
        return False
    return live.count(own_priority) == 1


def backstop_active(
    peerings: dict[str | None, dict[str, Any] | None], *, own_priority: int, now: datetime
) -> tuple[bool, list[str | None]]:
    """Whether this replica runs the backstop, from the peering object of every namespace kopf watches (``None``: the
    cluster-wide one), and the namespaces whose object is missing.

    kopf pauses a replica when any of its peering objects shows a live peer of a higher (or equal) priority, and a
    missing object pauses nothing (no event ever comes for it): the backstop follows the same rule, so it runs
    exactly where kopf's handlers run. A missing object is an error to report (kopf cannot coordinate replicas
    through it), never a reason to stand by: one namespace's object, deleted with its namespace or by hand, must not
    stop deadlines, TTLs and retries in every other namespace."""
    missing = [ns for ns, obj in peerings.items() if obj is None]
    active = all(
        peering_active((obj or {}).get("status") or {}, own_priority=own_priority, now=now)
        for obj in peerings.values()
        if obj is not None
    )
    return active, missing
