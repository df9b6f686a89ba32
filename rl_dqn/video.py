"""Videos of an episode from RGB frames: an mp4 or gif file, and the animated GIF that TensorBoard shows."""

from __future__ import annotations

import io
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from rl_dqn.checkpoints import write_bytes_atomically

FORMATS = (".mp4", ".gif")


class VideoError(RuntimeError):
    """A video file that cannot be written."""


def fps_of(frame_skip: int) -> float:
    """Frames per second that play an Atari game at its own speed: 60 emulator frames a second."""
    return 60.0 / frame_skip


def gif_bytes(frames: list[np.ndarray], fps: float) -> bytes:
    """An animated GIF of RGB frames [H, W, 3] uint8, looping. Pillow stores each frame as its change from the one
    before, which keeps an Atari episode far smaller than OpenCV's encoder does; that matters in event files.
    (GIF counts time in hundredths of a second, so 15 fps plays at 16.7.)"""
    images = [Image.fromarray(frame) for frame in frames]
    encoded = io.BytesIO()
    images[0].save(encoded, format="GIF", save_all=True, append_images=images[1:], duration=round(1000 / fps),
                   loop=0)
    return encoded.getvalue()


class VideoFile:
    """Writes RGB frames [H, W, 3] uint8 to `path`: an `.mp4` (MPEG-4 part 2, which every player reads) as they
    come, or a `.gif`, whose frames are kept until `close` (about 100 KB each for Atari)."""

    def __init__(self, path: Path, fps: float):
        self.path, self.fps = Path(path), fps
        self.gif = self.path.suffix.lower() == ".gif"
        if self.path.suffix.lower() not in FORMATS:
            raise VideoError(f"a video file ends in {' or '.join(FORMATS)}, got {self.path.name!r}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise VideoError(f"cannot write {self.path}: {e.strerror}") from None
        self.frames: list[np.ndarray] = []
        self.count = 0
        self._writer: cv2.VideoWriter | None = None

    def add(self, frame: np.ndarray) -> None:
        self.count += 1
        if self.gif:
            self.frames.append(frame.copy())
            return
        if self._writer is None:
            height, width = frame.shape[:2]
            writer = cv2.VideoWriter(str(self.path), cv2.VideoWriter_fourcc(*"mp4v"), self.fps, (width, height))
            if not writer.isOpened():   # nothing written: a file already there is left as it was
                raise VideoError(f"cannot write an mp4 to {self.path}")
            self._writer = writer
        self._writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))

    def close(self) -> None:
        if self.gif:
            if self.frames:
                try:   # a file cut short is never left
                    write_bytes_atomically(self.path, gif_bytes(self.frames, self.fps))
                except OSError as e:
                    raise VideoError(f"cannot write {self.path}: {e.strerror}") from None
            self.frames = []
        elif self._writer is not None:
            writer, self._writer = self._writer, None   # closed from here on: discard() leaves the file
            writer.release()

    def discard(self) -> None:
        """Drops what was added, and the file it was written to so far (an mp4 is written as frames come): what an
        unfinished play recorded is not a video of its episode."""
        self.frames = []
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.release()
            self.path.unlink(missing_ok=True)
