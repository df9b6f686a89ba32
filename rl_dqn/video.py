"""Videos of an episode from RGB frames: an mp4 or gif file, and the animated GIF that TensorBoard shows."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

FORMATS = (".mp4", ".gif")


def fps_of(frame_skip: int) -> float:
    """Frames per second that play an Atari game at its own speed: 60 emulator frames a second."""
    return 60.0 / frame_skip


def gif_bytes(frames: list[np.ndarray], fps: float) -> bytes:
    """An animated GIF of RGB frames [H, W, 3] uint8, looping."""
    animation = cv2.Animation()
    animation.frames = [cv2.cvtColor(f, cv2.COLOR_RGB2BGR) for f in frames]
    animation.durations = [max(1, round(1000 / fps))] * len(frames)
    ok, encoded = cv2.imencodeanimation(".gif", animation)
    if not ok:
        raise RuntimeError(f"OpenCV could not encode {len(frames)} frames as a GIF")
    return encoded.tobytes()


def write_video(frames: list[np.ndarray], path: Path, fps: float) -> Path:
    """Writes RGB frames [H, W, 3] uint8 to `path`: `.mp4` (MPEG-4 part 2, which every player reads) or `.gif`."""
    if not frames:
        raise ValueError("no frames to write")
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(f"a video file ends in {' or '.join(FORMATS)}, got {path.name!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".gif":
        path.write_bytes(gif_bytes(frames, fps))
        return path
    height, width = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write an mp4 to {path}")
    try:
        for frame in frames:
            writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    finally:
        writer.release()
    return path
