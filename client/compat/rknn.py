"""`RKNN`: RKNN-Toolkit2's class with its exact signatures, return codes and printouts.

`from rknn.api import RKNN` becomes `from rknn_client import RKNN`. Every call returns what the
toolkit returns (0 / -1, lists, strings, dicts, None on failure) and logs why it failed; the work
is done by the idiomatic API underneath (rknn_client.device, rknn_client.session).

When a real RKNN-Toolkit2 is found (rknn_client.toolkit), the conversion and simulator methods run in it
through the bridge instead, and `init_runtime(target=...)` uploads the `.rknn` it compiled; the path is
chosen per object (compat.toolkit_route: `RKNN(toolkit=...)` or RKNN_CLIENT_TOOLKIT).
"""

from __future__ import annotations

import atexit
import functools
import os
import tempfile
import traceback
from collections.abc import Callable, Sequence
from inspect import signature
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx

from rknn_client import __version__
from rknn_client.accuracy.analysis import AnalysisResult, analyse, prepare_output_dir
from rknn_client.accuracy.build import QuantConfig, build_models
from rknn_client.accuracy.capture import load_model
from rknn_client.accuracy.preprocess import input_specs, load_inputs
from rknn_client.accuracy.runtime_side import dump_runtime_layers
from rknn_client.accuracy.steps import Steps
from rknn_client.compat import aliases
from rknn_client.compat import inputs as input_rules
from rknn_client.compat.config_rules import ConfigError, normalization
from rknn_client.compat.core_masks import NpuCoreMasks
from rknn_client.compat.onnx_build import BuildError, prepare_model, set_input_shapes
from rknn_client.compat.rknn_file import inspect
from rknn_client.compat.rknn_state import ModelSource, OnnxLoad, Runtime
from rknn_client.compat.shapes import batched, check_dynamic, dynamic_sets, nchw_shape, with_free_dims
from rknn_client.compat.toolkit_log import ToolkitLog
from rknn_client.compat.toolkit_route import ModeError, ToolkitRoute, choose_mode
from rknn_client.device import connect
from rknn_client.errors import RknnError, advice
from rknn_client.frame_spec import FrameSpec
from rknn_client.pipeline import Pipeline
from rknn_client.progress import byte_bar
from rknn_client.report import devices_text, memory_text, perf_text, sdk_version_text
from rknn_client.session import Session
from rknn_client.toolkit import Missing
from rknn_client.transport.base import TransportError
from rknn_proto import model_container
from rknn_proto.messages import EvalPerfResponse, LayerDump

aliases.install_fallback()  # `from rknn.utils import onnx_edit` beside `from rknn_client import RKNN`

R = TypeVar("R")
TARGETS = (
    "rv1103",
    "rv1103b",
    "rv1106",
    "rv1106b",
    "rv1126b",
    "rk3562",
    "rk3566",
    "rk3568",
    "rk3576",
    "rk3588",
)
# Set to 0 to make a daemon restart fail the next call instead of re-initializing the runtime.
ENV_AUTO_RECONNECT = "RKNN_CLIENT_AUTO_RECONNECT"
TOOLKIT_ONLY = (
    "needs Rockchip's RKNN-Toolkit2 (its closed compiler), which rknn_client runs in its own interpreter: "
    "install it with `rknn-client toolkit install`"
)
_EXPECTED = (
    RknnError,
    TransportError,
    BuildError,
    input_rules.InputRuleError,
    OSError,
    ValueError,
    ConfigError,
)


