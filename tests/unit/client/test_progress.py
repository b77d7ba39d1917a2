"""The progress bar of an upload names its phase: hashing first, then sending."""

from __future__ import annotations

import io

from tqdm import tqdm

from rknn_client.progress import ByteBar


def test_the_bar_shows_hashing_then_upload_with_their_bytes() -> None:
    out = io.StringIO()
    bar = ByteBar(tqdm(unit="B", unit_scale=True, unit_divisor=1024, file=out, mininterval=0))
    bar.phase("hashing")(512 << 10, 2 << 20)
    hashing = out.getvalue()
    bar.phase("upload")(2 << 20, 2 << 20)
    upload = out.getvalue()[len(hashing) :]
    assert "hashing" in hashing and "512k/2.00M" in hashing
    assert "upload" in upload and "hashing" not in upload and "2.00M/2.00M" in upload
