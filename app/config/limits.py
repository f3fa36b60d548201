"""`Limits` (`args.limits`): the input limits, all checked before any expensive work."""

from __future__ import annotations

from pydantic import Field, model_validator

from app.config.base import _Strict


class Limits(_Strict):
    """Input limits, all checked before any expensive work."""

    max_body_bytes: int = Field(10 * 1024 * 1024, gt=0, description="request body limit (413 beyond)")
    max_pixels: int = Field(40_000_000, gt=0, description="width x height limit, read from the header (413)")
    max_batch_files: int = Field(64, gt=0, le=1024, description="images in one /v1/classify/batch request (413)")
    max_top_k: int = Field(20, gt=0, le=1000, description="largest top_k a request may ask for (422)")
    default_top_k: int = Field(5, gt=0, description="top_k when the request gives none")
    max_decode_bytes: int = Field(
        512 * 1024 * 1024,
        gt=0,
        description="decode budget per image: the memory decoding and converting it may take, estimated from "
        "the header (pixels x channels x bytes per sample, plus OpenCV's copy and buffers and the uint8 "
        "conversion) before the decoder runs (413 decode_budget_exceeded beyond). The default 512 MiB fits "
        "every 8-bit image up to max_pixels' 40 MP in any accepted format (worst: 8-bit RGBA, 320 MB; a GIF, "
        "360 MB) and a 40 MP 16-bit RGB one (480 MB); a 12 MP JPEG costs ~5 MB (reduced decode), ~40 MB if "
        "progressive. It refuses a 40 MP 16-bit RGBA (640 MB) or float32 RGBA image (1.3 GB; 2.5 GB before "
        "the band-wise conversion), which pixels and body size alone let through",
    )
    max_json_bytes: int = Field(
        4 * 1024 * 1024,
        gt=0,
        description="a V2 request's JSON (the whole body, or the header before binary tensor data), after "
        "decompression (413 beyond). JSON tensors are an inefficient encoding: one 224x224x3 UINT8 image is "
        "150,528 numbers, ~0.52-0.55 MB of tritonclient JSON (~3.6x its binary size) and ~28 ms of CPU to parse, "
        "so max_batch_files (64) such images would be ~35 MB, past max_body_bytes even before this limit. 4 MiB "
        "takes ~7 JSON images, or ~3 MB of base64 image files; send batches as binary tensor data "
        "(tritonclient's default), which this limit does not touch",
    )
    max_inflate_ratio: float = Field(
        32.0,
        gt=1,
        description="a compressed (gzip/deflate) body may inflate to at most this many times its size, unless it "
        "inflates to 1 MiB or less (413 beyond). tritonclient-compressed requests of real photographs inflate "
        "1.0-1.9x (binary tensors, encoded files), up to 2x (base64 JSON) and 4.8x (JSON pixels); only "
        "near-uniform images go further (a blank 224x224 image: 500-800x)",
    )
    max_url_bytes: int = Field(
        8192, gt=0, description="the request target, path and query (414 beyond, when the request reaches the Router)"
    )
    preprocessor_memory_bytes: int = Field(
        1024 * 1024 * 1024,
        gt=0,
        description="ceiling per decoding replica (the Preprocessor, or the Router with decode_in: router) on the "
        "decode budgets of the decodes in flight at once (nor are there more of them than the replica's whole CPUs, "
        "at least one); arrivals wait for room. At least "
        "max_decode_bytes. The replica's own baseline (Python, Ray, OpenCV) comes on top",
    )

    @model_validator(mode="after")
    def _default_within_max(self) -> Limits:
        if self.default_top_k > self.max_top_k:
            raise ValueError(f"default_top_k ({self.default_top_k}) exceeds max_top_k ({self.max_top_k})")
        if self.max_json_bytes > self.max_body_bytes:
            raise ValueError(
                f"max_json_bytes ({self.max_json_bytes}) exceeds max_body_bytes ({self.max_body_bytes}): JSON, the "
                "costlier encoding, may not be allowed more than binary"
            )
        if self.max_decode_bytes > self.preprocessor_memory_bytes:
            raise ValueError(
                f"max_decode_bytes ({self.max_decode_bytes}) exceeds preprocessor_memory_bytes "
                f"({self.preprocessor_memory_bytes}): an image within the budget could never be decoded"
            )
        return self
