"""A misnamed input file is read as what its content is, and adb's own ANDROID_SERIAL picks the board."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from rknn_client.input_files import InputFileError, read_input_files
from rknn_client.transport import adb


def test_a_png_named_npy_is_read_as_the_image_with_a_note(tmp_path: Path) -> None:
    pixels = np.random.default_rng(2).integers(0, 256, (4, 5, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "photo.png")
    misnamed = (tmp_path / "photo.png").rename(tmp_path / "photo.npy")
    notes: list[str] = []
    (array,) = read_input_files([misnamed], [None], notes.append)
    np.testing.assert_array_equal(array[0], pixels)
    assert notes == [f"{misnamed} is a PNG image, not .npy: read as one (rename it to .png)"]


def test_a_npy_that_is_nothing_known_says_so_without_pickle_advice(tmp_path: Path) -> None:
    junk = tmp_path / "x.npy"
    junk.write_bytes(b"hello, not an array")
    with pytest.raises(InputFileError) as raised:
        read_input_files([junk], [None], print)
    assert "neither a .npy nor a .npz array nor an image" in str(raised.value)
    assert "pickle" not in str(raised.value)


def _client(*serials: str) -> SimpleNamespace:
    listed = [SimpleNamespace(serial=s, state="device", tags={}) for s in serials]
    return SimpleNamespace(list=lambda extended: listed)


def test_android_serial_picks_among_several_boards(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _client("first", "second")
    monkeypatch.delenv("ANDROID_SERIAL", raising=False)
    with pytest.raises(adb.AdbDeviceAmbiguous):
        adb.find_device(client, None)  # type: ignore[arg-type]
    monkeypatch.setenv("ANDROID_SERIAL", "second")
    assert adb.find_device(client, None).serial == "second"  # type: ignore[arg-type]
    assert adb.find_device(client, "first").serial == "first"  # type: ignore[arg-type]
