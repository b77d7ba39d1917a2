"""One toolkit connection: the open handshake, then one request at a time until the client hangs up.

A connection holds at most one session (the model of its last MsgLoad); it is released on MsgUnload,
on a new MsgLoad and whenever the connection ends, however it ends. A refused request is answered as
Rockchip's rknn_server answers it: its ack with an error code (the reason goes to the log). A crash
report goes out only when a session's worker really crashed: after one during a run the toolkit runs
`killall rknn_server` and starts /usr/bin/rknn_server, which would take down every client. Its
sessions belong to the connecting user (`uid:N`, the identity gRPC gives a tokenless local caller);
every read waits at most the listener's idle deadline, and a message is held in memory only once
its size passed its limit and the daemon's memory budget (a model is streamed: legacy/intake.py).
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import structlog

from rknn_proto.codec import TensorLimits
from rknn_proto.messages import EvalMemoryResponse, TensorAttr
from rknn_server import __version__
from rknn_server.config.limits import TOOLKIT, DoorLimits
from rknn_server.core.data_plane import DataPlane, OpenRequest
from rknn_server.core.sessions import Session
from rknn_server.errors import InvalidInput, ResourceExhausted, status_of
from rknn_server.kit.connections import Gate, IdleTimeout
from rknn_server.observe.calls import Call, Recorder
from rknn_server.protocols.legacy import layouts, messages, wire
from rknn_server.protocols.legacy.intake import ModelIntake
from rknn_server.protocols.legacy.layouts import Layout
from rknn_server.protocols.legacy.wire import COMMAND_NAMES, Command, Header, ProtocolError
from rknn_server.runtime.base import InputError, InputFormat, InputShapes, WorkerLost

log = structlog.get_logger("rknn_server.legacy")
# Ioctl subcommands the client sends while loading a model (answered in the loading layout) ...
MODEL_INFO = 0
INPUT_DYNAMIC_RANGE = 7
# ... and after it (answered in the reader-thread layout; 4 = precompile and 6 = dump are refused).
PERF_DETAIL = 1
PERF_RUN = 2
MEMORY_DETAIL = 3
# The client's ack codes (its __ack_to_str table).
ACK_SUCC = 0
ACK_FAIL = 1
ACK_INVALD_INPUT = 3
ACK_IOCTL_UNKNOWN_CMD = 7
ACK_UNSUPPORT_SET_CORE = 9
ACK_INVALID_DYNAMIC_INPUT_RANGE = 10
# The ack that answers each request (a refused one carries ACK_FAIL at 0x6c), and those acks' sizes.
_ACKS = {
    Command.VERSION: Command.VERSION_ACK,
    Command.LOAD: Command.LOAD_ACK,
    Command.SET_CORE: Command.SET_CORE_ACK,
    Command.UNLOAD: Command.UNLOAD_ACK,
    Command.SET_INPUT_SHAPE: Command.SET_INPUT_SHAPE_ACK,
}
_BARE_ACKS = frozenset({Command.UNLOAD_ACK, Command.SET_INPUT_ACK})
# The most a request other than a model load or inputs may be (the largest seen is 0xb4f0 bytes).
SMALL_MESSAGE_BYTES = 0x10000
_MODEL_SIZE = struct.Struct("<I")
_LOAD_HEADER_BYTES = 0x70
_READ_BYTES = 1 << 20
_REQUESTS = frozenset(_ACKS) | {Command.IOCTL, Command.MULTI_INPUT, Command.RUN}
# The client (2.5.0's librknn_api; 2.3.2's is the same code) reads the answers to VERSION, LOAD and
# the MODEL_INFO and INPUT_DYNAMIC_RANGE ioctls itself while loading. Every later answer is taken by
# its reader thread, which signals a condition variable that rknn_run, rknn_query (the other ioctls),
# rknn_set_core_mask, rknn_set_input_shapes and rknn_destroy wait on only after they sent the request,
# waiting before they look whether the answer already came: one that arrives in between is lost and
# the toolkit fails with "Run timeout" minutes later. That gap is a few instructions, unless the
# client's thread is preempted right after its send (then it is as long as the CPU is taken); so no
# answer its reader thread takes leaves sooner than this after its request. Measured with the real
# toolkit on two cores loaded about fivefold (two busy loops beside other work), misses per
# inference: at once 1/475, 1 ms 1/1190, 2 ms 1/6470, 3 ms 1/3020, 5 ms 0/8000, 10 ms 0/4000.
MIN_TURNAROUND_S = 0.005


def _reader_thread_takes(header: Header, message: memoryview) -> bool:
    """Whether the client takes this request's answer on its reader thread (see MIN_TURNAROUND_S)."""
    if header.command in (Command.VERSION, Command.LOAD):
        return False
    if header.command == Command.IOCTL and len(message) >= wire.HEADER_BYTES + 4:
        (subcommand,) = struct.unpack_from("<I", message, wire.HEADER_BYTES)
        return subcommand not in (MODEL_INFO, INPUT_DYNAMIC_RANGE)
    return True


