"""Building and parsing FFmpeg filter descriptions (``name=args,name=args``)."""

from __future__ import annotations


def get_video_filter_desc(
    *,
    scale_width: int | None = None,
    scale_height: int | None = None,
    scale_algo: str = "bilinear",
    crop_width: int | None = None,
    crop_height: int | None = None,
    pix_fmt: str | None = "rgb24",
) -> str:
    """Return a filter chain that scales, then center-crops, then converts the pixel format.

    ``scale_width``/``scale_height`` resize (one of them alone keeps the aspect ratio);
    ``crop_width``/``crop_height`` take the center; ``pix_fmt`` is the output format
    (``None`` keeps the decoder's). The chain runs inside FFmpeg (libswscale).
    """
    parts: list[str] = []
    if scale_width is not None or scale_height is not None:
        w = scale_width if scale_width is not None else -2
        h = scale_height if scale_height is not None else -2
        parts.append(f"scale=w={w}:h={h}:flags={scale_algo}")
    if crop_width is not None or crop_height is not None:
        cw = crop_width if crop_width is not None else "in_w"
        ch = crop_height if crop_height is not None else "in_h"
        parts.append(f"crop=w={cw}:h={ch}")
    if pix_fmt is not None:
        parts.append(f"format=pix_fmts={pix_fmt}")
    return ",".join(parts)


def get_audio_filter_desc(
    *,
    sample_rate: int | None = None,
    num_channels: int | None = None,
    sample_fmt: str | None = "flt",
) -> str:
    """Return a filter chain that resamples and converts audio (``aformat``)."""
    args: list[str] = []
    if sample_fmt is not None:
        args.append(f"sample_fmts={sample_fmt}")
    if sample_rate is not None:
        args.append(f"sample_rates={sample_rate}")
    if num_channels is not None:
        layout = {1: "mono", 2: "stereo"}.get(num_channels, f"{num_channels}c")
        args.append(f"channel_layouts={layout}")
    return f"aformat={':'.join(args)}" if args else ""


def parse_filter_desc(desc: str | None) -> list[tuple[str, str]]:
    """Split a linear chain into ``(filter name, args)`` pairs."""
    if not desc:
        return []
    out: list[tuple[str, str]] = []
    for part in desc.split(","):
        name, _, args = part.strip().partition("=")
        out.append((name, args))
    return out


def parse_args(args: str) -> dict[str, str]:
    """Parse ``key=value:key=value`` filter arguments (keyed form only)."""
    out: dict[str, str] = {}
    for item in args.split(":") if args else []:
        key, _, value = item.partition("=")
        out[key] = value
    return out