def _toolkit_call(api: str, failure: Any) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Turn the idiomatic API's exceptions into the toolkit's logged error plus `failure`."""

    def decorate(fn: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(fn)
        def wrapper(self: RKNN, *args: Any, **kwargs: Any) -> R:
            with self.log.captured(api):
                try:
                    return fn(self, *args, **kwargs)
                except _EXPECTED as exc:
                    fix = advice(exc, "toolkit")
                    self.log.e(api, f"{exc}; {fix}" if fix else str(exc))
                    return failure
                except Exception as exc:  # the toolkit's contract: -1/None and the reason, never a raise
                    self.log.e(api, f"{type(exc).__name__}: {exc}")
                    self.log.d(api, traceback.format_exc())
                    return failure

        return wrapper

    return decorate


Given = dict[str, Any]


def _bridged(
    api: str,
    failure: Any,
    when: Callable[[RKNN, Given], bool] | None = None,
    then: Callable[[RKNN, Any], None] | None = None,
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Run the call in the real toolkit when this object uses the bridge (and `when` says so, from the
    arguments the caller gave), with the caller's arguments unchanged; else the host path (`fn`).
    The toolkit prints its own lines; a failure of the bridge itself is the logged error and `failure`.
    `then` updates our state from the toolkit's return value."""

    def decorate(fn: Callable[..., R]) -> Callable[..., R]:
        bind = signature(fn).bind

        @functools.wraps(fn)
        def wrapper(self: RKNN, *args: Any, **kwargs: Any) -> R:
            if self._route.mode == "host":  # never bridged: no need to read the arguments
                return fn(self, *args, **kwargs)
            if when is not None:
                try:
                    given = bind(self, *args, **kwargs).arguments
                except TypeError:  # Python's own error for a wrong call, as the host path gives it
                    return fn(self, *args, **kwargs)
                if not when(self, given):
                    return fn(self, *args, **kwargs)
            route = self._route.get(functools.partial(self._toolkit_missing, api))
            if route is None:
                return fn(self, *args, **kwargs)
            if isinstance(route, Missing):
                self.log.e(api, route.message())
                return failure
            reply = route.call(api, *args, **kwargs)
            if not reply.ok:
                self.log.e(api, reply.error)
                return failure
            if then is not None:
                then(self, reply.value)
            self._remember_for_host(api, fn, args, kwargs, reply.value)
            return reply.value

        return wrapper

    return decorate


def _loaded_in_toolkit(self: RKNN, value: Any) -> None:
    if value == 0:
        self._use_toolkit_model(built=False)


def _built_in_toolkit(self: RKNN, value: Any) -> None:
    if value == 0:
        self._use_toolkit_model(built=True)


def _simulator_started(self: RKNN, value: Any) -> None:
    self._close_runtime()
    self._runtime.simulator = value == 0


def _on_simulator(self: RKNN, given: Given) -> bool:
    return self._runtime.simulator


def _simulator_side(self: RKNN, given: Given) -> bool:
    """init_runtime()/accuracy_analysis() without a board, on a model the toolkit loaded."""
    return self._model.in_toolkit and given.get("target") is None and given.get("device_id") is None


PLATFORMS = (*TARGETS, "rk2118")  # what config(target_platform=...) accepts
NO_PLATFORM = (
    "The 'target_platform' has not been set yet: RKNN-Toolkit2 2.x compiles for one SoC and refuses "
    f"config() without it; set it to the board's, one of {', '.join(PLATFORMS)} "
    "(e.g. config(target_platform='rk3588'))"
)


def _platform_required(fn: Callable[..., R]) -> Callable[..., R]:
    """RKNN-Toolkit2 2.x raises ValueError from config() without target_platform, which ends the script
    there. Auto and bridge mode do the same before any toolkit is asked, so a script stops at the same
    line, with one message, whether or not a toolkit is installed; `toolkit='host'` (never the
    toolkit, virtual boards only) runs without it."""
    bind = signature(fn).bind

    @functools.wraps(fn)
    def wrapper(self: RKNN, *args: Any, **kwargs: Any) -> R:
        if self._route.mode != "host":
            try:
                given = bind(self, *args, **kwargs).arguments
            except TypeError:  # Python's own error for a wrong call, as the host path gives it
                return fn(self, *args, **kwargs)
            if given.get("target_platform") is None:
                self.log.e("config", NO_PLATFORM)
                raise ValueError(NO_PLATFORM)
        return fn(self, *args, **kwargs)

    return wrapper


def _check_op_target(op_target: dict[str, Any], model: onnx.ModelProto) -> None:
    """config(op_target=...) keys name tensors that nodes of the model write, as in the toolkit, which
    refuses any other key at build()."""
    written = {name for node in model.graph.node for name in node.output if name}
    for key in op_target:
        if key not in written:
            example = next(iter(sorted(written)), "")
            raise BuildError(
                f"Invalid key of {key!r} in 'op_target'! A key is the output tensor name of a node of "
                f"the model (e.g. {example!r}), not a node name"
            )


