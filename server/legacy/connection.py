"""One toolkit connection: the open handshake, then one request at a time until the client hangs up.

A connection holds at most one session (the model of its last MsgLoad); it is released on MsgUnload,
on a new MsgLoad and whenever the connection ends, however it ends. Every failure the client waits
on is answered with a crash report, whose text the toolkit prints, so the user reads why.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import time
from dataclasses import dataclass

import numpy as np
import structlog

from rknn_proto.codec import TensorLimits
from rknn_server import __version__
from rknn_server.calls import Call, Recorder
from rknn_server.data_plane import DataPlane, OpenRequest
from rknn_server.errors import InvalidInput, ResourceExhausted, status_of
from rknn_server.legacy import layouts, messages, wire
from rknn_server.legacy.layouts import Layout
from rknn_server.legacy.wire import Command, Header, ProtocolError
from rknn_server.runtime.base import InputFormat, MemoryResult
from rknn_server.sessions import Session

log = structlog.get_logger("rknn_server.legacy")
OWNER = "legacy-toolkit"
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
ACK_IOCTL_UNKNOWN_CMD = 7
ACK_UNSUPPORT_SET_CORE = 9
# The most a request other than a model load or inputs may be (the largest seen is 0xb4f0 bytes).
SMALL_MESSAGE_BYTES = 0x10000
_MODEL_SIZE = struct.Struct("<I")
_LOAD_HEADER_BYTES = 0x70
_COMMANDS = {int(c) for c in Command}
# rknn_run in the 2.5.0 client sends MsgRun and only then starts waiting on a condition variable,
# without checking whether the answer already came: a MsgFinish that arrives in between is lost and
# the toolkit fails with "Run timeout" minutes later (its other waits look alike). A real NPU run is
# slower than that gap; a fast stand-in is not, so no answer leaves sooner than this after its request.
MIN_TURNAROUND_S = 0.01


@dataclass(frozen=True)
class LegacyLimits:
    tensors: TensorLimits
    max_model_bytes: int
    max_inputs_bytes: int


def memory_text(memory: MemoryResult) -> str:
    """The memory detail as the toolkit parses it: `Name: bytes` lines (other = total - the two)."""
    return (
        f"Total Weight Memory: {memory.weight_bytes}\n"
        f"Total Internal Memory: {memory.internal_bytes}\n"
        f"Total Memory: {memory.total_bytes}\n"
    )


class LegacyConnection:
    def __init__(
        self,
        plane: DataPlane,
        layout: Layout,
        limits: LegacyLimits,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        name: str,
        recorder: Recorder,
    ) -> None:
        self.plane = plane
        self.recorder = recorder
        self.layout = layout
        self.limits = limits
        self.reader = reader
        self.writer = writer
        self.name = name
        self.session: Session | None = None
        self.inputs: tuple[list[np.ndarray], list[InputFormat]] | None = None
        self.input_error: Exception | None = None
        self.inputs_bytes = 0  # of the inputs received for the next run, counted in that run's record
        self.frames = itertools.count(1)
        self.last_run_us = 0.0
        self.finished = False

    async def serve(self) -> None:
        try:
            request = wire.OpenRequest.parse(
                await wire.read_exactly(self.reader, wire.OPEN_BYTES, "the open request")
            )
            log.info("legacy_client_connected", place=self.name, pid=request.pid, device=request.device_id)
            self.writer.write(wire.OPEN_ACCEPTED)
            while not self.finished:
                header, message = await self._receive()
                await self._dispatch(header, message)
                await self.writer.drain()
        except EOFError as exc:
            log.info("legacy_client_gone", place=self.name, detail=str(exc))
        except ProtocolError as exc:
            log.warning("legacy_protocol_error", place=self.name, error=str(exc))
            await self._send_quietly(self._crash(0, 0, str(exc)))
        except (ConnectionError, asyncio.CancelledError):
            log.info("legacy_client_gone", place=self.name)
        finally:
            await self._release("legacy client disconnected")
            self.writer.close()

    async def _receive(self) -> tuple[Header, bytes]:
        """One message, its size checked against the limit of its command before it is read."""
        length = await wire.read_length(self.reader)
        if length < wire.HEADER_BYTES:
            raise ProtocolError(
                f"a frame of {length} bytes; every message has a {wire.HEADER_BYTES}-byte header"
            )
        head = await wire.read_exactly(self.reader, wire.HEADER_BYTES, "a message header")
        header = Header.parse(head)
        if header.command not in _COMMANDS:
            raise ProtocolError(f"unknown command {header.command} in a message of {length} bytes")
        most = self._most(header.command)
        if length > most:
            raise ProtocolError(
                f"a {Command(header.command).name} message of {length} bytes; the limit for it is {most} bytes"
            )
        rest = await wire.read_exactly(self.reader, length - wire.HEADER_BYTES, "a message body")
        log.debug("legacy_request", place=self.name, command=Command(header.command).name, size=length)
        return header, head + rest

    def _most(self, command: int) -> int:
        if command == Command.LOAD:
            return _LOAD_HEADER_BYTES + self.limits.max_model_bytes + 0x1000
        if command == Command.MULTI_INPUT:
            return self.layout.input_data_at + self.limits.max_inputs_bytes
        return SMALL_MESSAGE_BYTES

    async def _dispatch(self, header: Header, message: bytes) -> None:
        command = header.command
        if command == Command.MULTI_INPUT:  # the client waits for no answer
            self._take_inputs(message)
            self.inputs_bytes = len(message)
            return
        # Recorded like a gRPC call (calls.py): the metrics and one `rpc` event per answered request.
        call = Call(f"legacy.{Command(command).name}", OWNER)
        call.bytes_in, self.inputs_bytes = len(message) + self.inputs_bytes, 0
        outcome = "OK"
        try:
            answer = await self._answer(header, message)
        except Exception as exc:
            code, text = status_of(exc)
            outcome = code.name
            log.warning("legacy_request_failed", place=self.name, command=Command(command).name, error=text)
            answer = self._crash(header.sequence, header.model_id, text)
        await asyncio.sleep(MIN_TURNAROUND_S - (time.perf_counter() - call.start))
        self.writer.write(wire.frame(answer))
        call.session = self.session.id if self.session is not None else ""
        call.bytes_out = len(answer)
        self.recorder.done(call, outcome)

    async def _answer(self, header: Header, message: bytes) -> bytearray:
        command = header.command
        self._check_release(command, len(message))
        if command == Command.VERSION:
            return self._version(header)
        if command == Command.LOAD:
            await self._load(header, message)
            return self._short_ack(Command.LOAD_ACK, header)
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
            await self._release("unloaded by the toolkit")
            self.finished = True
            return self._short_ack(Command.UNLOAD_ACK, header)
        raise InvalidInput(f"command {Command(command).name} is not something a client sends")

    def _check_release(self, command: int, size: int) -> None:
        """A request of another size than this layout's comes from a toolkit release with other structs:
        answering it would be misread (the client checks every ack's size), so it is refused, saying how."""
        expected = self.layout.request_bytes(command)
        if expected is None or size == expected:
            return
        known = ", ".join(layouts.RELEASES)
        what = f"this toolkit sends a {Command(command).name} request of {size} bytes; RKNN-Toolkit2 {self.layout.toolkit} sends {expected}"
        matching = layouts.releases_sending(command, size)
        if matching:
            raise InvalidInput(
                f"{what} and {', '.join(matching)} send {size}: start the daemon with "
                f"--legacy-toolkit-version {matching[-1]}"
            )
        raise InvalidInput(
            f"{what}: this daemon speaks the protocol of RKNN-Toolkit2 {known} only. Install one of those on the "
            f"PC (pip install rknn-toolkit2=={layouts.DEFAULT_VERSION}), or upgrade rknn-server-oss to a release "
            "that knows this toolkit"
        )

    def _short_ack(self, command: Command, header: Header) -> bytearray:
        return wire.build(command, header.sequence, header.model_id, self.layout.short_ack_bytes)

    def _crash(self, sequence: int, model_id: int, text: str) -> bytearray:
        answer = wire.build(Command.CRASH, sequence, model_id, self.layout.crash_bytes)
        body = f"rknn_server (rknn-server-oss {__version__}): {text}".encode("utf-8", "replace")
        room = self.layout.crash_bytes - self.layout.text_at - 1
        answer[self.layout.text_at : self.layout.text_at + min(len(body), room)] = body[:room]
        return answer

    def _version(self, header: Header) -> bytearray:
        answer = self._short_ack(Command.VERSION_ACK, header)
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

    async def _load(self, header: Header, message: bytes) -> None:
        (size,) = _MODEL_SIZE.unpack_from(message, wire.HEADER_BYTES)
        carried = len(message) - _LOAD_HEADER_BYTES
        if size > carried:
            raise InvalidInput(
                f"the model is {size} bytes but this message carries {carried}; models sent in parts "
                "are not supported by this daemon yet"
            )
        await self._release("replaced by a new model")
        model = message[_LOAD_HEADER_BYTES : _LOAD_HEADER_BYTES + size]
        digest = await self.plane.blocking(self.plane.cache.store_bytes, "model.rknn", model)
        self.session = await self.plane.open(
            OpenRequest(
                digest=digest,
                owner=OWNER,
                target=self.plane.backend.soc(),
                perf_debug=bool(header.flags & wire.FLAG_COLLECT_PERF),
                eval_mem=bool(header.flags & wire.FLAG_COLLECT_MEMORY),
            )
        )
        log.info("legacy_model_loaded", place=self.name, session=self.session.id[:12], model=digest[:12])

    def _loaded(self) -> Session:
        if self.session is None:
            raise InvalidInput("no model is loaded on this connection; call load_rknn and init_runtime first")
        return self.plane.session(self.session.id, OWNER)

    def _ioctl(self, header: Header, subcommand: int) -> bytearray:
        session = self._loaded()
        layout = self.layout
        length = layout.model_info_bytes if subcommand == MODEL_INFO else layout.dynamic_range_bytes
        answer = wire.build(
            Command.IOCTL_ACK, header.sequence, header.model_id, layout.ioctl_data_at + length
        )
        struct.pack_into("<IIQ", answer, wire.HEADER_BYTES, 0, subcommand, length)
        if subcommand == MODEL_INFO:
            messages.pack_model_info(answer, layout, session.runtime.inputs, session.runtime.outputs)
        return answer

    async def _run_ioctl(self, header: Header, subcommand: int) -> bytearray:
        """A query after loading. Its waiter in the client wakes only on an ioctl ack, never on a crash
        report, so a failure is an ack with an error code (and the reason goes to the log)."""
        value, data, ack = 0, b"", ACK_SUCC
        try:
            session = self._loaded()
            runtime = session.runtime
            if subcommand == PERF_RUN:
                value = round(self.last_run_us)
            elif subcommand == PERF_DETAIL:
                data = (await self.plane.in_session(session, runtime.perf, None)).raw_text.encode() + b"\0"
            elif subcommand == MEMORY_DETAIL:
                data = memory_text(await self.plane.in_session(session, runtime.memory)).encode() + b"\0"
            else:
                ack = ACK_IOCTL_UNKNOWN_CMD
                log.warning("legacy_ioctl_unsupported", place=self.name, subcommand=subcommand)
        except Exception as exc:
            ack = ACK_FAIL
            log.warning(
                "legacy_ioctl_failed", place=self.name, subcommand=subcommand, error=status_of(exc)[1]
            )
        layout = self.layout
        answer = wire.build(
            Command.IOCTL_ACK, header.sequence, header.model_id, layout.run_ioctl_data_at + len(data)
        )
        struct.pack_into("<II", answer, wire.HEADER_BYTES, ack, subcommand)
        struct.pack_into("<Q", answer, layout.run_ioctl_value_at, value or len(data))
        answer[layout.run_ioctl_data_at :] = data
        return answer

    async def _set_core(self, header: Header, message: bytes) -> bytearray:
        """init_runtime(core_mask=...) after the load: the session is reopened with that mask (a
        runtime takes its core mask when it loads). A refused mask is an error ack, as the client waits."""
        (mask,) = struct.unpack_from("<I", message, wire.HEADER_BYTES)
        answer = self._short_ack(Command.SET_CORE_ACK, header)
        session = self._loaded()
        if mask == session.options.core_mask:
            return answer
        try:
            options = session.options
            await self._release("reopened with another core mask")
            self.session = await self.plane.open(
                OpenRequest(
                    digest=session.digest,
                    owner=OWNER,
                    target=options.target,
                    perf_debug=options.perf_debug,
                    eval_mem=options.eval_mem,
                    core_mask=mask,
                )
            )
        except Exception as exc:
            struct.pack_into("<I", answer, wire.HEADER_BYTES, ACK_UNSUPPORT_SET_CORE)
            log.warning("legacy_core_mask_refused", place=self.name, mask=mask, error=status_of(exc)[1])
        return answer

    def _take_inputs(self, message: bytes) -> None:
        """Keep the inputs for the next MsgRun (a bad one is reported in answer to that run)."""
        self.inputs, self.input_error = None, None
        try:
            specs = self._loaded().runtime.inputs
            self.inputs = messages.unpack_inputs(message, self.layout, specs, self.limits.tensors)
        except Exception as exc:
            self.input_error = exc

    async def _run(self, header: Header) -> bytearray:
        session = self._loaded()
        inputs, error = self.inputs, self.input_error
        self.inputs, self.input_error = None, None
        if error is not None:
            raise error
        if inputs is None:
            raise InvalidInput("inference without inputs: the run came before any MsgMultiInput")
        arrays, formats = inputs
        start = time.perf_counter()
        outputs = await self.plane.in_session(session, session.runtime.run, arrays, formats)
        self.last_run_us = (time.perf_counter() - start) * 1e6
        native = messages.native_outputs(outputs, session.runtime.outputs)
        if len(native) > self.layout.max_tensors:
            raise ResourceExhausted(
                f"the model has {len(native)} outputs; the protocol carries at most {self.layout.max_tensors}"
            )
        answer = wire.build(
            Command.FINISH,
            header.sequence,
            header.model_id,
            self.layout.finish_data_at + sum(a.nbytes for a in native),
        )
        struct.pack_into("<QII", answer, wire.HEADER_BYTES, next(self.frames), 0, len(native))
        messages.pack_outputs(answer, self.layout, native)
        return answer

    async def _release(self, reason: str) -> None:
        session, self.session = self.session, None
        self.inputs = None
        if session is not None:
            try:
                await self.plane.close(session.id, OWNER)
                log.info("legacy_session_released", session=session.id[:12], reason=reason)
            except Exception as exc:  # expired meanwhile: nothing left to free
                log.info("legacy_release_skipped", session=session.id[:12], reason=str(exc))

    async def _send_quietly(self, answer: bytearray) -> None:
        try:
            self.writer.write(wire.frame(answer))
            await self.writer.drain()
        except ConnectionError:
            pass
