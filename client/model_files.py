"""Which files make up a model: the main file plus, for ONNX, the external-data files it names."""

from __future__ import annotations

from pathlib import Path


def model_files(path: Path) -> list[Path]:
    """The main file first, then every external-data file an ONNX model references."""
    if not path.is_file():
        raise FileNotFoundError(f"model file {path} does not exist")
    if path.suffix.lower() != ".onnx":
        return [path]
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise ValueError(f"{path} is not a readable ONNX model: {exc}") from exc
    extra: list[Path] = []
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                candidate = path.parent / entry.value
                if candidate.parent != path.parent:
                    raise ValueError(
                        f"{path} keeps weights in {entry.value!r}, outside its folder; "
                        "external data files must sit beside the model"
                    )
                if candidate not in extra:
                    extra.append(candidate)
    for f in extra:
        if not f.is_file():
            raise FileNotFoundError(f"{path} references external data {f.name}, which does not exist")
    return [path, *extra]