class RKNN(NpuCoreMasks):
    def __init__(
        self, verbose: bool | str = False, verbose_file: str | None = None, toolkit: str | None = None
    ) -> None:
        """`toolkit`: auto (default, else RKNN_CLIENT_TOOLKIT), bridge or host; see compat.toolkit_route."""
        if verbose not in (True, False, "debug"):
            ToolkitLog().e("__init__", "'verbose' must be True or False!")
            verbose = False
        self.log = ToolkitLog(verbose, verbose_file)
        try:
            mode = choose_mode(toolkit)
        except ModeError as exc:
            self.log.e("__init__", f"{exc}; using auto")
            mode = "auto"
        self._route = ToolkitRoute(mode, verbose, verbose_file)
        self._model = ModelSource()
        self._runtime = Runtime()
        # In auto mode, the host-path twins of the toolkit's config/load_onnx/build, replayed when the
        # model must run on a virtual board (a host-runtime daemon cannot run what the toolkit compiled).
        self._host_replay: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] | None = []
        # config()'s settings, which outlive a load
        self._dynamic_input: Any = None
        self._op_target: dict[str, Any] = {}
        self._quant = QuantConfig()
        self.last_accuracy: AnalysisResult | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        atexit.register(self.release)

    # -- model preparation -------------------------------------------------------------------

    @_platform_required
    @_bridged("config", -1)
    @_toolkit_call("config", -1)
    def config(
        self,
        mean_values: Sequence[Sequence[float]] | Sequence[float] | None = None,
        std_values: Sequence[Sequence[float]] | Sequence[float] | None = None,
        quantized_dtype: str = "w8a8",
        quantized_algorithm: str = "normal",
        quantized_method: str = "channel",
        quantized_hybrid_level: int = 0,
        target_platform: str | None = None,
        quant_img_RGB2BGR: bool = False,
        float_dtype: str = "float16",
        optimization_level: int = 3,
        custom_string: str | None = None,
        remove_weight: bool = False,
        compress_weight: bool = False,
        inputs_yuv_fmt: Any = None,
        single_core_mode: bool = False,
        dynamic_input: Any = None,
        model_pruning: bool = False,
        op_target: Any = None,
        quantize_weight: bool = False,
        remove_reshape: bool = False,
        sparse_infer: bool = False,
        enable_flash_attention: bool = False,
        auto_hybrid_cos_thresh: float = 0.98,
        auto_hybrid_euc_thresh: float | None = None,
        **kwargs: Any,
    ) -> int:
        if target_platform is not None and str(target_platform).lower() not in PLATFORMS:
            self.log.e(
                "config",
                f"target_platform {target_platform!r} is not supported; expected one of {', '.join(PLATFORMS)}",
            )
            return -1
        means, stds = normalization(mean_values, std_values)
        if dynamic_input is not None:
            first = dynamic_input[0] if isinstance(dynamic_input, Sequence) and dynamic_input else None
            dynamic_sets(dynamic_input, len(first) if isinstance(first, Sequence) else 0)
        self._dynamic_input = dynamic_input
        self._op_target = dict(op_target or {})
        self._quant = QuantConfig(
            mean_values=means,
            std_values=stds,
            quantized_dtype=quantized_dtype,
            quantized_algorithm=quantized_algorithm,
            quantized_method=quantized_method,
            target_platform=target_platform,
            quant_img_RGB2BGR=bool(quant_img_RGB2BGR),
        )
        for key in kwargs:
            self.log.w("config", f"unknown argument {key!r} ignored")
        return 0

    @_bridged("load_onnx", -1, then=_loaded_in_toolkit)
    @_toolkit_call("load_onnx", -1)
    def load_onnx(
        self,
        model: str,
        inputs: Sequence[str] | None = None,
        input_size_list: Sequence[Sequence[int]] | None = None,
        input_initial_val: Any = None,
        outputs: Sequence[str] | None = None,
    ) -> int:
        if not Path(model).is_file():
            self.log.e("load_onnx", f"model file {model} does not exist")
            return -1
        self._model = ModelSource(onnx=OnnxLoad(Path(model), inputs, input_size_list, outputs))
        self.log.i("load_onnx", f"loading model {model}")
        return 0

    def _unsupported_loader(self, api: str) -> int:
        self.log.e(
            api,
            f"{api}() on the host path (ONNX Runtime) takes ONNX models only: export the model to ONNX "
            f"and use load_onnx(); {api}() itself {TOOLKIT_ONLY}",
        )
        return -1

    @_bridged("load_pytorch", -1, then=_loaded_in_toolkit)
    def load_pytorch(self, model: str, input_size_list: Any = None) -> int:
        return self._unsupported_loader("load_pytorch")

    @_bridged("load_tensorflow", -1, then=_loaded_in_toolkit)
    def load_tensorflow(
        self,
        tf_pb: str,
        inputs: Any = None,
        input_size_list: Any = None,
        outputs: Any = None,
        input_is_nchw: bool = False,
    ) -> int:
        return self._unsupported_loader("load_tensorflow")

    @_bridged("load_tflite", -1, then=_loaded_in_toolkit)
    def load_tflite(self, model: str, input_is_nchw: bool = False) -> int:
        return self._unsupported_loader("load_tflite")

    @_bridged("load_caffe", -1, then=_loaded_in_toolkit)
    def load_caffe(self, model: str, blobs: Any = None, input_name: Any = None) -> int:
        return self._unsupported_loader("load_caffe")

    @_bridged("load_darknet", -1, then=_loaded_in_toolkit)
    def load_darknet(self, model: str, weight: str) -> int:
        return self._unsupported_loader("load_darknet")

    @_toolkit_call("load_rknn", -1)
    def load_rknn(self, path: str) -> int:
        if not Path(path).is_file():
            self.log.e("load_rknn", f"rknn model file {path} does not exist")
            return -1
        kind = inspect(Path(path))
        if kind.rknn is not None:
            self.log.i("load_rknn", f"{path}: {kind.rknn.summary()}")
        elif kind.virtual is not None:
            self.log.i("load_rknn", f"{path} is a virtual-board model: {model_container.VIRTUAL_ONLY}")
        sets = kind.virtual.header.get("dynamic_input") if kind.virtual else None
        self._model = ModelSource(
            rknn_path=Path(path),
            rknn_kind=kind,
            dynamic_sets=[[tuple(shape) for shape in shape_set] for shape_set in sets] if sets else None,
        )
        return 0

    @_bridged("build", -1, then=_built_in_toolkit)
    @_toolkit_call("build", -1)
    def build(
        self,
        do_quantization: bool = True,
        dataset: str | None = None,
        rknn_batch_size: int | None = None,
        auto_hybrid: bool = False,
    ) -> int:
        source = self._model
        if source.onnx is None:
            self.log.e("build", "no model loaded: call load_onnx() first")
            return -1
        batch = 1 if rknn_batch_size is None else int(rknn_batch_size)
        if batch < 1:
            self.log.e("build", f"rknn_batch_size must be 1 or more, not {rknn_batch_size}")
            return -1
        self._workdir = self._workdir or tempfile.TemporaryDirectory(prefix="rknn_client-")
        prepared = prepare_model(
            source.onnx.path,
            inputs=source.onnx.inputs,
            input_size_list=source.onnx.input_size_list,
            outputs=source.onnx.outputs,
        )
        _check_op_target(self._op_target, prepared)
        sets = None
        if self._dynamic_input is not None:
            if batch > 1:
                self.log.e("build", "rknn_batch_size and dynamic_input cannot be combined")
                return -1
            sets = dynamic_sets(self._dynamic_input, len(input_specs(prepared)))
            set_input_shapes(prepared, source.onnx.inputs, sets[0])  # calibrate on the first set
        if do_quantization:
            self.log.i("build", f"quantizing to int8 ({self._quant.quantized_algorithm}) with {dataset}")
        folder = Path(self._workdir.name) / "build"
        source.models = build_models(
            prepared, folder, self._quant, do_quantization, dataset, fixed_shapes=sets is None
        )
        # The daemon runs what was built: the int8 QDQ model, or the float model without quantization,
        # with the batch or the dynamic shapes asked for.
        source.built = source.models.quant_model
        if sets is not None or batch > 1:
            model = load_model(source.models.quant_model)
            model = with_free_dims(model, sets) if sets is not None else batched(model, batch)
            source.built = folder / "runtime.onnx"
            onnx.save(model, source.built)
        source.dynamic_sets = sets
        source.build_settings = {
            "do_quantization": bool(do_quantization),
            "quantized_algorithm": self._quant.quantized_algorithm,
            "quantized_method": self._quant.quantized_method,
            "rknn_batch_size": batch,
            "dynamic_input": sets,
        }
        return 0

    @_bridged("export_rknn", -1)
    @_toolkit_call("export_rknn", -1)
    def export_rknn(self, export_path: str, **kwargs: Any) -> int:
        """Without RKNN-Toolkit2: the built model in a virtual-board container (rknn_proto.model_container)."""
        built = self._model.built
        if self._model.models is None or built is None:
            self.log.e("export_rknn", "no built model to export: call load_onnx() and build() first")
            return -1
        header = {
            "producer": f"rknn_client {__version__}",
            "target_platform": self._quant.target_platform,
            "note": model_container.VIRTUAL_ONLY,
            **self._model.build_settings,
        }
        data = model_container.pack(built.read_bytes(), header)
        Path(export_path).write_bytes(data)
        self.log.w(
            "export_rknn", f"{export_path} is for the virtual board only: {model_container.VIRTUAL_ONLY}"
        )
        return 0

    # -- what only RKNN-Toolkit2 itself can do ----------------------------------------------------

    def _needs_toolkit(self, api: str, what: str) -> int:
        self.log.e(api, f"{what} {TOOLKIT_ONLY}")
        return -1

    @_bridged("hybrid_quantization_step1", -1)
    def hybrid_quantization_step1(
        self,
        dataset: str = "dataset.txt",
        rknn_batch_size: int | None = None,
        proposal: bool = False,
        proposal_dataset_size: int = 1,
        custom_hybrid: Any = None,
    ) -> int:
        return self._needs_toolkit("hybrid_quantization_step1", "hybrid quantization")

    @_bridged("hybrid_quantization_step2", -1, then=_built_in_toolkit)
    def hybrid_quantization_step2(
        self, model_input: str, data_input: str, model_quantization_cfg: str
    ) -> int:
        return self._needs_toolkit("hybrid_quantization_step2", "hybrid quantization")

    @_bridged("export_encrypted_rknn_model", -1)
    def export_encrypted_rknn_model(
        self, input_model: str, output_model: str | None = None, crypt_level: int = 1
    ) -> int:
        return self._needs_toolkit("export_encrypted_rknn_model", "encrypting an RKNN model")

    @_bridged("reg_custom_op", -1)
    def reg_custom_op(self, custom_op: Any) -> int:
        name = getattr(custom_op, "op_type", type(custom_op).__name__)
        return self._needs_toolkit("reg_custom_op", f"registering the custom operator {name!r}")

    @_bridged("codegen", -1)
    def codegen(self, output_path: str, inputs: Any = None, overwrite: bool = False) -> int:
        return self._needs_toolkit("codegen", "generating the C++ deployment example")

    @_bridged("optimize_onnx", -1)
    def optimize_onnx(
        self,
        model: str,
        optimized_path: str | None = None,
        passes_enable: Any = None,
        inputs_for_dump: Any = None,
    ) -> int:
        return self._needs_toolkit("optimize_onnx", "the toolkit's ONNX graph optimizer")

    # -- runtime -----------------------------------------------------------------------------

    def _remember_for_host(
        self, api: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], value: Any
    ) -> None:
        """Keep what the host path needs to build the same model (auto mode only; ONNX models only)."""
        if self._route.mode != "auto" or value != 0:
            return
        if api.startswith("load_"):
            replay = self._host_replay or []
            configs = [call for call in replay if call[0].__name__ == "config"]
            self._host_replay = [*configs, (fn, args, kwargs)] if api == "load_onnx" else None
        elif api in ("config", "build") and self._host_replay is not None:
            self._host_replay.append((fn, args, kwargs))
        elif api.startswith("hybrid_quantization"):
            self._host_replay = None  # the toolkit's own quantization: nothing on the host path matches it

    def _build_on_host(self, where: str) -> bool:
        """Auto mode, a daemon that runs ONNX models only (a virtual board): build the model on the host
        path too, as the toolkit's config/load_onnx/build calls asked. False when that cannot be done."""
        replay = self._host_replay
        if self._route.mode != "auto" or not replay or not any(c[0].__name__ == "load_onnx" for c in replay):
            return False
        self.log.say(
            "init_runtime",
            f"the daemon at {where} is a virtual board (it runs ONNX models, not what RKNN-Toolkit2 "
            "compiled): building the model with ONNX Runtime for it",
        )
        for fn, args, kwargs in replay:
            if fn(self, *args, **kwargs) != 0:
                raise BuildError(f"{fn.__name__}() on the host path failed (see the error above)")
        return True  # the replayed load_onnx() made the host's model the current one

    def _toolkit_missing(self, api: str, missing: Missing) -> None:
        if self._route.mode == "auto":  # the host path is the documented fallback: say why at debug level
            self.log.d(api, f"{missing.message()}; using the host path (ONNX Runtime)")

    def _use_toolkit_model(self, built: bool) -> None:
        """A load or build in the toolkit succeeded: the model is the toolkit's, the host's is dropped."""
        self._model = ModelSource(in_toolkit=True, toolkit_built=built)

    def _toolkit_rknn(self) -> Path:
        """The .rknn the toolkit compiled, exported into a private temp file for a board's daemon."""
        if not self._model.toolkit_built:
            self.log.i("init_runtime", "the model was not built; building it without quantization")
            if self.build(do_quantization=False) != 0:
                raise BuildError("building the model failed (see the error above)")
        if self._model.exported is None:
            self._workdir = self._workdir or tempfile.TemporaryDirectory(prefix="rknn_client-")
            path = Path(self._workdir.name) / "toolkit" / "model.rknn"
            path.parent.mkdir(exist_ok=True)
            if self.export_rknn(str(path)) != 0:
                raise BuildError("exporting the RKNN model from the toolkit failed (see the error above)")
            self._model.exported = path
        return self._model.exported

    def _model_for_runtime(self) -> Path:
        if self._model.rknn_path is not None:
            return self._model.rknn_path
        if self._model.in_toolkit:
            return self._toolkit_rknn()
        if self._model.onnx is None:
            raise BuildError("no model loaded: call load_rknn() or load_onnx() first")
        if self._model.built is None:
            self.log.i("init_runtime", "the model was not built; building it without quantization")
            if self.build(do_quantization=False) != 0:
                raise BuildError("building the model failed (see the error above)")
        assert self._model.built is not None
        return self._model.built

    @_bridged("init_runtime", -1, when=_simulator_side, then=_simulator_started)
    @_toolkit_call("init_runtime", -1)
    def init_runtime(
        self,
        target: str | None = None,
        device_id: str | None = None,
        perf_debug: bool = False,
        eval_mem: bool = False,
        async_mode: bool = False,
        core_mask: int = NpuCoreMasks.NPU_CORE_AUTO,
        fallback_prior_device: str = "cpu",
        **kwargs: Any,
    ) -> int:
        kwargs.pop("target_sub_class", None)
        for key in kwargs:
            self.log.w("init_runtime", f"unknown argument {key!r} ignored")
        if not self._known_target("init_runtime", target):
            return -1
        model = self._model_for_runtime()
        self._close_runtime()
        runtime = self._runtime
        runtime.target = (target or "").lower()
        if target:
            self.log.i("init_runtime", f"target set by user is: {runtime.target}")
        device = runtime.device = connect(device_id, target)
        info = device.info()
        self.log.i("init_runtime", f"Connect to Device success! ({device.endpoint.description})")
        where = device.endpoint.description
        if self._model.in_toolkit and ".rknn" not in info.model_formats and self._build_on_host(where):
            model = self._model_for_runtime()
        self._check_runnable(model, info.model_formats, info.soc, where)
        session = runtime.session = device.load(
            model,
            target=runtime.target,
            perf_debug=perf_debug,
            eval_mem=eval_mem,
            core_mask=core_mask,
            fallback_prior_device=fallback_prior_device,
            reconnect=True,
            on_reconnect=lambda note: self.log.w("init_runtime", note),
        )
        if async_mode:
            # This frame travels and runs while the previous frame's outputs are returned.
            runtime.pipeline = session.pipeline(depth=2)
        return 0

    def _known_target(self, api: str, target: str | None) -> bool:
        """Whether `target` (None: not given) names a platform the toolkit knows; logs why not. Whether
        it is the board's is the daemon's to say, when the session opens."""
        if target is None or str(target).lower() in TARGETS:
            return True
        self.log.e(api, f"target {target!r} is not supported; expected one of {', '.join(TARGETS)}")
        return False

    def _check_runnable(self, model: Path, formats: Sequence[str], soc: str, where: str) -> None:
        """A .rknn file (loaded, or compiled by the toolkit) the selected daemon cannot run is refused
        here, before any upload."""
        if self._model.rknn_path is not None:
            kind, name = self._model.rknn_kind, self._model.rknn_path.name
        elif self._model.in_toolkit:
            kind, name = inspect(model), "the model RKNN-Toolkit2 built"
        else:
            return
        header, virtual = kind.rknn, kind.virtual
        if virtual is not None and soc:
            built_for = str(virtual.header.get("target_platform") or "").lower()
            if built_for and built_for != soc.lower():
                raise RknnError(
                    f"{name} was built for {built_for}, but the board at {where} is {soc}: "
                    f"convert the model again with target_platform='{soc}'"
                )
        if header is not None and ".rknn" not in formats:
            raise RknnError(
                f"{name} is a real RKNN model ({header.summary()}); the daemon at {where} "
                f"runs models of type {', '.join(formats)} (the host runtime cannot run RKNN models): "
                "connect to a board's daemon, or load the original model with load_onnx()"
            )
        if header is not None and soc and header.target_platforms and soc not in header.target_platforms:
            raise RknnError(
                f"{name} was built for {', '.join(header.target_platforms)}, "
                f"but the board at {where} is {soc}: convert the model again with target_platform='{soc}'"
            )
        if virtual is not None and ".onnx" not in formats:
            raise RknnError(f"{name} cannot run on the board at {where}: {model_container.VIRTUAL_ONLY}")

    def _require_session(self) -> Session:
        session = self._runtime.session
        if session is None:
            raise RknnError("the runtime is not initialized: call init_runtime() first")
        session.allow_reconnect(os.environ.get(ENV_AUTO_RECONNECT, "1").strip() != "0")
        return session

    @_bridged("inference", None, when=_on_simulator)
    @_toolkit_call("inference", None)
    def inference(
        self,
        inputs: Any,
        data_format: str | Sequence[str] | None = None,
        inputs_pass_through: Sequence[int] | None = None,
        get_frame_id: bool = False,
    ) -> list[np.ndarray] | None:
        session = self._require_session()
        prepared = input_rules.prepare(inputs, session.inputs, data_format, inputs_pass_through)
        for note in prepared.notes:
            self.log.w("inference", note)
        frame = prepared.frame
        if self._model.dynamic_sets is not None:
            layouts = frame.layouts or [s.layout for s in session.inputs]
            shapes = [nchw_shape(a, layout) for a, layout in zip(frame.arrays, layouts, strict=True)]
            check_dynamic(shapes, self._model.dynamic_sets)
        runtime = self._runtime
        if runtime.pipeline is not None:
            frame_id, result = self._infer_async(runtime.pipeline, frame)
        else:
            result = session.run_frame(frame)
            runtime.frames += 1
            frame_id = runtime.frames
        outputs: list[Any] = list(result)
        if get_frame_id:
            outputs.append(frame_id)
        return outputs

    def _infer_async(self, pipeline: Pipeline, frame: FrameSpec) -> tuple[int, list[np.ndarray]]:
        """async_mode as the toolkit documents it: this frame is sent and run while the previous
        frame's result is returned. The first call has no previous frame and returns its own
        result, so the first two calls both return frame 1 (the frame id tells them apart)."""
        pipeline.submit_frame(frame)
        runtime = self._runtime
        if runtime.previous is None or pipeline.in_flight > 1:
            runtime.previous = pipeline.result()
        return runtime.previous

    @_bridged("eval_perf", None, when=_on_simulator)
    @_toolkit_call("eval_perf", None)
    def eval_perf(self, is_print: bool = True, fix_freq: bool = True) -> str | None:
        report: EvalPerfResponse = self._require_session().perf(fix_freq=fix_freq)
        text = perf_text(report)
        if is_print:
            print(text, end="")
        self.last_perf = report
        return text

    @_bridged("eval_memory", None, when=_on_simulator)
    @_toolkit_call("eval_memory", None)
    def eval_memory(self, is_print: bool = True) -> dict[str, int] | None:
        report = self._require_session().memory()
        if is_print:
            print(memory_text(report), end="")
        return {
            "weight_memory": report.weight_memory,
            "internal_memory": report.internal_memory,
            "other_memory": report.other_memory,
            "total_memory": report.total_memory,
        }

    @_bridged("get_sdk_version", None, when=_on_simulator)
    @_toolkit_call("get_sdk_version", None)
    def get_sdk_version(self) -> str | None:
        session = self._require_session()
        info = session.device.info()
        text = sdk_version_text(
            f"rknn_client {__version__}",
            f"{info.daemon_version} ({info.runtime})",
            f"{session.runtime_api_version} [{session.runtime_driver_version}]",
        )
        print(text, end="")
        return text

    def list_devices(self) -> tuple[list[str], list[str]]:
        adb_devices: list[str] = []
        try:
            from rknn_client.transport.adb import list_adb_devices

            adb_devices = [d.serial for d in list_adb_devices() if d.state == "device"]
        except ImportError as exc:
            self.log.w("list_devices", f"adb support is not installed ({exc})")
        except TransportError as exc:
            self.log.w("list_devices", str(exc))
        print(devices_text(adb_devices, []), end="")
        return adb_devices, []

    @_bridged("accuracy_analysis", -1, when=_simulator_side)
    @_toolkit_call("accuracy_analysis", -1)
    def accuracy_analysis(
        self,
        inputs: Sequence[str],
        output_dir: str = "./snapshot",
        target: str | None = None,
        device_id: str | None = None,
    ) -> int:
        """golden (float) vs simulator (built) per layer, and vs the runtime that `target`/`device_id`
        select as in init_runtime; neither means no runtime side. Prints the table, returns 0 / -1."""
        if self._model.rknn_path is not None:
            self.log.e(
                "accuracy_analysis",
                "the model was loaded with load_rknn(): an RKNN model lacks the original model, "
                "so accuracy analysis is not possible; load the original with load_onnx() and build()",
            )
            return -1
        if not self._known_target("accuracy_analysis", target):
            return -1
        if self._model.in_toolkit and not self._host_twin_for(target, device_id):
            self.log.e(
                "accuracy_analysis",
                "the runtime side (target/device_id) of a model RKNN-Toolkit2 built needs the model built "
                "on the host path too, which only auto mode (RKNN(toolkit='auto')) after load_onnx() does, "
                "for a daemon that runs ONNX models; call accuracy_analysis() without target for golden "
                "vs the toolkit's simulator, or use RKNN(toolkit='host') throughout",
            )
            return -1
        models = self._model.models
        if models is None:
            self.log.e("accuracy_analysis", "no built model: call load_onnx() and build() first")
            return -1
        specs = input_specs(load_model(models.float_model))
        feeds = load_inputs(list(inputs), specs, self._quant.quant_img_RGB2BGR)
        out = Path(output_dir)
        prepare_output_dir(out)
        runtime_layers: list[tuple[LayerDump, np.ndarray]] | None = None
        if target is not None or device_id is not None:
            runtime_layers = self._runtime_layers(
                models.quant_model, feeds, (target or "").lower(), device_id
            )
        result = analyse(models.float_model, models.quant_model, feeds, out, runtime_layers, Steps())
        print(result.report, end="")
        self.log.say("accuracy_analysis", result.written.text(out))
        self.last_accuracy = result
        return 0

    def _host_twin_for(self, target: str | None, device_id: str | None) -> bool:
        """The toolkit built the model: in auto mode, and when the daemon that target/device_id select
        runs ONNX models (a virtual board), build it on the host path too, as init_runtime does."""
        if self._route.mode != "auto" or not self._host_replay:
            return False
        with connect(device_id, (target or "").lower() or None) as device:
            formats, where = device.info().model_formats, device.endpoint.description
        return ".onnx" in formats and self._build_on_host(where)

    def _runtime_layers(
        self, model: Path, feeds: dict[str, np.ndarray], target: str, device_id: str | None
    ) -> list[tuple[LayerDump, np.ndarray]]:
        """Every layer of the built model as the selected daemon's runtime computes it."""
        with connect(device_id, target or None) as device:
            info = device.info()
            self.log.i("accuracy_analysis", f"runtime side: {device.endpoint.description} ({info.runtime})")
            layers: list[tuple[LayerDump, np.ndarray]] = []
            with byte_bar(True, "runtime layer dumps", delay_s=0.5) as bar:
                received = 0
                for layer in dump_runtime_layers(device, model, feeds, target):
                    layers.append((layer, layer.array))
                    received += layer.array.nbytes
                    if bar:
                        bar.phase("runtime layer dumps")(received, 0)
            return layers

    def _close_runtime(self) -> None:
        runtime, self._runtime = self._runtime, Runtime()
        refused = runtime.close()
        if refused:
            self.log.w("release", refused)

    def release(self) -> None:
        self._close_runtime()
        self._route.close()
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None
        atexit.unregister(self.release)