@dataclass(frozen=True)
class LegacyLimits:
    tensors: TensorLimits
    max_model_bytes: int
    max_inputs_bytes: int
    connections: DoorLimits = TOOLKIT  # the listener's caps and idle deadline


class OtherRelease(InvalidInput):
    """A request of a size another toolkit release sends: answered by a crash report, the one message
    such a client reads whatever its structs (see `LegacyConnection._check_release`)."""


def memory_text(memory: EvalMemoryResponse) -> str:
    """The memory detail as the real server writes it and the toolkit parses it (other = total - the two)."""
    return (
        f"Total Weight Memory  : {memory.weight_memory}\n"
        f"Total Internal Memory: {memory.internal_memory}\n"
        f"Total Memory: {memory.total_memory}\n"
    )


@dataclass(frozen=True)
class Door:
    """What the connections of one listener share: its limits, layout, gate, intake, recorder and the
    context ids its LOAD acks assign (1, 2, 3 ... per daemon lifetime, as the real server's)."""

    plane: DataPlane
    layout: Layout
    limits: LegacyLimits
    gate: Gate
    intake: ModelIntake
    recorder: Recorder
    contexts: Iterator[int] = field(default_factory=lambda: itertools.count(1))


class LegacyConnection:
    def __init__(
        self,
        door: Door,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        name: str,
        identity: str,
    ) -> None:
        self.plane = door.plane
        self.recorder = door.recorder
        self.layout = door.layout
        self.limits = door.limits
        self.gate = door.gate
        self.intake = door.intake
        self.contexts = door.contexts
        self.reader = reader
        self.writer = writer
        self.name = name
        self.owner = identity
        self.session: Session | None = None
        self.context = wire.NO_CONTEXT  # the id the LOAD ack of `session` assigned
        self.inputs: tuple[list[np.ndarray], list[InputFormat]] | None = None
        # The session's inputs' shapes as its runtime declares them, the inputs with those dims, and
        # the inputs and outputs as the client now knows them (declared, then its last MsgSetInputShape's).
        self.shapes: list[InputShapes] = []
        self.declared: list[TensorAttr] = []
        self.current: tuple[list[TensorAttr], list[TensorAttr]] = ([], [])
        self.input_error: Exception | None = None
        self.inputs_bytes = 0  # of the inputs received for the next run, counted in that run's record
        self.frames = itertools.count(0)
        self.last_run_us = 0.0
        self.finished = False
        self.unread = 0  # bytes of the current MsgLoad left in the stream (a model not yet taken in)

    async def serve(self) -> None:
        try:
            request = wire.OpenRequest.parse(await self._read(wire.OPEN_BYTES, "the open request"))
            log.info(
                "legacy_client_connected",
                place=self.name,
                client=self.owner,
                pid=request.pid,
                device=request.device_id,
            )
            self.writer.write(wire.OPEN_ACCEPTED)
            while not self.finished:
                header, message = await self._receive()
                await self._dispatch(header, message)
                await self.writer.drain()
                # A model refused before (or failed while) it was read is read to its end after the
                # ack (the toolkit sends all of it before it reads the ack), never held.
                while self.unread:
                    await self._read_model(_READ_BYTES)
        except EOFError as exc:
            log.info("legacy_client_gone", place=self.name, detail=str(exc))
        except IdleTimeout as exc:
            log.info("legacy_client_idle", place=self.name, client=self.owner, detail=str(exc))
        except ProtocolError as exc:  # the real server ignores such frames; this one hangs up
            log.warning("legacy_protocol_error", place=self.name, error=str(exc))
        except (ConnectionError, asyncio.CancelledError):
            log.info("legacy_client_gone", place=self.name)
        finally:
            await self._release("legacy client disconnected")
            self.writer.close()

    async def _read(self, count: int, what: str) -> bytes:
        """Exactly `count` bytes, each wait for them bounded by the idle deadline (bytes that came
        already are taken without one: a deadline costs a task and a timer per read)."""
        if _buffered(self.reader) >= count:
            return await self.reader.readexactly(count)
        return await self.gate.within(_read_exactly(self.reader, count, what), what)

    async def _read_some(self, most: int, what: str = "the model") -> bytes:
        """Up to `most` bytes of a message body, as they come (a model is streamed with it)."""
        if _buffered(self.reader):
            data = await self.reader.read(most)
        else:
            data = await self.gate.within(self.reader.read(most), f"bytes of {what}")
        if not data:
            raise EOFError(f"the client hung up in the middle of {what}")
        return data

    async def _read_model(self, most: int) -> bytes:
        """Up to `most` bytes of the MsgLoad body left in the stream, counted off `unread`."""
        data = await self._read_some(min(most, self.unread))
        self.unread -= len(data)
        return data

    async def _read_into(self, view: memoryview, what: str) -> None:
        """Fill `view` piece by piece (never a second copy of a whole message)."""
        done = 0
        while done < len(view):
            data = await self._read_some(min(len(view) - done, _READ_BYTES), what)
            view[done : done + len(data)] = data
            done += len(data)

    async def _receive(self) -> tuple[Header, memoryview]:
        """One message, its size checked against the limit of its command before it is read; of a
        MsgLoad only the part up to the model size is read (the model is streamed by `_load`, or read
        to its end when refused: it is never held)."""
        length = wire.parse_length(await self._read(wire.LENGTH_BYTES, "the next request"))
        if length < wire.HEADER_BYTES:
            raise ProtocolError(
                f"a frame of {length} bytes; every message has a {wire.HEADER_BYTES}-byte header"
            )
        head = await self._read(wire.HEADER_BYTES, "a message header")
        header = Header.parse(head)
        if header.command not in _REQUESTS:
            raise ProtocolError(f"command {header.command} (a message of {length} bytes) is not a request")
        most = self._most(header.command)
        if length > most:
            raise ProtocolError(
                f"a {COMMAND_NAMES[header.command]} message of {length} bytes; the limit for it is {most} bytes"
            )
        if header.command == Command.LOAD and length < _LOAD_HEADER_BYTES:
            raise ProtocolError(f"a LOAD message of {length} bytes; the model size follows its header")
        if header.context != self.context and header.command not in (Command.VERSION, Command.LOAD):
            # The real server never answers it (the client would wait forever): this side hangs up.
            raise ProtocolError(
                f"a request for context {header.context}; this connection's is {self.context}"
            )
        log.debug("legacy_request", place=self.name, command=COMMAND_NAMES[header.command], size=length)
        self.unread = length - _LOAD_HEADER_BYTES if header.command == Command.LOAD else 0
        message = np.empty(length - self.unread, np.uint8)
        try:
            self.plane.frame_memory.hold([message], f"a {COMMAND_NAMES[header.command]} message")
        except ResourceExhausted as exc:  # its body stays unread: the connection ends after the report
            raise ProtocolError(str(exc)) from None
        view = message.data.cast("B")
        view[: wire.HEADER_BYTES] = head
        await self._read_into(view[wire.HEADER_BYTES :], "a message body")
        return header, view

    def _most(self, command: int) -> int:
        if command == Command.LOAD:  # streamed, never held: its model size is checked by the intake
            return 0xFFFFFFFF
        if command == Command.MULTI_INPUT:
            return self.layout.input_data_at + self.limits.max_inputs_bytes
        return SMALL_MESSAGE_BYTES

    async def _dispatch(self, header: Header, message: memoryview) -> None:
        command = header.command
        if command == Command.MULTI_INPUT:  # the client waits for no answer, unless they contradict the model
            self.inputs_bytes = len(message)
            if isinstance(self._take_inputs(message), messages.InputMismatch):
                self.writer.write(wire.frame(self._ack(Command.SET_INPUT_ACK, header, ACK_INVALD_INPUT)))
            return
        # Recorded like a gRPC call (calls.py): the metrics and one `rpc` event per answered request.
        call = Call(f"legacy.{COMMAND_NAMES[command]}", self.owner)
        call.bytes_in, self.inputs_bytes = len(message) + self.unread + self.inputs_bytes, 0
        outcome = "OK"
        try:
            answer = await self._answer(header, message)
        except Exception as exc:
            code, text = status_of(exc)
            outcome = code.name
            log.warning("legacy_request_failed", place=self.name, command=COMMAND_NAMES[command], error=text)
            answer = self._refusal(header, message, exc, text)
        if _reader_thread_takes(header, message):
            await asyncio.sleep(MIN_TURNAROUND_S - (time.perf_counter() - call.start))
        self.writer.write(wire.frame(answer))
        call.session = self.session.id if self.session is not None else ""
        call.bytes_out = len(answer)
        self.recorder.done(call, outcome)

    async def _answer(self, header: Header, message: memoryview) -> bytearray:
        command = header.command
        self._check_release(command, len(message))
        if command == Command.VERSION:
            return self._version(header)
        if command == Command.LOAD:
            context = next(self.contexts)  # a refused load uses up its id too, as Rockchip's server's does
            await self._load(header, message)
            self.context = context
            return self._ack(Command.LOAD_ACK, header)
        if command == Command.IOCTL:
            (subcommand,) = struct.unpack_from("<I", message, wire.HEADER_BYTES)
            if subcommand in (MODEL_INFO, INPUT_DYNAMIC_RANGE):
                return self._ioctl(header, subcommand)
            return await self._run_ioctl(header, subcommand)
        if command == Command.RUN:
            return await self._run(header)
        if command == Command.SET_CORE:
            return await self._set_core(header, message)
        if command == Command.UNLOAD:
            # The client closes its end without waiting and then joins its reader thread, which only
            # returns when this side hangs up: so the connection ends here.
            answer = self._ack(Command.UNLOAD_ACK, header)
            await self._release("unloaded by the toolkit")
            self.finished = True
            return answer
        return await self._set_input_shapes(header, message)  # the last request left

    def _refusal(self, header: Header, message: memoryview, exc: Exception, text: str) -> bytearray:
        """The answer to a refused request: the ack it waits for, with ACK_FAIL, as the real server
        answers; a crash report only for a worker that really crashed (the toolkit then restarts the
        board's daemon) and for a client of another release (which would misread any ack)."""
        command = header.command
        if isinstance(exc, (WorkerLost, OtherRelease)):
            return self._crash(header, text)
        if command == Command.RUN:
            refused = isinstance(exc, (InvalidInput, ResourceExhausted, InputError))
            return self._finish(header, [], ACK_INVALD_INPUT if refused else ACK_FAIL)
        if command == Command.IOCTL:
            (subcommand,) = struct.unpack_from("<I", message, wire.HEADER_BYTES)
            return self._ioctl_ack(header, ACK_FAIL, subcommand, bytes(self._loading_length(subcommand)))
        return self._ack(_ACKS[Command(command)], header, ACK_FAIL)

    def _check_release(self, command: int, size: int) -> None:
        """A request of another size than this layout's comes from a toolkit release with other structs:
        answering it would be misread (the client checks every ack's size), so it is refused, saying how."""
        expected = self.layout.request_bytes(command)
        if expected is None or size == expected:
            return
        known = ", ".join(layouts.RELEASES)
        what = f"this toolkit sends a {COMMAND_NAMES[command]} request of {size} bytes; RKNN-Toolkit2 {self.layout.toolkit} sends {expected}"
        matching = layouts.releases_sending(command, size)
        if matching:
            raise OtherRelease(
                f"{what} and {', '.join(matching)} send {size}: start the daemon with "
                f"--legacy-toolkit-version {matching[-1]}"
            )
        raise OtherRelease(
            f"{what}: this daemon speaks the protocol of RKNN-Toolkit2 {known} only. Install one of those on the "
            f"PC (pip install rknn-toolkit2=={layouts.DEFAULT_VERSION}), or upgrade rknn-server-oss to a release "
            "that knows this toolkit"
        )

    def _ack(self, command: Command, header: Header, ack: int = ACK_SUCC) -> bytearray:
        """A fixed-size ack with its code at 0x6c."""
        size = self.layout.bare_ack_bytes if command in _BARE_ACKS else self.layout.short_ack_bytes
        answer = wire.build(command, header, size, self.context)
        struct.pack_into("<I", answer, wire.HEADER_BYTES, ack)
        return answer

    def _crash(self, header: Header, text: str) -> bytearray:
        answer = wire.build(Command.CRASH, header, self.layout.crash_bytes, self.context)
        body = f"rknn_server (rknn-server-oss {__version__}): {text}".encode("utf-8", "replace")
        room = self.layout.crash_bytes - self.layout.text_at - 1
        answer[self.layout.text_at : self.layout.text_at + min(len(body), room)] = body[:room]
        return answer

    def _version(self, header: Header) -> bytearray:
        answer = self._ack(Command.VERSION_ACK, header)
        # The toolkit refuses a server whose first version number is below its own: claim the protocol
        # level this layout speaks, and name what really answers in the parentheses.
        api = self.plane.backend.version().api  # e.g. "librknnrt 2.3.2 (build)"
        kind, _, rest = api.partition(" ")
        runtime = f"{rest} [{kind}]" if rest[:1].isdigit() else api
        text = (
            f"rknn_server: {self.layout.toolkit} (rknn-server-oss {__version__}, {self.plane.backend.name} "
            f"runtime)\nrknnrt: {runtime}"
        )
        data = text.encode("utf-8", "replace")[: self.layout.version_text_bytes - 1]
        answer[self.layout.text_at : self.layout.text_at + len(data)] = data
        return answer

    async def _load(self, header: Header, message: memoryview) -> None:
        """Take in the model the message carries (its size checked before its bytes are read), then
        open it in this connection's session."""
        (size,) = _MODEL_SIZE.unpack_from(message, wire.HEADER_BYTES)
        carried = self.unread
        await self._release("replaced by a new model")
        if size > carried:
            raise InvalidInput(
                f"the model is {size} bytes but this message carries {carried}; models sent in parts "
                "are not supported by this daemon yet"
            )
        self.intake.check(size)
        digest = await self.intake.receive(self._read_model, size, carried - size, self.owner)
        self.session = await self.plane.open(
            OpenRequest(
                digest=digest,
                owner=self.owner,
                target=self.plane.backend.soc(),
                perf_debug=bool(header.flags & wire.FLAG_COLLECT_PERF),
                eval_mem=bool(header.flags & wire.FLAG_COLLECT_MEMORY),
            )
        )
        await self._describe()
        log.info("legacy_model_loaded", place=self.name, session=self.session.id[:12], model=digest[:12])

    def _loaded(self) -> Session:
        if self.session is None:
            raise InvalidInput("no model is loaded on this connection; call load_rknn and init_runtime first")
        return self.plane.session(self.session.id, self.owner)

    def _loading_length(self, subcommand: int) -> int:
        """The data length the client compiled for a query it sends while loading."""
        if subcommand == MODEL_INFO:
            return self.layout.model_info_bytes
        return self.layout.dynamic_range_bytes

    def _ioctl_ack(self, header: Header, ack: int, subcommand: int, data: bytes | bytearray) -> bytearray:
        """An ioctl ack: code, subcommand, u64 data length, the data, and one more byte (as the real
        server sends every ioctl ack)."""
        at = self.layout.ioctl_data_at
        answer = wire.build(Command.IOCTL_ACK, header, at + len(data) + 1, self.context)
        struct.pack_into("<IIQ", answer, wire.HEADER_BYTES, ack, subcommand, len(data))
        answer[at : at + len(data)] = data
        return answer

    async def _describe(self) -> None:
        """Learn what the client is told of the new session's model: Rockchip's server describes each
        input by the dims the runtime's input attribute gives (a dynamic input's too), and lists the
        shapes of a dynamic one."""
        session = self._loaded()
        self.shapes = await self.plane.in_session(session, session.runtime.input_shapes)
        self.declared = [
            replace(spec, shape=shapes.declared)
            for spec, shapes in zip(session.runtime.inputs, self.shapes, strict=True)
        ]
        self.current = (self.declared, list(session.runtime.outputs))

    def _ioctl(self, header: Header, subcommand: int) -> bytearray:
        session = self._loaded()
        answer = self._ioctl_ack(header, ACK_SUCC, subcommand, bytes(self._loading_length(subcommand)))
        # The packers write at message offsets (the data starts at ioctl_data_at).
        if subcommand == MODEL_INFO:
            messages.pack_model_info(answer, self.layout, self.declared, session.runtime.outputs)
        else:
            messages.pack_dynamic_ranges(answer, self.layout, session.runtime.inputs, self.shapes)
        return answer

    async def _set_input_shapes(self, header: Header, message: memoryview) -> bytearray:
        """Inference on a dynamic-shape model: the client first sends each input's shape. The runtime
        switches to them, and the ack carries the inputs' and outputs' attributes at those shapes, which
        the client checks its inputs and the outputs against from then on. A shape the model does not
        take is ack 10 (ACK_INVALID_DYNAMIC_INPUT_RANGE), the attributes it was sent and the outputs'
        unchanged, as Rockchip's server answers; the runtime stays at its previous shapes."""
        session = self._loaded()
        shapes = messages.unpack_input_shapes(message, self.layout, session.runtime.inputs)
        answer = wire.build(Command.SET_INPUT_SHAPE_ACK, header, self.layout.shape_ack_bytes, self.context)
        try:
            self.current = await self.plane.in_session(session, session.runtime.set_input_shapes, shapes)
            messages.pack_attrs(answer, self.layout, self.layout.shape_ack_inputs_at, self.current[0])
        except InputError as exc:
            log.warning("legacy_input_shapes_refused", place=self.name, shapes=shapes, error=str(exc))
            struct.pack_into("<I", answer, wire.HEADER_BYTES, ACK_INVALID_DYNAMIC_INPUT_RANGE)
            messages.echo_input_shapes(answer, self.layout, message)
        messages.pack_attrs(answer, self.layout, self.layout.shape_ack_outputs_at, self.current[1])
        return answer

    async def _run_ioctl(self, header: Header, subcommand: int) -> bytearray:
        """A query after loading. Its waiter in the client wakes only on an ioctl ack, never on a crash
        report, so a failure is an ack with an error code (and the reason goes to the log)."""
        value, text, ack = 0, b"", ACK_SUCC
        try:
            session = self._loaded()
            if subcommand == PERF_RUN:
                value = round(self.last_run_us)
            elif subcommand == PERF_DETAIL:  # u64 strlen, the text, its NUL
                # The protocol carries no fix_freq: measured as the board runs (the real server's).
                text = (await self.plane.perf(session, fix_freq=False)).raw_text.encode() + b"\0"
                value = len(text) - 1
            elif subcommand == MEMORY_DETAIL:  # u64 1024, the text in a 1 KiB buffer, a NUL
                value = self.layout.memory_text_bytes
                memory = memory_text(await self.plane.memory_of(session)).encode()
                text = memory[: value - 1].ljust(value + 1, b"\0")
            else:
                ack = ACK_IOCTL_UNKNOWN_CMD
                log.warning("legacy_ioctl_unsupported", place=self.name, subcommand=subcommand)
        except Exception as exc:
            ack = ACK_FAIL
            log.warning(
                "legacy_ioctl_failed", place=self.name, subcommand=subcommand, error=status_of(exc)[1]
            )
        return self._ioctl_ack(header, ack, subcommand, struct.pack("<Q", value) + text)

    async def _set_core(self, header: Header, message: memoryview) -> bytearray:
        """init_runtime(core_mask=...) after the load: the session is reopened with that mask (a
        runtime takes its core mask when it loads). A refused mask is an error ack, as the client waits."""
        (mask,) = struct.unpack_from("<I", message, wire.HEADER_BYTES)
        session = self._loaded()
        answer = self._ack(Command.SET_CORE_ACK, header)
        if mask == session.options.core_mask:
            return answer
        try:
            options, context = session.options, self.context
            await self._release("reopened with another core mask")
            self.context = context  # the client keeps the id of its load
            self.session = await self.plane.open(
                OpenRequest(
                    digest=session.digest,
                    owner=self.owner,
                    target=options.target,
                    perf_debug=options.perf_debug,
                    eval_mem=options.eval_mem,
                    core_mask=mask,
                )
            )
            await self._describe()
        except Exception as exc:
            struct.pack_into("<I", answer, wire.HEADER_BYTES, ACK_UNSUPPORT_SET_CORE)
            log.warning("legacy_core_mask_refused", place=self.name, mask=mask, error=status_of(exc)[1])
        return answer

    def _take_inputs(self, message: memoryview) -> Exception | None:
        """Keep the inputs for the next MsgRun, or why they are refused (answered in its MsgFinish).

        Only inputs that contradict the model (InputMismatch) also get the real server's MSG_SET_INPUT_ACK
        at once: after one the toolkit fails the run with RKNN_ERR_RUNTIME_ABORT and kills the board's
        daemon, but it never sends such inputs itself (it checks them first). Inputs it sends in good
        faith and this daemon still refuses (its limits, a dynamic shape) fail only the run."""
        self.inputs, self.input_error = None, None
        try:
            self._loaded()
            self.inputs = messages.unpack_inputs(message, self.layout, self.current[0], self.limits.tensors)
        except Exception as exc:
            self.input_error = exc
            log.warning("legacy_inputs_refused", place=self.name, error=status_of(exc)[1])
        return self.input_error

    async def _run(self, header: Header) -> bytearray:
        session = self._loaded()
        inputs, error = self.inputs, self.input_error
        self.inputs, self.input_error = None, None
        if error is not None:
            raise error
        if inputs is None:
            raise InvalidInput("inference without inputs: the run came before any MsgMultiInput")
        arrays, formats = inputs
        ran = await self.plane.run(session, arrays, formats)  # timed: the per-model metrics count it
        self.last_run_us = ran.run_time_us
        native = messages.native_outputs(ran.outputs, self.current[1])
        if len(native) > self.layout.max_tensors:
            raise ResourceExhausted(
                f"the model has {len(native)} outputs; the protocol carries at most {self.layout.max_tensors}"
            )
        return self._finish(header, native, ACK_SUCC)

    def _finish(self, header: Header, outputs: list[np.ndarray], result: int) -> bytearray:
        """The answer to a MsgRun: frame id (from 0), result, the outputs."""
        size = self.layout.finish_data_at + sum(a.nbytes for a in outputs)
        answer = wire.build(Command.FINISH, header, size, self.context)
        struct.pack_into("<QII", answer, wire.HEADER_BYTES, next(self.frames), result, len(outputs))
        messages.pack_outputs(answer, self.layout, outputs)
        return answer

    async def _release(self, reason: str) -> None:
        session, self.session = self.session, None
        self.context = wire.NO_CONTEXT
        self.inputs = None
        self.shapes, self.declared, self.current = [], [], ([], [])
        if session is not None:
            try:
                await self.plane.close(session.id, self.owner)
                log.info("legacy_session_released", session=session.id[:12], reason=reason)
            except Exception as exc:  # expired meanwhile: nothing left to free
                log.info("legacy_release_skipped", session=session.id[:12], reason=str(exc))


def _buffered(reader: asyncio.StreamReader) -> int:
    """The bytes the stream has received and not yet handed out (asyncio keeps them in the reader's
    `_buffer`, which it has no public accessor for; 0 where a Python keeps them elsewhere: every read
    then waits under the deadline, as before)."""
    return len(getattr(reader, "_buffer", b""))


async def _read_exactly(reader: asyncio.StreamReader, count: int, what: str) -> bytes:
    """`count` bytes, or EOFError saying how much of `what` came before the client hung up."""
    try:
        return await reader.readexactly(count)
    except asyncio.IncompleteReadError as exc:
        raise EOFError(
            f"the client hung up after {len(exc.partial)} of the {count} bytes of {what}"
        ) from None
