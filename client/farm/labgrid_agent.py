"""The one piece of rknn_client that runs on labgrid's interpreter: it talks to the coordinator.

rknn_client never imports this module. `rknn_client.farm.labgrid_farm` runs it as a script on the
Python that `labgrid-client` runs on, so labgrid needs no place in rknn_client's environment (nor
its pins). It imports only the standard library and labgrid's client API (`start_session`, the
coordinator's gRPC messages), and answers in JSON on stdout:

    labgrid_agent.py list COORDINATOR CLS[,CLS ...] [KEY=VALUE ...]
        one JSON list: every place whose tags match, with the exporter, class and parameters of each
        resource of those classes it matches.
    labgrid_agent.py hold COORDINATOR PRIO [KEY=VALUE ...]
        reserves a place by the filter (labgrid's tags, `name=PLACE` for one place) with priority
        PRIO, waits in the coordinator's queue, locks the place the coordinator allocated; one JSON
        line per step: {"token"}, {"acquired": PLACE}. Then it holds the place until its stdin
        closes (a line or EOF: the parent gave it back, or died), cancels the reservation and
        unlocks the place. {"error"} and exit status 1 when it cannot.

Labgrid keeps a lock for as long as nobody unlocks it, even after its client died; this process
is that someone for a run: it outlives a killed run (its own session, so a Ctrl-C meant for the
run does not reach it) and gives the place back when its stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

POLL_S = 1.0  # how often a waiting reservation is polled (labgrid-client's `wait` polls as often)
ANSWERS = sys.stdout  # ours only: main() sends whatever labgrid prints to stderr


def emit(**message: Any) -> None:
    print(json.dumps(message), file=ANSWERS, flush=True)


def tag_filter(pairs: list[str]) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in pairs)


def matching_places(session: Any, classes: set[str], tags: dict[str, str]) -> list[dict[str, Any]]:
    """Places whose tags include `tags`, each with the resources of `classes` it matches."""
    found = []
    for name, place in sorted(session.places.items()):
        if any(place.tags.get(k) != v for k, v in tags.items()):
            continue
        resources = [
            {"exporter": exporter, "cls": resource.cls, "params": resource.args}
            for exporter, groups in sorted(session.resources.items())
            for group_name, group in sorted(groups.items())
            for resource_name, resource in sorted(group.items())
            if resource.cls in classes and place.hasmatch((exporter, group_name, resource.cls, resource_name))
        ]
        found.append({"place": name, "tags": dict(place.tags), "resources": resources})
    return found


async def hold(session: Any, prio: float, tags: dict[str, str]) -> None:
    from labgrid.remote.common import Reservation, ReservationState
    from labgrid.remote.generated import labgrid_coordinator_pb2 as pb2

    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    given_back = asyncio.ensure_future(stdin.readline())
    request = pb2.CreateReservationRequest(filters={"main": pb2.Reservation.Filter(filter=tags)}, prio=prio)
    token = (await session.stub.CreateReservation(request)).reservation.token
    emit(token=token)
    locked = False
    try:
        while True:
            polled = await session.stub.PollReservation(pb2.PollReservationRequest(token=token))
            reservation = Reservation.from_pb2(polled.reservation)
            if reservation.state is ReservationState.allocated:
                (place,) = reservation.allocations["main"]
                break
            if reservation.state is not ReservationState.waiting:
                raise RuntimeError(f"reservation {token} for {tags} is {reservation.state.name}")
            await asyncio.wait([given_back], timeout=POLL_S)
            if given_back.done():
                return
        await session.stub.AcquirePlace(pb2.AcquirePlaceRequest(placename=place))
        locked = True
        emit(acquired=place)
        await given_back
    finally:
        # The reservation goes first: the coordinator hands a place to the next reservation waiting
        # on a scheduling pass that finds it neither locked nor reserved, each of these calls makes
        # one, and a pass sees the place of a reservation just cancelled as still reserved. So
        # unlocking last gets the waiter served at once; cancelling last would leave it to the
        # periodic pass, up to 15 s later.
        try:
            await session.stub.CancelReservation(pb2.CancelReservationRequest(token=token))
        finally:
            if locked:
                await session.stub.ReleasePlace(pb2.ReleasePlaceRequest(placename=place))


def main(argv: list[str]) -> int:
    import grpc
    from labgrid.remote.client import start_session

    sys.stdout = sys.stderr
    command, coordinator, subject, *pairs = argv
    try:
        session = start_session(coordinator)
        if command == "list":
            places = matching_places(session, set(subject.split(",")), tag_filter(pairs))
            print(json.dumps(places), file=ANSWERS, flush=True)
        else:
            session.loop.run_until_complete(hold(session, float(subject), tag_filter(pairs)))
    except Exception as exc:  # the parent reads every failure from stdout
        why = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
        emit(error=f"{type(exc).__name__}: {why}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
