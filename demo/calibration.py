"""A calibration set for int8 quantization cut from one photo: shifted square crops, resized to the
model's input size and saved as PNG, listed in a dataset.txt the way RKNN-Toolkit2's build() reads it."""

from __future__ import annotations

from pathlib import Path

from PIL import Image


def photo_crops(photo: Path, folder: Path, count: int, size: int) -> list[Path]:
    """`count` different square crops (3/4 of the short side, sliding corner to corner) as PNG files."""
    folder.mkdir(parents=True, exist_ok=True)
    with Image.open(photo) as opened:
        image = opened.convert("RGB")
    side = min(image.size) * 3 // 4
    steps = max(count - 1, 1)
    paths = []
    for i in range(count):
        left = (image.width - side) * i // steps
        top = (image.height - side) * (count - 1 - i) // steps
        crop = image.crop((left, top, left + side, top + side)).resize(
            (size, size), Image.Resampling.BILINEAR
        )
        path = folder / f"crop{i}.png"
        crop.save(path)
        paths.append(path)
    return paths


def write_dataset(folder: Path, images: list[Path]) -> Path:
    """dataset.txt in `folder`, one image per line, relative to the folder."""
    listing = folder / "dataset.txt"
    listing.write_text("".join(f"{p.relative_to(folder)}\n" for p in images))
    return listing
